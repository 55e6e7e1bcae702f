//! Whether this thread is inside the registry's locks, and what waits for
//! it to be out: a flush a wake asked for there would take a lock this
//! thread may hold.

use std::cell::{Cell, RefCell};

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static LATER: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
}

/// Held while this thread may hold a registry lock.
pub(super) struct Busy(());

impl Busy {
    pub(super) fn enter() -> Busy {
        DEPTH.with(|depth| depth.set(depth.get() + 1));
        Busy(())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let depth = DEPTH.with(|depth| {
            depth.set(depth.get() - 1);
            depth.get()
        });
        if depth == 0 {
            while let Some(run) = LATER.with(|later| later.borrow_mut().pop()) {
                run();
            }
        }
    }
}

/// Runs `run` now, or, if this thread is busy, once it is not.
pub(super) fn later_or_now(run: impl FnOnce() + 'static) {
    if DEPTH.with(Cell::get) == 0 {
        run();
    } else {
        LATER.with(|later| later.borrow_mut().push(Box::new(run)));
    }
}
