//! One reactor thread's io_uring instance and every piece of memory the kernel
//! reads or writes for it: the provided buffer ring that receives land in, the
//! queues being sent, and the eventfd counter. All of the io_uring backend's
//! `unsafe` is in this file.
//!
//! The rule that makes it sound: whatever memory an operation names belongs to
//! the `Ring` from the moment the operation is queued until its last
//! completion arrives (a send's queue is moved into the ring and handed back
//! with the completion), and `Drop` cancels every operation still in flight
//! and waits for its completion before any of that memory is freed.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io::{self, IoSlice};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use io_uring::types::{BufRingEntry, CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};

use crate::proto::WriteQueue;

/// Slices one send takes at most.
const MAX_IOVECS: usize = 64;

/// The buffer group id of the provided buffer ring (one per ring).
const BUFFER_GROUP: u16 = 0;

/// How long dropping a ring waits for cancelled operations to complete.
const CANCEL_WAIT_ON_DROP: Duration = Duration::from_secs(5);

/// What an operation is, kept in its `user_data`: the kind in the high 32 bits,
/// the connection's slot in the low 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Accept,
    Recv(u32),
    Send(u32),
    /// The read of the reactor's eventfd: another thread woke it.
    Wake,
    Cancel,
}

impl Op {
    fn user_data(self) -> u64 {
        let (kind, slot): (u64, u32) = match self {
            Op::Accept => (1, 0),
            Op::Recv(slot) => (2, slot),
            Op::Send(slot) => (3, slot),
            Op::Wake => (4, 0),
            Op::Cancel => (5, 0),
        };
        (kind << 32) | u64::from(slot)
    }

    fn from_user_data(data: u64) -> Option<Op> {
        let slot = data as u32;
        Some(match data >> 32 {
            1 => Op::Accept,
            2 => Op::Recv(slot),
            3 => Op::Send(slot),
            4 => Op::Wake,
            5 => Op::Cancel,
            _ => return None,
        })
    }
}

/// A completed operation, decoded.
pub(crate) enum Completion {
    /// A connection from the multishot accept. Without `more`, the accept has
    /// ended and must be armed again.
    Accepted {
        result: io::Result<OwnedFd>,
        more: bool,
    },
    /// A multishot receive delivered data into a provided buffer, or the end.
    /// Without `more`, the receive has ended (after an error, the end of the
    /// stream, or ENOBUFS) and must be armed again to read on.
    Received {
        slot: u32,
        result: io::Result<Received>,
        more: bool,
    },
    /// A send finished: how much of its queue was written. The queue comes
    /// back with the rest (if any) still in it.
    Sent {
        slot: u32,
        result: io::Result<usize>,
        outgoing: Box<Outgoing>,
    },
    /// The eventfd was written: look at the woken list, then arm it again.
    Woken,
}

/// What a receive brought.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// `len` bytes in provided buffer `buffer`: read them with
    /// [`Ring::received`], then give the buffer back with [`Ring::recycle`].
    Data { buffer: u16, len: usize },
    /// The peer ended its side of the stream.
    End,
}

/// A connection's outbound queue while the kernel sends it, with the slices
/// that describe it to the kernel.
pub(crate) struct Outgoing {
    pub(crate) queue: WriteQueue,
    iovecs: [libc::iovec; MAX_IOVECS],
    msg: libc::msghdr,
}

impl Outgoing {
    pub(crate) fn new() -> Box<Outgoing> {
        Box::new(Outgoing {
            queue: WriteQueue::new(),
            iovecs: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOVECS],
            // SAFETY: `msghdr` is a plain C struct (pointers, lengths, flags,
            // and on some targets padding): all zeroes is a valid, empty value.
            msg: unsafe { std::mem::zeroed() },
        })
    }
}

/// The provided buffer ring: `count` buffers of `size` bytes that multishot
/// receives fill. The kernel takes one per completion; [`Ring::recycle`] puts
/// it back at the ring's tail as soon as its bytes have been handled.
struct ProvidedBuffers {
    /// `count` entries, page-aligned, shared with the kernel.
    entries: NonNull<BufRingEntry>,
    /// `None` once the entries are leaked (see `Ring::drop`).
    layout: Option<Layout>,
    mask: u16,
    tail: u16,
    size: usize,
    /// The buffers, by id. While the kernel owns one, nothing here touches it.
    buffers: Vec<BytesMut>,
    /// Which buffers a completion has handed back to us (and not yet recycled):
    /// only those may be read or recycled.
    delivered: Vec<bool>,
}

impl ProvidedBuffers {
    fn new(count: u16, size: usize) -> io::Result<ProvidedBuffers> {
        if !count.is_power_of_two() || size == 0 || u32::try_from(size).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "provided buffers: the count must be a power of two, the size 1 byte to 4 GiB",
            ));
        }
        let layout = Layout::array::<BufRingEntry>(usize::from(count))
            .and_then(|layout| layout.align_to(page_size()))
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: `layout` has a non-zero size (count >= 1).
        let entries = NonNull::new(unsafe { alloc_zeroed(layout) }.cast::<BufRingEntry>())
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut ring = ProvidedBuffers {
            entries,
            layout: Some(layout),
            mask: count - 1,
            tail: 0,
            size,
            buffers: (0..count).map(|_| BytesMut::with_capacity(size)).collect(),
            delivered: vec![false; usize::from(count)],
        };
        for id in 0..count {
            ring.provide(id);
        }
        Ok(ring)
    }

    /// Records that a completion handed buffer `id` back to us.
    fn deliver(&mut self, id: u16) -> u16 {
        let delivered = &mut self.delivered[usize::from(id)];
        assert!(
            !*delivered,
            "the kernel handed back a buffer it did not have"
        );
        *delivered = true;
        id
    }

    /// Puts buffer `id` at the tail of the ring, for the kernel to fill. Only
    /// buffers the kernel does not hold (new, or delivered and recycled).
    fn provide(&mut self, id: u16) {
        let buf = &mut self.buffers[usize::from(id)];
        debug_assert!(buf.is_empty() && buf.capacity() >= self.size);
        let index = usize::from(self.tail & self.mask);
        // SAFETY: `index` is below the ring's entry count, so the pointer is
        // inside the allocation. The kernel reads entries only between its
        // head and the published tail, and this one is past the tail until
        // the store below.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(buf.as_mut_ptr() as u64);
        entry.set_len(self.size as u32);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail is a properly aligned u16 inside the first entry,
        // which lives as long as `self`; the kernel only reads it, and every
        // access from this side is atomic.
        let tail =
            unsafe { AtomicU16::from_ptr(BufRingEntry::tail(self.entries.as_ptr()).cast_mut()) };
        // Release: the entry's fields are visible before the new tail.
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for ProvidedBuffers {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `new` with this layout; the kernel no longer
            // reads it (it never saw it, or `Ring::drop` unregistered it).
            unsafe { dealloc(self.entries.as_ptr().cast(), layout) };
        }
    }
}

/// An io_uring instance with its provided buffers and in-flight sends.
pub(crate) struct Ring {
    ring: IoUring,
    buffers: ProvidedBuffers,
    /// The queue each slot is sending, while the kernel sends it.
    sends: Vec<Option<Box<Outgoing>>>,
    /// Where the eventfd read puts the counter.
    wake_counter: Box<u64>,
    /// Operations whose last completion has not arrived.
    in_flight: usize,
    /// Completions taken early, to make room when the submission queue was
    /// full; handed out by the next `complete`.
    early: Vec<Completion>,
}

impl Ring {
    /// Sets up a ring with `entries` submission slots and `buffers` provided
    /// buffers of `buffer_size` bytes. Fails if the kernel lacks io_uring or a
    /// feature the backend needs (provided buffer rings: Linux 5.19; multishot
    /// receive: 6.0).
    pub(crate) fn new(entries: u32, buffers: u16, buffer_size: usize) -> io::Result<Ring> {
        let mut builder = IoUring::builder();
        builder
            .setup_cqsize(entries * 8)
            .setup_single_issuer()
            .setup_defer_taskrun()
            // Deferred task work (receives, accepts, waiting sends) runs only
            // when an enter asks for completions; this flag tells a
            // non-waiting submit that some is pending, so it asks.
            .setup_taskrun_flag();
        // Fewer flags on kernels without these (before 6.1).
        let ring = builder
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(entries * 8).build(entries))
            .map_err(|e| unavailable("io_uring_setup", e))?;
        let buffers = ProvidedBuffers::new(buffers, buffer_size)?;
        // SAFETY: the entries stay allocated, at this address, until
        // `Ring::drop` has unregistered them.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                buffers.entries.as_ptr() as u64,
                buffers.mask + 1,
                BUFFER_GROUP,
                0,
            )
        }
        .map_err(|e| unavailable("registering a provided buffer ring", e))?;
        Ok(Ring {
            ring,
            buffers,
            sends: Vec::new(),
            wake_counter: Box::new(0),
            in_flight: 0,
            early: Vec::new(),
        })
    }

    /// Queues `entry` for the next submit (submitting early if the queue is
    /// full).
    ///
    /// # Safety
    /// Every memory region `entry` names must stay valid, and unused by
    /// anything but the kernel where the kernel writes, until the operation's
    /// last completion is taken from the ring.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: passed on to the caller.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                break;
            }
            // Full: hand what is queued to the kernel and try again. If the
            // kernel is busy because completions pile up, take them now (the
            // reactor gets them with the next batch).
            if let Err(error) = self.ring.submit() {
                if error.raw_os_error() != Some(libc::EBUSY) {
                    tracing::warn!(%error, "io_uring submit failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut early = std::mem::take(&mut self.early);
                self.complete(&mut early);
                self.early = early;
            }
        }
        self.in_flight += 1;
    }

    /// Starts a multishot accept on `listener`.
    pub(crate) fn accept(&mut self, listener: RawFd) {
        let entry = opcode::AcceptMulti::new(Fd(listener)).build();
        // SAFETY: names no memory (no address is returned by a multishot accept).
        unsafe { self.push(entry.user_data(Op::Accept.user_data())) };
    }

    /// Starts a multishot receive on `fd` into the provided buffers.
    pub(crate) fn receive(&mut self, slot: u32, fd: RawFd) {
        let entry = opcode::RecvMulti::new(Fd(fd), BUFFER_GROUP).build();
        // SAFETY: names no memory but the provided buffers, which the ring owns
        // (see `ProvidedBuffers`).
        unsafe { self.push(entry.user_data(Op::Recv(slot).user_data())) };
    }

    /// Sends what `outgoing.queue` holds (as much as one send takes) on `fd`.
    /// The queue is the ring's until the completion hands it back.
    pub(crate) fn send(&mut self, slot: u32, fd: RawFd, mut outgoing: Box<Outgoing>) {
        let Outgoing { queue, iovecs, msg } = &mut *outgoing;
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let count = queue.io_slices(&mut slices);
        debug_assert!(count > 0, "nothing to send");
        for (iovec, slice) in iovecs.iter_mut().zip(&slices[..count]) {
            *iovec = libc::iovec {
                iov_base: slice.as_ptr().cast_mut().cast(),
                iov_len: slice.len(),
            };
        }
        let entry = if count == 1 {
            let len = u32::try_from(iovecs[0].iov_len).unwrap_or(u32::MAX);
            opcode::Send::new(Fd(fd), iovecs[0].iov_base.cast(), len)
                .flags(libc::MSG_NOSIGNAL)
                .build()
        } else {
            msg.msg_iov = iovecs.as_mut_ptr();
            msg.msg_iovlen = count as _;
            opcode::SendMsg::new(Fd(fd), &raw const *msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        };
        let index = slot as usize;
        if self.sends.len() <= index {
            self.sends.resize_with(index + 1, || None);
        }
        assert!(
            self.sends[index].is_none(),
            "one send per connection at a time"
        );
        self.sends[index] = Some(outgoing);
        // SAFETY: the message header, the slices and the bytes they point to
        // are in the boxed `Outgoing` just stored in `self.sends`, or owned by
        // its queue (which nothing else can reach). Moving the box does not
        // move them, and it stays there until the completion takes it back.
        unsafe { self.push(entry.user_data(Op::Send(slot).user_data())) };
    }

    /// Reads `eventfd` (8 bytes) into the ring's own counter.
    pub(crate) fn watch_wakes(&mut self, eventfd: RawFd) {
        let counter: *mut u64 = &mut *self.wake_counter;
        let entry = opcode::Read::new(Fd(eventfd), counter.cast(), 8).build();
        // SAFETY: the counter is boxed in the ring, which keeps it until the
        // read's completion (even when dropped, see `Drop`).
        unsafe { self.push(entry.user_data(Op::Wake.user_data())) };
    }

    /// Asks the kernel to cancel `op`; its completion reports it.
    pub(crate) fn cancel(&mut self, op: Op) {
        let entry = opcode::AsyncCancel::new(op.user_data()).build();
        // SAFETY: names no memory.
        unsafe { self.push(entry.user_data(Op::Cancel.user_data())) };
    }

    /// Submits everything queued, and if `wait`, waits for a completion (until
    /// `deadline`, if one is given). One call per loop turn.
    pub(crate) fn submit(&mut self, wait: bool, deadline: Option<Instant>) -> io::Result<()> {
        let submitter = self.ring.submitter();
        let result = match deadline {
            Some(deadline) if wait => {
                let timeout = Timespec::from(deadline.saturating_duration_since(Instant::now()));
                submitter.submit_with_args(1, &SubmitArgs::new().timespec(&timeout))
            }
            _ => submitter.submit_and_wait(usize::from(wait)),
        };
        match result {
            Ok(_) => Ok(()),
            // The timeout passed, a signal came, or completions must be taken
            // first: all mean "look at the completion queue".
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Moves every completion waiting in the queue to `out`, decoded.
    pub(crate) fn complete(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.early);
        let Ring {
            ring,
            buffers,
            sends,
            in_flight,
            ..
        } = self;
        for cqe in ring.completion() {
            let more = cqueue::more(cqe.flags());
            if !more {
                *in_flight -= 1;
            }
            let result = cqe.result();
            let error = || io::Error::from_raw_os_error(-result);
            let completion = match Op::from_user_data(cqe.user_data()) {
                Some(Op::Accept) => Completion::Accepted {
                    result: if result >= 0 {
                        // SAFETY: a successful accept's result is a new
                        // descriptor, which nothing else owns.
                        Ok(unsafe { OwnedFd::from_raw_fd(result) })
                    } else {
                        Err(error())
                    },
                    more,
                },
                Some(Op::Recv(slot)) => Completion::Received {
                    slot,
                    result: match (result, cqueue::buffer_select(cqe.flags())) {
                        (1.., Some(buffer)) => Ok(Received::Data {
                            buffer: buffers.deliver(buffer),
                            len: result as usize,
                        }),
                        (0, buffer) => {
                            // An end of stream holds no data; a buffer it
                            // took anyway goes straight back.
                            if let Some(buffer) = buffer {
                                let buffer = buffers.deliver(buffer);
                                recycle_buffer(buffers, buffer);
                            }
                            Ok(Received::End)
                        }
                        (1.., None) => Err(io::Error::other("receive without a buffer")),
                        _ => Err(error()),
                    },
                    more,
                },
                Some(Op::Send(slot)) => {
                    let Some(outgoing) = sends.get_mut(slot as usize).and_then(Option::take) else {
                        tracing::error!(slot, "send completion without a send");
                        continue;
                    };
                    Completion::Sent {
                        slot,
                        result: if result >= 0 {
                            Ok(result as usize)
                        } else {
                            Err(error())
                        },
                        outgoing,
                    }
                }
                Some(Op::Wake) => Completion::Woken,
                Some(Op::Cancel) | None => continue,
            };
            out.push(completion);
        }
    }

    /// The bytes a receive put in provided buffer `id`, to handle in place
    /// (unmasking writes to them). Give the buffer back with [`Ring::recycle`].
    pub(crate) fn received(&mut self, id: u16, len: usize) -> &mut BytesMut {
        let size = self.buffers.size;
        assert!(
            self.buffers.delivered[usize::from(id)],
            "only a buffer a completion handed back may be read"
        );
        let buf = &mut self.buffers.buffers[usize::from(id)];
        assert!(
            len <= size && buf.is_empty(),
            "a receive's buffer must be read once"
        );
        // SAFETY: the kernel wrote `len` bytes at the start of this buffer (its
        // ring entry gave it this buffer's address and `size` bytes of room,
        // and `size` is within the capacity), and the completion that said so
        // handed the buffer back: the kernel no longer touches it.
        unsafe { buf.set_len(len) };
        buf
    }

    /// Gives provided buffer `id` back to the kernel, emptied.
    pub(crate) fn recycle(&mut self, id: u16) {
        recycle_buffer(&mut self.buffers, id);
    }
}

/// Empties buffer `id` and puts it back in the ring. A buffer that was split
/// or shared while handled is replaced, so the kernel only ever writes to
/// memory nothing else holds.
fn recycle_buffer(buffers: &mut ProvidedBuffers, id: u16) {
    let delivered = &mut buffers.delivered[usize::from(id)];
    assert!(
        std::mem::replace(delivered, false),
        "only a buffer a completion handed back may be recycled, once"
    );
    let size = buffers.size;
    let buf = &mut buffers.buffers[usize::from(id)];
    buf.clear();
    // `try_reclaim` succeeds only for a buffer this handle owns alone, and
    // moves its start back to the start of its allocation.
    if !buf.try_reclaim(size) {
        *buf = BytesMut::with_capacity(size);
    }
    buffers.provide(id);
}

impl Ring {
    /// Cancels every operation in flight and waits (at most `limit`) for
    /// their completions, which are dropped. Returns how many are still out.
    fn cancel_all(&mut self, limit: Duration) -> usize {
        if self.in_flight > 0 {
            let entry = opcode::AsyncCancel2::new(CancelBuilder::any()).build();
            // SAFETY: names no memory.
            unsafe { self.push(entry.user_data(Op::Cancel.user_data())) };
            let give_up = Instant::now() + limit;
            let mut completions = Vec::new();
            while self.in_flight > 0 && Instant::now() < give_up {
                let wait_until = (Instant::now() + Duration::from_millis(100)).min(give_up);
                if self.submit(true, Some(wait_until)).is_err() {
                    break;
                }
                self.complete(&mut completions);
                completions.clear();
            }
        }
        self.in_flight
    }
}

impl Drop for Ring {
    /// Cancels whatever is still in flight and waits for it to complete, so
    /// the kernel no longer writes to memory about to be freed. If that takes
    /// too long, the memory is leaked rather than freed under the kernel.
    fn drop(&mut self) {
        if self.cancel_all(CANCEL_WAIT_ON_DROP) > 0 {
            tracing::error!(
                in_flight = self.in_flight,
                "io_uring operations did not finish; leaking their memory"
            );
            std::mem::forget(std::mem::take(&mut self.sends));
            std::mem::forget(std::mem::replace(&mut self.wake_counter, Box::new(0)));
            std::mem::forget(std::mem::take(&mut self.buffers.buffers));
            // The entries too: the kernel may still read them.
            self.buffers.layout = None;
            return;
        }
        let _ = self.ring.submitter().unregister_buf_ring(BUFFER_GROUP);
    }
}

/// The memory page size, which the provided ring's entries are aligned to.
fn page_size() -> usize {
    // SAFETY: `sysconf` takes no pointers.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

/// A new eventfd (close-on-exec), for other threads to wake a reactor with.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: `eventfd` takes no pointers; it returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The error `serve` returns when io_uring cannot be used here.
fn unavailable(step: &str, error: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "io_uring is not available ({step} failed: {error}); the io_uring backend needs \
             Linux 6.0 or later with io_uring allowed (not blocked by seccomp or the \
             kernel.io_uring_disabled sysctl); use the tokio backend instead"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use bytes::{Buf, Bytes};

    use super::*;
    use crate::proto::OpCode;

    /// Waits for completions until `until` accepts one.
    fn wait_for(ring: &mut Ring, mut until: impl FnMut(&Completion) -> bool) -> Completion {
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            assert!(Instant::now() < give_up, "no such completion within 10 s");
            ring.submit(true, Some(Instant::now() + Duration::from_millis(200)))
                .unwrap();
            ring.complete(&mut seen);
            if let Some(at) = seen.iter().position(&mut until) {
                return seen.swap_remove(at);
            }
            seen.clear();
        }
    }

    /// Waits for the next receive that brought data: its buffer and length.
    fn next_data(ring: &mut Ring) -> (u16, usize) {
        data(&wait_for(ring, |c| data(c).is_some())).unwrap()
    }

    fn data(completion: &Completion) -> Option<(u16, usize)> {
        match completion {
            Completion::Received {
                result: Ok(Received::Data { buffer, len }),
                ..
            } => Some((*buffer, *len)),
            _ => None,
        }
    }

    #[test]
    fn receives_into_provided_buffers_and_recycles_them() {
        let mut ring = Ring::new(8, 2, 512).unwrap();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        ring.receive(3, ours.as_raw_fd());
        for round in 0..6u8 {
            // More rounds than buffers: only recycling keeps the receive going.
            let message = [round; 100];
            peer.write_all(&message).unwrap();
            let completion = wait_for(&mut ring, |c| data(c).is_some());
            let Completion::Received { slot, more, .. } = &completion else {
                unreachable!()
            };
            assert_eq!((*slot, *more), (3, true));
            let (buffer, len) = data(&completion).unwrap();
            let received = ring.received(buffer, len);
            assert_eq!(&received[..], &message[..]);
            // Handled in place: unmasking writes to it, the session advances it.
            received[0] ^= 0xff;
            received.advance(10);
            ring.recycle(buffer);
        }
        drop(peer);
        let end = wait_for(&mut ring, |c| matches!(c, Completion::Received { .. }));
        assert!(matches!(
            end,
            Completion::Received {
                result: Ok(Received::End),
                more: false,
                ..
            }
        ));
        assert_eq!(ring.cancel_all(Duration::from_secs(5)), 0);
    }

    #[test]
    fn a_receive_without_buffers_ends_with_enobufs_and_works_once_rearmed() {
        let mut ring = Ring::new(8, 1, 512).unwrap();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        ring.receive(0, ours.as_raw_fd());
        peer.write_all(b"first").unwrap();
        let (buffer, len) = next_data(&mut ring);
        // The only buffer is still ours: the next bytes find none.
        peer.write_all(b"second").unwrap();
        let starved = wait_for(&mut ring, |c| matches!(c, Completion::Received { .. }));
        match starved {
            Completion::Received {
                result: Err(error),
                more: false,
                ..
            } => assert_eq!(error.raw_os_error(), Some(libc::ENOBUFS)),
            _ => panic!("expected ENOBUFS ending the receive"),
        }
        assert_eq!(&ring.received(buffer, len)[..], b"first");
        ring.recycle(buffer);
        ring.receive(0, ours.as_raw_fd());
        let (buffer, len) = next_data(&mut ring);
        assert_eq!(&ring.received(buffer, len)[..], b"second");
        ring.recycle(buffer);
    }

    #[test]
    fn a_buffer_split_off_while_handled_is_replaced_not_reused() {
        let mut ring = Ring::new(8, 1, 512).unwrap();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        ring.receive(0, ours.as_raw_fd());
        peer.write_all(b"keep me").unwrap();
        let (buffer, len) = next_data(&mut ring);
        let kept: Bytes = ring.received(buffer, len).split().freeze();
        ring.recycle(buffer);
        peer.write_all(b"overwrite?").unwrap();
        let (buffer, len) = next_data(&mut ring);
        assert_eq!(&ring.received(buffer, len)[..], b"overwrite?");
        assert_eq!(
            &kept[..],
            b"keep me",
            "the kernel wrote into a shared buffer"
        );
        ring.recycle(buffer);
    }

    #[test]
    fn sends_a_queue_in_one_operation() {
        let mut ring = Ring::new(8, 1, 512).unwrap();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        // One slice, then several (a shared payload is a segment of its own).
        let mut outgoing = Outgoing::new();
        outgoing
            .queue
            .push_frame(true, 0, OpCode::Text, b"one slice");
        let mut expected = Vec::new();
        for round in 0..2 {
            let total = outgoing.queue.len();
            let mut copy = vec![0u8; total];
            {
                let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
                let n = outgoing.queue.io_slices(&mut slices);
                let mut at = 0;
                for slice in &slices[..n] {
                    copy[at..at + slice.len()].copy_from_slice(slice);
                    at += slice.len();
                }
            }
            expected.extend_from_slice(&copy);
            ring.send(5, ours.as_raw_fd(), outgoing);
            let sent = wait_for(&mut ring, |c| matches!(c, Completion::Sent { .. }));
            let Completion::Sent {
                slot,
                result,
                outgoing: back,
            } = sent
            else {
                unreachable!()
            };
            assert_eq!((slot, result.unwrap()), (5, total), "round {round}");
            outgoing = back;
            outgoing.queue.advance(total);
            outgoing.queue.push_frame(true, 0, OpCode::Text, b"head");
            outgoing
                .queue
                .push_frame_shared(true, 0, OpCode::Binary, Bytes::from(vec![7u8; 4096]));
            outgoing.queue.push_frame(true, 0, OpCode::Text, b"tail");
        }
        let mut received = vec![0u8; expected.len()];
        peer.read_exact(&mut received).unwrap();
        assert_eq!(received, expected);
    }

    #[test]
    fn an_eventfd_write_completes_the_wake_read() {
        let mut ring = Ring::new(8, 1, 512).unwrap();
        let eventfd = std::fs::File::from(eventfd().unwrap());
        ring.watch_wakes(eventfd.as_raw_fd());
        let writer = eventfd.try_clone().unwrap();
        let waker = std::thread::spawn(move || (&writer).write_all(&1u64.to_ne_bytes()));
        wait_for(&mut ring, |c| matches!(c, Completion::Woken));
        waker.join().unwrap().unwrap();
        assert_eq!(*ring.wake_counter, 1);
    }

    #[test]
    fn dropping_a_ring_cancels_and_waits_for_what_is_in_flight() {
        let mut ring = Ring::new(8, 2, 512).unwrap();
        let (_peer, ours) = UnixStream::pair().unwrap();
        let eventfd = eventfd().unwrap();
        ring.receive(1, ours.as_raw_fd());
        ring.watch_wakes(eventfd.as_raw_fd());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        ring.accept(listener.as_raw_fd());
        ring.submit(false, None).unwrap();
        assert_eq!(ring.in_flight, 3);
        assert_eq!(ring.cancel_all(Duration::from_secs(5)), 0);
    }

    #[test]
    fn accepts_connections_until_cancelled() {
        let mut ring = Ring::new(8, 1, 512).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        ring.accept(listener.as_raw_fd());
        let addr = listener.local_addr().unwrap();
        for _ in 0..3 {
            let client = std::net::TcpStream::connect(addr).unwrap();
            let accepted = wait_for(&mut ring, |c| matches!(c, Completion::Accepted { .. }));
            let Completion::Accepted { result, more } = accepted else {
                unreachable!()
            };
            assert!(more, "multishot accept stays armed");
            let stream = std::net::TcpStream::from(result.unwrap());
            assert_eq!(stream.peer_addr().unwrap(), client.local_addr().unwrap());
        }
        ring.cancel(Op::Accept);
        let ended = wait_for(&mut ring, |c| matches!(c, Completion::Accepted { .. }));
        assert!(matches!(
            ended,
            Completion::Accepted {
                result: Err(_),
                more: false
            }
        ));
    }
}
