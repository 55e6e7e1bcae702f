//! How a `PubSub` is set up ([`Builder`]: the overflow policy, what each
//! topic keeps, who is told of occupancy, the byte budgets), and how it is
//! asked to publish ([`PublishOptions`]) and to subscribe ([`Subscribe`],
//! [`Start`]).

use std::sync::Arc;
use std::time::Duration;

use super::budget::Limits;
use super::envelope::Envelope;
use super::history::{History, Position};
use super::registry::Occupancy;
use crate::connection::conn::Conn;
use crate::proto::CloseCode;

/// What happens to a published message for a subscriber whose outbound
/// queue is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// That subscriber misses the message; it is counted in
    /// [`Stats::dropped`]. The default: one slow reader costs itself
    /// messages, and nobody else anything.
    ///
    /// [`Stats::dropped`]: super::Stats::dropped
    #[default]
    Drop,
    /// That subscriber is closed with this code (1008 or 1013, typically),
    /// after what is already queued for it; counted in [`Stats::closed`].
    /// (A message its server loop was too far behind to take is still
    /// missed, not closed for: see the module docs.)
    ///
    /// [`Stats::closed`]: super::Stats::closed
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
    ///
    /// [`Stats::conflated`]: super::Stats::conflated
    Conflate {
        /// What a keyless publication that does not fit does: `None` drops
        /// it for that subscriber, `Some(code)` closes the subscriber.
        close: Option<CloseCode>,
    },
}

/// How to publish: what [`PubSub::publish_with`] takes.
///
/// [`PubSub::publish_with`]: super::PubSub::publish_with
#[derive(Clone, Copy, Debug, Default)]
pub struct PublishOptions<'a> {
    pub(super) key: Option<&'a str>,
    pub(super) except: Option<&'a Conn>,
    /// To WebTransport subscribers as datagrams (else on their streams).
    pub(super) datagram: bool,
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
    ///
    /// [`PubSub::subscribe_session`]: super::PubSub::subscribe_session
    /// [`Stats::dropped`]: super::Stats::dropped
    #[cfg(feature = "http3")]
    pub fn datagram(mut self) -> PublishOptions<'a> {
        self.datagram = true;
        self
    }
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
    ///
    /// [`Subscribed::recovered`]: super::Subscribed::recovered
    After(Position),
}

/// How to subscribe: where to start, and how deliveries are shown.
#[derive(Clone, Default)]
pub struct Subscribe {
    pub(super) start: Start,
    pub(super) envelope: Option<Arc<dyn Envelope>>,
    /// A whole replay is not told (see [`Subscribe::after_handoff`]).
    pub(super) quiet_when_whole: bool,
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

/// How a [`PubSub`] is set up: the overflow policy, what each topic
/// keeps, who is told of occupancy.
///
/// [`PubSub`]: super::PubSub
#[derive(Clone, Default)]
pub struct Builder {
    pub(super) overflow: Overflow,
    history: History,
    /// `(prefix, history)`: the longest matching prefix wins.
    history_by_prefix: Vec<(String, History)>,
    pub(super) occupancy: Option<Occupancy>,
    pub(super) limits: Limits,
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

    /// How often history is swept (kept publications past their age let
    /// go, topics left with nothing forgotten): half the shortest age any
    /// topic keeps, at most a second; `None` without history.
    pub(super) fn sweep_every(&self) -> Option<Duration> {
        let ages = std::iter::once(self.history)
            .chain(self.history_by_prefix.iter().map(|(_, h)| *h))
            .filter(History::is_on)
            .map(|h| h.max_age());
        let shortest = ages.min()?;
        Some((shortest / 2).clamp(Duration::from_millis(10), Duration::from_secs(1)))
    }

    pub(super) fn history_of(&self, topic: &str) -> History {
        self.history_by_prefix
            .iter()
            .find(|(prefix, _)| topic.starts_with(prefix.as_str()))
            .map_or(self.history, |(_, history)| *history)
    }
}
