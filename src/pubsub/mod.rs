//! Topics: subscribe connections, publish a message to all of a topic's
//! subscribers, framed once (feature `pubsub`).
//!
//! ```no_run
//! use rapidws::pubsub::PubSub;
//! use rapidws::{Accept, Conn, Handler, Message, Reject, Request, ServerHandler};
//!
//! struct Chat {
//!     rooms: PubSub,
//! }
//!
//! impl Handler for Chat {
//!     type State = ();
//!
//!     fn on_open(&self, conn: &Conn, _: &mut ()) {
//!         let _ = self.rooms.subscribe(conn, "lobby");
//!     }
//!     fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
//!         // Everyone in the lobby but the sender.
//!         self.rooms.publish_except("lobby", message, conn);
//!     }
//! }
//!
//! impl ServerHandler for Chat {
//!     fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! A publish numbers its message in its topic ([`Position`]), keeps it if
//! the topic has [`History`] (for a subscriber that comes back:
//! [`Start::After`]), frames it once ([`Prepared`], and once per
//! [`Envelope`]) and hands one job to each server loop that serves
//! subscribers of the topic, which queues it for each of them in its next
//! turn. Nothing a publish makes waits unbounded: a subscriber whose queue
//! is full is dealt with by the [`Overflow`] policy; while the deliveries
//! waiting for one loop weigh 16 MiB, its subscribers miss further
//! publishes (counted in [`Stats::dropped`] under every policy); what all
//! topics, histories and conflation waits hold together is bounded in
//! bytes ([`Limits`]). Subscriptions end with their connection.
//! `docs/delivery.md` in the repository has the design.
//!
//! | file | concern |
//! |---|---|
//! | `options.rs` | [`Builder`], [`Overflow`], [`PublishOptions`], [`Subscribe`], [`Start`]: how a `PubSub` is set up and asked |
//! | `outcomes.rs` | [`Published`], [`Subscribed`], [`Stats`], [`Usage`], [`PubSubError`]: what the calls answer and count |
//! | `subscribe.rs` | subscribe and unsubscribe (connections, WebTransport sessions), who is subscribed |
//! | `read.rs` | [`PubSub::kept`]: a topic's history read without subscribing |
//! | `replay.rs` | what a new subscriber is sent from history, and whether it was recovered |
//! | `publish.rs` | the publish: numbered, kept and handed to each server loop under the topic's lock |
//! | `deliver.rs` | a delivery a server loop runs: queued for each of its subscribers, counted once |
//! | `conflate.rs` | [`Overflow::Conflate`]: what waits for a full subscriber, and its flush |
//! | `usage.rs` | [`PubSub::stats`], [`PubSub::usage`], history let go past its budget |
//! | `busy.rs` | whether this thread may hold a registry lock, and what waits until it does not |
//! | `relay.rs` | what a `PubSub` hands the Redis bridge, and is handed back |
//! | `bridged.rs` | what the bridge calls: publications numbered in Redis, history loaded from it |
//! | `registry.rs` | topics in shards; each topic's subscribers grouped by the loop that serves them |
//! | `history.rs` | [`Epoch`], [`Position`], [`History`] (the bounds per topic) |
//! | `log.rs` | a topic's kept publications, and what follows a position in them |
//! | `histories.rs` | every topic's history against one byte budget, oldest let go first |
//! | `budget.rs` | [`Limits`] and what is held against each |
//! | `pending.rs` | what waits for one conflating subscriber, by key |
//! | `envelope.rs` | [`Envelope`], [`Publication`]: a publication's frames, one per envelope |
//! | `sessions.rs` | WebTransport sessions as a topic's subscribers |
//! | `handoff.rs` | [`PubSub::hand_off`] and [`PubSub::take_over`]: topics carried to the next process |
//! | `sweeper.rs` | the thread that lets history past its age go, on time |
//! | `meters.rs` | what pub/sub reports to `metrics`; a delivery's counts |
//! | `redis/` | the bridge between nodes through Redis (feature `redis`) |
//!
//! [`Prepared`]: crate::proto::Prepared

mod bridged;
mod budget;
mod busy;
mod conflate;
mod deliver;
mod envelope;
mod handoff;
mod histories;
mod history;
mod log;
mod meters;
mod options;
mod outcomes;
mod pending;
mod publish;
mod read;
#[cfg(feature = "redis")]
pub mod redis;
mod registry;
mod relay;
mod replay;
mod sessions;
mod subscribe;
mod sweeper;
#[cfg(test)]
mod tests;
mod usage;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use budget::Limits;
use budget::Tally;
pub use envelope::{Envelope, Publication};
pub use history::{Epoch, History, ParsePositionError, Position};
pub use options::{Builder, Overflow, PublishOptions, Start, Subscribe};
pub use outcomes::{MAX_TOPIC_LEN, PubSubError, Published, Stats, Subscribed, Usage, check_topic};
pub use read::Kept;
use registry::{Occupancy, Registry};
use relay::Relay;

/// Topics and their subscribers. Cheap to clone (a handle); share one
/// between the handler, other tasks and threads. See the module docs.
#[derive(Clone)]
pub struct PubSub {
    inner: Arc<Inner>,
}

impl Default for PubSub {
    fn default() -> PubSub {
        Builder::default().build()
    }
}

struct Inner {
    registry: Registry,
    /// What waits for conflating subscribers (`Limits::waiting_bytes`).
    waiting: Arc<Tally>,
    /// Where this node's own publishes also go (the Redis bridge), if
    /// anywhere (shared with the registry's occupancy callback).
    relay: Arc<RwLock<Option<Arc<dyn Relay>>>>,
    config: Builder,
    published: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    closed: AtomicU64,
    gone: AtomicU64,
    replayed: AtomicU64,
    conflated: AtomicU64,
    /// The metric handles (nothing without feature `metrics`).
    meters: meters::PubSubMeters,
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSub")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PubSub {
    /// No topics yet; full subscriber queues drop messages
    /// ([`Overflow::Drop`]); no history.
    pub fn new() -> PubSub {
        PubSub::default()
    }

    /// No topics yet; full subscriber queues are handled by `overflow`.
    pub fn with_overflow(overflow: Overflow) -> PubSub {
        PubSub::builder().overflow(overflow).build()
    }

    /// Sets up a `PubSub`: overflow policy, history.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// What `topic` keeps.
    pub fn history(&self, topic: &str) -> History {
        self.inner.config.history_of(topic)
    }
}

impl Builder {
    /// The `PubSub`.
    pub fn build(self) -> PubSub {
        let relay: Arc<RwLock<Option<Arc<dyn Relay>>>> = Arc::default();
        // The handler's callback, and the relay's (to follow only the
        // topics someone here watches).
        let (user, told) = (self.occupancy.clone(), relay.clone());
        let occupancy: Occupancy = Arc::new(move |topic, occupied| {
            if let Some(user) = &user {
                user(topic, occupied);
            }
            if let Some(relay) = told.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
                relay.occupancy(topic, occupied);
            }
        });
        let limits = self.limits;
        let sweep_every = self.sweep_every();
        let pubsub = PubSub {
            inner: Arc::new(Inner {
                registry: Registry::new(Some(occupancy), limits),
                waiting: Arc::new(Tally::new(limits.waiting)),
                relay,
                config: self,
                published: AtomicU64::new(0),
                delivered: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                closed: AtomicU64::new(0),
                gone: AtomicU64::new(0),
                replayed: AtomicU64::new(0),
                conflated: AtomicU64::new(0),
                meters: meters::PubSubMeters::new(),
            }),
        };
        // With metrics, the budgets' gauges are refreshed on the same
        // pass, history or not.
        let gauges = cfg!(feature = "metrics").then_some(Duration::from_secs(1));
        if let Some(every) = sweep_every.or(gauges) {
            sweeper::start(&pubsub.inner, every);
        }
        pubsub
    }
}
