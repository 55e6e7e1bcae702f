//! [`Output`]: frames waiting for the transport, their payloads kept as
//! the slices the streams wrote (no copy), written out vectored.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

/// Where [`Mux::poll_transmit`](super::Mux::poll_transmit) puts frames.
///
/// A `BytesMut` takes them copied, one after the other; an [`Output`]
/// takes a payload that is all of its stream's buffer without a copy (the
/// buffer moves into it), for a vectored write.
pub trait Transmit {
    /// Bytes put and not taken out yet.
    fn len(&self) -> usize;

    /// Whether nothing is put.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes` (a frame's header, a window update), copied.
    fn put_slice(&mut self, bytes: &[u8]);

    /// Appends a frame's payload: the first `n` bytes of `from` (a
    /// stream's send buffer), taken off it.
    fn put_payload(&mut self, from: &mut BytesMut, n: usize);
}

impl Transmit for BytesMut {
    fn len(&self) -> usize {
        BytesMut::len(self)
    }

    fn put_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn put_payload(&mut self, from: &mut BytesMut, n: usize) {
        self.extend_from_slice(&from[..n]);
        from.advance(n);
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
/// first, then `head`. Headers, short payloads and parts of a stream's
/// buffer are copied into `head`; a payload that is a whole buffer moves
/// what `head` holds into `chunks` (split off, not copied) and follows it
/// there. Written with
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

    fn put_payload(&mut self, from: &mut BytesMut, n: usize) {
        // All of a buffer not much larger than what it holds moves here
        // whole, so what the output keeps alive is never more than twice
        // what it holds. Part of one is copied: a slice would keep the
        // stream's whole buffer (up to its send buffer's size, which the
        // budget no longer counts once framed) alive until written, the
        // stream writing on into a new one meanwhile.
        if n >= COPY_BELOW && n == from.len() && from.capacity() <= 2 * n {
            self.push(std::mem::take(from).freeze());
        } else {
            self.put_slice(&from[..n]);
            from.advance(n);
        }
    }
}

impl Output {
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
                while piece.len() < len {
                    let chunk = self.chunk();
                    let n = chunk.len().min(len - piece.len());
                    piece.extend_from_slice(&chunk[..n]);
                    self.advance(n);
                }
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
                let mut buffer = BytesMut::from(piece);
                output.put_payload(&mut buffer, piece.len());
                assert!(buffer.is_empty());
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
    fn a_whole_buffer_moves_in_and_out_without_a_copy() {
        let mut buffer = BytesMut::from(&[3u8; 2048][..]);
        let at = buffer.as_ptr();
        let mut output = Output::new();
        output.put_payload(&mut buffer, 2048);
        assert!(buffer.is_empty());
        let piece = output.copy_to_bytes(1024);
        assert_eq!(piece.as_ptr(), at);
        assert_eq!(output.remaining(), 1024);
    }

    #[test]
    fn part_of_a_buffer_or_a_roomy_one_is_copied() {
        let mut output = Output::new();
        // Part of it: the rest stays in the stream's buffer.
        let mut buffer = BytesMut::from(&[4u8; 4096][..]);
        output.put_payload(&mut buffer, 1024);
        assert_eq!(buffer.len(), 3072);
        // All of one three times larger than what it holds.
        let mut roomy = BytesMut::with_capacity(3 * 1024);
        roomy.extend_from_slice(&[5u8; 1024]);
        output.put_payload(&mut roomy, 1024);
        assert!(roomy.is_empty());
        assert!(output.chunks.is_empty());
        assert_eq!(output.chunk(), [[4u8; 1024], [5u8; 1024]].concat());
    }

    #[test]
    fn gives_at_most_the_slices_it_is_given() {
        let mut output = Output::new();
        for _ in 0..10 {
            output.put_slice(b"h");
            let mut buffer = BytesMut::from(&[2u8; COPY_BELOW][..]);
            output.put_payload(&mut buffer, COPY_BELOW);
        }
        let mut slices = [IoSlice::new(&[]); 3];
        assert_eq!(output.chunks_vectored(&mut slices), 3);
        assert_eq!(&slices[0][..], b"h");
        assert_eq!(slices[1].len(), COPY_BELOW);
    }
}
