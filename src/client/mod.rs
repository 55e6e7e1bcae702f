//! The client: connect to a `ws://` or `wss://` URL (directly, through an
//! HTTP CONNECT or SOCKS5 proxy, or over a stream you already have) and use
#![cfg_attr(
    feature = "socket",
    doc = "the connection as an async [`WebSocket`] or through a [`Handler`], on the"
)]
#![cfg_attr(
    not(feature = "socket"),
    doc = "the connection as an async `WebSocket` (feature `socket`) or through a [`Handler`], on the"
)]
//! same core as the server.
//!
//! ```no_run
//! # async fn run() -> Result<(), rapidws::client::ConnectError> {
//! let (mut socket, response) = rapidws::client::connect("ws://127.0.0.1:9001/").await?;
//! println!("subprotocol: {:?}", response.protocol());
//! socket.send("hello").await.ok();
//! while let Some(Ok(message)) = socket.recv().await {
//!     println!("{message:?}");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A [`Client`] holds what its connections share: the [`Config`] (limits,
//! timeouts, keepalive, the permessage-deflate offer with every parameter),
//! the connect timeout, `TCP_NODELAY`, the TLS config and the proxy. Each
//! [`ConnectRequest`] says what one connection asks for: the URL, extra headers,
//! subprotocols. Make one client and share it (it is cheap to clone); its
//! [`Client::shutdown`] closes every connection it opened with 1001.
//!
//! How a connection is made, and what bounds each step:
//! 1. the URL is parsed ([`ConnectError::Url`]);
//! 2. the host is resolved on the runtime and TCP connected, trying each
//!    address in turn ([`ConnectError::Dns`], [`ConnectError::Connect`]); through a
//!    proxy, the proxy is, and then it opens the tunnel ([`ConnectError::Proxy`]).
//!    [`Client::connect_timeout`] (10 s) bounds all of it;
//! 3. for `wss`, the TLS handshake with the URL's host as the server name
//!    ([`ConnectError::Tls`]);
//! 4. the upgrade request, and the response read and checked
//!    ([`ConnectError::Status`] for an answer other than 101, with its headers and
//!    the start of its body; [`ConnectError::Handshake`] for a `101` that breaks
//!    the protocol). [`Config::handshake_timeout`] bounds steps 3 and 4;
//! 5. the connection opens on the current tokio runtime, and `connect`
//!    returns. A plain `ws` connection joins one of the client's connection
//!    groups, as a tokio server's accepted sockets do (an idle `Handler`
//!    connection costs about what an accepted one does, one with the async
//!    socket 814 bytes: BENCHMARKS.md); `wss`, and a stream of the caller's, get a task of
//!    their own (the stream driver). Either way masking, pongs, the close
//!    handshake, limits and close codes are the core's, as on a server.
//!
#![cfg_attr(
    feature = "http3",
    doc = "With [`Client::http3`] (feature `http3`), `wss://` goes over HTTP/3"
)]
#![cfg_attr(
    not(feature = "http3"),
    doc = "With `Client::http3` (feature `http3`), `wss://` goes over HTTP/3"
)]
//! instead (RFC 9220): QUIC to the URL's host and port in step 2, TLS in
//! QUIC's handshake, an extended CONNECT for step 4 (its answer a `200`);
//! falling back to TCP is the caller's choice (see there).
//!
//! Once open, a client connection is a server connection with the other
//! role: its frames are masked, it fails a masked frame from the server
//! (1002), and after the close handshake it waits for the server to close
//! TCP first (RFC 6455 §7.1.1), at most `close_timeout`.

mod error;
#[cfg(feature = "http3")]
mod h3;
pub mod proxy;
#[cfg(feature = "socket")]
mod sockets;
#[cfg(all(feature = "bus", feature = "socket"))]
pub mod subscriber;
#[cfg(feature = "rustls")]
mod tls;
mod upgrade;
pub mod url;

pub use error::{ConnectError, MAX_REFUSAL_BODY, ProxyError, Refusal, Stage};
pub use proxy::Proxy;
#[cfg(feature = "socket")]
pub use sockets::{Inboxes, Slot};
#[cfg(all(feature = "bus", feature = "socket"))]
pub use subscriber::Subscriber;
pub use upgrade::Response;

/// The old name of [`ConnectError`] (one `Error` was too many beside
/// `socket::Error`).
#[deprecated(since = "0.2.0", note = "renamed `ConnectError`")]
pub type Error = ConnectError;
/// The old name of [`ConnectRequest`] (beside the server's `Request`).
#[deprecated(since = "0.2.0", note = "renamed `ConnectRequest`")]
pub type Request = ConnectRequest;
/// The old name of [`Inboxes`] (beside `axum::Sockets`).
#[cfg(feature = "socket")]
#[deprecated(since = "0.2.0", note = "renamed `Inboxes`")]
pub type Sockets = Inboxes;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use self::url::{Host, Url};
use crate::connection::config::Config;
use crate::connection::conn::Conn;
use crate::connection::handler::Handler;
use crate::connection::hub::Hub;
use crate::connection::lifecycle::Env;
use crate::connection::upgrade::Upgraded;
use crate::driver::surface::{Served, shutdown_methods};
use crate::proto::Role;
#[cfg(feature = "socket")]
use crate::socket::WebSocket;
#[cfg(feature = "socket")]
use crate::socket::inbox::Inbox;
use crate::stream::{Start, serve};
use crate::tokio::RuntimeGroups;
use crate::tokio::group::Incoming;

/// Connects with a client shared by the whole process (default [`Config`],
/// no permessage-deflate, TLS from the `webpki-roots` or `native-roots`
/// feature): [`Client::connect`] on it. Its plain `ws` connections live on
/// the runtime that made each (each `#[tokio::test]` has its own) and end
/// with it.
#[cfg(feature = "socket")]
pub async fn connect(
    request: impl Into<ConnectRequest>,
) -> Result<(WebSocket, Response), ConnectError> {
    static DEFAULT: std::sync::OnceLock<Client> = std::sync::OnceLock::new();
    DEFAULT
        .get_or_init(|| Client::new(Config::default()))
        .connect(request)
        .await
}

/// What one connection asks for: the URL, extra headers, subprotocols,
/// and the stream to use, if the caller has one.
pub struct ConnectRequest {
    url: String,
    headers: Vec<(String, String)>,
    protocols: Vec<String>,
    stream: Option<Box<dyn Io>>,
}

/// A stream a connection can run over.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for S {}

impl std::fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("url", &self.url)
            .field("headers", &self.headers)
            .field("protocols", &self.protocols)
            .field("stream", &self.stream.is_some())
            .finish()
    }
}

impl ConnectRequest {
    /// A request for `url` (`ws://host[:port][/path][?query]` or `wss://`).
    /// It is parsed when the connection is made.
    pub fn new(url: impl Into<String>) -> Self {
        ConnectRequest {
            url: url.into(),
            headers: Vec::new(),
            protocols: Vec::new(),
            stream: None,
        }
    }

    /// An extra header field (`Origin`, `Authorization`, `User-Agent`, ...).
    /// The handshake's own (`Host`, `Upgrade`, `Connection`,
    /// `Sec-WebSocket-*`) are refused with [`ConnectError::Request`].
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Offers a subprotocol (in order of preference, one call each); read
    /// the server's choice from [`Response::protocol`].
    pub fn protocol(mut self, protocol: impl Into<String>) -> Self {
        self.protocols.push(protocol.into());
        self
    }

    /// Runs the connection over `stream`, a byte stream that already
    /// reaches the server (a Unix socket, a tunnel): no name is resolved
    /// and no TCP or proxy connection made. The URL still gives the `Host`
    /// header and the path, and `wss` still runs TLS over the stream. The
    /// connection's `Conn::peer_addr` is then `0.0.0.0:0`.
    pub fn over(mut self, stream: impl Io) -> Self {
        self.stream = Some(Box::new(stream));
        self
    }
}

/// What the upgrade request carries besides the URL (a [`ConnectRequest`]
/// without its stream, which need not be `Sync`).
pub(crate) struct Asked {
    headers: Vec<(String, String)>,
    protocols: Vec<String>,
}

impl Asked {
    /// `ws://user:password@host/`: the credentials go in an `Authorization:
    /// Basic` header, unless the request has one of its own.
    fn add_url_credentials(&mut self, url: &Url) {
        let Some((user, password)) = &url.credentials else {
            return;
        };
        let has_own = self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("authorization"));
        if !has_own {
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            self.headers
                .push(("Authorization".to_owned(), format!("Basic {token}")));
        }
    }

    pub(crate) fn protocols(&self) -> Vec<&str> {
        self.protocols.iter().map(String::as_str).collect()
    }

    pub(crate) fn header_pairs(&self) -> Vec<(&str, &str)> {
        let pairs = self.headers.iter();
        pairs.map(|(n, v)| (n.as_str(), v.as_str())).collect()
    }

    /// Fails before anything is connected if the request cannot be written.
    fn check(&self, url: &Url, config: &Config) -> Result<(), ConnectError> {
        let host = upgrade::host_header(url);
        let (protocols, headers) = (self.protocols(), self.header_pairs());
        upgrade::client_request(&host, url, &protocols, &headers, config)
            .check()
            .map_err(ConnectError::Request)
    }
}

impl From<&str> for ConnectRequest {
    fn from(url: &str) -> Self {
        ConnectRequest::new(url)
    }
}

impl From<String> for ConnectRequest {
    fn from(url: String) -> Self {
        ConnectRequest::new(url)
    }
}

impl From<&String> for ConnectRequest {
    fn from(url: &String) -> Self {
        ConnectRequest::new(url.as_str())
    }
}

/// Which proxy connections go through.
#[derive(Clone, Debug)]
enum ProxyChoice {
    Direct,
    Fixed(Proxy),
    FromEnv,
}

#[derive(Clone)]
struct Options {
    connect_timeout: Duration,
    nodelay: bool,
    proxy: ProxyChoice,
    #[cfg(feature = "rustls")]
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `wss://` over HTTP/3 ([`Client::http3`]).
    #[cfg(feature = "http3")]
    http3: bool,
}

/// Defines `Client`, with `Inboxes` as its handler by default when the
/// async socket API is built (`socket`), and none otherwise.
macro_rules! client {
    ($inboxes:literal, $($default:tt)*) => {
        /// Opens client connections and drives them; see the module docs.
        ///
        /// A connection's `Conn::peer_addr` is the address its TCP connection went
        /// to: the server's, or the proxy's when it went through one.
        ///
        #[doc = $inboxes]
        /// `Client<H>` ([`Client::with_handler`]) runs a [`Handler`] for each
        /// connection, as a server does, with the state given to
        /// [`Client::connect_with`].
        pub struct Client<H: Handler $($default)*> {
            env: Env<H>,
            options: Options,
            /// The connection groups plain `ws` connections join (as a tokio
            /// server's accepted sockets do), started on each runtime that
            /// connects; they end with their last connection once every
            /// clone is gone.
            groups: Arc<RuntimeGroups<H::State>>,
        }
    };
}

// The first line of the docs differs: without `socket` there is no
// `Inboxes`, `Client::new` or `WebSocket` to link to.
#[cfg(feature = "socket")]
client!(
    "`Client<Inboxes>` ([`Client::new`]) hands out [`WebSocket`]s;",
    = Inboxes
);
#[cfg(not(feature = "socket"))]
client!("Without the `socket` feature there is no async socket:",);

impl<H: Handler> Clone for Client<H> {
    fn clone(&self) -> Self {
        Client {
            env: self.env.clone(),
            options: self.options.clone(),
            groups: self.groups.clone(),
        }
    }
}

impl<H: Handler> Served for Client<H> {
    fn hub(&self) -> &Arc<Hub> {
        &self.env.hub
    }
}

impl<H: Handler> std::fmt::Debug for Client<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("connect_timeout", &self.options.connect_timeout)
            .field("nodelay", &self.options.nodelay)
            .field("proxy", &self.options.proxy)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "socket")]
impl Client<Inboxes> {
    /// A client whose connections are [`WebSocket`]s.
    pub fn new(config: Config) -> Self {
        Client::with_handler(Inboxes::default(), config)
    }

    /// Bytes of received messages a socket may hold before its connection
    /// stops reading (as `SocketHandler::inbox_limit`; default 1 MiB).
    pub fn inbox_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.env.handler).inbox_limit = bytes;
        self
    }

    /// Connects and returns the open socket and the server's `101`.
    pub async fn connect(
        &self,
        request: impl Into<ConnectRequest>,
    ) -> Result<(WebSocket, Response), ConnectError> {
        let inbox = Arc::new(Inbox::new(self.env.handler.inbox_limit));
        let slot = Slot {
            inbox: inbox.clone(),
        };
        let (conn, response) = self.connect_with(request, slot).await?;
        Ok((WebSocket::new(conn, inbox), response))
    }
}

impl<H: Handler> Client<H> {
    /// A client that runs `handler` for each connection: `on_open`,
    /// `on_message`, `on_drain`, `on_close` as on a server. Any
    /// [`Handler`] will do (a server's [`ServerHandler`](crate::ServerHandler)
    /// callbacks are never asked for): the state comes with
    /// [`Client::connect_with`].
    pub fn with_handler(handler: H, config: Config) -> Self {
        Client {
            env: Env {
                hub: Hub::new(config, "client"),
                handler: Arc::new(handler),
                hooks: None,
            },
            options: Options {
                connect_timeout: Duration::from_secs(10),
                nodelay: true,
                proxy: ProxyChoice::Direct,
                #[cfg(feature = "rustls")]
                tls: None,
                #[cfg(feature = "http3")]
                http3: false,
            },
            groups: Arc::default(),
        }
    }

    /// How long resolving, connecting TCP and opening a proxy's tunnel may
    /// take together (default 10 s). The TLS handshake and the upgrade are
    /// bounded by `Config::handshake_timeout`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// Sets `TCP_NODELAY` on new connections (default on: a WebSocket
    /// message is written whole, so Nagle's delay only adds latency).
    pub fn nodelay(mut self, nodelay: bool) -> Self {
        self.options.nodelay = nodelay;
        self
    }

    /// The TLS config for `wss` (its roots, client certificates, crypto
    /// provider). ALPN is set to `http/1.1`. Without it, a config is made
    /// from the `webpki-roots` or `native-roots` feature's roots.
    #[cfg(feature = "rustls")]
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.options.tls = Some(tls::with_alpn(&config));
        self
    }

    /// Connects `wss://` URLs over HTTP/3 (RFC 9220): QUIC (UDP) to the
    /// URL's host and port, an extended CONNECT, and the WebSocket on that
    /// request stream, with the same [`Config`] (limits, permessage-deflate,
    /// keepalive), TLS config ([`Client::tls`]; its ALPN set to `h3`) and
    /// handler as over TCP. `ws://` URLs, a request given a stream of its
    /// own ([`ConnectRequest::over`]) and connections through a proxy (a
    /// proxy carries TCP) still go over TCP.
    ///
    /// Nothing falls back by itself: a server that does not speak HTTP/3
    /// fails the connect ([`ConnectError::Timeout`] or
    /// [`ConnectError::Connect`] when nothing answers on UDP,
    /// [`ConnectError::Status`] for a refusal), and trying again over TCP
    /// (a client without this) is the caller's choice: whether a
    /// network that drops UDP should cost a connect timeout first is
    /// theirs to weigh. Each connection has a UDP socket of its own.
    #[cfg(feature = "http3")]
    pub fn http3(mut self) -> Self {
        self.options.http3 = true;
        self
    }

    /// Connects through `proxy` (see [`Proxy::new`]).
    pub fn proxy(mut self, proxy: Proxy) -> Self {
        self.options.proxy = ProxyChoice::Fixed(proxy);
        self
    }

    /// Takes the proxy from the environment at each connect, as curl does:
    /// `https_proxy`/`HTTPS_PROXY` for `wss`, `http_proxy` for `ws`, then
    /// `all_proxy`/`ALL_PROXY`, unless `no_proxy`/`NO_PROXY` names the
    /// host. Off unless called.
    pub fn proxy_from_env(mut self) -> Self {
        self.options.proxy = ProxyChoice::FromEnv;
        self
    }

    shutdown_methods! {
        /// Connects after this fail with [`ConnectError::Closed`].
    }

    /// Connects, opens the connection with `state`, and returns its
    /// [`Conn`] and the server's `101`. `on_open` has run when this
    /// returns. Must be called within a tokio runtime, which drives the
    /// connection.
    pub async fn connect_with(
        &self,
        request: impl Into<ConnectRequest>,
        state: H::State,
    ) -> Result<(Conn, Response), ConnectError> {
        let ConnectRequest {
            url,
            headers,
            protocols,
            stream,
        } = request.into();
        let request = Asked { headers, protocols };
        if self.env.hub.is_shutting_down() {
            return Err(ConnectError::Closed);
        }
        let url = Url::parse(&url)?;
        if url.scheme != "ws" && url.scheme != "wss" {
            return Err(ConnectError::Url(url::UrlError::scheme()));
        }
        let mut request = request;
        request.add_url_credentials(&url);
        request.check(&url, &self.env.hub.config)?;
        #[cfg(feature = "http3")]
        if self.options.http3 && url.scheme == "wss" && stream.is_none() && !self.proxied(&url)? {
            return self.over_http3(&url, &request, state).await;
        }
        match stream {
            Some(stream) => {
                let peer = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
                self.secure(stream, peer, &url, &request, state).await
            }
            None => {
                let (tcp, peer) = self.dial(&url).await?;
                if url.scheme == "ws" {
                    return self.join_group(tcp, peer, &url, &request, state).await;
                }
                self.secure(tcp, peer, &url, &request, state).await
            }
        }
    }

    /// The proxy a connection to `url` goes through, if any.
    fn proxy_for(&self, url: &Url) -> Result<Option<Proxy>, ConnectError> {
        Ok(match &self.options.proxy {
            ProxyChoice::Direct => None,
            ProxyChoice::Fixed(proxy) => Some(proxy.clone()),
            ProxyChoice::FromEnv => Proxy::from_env(url).transpose()?,
        })
    }

    /// Whether a connection to `url` goes through a proxy.
    #[cfg(feature = "http3")]
    fn proxied(&self, url: &Url) -> Result<bool, ConnectError> {
        Ok(self.proxy_for(url)?.is_some())
    }

    /// `wss://` over HTTP/3, then the connection's task.
    #[cfg(feature = "http3")]
    async fn over_http3(
        &self,
        url: &Url,
        request: &Asked,
        state: H::State,
    ) -> Result<(Conn, Response), ConnectError> {
        let tls = match &self.options.tls {
            Some(config) => config.clone(),
            None => tls::default_config()?,
        };
        let config = &self.env.hub.config;
        let (stream, response, peer) =
            h3::connect(url, request, config, tls, self.options.connect_timeout).await?;
        self.start(stream, peer, bytes::BytesMut::new(), response, state)
            .await
    }

    /// Resolves, connects TCP and opens the proxy's tunnel, if any.
    async fn dial(&self, url: &Url) -> Result<(TcpStream, SocketAddr), ConnectError> {
        let deadline = Instant::now() + self.options.connect_timeout;
        let proxy = self.proxy_for(url)?;
        let port = url.port_or(default_port(url));
        let (host, to) = match &proxy {
            Some(proxy) => (&proxy.host, proxy.port),
            None => (&url.host, port),
        };
        let connected = timeout_at(deadline, connect_tcp(host, to, deadline))
            .await
            .unwrap_or(Err(ConnectError::Timeout(Stage::Connect)));
        let (mut tcp, peer) = match (connected, &proxy) {
            (Ok(connected), _) => connected,
            // Said as the proxy's failure: the target was never tried.
            (Err(error), Some(proxy)) => {
                return Err(ConnectError::ProxyUnreachable {
                    proxy: format!("{}:{}", proxy.host, proxy.port),
                    error: Box::new(error),
                });
            }
            (Err(error), None) => return Err(error),
        };
        tcp.set_nodelay(self.options.nodelay)
            .map_err(ConnectError::Io)?;
        if let Some(proxy) = proxy {
            timeout_at(deadline, proxy.tunnel(&mut tcp, &url.host, port))
                .await
                .map_err(|_| ConnectError::Timeout(Stage::Proxy))??;
        }
        Ok((tcp, peer))
    }

    /// Runs TLS over `stream` for `wss`, then the upgrade.
    async fn secure<S: Io>(
        &self,
        stream: S,
        peer: SocketAddr,
        url: &Url,
        request: &Asked,
        state: H::State,
    ) -> Result<(Conn, Response), ConnectError> {
        let deadline = Instant::now() + self.env.hub.config.handshake_timeout;
        if url.scheme == "ws" {
            return self.open(stream, peer, url, request, state, deadline).await;
        }

        #[cfg(feature = "rustls")]
        {
            let config = match &self.options.tls {
                Some(config) => config.clone(),
                None => tls::default_config()?,
            };
            let stream = timeout_at(
                deadline,
                tls::handshake(config, &url.host, stream, self.env.hub.pool.clone()),
            )
            .await
            .map_err(|_| ConnectError::Timeout(Stage::Handshake))??;
            self.open(stream, peer, url, request, state, deadline).await
        }

        #[cfg(not(feature = "rustls"))]
        {
            let _ = (stream, peer, request, state, deadline);
            Err(ConnectError::TlsUnavailable(
                "rapidws was built without the rustls feature",
            ))
        }
    }

    /// The upgrade over plain TCP, then the socket joins one of the client's
    /// connection groups: it costs what an accepted connection of a tokio
    /// server costs.
    async fn join_group(
        &self,
        mut tcp: TcpStream,
        peer: SocketAddr,
        url: &Url,
        request: &Asked,
        state: H::State,
    ) -> Result<(Conn, Response), ConnectError> {
        let config = &self.env.hub.config;
        let deadline = Instant::now() + config.handshake_timeout;
        let switched = upgrade::upgrade(&mut tcp, url, request, config, deadline).await?;
        let group = self
            .groups
            .least_loaded(&self.env)
            .map_err(ConnectError::Io)?;
        let stream = mio::net::TcpStream::from_std(tcp.into_std().map_err(ConnectError::Io)?);
        let (opening, mut handout) = opening(state, switched.prefix, &switched.response);
        group.hand_over(Incoming {
            stream,
            peer,
            live: self.env.hub.enter(),
            start: crate::tokio::group::Start::Opened(Box::new(opening)),
        });
        let conn = (&mut handout.0).await.map_err(|_| ConnectError::Closed)?;
        Ok((conn, switched.response))
    }

    /// The upgrade, then the connection's task.
    async fn open<S: Io>(
        &self,
        mut stream: S,
        peer: SocketAddr,
        url: &Url,
        request: &Asked,
        state: H::State,
        deadline: Instant,
    ) -> Result<(Conn, Response), ConnectError> {
        let config = &self.env.hub.config;
        let switched = upgrade::upgrade(&mut stream, url, request, config, deadline).await?;
        self.start(stream, peer, switched.prefix, switched.response, state)
            .await
    }

    /// Opens the upgraded connection on `stream` in a task of its own
    /// (`prefix`: its first bytes, read already).
    async fn start<S: Io>(
        &self,
        stream: S,
        peer: SocketAddr,
        prefix: bytes::BytesMut,
        response: Response,
        state: H::State,
    ) -> Result<(Conn, Response), ConnectError> {
        let (opening, mut handout) = opening(state, prefix, &response);
        let start = Start::Upgraded(Box::new(opening));
        let live = self.env.hub.enter();
        let now = std::time::Instant::now();
        tokio::spawn(serve(stream, peer, start, live, self.env.clone(), now));
        let conn = (&mut handout.0).await.map_err(|_| ConnectError::Closed)?;
        Ok((conn, response))
    }
}

/// A client connection whose `101` was read and checked, as a driver opens
/// it, and where its `Conn` comes back once `on_open` has run: if nobody
/// takes it any more (the connect was cancelled), it is closed with 1001,
/// since nobody else could.
fn opening<S>(state: S, prefix: bytes::BytesMut, response: &Response) -> (Upgraded<S>, Handout) {
    let (to, from) = oneshot::channel::<Conn>();
    let hand_out = move |conn: &Conn| {
        if to.send(conn.clone()).is_err() {
            let _ = conn.close(crate::CloseCode::GOING_AWAY, "nobody took the connection");
        }
    };
    let upgraded = Upgraded {
        state,
        deflate: response.deflate().copied(),
        settings: None,
        role: Role::Client,
        prefix,
        hand_out: Some(Box::new(hand_out)),
    };
    (upgraded, Handout(from))
}

/// The channel a connection's task sends its `Conn` back on. Dropped
/// before the `Conn` was taken (the connect was cancelled after the task
/// started), it closes the connection, which nobody else could; if the task
/// has not sent it yet, the task closes it when its send fails.
struct Handout(oneshot::Receiver<Conn>);

impl Drop for Handout {
    fn drop(&mut self) {
        if let Ok(conn) = self.0.try_recv() {
            let _ = conn.close(crate::CloseCode::GOING_AWAY, "connect cancelled");
        }
    }
}

fn default_port(url: &Url) -> u16 {
    if url.scheme == "wss" { 443 } else { 80 }
}

/// Connects TCP to `host:port`, trying each address the name resolves to
/// in turn ([`connect_each`]).
async fn connect_tcp(
    host: &Host,
    port: u16,
    deadline: Instant,
) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let addrs = resolve(host, port).await?;
    connect_each(addrs, deadline, |addr| async move {
        TcpStream::connect(addr)
            .await
            .map_err(|error| ConnectError::Connect { addr, error })
    })
    .await
}

/// Tries `connect` on each of `addrs` in turn until one connects; the
/// error is the last address's. Each attempt gets an equal share of the
/// time left before `deadline`, so one address that drops packets (a
/// broken IPv6 route) does not use up the time of the others. TCP's and
/// QUIC's connects share it.
async fn connect_each<T, F, Fut>(
    addrs: Vec<SocketAddr>,
    deadline: Instant,
    mut connect: F,
) -> Result<(T, SocketAddr), ConnectError>
where
    F: FnMut(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<T, ConnectError>>,
{
    let mut last = None;
    let count = addrs.len() as u32;
    for (i, addr) in addrs.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = left / (count - i as u32);
        match tokio::time::timeout(share, connect(addr)).await {
            Ok(Ok(connected)) => return Ok((connected, addr)),
            Ok(Err(error)) => last = Some(error),
            Err(_) => last = Some(ConnectError::Timeout(Stage::Connect)),
        }
    }
    Err(last.unwrap_or(ConnectError::Timeout(Stage::Connect)))
}

/// The addresses `host` names at `port`: itself, or what the resolver
/// says (at least one, or [`ConnectError::Dns`]).
async fn resolve(host: &Host, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
    Ok(match host {
        Host::V4(ip) => vec![SocketAddr::from((*ip, port))],
        Host::V6(ip) => vec![SocketAddr::from((*ip, port))],
        Host::Name(name) => {
            let dns = |error| ConnectError::Dns {
                host: name.clone(),
                error,
            };
            let found = tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(dns)?
                .collect::<Vec<_>>();
            if found.is_empty() {
                let none = std::io::Error::new(std::io::ErrorKind::NotFound, "no address found");
                return Err(dns(none));
            }
            found
        }
    })
}
