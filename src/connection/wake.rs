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
//! A loop also takes [`Job`]s from other threads (pub/sub deliveries) through
//! [`WokenList::post`]: its mailbox (`driver/mailbox.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Wake, Waker};

/// A server loop that keeps a list of woken slots.
pub(crate) trait WokenList: Send + Sync + 'static {
    /// Adds `slot` to the list and makes sure the loop runs to look at it.
    fn push_woken(&self, slot: u32);

    /// Hands the loop `job`, to run on its thread at the start of its next
    /// turn, and makes sure that turn comes; false (and `job` dropped) if
    /// it would take the jobs waiting past the mailbox's bound
    /// (`driver::mailbox::POSTED_LIMIT`). `bytes` is what
    /// the job holds on to (a message). (Only pub/sub posts jobs.)
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    fn post(&self, job: Job, bytes: usize) -> bool;
}

/// Work for a server loop's thread (see the module docs).
pub(crate) type Job = Box<dyn FnOnce() + Send>;

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

    /// The slot's wake state shared with a tokio group, which makes the
    /// connection's `Waker` from it for each turn.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn shared(&self) -> Option<&Arc<SlotWake>> {
        match self {
            ConnWake::Shared(slot) => Some(slot),
            _ => None,
        }
    }

    /// See [`SlotWake::taken`]; a `Waker` keeps its own state.
    pub(crate) fn taken(&self) {
        if let ConnWake::Slot(slot) = self {
            slot.taken();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A woken list that records what is pushed and runs what is posted
    /// at once (the reactor's tasks' tests use it too).
    #[derive(Default)]
    pub(crate) struct List(Mutex<Vec<u32>>);

    impl List {
        /// What was pushed since the last take.
        pub(crate) fn take(&self) -> Vec<u32> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    impl WokenList for List {
        fn push_woken(&self, slot: u32) {
            self.0.lock().unwrap().push(slot);
        }

        fn post(&self, job: Job, _: usize) -> bool {
            job();
            true
        }
    }

    #[test]
    fn a_slot_is_listed_once_until_taken() {
        let list = Arc::new(List::default());
        let slot_wake = SlotWake::waker(list.clone(), 7);
        let waker = Waker::from(slot_wake.clone());
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(*list.0.lock().unwrap(), [7]);
        slot_wake.taken();
        waker.wake();
        assert_eq!(*list.0.lock().unwrap(), [7, 7]);
    }

    #[test]
    fn an_inline_slot_wake_is_listed_once_until_taken() {
        let list = Arc::new(List::default());
        let wake = ConnWake::Slot(SlotWake::new(list.clone(), 3));
        wake.wake();
        wake.wake();
        assert_eq!(*list.0.lock().unwrap(), [3]);
        wake.taken();
        wake.wake();
        assert_eq!(*list.0.lock().unwrap(), [3, 3]);
    }
}
