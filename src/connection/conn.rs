//! `Conn`: the handle to one connection, usable from any task or thread.
//!
//! Sends are encoded straight into the connection's outbound queue, in its
//! outbox (`outbox.rs`), under a mutex that only this connection's senders
//! and the driver serving it touch, so it is uncontended in the common case. The first send after a flush
//! wakes the connection (through the `ConnWake` its driver gave it when it
//! opened); further sends before that flush ride along without another wake.
//! Inside a callback no wake is needed at all: the backend writes everything
//! the callbacks queued once they return, in one write.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::connection::config::SlowConsumer;
#[cfg(feature = "pubsub")]
use crate::connection::membership::Membership;
use crate::connection::outbox::{ConnShared, Outbox, wake_all};
use crate::proto::MAX_CLOSE_REASON;
#[cfg(feature = "pubsub")]
use crate::proto::Prepared;
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
/// Sending never blocks. Frames are queued in order and written by the backend
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
/// the queue holds half the bound or more, and resume once it has drained
/// to a quarter, woken by the backend as the peer reads. The producer goes
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
/// queue has drained to half the bound. So a peer that sends but does not
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

    /// Tells connections apart across servers (ids are unique only within
    /// one): the address of the shared state, fixed while a handle lives.
    #[cfg(feature = "pubsub")]
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
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
    /// half of `max_outbound_bytes`; if it holds more, until it has drained
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

    /// Queues a message framed once for many connections (pub/sub): the
    /// shared compressed frame if this connection's compressor can take
    /// one, else the shared plain frame; a client's connection frames it
    /// itself (its frames are masked). When the queue is full the message
    /// is not queued: with `close_on_full` the connection is also asked to
    /// close with that code. `Config::slow_consumer` plays no part.
    #[cfg(feature = "pubsub")]
    #[inline]
    pub(crate) fn send_prepared(
        &self,
        message: &Prepared,
        close_on_full: Option<CloseCode>,
    ) -> Result<(), SendError> {
        let sender = Sender::Published { close_on_full };
        // The frame is queued by reference, or copied into a buffer the
        // queue holds already: a subscriber with nothing queued takes no
        // buffer for it (10,000 subscribers would hold 40 MiB of them).
        self.enqueue_as(sender, None, |outbox| outbox.push_prepared(message))
    }

    /// Whether the queue has room now (below the producers' limit); if
    /// not, `waker` is woken once it has (or the connection takes no more
    /// sends). A conflating subscriber's flush waits this way.
    #[cfg(feature = "pubsub")]
    pub(crate) fn when_room(&self, waker: &std::task::Waker) -> bool {
        let shared = &*self.shared;
        let mut outbox = shared.lock();
        if !outbox.is_open() || outbox.queued() < shared.outbound().producer_limit() {
            return true;
        }
        outbox.wait_for_room(waker);
        false
    }

    /// Queues a pub/sub signal (a subscriber told whether it was kept
    /// whole), even past a full queue: it is small, and at most one is
    /// sent per message delivered or per subscribe, so the queue's bound
    /// still holds within a frame each.
    #[cfg(feature = "pubsub")]
    pub(crate) fn send_signal(&self, message: &Prepared) -> Result<(), SendError> {
        self.enqueue_as(Sender::Signal, None, |outbox| outbox.push_prepared(message))
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
                    #[cfg(feature = "pubsub")]
                    (Sender::Published { close_on_full }, _) => close_on_full,
                    #[cfg(feature = "pubsub")]
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

    /// Records that this connection joined `name` in `membership` (a
    /// pub/sub topic); false if it had already. Refused once the
    /// connection is closing: nothing would reach it.
    #[cfg(feature = "pubsub")]
    pub(crate) fn join(
        &self,
        membership: &Arc<dyn Membership>,
        name: &Arc<str>,
    ) -> Result<bool, SendError> {
        self.shared
            .memberships()
            .join(membership, name, || self.shared.lock().is_open())
            .ok_or(SendError::Closed)
    }

    /// Records that this connection left `name` in `membership`; false if
    /// it was not there.
    #[cfg(feature = "pubsub")]
    pub(crate) fn part(&self, membership: &Arc<dyn Membership>, name: &str) -> bool {
        self.shared.memberships().part(membership, name)
    }

    /// The names this connection joined in `membership`.
    #[cfg(feature = "pubsub")]
    pub(crate) fn joined(&self, membership: &Arc<dyn Membership>) -> Vec<Arc<str>> {
        self.shared.memberships().joined(membership)
    }

    /// Lets go of every membership: the connection ended. Called by the
    /// connection's end (after sends were closed, so nothing joins again).
    pub(crate) fn leave_all(&self) {
        #[cfg(feature = "pubsub")]
        for (membership, names) in self.shared.memberships().leave_all() {
            membership.leave(self.key(), self.shared.wake(), names);
        }
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

/// Who queues a frame through [`Conn::enqueue_as`].
#[derive(Clone, Copy)]
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
    #[cfg(feature = "pubsub")]
    Published { close_on_full: Option<CloseCode> },
    /// A pub/sub signal ([`Conn::send_signal`]): queued past a full queue.
    #[cfg(feature = "pubsub")]
    Signal,
}

impl Sender {
    /// Whether it is queued even when the queue is full.
    fn past_full(self) -> bool {
        #[cfg(feature = "pubsub")]
        if let Sender::Signal = self {
            return true;
        }
        false
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;
    use crate::connection::outbox::{Outbound, Phase, Waiters};
    use crate::connection::wake::ConnWake;
    #[cfg(feature = "deflate")]
    use crate::proto::deflate::Compressor;
    use crate::proto::frame::RSV1;

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn conn(max_outbound: usize) -> (Conn, Arc<CountWakes>) {
        conn_with(max_outbound, SlowConsumer::Pause)
    }

    fn conn_with(max_outbound: usize, on_full: SlowConsumer) -> (Conn, Arc<CountWakes>) {
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let outbound = Outbound {
            pool: Arc::default(),
            max_bytes: max_outbound,
            meters: crate::connection::meters::Meters::new("test"),
            on_full,
        };
        let shared = ConnShared::new(
            7,
            "127.0.0.1:1".parse().unwrap(),
            Arc::new(outbound),
            ConnWake::Waker(Waker::from(wakes.clone())),
            crate::proto::Role::Server,
        );
        (Conn::from_shared(shared), wakes)
    }

    #[test]
    fn resuming_reading_wakes_the_driver_only_after_a_pause() {
        let (conn, wakes) = conn(1 << 20);
        let woken = || wakes.0.load(Ordering::SeqCst);
        conn.resume_reading();
        assert_eq!(woken(), 0, "nothing was paused");
        conn.pause_reading();
        assert!(conn.shared().is_reading_paused());
        assert_eq!(woken(), 0, "the driver finds the pause at the next frame");
        conn.resume_reading();
        assert!(!conn.shared().is_reading_paused());
        assert_eq!(woken(), 1);
        assert!(conn.shared().take_attention(), "the driver looks again");
        conn.resume_reading();
        assert_eq!(woken(), 1, "once per pause");
    }

    #[test]
    fn sends_queue_frames_in_order_and_wake_once_per_flush() {
        let (conn, wakes) = conn(1 << 20);
        conn.send_text("a").unwrap();
        conn.send_binary(b"b").unwrap();
        conn.send_shared(MessageKind::Binary, Bytes::from(vec![9u8; 2000]))
            .unwrap();
        conn.ping(b"p").unwrap();
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "one wake until the queue is flushed"
        );
        assert_eq!(conn.queued_bytes(), 3 + 3 + 4 + 2000 + 3);
        let mut outbox = conn.shared().lock();
        outbox.unschedule_flush();
        drop(outbox);
        conn.send_text("c").unwrap();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
    }

    /// A send io_uring cut short for a handoff: its rest goes back ahead
    /// of what was queued since (a shared segment, which a reply could
    /// overtake), a reply queued later comes after all of it, and nothing
    /// counts as being sent any more.
    #[cfg(all(target_os = "linux", feature = "handoff", feature = "uring"))]
    #[test]
    fn a_send_cut_short_goes_back_ahead_of_everything_queued_since() {
        let (conn, _) = conn(1 << 20);
        conn.send_binary(&[1u8; 100]).unwrap();
        let mut taken = crate::proto::WriteQueue::new();
        conn.shared().lock().take_for_send(&mut taken);
        assert_eq!(taken.len(), 102);
        // Shared bytes: the queue keeps them as a segment of their own, where
        // a reply could overtake them.
        conn.send_shared(MessageKind::Binary, Bytes::from(vec![2u8; 2000]))
            .unwrap();
        // 30 bytes went out before the send was cancelled.
        taken.advance(30);
        let mut outbox = conn.shared().lock();
        outbox.no_longer_sending(30);
        assert!(!outbox.may_hand_off(), "72 bytes are still being sent");
        outbox.put_back(&mut taken, &crate::pool::BufferPool::default());
        assert!(taken.is_empty());
        assert!(outbox.may_hand_off(), "nothing is being sent any more");
        outbox.push_reply_message(OpCode::Pong, b"r");
        let mut out = crate::proto::WriteQueue::new();
        outbox.take_for_send(&mut out);
        let mut bytes = Vec::new();
        out.move_into(&mut bytes);
        let mut expected = vec![0x82, 100];
        expected.extend([1u8; 100]);
        expected.drain(..30);
        expected.extend([0x82, 126, 0x07, 0xD0]);
        expected.extend([2u8; 2000]);
        expected.extend([0x8A, 1, b'r']);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_full_queue_refuses_sends_and_asks_for_drain() {
        let (conn, _) = conn(10);
        conn.send_binary(&[0u8; 50]).unwrap();
        assert_eq!(conn.send_binary(b"x"), Err(SendError::QueueFull));
        assert!(conn.shared().lock().wants_drain());
        assert_eq!(conn.queued_bytes(), 52);
    }

    #[test]
    fn a_full_queue_closes_the_connection_under_the_close_policy() {
        let (conn, wakes) = conn_with(10, SlowConsumer::Close(CloseCode::TRY_AGAIN_LATER));
        conn.send_binary(&[0u8; 50]).unwrap();
        let before = wakes.0.load(Ordering::SeqCst);
        assert_eq!(conn.send_binary(b"x"), Err(SendError::QueueFull));
        assert!(
            wakes.0.load(Ordering::SeqCst) > before,
            "the backend is woken"
        );
        assert!(conn.shared().take_attention());
        let outbox = conn.shared().lock();
        assert!(!outbox.wants_drain());
        assert_eq!(outbox.phase(), Phase::Closing);
        let (code, _) = outbox.close_request().unwrap();
        assert_eq!(*code, CloseCode::TRY_AGAIN_LATER);
        drop(outbox);
        assert_eq!(conn.send_binary(b"x"), Err(SendError::Closed));
    }

    #[test]
    fn a_keepalive_ping_on_a_full_queue_is_skipped_without_the_policy() {
        for on_full in [
            SlowConsumer::Pause,
            SlowConsumer::Close(CloseCode::TRY_AGAIN_LATER),
        ] {
            let (conn, _) = conn_with(10, on_full);
            conn.send_binary(&[0u8; 50]).unwrap();
            conn.keepalive_ping();
            assert_eq!(conn.queued_bytes(), 52, "no ping queued");
            let outbox = conn.shared().lock();
            assert!(!outbox.wants_drain());
            assert_eq!(outbox.phase(), Phase::Open);
        }
        let (conn, _) = conn(1 << 20);
        conn.keepalive_ping();
        assert_eq!(conn.queued_bytes(), 2, "an empty ping");
    }

    #[test]
    fn close_validates_and_then_refuses_sends() {
        let (conn, _) = conn(1 << 20);
        assert_eq!(
            conn.close(CloseCode(1005), ""),
            Err(SendError::InvalidCloseCode)
        );
        assert_eq!(
            conn.close(CloseCode::NORMAL, &"x".repeat(124)),
            Err(SendError::PayloadTooLong)
        );
        assert!(conn.is_open());
        conn.close(CloseCode::NORMAL, "bye").unwrap();
        assert!(!conn.is_open());
        assert!(conn.shared().take_attention());
        assert_eq!(conn.send_text("late"), Err(SendError::Closed));
        assert_eq!(conn.close(CloseCode::NORMAL, ""), Err(SendError::Closed));
        let request = conn.shared().lock().take_close_request();
        assert_eq!(request, Some((CloseCode::NORMAL, "bye".to_owned())));
    }

    #[test]
    #[cfg(feature = "deflate")]
    fn with_deflate_sends_are_compressed_and_small_ones_and_pings_are_not() {
        use crate::proto::Role;
        use crate::proto::deflate::{DeflateConfig, DeflateParams, Inflater};
        use crate::proto::frame::{DecodeRules, decode_header};

        let (conn, _) = conn(1 << 20);
        let config = DeflateConfig::default();
        let params = DeflateParams::new(true, true);
        conn.shared()
            .lock()
            .set_compressor(Compressor::new(Role::Server, &params, &config));
        let text = "compress me, compress me, compress me, compress me ".repeat(20);
        conn.send_text(&text).unwrap();
        conn.send_shared(MessageKind::Binary, Bytes::from(vec![3u8; 5000]))
            .unwrap();
        conn.send_text("tiny").unwrap();
        conn.ping(b"p").unwrap();

        let mut wire = Vec::new();
        conn.shared().lock().queue().move_into(&mut wire);
        let mut frames = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let rules = DecodeRules {
                allowed_rsv: RSV1,
                ..DecodeRules::CLIENT
            };
            let (header, len) = decode_header(&wire[at..], rules).unwrap().unwrap();
            let payload = &wire[at + len..at + len + header.payload_len as usize];
            frames.push((header.opcode, header.rsv, payload.to_vec()));
            at += len + payload.len();
        }
        let inflate = |packed: &[u8]| {
            let mut inflater = Inflater::new(false);
            let mut out = bytes::BytesMut::new();
            inflater.feed(packed, &mut out, 1 << 20).unwrap();
            inflater.finish(&mut out, 1 << 20).unwrap();
            out.to_vec()
        };
        assert_eq!((frames[0].0, frames[0].1), (OpCode::Text, RSV1));
        assert!(frames[0].2.len() < text.len() / 4);
        assert_eq!(inflate(&frames[0].2), text.as_bytes());
        assert_eq!((frames[1].0, frames[1].1), (OpCode::Binary, RSV1));
        assert_eq!(inflate(&frames[1].2), vec![3u8; 5000]);
        assert_eq!(
            frames[2],
            (OpCode::Text, 0, b"tiny".to_vec()),
            "under 64 bytes"
        );
        assert_eq!(frames[3], (OpCode::Ping, 0, b"p".to_vec()));
    }

    #[test]
    fn replies_have_a_bound_of_their_own_and_go_ahead_of_what_has_not_started() {
        let (conn, _) = conn(100);
        conn.send_shared(MessageKind::Binary, Bytes::from(vec![1u8; 20_000]))
            .unwrap();
        conn.send_shared(MessageKind::Binary, Bytes::from(vec![2u8; 20_000]))
            .unwrap_err();
        conn.reply(Message::Text("r1")).unwrap();
        conn.reply(Message::Binary(&[9u8; 200])).unwrap();
        assert_eq!(
            conn.reply(Message::Text("r3")),
            Err(SendError::QueueFull),
            "replies over the bound"
        );
        let mut wire = Vec::new();
        conn.shared().lock().queue().move_into(&mut wire);
        assert_eq!(&wire[..4], &[0x81, 2, b'r', b'1'], "ahead of the push");
        assert_eq!(wire.len(), 4 + 204 + 20_004);
    }

    #[test]
    #[cfg(feature = "deflate")]
    fn a_reply_is_compressed_only_without_context_takeover() {
        use crate::proto::Role;
        use crate::proto::deflate::{DeflateConfig, DeflateParams};

        let text = "a reply worth compressing, a reply worth compressing ".repeat(4);
        for no_context in [false, true] {
            let (conn, _) = conn(1 << 20);
            let params = DeflateParams::new(no_context, true);
            let compressor = Compressor::new(Role::Server, &params, &DeflateConfig::default());
            conn.shared().lock().set_compressor(compressor);
            // Incompressible, so that it stays long.
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let noise: Vec<u8> = (0..40_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            conn.send_shared(MessageKind::Binary, Bytes::from(noise))
                .unwrap();
            conn.reply(Message::Text(&text)).unwrap();
            let mut wire = Vec::new();
            conn.shared().lock().queue().move_into(&mut wire);
            let compressed = wire[0] & 0x40 != 0;
            assert_eq!(wire[0] & 0x0f, 1, "the reply went first");
            assert_eq!(compressed, no_context, "no_context_takeover: {no_context}");
        }
    }

    /// What the driver does once the peer read everything: the queue is
    /// written out, and the tasks waiting for room are taken (the bound is
    /// 10 in these tests: woken at 5 or less).
    fn write_out(conn: &Conn) -> Option<Waiters> {
        let mut outbox = conn.shared().lock();
        let n = outbox.queue().len();
        outbox.queue().advance(n);
        outbox.take_waiting_if_room(5)
    }

    #[test]
    fn send_when_ready_waits_for_room_and_fails_once_closed() {
        use std::future::Future;
        let (conn, _) = conn(10);
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        conn.send_binary(&[0u8; 50]).unwrap();
        let payload = Bytes::from_static(b"next");
        let mut send = std::pin::pin!(conn.send_when_ready(MessageKind::Binary, payload));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        assert!(
            !conn.shared().lock().wants_drain(),
            "no on_drain for a waiter"
        );
        let waiting = write_out(&conn);
        wake_all(waiting);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert_eq!(send.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(conn.queued_bytes(), 6);

        conn.send_binary(&[0u8; 50]).unwrap();
        let mut send = std::pin::pin!(conn.send_when_ready(MessageKind::Binary, Bytes::new()));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        conn.close(CloseCode::NORMAL, "").unwrap();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2, "the close wakes it");
        assert_eq!(
            send.as_mut().poll(&mut cx),
            Poll::Ready(Err(SendError::Closed))
        );
    }

    #[test]
    fn a_dropped_send_when_ready_sends_nothing_and_leaves_no_harm() {
        use std::future::Future;
        let (conn, _) = conn(10);
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        conn.send_binary(&[0u8; 50]).unwrap();
        {
            let send = conn.send_when_ready(MessageKind::Binary, Bytes::from_static(b"lost"));
            let mut send = std::pin::pin!(send);
            assert!(send.as_mut().poll(&mut cx).is_pending());
            let mut ready = std::pin::pin!(conn.ready());
            assert!(ready.as_mut().poll(&mut cx).is_pending());
        }
        let waiting = write_out(&conn);
        assert_eq!(waiting.as_ref().map(|w| w.len()), Some(1), "one task, once");
        wake_all(waiting);
        assert_eq!(conn.queued_bytes(), 0, "the dropped send queued nothing");
        assert!(!conn.shared().lock().has_waiting());
    }

    #[test]
    fn rejects_invalid_text_and_long_pings() {
        let (conn, _) = conn(1 << 20);
        assert_eq!(
            conn.send_shared(MessageKind::Text, Bytes::from_static(b"\xff")),
            Err(SendError::InvalidUtf8)
        );
        assert_eq!(conn.ping(&[0u8; 126]), Err(SendError::PayloadTooLong));
        assert_eq!(conn.queued_bytes(), 0);
    }
}
