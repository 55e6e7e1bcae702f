//! What the calls answer and what is counted: [`Published`],
//! [`Subscribed`], [`Stats`], [`Usage`], and why a subscription is
//! refused ([`PubSubError`], [`check_topic`]).

use super::history::Position;

/// The longest topic name, in bytes.
pub const MAX_TOPIC_LEN: usize = 1024;

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
    ///
    /// [`Limits::topic_bytes`]: super::Limits::topic_bytes
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
///
/// [`Overflow::Conflate`]: super::Overflow::Conflate
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Publishes that had at least one subscriber (besides a sender it
    /// skipped).
    pub published: u64,
    /// Messages queued for a subscriber.
    pub delivered: u64,
    /// Messages a subscriber missed because its queue was full
    /// ([`Overflow::Drop`]), or, under either policy, because its server
    /// loop was too far behind its publishers to take them (see the module
    /// docs).
    ///
    /// [`Overflow::Drop`]: super::Overflow::Drop
    pub dropped: u64,
    /// Subscribers closed because their queue was full
    /// ([`Overflow::Close`]).
    ///
    /// [`Overflow::Close`]: super::Overflow::Close
    pub closed: u64,
    /// Messages for a subscriber whose connection had started closing by
    /// the time the delivery reached it (its subscriptions were ending).
    pub gone: u64,
    /// Publications sent from history to subscribers that resumed or
    /// asked for the latest.
    pub replayed: u64,
    /// Publications replaced, for a subscriber they were waiting for, by a
    /// newer one with the same key ([`Overflow::Conflate`]).
    ///
    /// [`Overflow::Conflate`]: super::Overflow::Conflate
    pub conflated: u64,
}

/// What a `PubSub` holds now against its byte budgets ([`Limits`]), and
/// what the budgets refused or let go so far.
///
/// [`Limits`]: super::Limits
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Topics kept: with subscribers, or with history only.
    pub topics: usize,
    /// What they hold (names and state), as [`Limits::topic_bytes`]
    /// counts it.
    ///
    /// [`Limits::topic_bytes`]: super::Limits::topic_bytes
    pub topic_bytes: usize,
    /// Topics not made because that budget was full.
    pub topics_refused: u64,
    /// Publications kept in every topic's history.
    pub history_publications: usize,
    /// What they hold, as [`Limits::history_bytes`] counts it.
    ///
    /// [`Limits::history_bytes`]: super::Limits::history_bytes
    pub history_bytes: usize,
    /// Kept publications let go, oldest first, because that budget was
    /// full.
    pub history_shed: u64,
    /// What waits for conflating subscribers, as
    /// [`Limits::waiting_bytes`] counts it.
    ///
    /// [`Limits::waiting_bytes`]: super::Limits::waiting_bytes
    pub waiting_bytes: usize,
}

/// What a publish did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The subscribers on this node it was addressed to (the sender left
    /// out by [`PubSub::publish_except`] is not counted). Each gets it in
    /// its server loop's next turn, unless its queue is full then (see
    /// [`Overflow`]); [`Stats`] counts what became of each.
    ///
    /// [`PubSub::publish_except`]: super::PubSub::publish_except
    /// [`Overflow`]: super::Overflow
    pub subscribers: usize,
    /// Where it sits in its topic; `None` if the topic had neither
    /// subscribers nor history here (nothing numbers it then).
    pub position: Option<Position>,
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
    ///
    /// [`Envelope::recovery`]: super::Envelope::recovery
    /// [`Start::After`]: super::Start::After
    pub recovered: Option<bool>,
    /// Publications sent from history.
    pub replayed: usize,
    /// The topic's latest position when it joined; live deliveries follow
    /// it.
    pub position: Position,
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
