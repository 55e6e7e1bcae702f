//! permessage-deflate (RFC 7692): the compressor and decompressor a
//! connection uses once it was agreed (the negotiation is the handshake's:
//! `handshake/negotiate.rs`).
//!
//! | file | concern |
//! |---|---|
//! | `params.rs` | the agreed parameters, and which apply to each role |
//! | `inflate.rs` | inflating a message as its frames arrive, bounded in size and work |
//! | `compress.rs` | compressing an outgoing message into the write queue |
//! | `zlib.rs` | zlib-rs streams written straight into a `BytesMut`, and the per-thread pool |
//!
//! The codec is zlib-rs, the pure-Rust zlib that `flate2`'s `zlib-rs` feature
//! wraps, used directly because `flate2` does not expose the memory level.
//!
//! **Memory.** A side that keeps its context holds a zlib stream for the life of
//! the connection: about 43 KiB to inflate and, at window 15 and memory level
//! 8, about 370 KiB to deflate. A side without context takeover holds none
//! between messages: it borrows a stream from a small per-thread pool for one
//! message and resets it. That is why both sides default to no context
//! takeover: an idle connection costs the same with or without compression.
//!
//! **Without the `deflate` cargo feature** zlib-rs is not compiled in.
//! `Config::permessage_deflate` is not there, so nothing is ever negotiated,
//! and [`Compressor`] and [`Inflater`] are types without values
//! (`absent.rs`): the session and the outbox keep one shape, their
//! `Option<Compressor>` and `Option<Inflater>` are always `None`, cost no
//! bytes, and the compression paths compile away.

#[cfg(not(feature = "deflate"))]
mod absent;
#[cfg(feature = "deflate")]
mod compress;
#[cfg(feature = "deflate")]
mod inflate;
mod params;
#[cfg(feature = "deflate")]
#[allow(unsafe_code)] // zlib-rs writing into a buffer's spare capacity
mod zlib;

#[cfg(not(feature = "deflate"))]
pub use absent::{Compressor, DeflateKey, Inflater, compress_alone};
#[cfg(feature = "deflate")]
pub use compress::{Compressor, compress_alone};
#[cfg(feature = "deflate")]
pub use inflate::Inflater;
pub use params::DeflateParams;
#[cfg(feature = "deflate")]
pub use zlib::DeflateKey;

/// Why inflating a message stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InflateFailure {
    /// The inflated message would exceed the size limit.
    TooBig,
    /// The payload is not a valid deflate stream.
    Invalid,
}

/// How permessage-deflate is negotiated and used. A server turns it on with
/// `Config::permessage_deflate` (off by default) and answers offers with it;
/// a client offers it in its upgrade request
/// (`handshake::ClientRequest::permessage_deflate`). Each setting names the
/// side it governs, so the same value means the same agreement from either
/// end.
///
/// The defaults suit many idle connections and browsers: no context takeover
/// on either side (nothing held between messages), window 15, level 1 (fast),
/// memory level 8, and messages under 64 bytes sent uncompressed.
///
/// ```
/// use rapidws_core::proto::deflate::DeflateConfig;
/// let deflate = DeflateConfig::default()
///     .server_context_takeover(true)
///     .level(6)
///     .compress_min_size(256);
/// # let _ = deflate;
/// // rapidws::Config::default().permessage_deflate(deflate)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateConfig {
    /// The server's LZ77 window, as a power of two (8 to 15).
    pub server_max_window_bits: u8,
    /// The client's LZ77 window, as a power of two (8 to 15).
    pub client_max_window_bits: u8,
    /// Whether the server keeps its compression context between messages.
    pub server_context_takeover: bool,
    /// Whether the client keeps its compression context between messages.
    pub client_context_takeover: bool,
    /// zlib's compression level (0 to 9).
    pub level: u8,
    /// zlib's memory level (1 to 9).
    pub mem_level: u8,
    /// Messages shorter than this go out uncompressed.
    pub compress_min_size: usize,
}

impl Default for DeflateConfig {
    fn default() -> Self {
        DeflateConfig {
            server_max_window_bits: 15,
            client_max_window_bits: 15,
            server_context_takeover: false,
            client_context_takeover: false,
            level: 1,
            mem_level: 8,
            compress_min_size: 64,
        }
    }
}

impl DeflateConfig {
    /// The largest LZ77 window the server compresses with, as a power of two
    /// (9 to 15; default 15). A client asking for less gets what it asks for,
    /// except 8: zlib cannot write a raw deflate stream with a 256-byte
    /// window, so an offer with `server_max_window_bits=8` is declined and the
    /// client's next offer, if any, is tried. Values outside 9..=15 are
    /// clamped into it.
    ///
    /// A client asks the server for this window: below 15 its offer says
    /// `server_max_window_bits=N`, and a response without it, or with more,
    /// fails the handshake.
    pub fn server_max_window_bits(mut self, bits: u8) -> Self {
        self.server_max_window_bits = bits.clamp(9, 15);
        self
    }

    /// For a client: the largest window it compresses with, as a power of
    /// two (9 to 15; default 15), offered as `client_max_window_bits=N`
    /// (bare at 15). The server may answer with a smaller one, which the
    /// client then uses; an answer of 8 fails the handshake, because zlib
    /// cannot write a raw deflate stream with a 256-byte window and using 9
    /// instead would break the agreement. Values outside 9..=15 are clamped
    /// into it.
    ///
    /// A server ignores this setting: it never asks a client for a smaller
    /// window, since it inflates with the largest window whatever the client
    /// uses, and a smaller one would only compress worse.
    pub fn client_max_window_bits(mut self, bits: u8) -> Self {
        self.client_max_window_bits = bits.clamp(9, 15);
        self
    }

    /// Whether the server keeps its compression context from one message to
    /// the next (default false). Keeping it compresses small, similar messages
    /// much better, at the cost of a zlib stream (about 370 KiB at window 15,
    /// memory level 8) held by every connection that has sent a compressed
    /// message. When false, the response says `server_no_context_takeover`;
    /// it also says so whenever the client asks for it.
    ///
    /// A client that sets it false offers `server_no_context_takeover`, so it
    /// holds no inflate state between messages, and fails a response that
    /// does not confirm it.
    pub fn server_context_takeover(mut self, keep: bool) -> Self {
        self.server_context_takeover = keep;
        self
    }

    /// Whether the client may keep its compression context (default false).
    /// When false, the response says `client_no_context_takeover`, and the
    /// server holds no inflate state between messages; when true, each
    /// connection that received a compressed message holds about 43 KiB.
    ///
    /// A client that sets it false offers `client_no_context_takeover` and
    /// starts every message afresh whatever the server answers; when true,
    /// it keeps its context unless the response says
    /// `client_no_context_takeover`.
    pub fn client_context_takeover(mut self, keep: bool) -> Self {
        self.client_context_takeover = keep;
        self
    }

    /// The zlib compression level, 0 (store) to 9 (smallest); default 1, the
    /// fastest that still compresses. Larger values are clamped to 9.
    pub fn level(mut self, level: u8) -> Self {
        self.level = level.min(9);
        self
    }

    /// The zlib memory level, 1 to 9 (default 8): lower uses less memory per
    /// compressor and compresses a little worse. Clamped into 1..=9.
    pub fn mem_level(mut self, mem_level: u8) -> Self {
        self.mem_level = mem_level.clamp(1, 9);
        self
    }

    /// Messages shorter than this many bytes are sent uncompressed (default
    /// 64): deflate rarely shrinks them, and it costs time.
    pub fn compress_min_size(mut self, bytes: usize) -> Self {
        self.compress_min_size = bytes;
        self
    }
}

#[cfg(all(test, feature = "deflate"))]
mod tests {
    use super::*;

    #[test]
    fn an_idle_connection_carries_little_for_deflate() {
        // Held inline by `Session` and `Outbox` of every connection, deflate
        // or not; the zlib streams are boxed inside and absent between
        // messages without context takeover.
        assert_eq!(size_of::<Option<Inflater>>(), 16);
        assert_eq!(size_of::<Option<Compressor>>(), 16);
    }
}
