//! The outbound byte queue: frames waiting to be written.
//!
//! Small frames are copied into one contiguous `tail` buffer, so that everything
//! produced while handling one read (echoes, pongs, a close) is written by one
//! `write`. Large payloads handed over as `Bytes` are not copied: the queue holds
//! them as separate segments and the driver writes all segments with one
//! `writev`. The queue knows nothing about sockets; the driver asks for
//! [`WriteQueue::io_slices`] and reports progress with [`WriteQueue::advance`].
//!
//! **Two lanes.** Messages go out in the order they were pushed, with one
//! exception: replies ([`WriteQueue::push_reply`]) and pongs
//! ([`WriteQueue::push_pong`]) go out ahead of every queued message that
//! has not started on the wire, so that a small answer does not wait behind
//! megabytes of pushes. They never land inside a message (not even a
//! fragmented one), and among themselves they keep their order. A pong
//! queued behind 4 KiB of unsent pongs replaces them (RFC 6455 §5.5.3 lets
//! an endpoint answer only the most recent ping), so a peer that pings
//! without reading costs at most that. How the lanes are kept is in
//! `lanes.rs`.
//!
//! The queue also knows which end of the connection writes into it: a
//! client's queue ([`WriteQueue::with_role`]) masks every frame pushed into
//! it with a fresh key, so nothing that sends (the session's pongs and close
//! frames, a handle's messages, the compressor) has to think about masking.

use std::io::{self, IoSlice};

use bytes::{Buf, Bytes, BytesMut};

use super::frame::{MAX_HEADER_LEN, OpCode, encode_header};
use super::mask::apply_mask;
use super::random;
use super::role::Role;

mod lanes;

use lanes::{Lane, Spill};

/// Shared payloads up to this size are copied into the tail instead of being
/// queued as their own segment: a copy of a few hundred bytes is cheaper than an
/// extra iovec and a reference count.
const COPY_BELOW: usize = 512;

/// Copies at least this long are checked for "4K aliasing" (see
/// [`WriteQueue::push_frame`]); shorter ones do not use the string-copy path.
const ALIASING_CHECK_FROM: usize = 2048;

/// The most bytes of unsent pongs a queue holds (see
/// `WriteQueue::push_pong`): room for dozens of answers to pings that
/// arrive together, not for a flood.
pub const PONG_BUDGET: usize = 4096;

/// How many slices [`WriteQueue::write_with`] hands one write at most.
pub const MAX_IOVECS: usize = 64;

/// What [`WriteQueue::write_with`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Bytes written (and dropped from the queue).
    pub bytes: usize,
    /// The queue is empty; otherwise the write would have blocked.
    pub all: bool,
}

/// Frames waiting to be written.
#[derive(Debug, Default)]
pub struct WriteQueue {
    /// Segments before `tail` and the reply lane: only a queue that backs
    /// up or holds shared payloads needs them, and every idle connection
    /// has a queue, so they are boxed and made on demand (see `lanes.rs`).
    spill: Option<Box<Spill>>,
    /// Small frames of the ordered lane, coalesced. Always written after the
    /// spill's segments.
    tail: BytesMut,
    /// Bytes queued in both lanes, the role, and two flags.
    len: LenAndFlags,
}

/// How many bytes are queued, with two flags in the top bits of the same
/// word: whether frames are masked (the client role) and whether a
/// fragmented message is open in the ordered lane.
///
/// Fields of their own would cost 8 bytes in every server connection's
/// `ConnShared`, which holds a queue, and could move it into the next
/// allocation size class for nothing: no queue can hold 2^62 bytes (on
/// 64-bit targets), so the top bits are free.
#[derive(Clone, Copy, Debug, Default)]
struct LenAndFlags(usize);

impl LenAndFlags {
    const MASKS: usize = 1 << (usize::BITS - 1);
    const FRAGMENT_OPEN: usize = 1 << (usize::BITS - 2);
    const FLAGS: usize = Self::MASKS | Self::FRAGMENT_OPEN;

    fn empty(role: Role) -> Self {
        match role {
            Role::Server => LenAndFlags(0),
            Role::Client => LenAndFlags(Self::MASKS),
        }
    }

    fn bytes(self) -> usize {
        self.0 & !Self::FLAGS
    }

    fn masks(self) -> bool {
        self.0 & Self::MASKS != 0
    }

    fn flag(self, flag: usize) -> bool {
        self.0 & flag != 0
    }

    fn set(&mut self, flag: usize, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }

    fn add(&mut self, n: usize) {
        debug_assert!(
            self.bytes() + n < Self::FRAGMENT_OPEN,
            "a queue of 2^62 bytes"
        );
        self.0 += n;
    }

    fn sub(&mut self, n: usize) {
        debug_assert!(n <= self.bytes());
        self.0 -= n;
    }

    /// These flags with `n` bytes (which must have none).
    fn with_bytes(self, n: usize) -> Self {
        LenAndFlags(self.0 | n)
    }

    /// No bytes, the same flags.
    fn without_bytes(self) -> Self {
        LenAndFlags(self.0 & Self::FLAGS)
    }
}

/// Where a frame just pushed to the ordered lane leaves the message stream.
#[derive(Clone, Copy)]
struct Pushed {
    opcode: OpCode,
    fin: bool,
}

impl WriteQueue {
    /// A server's queue: frames go out unmasked.
    pub fn new() -> Self {
        WriteQueue::with_role(Role::Server)
    }

    /// A queue for `role`'s frames: a client's masks every frame with a key
    /// of its own (see `proto::random`), a server's masks none.
    pub fn with_role(role: Role) -> Self {
        WriteQueue {
            spill: None,
            tail: BytesMut::new(),
            len: LenAndFlags::empty(role),
        }
    }

    /// The end of the connection whose frames this queue holds.
    pub fn role(&self) -> Role {
        if self.len.masks() {
            Role::Client
        } else {
            Role::Server
        }
    }

    /// Bytes waiting to be written, in both lanes.
    pub fn len(&self) -> usize {
        self.len.bytes()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes waiting in the reply lane (replies and pongs not yet written).
    pub fn reply_len(&self) -> usize {
        self.spill.as_ref().map_or(0, |spill| spill.urgent.len())
    }

    /// Queues a frame, copying `payload`; in a client's queue the copy is
    /// masked.
    ///
    /// A large copy whose destination would sit 1 to 63 bytes after its source
    /// within a 4 KiB page is moved to a destination with the source's alignment.
    /// The CPU's fast string copy (`rep movsb`, which `memcpy` uses for large
    /// sizes) slows down about twentyfold in that case: its stores alias the
    /// loads it is about to do. An echo hits it whenever the client's header is a
    /// few bytes longer than ours (it carries the mask key); profiled on AMD EPYC,
    /// that copy took a quarter of the server's CPU time at 16 KiB messages.
    pub fn push_frame(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload: &[u8]) {
        let before = self.ordered_len();
        if self.len.masks() {
            let n = put_frame(&mut self.tail, true, fin, rsv, opcode, payload);
            self.len.add(n);
            return self.pushed(before, Pushed { opcode, fin });
        }
        self.put_header(fin, rsv, opcode, payload.len());
        if payload.len() >= ALIASING_CHECK_FROM {
            self.tail.reserve(payload.len() + 64);
            let destination = self.tail.as_ptr() as usize + self.tail.len();
            let ahead = destination.wrapping_sub(payload.as_ptr() as usize) % 4096;
            if (1..64).contains(&ahead) {
                // Queue what is there, then start the payload `64 - ahead` bytes
                // further on: the padding is skipped, never sent.
                let head = self.tail.split().freeze();
                self.spill_with(before).segments.push_back(head);
                let pad = 64 - ahead;
                self.tail.extend_from_slice(&[0; 64][..pad]);
                self.tail.advance(pad);
            }
        }
        self.tail.extend_from_slice(payload);
        self.len.add(payload.len());
        self.pushed(before, Pushed { opcode, fin });
    }

    /// Queues a frame whose payload is shared: large payloads are not copied
    /// by a server. A client's queue copies every payload, because masking
    /// changes the bytes and other holders of a `Bytes` must not see that.
    pub fn push_frame_shared(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload: Bytes) {
        if payload.len() < COPY_BELOW || self.len.masks() {
            return self.push_frame(fin, rsv, opcode, &payload);
        }
        let before = self.ordered_len();
        self.put_header(fin, rsv, opcode, payload.len());
        self.len.add(payload.len());
        let head = self.tail.split().freeze();
        let segments = &mut self.spill_with(before).segments;
        segments.push_back(head);
        segments.push_back(payload);
        self.pushed(before, Pushed { opcode, fin });
    }

    /// Queues a whole data frame made elsewhere (a [`Prepared`] message's,
    /// shared by many connections) in the ordered lane: a small one is
    /// copied into the tail if the tail has room for it already (so that
    /// many of them go out as one slice); otherwise the frame is queued as
    /// a segment of its own, a reference to the same bytes, and the queue
    /// takes no buffer for it. Only for a server's queue: the bytes go out
    /// as they are, unmasked.
    ///
    /// [`Prepared`]: super::Prepared
    pub fn push_prepared(&mut self, opcode: OpCode, frame: Bytes) {
        debug_assert!(!self.len.masks(), "a prepared frame in a client's queue");
        let before = self.ordered_len();
        self.len.add(frame.len());
        let room = self.tail.capacity() - self.tail.len();
        if frame.len() < COPY_BELOW && frame.len() <= room {
            self.tail.extend_from_slice(&frame);
        } else {
            let head = self.tail.split().freeze();
            let segments = &mut self.spill_with(before).segments;
            if !head.is_empty() {
                segments.push_back(head);
            }
            segments.push_back(frame);
        }
        self.pushed(before, Pushed { opcode, fin: true });
    }

    /// Queues a frame whose payload `write` appends to the buffer it is given,
    /// for payloads produced in place (compressed messages). `expected_len`
    /// guesses the payload's length, to place it behind a header of the right
    /// size; a wrong guess costs one move of the payload. If `write` returns
    /// false, it must have appended nothing, and nothing is queued. In a
    /// client's queue the payload is masked once `write` is done.
    pub fn push_frame_with(
        &mut self,
        fin: bool,
        rsv: u8,
        opcode: OpCode,
        expected_len: usize,
        write: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        let before = self.ordered_len();
        let key = self.len.masks().then(random::mask_key);
        let frame = Frame {
            fin,
            rsv,
            opcode,
            key,
        };
        let Some(n) = put_frame_with(&mut self.tail, frame, expected_len, write) else {
            return false;
        };
        self.len.add(n);
        self.pushed(before, Pushed { opcode, fin });
        true
    }

    /// Queues a whole message (one frame, `fin` set) that goes out ahead of
    /// every queued message not yet started on the wire, after the replies
    /// queued before it; it waits only for the rest of a message already
    /// being written (fragmented or not). For request/response traffic mixed
    /// with bulk pushes. Never use it for a message whose payload depends on
    /// the ones queued before it (compressed with context takeover): it may
    /// reach the peer first.
    pub fn push_reply(&mut self, rsv: u8, opcode: OpCode, payload: &[u8]) {
        debug_assert!(!opcode.is_control() || payload.len() <= 125);
        match self.lane_for(opcode) {
            Lane::Ordered => {
                self.push_frame(true, rsv, opcode, payload);
                self.keep_ahead_of_replies();
            }
            Lane::Urgent => {
                let masks = self.len.masks();
                let spill = self.spill_mut();
                spill.pong = None;
                let n = put_frame(&mut spill.urgent, masks, true, rsv, opcode, payload);
                self.len.add(n);
            }
        }
    }

    /// [`WriteQueue::push_reply`] for a payload produced in place (see
    /// [`WriteQueue::push_frame_with`]); false if `write` declined.
    pub fn push_reply_with(
        &mut self,
        rsv: u8,
        opcode: OpCode,
        expected_len: usize,
        write: impl FnOnce(&mut BytesMut) -> bool,
    ) -> bool {
        match self.lane_for(opcode) {
            Lane::Ordered => {
                let pushed = self.push_frame_with(true, rsv, opcode, expected_len, write);
                self.keep_ahead_of_replies();
                pushed
            }
            Lane::Urgent => {
                let key = self.len.masks().then(random::mask_key);
                let frame = Frame {
                    fin: true,
                    rsv,
                    opcode,
                    key,
                };
                let spill = self.spill_mut();
                let Some(n) = put_frame_with(&mut spill.urgent, frame, expected_len, write) else {
                    return false;
                };
                spill.pong = None;
                self.len.add(n);
                true
            }
        }
    }

    /// Queues the answer to a ping, as a reply (see [`WriteQueue::push_reply`])
    /// unless the queue is empty. Unsent pongs at the end of the reply lane
    /// are replaced by the newest one once they reach [`PONG_BUDGET`] bytes:
    /// a peer that pings and does not read gets the answer to its latest
    /// ping, and costs no more than that. (RFC 6455 §5.5.3 allows answering
    /// only the most recent ping.) Below the budget every ping gets its pong,
    /// as Autobahn's cases 2.10 and 2.11 want, however slowly writes go: a
    /// write that would block says little about the peer on a stream with
    /// little buffering of its own (an HTTP/2 stream takes a write or two).
    pub(crate) fn push_pong(&mut self, payload: &[u8]) {
        debug_assert!(payload.len() <= 125);
        if self.is_empty() {
            self.push_frame(true, 0, OpCode::Pong, payload);
            return self.keep_ahead_of_replies();
        }
        let masks = self.len.masks();
        let spill = self.spill_mut();
        let mut replaced = 0;
        let run = spill.pong.unwrap_or(spill.urgent.len());
        if spill.urgent.len() - run >= PONG_BUDGET {
            replaced = spill.urgent.len() - run;
            spill.urgent.truncate(run);
        }
        spill.pong = Some(run);
        let n = put_frame(&mut spill.urgent, masks, true, 0, OpCode::Pong, payload);
        self.len.sub(replaced);
        self.len.add(n);
    }

    /// Queues bytes another writer began to write (what a connection
    /// handed over from another process had queued, the rest of a frame
    /// first): they count as started, so no reply or pong overtakes any of
    /// them (nobody knows where their frames begin).
    pub fn push_started(&mut self, bytes: &[u8]) {
        self.push_raw(bytes);
        self.keep_ahead_of_replies();
    }

    /// Queues raw bytes, for the HTTP handshake request or response: they
    /// count as a message of the ordered lane.
    pub fn push_raw(&mut self, bytes: &[u8]) {
        let before = self.ordered_len();
        self.tail.extend_from_slice(bytes);
        self.len.add(bytes.len());
        self.pushed(
            before,
            Pushed {
                opcode: OpCode::Binary,
                fin: true,
            },
        );
    }

    /// Moves everything queued in `other` to the end of this queue's ordered
    /// lane, in the order `other` would have written it. The bytes move as
    /// they are (already masked or not); each queue keeps its role.
    pub fn append(&mut self, other: &mut WriteQueue) {
        if other.is_empty() {
            return;
        }
        let before = self.ordered_len();
        let moved = other.take_to_send(usize::MAX);
        let WriteQueue { spill, tail, len } = moved;
        let head = self.tail.split().freeze();
        let segments = &mut self.spill_with(before).segments;
        if !head.is_empty() {
            segments.push_back(head);
        }
        if let Some(mut theirs) = spill {
            segments.append(&mut theirs.segments);
        }
        if !tail.is_empty() {
            segments.push_back(tail.freeze());
        }
        self.len.add(len.bytes());
        self.pushed(
            before,
            Pushed {
                opcode: OpCode::Binary,
                fin: true,
            },
        );
    }

    /// Fills `dst` with the queued bytes in the order they go out and returns
    /// how many slices it used. The slices stay valid until the queue is
    /// changed.
    pub fn io_slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut put = |part: &'a [u8]| {
            if part.is_empty() || n == dst.len() {
                return;
            }
            dst[n] = IoSlice::new(part);
            n += 1;
        };
        let segments = self.spill.iter().flat_map(|spill| spill.segments.iter());
        let mut ordered = segments
            .map(|b| &b[..])
            .chain(std::iter::once(&self.tail[..]));
        let Some(spill) = self.spill.as_deref().filter(|s| self.replies_may_go(s)) else {
            ordered.for_each(put);
            return n;
        };
        // The rest of a message already started, the reply lane, then the rest.
        let mut first = spill.started;
        let mut rest: &[u8] = &[];
        for part in ordered.by_ref() {
            if part.len() <= first {
                put(part);
                first -= part.len();
                continue;
            }
            put(&part[..first]);
            rest = &part[first..];
            break;
        }
        put(&spill.urgent);
        put(rest);
        ordered.for_each(put);
        n
    }

    /// Moves every queued byte, in order, to the end of `out`: for a sink
    /// that takes one buffer rather than [`WriteQueue::io_slices`] (a test, a
    /// fuzz target, a transport of your own).
    pub fn move_into(&mut self, out: &mut Vec<u8>) {
        out.reserve(self.len());
        while !self.is_empty() {
            let copied = {
                let mut slices = [IoSlice::new(&[]); 16];
                let n = self.io_slices(&mut slices);
                slices[..n].iter().for_each(|s| out.extend_from_slice(s));
                slices[..n].iter().map(|s| s.len()).sum()
            };
            self.advance(copied);
        }
    }

    /// Writes the queue through `write` (a non-blocking `writev`: it takes up
    /// to [`MAX_IOVECS`] slices and returns how many bytes it took) until the
    /// queue is empty or `write` reports `WouldBlock`. `Interrupted` is
    /// retried; any other error, or a write of nothing, is returned as it is.
    pub fn write_with(
        &mut self,
        mut write: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<Written> {
        let mut bytes = 0;
        while !self.is_empty() {
            let written = {
                let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
                let n = self.io_slices(&mut slices);
                write(&slices[..n])
            };
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.advance(n);
                    bytes += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(Written { bytes, all: false });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Written { bytes, all: true })
    }

    /// Drops the first `n` bytes in the order [`WriteQueue::io_slices`] gives
    /// them: they have been written.
    ///
    /// # Panics
    /// If `n` is more than [`WriteQueue::len`].
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.len(), "advanced past the end of the write queue");
        self.len.sub(n);
        let WriteQueue { spill, tail, len } = self;
        let Some(spill) = spill.as_deref_mut() else {
            tail.advance(n);
            return;
        };
        // The rest of a started message, the reply lane, then bytes nobody
        // had started: the writer now stands in (or after) a new message.
        let first = n.min(spill.started);
        spill.advance_ordered(tail, first);
        spill.started -= first;
        // (When replies may not go yet, the writer had only ordered bytes,
        // all of them started: `first` is all of `n`.)
        let replies = (n - first).min(spill.urgent.len());
        spill.advance_urgent(replies);
        let rest = n - first - replies;
        if rest > 0 {
            spill.advance_ordered(tail, rest);
            let ordered = len.bytes() - spill.urgent.len();
            spill.started = spill.distance_to_next_boundary(ordered);
        }
        if self.is_empty() {
            // Nothing left to order: the spill goes (an idle queue holds none).
            self.spill = None;
        }
    }

    /// Moves what goes out next into a queue of its own, for a writer whose
    /// writes own their buffers until they complete (io_uring): the rest of
    /// a message already started, the reply lane, then ordered messages up to
    /// a message boundary at least `at_least` bytes in (or everything). What
    /// stays can still be overtaken by replies; what was taken cannot. The
    /// taken queue has this queue's role and holds only the ordered lane.
    pub fn take_to_send(&mut self, at_least: usize) -> WriteQueue {
        let role = LenAndFlags(self.len.0 & LenAndFlags::MASKS);
        if self.spill.is_none() {
            // Nothing to overtake: the whole queue goes, buffer and all.
            let taken = std::mem::take(self);
            // What stays keeps the role and the open fragment, as the
            // spill's branch below does.
            self.len = taken.len.without_bytes();
            return WriteQueue {
                len: role.with_bytes(taken.len()),
                ..taken
            };
        }
        let mut taken = WriteQueue {
            len: role,
            ..WriteQueue::default()
        };
        let mut put = |piece: Bytes| {
            if !piece.is_empty() {
                taken.len.add(piece.len());
                taken.spill_with(0).segments.push_back(piece);
            }
        };
        let ordered = self.ordered_len();
        let replies_go = self
            .spill
            .as_deref()
            .is_some_and(|s| self.replies_may_go(s));
        let WriteQueue { spill, tail, len } = self;
        let spill = spill.as_deref_mut().expect("a spill");
        let first = spill.started.min(ordered);
        let replies = if replies_go { spill.urgent.len() } else { 0 };
        let min = first + at_least.saturating_sub(first + replies);
        let more = spill.boundary_at_or_after(min, ordered);
        spill.take_ordered(tail, first, &mut put);
        if replies_go {
            spill.pong = None;
            put(spill.urgent.split().freeze());
        }
        spill.take_ordered(tail, more - first, &mut put);
        spill.started = 0;
        len.sub(more + replies);
        if self.is_empty() {
            self.spill = None;
        }
        taken
    }

    /// Whether the queue has no buffer to copy frames into yet.
    pub fn needs_buffer(&self) -> bool {
        self.tail.capacity() == 0
    }

    /// Installs `buf` as the buffer frames are copied into, if the queue has none;
    /// otherwise `buf` is handed back.
    pub fn provide_buffer(&mut self, buf: BytesMut) -> Option<BytesMut> {
        if self.tail.capacity() == 0 {
            debug_assert!(buf.is_empty());
            self.tail = buf;
            None
        } else {
            Some(buf)
        }
    }

    /// Takes the copy buffer out of an empty queue, so an idle connection holds
    /// none; `None` if the queue still has bytes to write or holds no buffer.
    pub fn take_buffer(&mut self) -> Option<BytesMut> {
        if self.is_empty() && self.tail.capacity() > 0 {
            self.spill = None;
            Some(std::mem::take(&mut self.tail))
        } else {
            None
        }
    }

    /// Bytes of the ordered lane (everything but replies).
    fn ordered_len(&self) -> usize {
        self.len() - self.reply_len()
    }

    /// The spill, made if there is none: then everything in the ordered lane
    /// counts as started (nobody knows how far the writer got in it).
    fn spill_mut(&mut self) -> &mut Spill {
        self.spill_with(self.ordered_len())
    }

    /// The spill, made if there is none with the first `started` bytes of
    /// the ordered lane counting as started: for a push that makes it in the
    /// middle of a frame, whose own bytes nobody has started.
    fn spill_with(&mut self, started: usize) -> &mut Spill {
        self.spill
            .get_or_insert_with(|| Box::new(Spill::new(started)))
    }

    /// Whether the reply lane may go out after the started bytes: it holds
    /// something, and no started fragmented message is still open at the
    /// end of the ordered lane (its next fragments, not pushed yet, go
    /// first).
    fn replies_may_go(&self, spill: &Spill) -> bool {
        let open = self.len.flag(LenAndFlags::FRAGMENT_OPEN);
        let waits_for_fragments = open && spill.started >= self.ordered_len();
        !spill.urgent.is_empty() && !waits_for_fragments
    }

    /// A reply that took the ordered lane (nothing to overtake) must not be
    /// overtaken by later ones: everything up to it counts as started.
    fn keep_ahead_of_replies(&mut self) {
        let ordered = self.ordered_len();
        if let Some(spill) = self.spill.as_deref_mut() {
            spill.started = ordered;
        }
    }

    /// Which lane a reply with `opcode` goes to: the reply lane when there
    /// is something to overtake (or replies ahead of it), or when a
    /// fragmented message is open and the reply is a data frame, which may
    /// not land inside it; the ordered lane otherwise (the same place, and
    /// no spill to make).
    fn lane_for(&self, opcode: OpCode) -> Lane {
        let inside_fragments = !opcode.is_control() && self.len.flag(LenAndFlags::FRAGMENT_OPEN);
        let overtakes = self
            .spill
            .as_deref()
            .is_some_and(|spill| !spill.urgent.is_empty() || self.ordered_len() > spill.started);
        if overtakes || inside_fragments {
            Lane::Urgent
        } else {
            Lane::Ordered
        }
    }

    /// Book-keeping after a frame was pushed to the ordered lane, which held
    /// `before` bytes: whether a fragmented message is open, the rest of a
    /// message already started, and the boundaries replies may go to.
    fn pushed(&mut self, before: usize, frame: Pushed) {
        let open_before = self.len.flag(LenAndFlags::FRAGMENT_OPEN);
        let control = frame.opcode.is_control();
        let open_after = if control { open_before } else { !frame.fin };
        self.len.set(LenAndFlags::FRAGMENT_OPEN, open_after);
        let ordered = self.ordered_len();
        if let Some(spill) = self.spill.as_deref_mut() {
            if open_before && spill.started == before {
                // A started message goes on: its frames go before any reply.
                spill.started = ordered;
            }
        }
        if !open_after {
            // A message in one frame was pushed just now: nobody has
            // started it. The last frame of a fragmented one may end a
            // message that has.
            let whole = !open_before && frame.opcode != OpCode::Continuation;
            let unstarted_from = if whole { before } else { ordered };
            self.message_ended(ordered, unstarted_from);
        }
    }

    /// A message ended `ordered` bytes into the ordered lane: remember the
    /// boundary if it is far enough from the last one. A spill made for it
    /// counts the bytes before `unstarted_from` as started.
    fn message_ended(&mut self, ordered: usize, unstarted_from: usize) {
        let since = self
            .spill
            .as_deref()
            .map_or(ordered, |spill| ordered - spill.last_boundary());
        if since >= lanes::BOUNDARY_EVERY {
            self.spill_with(unstarted_from).mark(ordered);
        }
    }

    fn put_header(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload_len: usize) {
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(&mut header, fin, rsv, opcode, payload_len as u64, None);
        self.tail.extend_from_slice(&header[..n]);
        self.len.add(n);
    }
}

/// A frame's first byte and mask key.
#[derive(Clone, Copy)]
struct Frame {
    fin: bool,
    rsv: u8,
    opcode: OpCode,
    key: Option<[u8; 4]>,
}

/// Appends a whole frame to `buf` and returns its length. With `masks` (a
/// client's frame) the payload is copied behind a header with a new key,
/// then masked where it landed. (The 4 KiB aliasing detour of the server's
/// ordered copy is not taken here: replies are small, and masking rewrites
/// the bytes anyway.)
fn put_frame(
    buf: &mut BytesMut,
    masks: bool,
    fin: bool,
    rsv: u8,
    opcode: OpCode,
    payload: &[u8],
) -> usize {
    let key = masks.then(random::mask_key);
    let mut header = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&mut header, fin, rsv, opcode, payload.len() as u64, key);
    buf.reserve(n + payload.len());
    buf.extend_from_slice(&header[..n]);
    let start = buf.len();
    buf.extend_from_slice(payload);
    if let Some(key) = key {
        apply_mask(&mut buf[start..], key, 0);
    }
    n + payload.len()
}

/// Appends a frame whose payload `write` produces in place (see
/// [`WriteQueue::push_frame_with`]); its length, or `None` if `write`
/// declined (then nothing was appended).
fn put_frame_with(
    buf: &mut BytesMut,
    frame: Frame,
    expected_len: usize,
    write: impl FnOnce(&mut BytesMut) -> bool,
) -> Option<usize> {
    let Frame {
        fin,
        rsv,
        opcode,
        key,
    } = frame;
    let mut header = [0u8; MAX_HEADER_LEN];
    let guess = encode_header(&mut header, fin, rsv, opcode, expected_len as u64, key);
    let start = buf.len();
    buf.reserve(guess + expected_len);
    buf.extend_from_slice(&header[..guess]);
    if !write(buf) {
        buf.truncate(start);
        return None;
    }
    let payload_end = buf.len();
    let payload_len = payload_end - start - guess;
    let n = encode_header(&mut header, fin, rsv, opcode, payload_len as u64, key);
    if n != guess {
        if n > guess {
            buf.resize(payload_end + n - guess, 0);
        }
        buf.copy_within(start + guess..payload_end, start + n);
        buf.truncate(start + n + payload_len);
    }
    buf[start..start + n].copy_from_slice(&header[..n]);
    if let Some(key) = key {
        apply_mask(&mut buf[start + n..], key, 0);
    }
    Some(n + payload_len)
}

/// For tests (this crate's and the drivers'): a non-blocking vectored write
/// into `wire` that takes `budget` bytes in all, then would block, as a
/// socket whose peer stops reading.
#[doc(hidden)]
pub fn write_at_most(
    mut budget: usize,
    wire: &mut Vec<u8>,
) -> impl FnMut(&[IoSlice<'_>]) -> io::Result<usize> + '_ {
    move |slices| {
        let n = slices.iter().map(|s| s.len()).sum::<usize>().min(budget);
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        for s in slices {
            let k = s.len().min(budget);
            wire.extend_from_slice(&s[..k]);
            budget -= k;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
