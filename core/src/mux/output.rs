//! [`Output`]: frames waiting for the transport, payloads given as slices
//! of a stream's send buffer kept as they are (no copy), written out
//! vectored.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Where [`Mux::poll_transmit`](super::Mux::poll_transmit) puts frames.
///
/// A `BytesMut` takes them copied, one after the other; an [`Output`]
/// keeps a payload given as a buffer as it is, for a vectored write.
pub trait Transmit {
    /// Bytes put and not taken out yet.
    fn len(&self) -> usize;

    /// Whether nothing is put.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes` (a frame's header, a window update, part of a
    /// stream's send buffer), copied.
    fn put_slice(&mut self, bytes: &[u8]);

    /// Appends a frame's payload given as it is (a slice of a stream's
    /// send buffer).
    fn put_buffer(&mut self, buffer: Bytes);
}

impl Transmit for BytesMut {
    fn len(&self) -> usize {
        BytesMut::len(self)
    }

    fn put_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn put_buffer(&mut self, buffer: Bytes) {
        self.extend_from_slice(&buffer);
    }
}

/// Payloads shorter than this are copied beside the headers: an iovec
/// each would cost the kernel more than the copy.
const COPY_BELOW: usize = 512;

/// What `head` grows by when full: headers for hundreds of frames per
/// allocation (split off behind a payload, what it holds goes with the
/// write, and the rest of it takes the next headers).
const HEAD_GROWTH: usize = 4096;

/// Frames waiting for the transport, in order, as a [`Buf`]: `chunks`
/// first, then `head`. What is put as a slice, and buffers shorter than
/// 512 bytes, are copied into `head`; a longer buffer moves what `head`
/// holds into `chunks` (split off, not copied) and follows it there. Written with
/// [`chunks_vectored`](Buf::chunks_vectored) (a `writev`), or taken as
/// contiguous pieces with [`copy_to_bytes`](Buf::copy_to_bytes), which
/// copies only when a piece spans chunks.
#[derive(Debug, Default)]
pub struct Output {
    chunks: VecDeque<Bytes>,
    head: BytesMut,
    /// The bytes in `chunks`.
    queued: usize,
}

impl Output {
    /// An empty output.
    pub fn new() -> Output {
        Output::default()
    }

    /// Appends a long payload after what `head` holds.
    fn push(&mut self, payload: Bytes) {
        if !self.head.is_empty() {
            let head = self.head.split().freeze();
            self.queued += head.len();
            self.chunks.push_back(head);
        }
        self.queued += payload.len();
        self.chunks.push_back(payload);
    }
}

impl Transmit for Output {
    fn len(&self) -> usize {
        self.queued + self.head.len()
    }

    fn put_slice(&mut self, bytes: &[u8]) {
        if self.head.capacity() - self.head.len() < bytes.len() {
            self.head.reserve(bytes.len().max(HEAD_GROWTH));
        }
        self.head.extend_from_slice(bytes);
    }

    fn put_buffer(&mut self, buffer: Bytes) {
        if buffer.len() < COPY_BELOW {
            self.put_slice(&buffer);
        } else {
            self.push(buffer);
        }
    }
}

impl Buf for Output {
    fn remaining(&self) -> usize {
        Transmit::len(self)
    }

    fn chunk(&self) -> &[u8] {
        match self.chunks.front() {
            Some(chunk) => chunk,
            None => &self.head,
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let pieces = self.chunks.iter().map(|chunk| &chunk[..]);
        let pieces = pieces.chain(std::iter::once(&self.head[..]));
        let mut n = 0;
        for (slot, piece) in dst.iter_mut().zip(pieces.filter(|piece| !piece.is_empty())) {
            *slot = IoSlice::new(piece);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining(), "advanced past the output's end");
        while cnt > 0 {
            let Some(front) = self.chunks.front_mut() else {
                self.head.advance(cnt);
                return;
            };
            let n = cnt.min(front.len());
            front.advance(n);
            self.queued -= n;
            cnt -= n;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.remaining(), "took past the output's end");
        match self.chunks.front_mut() {
            // Within the first chunk: a slice of it.
            Some(front) if front.len() >= len => {
                let piece = front.split_to(len);
                self.queued -= len;
                if front.is_empty() {
                    self.chunks.pop_front();
                }
                piece
            }
            // Across chunks: copied together.
            Some(_) => {
                let mut piece = BytesMut::with_capacity(len);
                piece.put(Buf::take(&mut *self, len));
                piece.freeze()
            }
            None => self.head.split_to(len).freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_of(pieces: &[(&[u8], bool)]) -> (Output, Vec<u8>) {
        let mut output = Output::new();
        let mut bytes = Vec::new();
        for &(piece, payload) in pieces {
            if payload {
                output.put_buffer(Bytes::copy_from_slice(piece));
            } else {
                output.put_slice(piece);
            }
            bytes.extend_from_slice(piece);
        }
        (output, bytes)
    }

    fn gathered(output: &Output) -> Vec<u8> {
        let mut slices = [IoSlice::new(&[]); 64];
        let n = output.chunks_vectored(&mut slices);
        slices[..n]
            .iter()
            .flat_map(|slice| slice.iter().copied())
            .collect()
    }

    #[test]
    fn keeps_the_order_headers_and_payloads_were_put_in() {
        let big = vec![7u8; 4096];
        let (mut output, bytes) = output_of(&[
            (b"header-1", false),
            (&big, true),
            (b"header-2", false),
            (b"short", true),
            (b"header-3", false),
            (&big, true),
            (b"trailing", false),
        ]);
        assert_eq!(Transmit::len(&output), bytes.len());
        assert_eq!(gathered(&output), bytes);
        // Two long payloads kept as they were, the rest copied around them.
        assert_eq!(output.chunks.len(), 4);
        // Taken in odd pieces, across every boundary.
        let mut taken = Vec::new();
        let mut step = 1;
        while output.has_remaining() {
            let n = step.min(output.remaining());
            taken.extend_from_slice(&output.copy_to_bytes(n));
            step = step * 3 + 1;
        }
        assert_eq!(taken, bytes);
        assert!(output.is_empty() && output.chunks.is_empty());
    }

    #[test]
    fn advances_across_chunks_and_into_the_head() {
        let big = vec![1u8; 1000];
        let (mut output, bytes) = output_of(&[
            (b"h1", false),
            (&big, true),
            (b"h2", false),
            (b"tail", false),
        ]);
        output.advance(1);
        assert_eq!(output.chunk(), &bytes[1..2]);
        output.advance(500);
        assert_eq!(gathered(&output), bytes[501..]);
        output.advance(bytes.len() - 501 - 2);
        assert_eq!(output.chunk(), b"il");
        output.advance(2);
        assert!(output.is_empty());
        assert_eq!(output.chunk(), b"");
    }

    #[test]
    fn a_buffer_moves_in_and_out_without_a_copy() {
        let buffer = Bytes::from(vec![3u8; 2048]);
        let mut output = Output::new();
        output.put_buffer(buffer.clone());
        let piece = output.copy_to_bytes(1024);
        assert_eq!(piece.as_ptr(), buffer.as_ptr());
        assert_eq!(output.remaining(), 1024);
    }

    #[test]
    fn gives_at_most_the_slices_it_is_given() {
        let mut output = Output::new();
        for _ in 0..10 {
            output.put_slice(b"h");
            output.put_buffer(Bytes::from(vec![2u8; COPY_BELOW]));
        }
        let mut slices = [IoSlice::new(&[]); 3];
        assert_eq!(output.chunks_vectored(&mut slices), 3);
        assert_eq!(&slices[0][..], b"h");
        assert_eq!(slices[1].len(), COPY_BELOW);
    }
}
