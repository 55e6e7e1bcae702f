//! What waits for one conflating subscriber: publications in the order
//! they are to be sent, found by key in one step, counted as what they
//! hold against the subscriber's bound and the budget of every wait.
//!
//! A newer publication with a waiting one's key takes the older one's
//! place in one step (a map from key to where it waits), so a flood of
//! distinct keys costs each publish the same however many wait.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::budget::Tally;
use super::envelope::Publication;

/// A conflating subscriber's publications that did not fit its queue, in
/// the order they are sent; a newer one with a waiting one's key replaces
/// it (and goes to the end, so offsets stay in order): the latest value
/// per key. What it holds is given back to the budget when it goes.
pub(super) struct Pending {
    /// By when each started waiting (this wait's own count).
    waiting: BTreeMap<u64, Waiting>,
    /// Where the one with each key waits.
    by_key: HashMap<Box<str>, u64>,
    next: u64,
    /// What waits, as counted.
    bytes: usize,
    /// Something was replaced or dropped since the last was sent: the
    /// subscriber is told of the gap before the next one.
    pub(super) gap: bool,
    /// Every wait's budget.
    budget: Arc<Tally>,
}

struct Waiting {
    publication: Arc<Publication>,
    counted: usize,
}

/// What a waiting publication costs besides the publication: its entry
/// in the order, and in the key map with its copy of the key.
const WAITING_OVERHEAD: usize = 64 + 48;

/// What `publication` counts while it waits (with the frames made for it
/// so far: the subscriber's own is made before it waits).
pub(super) fn counted(publication: &Publication) -> usize {
    WAITING_OVERHEAD + publication.key().map_or(0, str::len) + publication.held_bytes()
}

impl Pending {
    pub(super) fn new(budget: Arc<Tally>) -> Pending {
        Pending {
            waiting: BTreeMap::new(),
            by_key: HashMap::new(),
            next: 0,
            bytes: 0,
            gap: false,
            budget,
        }
    }

    /// Puts `publication` in the place of the one waiting with its key, at
    /// the end (offsets stay in order), if there is one and the newer fits
    /// where the older was (under `limit` and the budget, the older one's
    /// bytes given back): `Some(true)` then, `Some(false)` if it did not fit
    /// (the older one stays: a gap is told either way), `None` if nothing
    /// waits with its key.
    pub(super) fn replace(&mut self, publication: &Arc<Publication>, limit: usize) -> Option<bool> {
        let key = publication.key()?;
        let at = *self.by_key.get(key)?;
        let old = self.waiting.get(&at)?.counted;
        let new = counted(publication);
        let fits = self.bytes - old + new <= limit && (new <= old || self.budget.take(new - old));
        if !fits {
            return Some(false);
        }
        if new < old {
            self.budget.give(old - new);
        }
        self.bytes = self.bytes - old + new;
        self.waiting.remove(&at);
        let next = self.next;
        self.next += 1;
        self.by_key.insert(Box::from(key), next);
        self.waiting.insert(
            next,
            Waiting {
                publication: publication.clone(),
                counted: new,
            },
        );
        Some(true)
    }

    /// Puts `publication` at the end if it fits under `limit` (this
    /// subscriber's) and the budget of every wait; false if it does not
    /// (nothing changed).
    pub(super) fn push(&mut self, publication: &Arc<Publication>, limit: usize) -> bool {
        let counted = counted(publication);
        if self.bytes + counted > limit || !self.budget.take(counted) {
            return false;
        }
        self.bytes += counted;
        let at = self.next;
        self.next += 1;
        if let Some(key) = publication.key() {
            self.by_key.insert(Box::from(key), at);
        }
        let publication = publication.clone();
        self.waiting.insert(
            at,
            Waiting {
                publication,
                counted,
            },
        );
        true
    }

    /// The first to be sent.
    pub(super) fn front(&self) -> Option<&Arc<Publication>> {
        self.waiting.first_key_value().map(|(_, w)| &w.publication)
    }

    /// Takes out the first to be sent.
    pub(super) fn pop_front(&mut self) -> Option<Arc<Publication>> {
        let (_, waiting) = self.waiting.pop_first()?;
        if let Some(key) = waiting.publication.key() {
            self.by_key.remove(key);
        }
        self.give(waiting.counted);
        Some(waiting.publication)
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn give(&mut self, counted: usize) {
        self.bytes -= counted;
        self.budget.give(counted);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}
