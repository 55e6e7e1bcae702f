//! WebSocket upgrades inside a hyper 1.x HTTP/1.1 server (feature `hyper`).
//!
//! [`upgrade`] answers a `hyper::Request` the way the standalone server
//! answers a raw one: the same RFC 6455 checks
//! ([`handshake::check_request`](crate::handshake::check_request)), the same
//! connection limit, upgrade hook, subprotocol check and permessage-deflate
//! negotiation, the same statuses and reasons for a bad request (400, 405
//! with `Allow: GET`, 426 with `Sec-WebSocket-Version: 13`, 503, the hook's
//! own). It returns the response for the service to return; once hyper has
//! written the `101` and hands over the connection, a task on the current
//! runtime serves it through the [`stream`](crate::stream) driver, with the
//! server's handler, limits, keepalive and shutdown.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use std::net::SocketAddr;
//!
//! use http_body_util::Full;
//! use hyper::body::{Bytes, Incoming};
//! use hyper::{Request, Response};
//! use rapidws::{Accept, Conn, Handler, Message, Reject};
//!
//! struct Echo;
//! impl Handler for Echo {
//!     type State = ();
//!     fn on_upgrade(&self, _: &rapidws::Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//!     fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
//!         let _ = conn.send(message);
//!     }
//! }
//!
//! async fn route(
//!     ws: &rapidws::stream::Server<Echo>,
//!     request: Request<Incoming>,
//!     peer: SocketAddr,
//! ) -> Result<Response<Full<Bytes>>, Infallible> {
//!     if request.uri().path() == "/ws" {
//!         return Ok(rapidws::hyper::upgrade(ws, request, peer));
//!     }
//!     Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
//! }
//! ```
//!
//! Serve the hyper connection `with_upgrades()`, or the upgraded IO never
//! comes (the connection is then dropped without `on_open`).

use std::net::SocketAddr;

use ::hyper::body::Bytes;
use ::hyper::header::{HeaderName, HeaderValue};
use ::hyper::{Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use crate::handler::Handler;
use crate::handshake::{accept_key, check_request, error_header, first_line, write_response_value};
use crate::upgrade::Decision;

/// Answers `request` for `server` (see the module docs): a `101` whose
/// connection is served once hyper hands it over, or an error response.
/// `peer` is what `Conn::peer_addr` reports. Call it from a service running
/// on a tokio runtime: the connection's task is spawned there.
pub fn upgrade<H: Handler, B>(
    server: &crate::stream::Server<H>,
    mut request: Request<B>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let version = match request.version() {
        Version::HTTP_11 => 1,
        Version::HTTP_10 => 0,
        // Refused by the check as "not HTTP/1.1" (400).
        _ => u8::MAX,
    };
    let headers: Vec<httparse::Header<'_>> = request
        .headers()
        .iter()
        .map(|(name, value)| httparse::Header {
            name: name.as_str(),
            value: value.as_bytes(),
        })
        .collect();
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let checked = match check_request(request.method().as_str(), target, version, &headers) {
        Ok(checked) => checked,
        Err(error) => {
            tracing::debug!(
                status = error.status(),
                reason = error.reason(),
                "refused upgrade"
            );
            return refusal(error.status(), error.reason());
        }
    };
    let (state, response, deflate) = match server.decide(&checked) {
        Decision::Refused(reject) => return refusal(reject.status(), reject.reason()),
        Decision::Accepted {
            state,
            accept,
            deflate,
        } => {
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let fields = response.headers_mut();
            fields.insert(
                ::hyper::header::UPGRADE,
                HeaderValue::from_static("websocket"),
            );
            fields.insert(
                ::hyper::header::CONNECTION,
                HeaderValue::from_static("Upgrade"),
            );
            let key = accept_key(checked.key());
            fields.insert(
                HeaderName::from_static("sec-websocket-accept"),
                HeaderValue::from_bytes(&key).expect("base64 is a valid header value"),
            );
            if let Some(protocol) = accept.chosen_protocol() {
                // The client offered it, so it is a valid header value.
                if let Ok(value) = HeaderValue::from_str(protocol) {
                    fields.insert(HeaderName::from_static("sec-websocket-protocol"), value);
                }
            }
            if let Some(params) = &deflate {
                let mut value = Vec::with_capacity(96);
                write_response_value(params, |piece| value.extend_from_slice(piece));
                fields.insert(
                    HeaderName::from_static("sec-websocket-extensions"),
                    HeaderValue::from_bytes(&value).expect("ASCII parameters"),
                );
            }
            (state, response, deflate)
        }
    };
    drop(headers);
    let upgraded = ::hyper::upgrade::on(&mut request);
    let stream = async move {
        upgraded
            .await
            .map(TokioIo::new)
            .map_err(std::io::Error::other)
    };
    tokio::spawn(server.serve_upgraded_later(stream, peer, state, deflate));
    response
}

/// An error response like the standalone server's: the status, a one-line
/// plain-text reason, and the header RFC 6455 or RFC 9110 asks for.
fn refusal(status: u16, reason: &str) -> Response<Full<Bytes>> {
    let line = first_line(reason);
    let mut response = Response::new(Full::new(Bytes::from(format!("{line}\n"))));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let fields = response.headers_mut();
    fields.insert(
        ::hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some((name, value)) = error_header(status) {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid field name");
        fields.insert(name, HeaderValue::from_static(value));
    }
    response
}
