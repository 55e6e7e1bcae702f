//! The connection: one WebSocket's life above the sans-I/O core, the same on
//! every driver and in both roles. Nothing here does I/O either; a driver
//! (`tokio/`, `uring/`, `stream/`) moves bytes and calls [`lifecycle`].
//!
//! | file | job |
//! |---|---|
//! | `lifecycle.rs` | `Lifecycle`: the whole life (handshake, open, closing, FIN, linger, done); time in, deadlines out; the driver's call contract |
//! | `upgrade.rs` | the server's answer to an upgrade request: limit, hook, negotiation, `101` |
//! | `dispatch.rs` | session events to the handler's callbacks; panics to 1011; `on_close` once |
//! | `conn.rs` | `Conn`, the handle: sends, replies, `ready`, close |
//! | `outbox.rs` | what a `Conn` and the driver share: the outbound queue, the phase, the waiting tasks; every change to it |
//! | `membership.rs` | the pub/sub topics a connection joined (feature `pubsub`) |
//! | `record.rs` | a connection as data, the same from every driver: what a handoff carries to the next process (feature `handoff`) |
//! | `keepalive.rs` | pings and the idle timeout, counted in a loop's sweeps |
//! | `handler.rs` | the `Handler` trait and the upgrade hook's `Accept`, `Reject`, `HttpResponse` |
//! | `config.rs` | `Config`: limits, timeouts, sizes, the slow-consumer policy |
//! | `origin.rs` | which web pages may open a WebSocket (`Origin` against `Host`, or a list) |
//! | `proxied.rs` | behind proxies: the PROXY protocol on a listener (which sources, the header read before the request), trusted forwarding headers |
//! | `hub.rs` | what every connection of a server (or a client) shares: settings, pool, counts, shutdown |
//! | `spread.rs` | a spread shutdown: closes spread over a window, with jitter |
//! | `meters.rs` | the hub's metric handles (feature `metrics`), Prometheus names |
//! | `budgets.rs` | the byte budgets' metrics (mux, WebTransport), reported on time by one thread (feature `metrics`) |
//! | `wake.rs` | how a `Conn` reaches its driver: a loop's woken list, or a task's waker |

#[cfg(any(feature = "mux", feature = "http3"))]
pub(crate) mod budgets;
pub(crate) mod config;
pub(crate) mod conn;
pub(crate) mod dispatch;
pub(crate) mod handler;
pub(crate) mod hub;
pub(crate) mod keepalive;
pub(crate) mod lifecycle;
#[cfg(feature = "pubsub")]
pub(crate) mod membership;
pub(crate) mod meters;
pub(crate) mod origin;
pub(crate) mod outbox;
pub(crate) mod proxied;
#[cfg(all(target_os = "linux", feature = "handoff"))]
pub(crate) mod record;
pub(crate) mod spread;
pub(crate) mod upgrade;
pub(crate) mod wake;
