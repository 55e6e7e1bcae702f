//! rapidws's sans-I/O core: everything about a WebSocket that does no I/O.
//!
//! Bytes go in (`&mut BytesMut`), events and bytes to send come out; nothing
//! here touches a socket, a runtime or a clock, so cargo itself keeps the
//! core free of them (this crate depends on no runtime). The `rapidws` crate
//! builds its drivers (tokio groups, io_uring, any async stream) on it, and
//! the fuzz targets and benchmarks drive it with no socket at all, as
//! quinn does with quinn-proto.
//!
//! | module | what |
//! |---|---|
//! | [`proto`] | frames, masking, roles, fragments, UTF-8, close, limits, permessage-deflate, the write queue, the per-connection [`Session`](proto::Session) |
//! | [`mux`] | many streams on one connection: the smux protocol (versions 1 and 2), sans-I/O: [`Mux`](mux::Mux) |
//! | [`h3`] | HTTP/3's own parsing for WebSockets over QUIC (RFC 9220): QUIC varints, frame heads, SETTINGS, QPACK with the static table only, a request head's checks, WebTransport's stream signals and capsules |
//! | [`handshake`] | the HTTP/1.1 upgrade: the server's request parser and checks, permessage-deflate negotiation, the `101` and HTTP errors; the client's request and its check of the response |
//! | [`sniff`] | a connection's first bytes: the PROXY protocol's header (versions 1 and 2) |
//! | [`pool`] | [`BufferPool`](pool::BufferPool): the buffers connections borrow while bytes are in them |
//! | [`budget`] | [`Budget`](budget::Budget): a bound in bytes on what many parties hold together (every mux session of a server; every WebTransport connection of an endpoint), the largest holder shed past it |
//!
//! Most applications use `rapidws`, which re-exports what a handler meets.

// `unsafe` is refused everywhere but in the two modules that need it (the
// AVX2 masking loop and zlib-rs writing into spare capacity), each allowing
// it where it is declared; every block says why it is sound.
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod budget;
pub mod h3;
pub mod handshake;
pub mod mux;
pub mod pool;
pub mod proto;
pub mod snapshot;
pub mod sniff;

/// How many rounds a randomized test runs: all of them natively, a fiftieth
/// under Miri, which interprets every instruction and is thousands of times
/// slower (see docs/testing.md, Miri).
#[cfg(test)]
pub(crate) const fn rounds(native: usize) -> usize {
    if cfg!(miri) { native / 50 + 1 } else { native }
}
