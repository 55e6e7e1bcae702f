//! What pub/sub reports through the `metrics` facade (feature `metrics`):
//! publishes, deliveries, what subscribers missed and why, and, for a
//! sample of publishes, how long a delivery took from the publish call to
//! its frame handed to the kernel. Handles are taken when the `PubSub` is
//! built (install the recorder first); counts are added once per delivery
//! walk, not per subscriber ([`Counts`], which the `PubSub`'s own
//! [`Stats`] take too). Without the feature, nothing.
//!
//! [`Stats`]: super::Stats

use std::time::Instant;

use crate::connection::conn::SendError;

#[cfg(feature = "metrics")]
use metrics::{Counter, Gauge};

/// What one delivery run did, counted once at its end.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) delivered: u64,
    pub(super) dropped: u64,
    pub(super) closed: u64,
    pub(super) gone: u64,
    pub(super) conflated: u64,
    /// Conflating subscribers whose queue had room by the time their
    /// wait was set up: flushed once the list's lock is let go.
    pub(super) flush_now: Vec<usize>,
}

impl Counts {
    /// Counts a delivery's send (`closing`: a full queue closes).
    pub(super) fn sent(&mut self, result: Result<(), SendError>, closing: bool) -> Sent {
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

/// What became of one send, as [`Counts::sent`] counted it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    Delivered,
    /// Its queue was full and the subscriber misses it.
    Dropped,
    /// Its queue was full and the subscriber is closed for it.
    Closed,
    /// The connection was closing: its end takes it off the topic.
    Gone,
}

/// One publish in this many (per publishing thread) is timed to the
/// kernel: a clock read and a probe on one subscriber per server loop.
#[cfg(feature = "metrics")]
const SAMPLE_EVERY: u32 = 64;

#[cfg(feature = "metrics")]
pub(crate) struct PubSubMeters {
    published: Counter,
    delivered: Counter,
    /// By reason: the queue was full, the server loop was too far behind,
    /// the subscriber was closed for its full queue, its connection was
    /// closing, a newer publication with the same key replaced it.
    queue_full: Counter,
    loop_behind: Counter,
    subscriber_closed: Counter,
    connection_closing: Counter,
    conflated: Counter,
    /// Kept publications let go for the history's byte budget.
    history_shed: Counter,
    /// Topics not made for the topics' byte budget (its total, set by the
    /// sweeper).
    topics_refused: Counter,
    /// Topics kept, and what the byte budgets hold and allow, set by the
    /// sweeper each pass (the family the other budgets use, `budget`
    /// `pubsub_topics`, `pubsub_history`, `pubsub_waiting`).
    topics: Gauge,
    held: [Gauge; 3],
    limits: [Gauge; 3],
}

/// The pub/sub budgets' labels, in `PubSubMeters::held`'s order.
#[cfg(feature = "metrics")]
const BUDGETS: [&str; 3] = ["pubsub_topics", "pubsub_history", "pubsub_waiting"];

#[cfg(not(feature = "metrics"))]
pub(crate) struct PubSubMeters;

#[cfg(feature = "metrics")]
impl PubSubMeters {
    pub(crate) fn new() -> PubSubMeters {
        let dropped = |reason: &'static str| metrics::counter!("rapidws_pubsub_dropped_total", "reason" => reason);
        PubSubMeters {
            published: metrics::counter!("rapidws_pubsub_published_total"),
            delivered: metrics::counter!("rapidws_pubsub_delivered_total"),
            queue_full: dropped("queue_full"),
            loop_behind: dropped("loop_behind"),
            subscriber_closed: dropped("subscriber_closed"),
            connection_closing: dropped("connection_closing"),
            conflated: dropped("conflated"),
            history_shed: metrics::counter!("rapidws_budget_shed_total", "budget" => BUDGETS[1]),
            topics_refused: metrics::counter!("rapidws_budget_refused_total", "budget" => BUDGETS[0]),
            topics: metrics::gauge!("rapidws_pubsub_topics"),
            held: BUDGETS.map(|budget| metrics::gauge!("rapidws_budget_bytes", "budget" => budget)),
            limits: BUDGETS
                .map(|budget| metrics::gauge!("rapidws_budget_limit_bytes", "budget" => budget)),
        }
    }

    /// Kept publications let go for the history's byte budget.
    pub(crate) fn history_shed(&self, shed: u64) {
        self.history_shed.increment(shed);
    }

    /// What the budgets hold and allow now, and the topics refused so
    /// far (the sweeper's pass).
    pub(crate) fn usage(&self, usage: &super::Usage, limits: &super::Limits) {
        self.topics.set(usage.topics as f64);
        self.topics_refused.absolute(usage.topics_refused);
        let held = [usage.topic_bytes, usage.history_bytes, usage.waiting_bytes];
        let allowed = [
            limits.max_topic_bytes(),
            limits.max_history_bytes(),
            limits.max_waiting_bytes(),
        ];
        for (gauge, bytes) in self.held.iter().zip(held) {
            gauge.set(bytes as f64);
        }
        for (gauge, bytes) in self.limits.iter().zip(allowed) {
            gauge.set(bytes as f64);
        }
    }

    pub(crate) fn published(&self) {
        self.published.increment(1);
    }

    /// Subscribers of a server loop too far behind its publishers missed one.
    pub(crate) fn loop_behind(&self, missed: u64) {
        self.loop_behind.increment(missed);
    }

    /// Subscriptions ended with publications still waiting for them.
    pub(crate) fn gone(&self, missed: u64) {
        self.connection_closing.increment(missed);
    }

    /// What one delivery walk counted, added at once.
    pub(crate) fn walked(&self, walk: &Counts) {
        for (counter, n) in [
            (&self.delivered, walk.delivered),
            (&self.queue_full, walk.dropped),
            (&self.subscriber_closed, walk.closed),
            (&self.connection_closing, walk.gone),
            (&self.conflated, walk.conflated),
        ] {
            if n > 0 {
                counter.increment(n);
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::unused_self)]
impl PubSubMeters {
    pub(crate) fn new() -> PubSubMeters {
        PubSubMeters
    }
    #[inline(always)]
    pub(crate) fn published(&self) {}
    #[inline(always)]
    pub(crate) fn loop_behind(&self, _missed: u64) {}
    #[inline(always)]
    pub(crate) fn gone(&self, _missed: u64) {}
    #[inline(always)]
    pub(crate) fn walked(&self, _walk: &Counts) {}
    pub(crate) fn history_shed(&self, _shed: u64) {}
    pub(crate) fn usage(&self, _: &super::Usage, _: &super::Limits) {}
}

impl std::fmt::Debug for PubSubMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PubSubMeters")
    }
}

/// Whether this publish is one to time (every [`SAMPLE_EVERY`]th on this
/// thread): when it was called, if so.
#[cfg(feature = "metrics")]
pub(crate) fn sample() -> Option<Instant> {
    use std::cell::Cell;
    thread_local! {
        static PUBLISHES: Cell<u32> = const { Cell::new(0) };
    }
    PUBLISHES.with(|count| {
        let n = count.get().wrapping_add(1);
        count.set(n);
        (n % SAMPLE_EVERY == 1).then(Instant::now)
    })
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn sample() -> Option<Instant> {
    None
}
