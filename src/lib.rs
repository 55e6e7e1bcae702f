//! A lean, strict, fast WebSocket library for services that hold many
//! long-lived connections (RFC 6455, with permessage-deflate, RFC 7692):
//! servers on tokio, io_uring and any async stream, upgrades inside axum and
//! hyper, a client, and pub/sub.
//!
//! # Start here
//!
//! A server is a [`Handler`] (what to do with a connection's messages) plus
//! a [`ServerHandler`] (whether to accept an upgrade), run by a server:
//!
//! ```no_run
//! use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request, ServerHandler};
//!
//! struct Echo;
//!
//! impl Handler for Echo {
//!     type State = ();
//!     fn on_message(&self, conn: &Conn, _: &mut (), msg: Message<'_>) {
//!         let _ = conn.send(msg);
//!     }
//! }
//! impl ServerHandler for Echo {
//!     fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::io::Result<()> {
//!     rapidws::tokio::Server::bind("127.0.0.1:9001", Echo, Config::default())
//!         .await?
//!         .serve()
//!         .await
//! }
//! ```
//!
//! Your project needs `tokio` with the `macros` and `rt-multi-thread`
//! features for `#[tokio::main]`.
//!
//! # Which entry point
//!
//! | you have | use | feature |
//! |---|---|---|
#![cfg_attr(
    feature = "tokio",
    doc = "| a service on tokio | [`tokio::Server`] | `tokio` (default) |"
)]
#![cfg_attr(
    not(feature = "tokio"),
    doc = "| a service on tokio | `tokio::Server` | `tokio` (default) |"
)]
#![cfg_attr(
    all(target_os = "linux", feature = "uring"),
    doc = "| Linux 6.0+, no tokio needed | [`uring::Server`] | `uring` |"
)]
#![cfg_attr(
    not(all(target_os = "linux", feature = "uring")),
    doc = "| Linux 6.0+, no tokio needed | `uring::Server` | `uring` |"
)]
#![cfg_attr(
    feature = "axum",
    doc = "| an axum app | [`axum::WebSocketUpgrade`] | `axum` |"
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = "| an axum app | `axum::WebSocketUpgrade` | `axum` |"
)]
#![cfg_attr(
    feature = "hyper",
    doc = "| a hyper server | [`hyper::upgrade`] | `hyper` |"
)]
#![cfg_attr(
    not(feature = "hyper"),
    doc = "| a hyper server | `hyper::upgrade` | `hyper` |"
)]
#![cfg_attr(
    feature = "stream",
    doc = "| a stream of your own (TLS, a Unix socket, a pipe) | [`stream::Server`] | `stream` |"
)]
#![cfg_attr(
    not(feature = "stream"),
    doc = "| a stream of your own (TLS, a Unix socket, a pipe) | `stream::Server` | `stream` |"
)]
#![cfg_attr(
    feature = "socket",
    doc = "| an async task per connection instead of callbacks | [`socket::SocketHandler`] | `socket` (default) |"
)]
#![cfg_attr(
    not(feature = "socket"),
    doc = "| an async task per connection instead of callbacks | `socket::SocketHandler` | `socket` (default) |"
)]
#![cfg_attr(
    all(feature = "tokio", feature = "rustls"),
    doc = "| wss on tokio | [`tokio::Server::tls`] | `rustls` |"
)]
#![cfg_attr(
    not(all(feature = "tokio", feature = "rustls")),
    doc = "| wss on tokio | `tokio::Server::tls` | `rustls` |"
)]
#![cfg_attr(
    all(target_os = "linux", feature = "uring", feature = "rustls"),
    doc = "| wss on io_uring | [`uring::Server::tls`] | `rustls` |"
)]
#![cfg_attr(
    not(all(target_os = "linux", feature = "uring", feature = "rustls")),
    doc = "| wss on io_uring | `uring::Server::tls` | `rustls` |"
)]
#![cfg_attr(
    feature = "http3",
    doc = "| HTTP/3 (QUIC), RFC 9220 | [`h3::serve`] | `http3` |"
)]
#![cfg_attr(
    not(feature = "http3"),
    doc = "| HTTP/3 (QUIC), RFC 9220 | `h3::serve` | `http3` |"
)]
#![cfg_attr(
    feature = "http3",
    doc = "| WebTransport (the browser's `new WebTransport(url)`) | [`h3::serve_with`] | `http3` |"
)]
#![cfg_attr(
    not(feature = "http3"),
    doc = "| WebTransport (the browser's `new WebTransport(url)`) | `h3::serve_with` | `http3` |"
)]
#![cfg_attr(
    feature = "client",
    doc = "| a client | [`client::Client`] | `client` |"
)]
#![cfg_attr(
    not(feature = "client"),
    doc = "| a client | `client::Client` | `client` |"
)]
#![cfg_attr(
    feature = "pubsub",
    doc = "| topics and fan-out, Redis between nodes | [`pubsub::PubSub`] | `pubsub`, `redis` |"
)]
#![cfg_attr(
    not(feature = "pubsub"),
    doc = "| topics and fan-out, Redis between nodes | `pubsub::PubSub` | `pubsub`, `redis` |"
)]
#![cfg_attr(
    feature = "mux",
    doc = "| many streams on one connection (smux) | [`mux::Mux`] | `mux` |"
)]
#![cfg_attr(
    not(feature = "mux"),
    doc = "| many streams on one connection (smux) | `mux::Mux` | `mux` |"
)]
#![cfg_attr(
    feature = "route",
    doc = "| one port for many protocols, routed by the first bytes | [`route::Router`] | `route` |"
)]
#![cfg_attr(
    not(feature = "route"),
    doc = "| one port for many protocols, routed by the first bytes | `route::Router` | `route` |"
)]
//! | deploys that keep every connection (Linux) | `handoff_socket`, `take_over` on the tokio and io_uring servers | `handoff` |
//!
//! Callbacks run on the server's own threads with each message borrowed
//! from the read buffer; the async socket gives each connection a task and
//! owned messages. Every connection has a bounded outbound queue:
//! [`Conn::send`] refuses a message that does not fit (`QueueFull`), and
//! [`Conn::ready`] waits for room; [`Config`] sets the bounds, the timeouts
//! and what happens to a peer that reads too slowly ([`SlowConsumer`]).
//!
//! The protocol itself (frames, the handshakes, permessage-deflate, the
//! buffer pool) is the sans-I/O crate [`rapidws_core`], re-exported here.
//! `ARCHITECTURE.md` in the repository is the map of the layers, with a page
//! per subsystem in `docs/`.

// `unsafe` is refused everywhere but in the four modules that need it, each
// allowing it where it is declared, and every block in them says why it is
// sound (docs/unsafe.md).
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
// What the backends share (wakers, the server loops' plumbing) is partly dead
// in a build with one backend or none; the full build is checked for dead
// code (CI runs clippy with every feature).
#![cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(dead_code))]

mod connection;
mod driver;
#[cfg(all(target_os = "linux", feature = "handoff"))]
mod handoff;
#[cfg(any(feature = "bus", feature = "centrifuge"))]
mod jwt;

#[cfg(feature = "axum")]
pub mod axum;
#[cfg(feature = "bus")]
pub mod bus;
#[cfg(feature = "centrifuge")]
pub mod centrifuge;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "http3")]
pub mod h3;
#[cfg(feature = "hyper")]
pub mod hyper;
#[cfg(feature = "mux")]
pub mod mux;
#[cfg(feature = "pubsub")]
pub mod pubsub;
#[cfg(feature = "route")]
pub mod route;
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
pub use connection::handler::{Accept, Handler, HttpResponse, Reject, ServerHandler};
pub use connection::hub::ServerHandle;
pub use connection::proxied::{Network, NetworkError, ProxyProtocol};
pub use connection::spread::Spread;
pub use handshake::Request;
pub use proto::deflate::{DeflateConfig, DeflateParams};
pub use proto::{CloseCode, Limits, Message, MessageKind, OwnedMessage};

/// How many rounds a randomized test runs: all of them natively, a fiftieth
/// under Miri, which interprets every instruction and is thousands of times
/// slower (see docs/testing.md, Miri).
#[cfg(test)]
pub(crate) const fn rounds(native: usize) -> usize {
    if cfg!(miri) { native / 50 + 1 } else { native }
}

/// The README's examples are compiled as doc tests, so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
