//! A topic's kept publications ([`History`]'s bounds), what they hold
//! (counted in every topic's [`Histories`]), and what follows a position
//! in them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::envelope::Publication;
use super::histories::Histories;
use super::history::History;

/// The publications one topic keeps, oldest first, offsets consecutive.
/// What they hold is counted in `histories` while they are kept (and
/// given back when the log goes).
pub(super) struct Log {
    policy: History,
    entries: VecDeque<Kept>,
    histories: Arc<Histories>,
}

/// A publication kept, and the bytes counted for it.
pub(super) struct Kept {
    publication: Arc<Publication>,
    counted: usize,
}

/// What keeping one publication costs besides the publication: its entry
/// here and in the shedding order.
const KEPT_OVERHEAD: usize = std::mem::size_of::<Kept>() + 8;

/// Kept publications, oldest first.
pub(super) type Publications<'a> =
    std::iter::Map<std::collections::vec_deque::Iter<'a, Kept>, fn(&Kept) -> &Arc<Publication>>;

fn publication_of(kept: &Kept) -> &Arc<Publication> {
    &kept.publication
}

/// What a log holds after a position.
pub(super) enum Since<'a> {
    /// Every publication after it (maybe none), oldest first.
    All(Publications<'a>),
    /// Some are no longer kept.
    Gap,
}

impl Log {
    pub(super) fn new(policy: History, histories: Arc<Histories>) -> Log {
        Log {
            policy,
            entries: VecDeque::new(),
            histories,
        }
    }

    /// Keeps `publication` (the next offset), letting the oldest go past
    /// the bounds. (The budget of every topic's history is held by the
    /// caller, once the topic's lock is let go: `Histories::shed`.)
    pub(super) fn push(&mut self, publication: Arc<Publication>, now: Instant) {
        debug_assert!(self.entries.back().is_none_or(|last| {
            last.publication.position().offset + 1 == publication.position().offset
        }));
        if self.entries.len() == self.policy.max_messages() {
            self.pop_front();
        }
        self.keep_back(publication);
        self.expire(now);
    }

    fn keep_back(&mut self, publication: Arc<Publication>) {
        let counted = KEPT_OVERHEAD + publication.held_bytes();
        self.histories.keep(&publication, counted);
        self.entries.push_back(Kept {
            publication,
            counted,
        });
    }

    fn pop_front(&mut self) -> Option<Arc<Publication>> {
        let kept = self.entries.pop_front()?;
        self.histories.release(kept.counted);
        Some(kept.publication)
    }

    /// Lets go of publications older than the age bound.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some(first) = self.entries.front() {
            if now.saturating_duration_since(first.publication.at()) <= self.policy.max_age() {
                break;
            }
            self.pop_front();
        }
    }

    /// Lets every publication go (the topic's numbering changed).
    pub(super) fn clear(&mut self) {
        while self.pop_front().is_some() {}
    }

    /// Lets go of the oldest publications up to `publication`, if it is
    /// still kept here (every topic's history is over its budget);
    /// returns how many.
    pub(super) fn shed_through(&mut self, publication: &Arc<Publication>) -> usize {
        let kept = self
            .entries
            .iter()
            .position(|kept| kept.publication.position().offset >= publication.position().offset);
        let Some(at) = kept.filter(|&at| Arc::ptr_eq(&self.entries[at].publication, publication))
        else {
            return 0;
        };
        for _ in 0..=at {
            self.pop_front();
        }
        at + 1
    }

    /// Counts again what each publication holds: frames made for it since
    /// it was kept (a subscriber's envelope, a compression) count from now.
    pub(super) fn recount(&mut self) {
        for kept in &mut self.entries {
            let now = KEPT_OVERHEAD + kept.publication.held_bytes();
            if now != kept.counted {
                self.histories.recount(kept.counted, now);
                kept.counted = now;
            }
        }
    }

    /// Puts `older` (consecutive, oldest first, ending just before the
    /// first kept) in front, as far as the bounds allow; with nothing
    /// kept, `older` must end at `last`. False (nothing changed) if they
    /// do not fit that way.
    pub(super) fn prepend(
        &mut self,
        older: Vec<Arc<Publication>>,
        last: u64,
        now: Instant,
    ) -> bool {
        let Some(newest) = older.last() else {
            return true;
        };
        let next = self
            .entries
            .front()
            .map_or(last + 1, |first| first.publication.position().offset);
        let consecutive = older
            .windows(2)
            .all(|w| w[0].position().offset + 1 == w[1].position().offset);
        if newest.position().offset + 1 != next || !consecutive {
            return false;
        }
        let room = self
            .policy
            .max_messages()
            .saturating_sub(self.entries.len());
        for publication in older.into_iter().rev().take(room) {
            let counted = KEPT_OVERHEAD + publication.held_bytes();
            self.histories.keep(&publication, counted);
            self.entries.push_front(Kept {
                publication,
                counted,
            });
        }
        self.expire(now);
        true
    }

    /// The first offset kept, if any.
    pub(super) fn first(&self) -> Option<u64> {
        self.entries
            .front()
            .map(|k| k.publication.position().offset)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The publications after `offset`, given that `last` is the topic's
    /// latest offset.
    pub(super) fn since(&self, offset: u64, last: u64) -> Since<'_> {
        debug_assert!(offset <= last);
        let kept_from = self.first().unwrap_or(last + 1);
        if offset + 1 < kept_from {
            return Since::Gap;
        }
        // Offsets are consecutive: the first wanted is at this index.
        let skip = (offset + 1 - kept_from) as usize;
        let range = self.entries.range(skip.min(self.entries.len())..);
        Since::All(range.map(publication_of as fn(&Kept) -> &Arc<Publication>))
    }

    /// Every publication kept, oldest first.
    pub(super) fn iter(&self) -> Publications<'_> {
        self.entries
            .iter()
            .map(publication_of as fn(&Kept) -> &Arc<Publication>)
    }

    /// The latest publication kept.
    pub(super) fn latest(&self) -> Option<&Arc<Publication>> {
        self.entries.back().map(|kept| &kept.publication)
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::OpCode;
    use crate::pubsub::history::{Epoch, Position};
    use std::time::Duration;

    fn publication(epoch: Epoch, offset: u64, at: Instant) -> Arc<Publication> {
        Arc::new(Publication::new(
            Arc::from("t"),
            Position { epoch, offset },
            None,
            OpCode::Text,
            format!("{offset}").as_bytes(),
            at,
        ))
    }

    fn unbounded() -> Arc<Histories> {
        Arc::new(Histories::new(usize::MAX))
    }

    fn offsets(since: Since<'_>) -> Option<Vec<u64>> {
        match since {
            Since::All(entries) => Some(entries.map(|p| p.position().offset).collect()),
            Since::Gap => None,
        }
    }

    #[test]
    fn keeps_the_last_n_and_finds_what_follows_a_position() {
        let (epoch, now) = (Epoch::new(), Instant::now());
        let mut log = Log::new(History::new(3, Duration::from_secs(60)), unbounded());
        assert_eq!(offsets(log.since(0, 0)), Some(vec![]));
        for offset in 1..=5 {
            log.push(publication(epoch, offset, now), now);
        }
        // 3, 4, 5 kept.
        assert_eq!(offsets(log.since(5, 5)), Some(vec![]));
        assert_eq!(offsets(log.since(4, 5)), Some(vec![5]));
        assert_eq!(offsets(log.since(2, 5)), Some(vec![3, 4, 5]));
        assert_eq!(offsets(log.since(1, 5)), None, "2 is gone");
        assert_eq!(offsets(log.since(0, 5)), None);
        assert_eq!(log.latest().unwrap().position().offset, 5);
    }

    #[test]
    fn lets_old_publications_go() {
        let (epoch, start) = (Epoch::new(), Instant::now());
        let mut log = Log::new(History::new(100, Duration::from_secs(10)), unbounded());
        log.push(publication(epoch, 1, start), start);
        let later = start + Duration::from_secs(5);
        log.push(publication(epoch, 2, later), later);
        log.expire(start + Duration::from_secs(12));
        assert_eq!(offsets(log.since(1, 2)), Some(vec![2]));
        assert_eq!(offsets(log.since(0, 2)), None);
        log.expire(start + Duration::from_secs(16));
        assert!(log.is_empty());
        // Nothing kept: only the latest position resumes.
        assert_eq!(offsets(log.since(2, 2)), Some(vec![]));
        assert_eq!(offsets(log.since(1, 2)), None);
    }

    #[test]
    fn what_is_kept_is_counted_until_it_goes() {
        let (epoch, now) = (Epoch::new(), Instant::now());
        let histories = unbounded();
        let mut log = Log::new(History::new(2, Duration::from_secs(60)), histories.clone());
        let first = publication(epoch, 1, now);
        let one = KEPT_OVERHEAD + first.held_bytes();
        log.push(first, now);
        assert_eq!((histories.kept(), histories.bytes()), (1, one));
        for offset in 2..=4 {
            log.push(publication(epoch, offset, now), now);
        }
        // Two kept, each counted once.
        assert_eq!(histories.kept(), 2);
        assert_eq!(histories.bytes(), 2 * one);
        log.expire(now + Duration::from_secs(61));
        assert_eq!((histories.kept(), histories.bytes()), (0, 0));
        log.push(publication(epoch, 5, now), now);
        drop(log);
        assert_eq!(
            (histories.kept(), histories.bytes()),
            (0, 0),
            "given back on drop"
        );
    }

    #[test]
    fn frames_made_later_count_once_recounted() {
        use crate::pubsub::Envelope;
        struct Loud;
        impl Envelope for Loud {
            fn wrap(&self, p: &Publication) -> crate::OwnedMessage {
                crate::OwnedMessage::Text("x".repeat(1000 + p.payload().len()))
            }
        }
        let (epoch, now) = (Epoch::new(), Instant::now());
        let histories = unbounded();
        let mut log = Log::new(History::new(10, Duration::from_secs(60)), histories.clone());
        let kept = publication(epoch, 1, now);
        log.push(kept.clone(), now);
        let before = histories.bytes();
        let envelope: Arc<dyn Envelope> = Arc::new(Loud);
        let _ = kept.frame(Some(&envelope));
        assert_eq!(histories.bytes(), before, "not counted until recounted");
        log.recount();
        assert!(
            histories.bytes() >= before + 1001,
            "{} then {}",
            before,
            histories.bytes()
        );
        drop(log);
        assert_eq!(histories.bytes(), 0);
    }

    #[test]
    fn shedding_lets_go_of_the_oldest_through_the_one_named() {
        let (epoch, now) = (Epoch::new(), Instant::now());
        let histories = unbounded();
        let mut log = Log::new(History::new(10, Duration::from_secs(60)), histories.clone());
        let kept: Vec<_> = (1..=5)
            .map(|offset| publication(epoch, offset, now))
            .collect();
        for publication in &kept {
            log.push(publication.clone(), now);
        }
        assert_eq!(log.shed_through(&kept[2]), 3);
        assert_eq!(log.first(), Some(4));
        assert_eq!(log.shed_through(&kept[1]), 0, "gone already");
        let stranger = publication(epoch, 4, now);
        assert_eq!(
            log.shed_through(&stranger),
            0,
            "the same offset, not the same one"
        );
        assert_eq!(histories.kept(), 2);
    }
}
