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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};

/// A server loop that keeps a list of woken slots.
pub(crate) trait WokenList: Send + Sync + 'static {
    /// Adds `slot` to the list and makes sure the loop runs to look at it.
    fn push_woken(&self, slot: u32);
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
    /// A waker (tokio: the group's waker for the connection's slot).
    Waker(Waker),
    /// The slot's wake state itself (io_uring: no separate allocation).
    Slot(SlotWake),
}

impl ConnWake {
    pub(crate) fn wake(&self) {
        match self {
            ConnWake::Waker(waker) => waker.wake_by_ref(),
            ConnWake::Slot(slot) => slot.wake(),
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
