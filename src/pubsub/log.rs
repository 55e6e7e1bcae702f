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
mod tests;
