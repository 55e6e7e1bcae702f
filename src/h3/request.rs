//! One request stream on the server: its head read and checked, answered
//! with a `200` that opens a WebSocket (RFC 9220) or an error, and the
//! WebSocket then served by the stream driver.

use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::{H3Error, QpackError, RequestHead, code, put_headers, qpack};

use std::convert::Infallible;
use std::sync::Arc;

use super::data::DataStream;
use super::session::{Sessions, WebTransport};
use super::wire::{HeadError, LINGER, Opening, answer_error, close, code_of, read_headers};
use crate::connection::handler::{Accept, ServerHandler};
use crate::connection::upgrade::Decision;
use crate::handshake::{HandshakeError, write_response_value};
use crate::stream::Handed;

/// A request being decided: held streams for its id are let go when this
/// goes.
struct Deciding(Arc<Sessions>, u64);

impl Drop for Deciding {
    fn drop(&mut self) {
        self.0.decided(self.1);
    }
}

/// What a connection's bidirectional streams are served with: the
/// WebSocket server, and the WebTransport handler with the connection's
/// sessions if there is one.
pub(crate) struct Service<H: ServerHandler, W> {
    pub(crate) server: crate::stream::Server<H>,
    pub(crate) webtransport: Option<(Arc<W>, Arc<Sessions>)>,
}

impl<H: ServerHandler, W> Clone for Service<H, W> {
    fn clone(&self) -> Self {
        Service {
            server: self.server.clone(),
            webtransport: self.webtransport.clone(),
        }
    }
}

/// Serves one bidirectional stream of `conn`: a request, or a stream of
/// a WebTransport session.
pub(crate) async fn serve<H: ServerHandler, W: WebTransport>(
    service: Service<H, W>,
    conn: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let server = service.server;
    let peer = conn.remote_address();
    let config = server.config();
    let limit = config.max_handshake_size;
    let sessions = service.webtransport.is_some();
    // Until this request is decided, streams for a session of its id are
    // held (`Sessions`); however it ends, they are let go.
    let deciding = service
        .webtransport
        .as_ref()
        .map(|(_, sessions)| Deciding(sessions.clone(), u64::from(send.id())));
    let read = tokio::time::timeout(
        config.handshake_timeout,
        read_headers(&mut recv, limit, sessions),
    )
    .await;
    let payload = match read {
        Ok(Ok(Opening::Head(payload))) => payload,
        Ok(Ok(Opening::WebTransport(id))) => {
            drop(deciding);
            if let Some((_, sessions)) = &service.webtransport {
                sessions.bi(id, send, recv);
            }
            return;
        }
        Err(_) | Ok(Err(HeadError::Gone)) => {
            let _ = send.reset(code_of(code::REQUEST_INCOMPLETE));
            return;
        }
        Ok(Err(HeadError::Unexpected(why))) => {
            return close(&conn, code::FRAME_UNEXPECTED, why);
        }
        Ok(Err(HeadError::TooLarge)) => {
            return refuse(&server, send, recv, HandshakeError::HeadTooLarge).await;
        }
    };
    let section = match qpack::decode(&payload, limit) {
        Ok(section) => section,
        Err(QpackError::TooLarge) => {
            return refuse(&server, send, recv, HandshakeError::HeadTooLarge).await;
        }
        Err(error @ QpackError::Invalid(_)) => {
            // A connection error (RFC 9204, section 2.2): our settings
            // allow no dynamic table, or the bytes are not QPACK at all.
            let error = H3Error::from(error);
            tracing::debug!(%peer, %error, "HTTP/3 connection closed");
            conn.close(code_of(error.code()), error.to_string().as_bytes());
            return;
        }
    };
    let head = match RequestHead::parse(section) {
        Ok(head) => head,
        Err(error) => {
            tracing::debug!(%peer, %error, "HTTP/3 request refused");
            let timeout = config.handshake_timeout;
            return answer_error(send, recv, 400, &error.to_string(), timeout).await;
        }
    };
    if let (Some((app, sessions)), Some(_)) = (&service.webtransport, head.webtransport()) {
        super::webtransport::serve(&server, app, sessions, conn, send, recv, head).await;
        drop(deciding);
        return;
    }
    // Not a session.
    drop(deciding);
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
        Err(error) => return refuse(&server, send, recv, error).await,
    };
    match decision {
        Decision::Refused(reject) => {
            let timeout = server.config().handshake_timeout;
            answer_error(send, recv, reject.status(), reject.reason(), timeout).await;
        }
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
            // A peer that gives the stream no room holds no connection
            // slot past the handshake timeout.
            let within = server.config().handshake_timeout;
            let stream = async move {
                match tokio::time::timeout(within, send.write_all(&response)).await {
                    Ok(written) => written?,
                    Err(_) => {
                        let _ = send.reset(code_of(code::REQUEST_CANCELLED));
                        return Err(std::io::ErrorKind::TimedOut.into());
                    }
                }
                let stream = DataStream::new(conn, send, recv, Some(returned));
                Ok(Handed::<_, Infallible>::Stream(stream))
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

/// Refuses an upgrade as the other drivers do: counted, logged, answered.
async fn refuse<H: ServerHandler>(
    server: &crate::stream::Server<H>,
    send: SendStream,
    recv: RecvStream,
    error: HandshakeError,
) {
    server.refused(&error);
    let timeout = server.config().handshake_timeout;
    answer_error(send, recv, error.status(), error.reason(), timeout).await;
}
