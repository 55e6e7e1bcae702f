//! Compressing outgoing messages (RFC 7692 §7.2.1).
//!
//! A message is compressed whole, with a sync flush, and the `00 00 ff ff`
//! that flush ends with is cut off: the peer appends it again. The output goes
//! straight into the write queue's buffer, behind its frame header.

use bytes::BytesMut;
use zlib_rs::Deflate;

use super::inflate::TAIL;
use super::zlib::{self, DeflateKey};
use super::{DeflateConfig, DeflateParams};
use crate::proto::{Role, Unmovable};
use crate::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

/// The sending side of permessage-deflate for one connection: compresses
/// with the window and context takeover the parameters give its role.
pub struct Compressor {
    key: DeflateKey,
    keep_context: bool,
    /// `compress_min_size`, capped at 4 GiB so the compressor stays 16 bytes.
    min_size: u32,
    /// Held between messages only when this side keeps its context.
    stream: Option<Box<Deflate>>,
}

impl Compressor {
    /// A compressor for `role`'s messages with the negotiated `params` and the local `config`.
    pub fn new(role: Role, params: &DeflateParams, config: &DeflateConfig) -> Self {
        Compressor {
            key: DeflateKey {
                window_bits: params.send_window_bits(role),
                level: config.level,
                mem_level: config.mem_level,
            },
            keep_context: params.send_keeps_context(role),
            min_size: u32::try_from(config.compress_min_size).unwrap_or(u32::MAX),
            stream: None,
        }
    }

    /// The compressor as data, for a successor process to go on compressing
    /// the connection's messages (see `Session::snapshot`): its window,
    /// level, memory level and smallest message compressed. One that keeps
    /// its window between messages (our context takeover) cannot move:
    /// zlib's state stays in this process.
    pub fn snapshot(&self, out: &mut SnapshotWriter) -> Result<(), Unmovable> {
        if self.keep_context {
            return Err(Unmovable::DeflateContext);
        }
        out.u8(self.key.window_bits)
            .u8(self.key.level)
            .u8(self.key.mem_level)
            .u32(self.min_size);
        Ok(())
    }

    /// A compressor from what [`snapshot`](Self::snapshot) wrote, its
    /// values checked against what zlib takes.
    pub fn restore(from: &mut SnapshotReader<'_>) -> Result<Compressor, SnapshotError> {
        let (window_bits, level, mem_level) = (from.u8()?, from.u8()?, from.u8()?);
        let min_size = from.u32()?;
        if !(9..=15).contains(&window_bits) || level > 9 || !(1..=9).contains(&mem_level) {
            return Err(SnapshotError::Invalid("compressor settings"));
        }
        Ok(Compressor {
            key: DeflateKey {
                window_bits,
                level,
                mem_level,
            },
            keep_context: false,
            min_size,
            stream: None,
        })
    }

    /// Whether a message of `len` bytes is worth compressing.
    pub fn wants(&self, len: usize) -> bool {
        u32::try_from(len).map_or(true, |len| len >= self.min_size)
    }

    /// Appends `payload`, compressed as one message and without its tail, to
    /// `out`. On `false` (zlib refused, which a sound stream never does)
    /// nothing was appended: send the message uncompressed.
    pub fn compress(&mut self, payload: &[u8], out: &mut BytesMut) -> bool {
        let key = self.key;
        let stream = self.stream.get_or_insert_with(|| zlib::take_deflater(key));
        let start = out.len();
        // Room for the usual case in one go; more is added if needed.
        out.reserve(payload.len() / 2 + 64);
        let mut input = payload;
        loop {
            let Ok((used, wrote, room)) = zlib::deflate_into(stream, input, out) else {
                // Unknown state: start the next message with a new stream,
                // which never refers back, so the peer's window stays valid.
                self.stream = None;
                out.truncate(start);
                return false;
            };
            input = &input[used..];
            // Until zlib leaves output room unused, it may hold more.
            if input.is_empty() && wrote < room {
                break;
            }
            out.reserve((out.len() - start).max(input.len() / 2).max(64));
        }
        if out[start..].ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        if out.len() == start {
            // An empty message right after a sync flush: zlib has nothing
            // to write. RFC 7692 §7.2.3.6 sends it as one 0x00, which the
            // peer's appended tail completes to an empty stored block.
            out.extend_from_slice(&[0x00]);
        }
        if !self.keep_context {
            if let Some(stream) = self.stream.take() {
                zlib::give_deflater(key, stream);
            }
        }
        true
    }

    /// Whether each message's compression depends on the ones before it (context
    /// takeover): then messages must reach the peer in the order they were
    /// compressed.
    pub fn keeps_context(&self) -> bool {
        self.keep_context
    }

    /// The parameters a message compressed on its own for this connection
    /// is made with, or `None` if this side keeps context (its messages
    /// depend on the ones before, so none can be shared with another
    /// connection). Equal keys mean interchangeable compressed messages.
    pub(crate) fn alone(&self) -> Option<DeflateKey> {
        (!self.keep_context).then_some(self.key)
    }

    /// Whether the compressor holds a zlib stream now (for tests of idle memory).
    #[cfg(test)]
    pub(crate) fn holds_stream(&self) -> bool {
        self.stream.is_some()
    }
}

/// Compresses `payload` as one message that depends on nothing before it
/// (what `Compressor::alone`'s key describes), appending it to `out`
/// without the `00 00 ff ff` tail; false if zlib failed (nothing appended).
/// The stream comes from, and goes back to, this thread's pool.
pub fn compress_alone(key: DeflateKey, payload: &[u8], out: &mut BytesMut) -> bool {
    let mut compressor = Compressor {
        key,
        keep_context: false,
        min_size: 0,
        stream: None,
    };
    compressor.compress(payload, out)
}

impl Drop for Compressor {
    fn drop(&mut self) {
        // Between messages, where a compressor always is, its stream can
        // go back to the pool (which resets it).
        if let Some(stream) = self.stream.take() {
            zlib::give_deflater(self.key, stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::deflate::Inflater;

    fn params(server_no_context_takeover: bool, bits: u8) -> DeflateParams {
        DeflateParams {
            server_max_window_bits: bits,
            ..DeflateParams::new(server_no_context_takeover, true)
        }
    }

    #[test]
    fn a_compressor_without_context_moves_and_compresses_the_same() {
        let config = DeflateConfig {
            level: 6,
            compress_min_size: 20,
            ..DeflateConfig::default()
        };
        let mut here = Compressor::new(Role::Server, &params(true, 10), &config);
        let message = b"handoff handoff handoff handoff handoff handoff";
        let mut before = BytesMut::new();
        assert!(here.compress(message, &mut before));
        let mut writer = SnapshotWriter::new();
        here.snapshot(&mut writer).unwrap();
        let bytes = writer.finish();
        let mut reader = SnapshotReader::new(&bytes);
        let mut there = Compressor::restore(&mut reader).unwrap();
        reader.finish().unwrap();
        let mut after = BytesMut::new();
        assert!(there.compress(message, &mut after));
        assert_eq!(before, after, "the same settings, the same bytes");
        assert!(!there.wants(19) && there.wants(20));
        // Keeping our window between messages: zlib's state cannot move.
        let keeping = Compressor::new(Role::Server, &params(false, 15), &config);
        assert_eq!(
            keeping.snapshot(&mut SnapshotWriter::new()),
            Err(Unmovable::DeflateContext)
        );
        // Settings zlib does not take are refused.
        for bad in [
            [8u8, 6, 8],
            [16, 6, 8],
            [15, 10, 8],
            [15, 6, 0],
            [15, 6, 10],
        ] {
            let mut writer = SnapshotWriter::new();
            writer.u8(bad[0]).u8(bad[1]).u8(bad[2]).u32(0);
            let bytes = writer.finish();
            assert!(
                Compressor::restore(&mut SnapshotReader::new(&bytes)).is_err(),
                "{bad:?}"
            );
        }
    }

    fn round_trip(compressor: &mut Compressor, inflater: &mut Inflater, message: &[u8]) -> usize {
        let mut packed = BytesMut::new();
        assert!(compressor.compress(message, &mut packed));
        assert!(!packed.ends_with(&TAIL) || packed.len() < 4, "tail cut off");
        let mut plain = BytesMut::new();
        inflater.feed(&packed, &mut plain, usize::MAX).unwrap();
        inflater.finish(&mut plain, usize::MAX).unwrap();
        assert_eq!(&plain[..], message);
        packed.len()
    }

    #[test]
    fn an_empty_message_after_others_is_one_zero_byte_with_context() {
        // Found by the property tests: after a sync flush, zlib has nothing
        // to write for an empty message, and a message of no bytes makes the
        // peer's appended tail a broken block that ruins the next message.
        let config = DeflateConfig::default();
        for first in [
            &b"hello hello hello"[..],
            &[0x5a, 0x13, 0xc7, 0x02, 0xee][..],
        ] {
            let mut compressor = Compressor::new(Role::Server, &params(false, 15), &config);
            let mut inflater = Inflater::new(true);
            round_trip(&mut compressor, &mut inflater, first);
            assert_eq!(round_trip(&mut compressor, &mut inflater, b""), 1);
            round_trip(&mut compressor, &mut inflater, b"after the empty one");
        }
    }

    #[test]
    fn context_takeover_shrinks_repeated_messages() {
        let config = DeflateConfig::default();
        let message = b"{\"symbol\":\"BTC-USD\",\"bid\":64001.5,\"ask\":64002.0}".repeat(3);
        let mut keep = Compressor::new(Role::Server, &params(false, 15), &config);
        let mut fresh = Compressor::new(Role::Server, &params(true, 15), &config);
        let mut inflate_keep = Inflater::new(true);
        let mut inflate_fresh = Inflater::new(false);
        let first = round_trip(&mut keep, &mut inflate_keep, &message);
        let second = round_trip(&mut keep, &mut inflate_keep, &message);
        assert!(second < first / 2, "{second} vs {first}");
        assert!(keep.holds_stream());
        for _ in 0..2 {
            assert_eq!(round_trip(&mut fresh, &mut inflate_fresh, &message), first);
            assert!(!fresh.holds_stream(), "nothing held between messages");
        }
    }

    #[test]
    fn empty_large_and_incompressible_messages_round_trip_at_every_window() {
        let config = DeflateConfig::default();
        // Smaller under Miri, which runs zlib-rs a thousand times slower.
        let mut noise = vec![0u8; if cfg!(miri) { 2_000 } else { 200_000 }];
        let mut x: u32 = 1;
        for byte in &mut noise {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *byte = x as u8;
        }
        let text =
            b"Habe nun, ach! Philosophie, Juristerei und Medizin ".repeat(crate::rounds(3000));
        let smallest = if cfg!(miri) { 15 } else { 9 };
        for bits in smallest..=15 {
            for no_context in [true, false] {
                let mut compressor =
                    Compressor::new(Role::Server, &params(no_context, bits), &config);
                let mut inflater = Inflater::new(!no_context);
                let empty = round_trip(&mut compressor, &mut inflater, b"");
                assert_eq!(empty, 1, "RFC 7692 §7.2.3.6: an empty message is one 0x00");
                round_trip(&mut compressor, &mut inflater, &noise);
                let packed = round_trip(&mut compressor, &mut inflater, &text);
                assert!(packed < text.len() / 4, "window {bits}: {packed}");
            }
        }
    }

    #[test]
    fn small_messages_are_not_worth_compressing() {
        let config = DeflateConfig::default().compress_min_size(100);
        let compressor = Compressor::new(Role::Server, &params(true, 15), &config);
        assert!(!compressor.wants(99));
        assert!(compressor.wants(100));
    }
}
