//! The outbox: what a connection's `Conn` handles and the driver serving it
//! share. [`ConnShared`] is that shared state (behind the `Conn`'s `Arc`):
//! the id and peer, how to wake the driver, two flags read without a lock,
//! and the [`Outbox`] under its mutex: the outbound [`WriteQueue`], the
//! phase that turns sends away, the close request, the tasks waiting for
//! room, the compressor. Every field of it is changed in this module,
//! through named methods: the senders' side (`conn.rs`) and the driver's
//! side (the connection's life, `dispatch.rs` and `lifecycle.rs`). What the
//! layers above need of it waits behind a feature in a file of its own:
//! `outbox/fanout.rs` (pub/sub), `outbox/handoff.rs` (the handoff),
//! `outbox/counting.rs` (metrics).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use bytes::Bytes;

use crate::connection::config::SlowConsumer;
#[cfg(feature = "pubsub")]
use crate::connection::membership::Memberships;
use crate::connection::meters::Meters;
use crate::connection::wake::ConnWake;
use crate::pool::BufferPool;
use crate::proto::Written;
use crate::proto::deflate::Compressor;
use crate::proto::frame::RSV1;
use crate::proto::{CloseCode, OpCode, Role, WriteQueue};

mod counting;
#[cfg(feature = "pubsub")]
mod fanout;
#[cfg(all(target_os = "linux", feature = "handoff"))]
mod handoff;

use counting::{Counting, Probe};

/// Tasks waiting in [`Conn::ready`](crate::Conn::ready).
pub(crate) type Waiters = Vec<Waker>;

/// Wakes the tasks that waited for room (after the outbox's lock is let go:
/// a waker may run code of its own).
pub(crate) fn wake_all(waiting: Option<Waiters>) {
    for waker in waiting.into_iter().flatten() {
        waker.wake();
    }
}

/// What few connections ever hold, in one box: an idle connection carries
/// 8 bytes for all of it (three fields of its own cost 16 more, and took
/// the connection's shared state into glibc's next 16-byte chunk size).
/// Freed again once it is empty.
#[derive(Default)]
struct Rare {
    /// A close asked for by `Conn::close`, for the driver to hand to the
    /// session.
    close_request: Option<(CloseCode, String)>,
    /// Tasks waiting in [`Conn::ready`](crate::Conn::ready).
    waiting: Waiters,
    /// A sampled pub/sub delivery waiting to be written (feature
    /// `metrics`; see `counting.rs`).
    probe: Option<Probe>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.close_request.is_none() && self.waiting.is_empty() && self.probe.is_none()
    }
}

/// The senders' side of the outbox: what `Conn` does with it.
impl Outbox {
    /// Sends are accepted (no close requested, sent or received).
    pub(crate) fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Bytes of replies waiting: what a reply's bound applies to.
    pub(crate) fn reply_len(&self) -> usize {
        self.queue.reply_len()
    }

    /// A send was refused as full: `on_drain` once the queue is written out.
    pub(crate) fn want_drain(&mut self) {
        self.wants_drain = true;
    }

    /// The tasks waiting for room, to wake once the lock is let go.
    #[must_use = "the tasks waiting for room must be woken"]
    pub(crate) fn take_waiting(&mut self) -> Option<Waiters> {
        let rare = self.rare.as_mut()?;
        let waiting = std::mem::take(&mut rare.waiting);
        self.tidy();
        (!waiting.is_empty()).then_some(waiting)
    }

    /// Gives the queue a pooled buffer for a send that copies about `bytes`
    /// into it, if it has none (an idle queue holds no buffer).
    pub(crate) fn provide_buffer(&mut self, pool: &BufferPool, bytes: usize) {
        if self.queue.needs_buffer()
            && let Some(unused) = self.queue.provide_buffer(pool.take(bytes))
        {
            pool.give(unused);
        }
    }

    /// Queues a data message: compressed if permessage-deflate was agreed
    /// and it is worth it, else as it is.
    pub(crate) fn push_message(&mut self, opcode: OpCode, payload: &[u8]) {
        if !self.push_compressed(opcode, payload) {
            self.queue.push_frame(true, 0, opcode, payload);
        }
    }

    /// Queues a reply (see `Conn::reply`): compressed only when this side
    /// compresses each message on its own.
    pub(crate) fn push_reply_message(&mut self, opcode: OpCode, payload: &[u8]) {
        if !self.push_compressed_reply(opcode, payload) {
            self.queue.push_reply(0, opcode, payload);
        }
    }

    /// Queues a ping.
    pub(crate) fn push_ping(&mut self, payload: &[u8]) {
        self.queue.push_frame(true, 0, OpCode::Ping, payload);
    }

    /// Stops sends and asks the driver to start the close handshake.
    pub(crate) fn request_close(&mut self, code: CloseCode, reason: &str) {
        self.phase = Phase::Closing;
        self.rare().close_request = Some((code, reason.to_owned()));
    }

    /// Bytes queued or being written: what the bound applies to.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len() + self.sending as usize
    }

    /// Queues `payload` as one compressed message if permessage-deflate was
    /// negotiated and the message is worth compressing; false if it was not
    /// queued (send it plain).
    fn push_compressed(&mut self, opcode: OpCode, payload: &[u8]) -> bool {
        let Some(compressor) = self.deflate.as_mut() else {
            return false;
        };
        if !compressor.wants(payload.len()) {
            return false;
        }
        // Text usually shrinks to well under half: a guess for the header.
        let expected = payload.len() / 3;
        self.queue
            .push_frame_with(true, RSV1, opcode, expected, |buf| {
                compressor.compress(payload, buf)
            })
    }
}

impl Outbox {
    /// Queues a shared payload: compressed if worth it, else without a copy.
    pub(crate) fn push_shared(&mut self, opcode: OpCode, payload: Bytes) {
        if !self.push_compressed(opcode, &payload) {
            self.queue.push_frame_shared(true, 0, opcode, payload);
        }
    }

    /// [`Outbox::push_compressed`] for a reply, which may overtake compressed
    /// messages: only if this side compresses each message on its own.
    fn push_compressed_reply(&mut self, opcode: OpCode, payload: &[u8]) -> bool {
        let Some(compressor) = self.deflate.as_mut() else {
            return false;
        };
        if compressor.keeps_context() || !compressor.wants(payload.len()) {
            return false;
        }
        let expected = payload.len() / 3;
        self.queue.push_reply_with(RSV1, opcode, expected, |buf| {
            compressor.compress(payload, buf)
        })
    }

    /// Registers `waker` to be woken once the queue has room (or the
    /// connection takes no more sends); once per task.
    pub(crate) fn wait_for_room(&mut self, waker: &Waker) {
        let waiting = &mut self.rare().waiting;
        if !waiting.iter().any(|known| known.will_wake(waker)) {
            waiting.push(waker.clone());
        }
    }
}

/// Where a connection is in its life, as far as senders are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Sends are accepted.
    Open,
    /// A close was requested or sent: no more data frames.
    Closing,
    /// The connection is over.
    Closed,
}

#[cfg(test)]
thread_local! {
    /// How often this thread locked an outbox: the lifecycle's tests count
    /// the locks an echoed message costs.
    pub(crate) static OUTBOX_LOCKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What `Conn` handles and the driver serving the connection share. Used
/// through its methods only: every change to it happens in this file.
pub(crate) struct Outbox {
    queue: WriteQueue,
    /// Bytes the driver took out of `queue` and is still writing (io_uring
    /// writes from a queue of its own, which senders cannot touch). A `u32`
    /// so that the outbox's flags share its word (every connection carries
    /// this struct): a send of 4 GiB or more counts as 4 GiB, which still
    /// refuses more sends under any bound below that.
    sending: u32,
    phase: Phase,
    /// The server gave up on this connection (forced shutdown): drop it now.
    abort: bool,
    /// The driver will write the queue soon; senders need not wake it.
    flush_scheduled: bool,
    /// A send was refused as `QueueFull`: call `on_drain` once the queue is empty.
    wants_drain: bool,
    /// The close request, waiting tasks and metrics probe, when there are
    /// any.
    rare: Option<Box<Rare>>,
    /// The permessage-deflate compressor, when it was negotiated. It lives
    /// here because messages are compressed as they are queued, by whichever
    /// thread sends them (16 bytes inline: a box of its own cost more).
    deflate: Option<Compressor>,
    /// What feature `metrics` counts (nothing without it).
    counting: Counting,
}

/// The driver's side of the outbox: what the connection's life does with it.
impl Outbox {
    /// A data message was queued (counted with feature `metrics`).
    #[inline(always)]
    pub(crate) fn count_message(&mut self) {
        self.counting.count_message();
    }

    /// The data messages queued since the last call (0 without feature
    /// `metrics`).
    pub(crate) fn take_messages(&mut self) -> u64 {
        self.counting.take_messages()
    }

    /// Where the session appends its replies (pongs, close frames).
    pub(crate) fn queue(&mut self) -> &mut WriteQueue {
        &mut self.queue
    }

    /// Puts `first` (the `101`) at the head of the still empty queue; its
    /// pooled buffer becomes the queue's, so what `on_open` sends joins it.
    /// (A client has no `101` to send: an empty `first` leaves the queue,
    /// and its role, as they are.)
    pub(crate) fn begin_with(&mut self, first: &mut WriteQueue) {
        debug_assert!(self.queue.is_empty());
        if !first.is_empty() {
            debug_assert_eq!(first.role(), self.queue.role());
            std::mem::swap(&mut self.queue, first);
        }
    }

    /// Nothing queued and nothing being written.
    pub(crate) fn is_flushed(&self) -> bool {
        self.queue.is_empty() && self.sending == 0
    }

    /// Bytes queued but not yet taken by the driver.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A close frame is in the queue: senders are turned away from now on,
    /// so that no data frame can follow it. Returns the tasks waiting for
    /// room, to wake (with `Closed`) once the lock is let go.
    #[must_use = "the tasks waiting for room must be woken"]
    pub(crate) fn close_sends(&mut self) -> Option<Waiters> {
        self.phase = Phase::Closed;
        self.take_waiting()
    }

    /// The close `Conn::close` asked for, once.
    pub(crate) fn take_close_request(&mut self) -> Option<(CloseCode, String)> {
        let request = self.rare.as_mut()?.close_request.take();
        self.tidy();
        request
    }

    /// The rare state, boxed on first use.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Frees the rare state once nothing is in it.
    fn tidy(&mut self) {
        if self.rare.as_ref().is_some_and(|rare| rare.is_empty()) {
            self.rare = None;
        }
    }

    /// `n` bytes were handed to the kernel: a probe they complete is
    /// recorded (feature `metrics`; see `counting.rs`).
    #[inline]
    fn count_written(&mut self, n: usize) {
        if let Some(rare) = self.rare.as_mut()
            && rare.probe.as_mut().is_some_and(|probe| probe.written(n))
        {
            rare.probe = None;
            self.tidy();
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.abort
    }

    /// The driver is about to write (or is handling a read whose replies it
    /// will write, or a send just queued something): senders need not wake
    /// it. True if it was not scheduled yet: a sender then wakes the driver.
    pub(crate) fn schedule_flush(&mut self) -> bool {
        !std::mem::replace(&mut self.flush_scheduled, true)
    }

    /// The driver will not write again on its own: the next send wakes it.
    pub(crate) fn unschedule_flush(&mut self) {
        self.flush_scheduled = false;
    }

    /// Whether a send was refused as full since the last call.
    pub(crate) fn take_wants_drain(&mut self) -> bool {
        std::mem::take(&mut self.wants_drain)
    }

    /// Sets the compressor permessage-deflate was agreed with.
    #[cfg(feature = "deflate")]
    pub(crate) fn set_compressor(&mut self, compressor: Compressor) {
        self.deflate = Some(compressor);
    }

    /// Writes the queue in place through `write` until it is empty or `write`
    /// stops (see [`WriteQueue::write_with`]); an emptied queue gives its
    /// buffer back to `pool`.
    pub(crate) fn write_with(
        &mut self,
        pool: &BufferPool,
        write: impl FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> std::io::Result<Written> {
        let written = self.queue.write_with(write)?;
        self.count_written(written.bytes);
        if self.queue.is_empty()
            && let Some(buf) = self.queue.take_buffer()
        {
            pool.give(buf);
        }
        Ok(written)
    }

    /// Moves what goes out next into `into` for a write that owns its buffers
    /// (io_uring), counting it as being written until [`Outbox::no_longer_sending`]
    /// says otherwise: at least [`SEND_AT_LEAST`] bytes up to a message
    /// boundary (or everything), so that replies can still overtake the rest
    /// (see [`WriteQueue::take_to_send`]). Returns the bytes queued and being
    /// written together after the move.
    pub(crate) fn take_for_send(&mut self, into: &mut WriteQueue) -> usize {
        debug_assert!(into.is_empty());
        *into = self.queue.take_to_send(SEND_AT_LEAST);
        let taken = u32::try_from(into.len()).unwrap_or(u32::MAX);
        self.sending = self.sending.saturating_add(taken);
        self.queued()
    }

    /// The tasks waiting for room, if they should run now: the queue has
    /// written down to `low_water`, or the connection takes no more sends.
    #[must_use = "the tasks waiting for room must be woken"]
    pub(crate) fn take_waiting_if_room(&mut self, low_water: usize) -> Option<Waiters> {
        if !self.has_waiting() {
            return None;
        }
        if self.phase != Phase::Open || self.queued() <= low_water {
            self.take_waiting()
        } else {
            None
        }
    }

    /// `n` taken bytes are no longer being written: they went out, or the
    /// write failed and they never will.
    pub(crate) fn no_longer_sending(&mut self, n: usize) {
        self.count_written(n);
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.sending = self.sending.saturating_sub(n);
    }

    /// The connection is over: later sends fail, a close request is void,
    /// the compressor goes (its zlib stream, if it holds one, back to this
    /// thread's pool), and what was never written is dropped, its buffer
    /// back to `pool`.
    #[must_use = "the tasks waiting for room must be woken"]
    pub(crate) fn clear(&mut self, pool: &BufferPool) -> Option<Waiters> {
        self.phase = Phase::Closed;
        self.deflate = None;
        let unwritten = self.queue.len();
        self.queue.advance(unwritten);
        self.sending = 0;
        if let Some(buf) = self.queue.take_buffer() {
            pool.give(buf);
        }
        let waiting = self.take_waiting();
        // The close request is void, and a probe never to be written.
        self.rare = None;
        waiting
    }

    /// Some task waits in [`Conn::ready`](crate::Conn::ready).
    pub(crate) fn has_waiting(&self) -> bool {
        self.rare
            .as_ref()
            .is_some_and(|rare| !rare.waiting.is_empty())
    }
}

/// What the tests of `Conn` look at.
#[cfg(test)]
impl Outbox {
    pub(crate) fn wants_drain(&self) -> bool {
        self.wants_drain
    }

    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    pub(crate) fn close_request(&self) -> Option<&(CloseCode, String)> {
        self.rare.as_ref()?.close_request.as_ref()
    }
}

/// How much an owned-buffer write takes at least (see
/// [`Outbox::take_for_send`]): enough that a send's cost is spread over
/// many bytes, little enough that a reply waits behind no more than this
/// plus one message, and that what a peer that reads nothing leaves in
/// flight stays small.
const SEND_AT_LEAST: usize = 64 * 1024;

/// What every connection of a server shares about sending (one allocation
/// for all, rather than three fields in each connection).
#[derive(Debug)]
pub(crate) struct Outbound {
    pub(crate) pool: Arc<BufferPool>,
    /// `Config::max_outbound_bytes`.
    pub(crate) max_bytes: usize,
    /// What a full queue leads to.
    pub(crate) on_full: SlowConsumer,
    /// The hub's metric handles (nothing without feature `metrics`).
    pub(crate) meters: Meters,
}

impl Outbound {
    /// Where a full queue counts as having room again: reading resumes.
    /// Half the bound, so a peer that reads slowly costs a wake-up per half
    /// a queue, not per write.
    pub(crate) fn low_water(&self) -> usize {
        self.max_bytes / 2
    }

    /// How full the queue may get before producers waiting in
    /// [`Conn::ready`](crate::Conn::ready) wait: half the bound. The other half is kept for
    /// what reading brings (answers, echoes), so a producer that keeps the
    /// queue busy never makes the connection stop reading its requests.
    pub(crate) fn producer_limit(&self) -> usize {
        self.max_bytes / 2
    }

    /// Where waiting producers are woken: a quarter of the bound, so that
    /// they refill in bursts, not a message per wake-up.
    pub(crate) fn producer_wake(&self) -> usize {
        self.max_bytes / 4
    }
}

pub(crate) struct ConnShared {
    id: u64,
    peer: SocketAddr,
    outbound: Arc<Outbound>,
    wake: ConnWake,
    /// Set with a close request or abort, so the driver can notice between two
    /// callbacks without taking the lock.
    attention: AtomicBool,
    /// `Conn::pause_reading`: no frame is handled, and nothing read, until
    /// `Conn::resume_reading`.
    reading_paused: AtomicBool,
    outbox: Mutex<Outbox>,
    /// The pub/sub topics this connection is in (see `fanout.rs`): under a
    /// lock of their own, so that the outbox (every send) does not carry them.
    #[cfg(feature = "pubsub")]
    memberships: Memberships,
}

impl ConnShared {
    pub(crate) fn new(
        id: u64,
        peer: SocketAddr,
        outbound: Arc<Outbound>,
        wake: ConnWake,
        role: Role,
    ) -> Arc<ConnShared> {
        Arc::new(ConnShared {
            id,
            peer,
            outbound,
            wake,
            attention: AtomicBool::new(false),
            reading_paused: AtomicBool::new(false),
            #[cfg(feature = "pubsub")]
            memberships: Memberships::default(),
            outbox: Mutex::new(Outbox {
                queue: WriteQueue::with_role(role),
                sending: 0,
                phase: Phase::Open,
                abort: false,
                flush_scheduled: false,
                wants_drain: false,
                rare: None,
                deflate: None,
                counting: Counting::default(),
            }),
        })
    }

    /// Locks the outbox. A panic while it was held cannot leave it half-written
    /// (the queue is only changed by whole frames), so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Outbox> {
        #[cfg(test)]
        OUTBOX_LOCKS.with(|locks| locks.set(locks.get() + 1));
        self.outbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How sends, close requests and aborts wake the driver.
    pub(crate) fn wake(&self) -> &ConnWake {
        &self.wake
    }

    /// A number unique among the hub's connections.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Makes the driver look at the connection between two callbacks (a
    /// close request, an abort, reading resumed), and wakes it.
    pub(crate) fn call_attention(&self) {
        self.attention.store(true, Ordering::Release);
        self.wake.wake();
    }

    /// `Conn::pause_reading`.
    pub(crate) fn pause_reading(&self) {
        self.reading_paused.store(true, Ordering::Release);
    }

    /// `Conn::resume_reading`: true if reading was paused (the driver is
    /// then to be called).
    pub(crate) fn resume_reading(&self) -> bool {
        self.reading_paused.swap(false, Ordering::AcqRel)
    }

    /// Whether the application paused reading (`Conn::pause_reading`).
    pub(crate) fn is_reading_paused(&self) -> bool {
        self.reading_paused.load(Ordering::Acquire)
    }

    /// Whether a close request or abort arrived; clears the flag.
    pub(crate) fn take_attention(&self) -> bool {
        self.attention.swap(false, Ordering::Acquire)
    }

    /// Whether the connection has work that no socket event will announce:
    /// bytes queued by another task, a close request, or an abort.
    pub(crate) fn has_pending_work(&self) -> bool {
        if self.attention.load(Ordering::Acquire) {
            return true;
        }
        let outbox = self.lock();
        !outbox.queue.is_empty() || outbox.abort
    }

    /// Makes the driver drop the connection at once.
    pub(crate) fn abort(&self) {
        self.lock().abort = true;
        self.call_attention();
    }

    pub(crate) fn pool(&self) -> &Arc<BufferPool> {
        &self.outbound.pool
    }

    /// The server's sending settings.
    pub(crate) fn outbound(&self) -> &Outbound {
        &self.outbound
    }
}
