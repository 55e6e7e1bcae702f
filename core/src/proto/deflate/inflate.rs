//! Inflating a compressed message as its payload arrives, bounded.
//!
//! The session hands each unmasked piece of a compressed message to
//! [`Inflater::feed`], and [`Inflater::finish`] after the last one, which
//! inflates the `00 00 ff ff` tail the sender stripped (RFC 7692 §7.2.2).
//!
//! Two bounds hold whatever the input:
//! - **Size.** Output stops one byte past the message size limit, and that is
//!   [`InflateFailure::TooBig`]: a small frame that would inflate to gigabytes
//!   costs no more than the limit.
//! - **Work.** Every call to zlib either uses input or writes output, or the
//!   data is declared invalid, so one piece costs at most its length plus the
//!   limit in steps: an input that makes zlib stop without progress (as some
//!   four-byte frames do) cannot spin the loop.

use bytes::BytesMut;
use zlib_rs::{Inflate, Status};

use super::{InflateFailure, zlib};

/// RFC 7692 §7.2.2: what the sender removed from the end of every message.
pub(crate) const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The least room zlib gets for output, so that each call does real work.
const MIN_ROOM: usize = 4096;

/// The receiving side of permessage-deflate for one connection.
pub struct Inflater {
    /// Held between messages only when the client keeps its context.
    stream: Option<Box<Inflate>>,
    keep_context: bool,
    /// This message's stream ended with a final block (BFINAL): what follows
    /// in the message is ignored, and the stream starts afresh with the next
    /// message.
    ended: bool,
    /// This message brought compressed bytes: without any, it is empty and
    /// the stream is left as it is.
    fed: bool,
}

impl Inflater {
    /// `keep_context`: the client may refer back to earlier messages, so the
    /// window must be kept from one message to the next.
    pub fn new(keep_context: bool) -> Self {
        Inflater {
            stream: None,
            keep_context,
            ended: false,
            fed: false,
        }
    }

    /// Whether the window is kept from one message to the next (then the
    /// inflater holds zlib state between messages).
    pub fn keeps_context(&self) -> bool {
        self.keep_context
    }

    /// Inflates the next piece of a message's payload, appending to `out`,
    /// which may hold at most `limit` bytes.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut BytesMut,
        limit: usize,
    ) -> Result<(), InflateFailure> {
        if input.is_empty() {
            return Ok(());
        }
        self.fed = true;
        let stream = self.stream.get_or_insert_with(zlib::take_inflater);
        loop {
            if self.ended {
                // RFC 7692 §7.2.3.5: a sender that ends with a final block
                // still appends the empty stored block and cuts its last four
                // bytes, leaving a 0x00 after the stream's end. Like zlib,
                // ignore whatever follows the end.
                return Ok(());
            }
            if out.len() > limit {
                return Err(InflateFailure::TooBig);
            }
            // One byte past the limit, to tell "exactly the limit" from "more".
            let allowed = limit.saturating_add(1) - out.len();
            if out.capacity() - out.len() < MIN_ROOM {
                out.reserve(out.len().max(MIN_ROOM).min(allowed));
            }
            let room = (out.capacity() - out.len()).min(allowed);
            let (used, wrote, status) = zlib::inflate_into(stream, input, out, room)
                .map_err(|_| InflateFailure::Invalid)?;
            input = &input[used..];
            if out.len() > limit {
                return Err(InflateFailure::TooBig);
            }
            if status == Status::StreamEnd {
                self.ended = true;
                continue;
            }
            if used == 0 && wrote == 0 {
                // zlib can go no further: done if the input is used up, stuck
                // (and so invalid) if not.
                return if input.is_empty() {
                    Ok(())
                } else {
                    Err(InflateFailure::Invalid)
                };
            }
            // A full output buffer may hide more output for the same input.
            if input.is_empty() && wrote < room {
                return Ok(());
            }
        }
    }

    /// The message's last piece was fed: inflates the tail, then readies the
    /// inflater for the next message (keeping the window only if the client
    /// keeps its context and did not end its stream).
    pub fn finish(&mut self, out: &mut BytesMut, limit: usize) -> Result<(), InflateFailure> {
        // A message of no bytes at all (what zlib, and so many senders,
        // write for an empty message right after a sync flush) is empty: the
        // tail would start a broken block in a kept window instead.
        if !self.ended && self.fed {
            self.feed(&TAIL, out, limit)?;
        }
        self.fed = false;
        if !self.keep_context {
            self.release();
        } else if std::mem::take(&mut self.ended) {
            if let Some(stream) = &mut self.stream {
                stream.reset(false);
            }
        }
        Ok(())
    }

    /// Drops whatever state the message in progress left: the connection
    /// failed or ended. The stream goes back to this thread's pool.
    pub fn release(&mut self) {
        self.ended = false;
        self.fed = false;
        if let Some(stream) = self.stream.take() {
            zlib::give_inflater(stream);
        }
    }

    /// Whether the inflater holds a zlib stream now (for tests of idle memory).
    #[cfg(test)]
    pub(crate) fn holds_stream(&self) -> bool {
        self.stream.is_some()
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::proto::deflate::zlib::{DeflateKey, deflate_into, take_deflater};

    /// Compresses `messages` with one stream (context kept) the way a client
    /// does, each without its tail.
    fn compress(messages: &[&[u8]], bits: u8) -> Vec<Vec<u8>> {
        let mut stream = take_deflater(DeflateKey {
            window_bits: bits,
            level: 6,
            mem_level: 8,
        });
        messages
            .iter()
            .map(|message| {
                let mut out = BytesMut::with_capacity(message.len() + 64);
                let mut input = *message;
                loop {
                    out.reserve(64);
                    let (used, wrote, room) = deflate_into(&mut stream, input, &mut out).unwrap();
                    input = &input[used..];
                    if input.is_empty() && wrote < room {
                        break;
                    }
                }
                assert!(out.ends_with(&TAIL));
                out.truncate(out.len() - 4);
                out.to_vec()
            })
            .collect()
    }

    fn inflate(
        inflater: &mut Inflater,
        pieces: &[&[u8]],
        limit: usize,
    ) -> Result<Vec<u8>, InflateFailure> {
        let mut out = BytesMut::new();
        for piece in pieces {
            inflater.feed(piece, &mut out, limit)?;
        }
        inflater.finish(&mut out, limit)?;
        Ok(out.to_vec())
    }

    #[test]
    fn a_message_of_no_bytes_is_empty_and_keeps_the_window() {
        let first = b"the quick brown fox jumps over the lazy dog ".repeat(4);
        let packed = compress(&[&first, &first], 15);
        let mut inflater = Inflater::new(true);
        assert_eq!(
            inflate(&mut inflater, &[&packed[0]], 1 << 20).unwrap(),
            first
        );
        assert_eq!(inflate(&mut inflater, &[], 1 << 20).unwrap(), b"");
        assert_eq!(inflate(&mut inflater, &[b""], 1 << 20).unwrap(), b"");
        assert_eq!(
            inflate(&mut inflater, &[&packed[1]], 1 << 20).unwrap(),
            first
        );
    }

    #[test]
    fn messages_with_context_inflate_in_any_pieces() {
        let first = b"the quick brown fox jumps over the lazy dog ".repeat(40);
        let second = b"the quick brown fox jumps over the lazy dog again".to_vec();
        let packed = compress(&[&first, &second], 15);
        assert!(packed[1].len() < 20, "refers back to the first message");
        let mut inflater = Inflater::new(true);
        let halves = packed[0].split_at(packed[0].len() / 2);
        assert_eq!(
            inflate(&mut inflater, &[halves.0, halves.1], 1 << 20).unwrap(),
            first
        );
        let bytes: Vec<&[u8]> = packed[1].chunks(1).collect();
        assert_eq!(inflate(&mut inflater, &bytes, 1 << 20).unwrap(), second);
        assert!(inflater.holds_stream(), "kept for the next message");
    }

    #[test]
    fn without_context_nothing_is_held_between_messages() {
        let message = b"no context takeover ".repeat(20);
        let packed = compress(&[&message], 9);
        let mut inflater = Inflater::new(false);
        for _ in 0..3 {
            assert_eq!(
                inflate(&mut inflater, &[&packed[0]], 1 << 20).unwrap(),
                message
            );
            assert!(!inflater.holds_stream());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "a megabyte is too much for Miri")]
    fn inflating_stops_at_the_limit() {
        let zeros = vec![0u8; 1 << 20];
        let packed = compress(&[&zeros], 15);
        assert!(
            packed[0].len() < 2048,
            "a small frame that inflates to 1 MiB"
        );
        let mut inflater = Inflater::new(false);
        assert_eq!(
            inflate(&mut inflater, &[&packed[0]], (1 << 20) - 1),
            Err(InflateFailure::TooBig)
        );
        let mut inflater = Inflater::new(false);
        assert_eq!(
            inflate(&mut inflater, &[&packed[0]], 1 << 20)
                .unwrap()
                .len(),
            1 << 20
        );
        // Stopping at the limit wrote at most one byte past it.
        let mut out = BytesMut::new();
        let mut inflater = Inflater::new(false);
        assert_eq!(
            inflater.feed(&packed[0], &mut out, 1000),
            Err(InflateFailure::TooBig)
        );
        assert_eq!(out.len(), 1001);
    }

    #[test]
    fn invalid_data_is_reported() {
        let mut inflater = Inflater::new(true);
        // Block type 3 is reserved.
        assert_eq!(
            inflate(&mut inflater, &[&[0xff, 0xff]], 1000),
            Err(InflateFailure::Invalid)
        );
    }

    #[test]
    fn a_final_block_ends_the_message_and_resets_the_context() {
        // RFC 7692 §7.2.3.5's example: "Hello" in a final fixed block, then
        // the 0x00 left of the empty stored block the sender appended.
        let hello = [0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00];
        for keep in [true, false] {
            let mut inflater = Inflater::new(keep);
            for _ in 0..2 {
                assert_eq!(inflate(&mut inflater, &[&hello], 1000).unwrap(), b"Hello");
            }
            // Then a message from a fresh stream.
            let message = b"after a final block".to_vec();
            let packed = compress(&[&message], 15);
            assert_eq!(
                inflate(&mut inflater, &[&packed[0]], 1000).unwrap(),
                message
            );
        }
    }

    #[test]
    fn short_and_truncated_inputs_end_without_spinning() {
        // Four-byte inputs of every shape that has stopped inflaters elsewhere:
        // a stored block announcing 65535 bytes with none behind it, a stored
        // header with a bad complement, lone block headers, empty blocks.
        let inputs: [&[u8]; 8] = [
            &[0x00, 0xff, 0xff, 0x00],
            &[0x00, 0x00, 0xff, 0xff],
            &[0x00, 0x05, 0x00, 0x00],
            &[0x02, 0x00, 0x00, 0x00],
            &[0x04, 0x00, 0x00, 0x00],
            &[0x01],
            &[],
            &[0x00],
        ];
        for input in inputs {
            for keep in [false, true] {
                let mut inflater = Inflater::new(keep);
                let result = inflate(&mut inflater, &[input], 1 << 16);
                assert!(
                    matches!(result, Ok(ref out) if out.len() <= 1 << 16) || result.is_err(),
                    "{input:02x?}"
                );
            }
        }
    }

    #[test]
    fn random_input_always_ends_within_the_limit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..crate::rounds(2000) {
            let len = rng.random_range(0..64);
            let input: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let limit = rng.random_range(0..4096);
            let mut inflater = Inflater::new(round % 2 == 0);
            let mut out = BytesMut::new();
            let fed = input
                .chunks(rng.random_range(1..8))
                .try_for_each(|piece| inflater.feed(piece, &mut out, limit));
            let result = fed.and_then(|()| inflater.finish(&mut out, limit));
            match result {
                Ok(()) => assert!(out.len() <= limit),
                Err(InflateFailure::TooBig) => assert_eq!(out.len(), limit + 1),
                Err(InflateFailure::Invalid) => assert!(out.len() <= limit),
            }
        }
    }
}
