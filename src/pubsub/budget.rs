//! Byte budgets: what all of one `PubSub`'s topics, histories and
//! conflation waits may hold together, whoever made them.
//!
//! Each bound per topic or per connection (a history's count and age, a
//! queue's bound) keeps one party small; these keep all of them together
//! below what the operator set, as nginx's and Redis's limits do. What
//! would go past one is refused or shed (see [`Limits`]) and counted.

use std::sync::atomic::{AtomicUsize, Ordering};

/// What a [`PubSub`]'s topics, histories and conflation waits may hold in
/// all, in bytes (see the module docs of `pubsub`). Counted as
/// estimates of the heap each holds (a topic's name and state, a
/// publication's frames and key, the bookkeeping around them), close to
/// what the allocator hands out.
///
/// The defaults keep a server alive whatever its clients and publishers
/// do: about 1 GiB of history, 512 MiB of topics (a million topics with
/// short names) and 256 MiB of conflation waits, under 2 GiB in all.
///
/// [`PubSub`]: super::PubSub
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub(super) history: usize,
    pub(super) topics: usize,
    pub(super) waiting: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            history: 1 << 30,
            topics: 512 << 20,
            waiting: 256 << 20,
        }
    }
}

impl Limits {
    /// The defaults (see the type's docs).
    pub fn new() -> Limits {
        Limits::default()
    }

    /// The bound on every topic's history, in bytes.
    pub fn max_history_bytes(&self) -> usize {
        self.history
    }

    /// The bound on the topics themselves, in bytes.
    pub fn max_topic_bytes(&self) -> usize {
        self.topics
    }

    /// The bound on every conflation wait, in bytes.
    pub fn max_waiting_bytes(&self) -> usize {
        self.waiting
    }

    /// What every topic's history holds in all (default 1 GiB). Past it,
    /// the oldest kept publications, whatever their topic, are let go
    /// first; a subscriber that resumes from before them is told it was
    /// not recovered, as when its history was too short.
    pub fn history_bytes(mut self, bytes: usize) -> Limits {
        self.history = bytes;
        self
    }

    /// What the topics themselves hold in all, names and state (default
    /// 512 MiB). Past it, a subscribe to a topic that is not there is
    /// refused ([`PubSubError::TooManyTopics`]), and a publication to such
    /// a topic is delivered to nobody and kept nowhere (nobody can be
    /// subscribed to it: [`Published::position`] is `None`).
    ///
    /// [`PubSubError::TooManyTopics`]: super::PubSubError::TooManyTopics
    /// [`Published::position`]: super::Published::position
    pub fn topic_bytes(mut self, bytes: usize) -> Limits {
        self.topics = bytes;
        self
    }

    /// What waits for conflating subscribers in all ([`Overflow::Conflate`]),
    /// default 256 MiB. A publication that would wait past it is treated
    /// as one past the subscriber's own bound: dropped (its gap told) or,
    /// when asked, the subscriber closed.
    ///
    /// [`Overflow::Conflate`]: super::Overflow::Conflate
    pub fn waiting_bytes(mut self, bytes: usize) -> Limits {
        self.waiting = bytes;
        self
    }
}

/// One of the budgets: its limit, and what is held against it now.
pub(super) struct Tally {
    limit: usize,
    used: AtomicUsize,
}

impl Tally {
    pub(super) fn new(limit: usize) -> Tally {
        Tally {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` if they fit under the limit; false (nothing taken)
    /// if they do not.
    pub(super) fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.limit)
            })
            .is_ok()
    }

    /// Takes `bytes` whatever the limit (what is already held and must be
    /// counted: the caller sheds until [`Tally::over`] is false).
    pub(super) fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives `bytes` back.
    pub(super) fn give(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(before >= bytes, "gave back {bytes} of {before}");
    }

    /// Whether more than the limit is held.
    pub(super) fn over(&self) -> bool {
        self.used() > self.limit
    }

    /// The limit.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// What is held now.
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_fits_and_counts_what_is_charged() {
        let budget = Tally::new(100);
        assert!(budget.take(60));
        assert!(!budget.take(41), "60 + 41 is past 100");
        assert!(budget.take(40));
        assert!(!budget.over());
        budget.charge(5);
        assert!(budget.over());
        budget.give(45);
        assert_eq!(budget.used(), 60);
        assert!(!budget.take(usize::MAX), "no overflow");
        assert_eq!(budget.used(), 60);
    }
}
