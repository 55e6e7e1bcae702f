//! [`Buffer`]: a stream's bytes one way (received and unread, or written
//! and unsent), copied in once and never moved again (or given as they
//! are): it grows by blocks, not by reallocating, and frames take their
//! payloads from it as slices.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use super::output::Transmit;

/// The largest block a buffer allocates. A long write fills several.
pub(super) const BLOCK: usize = 32 * 1024;

/// A piece of a frame's payload (the part of it in one block) at least
/// this long goes to the output as a slice of its block; a shorter one is
/// copied. A slice keeps its whole block alive until written, so what the
/// output keeps alive of the blocks is at most four times what it holds. A
/// buffer given to [`push`](Buffer::push) keeps its own allocation, of any
/// size (the caller's).
pub(super) const SLICE_FROM: usize = BLOCK / 4;

/// The smallest block: a stream that moves a few bytes at a time holds
/// little.
const FIRST_BLOCK: usize = 64;

/// A stream's bytes one way, in order: the full blocks (or what is left of
/// them) in `full`, then `tail`, the block being filled.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    full: VecDeque<Bytes>,
    tail: BytesMut,
    /// The bytes in `full` and `tail` together.
    len: usize,
}

impl Buffer {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`, copied into the tail block and, when it is full,
    /// into new ones: each the power of two at or above twice what the
    /// buffer holds, from 64 bytes up to [`BLOCK`].
    pub(super) fn copy(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            let room = self.tail.capacity() - self.tail.len();
            if room == 0 {
                if !self.tail.is_empty() {
                    // Full: nothing of its block is left to fill.
                    self.full.push_back(std::mem::take(&mut self.tail).freeze());
                }
                let block = (2 * self.len).next_power_of_two().clamp(FIRST_BLOCK, BLOCK);
                self.tail = BytesMut::with_capacity(block);
                continue;
            }
            let n = room.min(bytes.len());
            self.tail.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    /// Appends `bytes` as they are, after what is in the tail block; a
    /// piece shorter than [`SLICE_FROM`] is copied instead.
    pub(super) fn push(&mut self, bytes: Bytes) {
        if bytes.len() < SLICE_FROM {
            self.copy(&bytes);
            return;
        }
        if !self.tail.is_empty() {
            self.full.push_back(self.tail.split().freeze());
        }
        self.len += bytes.len();
        self.full.push_back(bytes);
    }

    /// Takes up to `max` of the first bytes as they are: the front of one
    /// block.
    pub(super) fn read_bytes(&mut self, max: usize) -> Bytes {
        self.split_front(max.min(self.front().len()))
    }

    /// Moves the first bytes into `buf`, as many as fit; returns how many.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.len);
        let mut filled = 0;
        while filled < n {
            let front = self.front();
            let take = (n - filled).min(front.len());
            buf[filled..filled + take].copy_from_slice(&front[..take]);
            self.advance_front(take);
            filled += take;
        }
        n
    }

    /// Moves the first `n` bytes into `out` as a frame's payload: slices of
    /// their blocks where a piece is at least [`SLICE_FROM`] long, copied
    /// otherwise.
    pub(super) fn transmit(&mut self, n: usize, out: &mut impl Transmit) {
        assert!(n <= self.len, "framed past the buffer's end");
        let mut left = n;
        while left > 0 {
            let take = left.min(self.front().len());
            if take >= SLICE_FROM {
                out.put_buffer(self.split_front(take));
            } else {
                out.put_slice(&self.front()[..take]);
                self.advance_front(take);
            }
            left -= take;
        }
    }

    /// The first bytes, in one block: the front full block's, or the
    /// tail's. Not empty unless the buffer is.
    pub(super) fn front(&self) -> &[u8] {
        self.full.front().map_or(&self.tail[..], |block| &block[..])
    }

    /// Takes the first `k` bytes of [`front`](Buffer::front) as they are.
    fn split_front(&mut self, k: usize) -> Bytes {
        let bytes = match self.full.front_mut() {
            Some(block) => {
                let bytes = block.split_to(k);
                if block.is_empty() {
                    self.full.pop_front();
                }
                bytes
            }
            None => self.tail.split_to(k).freeze(),
        };
        self.taken(k);
        bytes
    }

    /// Drops the first `k` bytes of [`front`](Buffer::front).
    fn advance_front(&mut self, k: usize) {
        match self.full.front_mut() {
            Some(block) => {
                block.advance(k);
                if block.is_empty() {
                    self.full.pop_front();
                }
            }
            None => self.tail.advance(k),
        }
        self.taken(k);
    }

    /// Lets go of everything; returns how many bytes that was.
    pub(super) fn clear(&mut self) -> usize {
        let len = self.len;
        *self = Buffer::default();
        len
    }

    /// `n` bytes went: an empty buffer holds no allocation, so an idle
    /// stream costs its two buffers' 72 bytes each and nothing more.
    fn taken(&mut self, n: usize) {
        self.len -= n;
        if self.len == 0 {
            *self = Buffer::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use super::super::Output;
    use super::*;

    fn pattern(length: usize, seed: usize) -> Vec<u8> {
        (0..length).map(|j| (seed * 31 + j) as u8).collect()
    }

    #[test]
    fn reads_what_was_copied_in_order_across_every_block() {
        let mut buffer = Buffer::default();
        let mut written = Vec::new();
        for (i, length) in [3usize, 50_000, 7, 1, 90_000, 2, 4].into_iter().enumerate() {
            let bytes = pattern(length, i);
            buffer.copy(&bytes);
            written.extend_from_slice(&bytes);
        }
        assert_eq!(buffer.len(), written.len());
        let mut read = Vec::new();
        let mut step = 1;
        while !buffer.is_empty() {
            let mut buf = vec![0u8; step];
            let n = buffer.read(&mut buf);
            assert!(n > 0 && n <= step);
            read.extend_from_slice(&buf[..n]);
            step = step * 2 + 1;
        }
        assert_eq!(read, written);
        assert_eq!(buffer.read(&mut [0u8; 8]), 0);
    }

    /// Random copies, pushes, reads and frames against a plain byte queue:
    /// the same bytes in the same order, every block within [`BLOCK`], and
    /// what went to the output unchanged by what was written after it.
    #[test]
    // Bytes moved in order, no `unsafe` of ours: nothing for Miri to find
    // that its other tests of `Bytes` do not, at minutes of its time.
    #[cfg_attr(miri, ignore)]
    fn random_use_keeps_every_byte_in_order() {
        use rand::{RngExt, SeedableRng, rngs::StdRng};
        for round in 0..crate::rounds(40) {
            let mut rng = StdRng::seed_from_u64(round as u64);
            let mut buffer = Buffer::default();
            let mut model = VecDeque::new();
            let mut out = Output::new();
            let mut framed = Vec::new();
            let mut next = 0u8;
            for _ in 0..200 {
                let size = match rng.random_range(0..4) {
                    0 => rng.random_range(0..100),
                    1 => rng.random_range(0..SLICE_FROM * 2),
                    _ => rng.random_range(0..3 * BLOCK),
                };
                match rng.random_range(0..5) {
                    0 | 1 => {
                        let bytes: Vec<u8> = (0..size)
                            .map(|_| {
                                next = next.wrapping_add(1);
                                next
                            })
                            .collect();
                        model.extend(bytes.iter().copied());
                        if rng.random_range(0..2) == 0 {
                            buffer.copy(&bytes);
                        } else {
                            buffer.push(Bytes::from(bytes));
                        }
                    }
                    2 => {
                        let mut buf = vec![0u8; size];
                        let n = buffer.read(&mut buf);
                        let want: Vec<u8> = model.drain(..n).collect();
                        assert_eq!(&buf[..n], &want[..], "round {round}");
                    }
                    3 => {
                        let bytes = buffer.read_bytes(size);
                        let want: Vec<u8> = model.drain(..bytes.len()).collect();
                        assert_eq!(&bytes[..], &want[..], "round {round}");
                    }
                    _ => {
                        let n = size.min(buffer.len());
                        buffer.transmit(n, &mut out);
                        framed.extend(model.drain(..n));
                    }
                }
                assert_eq!(buffer.len(), model.len(), "round {round}");
                assert!(buffer.tail.capacity() <= BLOCK, "round {round}");
            }
            let mut rest = vec![0u8; buffer.len()];
            buffer.read(&mut rest);
            assert_eq!(rest, model.drain(..).collect::<Vec<u8>>(), "round {round}");
            assert_eq!(out.copy_to_bytes(out.remaining()), framed, "round {round}");
        }
    }

    #[test]
    fn grows_by_blocks_it_never_moves() {
        let mut buffer = Buffer::default();
        buffer.copy(&[1; 10]);
        let first = buffer.tail.as_ptr();
        assert_eq!(buffer.tail.capacity(), FIRST_BLOCK);
        buffer.copy(&[2; 3 * BLOCK]);
        // The first block kept its place; every block is at most BLOCK.
        assert_eq!(buffer.full.front().unwrap().as_ptr(), first);
        assert!(buffer.full.iter().all(|block| block.len() <= BLOCK));
        assert!(buffer.tail.capacity() <= BLOCK);
        assert_eq!(buffer.len(), 10 + 3 * BLOCK);
        // Emptied, it holds nothing, however it was emptied.
        let mut sink = vec![0u8; buffer.len()];
        buffer.read(&mut sink);
        assert_eq!((buffer.tail.capacity(), buffer.full.capacity()), (0, 0));
        buffer.copy(&[3; 100]);
        buffer.read(&mut [0u8; 60]);
        buffer.read_bytes(40);
        assert!(buffer.is_empty());
        assert_eq!((buffer.tail.capacity(), buffer.full.capacity()), (0, 0));
    }

    #[test]
    fn transmits_long_pieces_as_slices_and_short_ones_copied() {
        let mut buffer = Buffer::default();
        let written = pattern(2 * BLOCK, 5);
        buffer.copy(&written);
        let mut out = Output::new();
        // Across a block's end: the part in each block is a slice.
        buffer.transmit(BLOCK + SLICE_FROM, &mut out);
        // A short piece is copied; a long one from the tail is a slice.
        buffer.transmit(100, &mut out);
        let rest = buffer.len();
        buffer.transmit(rest, &mut out);
        assert!(buffer.is_empty());
        let mut slices = [IoSlice::new(&[]); 8];
        let n = out.chunks_vectored(&mut slices);
        let gathered: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(gathered, written);
        let in_blocks = slices[..n]
            .iter()
            .filter(|slice| slice.len() >= SLICE_FROM)
            .count();
        assert!(in_blocks >= 3, "{n} pieces, {in_blocks} long");
    }
}
