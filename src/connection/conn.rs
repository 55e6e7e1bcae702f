//! `Conn`: the handle to one connection, usable from any task or thread.
//!
//! Sends are encoded straight into the connection's outbound queue, in its
//! outbox (`outbox.rs`), under a mutex that only this connection's senders
//! and the driver serving it touch, so it is uncontended in the common case. The first send after a flush
//! wakes the connection (through the `ConnWake` its driver gave it when it
//! opened); further sends before that flush ride along without another wake.
//! Inside a callback no wake is needed at all: the driver writes everything
//! the callbacks queued once they return, in one write.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::connection::config::SlowConsumer;
use crate::connection::outbox::{ConnShared, Outbox, wake_all};
use crate::proto::MAX_CLOSE_REASON;
use crate::proto::frame::{MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN};
use crate::proto::{CloseCode, Message, MessageKind, OpCode, validate_utf8};

/// Why a send or close was refused. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The connection is closing or closed.
    Closed,
    /// The outbound queue holds `max_outbound_bytes` or more (for a reply:
    /// the replies waiting do); the handler's `on_drain` is called once it
    /// has been written out. [`Conn::ready`] waits for room instead.
    QueueFull,
    /// A text payload given as `Bytes` was not valid UTF-8.
    InvalidUtf8,
    /// A ping payload over 125 bytes or a close reason over 123 bytes.
    PayloadTooLong,
    /// A close code that may not be sent (see `CloseCode::is_sendable`).
    InvalidCloseCode,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Closed => "connection is closing or closed",
            SendError::QueueFull => "outbound queue is full",
            SendError::InvalidUtf8 => "text payload is not valid UTF-8",
            SendError::PayloadTooLong => "control payload too long",
            SendError::InvalidCloseCode => "close code may not be sent",
        })
    }
}

impl std::error::Error for SendError {}

/// A handle to one connection: cheap to clone, `Send + Sync`.
///
/// Sending never blocks. Frames are queued in order and written by the driver
/// serving the connection; a send from another task or thread wakes it.
///
/// **When the queue is full.** The queue is bounded by `max_outbound_bytes`
/// (`Config`, default 4 MiB): while that many bytes or more wait to be written, a
/// send returns [`SendError::QueueFull`] and queues nothing. A send is accepted
/// whenever the queue is below the bound, so it never exceeds the bound by more
/// than one message. Then the [`SlowConsumer`] policy applies: by default the
/// handler's `on_drain` is called once the queue has been written out; with
/// `SlowConsumer::Close` the connection is closed instead.
///
/// **Waiting for room.** A task that produces messages (a push loop) awaits
/// [`Conn::ready`], or sends with [`Conn::send_when_ready`]: they wait while
/// the queue holds half the bound or more, and resume once it is written down
/// to a quarter, woken by the driver as the peer reads. The producer goes
/// at the reader's pace instead of spinning on `QueueFull`, and the other
/// half of the queue stays free for what reading brings, so a busy
/// producer never stops the connection from reading (and answering) its
/// requests.
///
/// **Replies.** [`Conn::reply`] puts a message ahead of every queued message
/// that has not started on the wire, so the answer to a request does not wait
/// behind megabytes of pushes. Replies have a bound of their own (the same
/// `max_outbound_bytes`, counting replies only), so bulk sends that fill the
/// queue do not turn them away.
///
/// **Reading.** The connection keeps reading from its peer while its writes
/// are blocked, as long as the queue is below the bound: requests are
/// answered while pushes drain. Once the queue reaches the bound it stops
/// handing messages to the handler (and stops reading), and goes on once the
/// queue is written down to half the bound. So a peer that sends but does not
/// read is slowed down by TCP itself rather than buffered for, and an echo
/// never finds the queue full.
#[derive(Clone)]
pub struct Conn {
    shared: Arc<ConnShared>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.shared.id())
            .field("peer", &self.shared.peer())
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// A number unique among this server's connections.
    pub fn id(&self) -> u64 {
        self.shared.id()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.peer()
    }

    /// Sends a message of the same kind, copying its payload (for example, to
    /// echo the message `on_message` received). With permessage-deflate
    /// negotiated, it is compressed unless shorter than the configured minimum.
    pub fn send(&self, message: Message<'_>) -> Result<(), SendError> {
        let opcode = data_opcode(message.kind());
        let payload = message.as_bytes();
        self.enqueue(payload.len(), |outbox| {
            outbox.push_message(opcode, payload);
        })
    }

    /// Sends a text message, copying it.
    pub fn send_text(&self, text: &str) -> Result<(), SendError> {
        self.send(Message::Text(text))
    }

    /// Sends a binary message, copying it.
    pub fn send_binary(&self, data: &[u8]) -> Result<(), SendError> {
        self.send(Message::Binary(data))
    }

    /// Sends a message ahead of every queued message that has not started on
    /// the wire: the reply to a request, on a connection that also carries
    /// bulk pushes. It waits only for the message being written (and, at
    /// most, 16 KiB of small messages behind it), never lands inside a
    /// message, and replies keep their order among themselves. It is
    /// refused when the replies waiting reach `max_outbound_bytes`.
    ///
    /// With permessage-deflate, a reply is compressed only when this side
    /// compresses each message on its own (`server_no_context_takeover`
    /// was agreed). With context takeover each compressed message depends
    /// on the ones compressed before it, so the peer must receive them in
    /// that order: a reply that overtakes them is sent uncompressed, which
    /// leaves the compressor's order and the wire's the same.
    pub fn reply(&self, message: Message<'_>) -> Result<(), SendError> {
        let opcode = data_opcode(message.kind());
        let payload = message.as_bytes();
        self.enqueue_as(Sender::Reply, Some(payload.len()), |outbox| {
            outbox.push_reply_message(opcode, payload);
        })
    }

    /// Waits until there is room for a producer: the queue holds less than
    /// half of `max_outbound_bytes`; if it holds more, until it is written down
    /// to a quarter. (The other half is kept for replies and what the
    /// handler sends while reading, see the type's docs.) Fails with
    /// [`SendError::Closed`] once the connection takes no more sends.
    /// Cancel-safe: dropping the future loses nothing. Another task may
    /// fill the queue between this and a send; a send is still accepted
    /// below the whole bound.
    pub fn ready(&self) -> Ready<'_> {
        Ready { conn: self }
    }

    /// [`Conn::ready`] as a poll function (for `Sink::poll_ready` and hand-
    /// written futures): registers `cx`'s waker while the queue is full.
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        let shared = &*self.shared;
        let mut outbox = shared.lock();
        if !outbox.is_open() {
            return Poll::Ready(Err(SendError::Closed));
        }
        if outbox.queued() < shared.outbound().producer_limit() {
            return Poll::Ready(Ok(()));
        }
        outbox.wait_for_room(cx.waker());
        Poll::Pending
    }

    /// Sends a shared payload (see [`Conn::send_shared`]) once there is room:
    /// [`Conn::ready`], then the send, again if another task filled the queue
    /// in between. A full queue here never sets off the slow-consumer
    /// policy. Cancel-safe: if the future is dropped before it finishes,
    /// nothing was sent.
    pub async fn send_when_ready(
        &self,
        kind: MessageKind,
        payload: Bytes,
    ) -> Result<(), SendError> {
        shared_opcode(kind, &payload)?;
        loop {
            self.ready().await?;
            match self.send_after_ready(kind, payload.clone()) {
                Err(SendError::QueueFull) => continue,
                other => return other,
            }
        }
    }

    /// The send that follows [`Conn::ready`] (`send_when_ready`,
    /// `Sink::start_send`): refused with `QueueFull` only if other tasks
    /// filled the whole bound since, and never setting off the slow-consumer
    /// policy.
    pub(crate) fn send_after_ready(
        &self,
        kind: MessageKind,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let opcode = shared_opcode(kind, &payload)?;
        self.enqueue_as(Sender::Waiting, Some(0), |outbox| {
            outbox.push_shared(opcode, payload);
        })
    }

    /// Stops reading from the peer after the message being delivered, until
    /// [`Conn::resume_reading`]: for a consumer that cannot keep up (a
    /// gateway whose other side is slow; the async socket's full inbox).
    /// Frames already read stay in the read buffer, and TCP's flow control
    /// slows the peer down. Pings are not answered meanwhile. Ignored once a
    /// close frame was sent or received, so the close handshake always
    /// completes. A connection served as an async `WebSocket` (`socket`)
    /// pauses and resumes itself as its inbox fills and empties: do not call
    /// these on it.
    pub fn pause_reading(&self) {
        self.shared.pause_reading();
    }

    /// Reading goes on after [`Conn::pause_reading`]; the connection's driver
    /// is woken for it.
    pub fn resume_reading(&self) {
        if self.shared.resume_reading() {
            self.shared.call_attention();
        }
    }

    /// Sends a message whose payload is shared, without copying it: the same
    /// `Bytes` can be broadcast to many connections. Text is checked for UTF-8.
    /// With permessage-deflate negotiated, a payload worth compressing is
    /// compressed for this connection instead (each connection's compressor
    /// has its own state), so nothing is shared then.
    pub fn send_shared(&self, kind: MessageKind, payload: Bytes) -> Result<(), SendError> {
        let opcode = shared_opcode(kind, &payload)?;
        self.enqueue(0, |outbox| outbox.push_shared(opcode, payload))
    }

    /// Sends a ping (payload at most 125 bytes). The peer's pong is answered by
    /// the protocol; nothing is reported for it.
    pub fn ping(&self, payload: &[u8]) -> Result<(), SendError> {
        if payload.len() > MAX_CONTROL_PAYLOAD {
            return Err(SendError::PayloadTooLong);
        }
        self.enqueue_as(Sender::Ping, Some(payload.len()), |outbox| {
            outbox.push_ping(payload)
        })
    }

    /// Starts the close handshake: frames queued so far are sent, then a close
    /// frame with `code` and `reason` (at most 123 bytes). Later sends fail with
    /// [`SendError::Closed`]. The server waits (bounded by `close_timeout`) for the
    /// peer's close, then ends TCP; `on_close` reports the outcome.
    pub fn close(&self, code: CloseCode, reason: &str) -> Result<(), SendError> {
        if !code.is_sendable() {
            return Err(SendError::InvalidCloseCode);
        }
        if reason.len() > MAX_CLOSE_REASON {
            return Err(SendError::PayloadTooLong);
        }
        let waiting = {
            let mut outbox = self.shared.lock();
            if !outbox.is_open() {
                return Err(SendError::Closed);
            }
            outbox.request_close(code, reason);
            outbox.take_waiting()
        };
        wake_all(waiting);
        self.shared.call_attention();
        Ok(())
    }

    /// The keepalive sweep's ping: skipped when the queue is full (the peer
    /// has plenty to read, and the slow-consumer policy is for the
    /// handler's sends, not ours).
    pub(crate) fn keepalive_ping(&self) {
        let _ = self.enqueue_as(Sender::Keepalive, Some(0), |outbox| outbox.push_ping(b""));
    }

    /// Bytes queued and not yet written to the socket.
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().queued()
    }

    /// False once a close was sent, or received and answered, or the
    /// connection ended. (A reply that waits for the handler, see
    /// [`Handler::has_unhandled_messages`](crate::Handler::has_unhandled_messages),
    /// leaves it open: sends are accepted until the reply goes.)
    pub fn is_open(&self) -> bool {
        self.shared.lock().is_open()
    }

    /// Runs `write` on the queue if the connection is open and the queue below its
    /// bound, then wakes the connection if it is not already due to flush.
    fn enqueue(
        &self,
        payload_len: usize,
        write: impl FnOnce(&mut Outbox),
    ) -> Result<(), SendError> {
        self.enqueue_as(Sender::Application, Some(payload_len), write)
    }

    /// [`Conn::enqueue`] for `sender`: replies count against the replies
    /// waiting, everything else against the whole queue; only the
    /// application's sends and replies set off the slow-consumer policy
    /// when it is full.
    ///
    /// Always inlined: a fan-out calls it once per subscriber
    /// (`send_prepared`), and a call there costs a tenth of what queueing
    /// the frame does (measured with callgrind: docs/delivery.md, "One send, inlined").
    #[inline(always)]
    fn enqueue_as(
        &self,
        sender: Sender,
        payload_len: Option<usize>,
        write: impl FnOnce(&mut Outbox),
    ) -> Result<(), SendError> {
        let shared = &*self.shared;
        let outbound = shared.outbound();
        let wake = {
            let mut outbox = shared.lock();
            if !outbox.is_open() {
                return Err(SendError::Closed);
            }
            let held = match sender {
                Sender::Reply => outbox.reply_len(),
                _ => outbox.queued(),
            };
            if held >= outbound.max_bytes && !sender.past_full() {
                let close = match (sender, outbound.on_full) {
                    (Sender::Keepalive | Sender::Waiting, _) => None,
                    (Sender::Published { close_on_full }, _) => close_on_full,
                    (Sender::Signal, _) => None,
                    (_, SlowConsumer::Pause) => {
                        outbox.want_drain();
                        None
                    }
                    (_, SlowConsumer::Close(code)) => Some(code),
                };
                if !matches!(sender, Sender::Keepalive | Sender::Waiting) {
                    outbound.meters.queue_full();
                }
                if let Some(code) = close {
                    self.close_full(code, outbox);
                }
                return Err(SendError::QueueFull);
            }
            // A pooled buffer for what the send copies into the queue
            // (`None`: it copies nothing, and an idle queue stays without
            // one).
            if let Some(payload_len) = payload_len {
                outbox.provide_buffer(&outbound.pool, payload_len + MAX_HEADER_LEN);
            }
            write(&mut outbox);
            if !matches!(sender, Sender::Keepalive | Sender::Ping) {
                outbox.count_message();
            }
            outbox.schedule_flush()
        };
        if wake {
            shared.wake().wake();
        }
        Ok(())
    }

    /// Closes the connection whose queue is full, as its policy asks.
    /// Out of line, so that every other send's path stays small enough to
    /// be inlined where it is called (a fan-out's loop).
    #[cold]
    fn close_full(&self, code: CloseCode, mut outbox: MutexGuard<'_, Outbox>) {
        outbox.request_close(code, "outbound queue full: peer reads too slowly");
        let waiting = outbox.take_waiting();
        drop(outbox);
        wake_all(waiting);
        self.shared.call_attention();
    }

    /// Lets go of every membership: the connection ended. Called by the
    /// connection's end (after sends were closed, so nothing joins again).
    pub(crate) fn leave_all(&self) {
        #[cfg(feature = "pubsub")]
        self.leave_memberships();
    }

    pub(crate) fn from_shared(shared: Arc<ConnShared>) -> Conn {
        Conn { shared }
    }

    pub(crate) fn shared(&self) -> &ConnShared {
        &self.shared
    }
}

/// The opcode a data message of `kind` is sent with.
fn data_opcode(kind: MessageKind) -> OpCode {
    match kind {
        MessageKind::Text => OpCode::Text,
        MessageKind::Binary => OpCode::Binary,
    }
}

/// The opcode for a shared payload of `kind`, once text is checked for UTF-8.
fn shared_opcode(kind: MessageKind, payload: &[u8]) -> Result<OpCode, SendError> {
    if kind == MessageKind::Text {
        validate_utf8(payload).map_err(|_| SendError::InvalidUtf8)?;
    }
    Ok(data_opcode(kind))
}

/// Who queues a frame through [`Conn::enqueue_as`]. Pub/sub's senders
/// (`fanout.rs`) exist only with feature `pubsub`.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
enum Sender {
    /// The handler, or any task holding a `Conn`.
    Application,
    /// [`Conn::reply`]: bounded by the replies waiting.
    Reply,
    /// [`Conn::send_when_ready`]: a full queue means "wait again".
    Waiting,
    /// The keepalive sweep's ping.
    Keepalive,
    /// [`Conn::ping`]: the application's, under its rules, but no data
    /// message (not counted as one).
    Ping,
    /// A pub/sub delivery: a full queue drops it, or closes with the code.
    Published { close_on_full: Option<CloseCode> },
    /// A pub/sub signal (`Conn::send_signal`): queued past a full queue.
    Signal,
}

impl Sender {
    /// Whether it is queued even when the queue is full.
    fn past_full(self) -> bool {
        matches!(self, Sender::Signal)
    }
}

/// The future of [`Conn::ready`].
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct Ready<'a> {
    conn: &'a Conn,
}

impl Future for Ready<'_> {
    type Output = Result<(), SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.conn.poll_ready(cx)
    }
}

#[cfg(feature = "pubsub")]
mod fanout;
#[cfg(test)]
mod tests;
