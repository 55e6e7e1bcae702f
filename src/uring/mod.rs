//! The io_uring backend (Linux 6.0 or later): one reactor thread per core,
//! each with its own ring, its own listening socket (SO_REUSEPORT: the kernel
//! spreads connections over them) and the connections it accepted.
//!
//! The handler is the same as on tokio, but its callbacks run on the
//! reactor threads, outside any tokio runtime: to start async work from a
//! callback, keep a `tokio::runtime::Handle` in the handler and spawn on it.
//! An async socket may instead run on the reactor that serves its
//! connection ([`SocketHandler::on_server_loop`](crate::socket::SocketHandler::on_server_loop)),
//! its messages then crossing no thread.
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
//! fn main() -> std::io::Result<()> {
//!     let server = rapidws::uring::Server::bind("127.0.0.1:9001", Echo, Config::default())?;
//!     // Blocks until `ServerHandle::shutdown`; fails at once, with a clear
//!     // message, where io_uring is not available.
//!     server.serve()
//! }
//! ```
//!
//! | file | what |
//! |---|---|
//! | `reactor.rs` | one reactor thread: its ring, listener, connections, timers and woken list |
//! | `connection.rs` | one connection on completions: receive armed or cancelled, one send per turn |
//! | `tasks.rs` | futures spawned on the reactor's thread (async sockets that run there), polled between rounds |
//! | `ring.rs` | every piece of memory the kernel reads or writes for a ring (the backend's `unsafe`) |
//! | `tls.rs`, `tls_absent.rs` | wss inside the reactor; without `rustls`, a `Tls` with no values |
//! | `handoff.rs` | the reactors' part in a handoff |

mod connection;
mod reactor;
#[allow(unsafe_code)] // memory the kernel reads and writes
mod ring;
mod tasks;
#[cfg(feature = "rustls")]
mod tls;
#[cfg(not(feature = "rustls"))]
#[path = "tls_absent.rs"]
mod tls;

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
#[cfg(feature = "handoff")]
use std::os::fd::AsFd;
use std::sync::{Arc, mpsc};
use std::task::{Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::connection::config::Config;
use crate::connection::handler::ServerHandler;
use crate::connection::hub::{Hub, deadline_after};
use crate::connection::lifecycle::Env;
pub use crate::driver::entrance::Entrance;
use crate::driver::entrance::{AdmitFn, Keeper};
use crate::driver::listen::{LISTEN_BACKLOG, bind_first};
use crate::driver::surface::{HandoffSettings, Served, socket_server_methods};
use reactor::{Reactor, Setup, Shared};

/// Submission queue entries per ring (the completion queue has eight times
/// as many).
const RING_ENTRIES: u32 = 1024;

/// Provided buffers per ring, by default (each `Config::read_buffer_size`).
const DEFAULT_BUFFERS: u16 = 512;

/// A WebSocket server on io_uring.
pub struct Server<H: ServerHandler> {
    /// One, bound here (each reactor then opens its own on the same port,
    /// SO_REUSEPORT), or those taken over from a predecessor (each with its
    /// own accept queue: see [`Server::take_over`]).
    listeners: Vec<TcpListener>,
    handler: Arc<H>,
    hub: Arc<Hub>,
    threads: usize,
    buffers: u16,
    /// wss: every connection's TLS configuration.
    tls: Option<Arc<tls::ServerConfig>>,
    /// Set by `handoff_socket`, `after_handoff` and `take_over`.
    handoff: HandoffSettings,
    /// Open while `serve` runs: connections accepted elsewhere come in
    /// through it (`entrance`).
    door: Keeper,
}

impl<H: ServerHandler> std::fmt::Debug for Server<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr().ok())
            .field("threads", &self.threads)
            .field("buffers", &self.buffers)
            .finish_non_exhaustive()
    }
}

impl<H: ServerHandler> Served for Server<H> {
    fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl<H: ServerHandler> Server<H> {
    /// Binds a listening socket (SO_REUSEADDR and SO_REUSEPORT, a backlog of
    /// 4096) on the first address `addr` resolves to that works. Needs no
    /// runtime; io_uring itself is first used by [`Server::serve`].
    ///
    /// SO_REUSEPORT lets each reactor thread listen on the same port; so that
    /// it does not also let a second server quietly share a port that is
    /// taken, the port is first bound without it: a port in use fails with
    /// `AddrInUse`, as on tokio.
    pub fn bind(addr: impl ToSocketAddrs, handler: H, config: Config) -> io::Result<Self> {
        let listener = bind_first(addr.to_socket_addrs()?, |addr| {
            check_free(addr).and_then(listen)
        })?;
        Ok(Server::with(vec![listener], Arc::new(handler), config))
    }

    fn with(listeners: Vec<TcpListener>, handler: Arc<H>, config: Config) -> Self {
        let hub = Hub::new(config, "uring");
        Server {
            listeners,
            handler,
            door: Keeper::new(hub.clone()),
            hub,
            threads: thread::available_parallelism().map_or(1, usize::from),
            buffers: DEFAULT_BUFFERS,
            tls: None,
            handoff: HandoffSettings::default(),
        }
    }

    socket_server_methods!(
        take_over: blocking,
        /// Blocks while it meets the old process. Runs at least one
        /// reactor per listening socket the old process announced (an
        /// io_uring predecessor has one per reactor, each with its own
        /// accept queue); more share them.
    );

    /// Serves wss: every connection starts with a TLS handshake (rustls,
    /// run inside the reactor: see `tls.rs`), within the handshake timeout.
    /// The crypto provider is the one `config` was built with. Advertise
    /// `http/1.1` by ALPN if clients ask for it.
    #[cfg(feature = "rustls")]
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// How many reactor threads serve connections (default: one per CPU).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// How many provided buffers each ring receives into (default 512, a power
    /// of two up to 32768), each `Config::read_buffer_size` bytes. Fewer cost
    /// less memory; when a ring runs out, receives wait for buffers to come
    /// back, which costs throughput but loses nothing.
    pub fn provided_buffers(mut self, count: u16) -> Self {
        self.buffers = count;
        self
    }

    /// Serves connections on this thread's behalf until
    /// [`ServerHandle::shutdown`](crate::ServerHandle::shutdown) is called,
    /// then closes every connection with 1001 and waits for them, at most
    /// `shutdown_timeout`, before dropping the rest and returning. Blocks the
    /// calling thread (from async code, call it on a blocking thread, e.g.
    /// `tokio::task::spawn_blocking`).
    ///
    /// Fails at once, before serving anything, if a ring cannot be set up: the
    /// error (kind `Unsupported`) says that io_uring is not available and why.
    ///
    /// Raise the descriptor limit (`RLIMIT_NOFILE`) before calling this: the
    /// kernel reads it when a reactor arms its accept and keeps that value
    /// until the accept is armed again (after an accept error such as EMFILE).
    pub fn serve(self) -> io::Result<()> {
        let Server {
            listeners,
            handler,
            hub,
            threads,
            buffers,
            tls,
            handoff,
            door,
        } = self;
        // A server that took over has no listening socket until its
        // predecessor's come, at the end of the handoff (`run_handoff`
        // gives them to the reactors): as many reactors as it announced,
        // at least.
        let announced = handoff.coming();
        let reactors_wanted = threads.max(listeners.len()).max(announced);
        let mut listeners = listeners;
        if let Some(addr) = listeners.first().map(TcpListener::local_addr).transpose()? {
            for _ in listeners.len()..reactors_wanted {
                listeners.push(listen(addr)?);
            }
        }
        let mut listeners: Vec<Option<TcpListener>> = listeners.into_iter().map(Some).collect();
        listeners.resize_with(reactors_wanted, || None);
        // What a successor would be handed: each accept queue once.
        #[cfg(feature = "handoff")]
        let handed = listeners
            .iter()
            .flatten()
            .map(|listener| listener.as_fd().try_clone_to_owned())
            .collect::<io::Result<Vec<_>>>()?;
        let setup = Arc::new(Setup {
            ring_entries: RING_ENTRIES,
            buffers,
            tls,
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut reactors = Reactors(Vec::new());
        for (index, listener) in listeners.into_iter().enumerate() {
            let shared = Shared::new()?;
            let env = Env::server(hub.clone(), handler.clone());
            let (ready, setup, reactor_shared) = (ready_tx.clone(), setup.clone(), shared.clone());
            let thread = thread::Builder::new()
                .name(format!("rapidws-uring-{index}"))
                .spawn(
                    move || match Reactor::new(listener, reactor_shared, env, &setup) {
                        Ok(reactor) => {
                            let _ = ready.send(Ok(()));
                            reactor.run();
                        }
                        Err(error) => {
                            let _ = ready.send(Err(error));
                        }
                    },
                )?;
            reactors.0.push((shared, Some(thread)));
        }
        drop(ready_tx);
        for _ in 0..reactors.0.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => return Err(io::Error::other("a reactor thread died while starting")),
            }
        }
        #[cfg(feature = "handoff")]
        let handing = {
            let loops = reactor::handoff::ReactorLoops::new(
                reactors
                    .0
                    .iter()
                    .map(|(shared, _)| shared.clone())
                    .collect(),
            );
            let env = Env::server(hub.clone(), handler.clone());
            start_handoff(handoff, loops, env, handed)?
        };
        door.open(admit(&reactors));
        wait_for_shutdown(&hub);
        drop(door);
        if !wait_until_idle(&hub, deadline_after(hub.shutdown_wait())) {
            hub.abort_remaining();
            wait_until_idle(&hub, Instant::now() + Duration::from_secs(1));
        }
        // The handoff's thread holds copies of the listening sockets: once
        // it is gone, the port is free. (It sees the shutdown within 100 ms.)
        #[cfg(feature = "handoff")]
        if let Some(thread) = handing
            && thread.join().is_err()
        {
            tracing::error!("the handoff's thread panicked");
        }
        // A reactor that failed started the shutdown; its error is `serve`'s.
        for (shared, _) in &reactors.0 {
            if let Some(error) = shared
                .failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                return Err(error);
            }
        }
        Ok(())
    }
}

/// How the [`Entrance`] hands a connection to the reactors: to each in
/// turn, in blocking mode as their own accepted sockets are.
fn admit(reactors: &Reactors) -> AdmitFn {
    let reactors: Vec<Arc<Shared>> = reactors
        .0
        .iter()
        .map(|(shared, _)| shared.clone())
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    Box::new(move |(stream, peer, live, read)| {
        if let Err(error) = stream.set_nonblocking(false) {
            tracing::debug!(%peer, %error, "could not make an admitted socket blocking");
        }
        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % reactors.len();
        reactors[index].enter((stream, peer, live, read));
    })
}

/// If this server took over, or waits for a successor: a thread that
/// takes in the predecessor's connections, then waits for a successor and
/// hands it everything (`listeners` and the reactors' connections); once
/// one has it all, the server shuts down, closing what stays as
/// `after_handoff` says (1012 at once by default).
#[cfg(feature = "handoff")]
fn start_handoff<H: ServerHandler>(
    handoff: HandoffSettings,
    loops: reactor::handoff::ReactorLoops,
    env: Env<H>,
    listeners: Vec<std::os::fd::OwnedFd>,
) -> io::Result<Option<thread::JoinHandle<()>>> {
    if handoff.predecessor.is_none() && handoff.socket.is_none() {
        return Ok(None);
    }
    let thread = thread::Builder::new()
        .name("rapidws-handoff".into())
        .spawn(move || run_handoff(handoff, &loops, &env, listeners))?;
    Ok(Some(thread))
}

#[cfg(feature = "handoff")]
fn run_handoff<H: ServerHandler>(
    handoff: HandoffSettings,
    loops: &reactor::handoff::ReactorLoops,
    env: &Env<H>,
    mut listeners: Vec<std::os::fd::OwnedFd>,
) {
    use crate::handoff::{arrive, leave, socket::HandoffSocket};
    let hub = &env.hub;
    let after = handoff.after_spread();
    let HandoffSettings {
        mut socket,
        later,
        predecessor,
        ..
    } = handoff;
    if let Some((_, successor)) = predecessor {
        let Some(taken) = arrive::take_in(successor, loops, hub) else {
            // The predecessor serves on, and keeps the path.
            return;
        };
        // Its listening sockets, last: the reactors accept from now.
        if let Err(error) = loops.listen(&taken) {
            tracing::error!(%error, "could not give the reactors the listening sockets");
        }
        listeners = taken.into_iter().map(std::os::fd::OwnedFd::from).collect();
        if let Some(path) = later {
            match HandoffSocket::bind(&path, true) {
                Ok(bound) => {
                    tracing::info!(path = %path.display(), "listening for a successor");
                    socket = Some(bound);
                }
                Err(error) => {
                    tracing::error!(%error, path = %path.display(), "cannot listen for a successor");
                }
            }
        }
    }
    let Some(socket) = socket else {
        return;
    };
    let every = Duration::from_millis(100);
    while let Some(successor) = socket.wait(every, || hub.is_shutting_down()) {
        // (The reactors serve and accept meanwhile: a process that is
        // no successor costs them nothing.)
        let Some(met) = leave::meet(successor) else {
            continue;
        };
        if leave::hand_off(met, &listeners, loops, env) {
            hub.begin_spread(after);
            return;
        }
    }
}

/// The reactor threads. However `serve` ends, they are stopped and joined.
struct Reactors(Vec<(Arc<Shared>, Option<thread::JoinHandle<()>>)>);

impl Drop for Reactors {
    fn drop(&mut self) {
        for (shared, _) in &self.0 {
            shared.stop();
        }
        for (_, thread) in &mut self.0 {
            if let Some(thread) = thread.take()
                && thread.join().is_err()
            {
                tracing::error!("a reactor thread panicked");
            }
        }
    }
}

/// A TCP socket bound to `addr` with SO_REUSEADDR, and SO_REUSEPORT if asked.
fn tcp_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Binds `addr` without SO_REUSEPORT (failing if it is taken), and returns
/// the address bound (with the port chosen, for port 0).
fn check_free(addr: SocketAddr) -> io::Result<SocketAddr> {
    tcp_socket(addr, false)?
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound to a non-IP address"))
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = tcp_socket(addr, true)?;
    socket.listen(LISTEN_BACKLOG as i32)?;
    Ok(socket.into())
}

/// Unparks a thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn wait_for_shutdown(hub: &Hub) {
    hub.watch(Waker::from(Arc::new(Unpark(thread::current()))));
    while !hub.is_shutting_down() {
        thread::park();
    }
}

/// Waits until no connection is left, or `deadline`; true if none is left.
fn wait_until_idle(hub: &Hub, deadline: Instant) -> bool {
    while hub.live() > 0 {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep((deadline - now).min(Duration::from_millis(5)));
    }
    true
}
