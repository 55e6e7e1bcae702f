//! [`SocketHandler`]: the [`Handler`] that gives each connection to an async
//! function as a [`WebSocket`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::runtime::Handle;

use super::WebSocket;
use super::inbox::Inbox;
use crate::connection::conn::Conn;
use crate::connection::handler::{Accept, Handler, HttpResponse, Reject, ServerHandler};
use crate::driver::local;
use crate::handshake::Request;
use crate::proto::{CloseCode, Message};

/// What an inbox holds before the connection stops reading, by default.
pub const DEFAULT_INBOX_LIMIT: usize = 1 << 20;

pub(crate) type Upgrade<T> = dyn Fn(&Request<'_>, &mut Accept) -> Result<T, Reject> + Send + Sync;
pub(crate) type Serve<T> =
    dyn Fn(WebSocket, T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;
type Http = dyn Fn(&Request<'_>) -> Option<HttpResponse> + Send + Sync;

/// A [`Handler`] that spawns an async function for each new connection and
/// hands it the connection as a [`WebSocket`]. `T` is what the upgrade hook
/// passes on to the function (the request's path, a user found from a
/// token), `()` with [`SocketHandler::new`].
///
/// The function runs on a tokio runtime: the one current when the handler
/// was made (so make it inside the runtime you serve from), or the one given
/// with [`SocketHandler::runtime`] (needed with io_uring when the handler is
/// made outside a runtime). Without either, connections are closed with
/// 1011 and an error is logged.
pub struct SocketHandler<T = ()> {
    upgrade: Box<Upgrade<T>>,
    serve: Box<Serve<T>>,
    runtime: Option<Handle>,
    inbox_limit: usize,
    http: Option<Box<Http>>,
    on_loop: bool,
}

impl<T> std::fmt::Debug for SocketHandler<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketHandler")
            .field("inbox_limit", &self.inbox_limit)
            .field("on_server_loop", &self.on_loop)
            .finish_non_exhaustive()
    }
}

impl SocketHandler<()> {
    /// Accepts every upgrade (no subprotocol) and runs `serve` for each
    /// connection.
    pub fn new<F, Fut>(serve: F) -> Self
    where
        F: Fn(WebSocket) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        SocketHandler::with_upgrade(|_, _| Ok(()), move |socket, ()| serve(socket))
    }
}

impl<T: Send + 'static> SocketHandler<T> {
    /// `upgrade` decides on each request as `ServerHandler::on_upgrade` does (it
    /// may choose a subprotocol or refuse permessage-deflate through
    /// `accept`, or answer with a [`Reject`]); what it returns is given to
    /// `serve` with the socket.
    pub fn with_upgrade<U, F, Fut>(upgrade: U, serve: F) -> Self
    where
        U: Fn(&Request<'_>, &mut Accept) -> Result<T, Reject> + Send + Sync + 'static,
        F: Fn(WebSocket, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        SocketHandler {
            upgrade: Box::new(upgrade),
            serve: Box::new(move |socket, value| Box::pin(serve(socket, value))),
            runtime: Handle::try_current().ok(),
            inbox_limit: DEFAULT_INBOX_LIMIT,
            http: None,
            on_loop: false,
        }
    }

    /// A handler whose functions run on the runtime of the task that opens
    /// each connection (hyper's and axum's: its group's, or the stream
    /// driver's task).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn from_parts(upgrade: Box<Upgrade<T>>, serve: Box<Serve<T>>) -> Self {
        SocketHandler {
            upgrade,
            serve,
            runtime: None,
            inbox_limit: DEFAULT_INBOX_LIMIT,
            http: None,
            on_loop: false,
        }
    }

    /// Runs the functions on this runtime.
    pub fn runtime(mut self, runtime: Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Runs each function on the thread of the server loop that serves its
    /// connection, where the loop runs tasks (an io_uring reactor), instead
    /// of on the runtime: a message reaches the function, and its sends
    /// reach the connection, without crossing a thread, which on io_uring
    /// saves two thread wake-ups per exchange (and a context switch each
    /// when the reactor and the runtime share a core). The function is
    /// still polled inside the runtime's context (its timers, `spawn`s and
    /// sockets work), and [`spawn`](super::spawn) in it puts a task
    /// beside it on that thread.
    ///
    /// Everything the reactor serves waits while such a function runs:
    /// keep blocking or long work off it (`spawn_blocking`, or a task on
    /// the runtime). Tokio's cooperative budget does not apply there, so a
    /// loop over a source that is always ready (a channel fed faster than
    /// it is read) must yield now and then (`tokio::task::yield_now`) or
    /// it holds the reactor. On the tokio groups and the stream driver,
    /// which run on the runtime's threads already, this changes nothing.
    pub fn on_server_loop(mut self) -> Self {
        self.on_loop = true;
        self
    }

    /// Bytes of received messages a socket may hold before its connection
    /// stops reading (each message counts 64 bytes more than its payload);
    /// reading goes on when the socket has taken it down to half. Default
    /// 1 MiB. A message longer than this is still delivered, alone.
    pub fn inbox_limit(mut self, bytes: usize) -> Self {
        self.inbox_limit = bytes;
        self
    }

    /// Answers plain HTTP requests (not upgrades) with `http`, as
    /// [`ServerHandler::on_http`] does (a server's `/metrics`, a health
    /// check); `None` from it, or no `http` at all, refuses the request
    /// as a bad upgrade (400, or 405 for a method other than GET).
    pub fn on_http<H>(mut self, http: H) -> Self
    where
        H: Fn(&Request<'_>) -> Option<HttpResponse> + Send + Sync + 'static,
    {
        self.http = Some(Box::new(http));
        self
    }
}

/// A [`SocketHandler`] connection's state: what the upgrade hook returned
/// until the function starts, then the socket's inbox.
pub struct SocketState<T> {
    value: Option<T>,
    inbox: Option<Arc<Inbox>>,
}

impl<T> SocketState<T> {
    /// Replaces what the upgrade hook returned, before the connection opens
    /// (the axum extractor puts each request's function here).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn set_value(&mut self, value: T) {
        self.value = Some(value);
    }
}

impl<T: Send + 'static> ServerHandler for SocketHandler<T> {
    fn on_upgrade(
        &self,
        request: &Request<'_>,
        accept: &mut Accept,
    ) -> Result<SocketState<T>, Reject> {
        Ok(SocketState {
            value: Some((self.upgrade)(request, accept)?),
            inbox: None,
        })
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        self.http.as_ref().and_then(|http| http(request))
    }
}

impl<T: Send + 'static> Handler for SocketHandler<T> {
    type State = SocketState<T>;

    fn on_open(&self, conn: &Conn, state: &mut SocketState<T>) {
        let runtime = self.runtime.clone().or_else(|| Handle::try_current().ok());
        let (Some(runtime), Some(value)) = (runtime, state.value.take()) else {
            tracing::error!(
                id = conn.id(),
                "SocketHandler has no tokio runtime to run the socket on (see SocketHandler::runtime)"
            );
            let _ = conn.close(CloseCode::INTERNAL_ERROR, "no runtime for the socket");
            return;
        };
        let inbox = Arc::new(Inbox::new(self.inbox_limit));
        state.inbox = Some(inbox.clone());
        let task = (self.serve)(WebSocket::new(conn.clone(), inbox), value);
        if self.on_loop && local::on_loop_thread() {
            local::spawn_entered(runtime, task);
        } else {
            runtime.spawn(task);
        }
    }

    fn on_message(&self, conn: &Conn, state: &mut SocketState<T>, message: Message<'_>) {
        if let Some(inbox) = &state.inbox {
            inbox.push(message.into_owned(), conn);
        }
    }

    /// While the socket reads, it may still be answering a message it took:
    /// the peer's close (or a failure's) waits until `recv` has returned
    /// the end, or the read half was dropped, the close timeout at most.
    fn has_unhandled_messages(&self, state: &SocketState<T>) -> bool {
        state.inbox.as_ref().is_some_and(|inbox| inbox.is_read())
    }

    fn on_close(&self, _conn: &Conn, state: &mut SocketState<T>, code: CloseCode, reason: &str) {
        if let Some(inbox) = &state.inbox {
            inbox.end(code, reason);
        }
    }
}
