//! WebSocket upgrades in an axum 0.8 app (feature `axum`).
//!
//! [`WebSocketUpgrade`] is an extractor shaped like axum's own: take it in a
//! handler, adjust the upgrade with its builder (subprotocols,
//! permessage-deflate, limits), and end with one of
//! - [`on_upgrade`](WebSocketUpgrade::on_upgrade): an async function gets
//!   the connection as a [`WebSocket`] (`recv`/`send`, `Stream`/`Sink`);
//! - [`serve`](WebSocketUpgrade::serve): a [`stream::Server`] serves it with
//!   its [`Handler`] (the callback API), as it serves any stream.
//!
//! Either returns the response: a `101`, or the standalone server's error
//! for a bad request. The connection is then served on the runtime axum
//! runs on: over plain TCP in a tokio connection group (the socket taken
//! back from hyper, as [`hyper`](crate::hyper) does), else (TLS, HTTP/2) by
//! the stream driver.
//!
//! [`stream::Server`]: crate::stream::Server
//! [`Handler`]: crate::Handler
//! [`WebSocket`]: crate::socket::WebSocket
//! [`Config`]: crate::Config
//!
//! ```no_run
//! use axum::response::Response;
//! use axum::routing::get;
//! use rapidws::axum::WebSocketUpgrade;
//!
//! async fn echo(upgrade: WebSocketUpgrade) -> Response {
//!     upgrade.on_upgrade(|mut socket| async move {
//!         while let Some(Ok(message)) = socket.recv().await {
//!             if socket.send(message).await.is_err() {
//!                 break;
//!             }
//!         }
//!     })
//! }
//!
//! # async fn run() -> std::io::Result<()> {
//! let app = axum::Router::new().route("/ws", get(echo));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! Other settings are the serving server's: the `stream::Server`'s
//! [`Config`] for `serve`; for `on_upgrade`, the [`Sockets`] in the
//! request's extensions (`Router::layer(Extension(sockets))`), else a shared
//! one with `Config::default()`. `Conn::peer_addr` is axum's
//! `ConnectInfo<SocketAddr>`, or `0.0.0.0:0` without it.

use std::borrow::Cow;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use ::axum::body::Body;
use ::axum::extract::connect_info::ConnectInfo;
use ::axum::extract::{FromRequestParts, OptionalFromRequestParts};
use ::axum::response::{IntoResponse, Response};
use ::hyper::header::UPGRADE;
use ::hyper::http::request::Parts;
use ::hyper::upgrade::OnUpgrade;
use ::hyper::{HeaderMap, Method, Uri, Version};

use crate::connection::config::Config;
use crate::connection::handler::{Accept, ServerHandler};
use crate::connection::hub::Hub;
use crate::connection::upgrade::Settings;
use crate::driver::surface::{Served, shutdown_methods};
use crate::handshake::HandshakeError;
use crate::hyper::{Answer, HeadRef, decide, extended_protocol, refusal, spawn};
use crate::proto::deflate::DeflateConfig;
use crate::socket::{SocketHandler, WebSocket};

/// An upgrade's function, boxed: what the `on_upgrade` closures become.
type Run = Box<dyn FnOnce(WebSocket) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The server behind [`WebSocketUpgrade::on_upgrade`]: the settings, buffer
/// pool, connection count and shutdown its connections share. Cheap to
/// clone (an `Arc`). Put one in the router's extensions to use it:
///
/// ```no_run
/// use axum::Extension;
/// use rapidws::axum::Sockets;
///
/// # fn app(router: axum::Router) -> axum::Router {
/// let sockets = Sockets::new(rapidws::Config::default().max_message_size(1 << 20));
/// router.layer(Extension(sockets))
/// # }
/// ```
#[derive(Clone)]
pub struct Sockets {
    server: Arc<crate::stream::Server<SocketHandler<Option<Run>>>>,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("handle", &self.handle())
            .finish_non_exhaustive()
    }
}

impl Sockets {
    /// Sockets served with `config`.
    pub fn new(config: Config) -> Self {
        Sockets::with_inbox_limit(config, crate::socket::DEFAULT_INBOX_LIMIT)
    }

    /// Sockets served with `config`, each holding at most `bytes` of
    /// received messages (see [`SocketHandler::inbox_limit`]).
    pub fn with_inbox_limit(config: Config, bytes: usize) -> Self {
        // The extractor answers the upgrade itself and hands each
        // connection its function; the hook only makes room for it.
        let handler = SocketHandler::from_parts(
            Box::new(|_, _| Ok(None)),
            Box::new(|socket, run: Option<Run>| match run {
                Some(run) => run(socket),
                None => Box::pin(async {}),
            }),
        )
        .inbox_limit(bytes);
        Sockets {
            server: Arc::new(crate::stream::Server::new(handler, config)),
        }
    }

    /// The sockets used when a request carries none: `Config::default()`,
    /// made on first use and shared by the whole process.
    pub fn shared() -> Sockets {
        static SHARED: OnceLock<Sockets> = OnceLock::new();
        SHARED
            .get_or_init(|| Sockets::new(Config::default()))
            .clone()
    }

    shutdown_methods! {
        /// New upgrades are answered 503.
        spread:
        /// What `axum::serve`'s graceful shutdown does not do: it stops
        /// accepting but never reaches the WebSocket connections it
        /// upgraded.
    }
}

impl Served for Sockets {
    fn hub(&self) -> &Arc<Hub> {
        self.server.hub()
    }
}

/// Why a request could not be upgraded: the status and reason the client
/// gets (the response is the standalone server's: a plain-text reason, and
/// `Allow: GET` with 405, `Sec-WebSocket-Version: 13` with 426).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    status: u16,
    reason: &'static str,
}

impl Rejection {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The one-line reason sent as the body.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl From<HandshakeError> for Rejection {
    fn from(error: HandshakeError) -> Self {
        Rejection {
            status: error.status(),
            reason: error.reason(),
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

impl std::error::Error for Rejection {}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        refusal(self.status, self.reason).map(Body::new)
    }
}

/// A WebSocket upgrade request, checked (RFC 6455 §4.2.1) when extracted.
/// As `Option<WebSocketUpgrade>` it is `None` for a request without
/// `Upgrade: websocket`, so one route can serve both. See the module docs.
pub struct WebSocketUpgrade {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    /// HTTP/2: the extended CONNECT's `:protocol`.
    protocol: Option<String>,
    upgraded: OnUpgrade,
    peer: SocketAddr,
    sockets: Option<Sockets>,
    /// The subprotocols spoken, most preferred first.
    protocols: Vec<Cow<'static, str>>,
    max_message_size: Option<usize>,
    max_frame_size: Option<usize>,
    /// `Some(None)`: permessage-deflate refused for this upgrade.
    deflate: Option<Option<DeflateConfig>>,
}

impl std::fmt::Debug for WebSocketUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSocketUpgrade")
            .field("uri", &self.uri)
            .field("peer", &self.peer)
            .field("protocols", &self.protocols)
            .finish_non_exhaustive()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for WebSocketUpgrade {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Rejection> {
        check(parts)?;
        let upgraded = parts.extensions.remove::<OnUpgrade>().ok_or(Rejection {
            status: 426,
            reason: "this connection cannot be upgraded",
        })?;
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), |info| info.0);
        Ok(WebSocketUpgrade {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            protocol: extended_protocol(&parts.extensions).map(str::to_owned),
            upgraded,
            peer,
            sockets: parts.extensions.get::<Sockets>().cloned(),
            protocols: Vec::new(),
            max_message_size: None,
            max_frame_size: None,
            deflate: None,
        })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for WebSocketUpgrade {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Option<Self>, Rejection> {
        let upgrade = parts.headers.get_all(UPGRADE).iter().any(|value| {
            value
                .as_bytes()
                .split(|&b| b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"websocket"))
        });
        // HTTP/2: an extended CONNECT with any `:protocol` is meant as one.
        let connect =
            parts.method == Method::CONNECT && extended_protocol(&parts.extensions).is_some();
        if !upgrade && !connect {
            return Ok(None);
        }
        <Self as FromRequestParts<S>>::from_request_parts(parts, state)
            .await
            .map(Some)
    }
}

/// The RFC 6455 checks, run when the request is extracted so that a bad
/// one never reaches the handler.
fn check(parts: &Parts) -> Result<(), Rejection> {
    let head = HeadRef {
        method: &parts.method,
        uri: &parts.uri,
        version: parts.version,
        headers: &parts.headers,
        protocol: extended_protocol(&parts.extensions),
    };
    head.check(|_| ()).map_err(Rejection::from)
}

impl WebSocketUpgrade {
    /// The subprotocols this hub speaks, most preferred first: the
    /// first one the client offered is chosen, and none if the client
    /// offered none of them (the upgrade still succeeds, as RFC 6455 lets
    /// the client decide whether to go on). With [`serve`], the handler's
    /// `on_upgrade` sees this choice in its `Accept` and may change it.
    ///
    /// [`serve`]: WebSocketUpgrade::serve
    pub fn protocols<I>(mut self, protocols: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<Cow<'static, str>>,
    {
        self.protocols = protocols.into_iter().map(Into::into).collect();
        self
    }

    /// The subprotocol that will be chosen (see [`protocols`]).
    ///
    /// [`protocols`]: WebSocketUpgrade::protocols
    pub fn selected_protocol(&self) -> Option<&str> {
        let offered: Vec<&str> = self
            .headers
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect();
        self.protocols
            .iter()
            .map(|protocol| protocol.as_ref())
            .find(|protocol| offered.contains(protocol))
    }

    /// permessage-deflate for this upgrade: offered with these settings, or
    /// refused with `None`. By default the server's setting applies
    /// (`Config::permessage_deflate`, off unless set).
    pub fn permessage_deflate(mut self, deflate: impl Into<Option<DeflateConfig>>) -> Self {
        self.deflate = Some(deflate.into());
        self
    }

    /// The largest message accepted, summed over its fragments; a larger
    /// one closes the connection with 1009. By default the server's.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = Some(bytes);
        self
    }

    /// The largest frame payload accepted; a larger one closes the
    /// connection with 1009. By default the server's.
    pub fn max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = Some(bytes);
        self
    }

    /// Upgrades, and once the connection is open runs `serve` with it on a
    /// task of the current runtime. Returns the response for axum to send.
    pub fn on_upgrade<F, Fut>(self, serve: F) -> Response
    where
        F: FnOnce(WebSocket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let sockets = self.sockets.clone().unwrap_or_else(Sockets::shared);
        let run: Run = Box::new(move |socket| Box::pin(serve(socket)));
        self.finish(&sockets.server, |state| state.set_value(Some(run)))
    }

    /// Upgrades, and serves the connection through `server` (its
    /// [`Handler`](crate::Handler), its config but for what this builder changed). The
    /// handler's `on_upgrade` decides as it does on the standalone server;
    /// its `Accept` starts with the subprotocol chosen from
    /// [`protocols`](WebSocketUpgrade::protocols).
    pub fn serve<H: ServerHandler>(self, server: &crate::stream::Server<H>) -> Response {
        self.finish(server, |_| ())
    }

    /// The decision and the response; `prepare` gets the state of an
    /// accepted connection before it opens.
    fn finish<H: ServerHandler>(
        self,
        server: &crate::stream::Server<H>,
        prepare: impl FnOnce(&mut H::State),
    ) -> Response {
        let mut accept = Accept::default();
        if let Some(protocol) = self.selected_protocol() {
            accept.protocol(protocol.to_owned());
        }
        let settings = self.settings(server.config()).map(Box::new);
        let head = HeadRef {
            method: &self.method,
            uri: &self.uri,
            version: self.version,
            headers: &self.headers,
            protocol: self.protocol.as_deref(),
        };
        match decide(server, &head, accept, settings.as_deref()) {
            Answer::Accepted {
                mut state,
                deflate,
                settings,
                response,
            } => {
                prepare(&mut state);
                spawn(server, self.upgraded, self.peer, state, deflate, settings);
                response.map(Body::new)
            }
            Answer::Refused(response) => response.map(Body::new),
        }
    }

    /// The connection's own settings, if the builder changed any.
    fn settings(&self, base: &Config) -> Option<Settings> {
        if self.max_message_size.is_none()
            && self.max_frame_size.is_none()
            && self.deflate.is_none()
        {
            return None;
        }
        let mut limits = base.limits();
        if let Some(bytes) = self.max_message_size {
            limits.max_message_size = bytes;
        }
        if let Some(bytes) = self.max_frame_size {
            limits.max_frame_size = bytes;
        }
        let deflate = match &self.deflate {
            Some(deflate) => *deflate,
            None => base.deflate().copied(),
        };
        Some(Settings { limits, deflate })
    }
}
