//! A topic's kept publications ([`History`]'s bounds), and what follows a
//! position in them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::envelope::Publication;
use super::history::History;

/// The publications one topic keeps, oldest first, offsets consecutive.
pub(super) struct Log {
    policy: History,
    entries: VecDeque<Arc<Publication>>,
}

/// What a log holds after a position.
pub(super) enum Since<'a> {
    /// Every publication after it (maybe none), oldest first.
    All(std::collections::vec_deque::Iter<'a, Arc<Publication>>),
    /// Some are no longer kept.
    Gap,
}

impl Log {
    pub(super) fn new(policy: History) -> Log {
        Log {
            policy,
            entries: VecDeque::new(),
        }
    }

    /// Keeps `publication` (the next offset), letting the oldest go past
    /// the bounds.
    pub(super) fn push(&mut self, publication: Arc<Publication>, now: Instant) {
        debug_assert!(
            self.entries
                .back()
                .is_none_or(|last| { last.position().offset + 1 == publication.position().offset })
        );
        if self.entries.len() == self.policy.max_messages() {
            self.entries.pop_front();
        }
        self.entries.push_back(publication);
        self.expire(now);
    }

    /// Lets go of publications older than the age bound.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some(first) = self.entries.front() {
            if now.saturating_duration_since(first.at()) <= self.policy.max_age() {
                break;
            }
            self.entries.pop_front();
        }
    }

    /// Lets every publication go (the topic's numbering changed).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
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
            .map_or(last + 1, |first| first.position().offset);
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
            self.entries.push_front(publication);
        }
        self.expire(now);
        true
    }

    /// The first offset kept, if any.
    pub(super) fn first(&self) -> Option<u64> {
        self.entries.front().map(|p| p.position().offset)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The publications after `offset`, given that `last` is the topic's
    /// latest offset.
    pub(super) fn since(&self, offset: u64, last: u64) -> Since<'_> {
        debug_assert!(offset <= last);
        let kept_from = self
            .entries
            .front()
            .map_or(last + 1, |first| first.position().offset);
        if offset + 1 < kept_from {
            return Since::Gap;
        }
        // Offsets are consecutive: the first wanted is at this index.
        let skip = (offset + 1 - kept_from) as usize;
        Since::All(self.entries.range(skip.min(self.entries.len())..))
    }

    /// Every publication kept, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<Publication>> {
        self.entries.iter()
    }

    /// The latest publication kept.
    pub(super) fn latest(&self) -> Option<&Arc<Publication>> {
        self.entries.back()
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

    fn offsets(since: Since<'_>) -> Option<Vec<u64>> {
        match since {
            Since::All(entries) => Some(entries.map(|p| p.position().offset).collect()),
            Since::Gap => None,
        }
    }

    #[test]
    fn keeps_the_last_n_and_finds_what_follows_a_position() {
        let (epoch, now) = (Epoch::new(), Instant::now());
        let mut log = Log::new(History::new(3, Duration::from_secs(60)));
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
        let mut log = Log::new(History::new(100, Duration::from_secs(10)));
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
}
