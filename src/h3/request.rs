//! One request stream on the server: its head read and checked, answered
//! with a `200` that opens a WebSocket (RFC 9220) or an error, and the
//! WebSocket then served by the stream driver.

use quinn::{Connection, RecvStream, SendStream, VarInt};
use rapidws_core::h3::frame::{FrameHead, kind};
use rapidws_core::h3::{H3Error, QpackError, RequestHead, code, put_headers, qpack};

use super::data::{DataStream, head_bytes_needed};
use crate::connection::handler::{Accept, ServerHandler};
use crate::connection::upgrade::Decision;
use crate::handshake::{HandshakeError, error_header, first_line, write_response_value};

/// How long a finished stream waits for the peer to acknowledge its last
/// bytes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Frames other than HEADERS skipped before it, at most.
const MAX_SKIPPED: u64 = 64 * 1024;

/// Why a request's head was not read.
pub(crate) enum HeadError {
    /// The stream broke or timed out: nothing to answer.
    Gone,
    /// A frame not allowed before the head: the stream is reset.
    Unexpected(&'static str),
    /// Larger than the server takes: 431.
    TooLarge,
}

/// Serves one request stream of `conn`.
pub(crate) async fn serve<H: ServerHandler>(
    server: crate::stream::Server<H>,
    conn: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let peer = conn.remote_address();
    let config = server.config();
    let limit = config.max_handshake_size;
    let read = tokio::time::timeout(config.handshake_timeout, read_head(&mut recv, limit)).await;
    let payload = match read {
        Ok(Ok(payload)) => payload,
        Err(_) | Ok(Err(HeadError::Gone)) => {
            let _ = send.reset(varint(code::REQUEST_INCOMPLETE));
            return;
        }
        Ok(Err(HeadError::Unexpected(why))) => {
            tracing::debug!(%peer, why, "HTTP/3 request refused");
            let _ = send.reset(varint(code::FRAME_UNEXPECTED));
            let _ = recv.stop(varint(code::FRAME_UNEXPECTED));
            return;
        }
        Ok(Err(HeadError::TooLarge)) => {
            return refuse(&server, send, HandshakeError::HeadTooLarge).await;
        }
    };
    let section = match qpack::decode(&payload, limit) {
        Ok(section) => section,
        Err(QpackError::TooLarge) => {
            return refuse(&server, send, HandshakeError::HeadTooLarge).await;
        }
        Err(error @ QpackError::Invalid(_)) => {
            // A connection error (RFC 9204, section 2.2): our settings
            // allow no dynamic table, or the bytes are not QPACK at all.
            let error = H3Error::from(error);
            tracing::debug!(%peer, %error, "HTTP/3 connection closed");
            conn.close(varint(error.code()), error.to_string().as_bytes());
            return;
        }
    };
    let head = match RequestHead::parse(section) {
        Ok(head) => head,
        Err(error) => {
            tracing::debug!(%peer, %error, "HTTP/3 request refused");
            return answer_error(send, 400, &error.to_string()).await;
        }
    };
    let mut headers = head.headers();
    // `:authority` stands for `Host` (RFC 9114, 4.3.1): what the `Origin`
    // check compares with.
    if let Some(authority) = head.authority()
        && !headers.iter().any(|h| h.name == "host")
    {
        headers.push(httparse::Header {
            name: "host",
            value: authority.as_bytes(),
        });
    }
    let decision = head
        .websocket(&headers)
        .map(|checked| server.decide(&checked, Accept::default(), None));
    let decision = match decision {
        Ok(decision) => decision,
        Err(error) => return refuse(&server, send, error).await,
    };
    match decision {
        Decision::Refused(reject) => answer_error(send, reject.status(), reject.reason()).await,
        Decision::Accepted {
            state,
            accept,
            deflate,
        } => {
            let settings = crate::connection::upgrade::settings(&accept, None, server.config());
            let mut extensions = Vec::new();
            if let Some(params) = &deflate {
                write_response_value(params, |piece| extensions.extend_from_slice(piece));
            }
            let mut fields: Vec<(&[u8], &[u8])> = vec![(b":status", b"200")];
            if let Some(protocol) = accept.chosen_protocol() {
                fields.push((b"sec-websocket-protocol", protocol.as_bytes()));
            }
            if deflate.is_some() {
                fields.push((b"sec-websocket-extensions", &extensions));
            }
            let mut response = Vec::new();
            put_headers(fields, &mut response);
            let (returned, back) = tokio::sync::oneshot::channel();
            let stream = async move {
                send.write_all(&response).await?;
                Ok(DataStream::new(send, recv, Some(returned)))
            };
            server
                .serve_upgraded_later(stream, peer, state, deflate, settings)
                .await;
            // The WebSocket is over and its stream finished: wait (a while)
            // for the peer to have every byte, so that closing the
            // connection next cannot cut the close handshake's last bytes.
            if let Ok(send) = back.await {
                let _ = tokio::time::timeout(LINGER, send.stopped()).await;
            }
        }
    }
}

/// Reads frames up to the HEADERS frame and returns its payload (at most
/// `limit` bytes); unknown frames before it are skipped.
pub(crate) async fn read_head(recv: &mut RecvStream, limit: usize) -> Result<Vec<u8>, HeadError> {
    let mut skipped = 0u64;
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
        match frame.kind {
            kind::HEADERS => {
                let length = usize::try_from(frame.length).map_err(|_| HeadError::TooLarge)?;
                if length > limit {
                    return Err(HeadError::TooLarge);
                }
                let mut payload = vec![0; length];
                recv.read_exact(&mut payload)
                    .await
                    .map_err(|_| HeadError::Gone)?;
                return Ok(payload);
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
                let mut left = frame.length;
                let mut scratch = [0u8; 512];
                while left > 0 {
                    let n = scratch.len().min(left as usize);
                    recv.read_exact(&mut scratch[..n])
                        .await
                        .map_err(|_| HeadError::Gone)?;
                    left -= n as u64;
                }
            }
        }
    }
}

/// Refuses an upgrade as the other drivers do: counted, logged, answered.
async fn refuse<H: ServerHandler>(
    server: &crate::stream::Server<H>,
    send: SendStream,
    error: HandshakeError,
) {
    server.refused(&error);
    answer_error(send, error.status(), error.reason()).await;
}

/// An error response like the other drivers': the status, a one-line
/// plain-text reason, and the field RFC 6455 or RFC 9110 asks for; then
/// the stream's end.
async fn answer_error(mut send: SendStream, status: u16, reason: &str) {
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
    if send.write_all(&out).await.is_ok() {
        let _ = send.finish();
    }
}

pub(crate) fn varint(value: u64) -> VarInt {
    VarInt::from_u64(value).unwrap_or_default()
}
