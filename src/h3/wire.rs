//! Reading HTTP/3 off a quinn stream, the error codes it closes with, and
//! an error's answer: what the connection, request, session, data and
//! client files share.

use quinn::{Connection, RecvStream, SendStream, VarInt};
use rapidws_core::h3::frame::{FrameHead, kind};
use rapidws_core::h3::{H3Error, code, put_headers, varint};

use crate::handshake::{error_header, first_line};

/// The most bytes of frames other than DATA (unknown ones, trailers)
/// skipped in a row before a request stream is refused: they may be sent,
/// not without end.
pub(crate) const MAX_SKIPPED: u64 = 64 * 1024;

/// An HTTP/3 error code as quinn takes it.
pub(crate) fn code_of(value: u64) -> VarInt {
    VarInt::from_u64(value).unwrap_or_default()
}

/// Why a request's head was not read.
pub(crate) enum HeadError {
    /// The stream broke or timed out: nothing to answer.
    Gone,
    /// A frame not allowed before the head: the connection's error
    /// (`H3_FRAME_UNEXPECTED`, RFC 9114 section 4.1).
    Unexpected(&'static str),
    /// Larger than the server takes: 431.
    TooLarge,
}

/// How a bidirectional stream begins.
pub(crate) enum Opening {
    /// A HEADERS frame's payload: a request's head (or a response's).
    Head(Vec<u8>),
    /// WebTransport's signal: a stream of this session (what follows is
    /// the application's bytes).
    WebTransport(u64),
}

/// Reads a stream's frames up to its HEADERS frame and returns the
/// payload (at most `limit` bytes, the buffer grown as bytes come);
/// unknown frames before it are skipped, `MAX_SKIPPED` bytes at most.
/// With `sessions`, a first frame of WebTransport's stream type is that
/// signal instead (its "length" the session id).
pub(crate) async fn read_headers(
    recv: &mut RecvStream,
    limit: usize,
    sessions: bool,
) -> Result<Opening, HeadError> {
    let mut skipped = 0u64;
    let mut first = true;
    loop {
        let mut head = [0u8; 16];
        let mut len = 0;
        let frame = loop {
            if let Some(frame) = FrameHead::decode(&head[..len]) {
                break frame;
            }
            let need = head_bytes_needed(&head[..len]);
            recv.read_exact(&mut head[len..len + need])
                .await
                .map_err(|_| HeadError::Gone)?;
            len += need;
        };
        if frame.is_http2_only() {
            return Err(HeadError::Unexpected("a frame type HTTP/3 reserves"));
        }
        if sessions && first && frame.kind == rapidws_core::h3::webtransport::BIDI_SIGNAL {
            return Ok(Opening::WebTransport(frame.length));
        }
        first = false;
        match frame.kind {
            kind::HEADERS => {
                let length = usize::try_from(frame.length).map_err(|_| HeadError::TooLarge)?;
                if length > limit {
                    return Err(HeadError::TooLarge);
                }
                // Grown as bytes come, not at the length a peer declares.
                let mut payload = Vec::with_capacity(length.min(1024));
                let mut chunk = [0u8; 1024];
                while payload.len() < length {
                    let n = (length - payload.len()).min(chunk.len());
                    recv.read_exact(&mut chunk[..n])
                        .await
                        .map_err(|_| HeadError::Gone)?;
                    payload.extend_from_slice(&chunk[..n]);
                }
                return Ok(Opening::Head(payload));
            }
            kind::DATA => return Err(HeadError::Unexpected("DATA before the request's head")),
            kind::CANCEL_PUSH
            | kind::SETTINGS
            | kind::PUSH_PROMISE
            | kind::GOAWAY
            | kind::MAX_PUSH_ID => {
                return Err(HeadError::Unexpected("a control frame on a request stream"));
            }
            _ => {
                skipped += frame.length;
                if skipped > MAX_SKIPPED {
                    return Err(HeadError::Unexpected("too many bytes of unknown frames"));
                }
                skip(recv, frame.length)
                    .await
                    .map_err(|()| HeadError::Gone)?;
            }
        }
    }
}

/// Bytes to read next so that a frame head in progress gets no further
/// than its own end: one byte to learn each varint's length, then the
/// rest of it.
pub(crate) fn head_bytes_needed(head: &[u8]) -> usize {
    let Some(&first) = head.first() else {
        return 1;
    };
    let type_len = 1usize << (first >> 6);
    if head.len() < type_len {
        return type_len - head.len();
    }
    match head.get(type_len) {
        None => 1,
        Some(&second) => (type_len + (1usize << (second >> 6))) - head.len(),
    }
}

/// Reads and drops `length` bytes.
pub(crate) async fn skip(recv: &mut RecvStream, mut length: u64) -> Result<(), ()> {
    let mut scratch = [0u8; 512];
    while length > 0 {
        let n = usize::try_from(length).map_or(scratch.len(), |n| n.min(scratch.len()));
        recv.read_exact(&mut scratch[..n]).await.map_err(|_| ())?;
        length -= n as u64;
    }
    Ok(())
}

/// A varint read from `recv` (how it failed does not matter here).
pub(crate) async fn read_varint(recv: &mut RecvStream) -> Result<u64, ()> {
    read_head_varint(recv).await.map_err(|_| ())
}

/// Why a stream's first varint was not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unread {
    /// The peer reset the stream: nothing is left to stop, and the code it
    /// gave is its own to give.
    Reset,
    /// It ended, broke off, or held no varint.
    Other,
}

/// [`read_varint`], telling a reset from the peer apart: a stream's type
/// (and a WebTransport stream's session), which a peer may reset before we
/// read it.
pub(crate) async fn read_head_varint(recv: &mut RecvStream) -> Result<u64, Unread> {
    let mut bytes = [0u8; 8];
    let unread = |error: quinn::ReadExactError| match error {
        quinn::ReadExactError::ReadError(quinn::ReadError::Reset(_)) => Unread::Reset,
        _ => Unread::Other,
    };
    recv.read_exact(&mut bytes[..1]).await.map_err(unread)?;
    let len = 1usize << (bytes[0] >> 6);
    recv.read_exact(&mut bytes[1..len]).await.map_err(unread)?;
    varint::decode(&bytes[..len])
        .map(|(value, _)| value)
        .ok_or(Unread::Other)
}

/// A frame head read from `recv` (its `len` not kept).
pub(crate) async fn read_frame_head(recv: &mut RecvStream) -> Result<FrameHead, ()> {
    let kind = read_varint(recv).await?;
    let length = read_varint(recv).await?;
    Ok(FrameHead {
        kind,
        length,
        len: 0,
    })
}

/// Closes the connection for `error`.
pub(crate) fn fail(conn: &Connection, error: H3Error) {
    tracing::debug!(%error, "HTTP/3 connection closed");
    conn.close(code_of(error.code()), error.to_string().as_bytes());
}

/// Closes the connection with `code`, saying `why`.
pub(crate) fn close(conn: &Connection, code: u64, why: &'static str) {
    tracing::debug!(why, "HTTP/3 connection closed");
    conn.close(code_of(code), why.as_bytes());
}

/// How long a finished stream waits for the peer to acknowledge its last
/// bytes.
pub(crate) const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// An error response like the other drivers': the status, a one-line
/// plain-text reason, and the field RFC 6455 or RFC 9110 asks for; then
/// the stream's end (written within `within`, or the stream is reset).
/// The rest of the request is not wanted: STOP_SENDING with
/// `H3_NO_ERROR` (RFC 9114, 4.1.1).
pub(crate) async fn answer_error(
    mut send: SendStream,
    mut recv: RecvStream,
    status: u16,
    reason: &str,
    within: std::time::Duration,
) {
    let _ = recv.stop(code_of(code::NO_ERROR));
    let status_text = status.to_string();
    let mut fields: Vec<(&[u8], &[u8])> = vec![
        (b":status", status_text.as_bytes()),
        (b"content-type", b"text/plain; charset=utf-8"),
    ];
    let extra = error_header(status).map(|(name, value)| (name.to_ascii_lowercase(), value));
    if let Some((name, value)) = &extra {
        fields.push((name.as_bytes(), value.as_bytes()));
    }
    let body = format!("{}\n", first_line(reason));
    let mut out = Vec::new();
    put_headers(fields, &mut out);
    rapidws_core::h3::frame::put_head(&mut out, kind::DATA, body.len() as u64);
    out.extend_from_slice(body.as_bytes());
    // quinn sends a finished stream's bytes after its handle is gone.
    match tokio::time::timeout(within, send.write_all(&out)).await {
        Ok(Ok(())) => {
            let _ = send.finish();
        }
        Ok(Err(_)) => {}
        Err(_) => {
            let _ = send.reset(code_of(code::REQUEST_CANCELLED));
        }
    }
}
