//! A WebTransport session's CONNECT stream on the server: the request
//! checked and answered, the session's handler run, the peer's capsules
//! read until the session ends, and its end said (`WT_CLOSE_SESSION`, then
//! the stream's FIN; or a reset for a malformed capsule).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::webtransport::{self as wt, capsule, capsule_head, decode_close};
use rapidws_core::h3::{RequestHead, code, put_headers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::data::DataStream;
use super::session::{Closed, Control, Sessions, WebTransport};
use super::wire::{LINGER, answer_error, code_of, head_bytes_needed};
use crate::connection::handler::ServerHandler;

/// Sessions open at once on one connection: one, as the draft allows a
/// server that does no session-level flow control (and as browsers use
/// them: a connection each). A second is refused with 429.
pub(crate) const MAX_SESSIONS: u64 = 1;

/// How long a session's handler has to return once the session is over.
const HANDLER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves the WebTransport session `head` asks for on `send`/`recv`.
pub(crate) async fn serve<H: ServerHandler, W: WebTransport>(
    server: &crate::stream::Server<H>,
    app: &Arc<W>,
    sessions: &Arc<Sessions>,
    conn: Connection,
    mut send: SendStream,
    recv: RecvStream,
    head: RequestHead,
) {
    let within = server.config().handshake_timeout;
    if let Some(Err(why)) = head.webtransport() {
        return answer_error(send, recv, 400, why, within).await;
    }
    let headers = head.headers();
    let field = |name: &str| headers.iter().find(|h| h.name == name).map(|h| h.value);
    let host = field("host").or(head.authority().map(str::as_bytes));
    if !server.allows_origin(field("origin"), host) {
        let why = "a page of this origin may not open a session here \
                   (the server lets in other origins with Config::allow_origins)";
        return answer_error(send, recv, 403, why, within).await;
    }
    // A panicking hook answers 500, as the WebSocket upgrade hook does.
    match std::panic::catch_unwind(AssertUnwindSafe(|| app.on_request(&head))) {
        Ok(Ok(())) => {}
        Ok(Err(reject)) => {
            return answer_error(send, recv, reject.status(), reject.reason(), within).await;
        }
        Err(_) => {
            tracing::error!("the WebTransport handler's on_request panicked");
            let why = "the server failed to decide on the session";
            return answer_error(send, recv, 500, why, within).await;
        }
    }
    let id = u64::from(send.id());
    let path = head.path().unwrap_or_default().to_owned();
    // The session's streams get the credit its peer expects (see
    // `WebTransport::max_streams`); a panicking handler's, the default.
    let streams = std::panic::catch_unwind(AssertUnwindSafe(|| app.max_streams()))
        .unwrap_or(super::DEFAULT_SESSION_STREAMS);
    let Some((session, control)) = sessions.open(&conn, id, path, MAX_SESSIONS as usize, streams)
    else {
        let why = "one WebTransport session at a time on a connection: open another connection";
        return answer_error(send, recv, 429, why, within).await;
    };
    conn.set_max_concurrent_bi_streams(streams.into());
    conn.set_max_concurrent_uni_streams(streams.saturating_add(3).into());
    // From here, however this task ends (a panic in the handler, the
    // connection's end aborting it), the session leaves the table and
    // its end is told.
    let mut open = Open {
        sessions,
        id,
        control,
    };
    // Registered before the answer: streams the peer opens once it has the
    // answer find it (those it sent before are held for it: `Sessions`).
    let mut response = Vec::new();
    put_headers(
        [
            (&b":status"[..], &b"200"[..]),
            (b"sec-webtransport-http3-draft", b"draft02"),
        ],
        &mut response,
    );
    match tokio::time::timeout(within, send.write_all(&response)).await {
        Ok(Ok(())) => {}
        _ => {
            let _ = send.reset(code_of(code::REQUEST_CANCELLED));
            return;
        }
    }
    let (returned, back) = tokio::sync::oneshot::channel();
    let mut stream = DataStream::new(conn, send, recv, Some(returned));
    let mut served = Box::pin(app.serve(session));
    let mut returned = false;
    let (ended, malformed) = tokio::select! {
        () = &mut served => {
            returned = true;
            // A close asked for just before returning still counts.
            let (code, reason) = open.control.closing.try_recv().unwrap_or_default();
            (Closed { code, reason, by_peer: false }, false)
        }
        read = read_capsules(&mut stream) => read,
        Some((code, reason)) = open.control.closing.recv() => {
            (Closed { code, reason, by_peer: false }, false)
        }
        () = server.shutdown_requested() => (Closed {
            code: 0,
            reason: "server shutting down".into(),
            by_peer: false,
        }, false),
    };
    tracing::debug!(id, code = ended.code, reason = %ended.reason, by_peer = ended.by_peer, "WebTransport session over");
    let mut last = Vec::new();
    if !ended.by_peer {
        wt::put_close(ended.code, &ended.reason, &mut last);
    }
    // Its streams and datagrams are refused from here, its handler's
    // `accept_*` end, `closed` resolves.
    open.end(ended);
    if malformed {
        stream.reset(code::MESSAGE_ERROR);
    } else {
        let closing = async {
            stream.write_all(&last).await?;
            stream.shutdown().await
        };
        let _ = tokio::time::timeout(within, closing).await;
    }
    drop(stream);
    // The handler sees the end and has a while to finish; then its future
    // goes, with the streams it holds.
    if !returned {
        let _ = tokio::time::timeout(HANDLER_GRACE, &mut served).await;
    }
    drop(served);
    if let Ok(send) = back.await {
        let _ = tokio::time::timeout(LINGER, send.stopped()).await;
    }
}

/// A session in the connection's table, taken out (and its end told) when
/// this goes, however its task ends.
struct Open<'a> {
    sessions: &'a Sessions,
    id: u64,
    control: Control,
}

impl Open<'_> {
    fn end(&mut self, closed: Closed) {
        self.sessions.remove(self.id);
        self.control.closed.send_if_modified(|now| {
            let first = now.is_none();
            if first {
                *now = Some(closed);
            }
            first
        });
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.end(Closed {
            code: 0,
            reason: "the session's task ended (the connection closed, or its handler panicked)"
                .into(),
            by_peer: false,
        });
    }
}

/// Reads the peer's capsules until the session ends: `WT_CLOSE_SESSION`,
/// the stream's end (code 0) or reset. Unknown capsules (and
/// `WT_DRAIN_SESSION`) are skipped, whatever their length (their bytes
/// are read and dropped, as the stream's flow control lets them come).
/// `true` with the end: a malformed capsule, to be answered with
/// `H3_MESSAGE_ERROR`.
async fn read_capsules(stream: &mut DataStream) -> (Closed, bool) {
    let peer = |code, reason: &str| Closed {
        code,
        reason: reason.to_owned(),
        by_peer: true,
    };
    let cut = "the session's stream ended inside a capsule";
    loop {
        // Two varints, as a frame head: 16 bytes at most, each read
        // whole once its first byte tells its length.
        let mut head = [0u8; 16];
        let mut len = 0;
        let (kind, length) = loop {
            if let Some((kind, length, _)) = capsule_head(&head[..len]) {
                break (kind, length);
            }
            let need = head_bytes_needed(&head[..len]);
            match stream.read(&mut head[len..len + need]).await {
                Ok(0) if len == 0 => return (peer(0, ""), false),
                Ok(0) => return (peer(0, cut), true),
                Ok(n) => len += n,
                Err(error) => {
                    tracing::debug!(%error, "a WebTransport session's stream broke");
                    return (peer(0, "the session's stream was reset"), false);
                }
            }
        };
        if kind == capsule::CLOSE_SESSION {
            if length > (4 + wt::MAX_CLOSE_REASON) as u64 {
                return (peer(0, "a WT_CLOSE_SESSION over 1028 bytes"), true);
            }
            let mut payload = vec![0; length as usize];
            if stream.read_exact(&mut payload).await.is_err() {
                return (peer(0, cut), true);
            }
            return match decode_close(&payload) {
                Ok((code, reason)) => (peer(code, reason), false),
                Err(error) => (peer(0, &error.to_string()), true),
            };
        }
        let mut rest = (&mut *stream).take(length);
        match tokio::io::copy(&mut rest, &mut tokio::io::sink()).await {
            Ok(n) if n == length => {}
            _ => return (peer(0, cut), true),
        }
    }
}
