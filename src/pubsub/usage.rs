//! What a `PubSub` says of itself: its counts ([`PubSub::stats`]) and
//! what it holds against its byte budgets ([`PubSub::usage`]); and the
//! history budget held, the oldest kept publications let go first.

use std::sync::atomic::Ordering;

use super::{Inner, PubSub, Stats, Usage};

impl PubSub {
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
}

impl Inner {
    pub(super) fn usage(&self) -> Usage {
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
    pub(super) fn shed_history(&self) {
        let shed = self.registry.shed_history();
        if shed > 0 {
            self.meters.history_shed(shed);
        }
    }
}
