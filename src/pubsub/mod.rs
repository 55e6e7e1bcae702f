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
//! **Framed once.** A publish frames its message once ([`Prepared`]); every
//! server connection's queue takes a reference to the same bytes. With
//! permessage-deflate, subscribers that compress each message on its own
//! (no server context takeover: rapidws's default) share one compressed
//! frame per distinct set of parameters, made by the first of them to need
//! it. A subscriber that keeps its compression context gets the message
//! uncompressed (RFC 7692 lets any message go uncompressed): its
//! compressed messages depend on what that one connection was sent
//! before, so nothing can be shared with it, and even a frame compressed
//! on its own would leave its peer's window out of step with its own
//! compressor. Measured (`cargo bench --bench deflate -- publish`, 1 KiB
//! JSON-like messages): compressing for such a subscriber costs 2.5 µs of
//! CPU per subscriber per message, against 27 ns for queuing the shared
//! frame (92x), to send 25% of the bytes instead of all of them (a shared
//! frame compressed on its own is 46%). At 10,000 subscribers that is
//! 25 ms of CPU per message; a server that wants the bytes saved should
//! leave server context takeover off (the default), so that its
//! subscribers share one compression.
//!
//! **Fan-out.** A topic's subscribers are kept by the server loop that
//! serves them (a tokio connection group, an io_uring reactor). A publish
//! hands each loop that has subscribers one job, from any thread; the loop
//! runs it at the start of its next turn, queues the message for each of
//! its subscribers, and writes each connection once in that turn, with
//! whatever else was queued for it (many publishes to one subscriber go out
//! in one write). Connections with a task of their own (the stream driver:
//! wss on tokio, hyper and axum upgrades) are sent to from the publishing
//! thread; their queue is the hand-off.
//!
//! **Bounded.** A subscriber whose queue holds `max_outbound_bytes` is not
//! sent the message: by default it is dropped for that subscriber and
//! counted ([`Stats::dropped`]); with [`Overflow::Close`] the subscriber is
//! closed with the given code instead; with [`Overflow::Conflate`] a keyed
//! message waits for it, replacing an older one with its key (what waits
//! is counted as what it holds, and bounded by the queue's bound again and
//! by the budget of all waits). `Config::slow_consumer` plays
//! no part. The hand-off to a loop is bounded too: while the deliveries
//! waiting for one loop, or being run by it, weigh 16 MiB (their frames,
//! plus 64 bytes each), publishes are not handed to it (but one always
//! is, so a message that large still gets through), and its subscribers
//! miss them (counted in [`Stats::dropped`] under every policy). A burst
//! of 100,000 small publishes fits; a loop further behind than that would
//! not deliver them soon anyway. Nothing else a publish makes waits
//! anywhere.
//!
//! **Positions.** Every publication on a topic gets a [`Position`]: the
//! topic's [`Epoch`] and an offset that counts its publications from 1, in
//! the one order every subscriber gets them in (a topic's publishes are
//! numbered and handed on under the topic's lock). [`PubSub::publish`]
//! returns it. A topic that keeps no history and has no subscribers is
//! forgotten, and so is its epoch: its next publication starts a new one.
//! Positions are this node's: with the Redis bridge, each node numbers
//! what it delivers.
//!
//! **History and resume.** With [`History`] on (for every topic, or for
//! topics by prefix: [`Builder`]), a topic keeps its last publications,
//! as the frames already built. A subscriber that comes back with the
//! last position it saw ([`Start::After`]) is sent every publication after
//! it, then live ones: exactly once and in order, also while publishers
//! race its subscribe (the replay and the joining happen under the topic's
//! lock, and a delivery already on its way passes the new subscriber by).
//! If the history no longer holds them all, or the epoch is not the
//! topic's, it is sent nothing from history and is told it was not
//! recovered ([`Subscribed::recovered`], and its envelope's
//! [`Envelope::recovery`] message). [`Start::Latest`] sends the latest
//! publication kept first ("last value" on subscribe).
//!
//! **Budgets.** What clients and publishers can make a `PubSub` keep is
//! bounded in bytes across all of them ([`Limits`], [`Builder::limits`]):
//! every topic's history together (the oldest kept publications, whatever
//! their topic, are let go first: a subscriber resuming from before them
//! is told it was not recovered), the topics themselves (a new one past
//! the budget is refused: [`PubSubError::TooManyTopics`]) and every
//! conflation wait (a publication past it is dropped for that subscriber,
//! its gap told). [`PubSub::usage`] says what each holds. Kept
//! publications past their age are let go on time, within half their age
//! (at most a second), whether anything is published or not.
//!
//! **Envelopes.** A subscription may show its deliveries in an
//! [`Envelope`] (say, JSON with the topic and position around the
//! payload): each publication is wrapped and framed once per envelope, for
//! all the subscribers that share it, and the frame is kept for replay.
//! With an envelope, a delivery that a full queue drops is followed by the
//! envelope's "not recovered" message (once per gap, after whatever was
//! delivered before it), so its client knows to resync.
//!
//! **Life.** Subscriptions end with their connection (when it closes, or
//! when its close starts: no message could reach it after that).
//!
//! [`Prepared`]: crate::proto::Prepared

mod budget;
mod conflate;
mod envelope;
mod handoff;
mod histories;
mod history;
mod log;
mod meters;
mod pending;
#[cfg(feature = "redis")]
pub mod redis;
mod registry;
mod sessions;
mod sweeper;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::connection::conn::{Conn, SendError};
use crate::connection::membership::Membership;
use crate::connection::wake::ConnWake;
use crate::proto::{CloseCode, Message, MessageKind, OpCode};
pub use budget::Limits;
use budget::Tally;
pub use envelope::{Envelope, Publication};
pub use history::{Epoch, History, ParsePositionError, Position};
use log::Since;
use registry::{Local, Numbering, Registry, Route, Subscriber, Topic, tell_gap};

/// The longest topic name, in bytes.
pub const MAX_TOPIC_LEN: usize = 1024;

/// What happens to a published message for a subscriber whose outbound
/// queue is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// That subscriber misses the message; it is counted in
    /// [`Stats::dropped`]. The default: one slow reader costs itself
    /// messages, and nobody else anything.
    #[default]
    Drop,
    /// That subscriber is closed with this code (1008 or 1013, typically),
    /// after what is already queued for it; counted in [`Stats::closed`].
    /// (A message its server loop was too far behind to take is still
    /// missed, not closed for: see "Bounded" in the module docs.)
    Close(CloseCode),
    /// A publication with a key ([`PublishOptions::key`]) that does not fit
    /// waits for room instead, and replaces one with the same key that is
    /// waiting: the subscriber ends up with the latest value per key, its
    /// connection kept, and is told of the gap (its envelope's
    /// [`Envelope::recovery`] with false) before the next it gets. What
    /// waits is bounded by the connection's queue bound again; a keyless
    /// publication that does not fit (or one past that bound) is dropped,
    /// or with `close: Some(code)` the subscriber is closed with it.
    /// Replacements are counted in [`Stats::conflated`].
    Conflate {
        /// What a keyless publication that does not fit does: `None` drops
        /// it for that subscriber, `Some(code)` closes the subscriber.
        close: Option<CloseCode>,
    },
}

/// How to publish: what [`PubSub::publish_with`] takes.
#[derive(Clone, Copy, Debug, Default)]
pub struct PublishOptions<'a> {
    key: Option<&'a str>,
    except: Option<&'a Conn>,
    /// To WebTransport subscribers as datagrams (else on their streams).
    datagram: bool,
}

impl<'a> PublishOptions<'a> {
    /// To every subscriber, no key.
    pub fn new() -> PublishOptions<'a> {
        PublishOptions::default()
    }

    /// The publication's key (a symbol, an entity's id): under
    /// [`Overflow::Conflate`], a newer publication with the same key
    /// replaces this one for a subscriber it is still waiting for.
    pub fn key(mut self, key: &'a str) -> PublishOptions<'a> {
        self.key = Some(key);
        self
    }

    /// To everyone but `conn` (typically the sender).
    pub fn except(mut self, conn: &'a Conn) -> PublishOptions<'a> {
        self.except = Some(conn);
        self
    }

    /// To WebTransport subscribers ([`PubSub::subscribe_session`]) as a
    /// datagram each: unreliable and unordered, and dropped for a session
    /// whose path carries less (counted in [`Stats::dropped`]); without
    /// this, on each subscription's stream, in order. WebSocket
    /// subscribers get it as a message either way. (A publish that goes
    /// through the Redis bridge reaches them on their streams.)
    #[cfg(feature = "http3")]
    pub fn datagram(mut self) -> PublishOptions<'a> {
        self.datagram = true;
        self
    }
}

/// Why a subscription was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PubSubError {
    /// The topic name is empty.
    EmptyTopic,
    /// The topic name is longer than [`MAX_TOPIC_LEN`] bytes.
    TopicTooLong,
    /// The connection is closing or closed.
    Closed,
    /// The topic is not there, and the topics' byte budget has no room
    /// for another ([`Limits::topic_bytes`]).
    TooManyTopics,
}

impl std::fmt::Display for PubSubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PubSubError::EmptyTopic => "empty topic name",
            PubSubError::TopicTooLong => "topic name longer than 1024 bytes",
            PubSubError::Closed => "connection closed",
            PubSubError::TooManyTopics => "too many topics: the server's budget for them is full",
        })
    }
}

impl std::error::Error for PubSubError {}

/// Counts since the `PubSub` was made. Every subscriber a publish was
/// addressed to ([`Published::subscribers`]) ends up counted once, in
/// `delivered`, `dropped`, `closed`, `gone` or `conflated`, when its
/// server loop has run the delivery (and, for one waiting under
/// [`Overflow::Conflate`], when it was sent or replaced).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Publishes that had at least one subscriber (besides a sender it
    /// skipped).
    pub published: u64,
    /// Messages queued for a subscriber.
    pub delivered: u64,
    /// Messages a subscriber missed because its queue was full
    /// ([`Overflow::Drop`]), or, under either policy, because its server
    /// loop was too far behind its publishers to take them (see "Bounded"
    /// in the module docs).
    pub dropped: u64,
    /// Subscribers closed because their queue was full
    /// ([`Overflow::Close`]).
    pub closed: u64,
    /// Messages for a subscriber whose connection had started closing by
    /// the time the delivery reached it (its subscriptions were ending).
    pub gone: u64,
    /// Publications sent from history to subscribers that resumed or
    /// asked for the latest.
    pub replayed: u64,
    /// Publications replaced, for a subscriber they were waiting for, by a
    /// newer one with the same key ([`Overflow::Conflate`]).
    pub conflated: u64,
}

/// What a `PubSub` holds now against its byte budgets ([`Limits`]), and
/// what the budgets refused or let go so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Topics kept: with subscribers, or with history only.
    pub topics: usize,
    /// What they hold (names and state), as [`Limits::topic_bytes`]
    /// counts it.
    pub topic_bytes: usize,
    /// Topics not made because that budget was full.
    pub topics_refused: u64,
    /// Publications kept in every topic's history.
    pub history_publications: usize,
    /// What they hold, as [`Limits::history_bytes`] counts it.
    pub history_bytes: usize,
    /// Kept publications let go, oldest first, because that budget was
    /// full.
    pub history_shed: u64,
    /// What waits for conflating subscribers, as
    /// [`Limits::waiting_bytes`] counts it.
    pub waiting_bytes: usize,
}

/// Where a node's own publishes go besides its subscribers: other nodes
/// (the Redis bridge). Called on the publisher's thread; must not block.
pub(crate) trait Relay: Send + Sync {
    fn relay(&self, outbound: Outbound<'_>) -> Relayed;

    /// A topic got its first subscriber here (`true`) or lost its last
    /// (under the topic's lock: must not block).
    fn occupancy(&self, _topic: &str, _occupied: bool) {}
}

/// A publish of this node, handed to the [`Relay`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Outbound<'a> {
    pub(crate) topic: &'a str,
    pub(crate) key: Option<&'a str>,
    pub(crate) opcode: OpCode,
    pub(crate) payload: &'a [u8],
    /// The topic's history here: on, Redis numbers and keeps it.
    pub(crate) history: History,
    pub(crate) except: Option<&'a Conn>,
    /// Told what became of a recorded publish, once this node has
    /// delivered it (or given up waiting for it).
    pub(crate) reply: Option<Reply>,
}

/// Told what a publish numbered elsewhere did here.
pub(crate) type Reply = Box<dyn FnOnce(Published) + Send>;

/// What the relay did with a publish.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Passed on (or lost on the way, counted there): deliver it here now.
    Sent,
    /// Numbered and kept elsewhere: it comes back to be delivered here
    /// with every other node's, in the order of its position.
    Recorded,
    /// It has history but could not be recorded (Redis gone, or too far
    /// behind): deliver it here now, numbered here, and the topic's
    /// history is broken (see [`registry::Numbering::Lost`]).
    Unrecorded,
}

/// What became of a publication numbered elsewhere.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
pub(crate) enum Placed {
    Delivered(Published),
    /// At or before the topic's latest here: delivered already.
    Duplicate,
    /// After a gap: the publications after `after` are missing here.
    Missing {
        after: u64,
    },
}

/// A publication read back from elsewhere's history.
#[derive(Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Loaded {
    pub(crate) offset: u64,
    pub(crate) key: Option<String>,
    pub(crate) opcode: OpCode,
    pub(crate) payload: Vec<u8>,
    pub(crate) at: Instant,
}

/// What a publish did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The subscribers on this node it was addressed to (the sender left
    /// out by [`PubSub::publish_except`] is not counted). Each gets it in
    /// its server loop's next turn, unless its queue is full then (see
    /// [`Overflow`]); [`Stats`] counts what became of each.
    pub subscribers: usize,
    /// Where it sits in its topic; `None` if the topic had neither
    /// subscribers nor history here (nothing numbers it then).
    pub position: Option<Position>,
}

/// Where a subscription starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Start {
    /// With the next publication (the default).
    #[default]
    Now,
    /// With the latest publication the topic keeps, if it keeps one
    /// ("last value" on subscribe; needs [`History`] of at least one).
    Latest,
    /// Right after this position: every later publication the topic
    /// keeps is replayed first, exactly once and in order, then live ones
    /// follow. See [`Subscribed::recovered`].
    After(Position),
}

/// How to subscribe: where to start, and how deliveries are shown.
#[derive(Clone, Default)]
pub struct Subscribe {
    start: Start,
    envelope: Option<Arc<dyn Envelope>>,
    /// A whole replay is not told (see [`Subscribe::after_handoff`]).
    quiet_when_whole: bool,
}

impl std::fmt::Debug for Subscribe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscribe")
            .field("start", &self.start)
            .field("envelope", &self.envelope.is_some())
            .finish()
    }
}

impl Subscribe {
    /// From now on, each payload as it was published.
    pub fn new() -> Subscribe {
        Subscribe::default()
    }

    /// Where the subscription starts.
    pub fn start(mut self, start: Start) -> Subscribe {
        self.start = start;
        self
    }

    /// Deliveries shown in `envelope` (one `Arc` shared by many
    /// subscriptions: each publication is wrapped once for all of them).
    pub fn envelope(mut self, envelope: Arc<dyn Envelope>) -> Subscribe {
        self.envelope = Some(envelope);
        self
    }

    /// A subscription carried on from the previous process (a handoff:
    /// `Handler::take_over`), which had delivered up to `position`: what
    /// was published since is replayed as with [`Start::After`], but the
    /// client, which never resubscribed, is told only if something is
    /// missing ([`Envelope::recovery`] with false), not that all is well.
    pub fn after_handoff(mut self, position: Position) -> Subscribe {
        self.start = Start::After(position);
        self.quiet_when_whole = true;
        self
    }
}

/// What a subscribe did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribed {
    /// False if the connection was subscribed already (nothing else was
    /// done then).
    pub added: bool,
    /// For [`Start::After`]: whether the subscriber was kept whole (every
    /// publication after its position was replayed). False when the
    /// history no longer held them all, the epoch was not the topic's, the
    /// offset was ahead of the topic, or the replay did not fit the
    /// connection's queue (see [`Envelope::recovery`]). `None` for the
    /// other starts.
    pub recovered: Option<bool>,
    /// Publications sent from history.
    pub replayed: usize,
    /// The topic's latest position when it joined; live deliveries follow
    /// it.
    pub position: Position,
}

/// How a [`PubSub`] is set up: the overflow policy, what each topic
/// keeps, who is told of occupancy.
#[derive(Clone, Default)]
pub struct Builder {
    overflow: Overflow,
    history: History,
    /// `(prefix, history)`: the longest matching prefix wins.
    history_by_prefix: Vec<(String, History)>,
    occupancy: Option<registry::Occupancy>,
    limits: Limits,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("overflow", &self.overflow)
            .field("history", &self.history)
            .field("history_by_prefix", &self.history_by_prefix)
            .field("occupancy", &self.occupancy.is_some())
            .field("limits", &self.limits)
            .finish()
    }
}

impl Builder {
    /// What happens to a publication for a subscriber whose queue is full.
    pub fn overflow(mut self, overflow: Overflow) -> Builder {
        self.overflow = overflow;
        self
    }

    /// What every topic keeps (unless a prefix says otherwise).
    pub fn history(mut self, history: History) -> Builder {
        self.history = history;
        self
    }

    /// What topics whose names start with `prefix` keep (`""` matches
    /// every topic; the longest matching prefix wins).
    pub fn history_for(mut self, prefix: &str, history: History) -> Builder {
        self.history_by_prefix.retain(|(p, _)| p != prefix);
        self.history_by_prefix.push((prefix.to_owned(), history));
        self.history_by_prefix
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self
    }

    /// Calls `occupancy(topic, true)` when a topic gets its first
    /// subscriber on this node and `occupancy(topic, false)` when it loses
    /// its last: what a service needs to watch an upstream source only
    /// while someone watches the topic. Called in order for each topic
    /// (under the topic's lock, on the thread that subscribed or
    /// unsubscribed, or where the connection ended), so it must be quick,
    /// must not block, and must not call back into this `PubSub` (hand the
    /// event to a channel or a task instead).
    pub fn on_occupancy(
        mut self,
        occupancy: impl Fn(&str, bool) + Send + Sync + 'static,
    ) -> Builder {
        self.occupancy = Some(Arc::new(occupancy));
        self
    }

    /// What all topics, histories and conflation waits may hold together,
    /// in bytes (see [`Limits`] for the defaults and what happens past
    /// each).
    pub fn limits(mut self, limits: Limits) -> Builder {
        self.limits = limits;
        self
    }

    /// The `PubSub`.
    pub fn build(self) -> PubSub {
        let relay: Arc<RwLock<Option<Arc<dyn Relay>>>> = Arc::default();
        // The handler's callback, and the relay's (to follow only the
        // topics someone here watches).
        let (user, told) = (self.occupancy.clone(), relay.clone());
        let occupancy: registry::Occupancy = Arc::new(move |topic, occupied| {
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

    /// How often history is swept (kept publications past their age let
    /// go, topics left with nothing forgotten): half the shortest age any
    /// topic keeps, at most a second; `None` without history.
    fn sweep_every(&self) -> Option<Duration> {
        let ages = std::iter::once(self.history)
            .chain(self.history_by_prefix.iter().map(|(_, h)| *h))
            .filter(History::is_on)
            .map(|h| h.max_age());
        let shortest = ages.min()?;
        Some((shortest / 2).clamp(Duration::from_millis(10), Duration::from_secs(1)))
    }

    fn history_of(&self, topic: &str) -> History {
        self.history_by_prefix
            .iter()
            .find(|(prefix, _)| topic.starts_with(prefix.as_str()))
            .map_or(self.history, |(_, history)| *history)
    }
}

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

    /// Subscribes `conn` to `topic` from now on, from a callback or any
    /// thread. Returns false if it was subscribed already.
    pub fn subscribe(&self, conn: &Conn, topic: &str) -> Result<bool, PubSubError> {
        Ok(self.subscribe_with(conn, topic, &Subscribe::new())?.added)
    }

    /// Subscribes `conn` to `topic`, starting where `how` says and showing
    /// deliveries in its envelope: see [`Start`] and [`Subscribed`]. What
    /// is replayed is queued for `conn` before this returns, and before any
    /// later publication.
    pub fn subscribe_with(
        &self,
        conn: &Conn,
        topic: &str,
        how: &Subscribe,
    ) -> Result<Subscribed, PubSubError> {
        check_topic(topic)?;
        let busy = busy::Busy::enter();
        let joined = self.with_topic(topic, |entry, state| {
            let route = Route::of(conn);
            let position = Position {
                epoch: state.epoch,
                offset: state.last,
            };
            if state.contains(&route, conn.key()) {
                let subscribed = Subscribed {
                    added: false,
                    recovered: None,
                    replayed: 0,
                    position,
                };
                return Err(subscribed);
            }
            let replay = self.inner.replay(conn, entry, state, how);
            let was_empty = state.unoccupied();
            let from = state.last + 1;
            state.add(Subscriber {
                conn: conn.clone(),
                from,
                envelope: how.envelope.clone(),
                gap: replay.recovered == Some(false),
                pending: None,
            });
            if was_empty {
                self.inner.registry.occupy(&entry.name);
            }
            let subscribed = Subscribed {
                added: true,
                recovered: replay.recovered,
                replayed: replay.replayed,
                position,
            };
            Ok((entry.name.clone(), subscribed))
        })?;
        let (name, subscribed) = match joined {
            Ok(joined) => joined,
            Err(already) => return Ok(already),
        };
        drop(busy);
        // Recorded on the connection after the registry: if the connection
        // has started closing, it ends (or has ended) without this topic
        // in its list, so the registry entry is taken back here.
        match conn.join(&self.membership(), &name) {
            Ok(_) => Ok(subscribed),
            Err(_) => {
                self.inner
                    .registry
                    .remove(topic, conn.key(), &Route::of(conn));
                Err(PubSubError::Closed)
            }
        }
    }

    /// Runs `f` with `topic` locked: made if it is not there, looked up
    /// again if it was forgotten between the lookup and the lock.
    /// [`PubSubError::TooManyTopics`] if it is not there and the topics'
    /// budget has no room for it.
    fn with_topic<T>(
        &self,
        topic: &str,
        f: impl FnOnce(&Topic, &mut registry::TopicState) -> T,
    ) -> Result<T, PubSubError> {
        loop {
            let entry = self
                .inner
                .registry
                .open(topic, self.inner.config.history_of(topic))
                .ok_or(PubSubError::TooManyTopics)?;
            let mut state = entry.lock();
            if !state.gone {
                return Ok(f(&entry, &mut state));
            }
        }
    }

    /// Unsubscribes `conn` from `topic`; false if it was not subscribed.
    pub fn unsubscribe(&self, conn: &Conn, topic: &str) -> bool {
        if !conn.part(&self.membership(), topic) {
            return false;
        }
        let removed = self
            .inner
            .registry
            .remove(topic, conn.key(), &Route::of(conn));
        self.inner.ended(removed);
        true
    }

    /// Subscribes a WebTransport session to `topic` from now on: each
    /// publication's payload goes to it on a stream of its own, or as a
    /// datagram when the publisher says so ([`PublishOptions::datagram`]);
    /// the wire format and the bounds are in the module docs of
    /// `pubsub::sessions` (and ARCHITECTURE.md). Returns false if it was
    /// subscribed already. The subscription ends with the session.
    #[cfg(feature = "http3")]
    pub fn subscribe_session(
        &self,
        session: &crate::h3::Session,
        topic: &str,
    ) -> Result<bool, PubSubError> {
        check_topic(topic)?;
        let link = session.link();
        if link.is_closed() {
            return Err(PubSubError::Closed);
        }
        let busy = busy::Busy::enter();
        let added = self.with_topic(topic, |entry, state| {
            if state.sessions.contains(link) {
                return None;
            }
            let was_empty = state.unoccupied();
            let writer = state.sessions.add(link);
            if was_empty {
                self.inner.registry.occupy(&entry.name);
            }
            Some((writer, entry.name.clone()))
        })?;
        let Some((writer, name)) = added else {
            return Ok(false);
        };
        drop(busy);
        // However the writer ends (its session's end, an unsubscribe, its
        // runtime shutting down before it ran), its subscription goes.
        let leave = Leave {
            pubsub: self.clone(),
            key: link.key(),
            token: writer.token,
            topic: name,
        };
        link.runtime.spawn(async move {
            writer.run(&leave.topic).await;
            drop(leave);
        });
        Ok(true)
    }

    /// Ends a session's subscription to `topic` (its stream is finished);
    /// false if it was not subscribed.
    #[cfg(feature = "http3")]
    pub fn unsubscribe_session(&self, session: &crate::h3::Session, topic: &str) -> bool {
        self.inner
            .registry
            .remove_session(topic, session.link().key(), None)
    }

    /// The topics `conn` is subscribed to here, in no particular order.
    pub fn topics(&self, conn: &Conn) -> Vec<Arc<str>> {
        conn.joined(&self.membership())
    }

    /// How many connections are subscribed to `topic` now.
    pub fn subscribers(&self, topic: &str) -> usize {
        self.inner.registry.count(topic)
    }

    /// How many topics have at least one subscriber.
    pub fn topic_count(&self) -> usize {
        self.inner.registry.topics()
    }

    /// `topic`'s latest position here (offset 0 if nothing was published in
    /// its epoch yet); `None` if the topic has neither subscribers nor
    /// history here.
    pub fn position(&self, topic: &str) -> Option<Position> {
        let entry = self.inner.registry.find(topic)?;
        let state = entry.lock();
        (!state.gone).then_some(Position {
            epoch: state.epoch,
            offset: state.last,
        })
    }

    /// Publishes `message` to every subscriber of `topic`, from anywhere (a
    /// callback, another task, another thread): see [`Published`]. A
    /// topic's subscribers get its publications in one order, the order
    /// of their offsets (so a publisher's own are in the order it
    /// published them).
    pub fn publish(&self, topic: &str, message: Message<'_>) -> Published {
        self.publish_with(topic, message, PublishOptions::new())
    }

    /// [`PubSub::publish`] to everyone but `except` (typically the sender).
    pub fn publish_except(&self, topic: &str, message: Message<'_>, except: &Conn) -> Published {
        self.publish_with(topic, message, PublishOptions::new().except(except))
    }

    /// [`PubSub::publish`] with a key, or to everyone but one connection:
    /// see [`PublishOptions`].
    pub fn publish_with(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Published {
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        self.publish_through(topic, message, options, None)
            .unwrap_or(nobody)
    }

    /// [`PubSub::publish_with`], and `None` if the relay took it to be
    /// numbered elsewhere (then `reply` is told what it did here, later).
    pub(crate) fn publish_through(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
        reply: Option<Reply>,
    ) -> Option<Published> {
        let opcode = data_opcode(message.kind());
        let payload = message.as_bytes();
        let relayed = self.relay(topic, &options, (opcode, payload), reply);
        let unrecorded = match relayed {
            Relayed::Recorded => return None,
            Relayed::Sent => false,
            Relayed::Unrecorded => true,
        };
        Some(self.publish_frame(topic, options, opcode, payload, unrecorded))
    }

    /// [`PubSub::publish`] for a payload given as bytes: text is checked
    /// for UTF-8 ([`SendError::InvalidUtf8`] if it is not).
    pub fn publish_bytes(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
    ) -> Result<Published, SendError> {
        let message = match kind {
            MessageKind::Text => {
                Message::Text(std::str::from_utf8(payload).map_err(|_| SendError::InvalidUtf8)?)
            }
            MessageKind::Binary => Message::Binary(payload),
        };
        Ok(self.publish(topic, message))
    }

    /// Counts since this `PubSub` was made.
    pub fn stats(&self) -> Stats {
        let inner = &self.inner;
        Stats {
            published: inner.published.load(Ordering::Relaxed),
            delivered: inner.delivered.load(Ordering::Relaxed),
            dropped: inner.dropped.load(Ordering::Relaxed),
            closed: inner.closed.load(Ordering::Relaxed),
            gone: inner.gone.load(Ordering::Relaxed),
            replayed: inner.replayed.load(Ordering::Relaxed),
            conflated: inner.conflated.load(Ordering::Relaxed),
        }
    }

    /// What this `PubSub` holds now against its byte budgets, and what
    /// they refused or let go so far.
    pub fn usage(&self) -> Usage {
        self.inner.usage()
    }

    /// Hands a publish of this node to the relay, if there is one (the
    /// topic's history looked up only then: a node without a bridge pays
    /// nothing here).
    fn relay(
        &self,
        topic: &str,
        options: &PublishOptions<'_>,
        (opcode, payload): (OpCode, &[u8]),
        reply: Option<Reply>,
    ) -> Relayed {
        if check_topic(topic).is_err() {
            return Relayed::Sent; // nobody can be subscribed to it, anywhere
        }
        let relay = self.inner.relay.read().unwrap_or_else(|p| p.into_inner());
        match relay.as_ref() {
            Some(relay) => relay.relay(Outbound {
                topic,
                key: options.key,
                opcode,
                payload,
                history: self.inner.config.history_of(topic),
                except: options.except,
                reply,
            }),
            None => Relayed::Sent,
        }
    }

    /// Sets where this node's publishes also go, unless something is set
    /// already (false then).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn set_relay_if_none(&self, relay: Arc<dyn Relay>) -> bool {
        let mut slot = self.inner.relay.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(relay);
        true
    }

    /// Clears where this node's publishes also go, if it is `relay`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn clear_relay_if(&self, relay: &Arc<dyn Relay>) {
        let mut slot = self.inner.relay.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|set| Arc::ptr_eq(set, relay)) {
            *slot = None;
        }
    }

    /// Publishes a message that came from another node: to this node's
    /// subscribers only, never relayed again.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn publish_relayed(
        &self,
        topic: &str,
        key: Option<&str>,
        opcode: OpCode,
        payload: &[u8],
    ) -> Published {
        let options = PublishOptions {
            key,
            ..PublishOptions::default()
        };
        self.publish_frame(topic, options, opcode, payload, false)
    }

    /// Delivers a publication numbered elsewhere (Redis), at `position`,
    /// to this node's subscribers, in offset order: one this node has
    /// delivered already is a duplicate, one after a gap is refused
    /// unless `over_gap` (then every subscriber is told of the gap). A
    /// new epoch restarts the topic's numbering here (its subscribers told
    /// of the gap if it had one from Redis before).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn publish_at(
        &self,
        topic: &str,
        position: Position,
        (key, opcode, payload): (Option<&str>, OpCode, &[u8]),
        except: Option<&Conn>,
        over_gap: bool,
    ) -> Placed {
        let inner = &*self.inner;
        let history = inner.config.history_of(topic);
        let options = PublishOptions {
            key,
            except,
            datagram: false,
        };
        if check_topic(topic).is_err() || !history.is_on() {
            // Not kept here: numbered here, like a relayed publish.
            return Placed::Delivered(self.publish_frame(topic, options, opcode, payload, false));
        }
        let placed = loop {
            let Some(entry) = inner.registry.open(topic, history) else {
                // No room for the topic here: nobody can be subscribed to it.
                break Placed::Delivered(Published {
                    subscribers: 0,
                    position: None,
                });
            };
            let _busy = busy::Busy::enter();
            let mut state = entry.lock();
            if state.gone {
                continue;
            }
            match state.numbering {
                Numbering::Here => state.renumber(&entry.name, position, false),
                Numbering::Lost => state.renumber(&entry.name, position, true),
                Numbering::Redis if state.epoch != position.epoch => {
                    state.renumber(&entry.name, position, true);
                }
                Numbering::Redis if position.offset <= state.last => return Placed::Duplicate,
                Numbering::Redis if position.offset > state.last + 1 => {
                    if !over_gap {
                        return Placed::Missing { after: state.last };
                    }
                    state.renumber(&entry.name, position, true);
                }
                Numbering::Redis => {}
            }
            let published = self.publish_locked(&entry, &mut state, options, opcode, payload);
            break Placed::Delivered(published);
        };
        inner.shed_history();
        placed
    }

    /// Takes what Redis keeps of `topic` (its `epoch`, its `last` offset,
    /// and its latest publications, oldest first) into this node's
    /// history: all of it if this node did not follow Redis's numbering
    /// yet, else only what is older than what it keeps. Nothing is
    /// delivered: subscribing afterwards replays from it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn load(&self, topic: &str, epoch: Epoch, last: u64, loaded: Vec<Loaded>) {
        let inner = &*self.inner;
        let history = inner.config.history_of(topic);
        if check_topic(topic).is_err() || !history.is_on() {
            return;
        }
        let Some(entry) = inner.registry.open(topic, history) else {
            return; // no room for the topic: subscribers resume not recovered
        };
        // Looked at and changed under one guard: a topic let go between
        // two (the sweeper forgets an empty one) would take it with it.
        let mut state = entry.lock();
        if state.gone {
            drop(state);
            return self.load(topic, epoch, last, loaded); // made again
        }
        match state.numbering {
            Numbering::Redis if state.epoch == epoch => {}
            numbering => {
                let tell = numbering != Numbering::Here;
                state.renumber(
                    &entry.name,
                    Position {
                        epoch,
                        offset: last + 1,
                    },
                    tell,
                );
                state.last = last;
            }
        }
        let now = Instant::now();
        let publications = loaded
            .into_iter()
            .filter(|l| l.offset <= state.last)
            .map(|l| {
                let position = Position {
                    epoch,
                    offset: l.offset,
                };
                Arc::new(Publication::new(
                    entry.name.clone(),
                    position,
                    l.key.as_deref(),
                    l.opcode,
                    &l.payload,
                    l.at,
                ))
            })
            .collect();
        let last = state.last;
        if let Some(log) = &mut state.log {
            log.prepend(publications, last, now);
        }
        drop(state);
        inner.shed_history();
    }

    /// What this node's history of `topic` lacks to answer `start` as
    /// Redis's would: the publications after the first offset and before
    /// the second (`None`: up to the latest); `None` if it lacks nothing
    /// (it follows Redis's numbering and holds what follows the position,
    /// or, for the latest, has one).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn missing(&self, topic: &str, start: Start) -> Option<(u64, Option<u64>)> {
        let after = match start {
            Start::Now => return None,
            Start::Latest => 0,
            Start::After(seen) => seen.offset,
        };
        let Some(entry) = self.inner.registry.find(topic) else {
            return Some((after, None));
        };
        let state = entry.lock();
        if state.gone || state.numbering != Numbering::Redis {
            return Some((after, None));
        }
        let log = state.log.as_ref()?;
        let first = log.first().unwrap_or(state.last + 1);
        let covered = match start {
            Start::Now => true,
            Start::Latest => state.last == 0 || !log.is_empty(),
            Start::After(seen) => {
                seen.epoch != state.epoch || seen.offset >= state.last || first <= seen.offset + 1
            }
        };
        (!covered).then_some((after, Some(first)))
    }

    /// Whether a subscribe to `topic` would find it, or room for it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has_room_for(&self, topic: &str) -> bool {
        self.inner.registry.has_room_for(topic)
    }

    /// The topics with subscribers here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn occupied(&self) -> Vec<Arc<str>> {
        self.inner.registry.occupied()
    }

    /// Whether this node takes `topic`'s numbering from Redis now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn is_numbered_by_redis(&self, topic: &str) -> bool {
        self.inner
            .registry
            .find(topic)
            .is_some_and(|entry| entry.lock().numbering == Numbering::Redis)
    }

    /// The topics whose numbering this node takes from Redis, and their
    /// latest offsets here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn numbered_by_redis(&self) -> Vec<(Arc<str>, Position)> {
        self.inner.registry.numbered_by_redis()
    }

    fn membership(&self) -> Arc<dyn Membership> {
        self.inner.clone()
    }

    fn publish_frame(
        &self,
        topic: &str,
        options: PublishOptions<'_>,
        opcode: OpCode,
        payload: &[u8],
        unrecorded: bool,
    ) -> Published {
        let inner = &*self.inner;
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        if check_topic(topic).is_err() {
            return nobody;
        }
        let history = inner.config.history_of(topic);
        loop {
            let found = if history.is_on() {
                inner.registry.open(topic, history)
            } else {
                inner.registry.find(topic)
            };
            // No subscribers, and (with history) no room to keep it.
            let Some(entry) = found else {
                return nobody;
            };
            let _busy = busy::Busy::enter();
            let mut state = entry.lock();
            if state.gone {
                if history.is_on() {
                    continue; // forgotten meanwhile: made again
                }
                return nobody; // its last subscriber left meanwhile
            }
            if unrecorded && state.numbering == Numbering::Redis {
                // Redis's history of it misses this one from here on: an
                // epoch of this node's own until Redis numbers it again.
                state.numbering = Numbering::Lost;
                state.epoch = Epoch::new();
                if let Some(log) = &mut state.log {
                    log.clear();
                }
            }
            let published = self.publish_locked(&entry, &mut state, options, opcode, payload);
            drop(state);
            if history.is_on() {
                inner.shed_history();
            }
            return published;
        }
    }

    /// Numbers the publication, keeps it, and hands it to every route,
    /// under the topic's lock (so that every subscriber gets a topic's
    /// publications in the order of their offsets).
    fn publish_locked(
        &self,
        entry: &Topic,
        state: &mut registry::TopicState,
        options: PublishOptions<'_>,
        opcode: OpCode,
        payload: &[u8],
    ) -> Published {
        let inner = &self.inner;
        let PublishOptions { key, except, .. } = options;
        let sampled = meters::sample();
        state.last += 1;
        let position = Position {
            epoch: state.epoch,
            offset: state.last,
        };
        let now = match state.log {
            Some(_) => Instant::now(),
            None => epoch_start(),
        };
        let publication = Arc::new(
            Publication::new(entry.name.clone(), position, key, opcode, payload, now)
                .timed(sampled),
        );
        if let Some(log) = &mut state.log {
            log.push(publication.clone(), now);
        }
        let mut reached = state.subscribers();
        if reached == 0 {
            return Published {
                subscribers: 0,
                position: Some(position),
            };
        }
        // The sender's key, and its route if it is among the subscribers.
        let mut sender_route = None;
        let except = except.map(|conn| {
            let route = Route::of(conn);
            if state.contains(&route, conn.key()) {
                reached -= 1;
                sender_route = Some(route);
            }
            conn.key()
        });
        if reached > 0 {
            inner.published.fetch_add(1, Ordering::Relaxed);
            inner.meters.published();
        }
        let bytes = publication.plain().frame().len();
        for local in &state.locals {
            match &local.route {
                Route::Loop(list) => {
                    // Counted now, without the lock a delivery may hold:
                    // the publisher never waits.
                    let sender_here = sender_route.as_ref().is_some_and(|r| r.same(&local.route));
                    let missed = local.count().saturating_sub(usize::from(sender_here));
                    let (shared, local, publication) =
                        (inner.clone(), local.clone(), publication.clone());
                    let job = Box::new(move || shared.deliver(&local, &publication, except));
                    if !list.post(job, bytes) {
                        // The loop is far behind its publishers: its
                        // subscribers miss this message, as a full queue's would.
                        inner.dropped.fetch_add(missed as u64, Ordering::Relaxed);
                        inner.meters.loop_behind(missed as u64);
                    }
                }
                Route::Direct => inner.deliver(local, &publication, except),
            }
        }
        #[cfg(feature = "http3")]
        if !state.sessions.is_empty() {
            let handed = state
                .sessions
                .deliver(&entry.name, payload, options.datagram);
            inner
                .delivered
                .fetch_add(handed.delivered, Ordering::Relaxed);
            inner.dropped.fetch_add(handed.dropped, Ordering::Relaxed);
        }
        Published {
            subscribers: reached,
            position: Some(position),
        }
    }
}

/// A session's subscription, taken out of its topic when this goes.
#[cfg(feature = "http3")]
struct Leave {
    pubsub: PubSub,
    key: (usize, u64),
    token: u64,
    topic: Arc<str>,
}

#[cfg(feature = "http3")]
impl Drop for Leave {
    fn drop(&mut self) {
        let registry = &self.pubsub.inner.registry;
        registry.remove_session(&self.topic, self.key, Some(self.token));
    }
}

/// Times a sampled publish's delivery on `conn` (the last of a walk it
/// reached: the one that waited for all the others) from `since`, the
/// publish call, to its frame handed to the kernel (feature `metrics`).
/// Set right after the walk: on a server loop nothing is written in
/// between; a connection with a task of its own may have written some of
/// its queue meanwhile, which only makes the time longer.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn probe(conn: Option<Conn>, since: Option<Instant>) {
    #[cfg(feature = "metrics")]
    if let (Some(conn), Some(since)) = (conn, since) {
        conn.shared().lock().probe(since);
    }
}

/// A time to stamp publications that no history keeps (never read).
fn epoch_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// What a replay did.
struct Replay {
    recovered: Option<bool>,
    replayed: usize,
}

impl Inner {
    /// Sends a new subscriber what `how` asks for from `entry`'s history,
    /// under the topic's lock; then, for a resume, whether it was
    /// recovered (through its envelope).
    fn replay(
        &self,
        conn: &Conn,
        entry: &Topic,
        state: &registry::TopicState,
        how: &Subscribe,
    ) -> Replay {
        let envelope = how.envelope.as_ref();
        let mut replayed = 0;
        // Sends one kept publication; false if it did not fit.
        let mut send = |publication: &Arc<Publication>| {
            let fits = conn
                .send_prepared(&publication.frame(envelope), None)
                .is_ok();
            replayed += usize::from(fits);
            fits
        };
        let recovered = match how.start {
            Start::Now => None,
            Start::Latest => {
                if let Some(latest) = state.log.as_ref().and_then(|log| log.latest()) {
                    send(latest);
                }
                None
            }
            Start::After(seen) => {
                // Everything of the epoch before a renumbering is nothing
                // missed of this one.
                let seen = match state.renumbered_from {
                    Some(ended) if ended == seen => Position {
                        epoch: state.epoch,
                        offset: 0,
                    },
                    _ => seen,
                };
                let whole = if seen.epoch != state.epoch || seen.offset > state.last {
                    false
                } else if seen.offset == state.last {
                    true // missed nothing
                } else {
                    match state
                        .log
                        .as_ref()
                        .map(|log| log.since(seen.offset, state.last))
                    {
                        Some(Since::All(missed)) => {
                            let mut whole = true;
                            for publication in missed {
                                if !send(publication) {
                                    whole = false;
                                    break;
                                }
                            }
                            whole
                        }
                        Some(Since::Gap) | None => false,
                    }
                };
                let told = !(whole && how.quiet_when_whole);
                if let Some(signal) = envelope
                    .filter(|_| told)
                    .and_then(|e| e.recovery(&entry.name, whole))
                {
                    let _ = conn.send_signal(&envelope::prepare(&signal));
                }
                Some(whole)
            }
        };
        self.replayed.fetch_add(replayed as u64, Ordering::Relaxed);
        Replay {
            recovered,
            replayed,
        }
    }

    /// Queues `publication` for `local`'s subscribers (but `except`), on
    /// their loop's thread (or, for `Route::Direct`, the publisher's).
    fn deliver(
        self: &Arc<Self>,
        local: &Arc<Local>,
        publication: &Arc<Publication>,
        except: Option<usize>,
    ) {
        let (close_on_full, conflate) = match self.config.overflow {
            Overflow::Drop => (None, false),
            Overflow::Close(code) => (Some(code), false),
            Overflow::Conflate { .. } => (None, true),
        };
        let _busy = busy::Busy::enter();
        let offset = publication.position().offset;
        let mut counts = Counts::default();
        // A timed publish: the last subscriber it reached, whose write is
        // timed (a clone only then).
        let sampled = publication.sampled();
        #[cfg_attr(not(feature = "metrics"), allow(unused_mut))]
        let mut timed: Option<Conn> = None;
        let mut subscribers = local.lock();
        if subscribers.is_plain_for(offset, conflate) {
            // The common case, as fast as before positions: one frame for
            // all, nothing to note per subscription.
            for conn in &subscribers.conns {
                if Some(conn.key()) == except {
                    continue;
                }
                let sent = counts.sent(
                    conn.send_prepared(publication.plain(), close_on_full),
                    close_on_full.is_some(),
                );
                #[cfg(feature = "metrics")]
                if sampled.is_some() && sent == Sent::Delivered {
                    timed = Some(conn.clone());
                }
                let _ = sent;
            }
            drop(subscribers);
            probe(timed, sampled);
            self.count(counts);
            return;
        }
        for subscriber in &mut subscribers.list {
            let conn = &subscriber.conn;
            if Some(conn.key()) == except || offset < subscriber.from {
                continue;
            }
            if conflate {
                self.conflate(local, subscriber, publication, &mut counts);
                continue;
            }
            let frame = publication.frame(subscriber.envelope.as_ref());
            let sent = counts.sent(
                conn.send_prepared(&frame, close_on_full),
                close_on_full.is_some(),
            );
            #[cfg(feature = "metrics")]
            if sampled.is_some() && sent == Sent::Delivered {
                timed = Some(conn.clone());
            }
            match sent {
                // Written only when set: most deliveries leave the
                // subscriber's entry (and its cache line) unwritten.
                Sent::Delivered if subscriber.gap => subscriber.gap = false,
                Sent::Dropped => tell_gap(subscriber, publication.topic()),
                _ => {}
            }
        }
        drop(subscribers);
        probe(timed, sampled);
        let flush_now = std::mem::take(&mut counts.flush_now);
        self.count(counts);
        for key in flush_now {
            self.flush(local, key);
        }
    }

    fn count(&self, counts: Counts) {
        self.meters.walked(&counts);
        for (counter, n) in [
            (&self.delivered, counts.delivered),
            (&self.dropped, counts.dropped),
            (&self.closed, counts.closed),
            (&self.gone, counts.gone),
            (&self.conflated, counts.conflated),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// One pass of the sweeper: kept publications past their age let go,
    /// the rest counted again (with `recount`: at most once a second),
    /// idle topics forgotten, the budget held, the gauges set.
    fn sweep(&self, now: Instant, recount: bool) {
        self.registry.sweep(now, recount);
        self.shed_history();
        self.meters.usage(&self.usage(), &self.config.limits);
    }

    fn usage(&self) -> Usage {
        let registry = &self.registry;
        let (topics, topic_bytes, topics_refused) = registry.kept();
        let histories = &registry.histories;
        Usage {
            topics,
            topic_bytes,
            topics_refused,
            history_publications: histories.kept(),
            history_bytes: histories.bytes(),
            history_shed: histories.shed_count(),
            waiting_bytes: self.waiting.used(),
        }
    }

    /// Lets go of the oldest kept publications while every topic's
    /// history holds more than its budget (no lock of the registry held).
    fn shed_history(&self) {
        let shed = self.registry.shed_history();
        if shed > 0 {
            self.meters.history_shed(shed);
        }
    }

    /// A subscription ended: what waited for it will not be sent.
    fn ended(&self, subscriber: Option<Subscriber>) {
        let waiting = subscriber.and_then(|s| s.pending).map_or(0, |p| p.len());
        if waiting > 0 {
            self.gone.fetch_add(waiting as u64, Ordering::Relaxed);
            self.meters.gone(waiting as u64);
        }
    }
}

/// What became of one send, as [`Counts::sent`] counted it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    Delivered,
    /// Its queue was full and the subscriber misses it.
    Dropped,
    /// Its queue was full and the subscriber is closed for it.
    Closed,
    /// The connection was closing: its end takes it off the topic.
    Gone,
}

impl Counts {
    /// Counts a delivery's send (`closing`: a full queue closes).
    fn sent(&mut self, result: Result<(), SendError>, closing: bool) -> Sent {
        let (counter, sent) = match result {
            Ok(()) => (&mut self.delivered, Sent::Delivered),
            Err(SendError::QueueFull) if closing => (&mut self.closed, Sent::Closed),
            Err(SendError::QueueFull) => (&mut self.dropped, Sent::Dropped),
            Err(_) => (&mut self.gone, Sent::Gone),
        };
        *counter += 1;
        sent
    }
}

/// What one delivery run did, counted once at its end.
#[derive(Default)]
struct Counts {
    delivered: u64,
    dropped: u64,
    closed: u64,
    gone: u64,
    conflated: u64,
    /// Conflating subscribers whose queue had room by the time their
    /// wait was set up: flushed once the list's lock is let go.
    flush_now: Vec<usize>,
}

/// Whether this thread is inside the registry's locks, and what waits for
/// it to be out: a flush a wake asked for there would take a lock this
/// thread may hold.
mod busy {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static DEPTH: Cell<u32> = const { Cell::new(0) };
        static LATER: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
    }

    /// Held while this thread may hold a registry lock.
    pub(super) struct Busy(());

    impl Busy {
        pub(super) fn enter() -> Busy {
            DEPTH.with(|depth| depth.set(depth.get() + 1));
            Busy(())
        }
    }

    impl Drop for Busy {
        fn drop(&mut self) {
            let depth = DEPTH.with(|depth| {
                depth.set(depth.get() - 1);
                depth.get()
            });
            if depth == 0 {
                while let Some(run) = LATER.with(|later| later.borrow_mut().pop()) {
                    run();
                }
            }
        }
    }

    /// Runs `run` now, or, if this thread is busy, once it is not.
    pub(super) fn later_or_now(run: impl FnOnce() + 'static) {
        if DEPTH.with(Cell::get) == 0 {
            run();
        } else {
            LATER.with(|later| later.borrow_mut().push(Box::new(run)));
        }
    }
}

impl Membership for Inner {
    fn leave(&self, key: usize, wake: &ConnWake, names: Vec<Arc<str>>) {
        let route = Route::of_wake(wake);
        for name in names {
            self.ended(self.registry.remove(&name, key, &route));
        }
    }
}

/// Whether `topic` can be subscribed to: not empty, at most
/// [`MAX_TOPIC_LEN`] bytes. `subscribe` checks the same; call this to check
/// a name before there is a connection (an upgrade's query, say).
pub fn check_topic(topic: &str) -> Result<(), PubSubError> {
    if topic.is_empty() {
        Err(PubSubError::EmptyTopic)
    } else if topic.len() > MAX_TOPIC_LEN {
        Err(PubSubError::TopicTooLong)
    } else {
        Ok(())
    }
}

fn data_opcode(kind: MessageKind) -> OpCode {
    match kind {
        MessageKind::Text => OpCode::Text,
        MessageKind::Binary => OpCode::Binary,
    }
}
