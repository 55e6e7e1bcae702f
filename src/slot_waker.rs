//! The waker each connection gets from the backend serving it (a tokio group
//! or an io_uring reactor): waking it puts the connection's slot on its
//! server loop's woken list, once, and wakes that loop.
//!
//! `Conn` sends from elsewhere, close requests, aborts and (on tokio) the
//! connection's timers all use it. A waker that outlives its connection (a
//! `Conn` kept by the application holds it) lists the slot at most once more,
//! which gives whoever has the slot by then a turn with nothing to do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Wake;

/// A server loop that keeps a list of woken slots.
pub(crate) trait WokenList: Send + Sync + 'static {
    /// Adds `slot` to the list and makes sure the loop runs to look at it.
    fn push_woken(&self, slot: u32);
}

/// Wakes one connection of a server loop.
pub(crate) struct SlotWaker<L> {
    list: Arc<L>,
    slot: u32,
    /// On the woken list already: more wakes add nothing.
    queued: AtomicBool,
}

impl<L: WokenList> SlotWaker<L> {
    pub(crate) fn new(list: Arc<L>, slot: u32) -> Arc<Self> {
        Arc::new(SlotWaker {
            list,
            slot,
            queued: AtomicBool::new(false),
        })
    }

    /// The loop took the slot off its list: the next wake lists it again.
    /// Call before the connection's turn, so a wake during it is not lost.
    pub(crate) fn taken(&self) {
        self.queued.store(false, Ordering::Release);
    }
}

impl<L: WokenList> Wake for SlotWaker<L> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.list.push_woken(self.slot);
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
    use std::task::Waker;

    use super::*;

    #[derive(Default)]
    struct List(Mutex<Vec<u32>>);

    impl WokenList for List {
        fn push_woken(&self, slot: u32) {
            lock(&self.0).push(slot);
        }
    }

    #[test]
    fn a_slot_is_listed_once_until_taken() {
        let list = Arc::new(List::default());
        let slot_waker = SlotWaker::new(list.clone(), 7);
        let waker = Waker::from(slot_waker.clone());
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(*lock(&list.0), [7]);
        slot_waker.taken();
        waker.wake();
        assert_eq!(*lock(&list.0), [7, 7]);
    }
}
