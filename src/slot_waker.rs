//! How a connection's server loop (a tokio group or an io_uring reactor) is
//! told that the connection has something to do: its slot goes on the loop's
//! woken list, once until the loop takes it, and the loop wakes.
//!
//! [`SlotWake`] is that state. An io_uring connection keeps it inline in its
//! shared state (`Conn` sends, close requests and aborts call it directly), so
//! it costs no allocation of its own; a tokio group wraps it in an `Arc` as the
//! `Waker` its connections' sockets and timers use ([`SlotWake::waker`]). A
//! wake that comes after its connection ended (a `Conn` kept by the
//! application) lists the slot at most once more, which gives whoever has the
//! slot by then a turn with nothing to do.
//!
//! A loop also takes [`Job`]s from other threads (pub/sub deliveries): one
//! hand-off per loop, run on the loop's thread at the start of its next
//! turn, so that the sends they make to its connections go out with that
//! turn's writes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};

/// A server loop that keeps a list of woken slots.
pub(crate) trait WokenList: Send + Sync + 'static {
    /// Adds `slot` to the list and makes sure the loop runs to look at it.
    fn push_woken(&self, slot: u32);

    /// Hands the loop `job`, to run on its thread at the start of its next
    /// turn, and makes sure that turn comes. (Only pub/sub posts jobs.)
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    fn post(&self, job: Job);
}

/// Work for a server loop's thread (see the module docs).
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The jobs posted to a loop and not run yet.
#[derive(Default)]
pub(crate) struct Posted {
    /// Set after a push: a loop with nothing posted pays one atomic load
    /// per turn, not a lock.
    any: AtomicBool,
    jobs: Mutex<Vec<Job>>,
}

impl Posted {
    /// Adds a job; the caller then wakes the loop.
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) fn push(&self, job: Job) {
        lock(&self.jobs).push(job);
        self.any.store(true, Ordering::Release);
    }

    /// Runs the jobs posted so far, in order, with `spare` as the list to
    /// run them from (kept by the loop, so a turn allocates nothing);
    /// false if there were none. A job that panics is logged and costs
    /// only itself.
    pub(crate) fn run(&self, spare: &mut Vec<Job>) -> bool {
        if !self.any.swap(false, Ordering::AcqRel) {
            return false;
        }
        std::mem::swap(&mut *lock(&self.jobs), spare);
        for job in spare.drain(..) {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("a job posted to a server loop panicked");
            }
        }
        true
    }
}

/// Wakes one slot of a server loop.
pub(crate) struct SlotWake {
    list: Arc<dyn WokenList>,
    slot: u32,
    /// On the woken list already: more wakes add nothing.
    queued: AtomicBool,
}

impl SlotWake {
    pub(crate) fn new(list: Arc<dyn WokenList>, slot: u32) -> Self {
        SlotWake {
            list,
            slot,
            queued: AtomicBool::new(false),
        }
    }

    /// A `Waker` that wakes `slot` of `list`.
    pub(crate) fn waker(list: Arc<dyn WokenList>, slot: u32) -> Arc<Self> {
        Arc::new(SlotWake::new(list, slot))
    }

    /// Lists the slot unless it is listed already.
    pub(crate) fn wake(&self) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.list.push_woken(self.slot);
        }
    }

    /// The loop took the slot off its list: the next wake lists it again.
    /// Call before the connection's turn, so a wake during it is not lost.
    pub(crate) fn taken(&self) {
        self.queued.store(false, Ordering::Release);
    }
}

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        SlotWake::wake(&self);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        SlotWake::wake(self);
    }
}

/// How a connection's shared state wakes its server loop.
pub(crate) enum ConnWake {
    /// A task's waker (the stream driver: one task per connection).
    Waker(Waker),
    /// The slot's wake state, shared with the loop (a tokio group, whose
    /// timers and socket use it as their `Waker` too).
    Shared(Arc<SlotWake>),
    /// The slot's wake state itself (io_uring: no separate allocation).
    Slot(SlotWake),
}

impl ConnWake {
    pub(crate) fn wake(&self) {
        match self {
            ConnWake::Waker(waker) => waker.wake_by_ref(),
            ConnWake::Shared(slot) => SlotWake::wake(slot),
            ConnWake::Slot(slot) => slot.wake(),
        }
    }

    /// The loop serving the connection, if it is served by one (a tokio
    /// group or an io_uring reactor; not a task of its own).
    #[cfg(feature = "pubsub")]
    pub(crate) fn list(&self) -> Option<&Arc<dyn WokenList>> {
        match self {
            ConnWake::Waker(_) => None,
            ConnWake::Shared(slot) => Some(&slot.list),
            ConnWake::Slot(slot) => Some(&slot.list),
        }
    }

    /// See [`SlotWake::taken`]; a `Waker` keeps its own state.
    pub(crate) fn taken(&self) {
        if let ConnWake::Slot(slot) = self {
            slot.taken();
        }
    }
}

/// Locks a list; a panic elsewhere cannot leave a `Vec` half-pushed, so
/// poisoning is ignored.
pub(crate) fn lock<T>(list: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    list.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct List(Mutex<Vec<u32>>);

    impl WokenList for List {
        fn push_woken(&self, slot: u32) {
            lock(&self.0).push(slot);
        }

        fn post(&self, job: Job) {
            job();
        }
    }

    #[test]
    fn posted_jobs_run_once_in_order_and_a_panic_costs_only_its_job() {
        let posted = Posted::default();
        let mut spare = Vec::new();
        assert!(!posted.run(&mut spare), "nothing posted");
        let ran = Arc::new(Mutex::new(Vec::new()));
        for n in 0..3 {
            let ran = ran.clone();
            posted.push(Box::new(move || {
                assert_ne!(n, 1, "the second job panics");
                lock(&ran).push(n);
            }));
        }
        assert!(posted.run(&mut spare));
        assert_eq!(*lock(&ran), [0, 2]);
        assert!(!posted.run(&mut spare), "each job runs once");
    }

    #[test]
    fn a_slot_is_listed_once_until_taken() {
        let list = Arc::new(List::default());
        let slot_wake = SlotWake::waker(list.clone(), 7);
        let waker = Waker::from(slot_wake.clone());
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(*lock(&list.0), [7]);
        slot_wake.taken();
        waker.wake();
        assert_eq!(*lock(&list.0), [7, 7]);
    }

    #[test]
    fn an_inline_slot_wake_is_listed_once_until_taken() {
        let list = Arc::new(List::default());
        let wake = ConnWake::Slot(SlotWake::new(list.clone(), 3));
        wake.wake();
        wake.wake();
        assert_eq!(*lock(&list.0), [3]);
        wake.taken();
        wake.wake();
        assert_eq!(*lock(&list.0), [3, 3]);
    }
}
