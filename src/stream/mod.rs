//! The driver for any async byte stream: TLS (wss), a Unix socket, an
//! in-memory pipe, hyper's and axum's upgraded IO, an HTTP/2 stream. The
//! same [`Handler`],
//! [`Conn`](crate::Conn), [`Config`] (limits, timeouts, keepalive,
//! slow-consumer policy) and [`ServerHandle`](crate::ServerHandle) as the
//! two socket backends; one tokio task per connection. The listener is
//! yours: give it a backlog sized for bursts of connects (the socket
//! servers listen with 4096), or connects that find it full are retried
//! only a second later.
//!
//! ```no_run
//! use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request, ServerHandler};
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
//!     fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::io::Result<()> {
//!     let server = rapidws::stream::Server::new(Echo, Config::default());
//!     let listener = tokio::net::UnixListener::bind("/tmp/echo.sock")?;
//!     loop {
//!         let (stream, _) = listener.accept().await?;
//!         // Any `AsyncRead + AsyncWrite` stream: here a Unix socket.
//!         let peer = "127.0.0.1:0".parse().unwrap();
//!         tokio::spawn(server.serve(stream, peer, &[]));
//!     }
//! }
//! ```
//!
//! | file | what |
//! |---|---|
//! | `connection.rs` | one connection's task: the stream as the turn's transport, the timer, keepalive, shutdown |
//! | `tls.rs` | `TlsStream`: a rustls session over an async stream, itself one (wss on tokio, the client's wss) |

mod connection;
#[cfg(feature = "rustls")]
pub(crate) mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::connection::config::Config;
use crate::connection::handler::{Accept, Handler, Hooks, ServerHandler};
use crate::connection::hub::{Hub, LiveGuard};
use crate::connection::lifecycle::Env;
use crate::connection::upgrade::{Decision, Settings, Upgraded};
use crate::driver::surface::{Served, shutdown_methods};
use crate::proto::deflate::DeflateParams;

pub(crate) use connection::{Start, serve};

/// Serves WebSocket connections over streams the caller accepts.
pub struct Server<H: ServerHandler> {
    env: Env<H>,
    /// What an integration above keeps for this server, made at its first
    /// use (hyper's: the connection groups its plain TCP upgrades join);
    /// dropped with the last clone.
    #[cfg(feature = "hyper")]
    kept: Arc<std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>>,
}

impl<H: ServerHandler> std::fmt::Debug for Server<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("handle", &self.handle())
            .finish_non_exhaustive()
    }
}

impl<H: ServerHandler> Served for Server<H> {
    fn hub(&self) -> &Arc<Hub> {
        &self.env.hub
    }
}

/// Another handle on the same server (its handler, settings, connections
/// and shutdown are shared): what an accept loop gives each task.
impl<H: ServerHandler> Clone for Server<H> {
    fn clone(&self) -> Self {
        Server {
            env: self.env.clone(),
            #[cfg(feature = "hyper")]
            kept: self.kept.clone(),
        }
    }
}

impl<H: ServerHandler> Server<H> {
    /// A server for `handler` with `config`; it serves the streams handed to it.
    pub fn new(handler: H, config: Config) -> Self {
        Server {
            env: Env::server(Hub::new(config, "stream"), Arc::new(handler)),
            #[cfg(feature = "hyper")]
            kept: Arc::default(),
        }
    }

    shutdown_methods! {
        /// No new connection is upgraded: handshakes are answered 503.
    }

    /// Serves one connection over `stream`, whose upgrade request comes next
    /// (`prefix`: bytes of it already read from the stream, for a caller that
    /// peeked). The connection counts from this call: the handshake timeout
    /// runs from here, and [`Server::shutdown`] waits for it.
    ///
    /// The future ends when the connection is over; spawn it
    /// (`tokio::spawn(server.serve(stream, peer, &[]))`).
    pub fn serve<S>(
        &self,
        stream: S,
        peer: SocketAddr,
        prefix: &[u8],
    ) -> impl Future<Output = ()> + Send + 'static + use<H, S>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let live = self.env.hub.enter();
        let start = Start::Request {
            prefix: BytesMut::from(prefix),
        };
        serve(stream, peer, start, live, self.env.clone(), Instant::now())
    }

    /// Serves one connection over `stream` whose upgrade the caller has
    /// answered (checked the request, ran the upgrade hook to get `state`,
    /// negotiated permessage-deflate with [`handshake::negotiate`] and sent
    /// the `101`): it opens at once, calling `on_open`. The connection limit
    /// is the caller's to check. Spawn the future, like [`Server::serve`]'s.
    ///
    /// [`handshake::negotiate`]: crate::handshake::negotiate
    pub fn serve_upgraded<S>(
        &self,
        stream: S,
        peer: SocketAddr,
        state: H::State,
        deflate: Option<DeflateParams>,
    ) -> impl Future<Output = ()> + Send + 'static + use<H, S>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let live = self.env.hub.enter();
        let start = Start::Upgraded(Box::new(Upgraded::server(state, deflate)));
        serve(stream, peer, start, live, self.env.clone(), Instant::now())
    }

    /// [`Server::serve_upgraded`] for a stream that comes later (hyper hands
    /// the upgraded IO over after the `101` is written), and may turn out
    /// to be a plain TCP socket for a connection group (see [`Handed`]):
    /// the connection counts from this call, so the limit and shutdown see
    /// it at once. If `handed` fails, the connection never opens (no
    /// `on_open`, no `on_close`). `settings`: the connection's own, if the
    /// upgrade set any.
    #[cfg_attr(not(any(feature = "hyper", feature = "http3")), allow(dead_code))]
    pub(crate) fn serve_upgraded_later<S, G, F>(
        &self,
        handed: F,
        peer: SocketAddr,
        state: H::State,
        deflate: Option<DeflateParams>,
        settings: Option<Box<Settings>>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = std::io::Result<Handed<S, G>>> + Send + 'static,
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        G: Join<H::State> + Send + 'static,
    {
        // One pointer captured (see `connection::serve` on the task's size).
        let later = Box::new(Later {
            handed,
            peer,
            state,
            deflate,
            settings,
            live: self.env.hub.enter(),
            env: self.env.clone(),
        });
        async move {
            let Some(serving) = later.open().await else {
                return;
            };
            serving.await;
        }
    }

    /// What the integration above keeps for this server (see `kept`),
    /// made by `make` at the first call. Each server has one integration's
    /// kind of it.
    #[cfg(feature = "hyper")]
    pub(crate) fn kept<T: std::any::Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> &T {
        self.kept
            .get_or_init(|| Box::new(make()))
            .downcast_ref()
            .expect("one kind of state kept per server")
    }

    /// The server's handler and shared state, for a driver that serves its
    /// connections elsewhere (hyper's upgrades taken back to the groups).
    #[cfg(all(feature = "hyper", feature = "tokio"))]
    pub(crate) fn env(&self) -> &Env<H> {
        &self.env
    }

    /// What the server decides on a checked upgrade request (limit, hook,
    /// subprotocol, permessage-deflate), for integrations that parse
    /// requests themselves: the hook starts from `accept`, and `settings`
    /// (the upgrade's own, if any) replace the server's deflate settings.
    #[cfg_attr(not(any(feature = "hyper", feature = "http3")), allow(dead_code))]
    pub(crate) fn decide(
        &self,
        request: &crate::handshake::Request<'_>,
        accept: Accept,
        settings: Option<&Settings>,
    ) -> Decision<H::State> {
        let deflate = match settings {
            Some(settings) => settings.deflate.as_ref(),
            None => self.env.hub.config.deflate(),
        };
        let handler = &*self.env.handler;
        let hooks = Hooks::of();
        crate::connection::upgrade::decide(
            request,
            handler,
            hooks,
            &self.env.hub,
            accept,
            deflate,
            None,
        )
    }

    /// The server's metric handles (the hyper upgrade counts its refusals).
    #[cfg_attr(not(any(feature = "hyper", feature = "http3")), allow(dead_code))]
    pub(crate) fn meters(&self) -> &crate::connection::meters::Meters {
        self.env.hub.meters()
    }

    /// Notes a request refused before the upgrade hook (a bad request):
    /// logged and counted by reason, as the socket servers do.
    #[cfg_attr(not(any(feature = "hyper", feature = "http3")), allow(dead_code))]
    pub(crate) fn refused(&self, error: &crate::handshake::HandshakeError) {
        tracing::debug!(
            status = error.status(),
            reason = error.reason(),
            "refused upgrade"
        );
        self.meters()
            .rejected(crate::connection::meters::rejection_reason(error));
    }

    /// The server's settings (the base an upgrade's own settings start from).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn config(&self) -> &Config {
        &self.env.hub.config
    }

    /// Whether a page of `origin` may open a session here (the same check
    /// as a WebSocket upgrade's, `Config::allow_origins`); a refusal is
    /// counted as the upgrade's are.
    #[cfg(feature = "http3")]
    pub(crate) fn allows_origin(&self, origin: Option<&[u8]>, host: Option<&[u8]>) -> bool {
        let allowed = self.env.hub.config.origins.allow(origin, host);
        if !allowed {
            self.meters().rejected("origin");
        }
        allowed
    }

    /// Resolves once a shutdown was asked for (here or through a
    /// [`ServerHandle`](crate::ServerHandle)): an accept loop selects on it
    /// to stop accepting.
    pub async fn shutdown_requested(&self) {
        self.env.hub.shutdown_requested().await;
    }
}

/// What an upgrade made elsewhere (hyper, HTTP/3) hands over once its
/// `101` is written.
#[cfg_attr(not(any(feature = "hyper", feature = "http3")), allow(dead_code))]
pub(crate) enum Handed<S, G> {
    /// A stream this driver serves.
    Stream(S),
    /// A plain TCP socket taken back from the HTTP server, with the bytes it
    /// had read past the request: `to` serves it (hyper's upgrades: in a
    /// tokio connection group, where an idle connection costs what an
    /// accepted one of the tokio server does).
    #[cfg_attr(not(all(feature = "hyper", feature = "tokio")), allow(dead_code))]
    Tcp {
        socket: std::net::TcpStream,
        read: BytesMut,
        to: G,
    },
}

/// Who serves a connection handed over as a TCP socket; `Infallible`
/// where there is nobody.
pub(crate) trait Join<S> {
    /// Serves the opened connection on `socket`, counted by `live`.
    fn join(
        self,
        socket: std::net::TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        upgraded: Upgraded<S>,
    );
}

impl<S> Join<S> for Infallible {
    fn join(self, _: std::net::TcpStream, _: SocketAddr, _: LiveGuard, _: Upgraded<S>) {
        match self {}
    }
}

/// A connection upgraded elsewhere whose stream comes later (see
/// [`Server::serve_upgraded_later`]).
struct Later<F, H: Handler> {
    handed: F,
    peer: SocketAddr,
    state: H::State,
    deflate: Option<DeflateParams>,
    settings: Option<Box<Settings>>,
    live: LiveGuard,
    env: Env<H>,
}

impl<F, S, G, H> Later<F, H>
where
    F: Future<Output = std::io::Result<Handed<S, G>>>,
    S: AsyncRead + AsyncWrite + Unpin,
    G: Join<H::State>,
    H: Handler,
{
    /// Waits for the stream: the connection's serving future, or `None` if
    /// the stream failed (the connection never opens) or went to a group.
    async fn open(self: Box<Self>) -> Option<impl Future<Output = ()>> {
        let Later {
            handed,
            peer,
            state,
            deflate,
            settings,
            live,
            env,
        } = *self;
        let upgraded = |prefix| Upgraded {
            settings,
            prefix,
            ..Upgraded::server(state, deflate)
        };
        match handed.await {
            Ok(Handed::Stream(stream)) => {
                let start = Start::Upgraded(Box::new(upgraded(BytesMut::new())));
                Some(serve(stream, peer, start, live, env, Instant::now()))
            }
            Ok(Handed::Tcp { socket, read, to }) => {
                to.join(socket, peer, live, upgraded(read));
                None
            }
            Err(error) => {
                tracing::debug!(%peer, %error, "the upgraded stream never came");
                None
            }
        }
    }
}
