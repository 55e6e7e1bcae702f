//! WebSocket upgrades inside a hyper 1.x HTTP/1.1 server (feature `hyper`).
//!
//! [`upgrade`] answers a `hyper::Request` the way the standalone server
//! answers a raw one: the same RFC 6455 checks
//! ([`handshake::check_request`](crate::handshake::check_request)), the same
//! connection limit, upgrade hook, subprotocol check and permessage-deflate
//! negotiation, the same statuses and reasons for a bad request (400, 405
//! with `Allow: GET`, 426 with `Sec-WebSocket-Version: 13`, 503, the hook's
//! own). It returns the response for the service to return; once hyper has
//! written the `101` and hands over the connection, it is served on the
//! current runtime with the server's handler, limits, keepalive and
//! shutdown: over plain TCP the socket is taken back from hyper and joins a
//! tokio connection group (an idle connection then costs what one the
//! tokio server accepted does), and anything else (TLS, an HTTP/2 stream)
//! runs through the [`stream`](crate::stream) driver on a task.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use std::net::SocketAddr;
//!
//! use http_body_util::Full;
//! use hyper::body::{Bytes, Incoming};
//! use hyper::{Request, Response};
//! use rapidws::{Accept, Conn, Handler, Message, Reject, ServerHandler};
//!
//! struct Echo;
//!
//! impl Handler for Echo {
//!     type State = ();
//!
//!     fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
//!         let _ = conn.send(message);
//!     }
//! }
//!
//! impl ServerHandler for Echo {
//!     fn on_upgrade(&self, _: &rapidws::Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//!
//! /// Each hyper connection's service.
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
use ::hyper::upgrade::OnUpgrade;
use ::hyper::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use crate::connection::handler::{Accept, ServerHandler};
use crate::connection::upgrade::{Decision, Settings};
use crate::handshake::{
    HandshakeError, accept_key, check_extended_connect, check_request, error_header, first_line,
    write_response_value,
};
use crate::proto::deflate::DeflateParams;
use crate::stream::Handed;

/// Answers `request` for `server` (see the module docs): a `101` whose
/// connection is served once hyper hands it over, or an error response.
/// `peer` is what `Conn::peer_addr` reports. Call it from a service running
/// on a tokio runtime: the connection's task is spawned there.
pub fn upgrade<H: ServerHandler, B>(
    server: &crate::stream::Server<H>,
    mut request: Request<B>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let upgraded = ::hyper::upgrade::on(&mut request);
    let head = HeadRef {
        method: request.method(),
        uri: request.uri(),
        version: request.version(),
        headers: request.headers(),
        protocol: extended_protocol(request.extensions()),
    };
    match decide(server, &head, Accept::default(), None) {
        Answer::Accepted {
            state,
            deflate,
            settings,
            response,
        } => {
            spawn(server, upgraded, peer, state, deflate, settings);
            response
        }
        Answer::Refused(response) => response,
    }
}

/// An upgrade request's head as hyper gives it.
pub(crate) struct HeadRef<'a> {
    pub(crate) method: &'a Method,
    pub(crate) uri: &'a Uri,
    pub(crate) version: Version,
    pub(crate) headers: &'a HeaderMap,
    /// HTTP/2: the `:protocol` of an extended CONNECT (RFC 8441).
    pub(crate) protocol: Option<&'a str>,
}

/// The `:protocol` pseudo-header hyper keeps in a request's extensions
/// (HTTP/2 extended CONNECT, feature `http2`).
pub(crate) fn extended_protocol(extensions: &::hyper::http::Extensions) -> Option<&str> {
    #[cfg(feature = "http2")]
    {
        extensions
            .get::<::hyper::ext::Protocol>()
            .map(::hyper::ext::Protocol::as_str)
    }

    #[cfg(not(feature = "http2"))]
    {
        let _ = extensions;
        None
    }
}

impl HeadRef<'_> {
    /// The head's length as HTTP/1.1 writes it (request line, headers,
    /// blank line): what `Config::max_handshake_size` bounds on the
    /// standalone servers, so an upgrade through hyper or axum is refused
    /// (431) where theirs would be, whatever hyper itself let through.
    fn len(&self) -> usize {
        let target = self.uri.path_and_query().map_or(1, |t| t.as_str().len());
        let request_line = self.method.as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
            .sum();
        request_line + headers + 2
    }

    /// Runs the RFC 6455 checks ([`check_request`]), or over HTTP/2 the RFC
    /// 8441 ones ([`check_extended_connect`]), and gives the checked request
    /// to `then`.
    pub(crate) fn check<R>(
        &self,
        then: impl FnOnce(&crate::handshake::Request<'_>) -> R,
    ) -> Result<R, HandshakeError> {
        let version = match self.version {
            Version::HTTP_11 => 1,
            Version::HTTP_10 => 0,
            // Refused by the check as "not HTTP/1.1" (400).
            _ => u8::MAX,
        };
        let mut headers: Vec<httparse::Header<'_>> = self
            .headers
            .iter()
            .map(|(name, value)| httparse::Header {
                name: name.as_str(),
                value: value.as_bytes(),
            })
            .collect();
        // HTTP/2's `:authority` stands for `Host` (RFC 9113 §8.3.1): what
        // the `Origin` check compares with.
        if let Some(authority) = self.uri.authority()
            && self.version == Version::HTTP_2
            && !self.headers.contains_key(::hyper::header::HOST)
        {
            headers.push(httparse::Header {
                name: "host",
                value: authority.as_str().as_bytes(),
            });
        }
        let target = self
            .uri
            .path_and_query()
            .map_or("/", |target| target.as_str());
        let method = self.method.as_str();
        let checked = if self.version == Version::HTTP_2 {
            check_extended_connect(method, self.protocol, target, &headers)?
        } else {
            check_request(method, target, version, &headers)?
        };
        Ok(then(&checked))
    }
}

/// What `server` answers to an upgrade request.
pub(crate) enum Answer<S> {
    /// The `101`, and what serving the connection needs.
    Accepted {
        state: S,
        deflate: Option<DeflateParams>,
        /// The connection's own settings (the builder's, the hook's limits).
        settings: Option<Box<Settings>>,
        response: Response<Full<Bytes>>,
    },
    /// An error response.
    Refused(Response<Full<Bytes>>),
}

/// The standalone server's checks and decision on a request hyper parsed:
/// the `101` to answer with, or the error response. The upgrade hook starts
/// from `accept`; `settings` are the connection's own, if any.
pub(crate) fn decide<H: ServerHandler>(
    server: &crate::stream::Server<H>,
    head: &HeadRef<'_>,
    accept: Accept,
    settings: Option<&Settings>,
) -> Answer<H::State> {
    // HTTP/2 has no key: its answer is a 200 without an accept key.
    let http2 = head.version == Version::HTTP_2;
    let decision = if head.len() > server.config().max_handshake_size {
        Err(HandshakeError::HeadTooLarge)
    } else {
        head.check(|checked| {
            let decision = server.decide(checked, accept, settings);
            (decision, (!http2).then(|| accept_key(checked.key())))
        })
    };
    let (decision, key) = match decision {
        Ok(decided) => decided,
        Err(error) => {
            server.refused(&error);
            return Answer::Refused(refusal(error.status(), error.reason()));
        }
    };
    match decision {
        Decision::Refused(reject) => Answer::Refused(refusal(reject.status(), reject.reason())),
        Decision::Accepted {
            state,
            accept,
            deflate,
        } => {
            let response = switching(key.as_ref(), accept.chosen_protocol(), deflate.as_ref());
            Answer::Accepted {
                state,
                deflate,
                settings: crate::connection::upgrade::settings(&accept, settings, server.config()),
                response,
            }
        }
    }
}

/// Serves the connection on a task of the current runtime once hyper hands
/// over the upgraded IO. IO that is plain TCP (hyper's own HTTP/1.1
/// connection, or hyper-util's `auto` builder's, which `axum::serve` uses)
/// is taken back from hyper and joins a connection group of this runtime
/// (`ToGroups`): the task then ends, and an idle connection costs what
/// one accepted by the tokio server does. Anything else (TLS, an HTTP/2
/// stream) is served by the stream driver on the task.
pub(crate) fn spawn<H: ServerHandler>(
    server: &crate::stream::Server<H>,
    upgraded: OnUpgrade,
    peer: SocketAddr,
    state: H::State,
    deflate: Option<DeflateParams>,
    settings: Option<Box<Settings>>,
) {
    #[cfg(feature = "tokio")]
    let to = ToGroups(server.clone());
    let handed = async move {
        let upgraded = upgraded.await.map_err(std::io::Error::other)?;
        #[cfg(feature = "tokio")]
        let upgraded = match taken_back(upgraded) {
            // Out of tokio's reactor, or gone: a failed deregistration is
            // the only failure.
            Ok(tcp) => {
                let (socket, read) = tcp?;
                return Ok(Handed::Tcp { socket, read, to });
            }
            Err(upgraded) => upgraded,
        };
        #[cfg(feature = "tokio")]
        return Ok(Handed::<_, ToGroups<H>>::Stream(TokioIo::new(upgraded)));
        #[cfg(not(feature = "tokio"))]
        Ok(Handed::<_, std::convert::Infallible>::Stream(TokioIo::new(
            upgraded,
        )))
    };
    tokio::spawn(server.serve_upgraded_later(handed, peer, state, deflate, settings));
}

/// Where hyper's upgrades taken back as TCP go: the least loaded
/// connection group of the current runtime, chosen as the connection
/// arrives; the groups start at the first one. It holds the server, so
/// they stay up while an upgrade is on its way. If they cannot start (no
/// descriptor left for an epoll), the socket is served by the stream
/// driver on a task of its own.
#[cfg(feature = "tokio")]
struct ToGroups<H: ServerHandler>(crate::stream::Server<H>);

#[cfg(feature = "tokio")]
impl<H: ServerHandler> crate::stream::Join<H::State> for ToGroups<H> {
    fn join(
        self,
        socket: std::net::TcpStream,
        peer: SocketAddr,
        live: crate::connection::hub::LiveGuard,
        upgraded: crate::connection::upgrade::Upgraded<H::State>,
    ) {
        let server = &self.0;
        let env = server.env();
        let groups = server.kept(crate::tokio::RuntimeGroups::<H::State>::default);
        match groups.least_loaded(env) {
            Ok(group) => group.hand_over_upgraded(socket, peer, live, upgraded, &env.hub.config),
            Err(error) => {
                tracing::warn!(%error, "could not start connection groups; this upgrade is served on a task");
                match tokio::net::TcpStream::from_std(socket) {
                    Ok(tcp) => {
                        let start = crate::stream::Start::Upgraded(Box::new(upgraded));
                        let now = std::time::Instant::now();
                        tokio::spawn(crate::stream::serve(
                            tcp,
                            peer,
                            start,
                            live,
                            env.clone(),
                            now,
                        ));
                    }
                    Err(error) => {
                        tracing::warn!(%peer, %error, "could not serve an upgraded socket; dropped")
                    }
                }
            }
        }
    }
}

/// The TCP socket under `upgraded`, with the bytes hyper read past the
/// request, if hyper served it as `TokioIo<TcpStream>` (directly, or under
/// hyper-util's `auto` builder); `upgraded` back otherwise.
#[cfg(feature = "tokio")]
fn taken_back(
    upgraded: ::hyper::upgrade::Upgraded,
) -> Result<std::io::Result<(std::net::TcpStream, bytes::BytesMut)>, ::hyper::upgrade::Upgraded> {
    type Tcp = TokioIo<tokio::net::TcpStream>;
    let (io, read) = match upgraded.downcast::<Tcp>() {
        Ok(parts) => (parts.io, parts.read_buf),
        Err(upgraded) => {
            let parts = hyper_util::server::conn::auto::upgrade::downcast::<Tcp>(upgraded)?;
            (parts.io, parts.read_buf)
        }
    };
    // Out of tokio's reactor, for a group's epoll; it stays non-blocking.
    let socket = io.into_inner().into_std();
    Ok(socket.map(|socket| (socket, bytes::BytesMut::from(read))))
}

/// The `101` with this `Sec-WebSocket-Accept`; without one (HTTP/2), the
/// `200` that opens the stream (RFC 8441 §5).
fn switching(
    key: Option<&[u8; 28]>,
    protocol: Option<&str>,
    deflate: Option<&DeflateParams>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    if key.is_some() {
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    }
    let fields = response.headers_mut();
    if let Some(key) = key {
        fields.insert(
            ::hyper::header::UPGRADE,
            HeaderValue::from_static("websocket"),
        );
        fields.insert(
            ::hyper::header::CONNECTION,
            HeaderValue::from_static("Upgrade"),
        );
        fields.insert(
            HeaderName::from_static("sec-websocket-accept"),
            HeaderValue::from_bytes(key).expect("base64 is a valid header value"),
        );
    }
    if let Some(protocol) = protocol {
        // The client offered it, so it is a valid header value.
        if let Ok(value) = HeaderValue::from_str(protocol) {
            fields.insert(HeaderName::from_static("sec-websocket-protocol"), value);
        }
    }
    if let Some(params) = deflate {
        let mut value = Vec::with_capacity(96);
        write_response_value(params, |piece| value.extend_from_slice(piece));
        fields.insert(
            HeaderName::from_static("sec-websocket-extensions"),
            HeaderValue::from_bytes(&value).expect("ASCII parameters"),
        );
    }
    response
}

/// An error response like the standalone server's: the status, a one-line
/// plain-text reason, and the header RFC 6455 or RFC 9110 asks for.
pub(crate) fn refusal(status: u16, reason: &str) -> Response<Full<Bytes>> {
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
