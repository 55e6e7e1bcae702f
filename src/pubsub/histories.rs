//! Every topic's history together: the bytes they hold against one
//! budget, and the order in which the oldest kept publications, whatever
//! their topic, are let go when it is full.
//!
//! A topic's [`Log`] counts what it keeps here as it keeps and lets go;
//! each publication kept also goes to the back of one queue, in the order
//! kept. When the budget is over after a publish (no lock held), the
//! registry lets the publications at the front go from their topics'
//! logs, oldest first, until it is not (`Registry::shed_history`). An entry whose publication a log let go
//! already (its count or age bound) is skipped; such entries are cleared
//! out of the queue once it is twice as long as what is kept, so the
//! queue stays within a few words per kept publication.
//!
//! Locks: a log tells of a publication kept under its topic's lock, and
//! takes the queue's lock inside it (topic, then queue). Shedding takes
//! the queue's lock alone, lets it go, then takes a topic's like any
//! publish (shard, then topic): never the other way round.
//!
//! [`Log`]: super::log::Log

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::budget::Tally;
use super::envelope::Publication;

/// Every topic's history's bytes, and the order to let them go in.
pub(super) struct Histories {
    budget: Tally,
    order: Mutex<Order>,
    /// Publications kept in every log.
    kept: AtomicUsize,
    /// Publications let go for the budget.
    shed: AtomicU64,
}

/// Kept publications, oldest first (some let go already).
struct Order {
    queue: VecDeque<Weak<Publication>>,
    /// The length at which the queue is cleared of what is gone.
    compact_at: usize,
}

/// The shortest queue that is cleared of what is gone.
const MIN_COMPACT: usize = 1024;

impl Histories {
    pub(super) fn new(limit: usize) -> Histories {
        Histories {
            budget: Tally::new(limit),
            order: Mutex::new(Order {
                queue: VecDeque::new(),
                compact_at: MIN_COMPACT,
            }),
            kept: AtomicUsize::new(0),
            shed: AtomicU64::new(0),
        }
    }

    /// A log keeps `publication`, holding `bytes` (under its topic's lock).
    pub(super) fn keep(&self, publication: &Arc<Publication>, bytes: usize) {
        self.budget.charge(bytes);
        let kept = self.kept.fetch_add(1, Ordering::Relaxed) + 1;
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        order.queue.push_back(Arc::downgrade(publication));
        if order.queue.len() > order.compact_at.max(2 * kept) {
            order.queue.retain(|weak| weak.strong_count() > 0);
            // Publications still held elsewhere (a queue, a delivery on its
            // way) stay: the next clearing waits until the queue doubles.
            order.compact_at = (2 * order.queue.len()).max(MIN_COMPACT);
        }
    }

    /// A log let go of a publication that held `bytes`.
    pub(super) fn release(&self, bytes: usize) {
        self.budget.give(bytes);
        self.kept.fetch_sub(1, Ordering::Relaxed);
    }

    /// What a kept publication holds changed (frames made for it since it
    /// was kept): from `before` bytes to `after`.
    pub(super) fn recount(&self, before: usize, after: usize) {
        if after > before {
            self.budget.charge(after - before);
        } else {
            self.budget.give(before - after);
        }
    }

    /// Whether more is held than the budget allows.
    pub(super) fn over(&self) -> bool {
        self.budget.over()
    }

    /// The oldest publication kept in some log (maybe let go there
    /// since: the log checks), taken out of the order; `None` when the
    /// order is empty.
    pub(super) fn oldest(&self) -> Option<Arc<Publication>> {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(next) = order.queue.pop_front() {
            if let Some(publication) = next.upgrade() {
                return Some(publication);
            }
        }
        None
    }

    /// Counts publications let go for the budget.
    pub(super) fn shed(&self, count: u64) {
        self.shed.fetch_add(count, Ordering::Relaxed);
    }

    /// What every log holds now, in bytes.
    pub(super) fn bytes(&self) -> usize {
        self.budget.used()
    }

    /// Publications kept in every log now.
    pub(super) fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// Publications let go for the budget so far.
    pub(super) fn shed_count(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }
}
