//! The [`Hub`]: what every connection of one server (or one client)
//! shares, whatever the driver and whichever the role (quinn calls the
//! same thing an endpoint; here that word is only quinn's): settings, the buffer pool, connection ids, the connection
//! counts, and the shutdown and abort flags with the wakers of the server
//! loops that act on them.
//!
//! There is no list of connections here: each server loop (a tokio group, an
//! io_uring reactor) owns its connections, and when woken for a shutdown or an
//! abort it reaches them itself. An idle connection costs no entry in a shared
//! table, and connecting takes no shared lock.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;
use std::time::{Duration, Instant};

#[cfg(feature = "stream")]
use tokio::sync::Notify;

use crate::connection::config::Config;
use crate::connection::conn::Conn;
use crate::connection::meters::Meters;
use crate::connection::outbox::{ConnShared, Outbound};
use crate::connection::spread::{Spread, Spreader};
use crate::connection::wake::ConnWake;
use crate::pool::BufferPool;
use crate::proto::CloseCode;

/// What the connections of one server (or one client) share; see the module.
pub(crate) struct Hub {
    pub(crate) config: Config,
    pub(crate) pool: Arc<BufferPool>,
    /// The sending settings every connection holds (the same pool).
    outbound: Arc<Outbound>,
    next_id: AtomicU64,
    live: AtomicUsize,
    /// Upgraded connections not yet ended.
    open: AtomicUsize,
    /// Wakes the tokio `serve` waiting for the last connection to end.
    #[cfg(feature = "stream")]
    idle: Notify,
    shutting_down: AtomicBool,
    /// Set when the shutdown timeout has passed: loops drop their connections.
    aborting: AtomicBool,
    /// Set (before the shutdown flag) when the shutdown is spread: the
    /// loops hand their connections to it instead of closing them.
    spreader: OnceLock<Arc<Spreader>>,
    /// A handoff is under way: requests (plain HTTP, upgrades) are not
    /// read or handled here, so nothing a request does (a publish) happens
    /// after the server's state left.
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    requests_frozen: AtomicBool,
    /// A handoff is about to send the server's state: open connections
    /// read and handle nothing more here (what their callbacks do, a
    /// publish, would come after the state left); what they sent waits for
    /// the successor. Each loop acknowledges it between two turns.
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    input_frozen: AtomicBool,
    /// Requests being handled now, on any thread (see
    /// [`Hub::begin_request`]).
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    requests_handled: AtomicUsize,
    /// Held while a shutdown is started, so that a plain one and a spread
    /// one asked for at once make one shutdown of one kind.
    starting: Mutex<()>,
    /// Wakes the tasks that wait for a shutdown or an abort (the tokio accept
    /// loop, stream connections); they look at the flags when woken.
    #[cfg(feature = "stream")]
    signals: Notify,
    /// The server loops (and `serve` on io_uring), woken when a shutdown
    /// begins and again when it turns to an abort.
    loop_wakers: Mutex<Vec<Waker>>,
}

impl Hub {
    /// A hub of `driver` (the `driver` label of its metrics:
    /// `tokio`, `uring`, `stream` or `client`).
    pub(crate) fn new(config: Config, driver: &'static str) -> Arc<Hub> {
        let pool = Arc::new(BufferPool::default());
        let outbound = Arc::new(Outbound {
            pool: pool.clone(),
            max_bytes: config.max_outbound_bytes,
            on_full: config.slow_consumer,
            meters: Meters::new(driver),
        });
        Arc::new(Hub {
            config,
            pool,
            outbound,
            next_id: AtomicU64::new(1),
            live: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            #[cfg(feature = "stream")]
            idle: Notify::new(),
            shutting_down: AtomicBool::new(false),
            aborting: AtomicBool::new(false),
            spreader: OnceLock::new(),
            #[cfg(all(target_os = "linux", feature = "handoff"))]
            requests_frozen: AtomicBool::new(false),
            #[cfg(all(target_os = "linux", feature = "handoff"))]
            input_frozen: AtomicBool::new(false),
            #[cfg(all(target_os = "linux", feature = "handoff"))]
            requests_handled: AtomicUsize::new(0),
            starting: Mutex::new(()),
            #[cfg(feature = "stream")]
            signals: Notify::new(),
            loop_wakers: Mutex::new(Vec::new()),
        })
    }

    /// Counts a connection (from its accept) until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> LiveGuard {
        self.live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(self.clone())
    }

    /// Creates the shared state of an upgraded connection, which reaches its
    /// server loop through `wake`, and counts it as open. If a shutdown has
    /// already begun, the connection is asked to close right away.
    ///
    /// Call from the loop that serves the connection: that loop closes its
    /// open connections when it sees the shutdown flag, so a connection opened
    /// before it looked is closed by it, and one opened after sees the flag
    /// here.
    pub(crate) fn open_connection(
        self: &Arc<Self>,
        peer: std::net::SocketAddr,
        wake: ConnWake,
        role: crate::proto::Role,
    ) -> (Conn, Registration) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = ConnShared::new(id, peer, self.outbound.clone(), wake, role);
        self.open.fetch_add(1, Ordering::Relaxed);
        self.outbound.meters.opened();
        let registration = Registration(self.clone());
        let conn = Conn::from_shared(shared);
        if self.is_shutting_down() {
            self.close_for_shutdown(&conn);
        }
        (conn, registration)
    }

    /// Asks an open connection to close because the server is shutting
    /// down: with 1001 at once, or, in a spread shutdown, at its slot in the window.
    pub(crate) fn close_for_shutdown(&self, conn: &Conn) {
        match self.spreader.get() {
            Some(spreader) => spreader.add(conn),
            // Refused only if it is closing already, which is as good.
            None => {
                let _ = conn.close(CloseCode::GOING_AWAY, "server shutting down");
            }
        }
    }

    /// Starts a shutdown that closes the open connections as `spread` says
    /// (see [`Spreader`]). Returns false if a shutdown was already under way.
    pub(crate) fn begin_spread(&self, spread: Spread) -> bool {
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_shutting_down() {
            return false;
        }
        // Its thread starts only now that this is the shutdown; the loops
        // see it once they see the flag, and so does the wait before the
        // abort (`shutdown_wait`).
        let _ = self.spreader.set(Spreader::start(spread, self.open()));
        self.raise_shutdown()
    }

    /// How long a shutdown waits for the connections to close before
    /// dropping them: a spread shutdown's window, then `shutdown_timeout`.
    pub(crate) fn shutdown_wait(&self) -> Duration {
        let window = self
            .spreader
            .get()
            .map_or(Duration::ZERO, |s| s.spread().window());
        self.config.shutdown_timeout.saturating_add(window)
    }

    /// Sets the shutdown flag and wakes the accept loop and every server loop,
    /// which close their connections with 1001. Returns false if a shutdown
    /// was already under way.
    pub(crate) fn begin_shutdown(&self) -> bool {
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        self.raise_shutdown()
    }

    /// Sets the flag and wakes the loops (under `starting`).
    fn raise_shutdown(&self) -> bool {
        if self.shutting_down.swap(true, Ordering::SeqCst) {
            return false;
        }
        fence(Ordering::SeqCst);
        self.wake_loops();
        true
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Resolves once a shutdown has been requested. Any number of tasks may wait.
    #[cfg(feature = "stream")]
    pub(crate) async fn shutdown_requested(&self) {
        self.until(Hub::is_shutting_down).await;
    }

    /// Completes at the next shutdown or abort signal (enable it, then look
    /// at the flags, so that none is missed in between).
    #[cfg(feature = "stream")]
    pub(crate) fn signaled(&self) -> tokio::sync::futures::Notified<'_> {
        self.signals.notified()
    }

    /// Resolves once the shutdown has turned to an abort.
    #[cfg(all(feature = "rustls", feature = "tokio"))]
    pub(crate) async fn abort_requested(&self) {
        self.until(Hub::is_aborting).await;
    }

    /// Resolves once `flag` is true; it is looked at whenever the shutdown
    /// or abort flag changes.
    #[cfg(feature = "stream")]
    async fn until(&self, flag: fn(&Hub) -> bool) {
        loop {
            let notified = self.signals.notified();
            tokio::pin!(notified);
            // Registered before the flag is checked, so a change between the
            // check and the await is not missed.
            notified.as_mut().enable();
            if flag(self) {
                return;
            }
            notified.await;
        }
    }

    /// After a shutdown began: waits for the connections to close, at most
    /// [`shutdown_wait`](Self::shutdown_wait), then aborts the rest and gives
    /// them a second to go.
    #[cfg(feature = "stream")]
    pub(crate) async fn finish_shutdown(&self) {
        if tokio::time::timeout(self.shutdown_wait(), self.wait_idle())
            .await
            .is_err()
        {
            self.abort_remaining();
            let _ = tokio::time::timeout(Duration::from_secs(1), self.wait_idle()).await;
        }
    }

    /// Calls `waker` when a shutdown begins (at once if it already has) and
    /// again if it turns to an abort. A server loop registers itself here
    /// when it starts.
    pub(crate) fn watch(&self, waker: Waker) {
        self.loop_wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.clone());
        // Pairs with the fence in `begin_shutdown`: either its wake reaches
        // this waker, or this load sees its flag.
        fence(Ordering::SeqCst);
        if self.is_shutting_down() {
            waker.wake();
        }
    }

    /// Forgets a waker [`Hub::watch`] was given (a server loop that ended):
    /// those made from the same `Arc` (the same data pointer) go.
    #[cfg(feature = "tokio")]
    pub(crate) fn unwatch(&self, waker: &Waker) {
        self.loop_wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|watching| watching.data() != waker.data());
    }

    /// The shutdown timeout has passed with connections left: says so and
    /// aborts them.
    pub(crate) fn abort_remaining(&self) {
        // Several may wait for the end (a server's loop and any handle's
        // `ended`): the first to see the timeout pass says so.
        if !self.is_aborting() {
            tracing::warn!(
                remaining = self.live(),
                "connections still open after the shutdown timeout; dropping them"
            );
        }
        self.abort_all();
    }

    /// Makes every server loop drop its connections at once (after the
    /// shutdown timeout).
    pub(crate) fn abort_all(&self) {
        self.aborting.store(true, Ordering::SeqCst);
        if let Some(spreader) = self.spreader.get() {
            spreader.finish();
        }
        self.wake_loops();
    }

    /// True once [`Hub::abort_all`] was called.
    pub(crate) fn is_aborting(&self) -> bool {
        self.aborting.load(Ordering::SeqCst)
    }

    fn wake_loops(&self) {
        #[cfg(feature = "stream")]
        self.signals.notify_waiters();
        let wakers = self.loop_wakers.lock().unwrap_or_else(|p| p.into_inner());
        wakers.iter().for_each(Waker::wake_by_ref);
    }

    /// Resolves once no connection is left.
    #[cfg(feature = "stream")]
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.live.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The last connection ended: wakes whoever waits in `wait_idle` (the
    /// io_uring `serve` looks at the count itself).
    fn notify_idle(&self) {
        #[cfg(feature = "stream")]
        self.idle.notify_waiters();
    }

    /// Connections alive, including those still in the handshake or closing.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Stops (or lets go on) reading and handling requests, for a handoff
    /// (see the field). A loop sees it from its next step on.
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    pub(crate) fn freeze_requests(&self, frozen: bool) {
        self.requests_frozen.store(frozen, Ordering::SeqCst);
    }

    /// Stops (or lets go on) reading and handling open connections' input,
    /// for a handoff (see the field).
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    pub(crate) fn freeze_input(&self, frozen: bool) {
        self.input_frozen.store(frozen, Ordering::SeqCst);
        if !frozen {
            // Connections served by tasks (the stream driver), which no
            // loop gives a turn: they read, and handle what waited, again.
            self.wake_loops();
        }
    }

    /// Whether open connections' input waits (see
    /// [`Hub::freeze_input`]; never without the `handoff` feature).
    /// Keepalive sweeps wait too: no pong is read meanwhile, so none may
    /// count against a connection's idle time.
    pub(crate) fn input_frozen(&self) -> bool {
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        return self.input_frozen.load(Ordering::Relaxed);
        #[cfg(not(all(target_os = "linux", feature = "handoff")))]
        false
    }

    /// Whether requests wait (see [`Hub::freeze_requests`]; never
    /// without the `handoff` feature).
    pub(crate) fn requests_frozen(&self) -> bool {
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        return self.requests_frozen.load(Ordering::SeqCst);
        #[cfg(not(all(target_os = "linux", feature = "handoff")))]
        false
    }

    /// A request is about to be handled: counted until the guard goes, or
    /// `None` (not counted) if requests are frozen. Counted first, the flag
    /// read after (both `SeqCst`), so a handoff that sets the flag and then
    /// sees no request counted knows none is being handled anywhere (a
    /// group, a stream task), nor will be.
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    pub(crate) fn begin_request(&self) -> Option<RequestGuard<'_>> {
        self.requests_handled.fetch_add(1, Ordering::SeqCst);
        let guard = RequestGuard(self);
        (!self.requests_frozen()).then_some(guard)
    }

    /// Requests being handled now (see [`Hub::begin_request`]).
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    pub(crate) fn requests_handled(&self) -> usize {
        self.requests_handled.load(Ordering::SeqCst)
    }

    /// The metric handles (nothing without feature `metrics`).
    pub(crate) fn meters(&self) -> &Meters {
        &self.outbound.meters
    }

    /// Upgraded connections not yet ended.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Whether `max_connections` leaves room for one more upgrade.
    pub(crate) fn has_room(&self) -> bool {
        self.config
            .max_connections
            .is_none_or(|max| self.open() < max)
    }
}

/// A request counted as being handled (see [`Hub::begin_request`]).
#[cfg(all(target_os = "linux", feature = "handoff"))]
pub(crate) struct RequestGuard<'a>(&'a Hub);

#[cfg(all(target_os = "linux", feature = "handoff"))]
impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        self.0.requests_handled.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `timeout` from now (see [`deadline_from`]).
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    deadline_from(Instant::now(), timeout)
}

/// `timeout` after `now`; a timeout too long to represent (`Duration::MAX`
/// for "never") becomes about 30 years, as `tokio::time::sleep` does.
pub(crate) fn deadline_from(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

/// Keeps a connection counted as live.
pub(crate) struct LiveGuard(Arc<Hub>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.notify_idle();
        }
    }
}

/// Counts an upgraded connection as open until dropped.
pub(crate) struct Registration(Arc<Hub>);

impl Drop for Registration {
    fn drop(&mut self) {
        self.0.outbound.meters.ended();
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A handle to a running server, to stop it or look at it from elsewhere.
#[derive(Clone)]
pub struct ServerHandle {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("connections", &self.connections())
            .field("shutting_down", &self.hub.is_shutting_down())
            .finish()
    }
}

impl ServerHandle {
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        ServerHandle { hub }
    }

    /// Starts a graceful shutdown: the server stops accepting (new
    /// upgrades are answered 503), sends close 1001 to every connection and
    /// waits for them, at most the config's `shutdown_timeout`, before
    /// dropping the rest. Calling it again does nothing. It returns at once;
    /// [`ended`](Self::ended) waits for the end, on every server.
    pub fn shutdown(&self) {
        if self.hub.begin_shutdown() {
            tracing::info!(connections = self.connections(), "shutting down");
        }
    }

    /// Starts a spread shutdown: a graceful shutdown whose closes are
    /// spread over a window instead of sent at once, so that the clients of
    /// a server being deployed reconnect over the window rather than all in
    /// the same second (NATS's lame duck mode). The server stops accepting
    /// at once (the listening sockets close, so a load balancer moves on;
    /// upgrades in progress are answered 503); each open connection gets
    /// the close of `spread` (1012, service restart, unless
    /// [`Spread::code`] says otherwise) at its own moment in the window,
    /// evenly spread with jitter; the close handshakes then have
    /// `shutdown_timeout` to finish before the rest are dropped. Calling it
    /// (or [`shutdown`](Self::shutdown)) again does nothing. It returns at
    /// once; [`ended`](Self::ended) waits for the end, and
    /// [`shutdown_gracefully`](Self::shutdown_gracefully) does both.
    ///
    /// [`Spread::over`] a zero window closes every connection at once.
    pub fn shutdown_spread(&self, spread: Spread) {
        let window = spread.window();
        if self.hub.begin_spread(spread) {
            tracing::info!(
                connections = self.connections(),
                window_ms = window.as_millis() as u64,
                "shutting down, closes spread over the window"
            );
        }
    }

    /// Closes every connection with 1012 spread over `window` (see
    /// [`shutdown_spread`](Self::shutdown_spread)) and resolves once every
    /// connection has ended: at most `window` plus the config's
    /// `shutdown_timeout` after the call. On io_uring, `serve` returns then
    /// too.
    ///
    /// ```no_run
    /// # async fn run(handle: rapidws::ServerHandle) {
    /// // On SIGTERM: stop accepting, close everyone with 1012 over 30 s.
    /// handle.shutdown_gracefully(std::time::Duration::from_secs(30)).await;
    /// # }
    /// ```
    #[cfg(feature = "stream")]
    pub async fn shutdown_gracefully(&self, window: Duration) {
        self.shutdown_spread(Spread::over(window));
        self.ended().await;
    }

    /// Resolves once a shutdown was asked for (through any handle) and
    /// every connection of the server has ended: closed within the
    /// `shutdown_timeout`, or dropped once it passed (a connection of
    /// `uring::Server` is dropped by the time its `serve` returns). The
    /// same on every server, whoever asked for the shutdown; `serve`
    /// returning (tokio, io_uring) or `shutdown().await` (stream, axum, the
    /// client) says the same thing where there is one to wait on.
    ///
    /// ```no_run
    /// # async fn run(handle: rapidws::ServerHandle) {
    /// handle.shutdown();
    /// handle.ended().await;
    /// # }
    /// ```
    #[cfg(feature = "stream")]
    pub async fn ended(&self) {
        self.hub.shutdown_requested().await;
        self.hub.finish_shutdown().await;
        self.hub.wait_idle().await;
    }

    /// Open WebSocket connections (upgraded and not yet closed).
    pub fn connections(&self) -> usize {
        self.hub.open()
    }

    /// Accepted connections not yet finished: upgraded ones, and also those
    /// still in the handshake or ending TCP.
    pub fn alive(&self) -> usize {
        self.hub.live()
    }
}
