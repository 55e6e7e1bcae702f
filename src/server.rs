//! What a server keeps across its connections, whatever the backend: settings,
//! the buffer pool, connection ids, the live-connection count and the registry a
//! shutdown uses to reach every connection.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::Config;
use crate::conn::{Conn, ConnShared};
use crate::pool::BufferPool;
use crate::proto::CloseCode;
use crate::registry::Registry;

pub(crate) struct ServerCore {
    pub(crate) config: Config,
    pub(crate) pool: Arc<BufferPool>,
    registry: Registry,
    next_id: AtomicU64,
    live: AtomicUsize,
    idle: Notify,
    shutting_down: AtomicBool,
    /// Wakes the accept loop and the connection groups (for the handshakes in
    /// progress) at shutdown.
    shutdown_requested: Notify,
    /// The same for whoever waits without a tokio runtime (io_uring reactors).
    shutdown_wakers: Mutex<Vec<Waker>>,
}

impl ServerCore {
    pub(crate) fn new(config: Config) -> Arc<ServerCore> {
        Arc::new(ServerCore {
            config,
            pool: Arc::new(BufferPool::default()),
            registry: Registry::default(),
            next_id: AtomicU64::new(1),
            live: AtomicUsize::new(0),
            idle: Notify::new(),
            shutting_down: AtomicBool::new(false),
            shutdown_requested: Notify::new(),
            shutdown_wakers: Mutex::new(Vec::new()),
        })
    }

    /// Counts a connection (from its accept) until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> LiveGuard {
        self.live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(self.clone())
    }

    /// Creates the shared state of an upgraded connection and registers it, so a
    /// shutdown reaches it. If a shutdown has already begun, the connection is
    /// asked to close right away.
    pub(crate) fn open_connection(
        self: &Arc<Self>,
        peer: std::net::SocketAddr,
    ) -> (Conn, Registration) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = ConnShared::new(id, peer, self.config.max_outbound_bytes, self.pool.clone());
        self.registry.insert(id, shared.clone());
        let registration = Registration {
            core: self.clone(),
            id,
        };
        let conn = Conn::from_shared(shared);
        // Pairs with the fence in `begin_shutdown`: either that sweep sees this
        // registration, or this load sees its flag.
        fence(Ordering::SeqCst);
        if self.shutting_down.load(Ordering::SeqCst) {
            let _ = conn.close(CloseCode::GOING_AWAY, SHUTDOWN_REASON);
        }
        (conn, registration)
    }

    /// Sets the shutdown flag, wakes the accept loop, and asks every registered
    /// connection to close with 1001. Returns false if a shutdown was already
    /// under way.
    pub(crate) fn begin_shutdown(&self) -> bool {
        if self.shutting_down.swap(true, Ordering::SeqCst) {
            return false;
        }
        fence(Ordering::SeqCst);
        self.shutdown_requested.notify_waiters();
        let wakers = std::mem::take(
            &mut *self
                .shutdown_wakers
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        wakers.into_iter().for_each(Waker::wake);
        self.registry.for_each(|shared| {
            let _ = Conn::from_shared(shared.clone()).close(CloseCode::GOING_AWAY, SHUTDOWN_REASON);
        });
        true
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Resolves once a shutdown has been requested. Any number of tasks may wait
    /// (the accept loop and every connection group).
    pub(crate) async fn shutdown_requested(&self) {
        loop {
            let notified = self.shutdown_requested.notified();
            tokio::pin!(notified);
            // Registered before the flag is checked, so a shutdown between the
            // check and the await is not missed.
            notified.as_mut().enable();
            if self.is_shutting_down() {
                return;
            }
            notified.await;
        }
    }

    /// Calls `waker` once a shutdown is requested (at once if it already was).
    pub(crate) fn on_shutdown(&self, waker: Waker) {
        self.shutdown_wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.clone());
        // Pairs with the fence in `begin_shutdown`: either its sweep takes this
        // waker, or this load sees its flag.
        fence(Ordering::SeqCst);
        if self.is_shutting_down() {
            waker.wake();
        }
    }

    /// Drops every registered connection at once (after the shutdown timeout).
    pub(crate) fn abort_all(&self) {
        self.registry.for_each(|shared| shared.abort());
    }

    /// Resolves once no connection is left.
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

    /// Connections alive, including those still in the handshake or closing.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Upgraded connections currently registered.
    pub(crate) fn registered(&self) -> usize {
        self.registry.len()
    }
}

const SHUTDOWN_REASON: &str = "server shutting down";

/// `timeout` from now; a timeout too long to represent (`Duration::MAX` for
/// "never") becomes about 30 years, as `tokio::time::sleep` does.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

/// Keeps a connection counted as live.
pub(crate) struct LiveGuard(Arc<ServerCore>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Keeps an upgraded connection in the registry.
pub(crate) struct Registration {
    core: Arc<ServerCore>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.core.registry.remove(self.id);
    }
}

/// A handle to a running server, to stop it or look at it from elsewhere.
#[derive(Clone)]
pub struct ServerHandle {
    core: Arc<ServerCore>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("connections", &self.connections())
            .field("shutting_down", &self.core.is_shutting_down())
            .finish()
    }
}

impl ServerHandle {
    pub(crate) fn new(core: Arc<ServerCore>) -> Self {
        ServerHandle { core }
    }

    /// Starts a graceful shutdown: the server stops accepting, sends close 1001
    /// to every connection and waits for them (bounded by `shutdown_timeout`)
    /// before `serve` returns. Calling it again does nothing.
    pub fn shutdown(&self) {
        if self.core.begin_shutdown() {
            tracing::info!(connections = self.connections(), "shutting down");
        }
    }

    /// Open WebSocket connections (upgraded and not yet closed).
    pub fn connections(&self) -> usize {
        self.core.registered()
    }

    /// Accepted connections not yet finished: upgraded ones, and also those
    /// still in the handshake or ending TCP.
    pub fn alive(&self) -> usize {
        self.core.live()
    }
}

/// Pending connections the kernel queues for `accept`.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// Back-off after an accept error such as EMFILE: doubles up to the maximum.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(5);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Accept errors about one incoming connection, which are no reason to pause.
pub(crate) fn concerns_one_connection(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionRefused
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    )
}
