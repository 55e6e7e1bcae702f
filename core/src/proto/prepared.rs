//! A server message framed once, for many connections (pub/sub, broadcast).
//!
//! A server's frames carry no mask, so every connection can send the same
//! bytes: [`Prepared`] holds the whole frame (header and payload) as one
//! `Bytes`, and each connection's queue takes a reference to it instead of
//! framing the message again ([`WriteQueue::push_prepared`]).
//!
//! With permessage-deflate, a connection whose compressor starts every
//! message afresh (no server context takeover, the default) can share a
//! compressed frame too: [`Prepared::compressed_frame`] compresses the
//! message once per distinct set of parameters (window bits, level, memory
//! level) and keeps the frame for the next connection that asks. A
//! connection that keeps its compression context cannot share anything:
//! each compressed message there depends on the ones before it on that
//! connection. It gets the plain frame, which RFC 7692 allows (a message
//! without RSV1 is not compressed, and leaves the context untouched).
//!
//! [`WriteQueue::push_prepared`]: super::WriteQueue::push_prepared

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};

use super::deflate::{Compressor, DeflateKey, compress_alone};
use super::frame::{MAX_HEADER_LEN, OpCode, RSV1, encode_header};

/// A data message framed once (unmasked, FIN set): see the module docs.
#[derive(Debug)]
pub struct Prepared {
    opcode: OpCode,
    /// Where the payload starts in `frame`.
    header_len: usize,
    frame: Bytes,
    /// Compressed frames made so far, one per set of parameters; `None`
    /// where compressing failed or did not pay (the plain frame goes).
    compressed: Mutex<Vec<(DeflateKey, Option<Bytes>)>>,
    /// The compressed frames' bytes, readable without the lock.
    compressed_bytes: AtomicUsize,
}

impl Prepared {
    /// Frames `payload` as one message of `opcode` (text or binary). Text
    /// must be UTF-8: the caller checks it.
    pub fn new(opcode: OpCode, payload: &[u8]) -> Prepared {
        debug_assert!(matches!(opcode, OpCode::Text | OpCode::Binary));
        let mut header = [0u8; MAX_HEADER_LEN];
        let header_len = encode_header(&mut header, true, 0, opcode, payload.len() as u64, None);
        let mut frame = BytesMut::with_capacity(header_len + payload.len());
        frame.extend_from_slice(&header[..header_len]);
        frame.extend_from_slice(payload);
        Prepared {
            opcode,
            header_len,
            frame: frame.freeze(),
            compressed: Mutex::new(Vec::new()),
            compressed_bytes: AtomicUsize::new(0),
        }
    }

    /// The message's opcode.
    pub fn opcode(&self) -> OpCode {
        self.opcode
    }

    /// The payload, uncompressed.
    pub fn payload(&self) -> &[u8] {
        &self.frame[self.header_len..]
    }

    /// The whole uncompressed frame.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    /// The bytes it holds: its frame and every compressed frame made so
    /// far (what a byte budget counts; the struct itself is the caller's).
    pub fn held_bytes(&self) -> usize {
        self.frame.len() + self.compressed_bytes.load(Ordering::Relaxed)
    }

    /// The compressed frame for a connection whose compressor is
    /// `compressor`, made on the first call for its parameters; `None` if
    /// that connection should get the plain frame: its compressor keeps
    /// context, the message is below its minimum size, or compressing
    /// failed.
    pub fn compressed_frame(&self, compressor: &Compressor) -> Option<Bytes> {
        let key = compressor.alone()?;
        if !compressor.wants(self.payload().len()) {
            return None;
        }
        let mut made = self
            .compressed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, frame)) = made.iter().find(|(k, _)| *k == key) {
            return frame.clone();
        }
        let frame = self.compress(key);
        let bytes = frame.as_ref().map_or(0, Bytes::len);
        self.compressed_bytes.fetch_add(bytes, Ordering::Relaxed);
        made.push((key, frame.clone()));
        frame
    }

    /// Compresses the payload with `key` into a frame with RSV1 set. The
    /// payload goes behind room for the longest header, and the header is
    /// written right before it once the length is known: no second copy.
    fn compress(&self, key: DeflateKey) -> Option<Bytes> {
        let mut buf = BytesMut::with_capacity(MAX_HEADER_LEN + self.payload().len() / 2 + 64);
        buf.extend_from_slice(&[0; MAX_HEADER_LEN]);
        if !compress_alone(key, self.payload(), &mut buf) {
            return None;
        }
        let compressed_len = buf.len() - MAX_HEADER_LEN;
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut header,
            true,
            RSV1,
            self.opcode,
            compressed_len as u64,
            None,
        );
        let start = MAX_HEADER_LEN - n;
        buf[start..MAX_HEADER_LEN].copy_from_slice(&header[..n]);
        Some(buf.freeze().slice(start..))
    }

    /// How many compressed frames were made (tests: once per parameters).
    #[cfg(test)]
    fn compressed_count(&self) -> usize {
        self.compressed.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::frame::{DecodeRules, FrameHeader, decode_header};

    /// The header of `frame` as a client reads it, and where its payload starts.
    fn header(frame: &[u8]) -> (FrameHeader, usize) {
        let rules = DecodeRules {
            expect_masked: false,
            allowed_rsv: RSV1,
        };
        decode_header(frame, rules)
            .unwrap()
            .expect("a whole header")
    }

    #[test]
    fn the_frame_is_a_whole_unmasked_server_frame() {
        for len in [0usize, 1, 125, 126, 65_535, 65_536, 100_000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let prepared = Prepared::new(OpCode::Binary, &payload);
            let frame = prepared.frame();
            let (header, header_len) = header(frame);
            assert!(header.fin);
            assert_eq!((header.opcode, header.rsv), (OpCode::Binary, 0));
            assert_eq!(header.mask, None);
            assert_eq!(header.payload_len, len as u64);
            assert_eq!(&frame[header_len..], &payload[..]);
            assert_eq!(prepared.payload(), &payload[..]);
            assert_eq!(prepared.held_bytes(), frame.len());
        }
    }

    #[cfg(feature = "deflate")]
    mod deflate {
        use super::*;
        use crate::proto::Role;
        use crate::proto::deflate::{DeflateConfig, DeflateParams, Inflater};

        fn compressor(server_no_context_takeover: bool, bits: u8) -> Compressor {
            let params = DeflateParams {
                server_max_window_bits: bits,
                ..DeflateParams::new(server_no_context_takeover, true)
            };
            Compressor::new(Role::Server, &params, &DeflateConfig::default())
        }

        fn inflate(frame: &[u8]) -> Vec<u8> {
            let (header, header_len) = header(frame);
            assert_eq!(header.rsv, RSV1);
            assert!(header.fin);
            let body = &frame[header_len..];
            assert_eq!(body.len() as u64, header.payload_len);
            let mut inflater = Inflater::new(false);
            let mut plain = BytesMut::new();
            inflater.feed(body, &mut plain, usize::MAX).unwrap();
            inflater.finish(&mut plain, usize::MAX).unwrap();
            plain.to_vec()
        }

        #[test]
        fn compressed_once_per_set_of_parameters() {
            let text = "{\"topic\":\"prices\",\"bid\":64001.5}".repeat(40);
            let prepared = Prepared::new(OpCode::Text, text.as_bytes());
            let a = prepared.compressed_frame(&compressor(true, 15)).unwrap();
            let again = prepared.compressed_frame(&compressor(true, 15)).unwrap();
            // The same bytes, not a second compression.
            assert_eq!(a.as_ptr(), again.as_ptr());
            assert_eq!(prepared.compressed_count(), 1);
            let plain = prepared.frame().len();
            assert_eq!(prepared.held_bytes(), plain + a.len());
            let small_window = prepared.compressed_frame(&compressor(true, 9)).unwrap();
            assert_eq!(prepared.compressed_count(), 2);
            assert_eq!(prepared.held_bytes(), plain + a.len() + small_window.len());
            assert!(a.len() < text.len() / 4, "{} of {}", a.len(), text.len());
            assert_eq!(inflate(&a), text.as_bytes());
            assert_eq!(inflate(&small_window), text.as_bytes());
        }

        #[test]
        fn context_takeover_and_small_messages_get_the_plain_frame() {
            let text = "hello ".repeat(100);
            let prepared = Prepared::new(OpCode::Text, text.as_bytes());
            assert_eq!(prepared.compressed_frame(&compressor(false, 15)), None);
            let tiny = Prepared::new(OpCode::Text, b"hi");
            assert_eq!(tiny.compressed_frame(&compressor(true, 15)), None);
            assert_eq!(prepared.compressed_count() + tiny.compressed_count(), 0);
        }

        #[test]
        fn every_header_length_is_written_in_place() {
            // Compressed lengths under 126, up to 64 KiB, and beyond: noise
            // does not compress, so its length sets the header's.
            let mut x: u32 = 7;
            let noise: Vec<u8> = (0..100_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            for len in [200usize, 2_000, 70_000, 100_000] {
                let prepared = Prepared::new(OpCode::Binary, &noise[..len]);
                let frame = prepared.compressed_frame(&compressor(true, 15)).unwrap();
                assert_eq!(inflate(&frame), &noise[..len]);
            }
        }
    }
}
