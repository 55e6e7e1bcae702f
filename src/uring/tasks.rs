//! The reactor's tasks: futures spawned on its thread (`driver::local`),
//! polled between its rounds, woken from any thread through its woken list.
//!
//! A task's wake puts `TASK | id` on the woken list (and writes the eventfd
//! if the reactor waits in the kernel), as a connection's wake puts its
//! slot: a wake on the reactor's own thread, the usual one (a message for
//! the socket it reads, room in the queue it writes), costs a lock and no
//! system call.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::connection::wake::{SlotWake, WokenList};
use crate::driver::local::{self, LoopTask};
use crate::driver::slab::Slab;

/// The woken-list entries with this bit are tasks' ids (connections' slots
/// stay below it).
pub(crate) const TASK: u32 = 1 << 31;

struct Task {
    future: LoopTask,
    wake: Arc<SlotWake>,
    waker: Waker,
    /// On `ready` already: a second wake before its poll adds nothing.
    ready: bool,
}

/// The tasks of one reactor.
pub(crate) struct Tasks {
    list: Arc<dyn WokenList>,
    tasks: Slab<Task>,
    /// Woken (or new) and not polled since.
    ready: Vec<u32>,
    spawned: Vec<LoopTask>,
    /// How many tasks there are.
    live: usize,
}

impl Tasks {
    pub(crate) fn new(list: Arc<dyn WokenList>) -> Tasks {
        Tasks {
            list,
            tasks: Slab::default(),
            ready: Vec::new(),
            spawned: Vec::new(),
            live: 0,
        }
    }

    /// A woken-list entry for task `id` (without the [`TASK`] bit).
    pub(crate) fn woken(&mut self, id: u32) {
        if let Some(task) = self.tasks.get_mut(id) {
            // Cleared before the poll, so a wake during it lists it again.
            task.wake.taken();
            if !std::mem::replace(&mut task.ready, true) {
                self.ready.push(id);
            }
        }
    }

    /// No task, and none spawned: a reactor without tasks skips them.
    pub(crate) fn is_none(&self) -> bool {
        self.live == 0 && !local::has_spawned()
    }

    /// Whether a task waits to be polled: the reactor must not wait then.
    pub(crate) fn is_ready(&self) -> bool {
        !self.ready.is_empty() || local::has_spawned()
    }

    /// Takes the tasks spawned since the last round, then polls every task
    /// that is ready, each once; a task that ends or panics is dropped.
    pub(crate) fn run(&mut self) {
        if local::take_spawned(&mut self.spawned) {
            for future in self.spawned.drain(..) {
                let id = self.tasks.next_slot();
                // `TASK | id` must stay below the reactor's own entry.
                if id >= TASK - 1 {
                    tracing::error!("too many tasks on one reactor; dropping one");
                    continue;
                }
                let wake = SlotWake::waker(self.list.clone(), TASK | id);
                let waker = Waker::from(wake.clone());
                self.tasks.insert(Task {
                    future,
                    wake,
                    waker,
                    ready: true,
                });
                self.live += 1;
                self.ready.push(id);
            }
        }
        let mut ready = std::mem::take(&mut self.ready);
        for id in ready.drain(..) {
            let Some(task) = self.tasks.get_mut(id) else {
                continue;
            };
            task.ready = false;
            let mut cx = Context::from_waker(&task.waker);
            let done = match catch_unwind(AssertUnwindSafe(|| task.future.as_mut().poll(&mut cx))) {
                Ok(Poll::Ready(())) => true,
                Ok(Poll::Pending) => false,
                Err(_) => {
                    tracing::error!("a task on the reactor panicked; it is dropped");
                    true
                }
            };
            if done {
                self.live -= 1;
                drop_caught(self.tasks.remove(id));
            }
        }
        // Woken again during this round: polled in the next.
        ready.append(&mut self.ready);
        self.ready = ready;
    }

    /// Drops every task, and those their drops spawn, each drop's panic
    /// caught: the reactor calls it as it stops, while its thread still
    /// takes tasks and before its connections go.
    pub(crate) fn drop_all(&mut self) {
        loop {
            self.ready.clear();
            self.live = 0;
            drop_caught(std::mem::take(&mut self.tasks));
            if !local::take_spawned(&mut self.spawned) {
                return;
            }
            self.spawned.drain(..).for_each(drop_caught);
        }
    }
}

/// Drops task state, a panic in a task's drop caught and logged: it costs
/// that task, not the reactor.
fn drop_caught<T>(tasks: T) {
    if catch_unwind(AssertUnwindSafe(move || drop(tasks))).is_err() {
        tracing::error!("dropping a task on the reactor panicked");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::connection::wake::tests::List;

    /// Pending until `waker` is woken `times` times, counting its polls.
    struct Counted {
        polls: Arc<AtomicUsize>,
        waker: Arc<Mutex<Option<Waker>>>,
        times: usize,
    }

    impl std::future::Future for Counted {
        type Output = ();
        fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let polls = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if polls > self.times {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A reactor's tasks, its woken list, and its thread offered.
    fn reactor() -> (Arc<List>, Tasks, local::Offered) {
        let list = Arc::new(List::default());
        let tasks = Tasks::new(list.clone());
        (list, tasks, local::offer())
    }

    /// Spawns a [`Counted`] task ending at its poll `times + 1`; gives its
    /// poll count and the waker of its last poll.
    fn spawn_counted(times: usize) -> (Arc<AtomicUsize>, Arc<Mutex<Option<Waker>>>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let waker = Arc::new(Mutex::new(None));
        let task = Counted {
            polls: polls.clone(),
            waker: waker.clone(),
            times,
        };
        assert!(local::spawn(Box::pin(task)).is_ok());
        (polls, waker)
    }

    #[test]
    fn a_task_runs_when_spawned_and_again_only_when_woken() {
        let (list, mut tasks, _offered) = reactor();
        let (polls, waker) = spawn_counted(2);
        assert!(tasks.is_ready(), "spawned and not polled");
        tasks.run();
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        assert!(!tasks.is_ready());
        tasks.run();
        assert_eq!(polls.load(Ordering::SeqCst), 1, "not woken: not polled");

        // Two wakes before the reactor looks: one entry on the list.
        let w = waker.lock().unwrap().take().unwrap();
        w.wake_by_ref();
        w.wake();
        let entries = list.take();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0] & TASK, TASK);
        tasks.woken(entries[0] & !TASK);
        tasks.run();
        assert_eq!(polls.load(Ordering::SeqCst), 2);

        waker.lock().unwrap().take().unwrap().wake();
        let entries = list.take();
        tasks.woken(entries[0] & !TASK);
        tasks.run();
        assert_eq!(polls.load(Ordering::SeqCst), 3, "the third poll ends it");
        assert!(tasks.is_none(), "an ended task is dropped");
    }

    #[test]
    fn a_task_that_panics_is_dropped_and_the_others_go_on() {
        let (_list, mut tasks, _offered) = reactor();
        let ran = Arc::new(AtomicUsize::new(0));
        let after = ran.clone();
        assert!(local::spawn(Box::pin(async { panic!("a task's own bug") })).is_ok());
        assert!(
            local::spawn(Box::pin(async move {
                after.fetch_add(1, Ordering::SeqCst);
            }))
            .is_ok()
        );
        tasks.run();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(tasks.is_none());
    }

    #[test]
    fn a_task_woken_twice_before_its_poll_is_polled_once() {
        let (list, mut tasks, _offered) = reactor();
        let (polls, waker) = spawn_counted(10);
        tasks.run();
        let w = waker.lock().unwrap().take().unwrap();
        // Taken off the list, woken again, taken again: still one poll.
        w.wake_by_ref();
        tasks.woken(list.take()[0] & !TASK);
        w.wake_by_ref();
        tasks.woken(list.take()[0] & !TASK);
        tasks.run();
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    /// Drops a spawn of its own, `depth` deep, when dropped.
    struct SpawnsOnDrop {
        depth: usize,
        dropped: Arc<AtomicUsize>,
    }

    impl std::future::Future for SpawnsOnDrop {
        type Output = ();
        fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    impl Drop for SpawnsOnDrop {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
            if self.depth > 0 {
                let next = SpawnsOnDrop {
                    depth: self.depth - 1,
                    dropped: self.dropped.clone(),
                };
                assert!(
                    local::spawn(Box::pin(next)).is_ok(),
                    "the loop still takes tasks"
                );
            }
        }
    }

    #[test]
    fn stopping_drops_every_task_and_what_their_drops_spawn() {
        let list = Arc::new(List::default());
        let mut tasks = Tasks::new(list);
        let offered = local::offer();
        let dropped = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let task = SpawnsOnDrop {
                depth: 3,
                dropped: dropped.clone(),
            };
            assert!(local::spawn(Box::pin(task)).is_ok());
        }
        tasks.run();
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        tasks.drop_all();
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            8,
            "two tasks, three spawns each"
        );
        assert!(tasks.is_none());
        drop(offered);
    }

    #[test]
    fn a_wake_for_a_task_that_ended_is_ignored() {
        let list = Arc::new(List::default());
        let mut tasks = Tasks::new(list);
        tasks.woken(7);
        assert!(!tasks.is_ready());
    }
}
