//! [`Mux`], the handle the application holds.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use rapidws_core::mux::{Budget, Config, Mux as Protocol, MuxStats, Side, Version};
use tokio::io::{AsyncRead, AsyncWrite};

use super::driver::Driver;
use super::shared::Shared;
use super::{Error, Stream};

/// One mux (smux's "session"): many streams over one connection; opens
/// and accepts [`Stream`]s.
///
/// Cloning gives another handle to the same mux. The mux ends
/// when the transport does, when the peer breaks the protocol, at
/// [`close`](Mux::close), or once every handle and every stream is
/// dropped; its streams then read what had arrived and then fail.
pub struct Mux {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Mux")
            .field("side", &state.protocol.side())
            .field("version", &state.protocol.version())
            .field("streams", &state.protocol.streams())
            .field("unsent", &state.protocol.unsent())
            .field("buffered", &state.protocol.buffered())
            .field("held", &state.protocol.held())
            .field("wants_input", &state.protocol.wants_input())
            .field("has_output", &state.protocol.has_output())
            .field("ending", &state.protocol.is_ending())
            .field("ended", &state.ended)
            .finish()
    }
}

impl Clone for Mux {
    fn clone(&self) -> Self {
        self.shared.lock().handles += 1;
        Mux {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.handles -= 1;
        if state.handles == 0 {
            // Nobody can accept any more: what the peer opens is refused.
            state.protocol.refuse_incoming();
            state.dispatch();
            state.wake_driver();
        }
    }
}

impl Mux {
    /// A mux over `io` (a TCP or TLS stream, any async byte stream),
    /// on `side`: [`Side::Dialer`] if this end connected, as smux's
    /// client (it opens odd stream ids). Spawns its driver on the current
    /// tokio runtime, or beside the socket on an io_uring reactor when made
    /// there ([`socket::spawn`](crate::socket::spawn)).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, if `config` fails [`Config::check`] (the
    /// message says what is wrong), or if a [`Side::Dialer`] leaves the
    /// version to the peer (the peer, a server, waits for it to speak).
    pub fn new<T>(io: T, side: Side, config: Config) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Mux::start(super::driver::Plain(io), side, config)
    }

    /// [`Mux::new`] over either kind of transport.
    fn start<T: super::driver::Transport + Send + 'static>(
        io: T,
        side: Side,
        config: Config,
    ) -> Mux {
        if let Err(problem) = config.check() {
            panic!("rapidws::mux::Config: {problem}");
        }
        if side == Side::Dialer && config.version.is_none() {
            // It would wait for a peer that waits for it.
            panic!(
                "rapidws::mux::Config: the side that dialled must choose the version (version: None is for servers)"
            );
        }
        crate::connection::budgets::watch(&config.budget, "mux");
        let protocol = Protocol::new(side, config, Instant::now());
        let shared = Arc::new(Shared::new(protocol));
        // Beside its transport: on an io_uring reactor when the mux is
        // made there (over a socket run on the server loop).
        crate::driver::local::spawn_beside(Driver::new(io, shared.clone()).run());
        Mux { shared }
    }

    /// A mux over a WebSocket whose binary messages carry the smux
    /// bytes (see [`MessageStream`](super::MessageStream)).
    #[cfg(feature = "socket")]
    pub fn over_websocket(socket: crate::socket::WebSocket, side: Side, config: Config) -> Mux {
        Mux::start(super::MessageStream::new(socket), side, config)
    }

    /// Opens a stream. Its SYN goes out at once; the peer sees the stream
    /// when it accepts. Fails at once when [`Config::max_streams`] streams
    /// are open or the mux ended.
    pub async fn open_stream(&self) -> Result<Stream, Error> {
        let mut state = self.shared.lock();
        if let Some(why) = &state.ended {
            return Err(why.clone());
        }
        let id = state.protocol.open().map_err(Error::Open)?;
        state.wake_driver();
        drop(state);
        Ok(Stream::new(self.shared.clone(), id))
    }

    /// The next stream the peer opens; `None` once the mux ended.
    pub async fn accept_stream(&self) -> Option<Stream> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// [`accept_stream`](Mux::accept_stream) as a poll.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Option<Stream>> {
        let mut state = self.shared.lock();
        if let Some(id) = state.protocol.accept() {
            return Poll::Ready(Some(Stream::new(self.shared.clone(), id)));
        }
        if state.ended.is_some() || state.protocol.is_failed() {
            return Poll::Ready(None);
        }
        state.park_acceptor(cx.waker());
        Poll::Pending
    }

    /// Streams open now (opened, accepted or waiting to be, or closed with
    /// data still going out).
    pub fn streams(&self) -> usize {
        self.shared.lock().protocol.streams()
    }

    /// The version spoken, once known (see [`Config::version`]).
    pub fn version(&self) -> Option<Version> {
        self.shared.lock().protocol.version()
    }

    /// What the mux counted (refused SYNs, data dropped).
    pub fn stats(&self) -> MuxStats {
        self.shared.lock().protocol.stats()
    }

    /// What the mux holds against its budget now
    /// ([`Config::budget`]): bytes received and not yet read, written and
    /// not yet sent.
    pub fn held(&self) -> usize {
        self.shared.lock().protocol.held()
    }

    /// The budget the mux shares with every other of its
    /// configuration.
    pub fn budget(&self) -> Budget {
        self.shared.lock().protocol.config().budget.clone()
    }

    /// Whether the mux ended.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().ended.is_some()
    }

    /// Ends the mux cleanly: every stream gets its FIN after what was
    /// written, new streams are refused both ways, and once that is out
    /// (streams waiting for the peer's window get 5 s) the transport is
    /// shut down. Returns when the driver is done (what
    /// [`closed`](Mux::closed) returns). A program about to exit calls it:
    /// a stream's `flush` and `shutdown` return before the bytes leave.
    pub async fn close(&self) -> Result<(), Error> {
        {
            let mut state = self.shared.lock();
            state.protocol.shut_down();
            state.wake_driver();
        }
        self.closed().await
    }

    /// Waits for the mux to end: `Ok` if it ended cleanly (the
    /// transport closed, or [`close`](Mux::close)), the error otherwise.
    pub async fn closed(&self) -> Result<(), Error> {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            match &state.ended {
                Some(Error::Closed) => Poll::Ready(Ok(())),
                Some(error) => Poll::Ready(Err(error.clone())),
                None => {
                    state.park_watcher(cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }
}
