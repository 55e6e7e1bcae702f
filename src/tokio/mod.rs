//! The tokio backend: connections served in groups, one tokio task per group,
//! on any tokio runtime. The accept loop hands each new connection to the
//! least loaded group; a group watches its sockets with an epoll instance of
//! its own, so an idle connection costs no task and no tokio registration.
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
//!     let server = rapidws::tokio::Server::bind("127.0.0.1:9001", Echo, Config::default()).await?;
//!     server.serve().await
//! }
//! ```
//!
//! | file | what |
//! |---|---|
//! | `group.rs` | a group: one tokio task, an epoll instance of its own, a slab of connections |
//! | `connection.rs` | one connection's plumbing: its socket as the turn's transport, its timer |
//! | `sys.rs` | the backend's `unsafe`: `recv` into spare capacity, `AsyncFd` registration |
//! | `tls.rs` | wss: the rustls handshake, then the stream driver |
//! | `handoff.rs` | the groups' part in a handoff |

mod connection;
pub(crate) mod group;
#[cfg(all(target_os = "linux", feature = "handoff"))]
mod handoff;
#[cfg(all(target_os = "linux", feature = "handoff"))]
use handoff::Handoff;
#[allow(unsafe_code)] // recv into spare capacity; AsyncFd registration
mod sys;
#[cfg(feature = "rustls")]
pub(crate) mod tls;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::net::{TcpListener, TcpSocket, ToSocketAddrs};

use crate::connection::config::Config;
use crate::connection::handler::{Handler, ServerHandler};
use crate::connection::hub::Hub;
use crate::connection::lifecycle::Env;
pub use crate::driver::entrance::Entrance;
use crate::driver::entrance::Keeper;
use crate::driver::listen::{
    LISTEN_BACKLOG, MAX_BACKOFF, MIN_BACKOFF, bind_first, concerns_one_connection,
};
use crate::driver::surface::{HandoffSettings, Served, socket_server_methods};
use group::{GroupShared, Incoming, Start};

/// Connections accepted in a row before the accept loop lets other tasks run.
const ACCEPTS_PER_TURN: usize = 64;

/// A WebSocket server on tokio.
pub struct Server<H: ServerHandler> {
    /// One, unless taken over from an io_uring server (one per reactor,
    /// each with its own accept queue: all are accepted from).
    listeners: Vec<TcpListener>,
    handler: Arc<H>,
    hub: Arc<Hub>,
    /// Set by [`Server::tls`]: every connection is wss.
    #[cfg(feature = "rustls")]
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Set by [`Server::also_plain`]: with TLS, plain ws on the same port.
    #[cfg(feature = "rustls")]
    also_plain: bool,
    /// Set by `handoff_socket`, `after_handoff` and `take_over`.
    handoff: HandoffSettings,
    /// Open while `serve` runs: connections accepted elsewhere come in
    /// through it ([`Server::entrance`]).
    door: Keeper,
}

/// Without the `handoff` feature: no successor ever comes.
#[cfg(not(all(target_os = "linux", feature = "handoff")))]
struct Handoff(());

#[cfg(not(all(target_os = "linux", feature = "handoff")))]
impl Handoff {
    fn new(_: HandoffSettings) -> io::Result<Self> {
        Ok(Handoff(()))
    }

    fn take_in<S>(&mut self, _: &[Arc<GroupShared<S>>], _: &Arc<Hub>) -> io::Result<Coming> {
        Ok(Coming)
    }

    fn after_spread(&self) -> crate::Spread {
        crate::Spread::over(std::time::Duration::ZERO)
    }

    async fn successor(&self) -> std::convert::Infallible {
        std::future::pending().await
    }

    async fn hand_off<H: Handler>(
        &self,
        successor: std::convert::Infallible,
        _: &[tokio::io::unix::AsyncFd<mio::net::TcpListener>],
        _: &[Arc<GroupShared<H::State>>],
        _: &Env<H>,
    ) -> io::Result<bool> {
        match successor {}
    }
}

/// Without the `handoff` feature: no listening socket comes later.
#[cfg(not(all(target_os = "linux", feature = "handoff")))]
struct Coming;

#[cfg(not(all(target_os = "linux", feature = "handoff")))]
impl Coming {
    async fn listeners(&mut self) -> Vec<std::net::TcpListener> {
        std::future::pending().await
    }
}

impl<H: ServerHandler> std::fmt::Debug for Server<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl<H: ServerHandler> Served for Server<H> {
    fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl<H: ServerHandler> Server<H> {
    /// Binds a listening socket (SO_REUSEADDR, a backlog of 4096) on the first
    /// address `addr` resolves to that works.
    pub async fn bind(addr: impl ToSocketAddrs, handler: H, config: Config) -> io::Result<Self> {
        let listener = bind_first(tokio::net::lookup_host(addr).await?, listen)?;
        Ok(Server::from_listener(listener, handler, config))
    }

    /// Serves on a listener the caller has set up.
    pub fn from_listener(listener: TcpListener, handler: H, config: Config) -> Self {
        Server::with(vec![listener], Arc::new(handler), config)
    }

    fn with(listeners: Vec<TcpListener>, handler: Arc<H>, config: Config) -> Self {
        let hub = Hub::new(config, "tokio");
        Server {
            listeners,
            handler,
            door: Keeper::new(hub.clone()),
            hub,
            #[cfg(feature = "rustls")]
            tls: None,
            #[cfg(feature = "rustls")]
            also_plain: false,
            handoff: HandoffSettings::default(),
        }
    }

    socket_server_methods!(take_over: async);

    /// Serves wss: every connection starts with a TLS handshake with this
    /// rustls configuration, then the WebSocket upgrade, both within
    /// `handshake_timeout`. TLS connections are served by the stream driver
    /// (`rapidws::stream`), one task each, with the same handler, limits and
    /// shutdown. Set ALPN to `http/1.1` (or nothing): the upgrade is HTTP/1.1.
    /// (With the `rustls` feature.)
    #[cfg(feature = "rustls")]
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// With [`Server::tls`], also serves plain ws on the same port (the
    /// "one port for ws and wss" case): the first byte a peer sends tells a
    /// TLS handshake (0x16, a handshake record) from an HTTP request. The
    /// wait for that byte counts against `handshake_timeout`, so a peer that
    /// sends nothing is closed then; plain connections are then served like
    /// those of a server without TLS (by a connection group). Without
    /// [`Server::tls`] it changes nothing. (With the `rustls` feature.)
    #[cfg(feature = "rustls")]
    pub fn also_plain(mut self) -> Self {
        self.also_plain = true;
        self
    }

    /// Accepts and serves connections until
    /// [`ServerHandle::shutdown`](crate::ServerHandle::shutdown) is called,
    /// then closes every connection with 1001 and waits for them, at most
    /// `shutdown_timeout`, before dropping the rest and returning.
    ///
    /// Accept errors never end the loop: errors that concern one connection are
    /// ignored, and resource errors (EMFILE, ENFILE, ENOBUFS, ENOMEM) are logged
    /// and retried with a growing pause, so the server recovers once descriptors
    /// are free again.
    pub async fn serve(self) -> io::Result<()> {
        let Server {
            listeners,
            handler,
            hub,
            #[cfg(feature = "rustls")]
            tls,
            #[cfg(feature = "rustls")]
            also_plain,
            handoff,
            door,
        } = self;
        let mut handoff = Handoff::new(handoff)?;
        // Accepted sockets go to a group's epoll, never to tokio's, so the
        // listener is polled as a plain descriptor.
        let mut listeners = listeners
            .into_iter()
            .map(|listener| {
                sys::watch_listener(mio::net::TcpListener::from_std(listener.into_std()?))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let env = Env::server(hub.clone(), handler);
        let groups = Groups::spawn(&env)?;
        // Bound again here, so that it is dropped (closed) before the
        // groups are told that no more connections will come.
        let door = door;
        door.open(groups.admit());
        // A predecessor's connections, if this server took over; its
        // listening sockets at the end (none until then).
        let mut coming = handoff.take_in(&groups.0, &hub)?;
        let mut backoff = MIN_BACKOFF;
        let mut turn = 0;
        // Kept across turns: a successor being met is not dropped when a
        // connection is accepted meanwhile.
        let mut successor = std::pin::pin!(handoff.successor());
        'serving: loop {
            let mut ready = tokio::select! {
                biased;
                () = hub.shutdown_requested() => break,
                taken = coming.listeners() => {
                    listeners = taken
                        .into_iter()
                        .map(|listener| sys::watch_listener(mio::net::TcpListener::from_std(listener)))
                        .collect::<io::Result<Vec<_>>>()?;
                    continue;
                }
                met = &mut successor => {
                    // Not accepting meanwhile: what waits in the accept
                    // queue goes to the successor with the listening
                    // socket, at the end, or is ours again if it fails.
                    if handoff.hand_off(met, &listeners, &groups.0, &env).await? {
                        // What stays is closed (1012, at once by default).
                        hub.begin_spread(handoff.after_spread());
                        break;
                    }
                    successor.set(handoff.successor());
                    continue;
                }
                ready = readable(&listeners, &mut turn) => ready?,
            };
            let mut accepted = 0;
            while accepted < ACCEPTS_PER_TURN {
                accepted += 1;
                match ready.get_inner().accept() {
                    Ok((stream, peer)) => {
                        backoff = MIN_BACKOFF;
                        crate::driver::tcp::prepare(&stream, &hub.config, peer);
                        // Counted before it is handed over, so a shutdown waits for it.
                        let live = hub.enter();
                        #[cfg(feature = "rustls")]
                        if let Some(config) = &tls {
                            tokio::spawn(crate::tokio::tls::serve(Box::new(
                                crate::tokio::tls::Accepted {
                                    config: config.clone(),
                                    tcp: std::net::TcpStream::from(stream),
                                    peer,
                                    live,
                                    env: env.clone(),
                                    plain: also_plain.then(|| groups.least_loaded().clone()),
                                },
                            )));
                            continue;
                        }
                        groups.least_loaded().hand_over(Incoming {
                            stream,
                            peer,
                            live,
                            start: Start::Accepted { proxy_header: true },
                        });
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        ready.clear_ready();
                        continue 'serving;
                    }
                    Err(error) if concerns_one_connection(&error) => {
                        tracing::debug!(%error, "accept failed for one connection");
                    }
                    Err(error) => {
                        tracing::warn!(%error, ?backoff, "accept failed; pausing before the next try");
                        drop(ready);
                        tokio::select! {
                            () = hub.shutdown_requested() => break 'serving,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue 'serving;
                    }
                }
            }
            // More may be waiting; let the groups take these first.
            tokio::task::yield_now().await;
        }
        drop(listeners);
        drop(door);
        drop(groups);
        hub.finish_shutdown().await;
        Ok(())
    }
}

/// The first of `listeners` with a connection to accept, looking from a
/// different one each time (so none waits behind a busy one).
async fn readable<'a>(
    listeners: &'a [AsyncFd<mio::net::TcpListener>],
    turn: &mut usize,
) -> io::Result<AsyncFdReadyGuard<'a, mio::net::TcpListener>> {
    *turn = turn.wrapping_add(1);
    let first = *turn;
    std::future::poll_fn(|cx| {
        for i in 0..listeners.len() {
            let listener = &listeners[(first + i) % listeners.len()];
            if let std::task::Poll::Ready(ready) = listener.poll_read_ready(cx) {
                return std::task::Poll::Ready(ready);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The server's connection groups. However `serve` ends (even by being
/// dropped), the groups are told that no more connections will come, so each
/// task ends with its last connection.
pub(crate) struct Groups<S>(Vec<Arc<GroupShared<S>>>);

impl<S> Groups<S> {
    /// One group per worker thread of the current runtime, each a task on it.
    pub(crate) fn spawn<H: Handler<State = S>>(env: &Env<H>) -> io::Result<Self> {
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        let mut groups = Groups(Vec::new());
        for _ in 0..workers.max(1) {
            // On failure, the groups already started are told to end.
            groups.0.push(group::spawn(env.clone())?);
        }
        Ok(groups)
    }

    /// Whether a group's task is gone (its runtime shut down).
    #[cfg_attr(not(any(feature = "client", feature = "hyper")), allow(dead_code))]
    pub(crate) fn is_gone(&self) -> bool {
        self.0.iter().any(|group| group.is_gone())
    }

    pub(crate) fn least_loaded(&self) -> &Arc<GroupShared<S>> {
        group::least_loaded(&self.0)
    }

    /// How the [`Entrance`] hands a connection to the least loaded group.
    fn admit(&self) -> crate::driver::entrance::AdmitFn
    where
        S: Send + 'static,
    {
        let groups = self.0.clone();
        Box::new(move |(stream, peer, live, read)| {
            // A group's epoll needs it non-blocking; an error shows at its
            // first read.
            if let Err(error) = stream.set_nonblocking(true) {
                tracing::debug!(%peer, %error, "could not make an admitted socket non-blocking");
            }
            group::least_loaded(&groups).hand_over(Incoming {
                stream: mio::net::TcpStream::from_std(stream),
                peer,
                live,
                start: Start::Routed(read),
            });
        })
    }
}

/// Connection groups started where they are first needed (a client's
/// plain `ws` connect, an upgrade taken back from hyper as a TCP socket):
/// one set per tokio runtime that asked, so a connection is served on the
/// runtime it came from and ends with that runtime, not with another's.
/// The sets end with their last connection once this is dropped.
#[cfg(any(feature = "client", feature = "hyper"))]
pub(crate) struct RuntimeGroups<S>(std::sync::Mutex<Vec<(tokio::runtime::Id, Groups<S>)>>);

#[cfg(any(feature = "client", feature = "hyper"))]
impl<S> Default for RuntimeGroups<S> {
    fn default() -> Self {
        RuntimeGroups(std::sync::Mutex::new(Vec::new()))
    }
}

#[cfg(any(feature = "client", feature = "hyper"))]
impl<S> RuntimeGroups<S> {
    /// The least loaded group of the current runtime, whose groups start
    /// now if it has none yet. Panics outside a runtime, as `tokio::spawn`
    /// does.
    pub(crate) fn least_loaded<H: Handler<State = S>>(
        &self,
        env: &Env<H>,
    ) -> io::Result<Arc<GroupShared<S>>> {
        let runtime = tokio::runtime::Handle::current().id();
        let mut sets = crate::driver::mailbox::lock(&self.0);
        // A runtime that shut down took its groups' tasks with it.
        sets.retain(|(_, groups)| !groups.is_gone());
        if let Some((_, groups)) = sets.iter().find(|(id, _)| *id == runtime) {
            return Ok(groups.least_loaded().clone());
        }
        let groups = Groups::spawn(env)?;
        let group = groups.least_loaded().clone();
        sets.push((runtime, groups));
        Ok(group)
    }
}

impl<S> Drop for Groups<S> {
    fn drop(&mut self) {
        for group in &self.0 {
            group.stop_accepting();
        }
    }
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
