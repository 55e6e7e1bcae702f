//! [`Buffer`]: a stream's bytes one way (received and unread, or written
//! and unsent), copied in once and never moved again: it grows by blocks,
//! not by reallocating, and frames take their payloads from it as slices.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use super::output::Transmit;

/// The largest block a buffer allocates. A long write fills several.
pub(super) const BLOCK: usize = 32 * 1024;

/// A frame's payload at least this long goes to the output as a slice of
/// its block; a shorter one is copied. A slice keeps its whole block alive
/// until written, so what the output keeps alive is at most eight times
/// what it holds.
pub(super) const SLICE_FROM: usize = BLOCK / 8;

/// A buffer emptied with a block larger than this lets it go, so an idle
/// stream holds no more than a small one.
const KEEP_CAPACITY: usize = 4096;

/// The smallest block: a stream that moves a few bytes at a time holds
/// little.
const FIRST_BLOCK: usize = 64;

/// A stream's bytes one way, in order: the full blocks (or what is left of
/// them) in `full`, then `tail`, the block being filled.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    full: VecDeque<Bytes>,
    tail: BytesMut,
    /// The size of the tail's block (its capacity counts only what is
    /// past what was taken).
    block: usize,
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
    /// into new ones: each twice what the buffer holds, up to [`BLOCK`].
    pub(super) fn copy(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            let room = self.tail.capacity() - self.tail.len();
            if room == 0 {
                if !self.tail.is_empty() {
                    self.full.push_back(self.tail.split().freeze());
                }
                self.block = (2 * self.len).next_power_of_two().clamp(FIRST_BLOCK, BLOCK);
                self.tail = BytesMut::with_capacity(self.block);
                continue;
            }
            let n = room.min(bytes.len());
            self.tail.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    /// Moves the first bytes into `buf`, as many as fit; returns how many.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.len);
        let mut filled = 0;
        while filled < n {
            let want = n - filled;
            let Some(front) = self.full.front_mut() else {
                buf[filled..n].copy_from_slice(&self.tail[..want]);
                self.tail.advance(want);
                break;
            };
            let take = want.min(front.len());
            buf[filled..filled + take].copy_from_slice(&front[..take]);
            front.advance(take);
            filled += take;
            if front.is_empty() {
                self.full.pop_front();
            }
        }
        self.taken(n);
        n
    }

    /// Moves the first `n` bytes into `out` as a frame's payload: slices of
    /// their blocks where a piece is at least [`SLICE_FROM`] long, copied
    /// otherwise.
    pub(super) fn transmit(&mut self, n: usize, out: &mut impl Transmit) {
        assert!(n <= self.len, "framed past the buffer's end");
        let mut left = n;
        while left > 0 {
            let Some(front) = self.full.front_mut() else {
                if left >= SLICE_FROM {
                    out.put_buffer(self.tail.split_to(left).freeze());
                } else {
                    out.put_slice(&self.tail[..left]);
                    self.tail.advance(left);
                }
                break;
            };
            let take = left.min(front.len());
            if take >= SLICE_FROM {
                out.put_buffer(front.split_to(take));
            } else {
                out.put_slice(&front[..take]);
                front.advance(take);
            }
            left -= take;
            if front.is_empty() {
                self.full.pop_front();
            }
        }
        self.taken(n);
    }

    /// Lets go of everything; returns how many bytes that was.
    pub(super) fn clear(&mut self) -> usize {
        let len = self.len;
        *self = Buffer::default();
        len
    }

    /// `n` bytes went: an empty buffer keeps no more than a small block.
    fn taken(&mut self, n: usize) {
        self.len -= n;
        if self.len == 0 && self.block > KEEP_CAPACITY {
            self.tail = BytesMut::new();
            self.block = 0;
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
        // Emptied, it lets a large block go.
        let mut sink = vec![0u8; buffer.len()];
        buffer.read(&mut sink);
        assert_eq!(buffer.tail.capacity(), 0);
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
