//! A lean, strict, fast WebSocket server (RFC 6455, with permessage-deflate,
//! RFC 7692).
//!
//! The protocol lives in a sans-I/O core ([`proto`], [`handshake`]) that never
//! touches a socket; backends ([`tokio`], [`uring`] on Linux) move bytes between
//! sockets and that core and call your [`Handler`]. See `ARCHITECTURE.md` for
//! the path of a byte.

// `unsafe` is refused everywhere but in the four modules that need it, each
// allowing it where it is declared, and every block in them says why it is
// sound (ARCHITECTURE.md, "unsafe").
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
// What the backends share (wakers, the server loops' plumbing) is partly dead
// in a build with one backend or none; the full build is checked for dead
// code (CI runs clippy with every feature).
#![cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(dead_code))]

mod connection;
mod driver;

#[cfg(feature = "axum")]
pub mod axum;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "hyper")]
pub mod hyper;
#[cfg(feature = "pubsub")]
pub mod pubsub;
#[cfg(feature = "socket")]
pub mod socket;
#[cfg(feature = "stream")]
pub mod stream;
#[cfg(feature = "tokio")]
pub mod tokio;
#[cfg(all(target_os = "linux", feature = "uring"))]
pub mod uring;

// The sans-I/O core: the protocol, the handshakes, the buffer pool. Its
// modules are this crate's own paths (`crate::proto`); users get the names
// they meet below, and the whole core as `rapidws::rapidws_core`.
pub(crate) use rapidws_core::{handshake, pool, proto};

/// The sans-I/O core this crate drives (protocol, handshakes, buffer pool),
/// for code that works below the servers: a driver of its own, a frame
/// codec, a fuzz target. Every name a server or client user meets is also
/// at this crate's root.
pub use rapidws_core;

pub use bytes::Bytes;
pub use connection::config::{Config, SlowConsumer};
pub use connection::conn::{Conn, Ready, SendError};
pub use connection::endpoint::ServerHandle;
pub use connection::handler::{Accept, Handler, HttpResponse, Reject, ServerHandler};
pub use handshake::Request;
pub use proto::deflate::{DeflateConfig, DeflateParams};
pub use proto::{CloseCode, Limits, Message, MessageKind, OwnedMessage};

/// How many rounds a randomized test runs: all of them natively, a fiftieth
/// under Miri, which interprets every instruction and is thousands of times
/// slower (see ARCHITECTURE.md, "Testing").
#[cfg(test)]
pub(crate) const fn rounds(native: usize) -> usize {
    if cfg!(miri) { native / 50 + 1 } else { native }
}

/// The README's examples are compiled as doc tests, so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
