//! One request stream on the server: its head read and checked, answered
//! with a `200` that opens a WebSocket (RFC 9220) or an error, and the
//! WebSocket then served by the stream driver.

use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::frame::kind;
use rapidws_core::h3::{H3Error, QpackError, RequestHead, code, put_headers, qpack};

use super::data::DataStream;
use super::wire::{HeadError, close, code_of, read_headers};
use crate::connection::handler::{Accept, ServerHandler};
use crate::connection::upgrade::Decision;
use crate::handshake::{HandshakeError, error_header, first_line, write_response_value};

/// How long a finished stream waits for the peer to acknowledge its last
/// bytes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

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
    let read = tokio::time::timeout(config.handshake_timeout, read_headers(&mut recv, limit)).await;
    let payload = match read {
        Ok(Ok(payload)) => payload,
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
                Ok(DataStream::new(conn, send, recv, Some(returned)))
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

/// An error response like the other drivers': the status, a one-line
/// plain-text reason, and the field RFC 6455 or RFC 9110 asks for; then
/// the stream's end (written within `within`, or the stream is reset).
/// The rest of the request is not wanted: STOP_SENDING with
/// `H3_NO_ERROR` (RFC 9114, 4.1.1).
async fn answer_error(
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
