//! An async WebSocket, for code that prefers `async` to callbacks: a value
//! with `recv` and `send`, a [`Stream`] of messages and a [`Sink`] for them,
//! and owned halves for a reader task and a writer task. It stands on the
//! callback API, on every driver; its inbox is bounded
//! ([`SocketHandler::inbox_limit`]), so a slow task slows its peer down
//! through TCP.
//!
//! [`SocketHandler`] is the [`Handler`](crate::Handler) that hands each new
//! connection to an async function as a `WebSocket`, on any server:
//!
//! ```no_run
//! use rapidws::socket::{SocketHandler, WebSocket};
//!
//! async fn echo(mut socket: WebSocket) {
//!     while let Some(Ok(message)) = socket.recv().await {
//!         if socket.send(message).await.is_err() {
//!             break;
//!         }
//!     }
//! }
//!
//! # async fn run() -> std::io::Result<()> {
//! let server = rapidws::tokio::Server::bind(
//!     "127.0.0.1:9001",
//!     SocketHandler::new(echo),
//!     rapidws::Config::default(),
//! )
//! .await?;
//! server.serve().await
//! # }
//! ```
//!
//! The call contract:
//! - `recv` (and `Stream::poll_next`) is cancel-safe: a message is taken
//!   only by the call that returns it.
//! - `send` waits for room in the connection's queue ([`Conn::ready`]) and
//!   never sets off the slow-consumer policy; `Sink::poll_ready` is the same
//!   wait and does not flush. There is nothing to flush: the driver writes
//!   whatever is queued as soon as the socket takes it, so `poll_flush` is
//!   ready at once.
//! - The stream ends (`None`) when the connection is over. If it ended with
//!   a failure code (1002 protocol error, 1006 TCP ended without a close,
//!   1007 invalid data, 1009 too big, 1011 internal error: sent by the
//!   server when it failed the connection, or by the peer in its own close
//!   frame), it yields one [`Error::Failed`] first. [`WebSocket::close_code`]
//!   tells how it ended.
//! - Keep calling `recv` (or drop the read half): a full inbox stops the
//!   connection reading, and the peer's close frame, pings included, wait
//!   behind the messages it holds. A task that only sends should drop its
//!   [`ReadHalf`]; then messages are discarded and reading never pauses.
//!   With [`Config::idle_timeout`](crate::Config::idle_timeout) set, a
//!   connection paused this way long enough counts as idle and is closed.
//! - A task that echoes (`recv`, then `send` waiting for room) and a peer
//!   that writes everything before it reads can wait for each other once
//!   both bounded queues are full: read and write in separate tasks
//!   ([`WebSocket::split`]) when the peer may do that.
//! - Dropping the socket (both halves, once split) closes the connection
//!   with 1000, after what is queued; with 1011 if the task is panicking.
//!   A close we start (here, by the server's shutdown or its idle timeout)
//!   completes even while the inbox is full: reading resumes for it.
//!
//! | file | what |
//! |---|---|
//! | `handler.rs` | [`SocketHandler`]: the `Handler` that spawns the function |
//! | `inbox.rs` | the delivered messages waiting for the socket, bounded in bytes |

mod handler;
pub(crate) mod inbox;

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;

use crate::connection::conn::{Conn, SendError};
use crate::proto::{CloseCode, MessageKind, OwnedMessage};

pub use handler::{DEFAULT_INBOX_LIMIT, SocketHandler, SocketState};
use inbox::{Ending, Inbox, Taken};

/// Spawns `task` beside the socket: on the server loop's thread when
/// called there (from a function [`SocketHandler::on_server_loop`] runs on
/// an io_uring reactor, or a task spawned from one), polled inside the
/// current runtime's context; anywhere else, on the current tokio runtime,
/// as `tokio::spawn`. A task that works with what the function works with
/// (a stream of a mux over the socket, a channel to it) then stays on the
/// function's thread.
///
/// # Panics
///
/// Off a server loop's thread and outside a tokio runtime, as
/// `tokio::spawn`.
pub fn spawn<F>(task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    crate::driver::local::spawn_beside(task);
}

/// Why a socket's stream or sink failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The connection ended with a failure code: `code` and `reason` are
    /// what `Handler::on_close` reports (1002, 1007, 1009 or 1011 sent by
    /// the server or by the peer, or 1006 when TCP ended without a close
    /// handshake).
    Failed {
        /// The close code.
        code: CloseCode,
        /// The close reason.
        reason: String,
    },
    /// A send was refused.
    Send(SendError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Failed { code, reason } if reason.is_empty() => {
                write!(f, "connection failed ({})", code.0)
            }
            Error::Failed { code, reason } => {
                write!(f, "connection failed ({}: {reason})", code.0)
            }
            Error::Send(error) => write!(f, "send refused: {error}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<SendError> for Error {
    fn from(error: SendError) -> Self {
        Error::Send(error)
    }
}

/// What both halves share; the last one dropped closes the connection.
struct Shared {
    conn: Conn,
    inbox: Arc<Inbox>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let code = if std::thread::panicking() {
            CloseCode::INTERNAL_ERROR
        } else {
            CloseCode::NORMAL
        };
        // Already closing or closed: nothing to do.
        let _ = self.conn.close(code, "");
    }
}

/// An open WebSocket connection, as an async value: see the module docs.
pub struct WebSocket {
    // Dropped in this order: the read half abandons the inbox (lifting a
    // pause) before the last `Shared` closes the connection.
    read: ReadHalf,
    write: WriteHalf,
}

impl std::fmt::Debug for WebSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSocket")
            .field("conn", self.conn())
            .finish_non_exhaustive()
    }
}

impl WebSocket {
    pub(crate) fn new(conn: Conn, inbox: Arc<Inbox>) -> Self {
        let shared = Arc::new(Shared { conn, inbox });
        WebSocket {
            read: ReadHalf {
                shared: shared.clone(),
                failure_told: false,
            },
            write: WriteHalf { shared },
        }
    }

    /// The next message; `None` once the connection is over (see the module
    /// docs for when an `Err` comes first). Cancel-safe.
    pub async fn recv(&mut self) -> Option<Result<OwnedMessage, Error>> {
        self.read.recv().await
    }

    /// Sends a message once the connection's queue has room (see
    /// [`Conn::send_when_ready`]). Text goes out as text, binary as binary;
    /// a binary payload is not copied. Cancel-safe in that a future dropped
    /// before it finishes sent nothing (the message it held is dropped with
    /// it).
    pub async fn send(&mut self, message: impl Into<OwnedMessage>) -> Result<(), Error> {
        self.write.send(message).await
    }

    /// Starts the close handshake (see [`Conn::close`]); keep calling
    /// [`recv`](WebSocket::recv) until `None` to see it finish.
    pub fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        self.write.close(code, reason)
    }

    /// How the connection ended, once `recv` has returned everything:
    /// the close code the peer sent (1005 if none), or the one the server
    /// failed it with.
    pub fn close_code(&self) -> Option<CloseCode> {
        self.read.close_code()
    }

    /// The close reason that came with [`close_code`](WebSocket::close_code)
    /// (empty if the peer gave none), once `recv` has returned everything.
    pub fn close_reason(&self) -> Option<String> {
        self.read.close_reason()
    }

    /// The connection's handle: clone it to send from other tasks, or to
    /// use the callback API's calls (`reply`, `send_shared`, `ping`).
    pub fn conn(&self) -> &Conn {
        &self.write.shared.conn
    }

    /// Owned halves, for a reader task and a writer task. The connection
    /// closes when both are dropped; dropping only the read half discards
    /// the messages it held and those that arrive from then on.
    pub fn split(self) -> (ReadHalf, WriteHalf) {
        (self.read, self.write)
    }
}

/// The receiving half of a [`WebSocket`].
pub struct ReadHalf {
    shared: Arc<Shared>,
    /// The failure was yielded once; the stream has ended since.
    failure_told: bool,
}

impl std::fmt::Debug for ReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHalf")
            .field("conn", &self.shared.conn)
            .finish_non_exhaustive()
    }
}

impl ReadHalf {
    /// See [`WebSocket::recv`].
    pub async fn recv(&mut self) -> Option<Result<OwnedMessage, Error>> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// [`ReadHalf::recv`] as a poll function.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<OwnedMessage, Error>>> {
        let shared = &*self.shared;
        match shared.inbox.poll_take(cx, &shared.conn) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Taken::Message(message)) => Poll::Ready(Some(Ok(message))),
            Poll::Ready(Taken::Ended(Ending { code, reason })) => {
                // Every message before the end was taken (and answered): the
                // close that waited for us goes out now.
                answer_close(&shared.conn, code, &reason);
                if is_failure(code) && !std::mem::replace(&mut self.failure_told, true) {
                    Poll::Ready(Some(Err(Error::Failed { code, reason })))
                } else {
                    Poll::Ready(None)
                }
            }
        }
    }

    /// See [`WebSocket::close_code`].
    pub fn close_code(&self) -> Option<CloseCode> {
        self.shared.inbox.ending().map(|ending| ending.code)
    }

    /// See [`WebSocket::close_reason`].
    pub fn close_reason(&self) -> Option<String> {
        self.shared.inbox.ending().map(|ending| ending.reason)
    }

    /// The connection's handle.
    pub fn conn(&self) -> &Conn {
        &self.shared.conn
    }
}

impl Drop for ReadHalf {
    fn drop(&mut self) {
        // Nobody reads any more: what comes is dropped, and a pause the
        // inbox set must not stop the close handshake.
        self.shared.inbox.abandon(&self.shared.conn);
        // Nor a close that waited for the messages to be taken.
        if let Some(Ending { code, reason }) = self.shared.inbox.ending() {
            answer_close(&self.shared.conn, code, &reason);
        }
    }
}

/// The sending half of a [`WebSocket`].
pub struct WriteHalf {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteHalf")
            .field("conn", &self.shared.conn)
            .finish_non_exhaustive()
    }
}

impl WriteHalf {
    /// See [`WebSocket::send`].
    pub async fn send(&mut self, message: impl Into<OwnedMessage>) -> Result<(), Error> {
        let (kind, payload) = into_parts(message.into());
        Ok(self.shared.conn.send_when_ready(kind, payload).await?)
    }

    /// See [`WebSocket::close`].
    pub fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        Ok(self.shared.conn.close(code, reason)?)
    }

    /// The connection's handle.
    pub fn conn(&self) -> &Conn {
        &self.shared.conn
    }
}

/// Lets the close that waited for the application go out
/// (`Handler::has_unhandled_messages`): a failure's with its own code and
/// reason, or the reply to the peer's close (which echoes the peer's code,
/// whatever is asked here). A no-op if nothing waited.
fn answer_close(conn: &Conn, code: CloseCode, reason: &str) {
    let _ = if is_failure(code) {
        conn.close(code, reason)
    } else {
        conn.close(CloseCode::NORMAL, "")
    };
}

/// The codes `on_close` reports for a connection that failed.
fn is_failure(code: CloseCode) -> bool {
    [
        CloseCode::PROTOCOL_ERROR,
        CloseCode::ABNORMAL,
        CloseCode::INVALID_PAYLOAD,
        CloseCode::MESSAGE_TOO_BIG,
        CloseCode::INTERNAL_ERROR,
    ]
    .contains(&code)
}

fn into_parts(message: OwnedMessage) -> (MessageKind, Bytes) {
    match message {
        OwnedMessage::Text(text) => (MessageKind::Text, Bytes::from(text.into_bytes())),
        OwnedMessage::Binary(data) => (MessageKind::Binary, data),
    }
}

impl Stream for ReadHalf {
    type Item = Result<OwnedMessage, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx)
    }
}

impl Sink<OwnedMessage> for WriteHalf {
    type Error = Error;

    /// Waits for room in the connection's queue; does not flush.
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.shared.conn.poll_ready(cx).map_err(Error::Send)
    }

    /// Queues the message. After `poll_ready`, refused only if other tasks
    /// filled the whole queue meanwhile (`SendError::QueueFull`).
    fn start_send(self: Pin<&mut Self>, message: OwnedMessage) -> Result<(), Error> {
        let (kind, payload) = into_parts(message);
        Ok(self.shared.conn.send_after_ready(kind, payload)?)
    }

    /// Ready at once: the driver writes what is queued without being asked.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    /// Starts the close handshake with 1000 (after what is queued), if no
    /// close was started yet.
    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        match self.shared.conn.close(CloseCode::NORMAL, "") {
            Ok(()) | Err(SendError::Closed) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(Error::Send(error))),
        }
    }
}

impl Stream for WebSocket {
    type Item = Result<OwnedMessage, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().read.poll_recv(cx)
    }
}

impl Sink<OwnedMessage> for WebSocket {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Pin::new(&mut self.get_mut().write).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, message: OwnedMessage) -> Result<(), Error> {
        Pin::new(&mut self.get_mut().write).start_send(message)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Pin::new(&mut self.get_mut().write).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Pin::new(&mut self.get_mut().write).poll_close(cx)
    }
}
