//! A notification bus as a component (feature `bus`): topics over
//! WebSockets with positions and resume, publishing over HTTP, tokens,
//! mounted on any server or on an axum router.
//!
//! ```no_run
//! use rapidws::bus::Bus;
//! use rapidws::pubsub::{History, PubSub};
//!
//! # async fn run() -> std::io::Result<()> {
//! let pubsub = PubSub::builder()
//!     .history(History::new(1000, std::time::Duration::from_secs(300)))
//!     .build();
//! let bus = Bus::builder(pubsub).publish_token("0123456789abcdef-publish").build();
//! // On the standalone server: `/ws`, `/publish`, `/topics/<t>`, `/stats`.
//! let server = rapidws::tokio::Server::bind("127.0.0.1:9004", bus, bus_config()).await?;
//! server.serve().await
//! # }
//! # fn bus_config() -> rapidws::Config { rapidws::Config::default() }
//! ```
//!
//! With the `axum` feature, `Bus::router` gives the same routes as an
//! `axum::Router` to merge or nest into an app's.
//!
//! The contract, which every driver and the router serve alike (the whole
//! of it, with examples, is in `docs/bus.md`):
//! - `GET /ws?topics=a,b` subscribes; `positions=1` wraps each delivery in
//!   JSON with its position, `since=<topic>:<epoch>:<offset>` resumes a
//!   topic after a position ([`Since`]), `latest=a,b` starts each with its
//!   latest kept publication, `token=<jwt>` presents a token. Text
//!   commands `subscribe:<t>`, `unsubscribe:<t>`, `token:<jwt>`.
//! - `POST /publish/<topic>[?key=K]` publishes its body; `POST /publish`
//!   takes NDJSON batches; `GET /topics/<topic>` and `GET /stats` tell.
//!
//! What a `positions=1` subscriber reads is [`Incoming`]; the subscriber
//! that reconnects and resumes by itself is `rapidws::client::Subscriber`
//! (with the `client` feature), and `clients/js` in the repository is the
//! same for browsers and Node.
//!
//! | file | concern |
//! |---|---|
//! | `builder.rs` | [`Builder`]: the pub/sub, the Redis bridge, tokens, the paths |
//! | `socket.rs` | the WebSocket side: the upgrade's query, commands, handoff |
//! | `http.rs` | the HTTP side: publish, batches, topics, stats, who may see them |
//! | `lines.rs` | one NDJSON publication, read and checked |
//! | `query.rs` | the subscribe URL's query, [`Since`] |
//! | `wire.rs` | the JSON envelope, [`Incoming`] |
//! | `auth.rs` | the publish token; subscribers' JWTs, their grants and expiry |
//! | `router.rs` | `Bus::router`: the routes on axum (feature `axum`) |

mod auth;
mod builder;
mod http;
mod lines;
mod query;
#[cfg(feature = "axum")]
mod router;
mod socket;
mod wire;

use std::sync::Arc;

pub use crate::handshake::{percent_decode, percent_encode};
pub use auth::MAX_LIFETIME;
pub use builder::Builder;
pub use query::{MAX_TOPICS_PER_CONNECTION, Since};
pub use socket::Member;
pub use wire::{Data, Incoming, ParseIncomingError};

use crate::connection::handler::HttpResponse;
use crate::handshake::Request;
use crate::pubsub::{Envelope, PubSub};

/// Answers for requests outside the bus's paths (see
/// [`Builder::fallback`]).
type Fallback = dyn Fn(&Request<'_>) -> Option<HttpResponse> + Send + Sync;

/// The bus: a [`ServerHandler`](crate::ServerHandler) to give any server,
/// and (with `axum`) a router. Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

struct Inner {
    pubsub: PubSub,
    /// What `positions=1` subscribers get (one for all: each publication
    /// is wrapped once).
    json: Arc<dyn Envelope>,
    /// Kept for as long as the bus runs: dropping it stops the relaying.
    #[cfg(feature = "redis")]
    bridge: Option<crate::pubsub::redis::Bridge>,
    publish_token: Option<auth::PublishToken>,
    tokens: Option<auth::Tokens>,
    /// `/stats`, `/topics/` and `/metrics` need the publish token (tokens
    /// are on, and the counters are not opened).
    closed_stats: bool,
    /// The WebSocket's path (`/ws`).
    path: String,
    fallback: Option<Box<Fallback>>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("path", &self.inner.path)
            .field("publish_token", &self.inner.publish_token.is_some())
            .field("tokens", &self.inner.tokens.is_some())
            .finish_non_exhaustive()
    }
}

impl Bus {
    /// A bus over `pubsub` (its overflow policy, history and limits are
    /// the bus's): see [`Builder`].
    pub fn builder(pubsub: PubSub) -> Builder {
        Builder::new(pubsub)
    }

    /// The pub/sub the bus publishes on: to publish from the application
    /// itself, or read its counters.
    pub fn pubsub(&self) -> &PubSub {
        &self.inner.pubsub
    }

    /// The Redis bridge the bus relays through, if it has one.
    #[cfg(feature = "redis")]
    pub fn bridge(&self) -> Option<&crate::pubsub::redis::Bridge> {
        self.inner.bridge.as_ref()
    }
}
