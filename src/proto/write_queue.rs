//! The outbound byte queue: frames waiting to be written, in order.
//!
//! Small frames are copied into one contiguous `tail` buffer, so that everything
//! produced while handling one read (echoes, pongs, a close) is written by one
//! `write`. Large payloads handed over as `Bytes` are not copied: the queue holds
//! them as separate segments and the backend writes all segments with one
//! `writev`. The queue knows nothing about sockets; the backend asks for
//! [`WriteQueue::io_slices`] and reports progress with [`WriteQueue::advance`].
//!
//! The queue also knows which end of the connection writes into it: a
//! client's queue ([`WriteQueue::with_role`]) masks every frame pushed into
//! it with a fresh key, so nothing that sends (the session's pongs and close
//! frames, a handle's messages, the compressor) has to think about masking.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::{Buf, Bytes, BytesMut};

use super::frame::{MAX_HEADER_LEN, OpCode, encode_header};
use super::mask::apply_mask;
use super::random;
use super::role::Role;

/// Shared payloads up to this size are copied into the tail instead of being
/// queued as their own segment: a copy of a few hundred bytes is cheaper than an
/// extra iovec and a reference count.
const COPY_BELOW: usize = 512;

/// Copies at least this long are checked for "4K aliasing" (see
/// [`WriteQueue::push_frame`]); shorter ones do not use the string-copy path.
const ALIASING_CHECK_FROM: usize = 2048;

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
    /// Segments that come before `tail`, oldest first. Boxed and made only
    /// when needed: most queues never hold one, and every idle connection
    /// has a queue.
    #[allow(
        clippy::box_collection,
        reason = "an absent box is 8 bytes, an empty VecDeque 32, in every connection"
    )]
    segments: Option<Box<VecDeque<Bytes>>>,
    /// Small frames, coalesced. Always written after `segments`.
    tail: BytesMut,
    /// Bytes queued in `segments` and `tail` together, and the role.
    len: LengthAndRole,
}

/// How many bytes are queued, with whether frames are masked (the client
/// role) in the top bit of the same word.
///
/// A field of its own would cost 8 bytes in every server connection's
/// `ConnShared`, which holds a queue and is 184 bytes (200 in its `Arc`),
/// and would move it into the next allocation size class for nothing: no
/// queue can hold 2^63 bytes (on 64-bit targets), so the top bit is free.
#[derive(Clone, Copy, Debug, Default)]
struct LengthAndRole(usize);

impl LengthAndRole {
    const MASKS: usize = 1 << (usize::BITS - 1);

    fn empty(role: Role) -> Self {
        match role {
            Role::Server => LengthAndRole(0),
            Role::Client => LengthAndRole(Self::MASKS),
        }
    }

    fn bytes(self) -> usize {
        self.0 & !Self::MASKS
    }

    fn masks(self) -> bool {
        self.0 & Self::MASKS != 0
    }

    fn add(&mut self, n: usize) {
        debug_assert!(self.bytes() + n < Self::MASKS, "a queue of 2^63 bytes");
        self.0 += n;
    }

    fn sub(&mut self, n: usize) {
        debug_assert!(n <= self.bytes());
        self.0 -= n;
    }

    fn clear(&mut self) {
        self.0 &= Self::MASKS;
    }
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
            segments: None,
            tail: BytesMut::new(),
            len: LengthAndRole::empty(role),
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

    /// Bytes waiting to be written.
    pub fn len(&self) -> usize {
        self.len.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        if self.len.masks() {
            return self.push_masked_frame(fin, rsv, opcode, payload);
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
                self.segments().push_back(head);
                let pad = 64 - ahead;
                self.tail.extend_from_slice(&[0; 64][..pad]);
                self.tail.advance(pad);
            }
        }
        self.tail.extend_from_slice(payload);
        self.len.add(payload.len());
    }

    /// A client's frame: the payload is copied behind a header with a new
    /// key, then masked where it landed. (The 4 KiB aliasing detour of the
    /// server's copy is not taken: masking rewrites the bytes anyway.)
    fn push_masked_frame(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload: &[u8]) {
        let key = random::mask_key();
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut header,
            fin,
            rsv,
            opcode,
            payload.len() as u64,
            Some(key),
        );
        self.tail.reserve(n + payload.len());
        self.tail.extend_from_slice(&header[..n]);
        let start = self.tail.len();
        self.tail.extend_from_slice(payload);
        apply_mask(&mut self.tail[start..], key, 0);
        self.len.add(n + payload.len());
    }

    /// Queues a frame whose payload is shared: large payloads are not copied
    /// by a server. A client's queue copies every payload, because masking
    /// changes the bytes and other holders of a `Bytes` must not see that.
    pub fn push_frame_shared(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload: Bytes) {
        if payload.len() < COPY_BELOW || self.len.masks() {
            return self.push_frame(fin, rsv, opcode, &payload);
        }
        self.put_header(fin, rsv, opcode, payload.len());
        self.len.add(payload.len());
        let head = self.tail.split().freeze();
        let segments = self.segments();
        segments.push_back(head);
        segments.push_back(payload);
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
        let key = self.len.masks().then(random::mask_key);
        let mut header = [0u8; MAX_HEADER_LEN];
        let guess = encode_header(&mut header, fin, rsv, opcode, expected_len as u64, key);
        let start = self.tail.len();
        self.tail.reserve(guess + expected_len);
        self.tail.extend_from_slice(&header[..guess]);
        if !write(&mut self.tail) {
            self.tail.truncate(start);
            return false;
        }
        let payload_end = self.tail.len();
        let payload_len = payload_end - start - guess;
        let n = encode_header(&mut header, fin, rsv, opcode, payload_len as u64, key);
        if n != guess {
            if n > guess {
                self.tail.resize(payload_end + n - guess, 0);
            }
            self.tail.copy_within(start + guess..payload_end, start + n);
            self.tail.truncate(start + n + payload_len);
        }
        self.tail[start..start + n].copy_from_slice(&header[..n]);
        if let Some(key) = key {
            apply_mask(&mut self.tail[start + n..], key, 0);
        }
        self.len.add(n + payload_len);
        true
    }

    /// Queues raw bytes, for the HTTP handshake response.
    pub fn push_raw(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        self.len.add(bytes.len());
    }

    /// Moves everything queued in `other` to the end of this queue. The
    /// bytes move as they are (already masked or not); each queue keeps its
    /// role.
    pub fn append(&mut self, other: &mut WriteQueue) {
        if other.is_empty() {
            return;
        }
        match other.segments.take() {
            None => self.tail.extend_from_slice(&other.tail),
            Some(mut theirs) => {
                let head = self.tail.split().freeze();
                let segments = self.segments();
                if !head.is_empty() {
                    segments.push_back(head);
                }
                segments.append(&mut theirs);
                if !other.tail.is_empty() {
                    segments.push_back(other.tail.split().freeze());
                }
            }
        }
        self.len.add(other.len());
        other.tail.clear();
        other.len.clear();
    }

    /// Fills `dst` with the queued bytes in order and returns how many slices it
    /// used. The slices stay valid until the queue is changed.
    pub fn io_slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let parts = self
            .segments
            .iter()
            .flat_map(|segments| segments.iter())
            .map(|b| &b[..])
            .chain(std::iter::once(&self.tail[..]));
        for part in parts.filter(|p| !p.is_empty()) {
            if n == dst.len() {
                break;
            }
            dst[n] = IoSlice::new(part);
            n += 1;
        }
        n
    }

    /// Moves every queued byte, in order, to the end of `out`: for a sink
    /// that takes one buffer rather than [`WriteQueue::io_slices`] (a test, a
    /// fuzz target, a transport of your own).
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
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

    /// Drops the first `n` queued bytes: they have been written.
    ///
    /// # Panics
    /// If `n` is more than [`WriteQueue::len`].
    pub fn advance(&mut self, mut n: usize) {
        assert!(n <= self.len(), "advanced past the end of the write queue");
        self.len.sub(n);
        if let Some(segments) = &mut self.segments {
            while n > 0 {
                let Some(front) = segments.front_mut() else {
                    break;
                };
                if front.len() > n {
                    front.advance(n);
                    return;
                }
                n -= front.len();
                segments.pop_front();
            }
            // Drop emptied segments so the next `io_slices` starts at real data.
            while segments.front().is_some_and(|s| s.is_empty()) {
                segments.pop_front();
            }
            if segments.is_empty() {
                self.segments = None;
            }
        }
        self.tail.advance(n);
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
            self.segments = None;
            Some(std::mem::take(&mut self.tail))
        } else {
            None
        }
    }

    fn segments(&mut self) -> &mut VecDeque<Bytes> {
        self.segments.get_or_insert_with(Box::default)
    }

    fn put_header(&mut self, fin: bool, rsv: u8, opcode: OpCode, payload_len: usize) {
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(&mut header, fin, rsv, opcode, payload_len as u64, None);
        self.tail.extend_from_slice(&header[..n]);
        self.len.add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::frame::{DecodeRules, FrameHeader, decode_header};

    #[test]
    fn large_copies_never_land_just_ahead_of_their_source() {
        // Sources at every offset within 64 bytes, into tails at every offset:
        // the bytes written are the same, the copy never starts 1-63 bytes ahead.
        let source = vec![0xabu8; 5000 + 64];
        for src_offset in 0..64 {
            for prefix in [0usize, 1, 3, 60] {
                let mut q = WriteQueue::new();
                q.provide_buffer(BytesMut::with_capacity(16 * 1024));
                q.push_raw(&vec![b'x'; prefix]);
                let payload = &source[src_offset..src_offset + 5000];
                q.push_frame(true, 0, OpCode::Binary, payload);
                let copy = q.tail.as_ptr() as usize + q.tail.len() - payload.len();
                let ahead = copy.wrapping_sub(payload.as_ptr() as usize) % 4096;
                assert!(
                    !(1..64).contains(&ahead),
                    "src {src_offset} prefix {prefix}"
                );
                let mut expected = vec![b'x'; prefix];
                let mut header = [0u8; MAX_HEADER_LEN];
                let n = encode_header(&mut header, true, 0, OpCode::Binary, 5000, None);
                expected.extend_from_slice(&header[..n]);
                expected.extend_from_slice(payload);
                assert_eq!(drain(&mut q, 1000), expected);
            }
        }
    }

    fn drain(q: &mut WriteQueue, max_per_write: usize) -> Vec<u8> {
        let mut written = Vec::new();
        while !q.is_empty() {
            let mut slices = [IoSlice::new(&[]); 4];
            let n = q.io_slices(&mut slices);
            let mut budget = max_per_write;
            let mut took = 0;
            for s in &slices[..n] {
                let k = s.len().min(budget);
                written.extend_from_slice(&s[..k]);
                budget -= k;
                took += k;
            }
            q.advance(took);
        }
        written
    }

    #[test]
    fn keeps_frame_order_across_copied_and_shared_payloads() {
        let big = Bytes::from(vec![0xAB; 4000]);
        let mut q = WriteQueue::new();
        q.push_frame(true, 0, OpCode::Text, b"one");
        q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
        q.push_frame(true, 0, OpCode::Pong, b"p");
        q.push_frame_shared(true, 0, OpCode::Binary, Bytes::from_static(b"tiny"));

        let mut expected = vec![0x81, 3];
        expected.extend_from_slice(b"one");
        expected.extend_from_slice(&[0x82, 126, 0x0F, 0xA0]);
        expected.extend_from_slice(&big);
        expected.extend_from_slice(&[0x8A, 1, b'p', 0x82, 4]);
        expected.extend_from_slice(b"tiny");
        assert_eq!(q.len(), expected.len());

        for max in [1usize, 3, 7, 1000, usize::MAX] {
            let mut copy = WriteQueue::new();
            copy.push_frame(true, 0, OpCode::Text, b"one");
            copy.push_frame_shared(true, 0, OpCode::Binary, big.clone());
            copy.push_frame(true, 0, OpCode::Pong, b"p");
            copy.push_frame_shared(true, 0, OpCode::Binary, Bytes::from_static(b"tiny"));
            assert_eq!(drain(&mut copy, max), expected, "{max} bytes per write");
        }
        let mut all = vec![0xEE];
        q.drain_into(&mut all);
        assert_eq!((all[0], &all[1..]), (0xEE, &expected[..]));
        assert!(q.is_empty());
    }

    #[test]
    fn large_shared_payloads_are_not_copied() {
        let big = Bytes::from(vec![1u8; 10_000]);
        let mut q = WriteQueue::new();
        q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
        let mut slices = [IoSlice::new(&[]); 4];
        let n = q.io_slices(&mut slices);
        assert_eq!(n, 2, "header and payload");
        assert_eq!(slices[1].as_ptr(), big.as_ptr());
    }

    #[test]
    fn frames_written_in_place_get_the_header_their_length_needs() {
        // Guesses below, at and above each header-size boundary, and payloads
        // that end up shorter or longer than guessed.
        for (guess, actual) in [
            (10, 10),
            (10, 125),
            (10, 126),
            (200, 100),
            (200, 70_000),
            (70_000, 200),
            (70_000, 65_536),
            (0, 0),
        ] {
            let mut q = WriteQueue::new();
            q.push_raw(b"before");
            let payload: Vec<u8> = (0..actual).map(|i| i as u8).collect();
            assert!(
                q.push_frame_with(true, RSV1_BITS, OpCode::Text, guess, |buf| {
                    buf.extend_from_slice(&payload);
                    true
                })
            );
            q.push_raw(b"after");
            let mut expected = b"before".to_vec();
            let mut header = [0u8; MAX_HEADER_LEN];
            let n = encode_header(
                &mut header,
                true,
                RSV1_BITS,
                OpCode::Text,
                actual as u64,
                None,
            );
            expected.extend_from_slice(&header[..n]);
            expected.extend_from_slice(&payload);
            expected.extend_from_slice(b"after");
            assert_eq!(q.len(), expected.len(), "{guess} then {actual}");
            assert_eq!(drain(&mut q, usize::MAX), expected, "{guess} then {actual}");
        }
        let mut q = WriteQueue::new();
        q.push_raw(b"x");
        assert!(!q.push_frame_with(true, 0, OpCode::Binary, 50, |_| false));
        assert_eq!(drain(&mut q, usize::MAX), b"x");
    }

    const RSV1_BITS: u8 = 0b100;

    #[test]
    fn append_moves_everything_in_order() {
        let mut a = WriteQueue::new();
        a.push_raw(b"a");
        let mut b = WriteQueue::new();
        b.push_raw(b"b");
        b.push_frame_shared(true, 0, OpCode::Binary, Bytes::from(vec![2u8; 600]));
        b.push_raw(b"c");
        a.append(&mut b);
        assert!(b.is_empty());
        let out = drain(&mut a, usize::MAX);
        assert_eq!(&out[..2], b"ab");
        assert_eq!(out.len(), 2 + 4 + 600 + 1);
        assert_eq!(out[out.len() - 1], b'c');
    }

    /// Every frame in `bytes`, checked to be masked, as (header, unmasked
    /// payload).
    fn client_frames(bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut frames = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let rules = DecodeRules {
                allowed_rsv: RSV1_BITS,
                ..DecodeRules::SERVER
            };
            let (header, len) = decode_header(rest, rules)
                .expect("a masked frame")
                .expect("a whole frame");
            let end = len + header.payload_len as usize;
            let mut payload = rest[len..end].to_vec();
            apply_mask(&mut payload, header.mask.unwrap(), 0);
            frames.push((header, payload));
            rest = &rest[end..];
        }
        frames
    }

    #[test]
    fn a_client_queue_masks_every_kind_of_push_with_its_own_key() {
        let big = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let small = Bytes::from_static(b"small shared");
        let written: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let mut q = WriteQueue::with_role(Role::Client);
        assert_eq!(q.role(), Role::Client);
        q.push_frame(true, 0, OpCode::Text, b"copied");
        q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
        q.push_frame_shared(false, 0, OpCode::Binary, small.clone());
        q.push_frame(true, 0, OpCode::Continuation, b"");
        q.push_frame(true, 0, OpCode::Ping, b"ping");
        // A guess too small for the header the payload needs.
        assert!(
            q.push_frame_with(true, RSV1_BITS, OpCode::Binary, 10, |buf| {
                buf.extend_from_slice(&written);
                true
            })
        );
        assert!(!q.push_frame_with(true, 0, OpCode::Binary, 10, |_| false));
        let len = q.len();
        let mut bytes = Vec::new();
        q.drain_into(&mut bytes);
        assert_eq!(bytes.len(), len);
        let frames = client_frames(&bytes);
        let payloads: Vec<&[u8]> = frames.iter().map(|(_, p)| &p[..]).collect();
        assert_eq!(
            payloads,
            [&b"copied"[..], &big, &small, b"", b"ping", &written]
        );
        assert_eq!(frames[5].0.rsv, RSV1_BITS);
        assert!(!frames[2].0.fin);
        let mut keys: Vec<[u8; 4]> = frames.iter().map(|(h, _)| h.mask.unwrap()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), frames.len(), "a fresh key per frame");
        // The shared payloads were copied to be masked, not masked in place.
        assert_eq!(big[..4], [0, 1, 2, 3]);
        assert_eq!(&small[..], b"small shared");
    }

    #[test]
    fn a_client_queue_keeps_its_role_through_draining_and_appending() {
        let mut q = WriteQueue::with_role(Role::Client);
        q.push_frame(true, 0, OpCode::Text, b"x");
        let mut server = WriteQueue::new();
        server.push_raw(b"raw");
        q.append(&mut server);
        assert_eq!((q.role(), server.role()), (Role::Client, Role::Server));
        assert_eq!(q.len(), 2 + 4 + 1 + 3);
        q.advance(q.len());
        assert!(q.is_empty());
        assert_eq!(q.role(), Role::Client);
        q.push_frame(true, 0, OpCode::Text, b"y");
        let mut bytes = Vec::new();
        q.drain_into(&mut bytes);
        assert_eq!(client_frames(&bytes)[0].1, b"y");
        assert_eq!(WriteQueue::default().role(), Role::Server);
    }

    #[test]
    fn the_role_costs_a_server_queue_no_space() {
        // Every idle connection holds a queue in its `ConnShared`.
        assert_eq!(size_of::<WriteQueue>(), 48);
    }

    #[test]
    fn the_copy_buffer_can_be_taken_out_and_given_back() {
        let mut q = WriteQueue::new();
        assert!(q.needs_buffer());
        assert!(q.provide_buffer(BytesMut::with_capacity(64)).is_none());
        q.push_raw(b"xy");
        assert!(q.take_buffer().is_none(), "not while bytes are queued");
        q.advance(2);
        let buf = q.take_buffer().expect("empty queue gives its buffer back");
        assert!(buf.capacity() > 0);
        assert!(q.needs_buffer());
    }
}
