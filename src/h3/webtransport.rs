//! A WebTransport session's CONNECT stream on the server: the request
//! checked and answered, the session's handler run, the peer's capsules
//! read until the session ends, and its end said (`WT_CLOSE_SESSION`, then
//! the stream's FIN).

use std::sync::Arc;

use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::webtransport::{self as wt, capsule, capsule_head, decode_close};
use rapidws_core::h3::{RequestHead, code, put_headers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::data::DataStream;
use super::session::{Closed, Sessions, WebTransport};
use super::wire::{LINGER, answer_error, code_of};
use crate::connection::handler::ServerHandler;

/// Sessions open at once on one connection: one, as the draft allows a
/// server that does no session-level flow control (and as browsers use
/// them: a connection each). A second is refused with 429.
pub(crate) const MAX_SESSIONS: u64 = 1;

/// How long a session's handler has to return once the session is over.
const HANDLER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Unknown capsules' bytes skipped in a row before the session is closed.
const MAX_SKIPPED: u64 = 64 * 1024;

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
    if let Err(reject) = app.on_request(&head) {
        return answer_error(send, recv, reject.status(), reject.reason(), within).await;
    }
    let id = u64::from(send.id());
    let path = head.path().unwrap_or_default().to_owned();
    let Some((session, mut control)) = sessions.open(&conn, id, path, MAX_SESSIONS as usize) else {
        let why = "one WebTransport session at a time on a connection: open another connection";
        return answer_error(send, recv, 429, why, within).await;
    };
    // Registered before the answer: the peer's streams may follow it at once.
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
            sessions.remove(id);
            let _ = send.reset(code_of(code::REQUEST_CANCELLED));
            return;
        }
    }
    let (returned, back) = tokio::sync::oneshot::channel();
    let mut stream = DataStream::new(conn, send, recv, Some(returned));
    let served = app.serve(session);
    tokio::pin!(served);
    let mut returned = false;
    let ended = tokio::select! {
        () = &mut served => {
            returned = true;
            Closed { code: 0, reason: String::new(), by_peer: false }
        }
        closed = read_capsules(&mut stream) => closed,
        Some((code, reason)) = control.closing.recv() => Closed { code, reason, by_peer: false },
        () = server.shutdown_requested() => Closed {
            code: 0,
            reason: "server shutting down".into(),
            by_peer: false,
        },
    };
    // From here the session's streams and datagrams are refused, and its
    // handler's `accept_*` end once it has taken those queued.
    sessions.remove(id);
    tracing::debug!(id, code = ended.code, reason = %ended.reason, by_peer = ended.by_peer, "WebTransport session over");
    let mut last = Vec::new();
    if !ended.by_peer {
        wt::put_close(ended.code, &ended.reason, &mut last);
    }
    control.closed.send_replace(Some(ended));
    let closing = async {
        stream.write_all(&last).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(within, closing).await;
    drop(stream);
    // The handler sees the end (`closed`, its `accept_*` ending) and has a
    // while to finish; then its future goes, with the streams it holds.
    if !returned {
        let _ = tokio::time::timeout(HANDLER_GRACE, &mut served).await;
    }
    if let Ok(send) = back.await {
        let _ = tokio::time::timeout(LINGER, send.stopped()).await;
    }
}

/// Reads the peer's capsules until the session ends: `WT_CLOSE_SESSION`,
/// the stream's end (code 0), a reset or a malformed capsule. Unknown
/// capsules (and `WT_DRAIN_SESSION`) are skipped.
async fn read_capsules(stream: &mut DataStream) -> Closed {
    let peer = |code, reason: &str| Closed {
        code,
        reason: reason.to_owned(),
        by_peer: true,
    };
    let mut skipped = 0u64;
    loop {
        let mut head = [0u8; 16];
        let mut len = 0;
        let (kind, length) = loop {
            if let Some((kind, length, _)) = capsule_head(&head[..len]) {
                break (kind, length);
            }
            match stream.read(&mut head[len..len + 1]).await {
                Ok(0) if len == 0 => return peer(0, ""),
                Ok(0) => return peer(0, "the session's stream ended inside a capsule"),
                Ok(n) => len += n,
                Err(error) => {
                    tracing::debug!(%error, "a WebTransport session's stream broke");
                    return peer(0, "the session's stream was reset");
                }
            }
            if len == head.len() {
                return peer(0, "a malformed capsule");
            }
        };
        if kind == capsule::CLOSE_SESSION {
            if length > (4 + wt::MAX_CLOSE_REASON) as u64 {
                return peer(0, "a WT_CLOSE_SESSION over 1028 bytes");
            }
            let mut payload = vec![0; length as usize];
            if stream.read_exact(&mut payload).await.is_err() {
                return peer(0, "the session's stream ended inside a capsule");
            }
            return match decode_close(&payload) {
                Ok((code, reason)) => peer(code, reason),
                Err(error) => peer(0, &error.to_string()),
            };
        }
        skipped = skipped.saturating_add(length);
        if skipped > MAX_SKIPPED {
            return peer(0, "too many bytes of unknown capsules");
        }
        let mut rest = (&mut *stream).take(length);
        match tokio::io::copy(&mut rest, &mut tokio::io::sink()).await {
            Ok(n) if n == length => {}
            _ => return peer(0, "the session's stream ended inside a capsule"),
        }
    }
}
