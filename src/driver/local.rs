//! Tasks on a server loop's own thread: futures an io_uring reactor polls
//! between its rounds, so a task that speaks to that loop's connections (an
//! async socket, a mux over one) crosses no thread to reach them.
//!
//! A loop that runs tasks offers itself here for as long as it runs
//! ([`offer`]); [`spawn`] on its thread hands it a task, which it takes at
//! its next round ([`take_spawned`]). On any other thread there is no loop,
//! and [`spawn`] gives the task back.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

/// A task for a server loop: its future, boxed.
pub(crate) type LoopTask = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// The tasks spawned on this thread's loop since it last took them;
    /// `None` while no loop that runs tasks is running on this thread.
    static SPAWNED: RefCell<Option<Vec<LoopTask>>> = const { RefCell::new(None) };
}

/// This thread's loop runs tasks until the value is dropped.
#[cfg_attr(not(all(target_os = "linux", feature = "uring")), allow(dead_code))]
pub(crate) struct Offered(());

/// Makes this thread's loop the one [`spawn`] gives tasks to, until the
/// returned value is dropped (tasks spawned and not taken are dropped then).
#[cfg_attr(not(all(target_os = "linux", feature = "uring")), allow(dead_code))]
pub(crate) fn offer() -> Offered {
    SPAWNED.with(|spawned| *spawned.borrow_mut() = Some(Vec::new()));
    Offered(())
}

impl Drop for Offered {
    fn drop(&mut self) {
        let left = SPAWNED.with(|spawned| spawned.borrow_mut().take());
        // Dropped outside the borrow: a task's drop may spawn.
        drop(left);
    }
}

/// Whether a loop that runs tasks is running on this thread.
#[cfg_attr(not(any(feature = "socket", feature = "mux")), allow(dead_code))]
pub(crate) fn on_loop_thread() -> bool {
    SPAWNED.with(|spawned| spawned.borrow().is_some())
}

/// Hands `task` to this thread's loop; gives it back if there is none.
#[cfg_attr(not(any(feature = "socket", feature = "mux")), allow(dead_code))]
pub(crate) fn spawn(task: LoopTask) -> Result<(), LoopTask> {
    SPAWNED.with(|spawned| match spawned.borrow_mut().as_mut() {
        Some(spawned) => {
            spawned.push(task);
            Ok(())
        }
        None => Err(task),
    })
}

/// Moves the tasks spawned since the last call into `into`; false if there
/// were none.
#[cfg_attr(not(all(target_os = "linux", feature = "uring")), allow(dead_code))]
pub(crate) fn take_spawned(into: &mut Vec<LoopTask>) -> bool {
    SPAWNED.with(|spawned| match spawned.borrow_mut().as_mut() {
        Some(spawned) if !spawned.is_empty() => {
            into.append(spawned);
            true
        }
        _ => false,
    })
}

/// Whether tasks were spawned and not taken yet.
#[cfg_attr(not(all(target_os = "linux", feature = "uring")), allow(dead_code))]
pub(crate) fn has_spawned() -> bool {
    SPAWNED.with(|spawned| spawned.borrow().as_ref().is_some_and(|s| !s.is_empty()))
}

#[cfg(any(feature = "socket", feature = "mux"))]
pub(crate) use beside::spawn_beside;
#[cfg(feature = "socket")]
pub(crate) use beside::spawn_entered;

#[cfg(any(feature = "socket", feature = "mux"))]
mod beside {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::runtime::Handle;

    /// Spawns `task` on this thread's server loop if one runs tasks here
    /// and a tokio runtime's context is entered (a task the loop polls:
    /// `task` is then polled inside that context too, so its timers and
    /// spawns work), else on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// As `tokio::spawn`, off a loop's thread and outside a runtime.
    pub(crate) fn spawn_beside<F>(task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Off a loop, or on one outside any runtime (a callback of the
        // reactor's own, not a task it polls): tokio's, which panics there
        // as it always does, rather than a task whose first timer would.
        match Handle::try_current() {
            Ok(runtime) if super::on_loop_thread() => spawn_entered(runtime, Box::pin(task)),
            _ => drop(tokio::spawn(task)),
        }
    }

    /// Hands `task` to this thread's server loop, to be polled (and dropped)
    /// inside `runtime`'s context; on `runtime` if no loop runs here.
    pub(crate) fn spawn_entered<F>(runtime: Handle, task: Pin<Box<F>>)
    where
        F: Future<Output = ()> + Send + ?Sized + 'static,
    {
        let entered: super::LoopTask = Box::pin(Entered {
            runtime: runtime.clone(),
            task: Some(task),
        });
        if let Err(task) = super::spawn(entered) {
            runtime.spawn(task);
        }
    }

    /// A loop task polled (and dropped) inside a tokio runtime's context.
    struct Entered<F: ?Sized> {
        runtime: Handle,
        task: Option<Pin<Box<F>>>,
    }

    impl<F: Future<Output = ()> + ?Sized> Future for Entered<F> {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = &mut *self;
            let _entered = this.runtime.enter();
            match this.task.as_mut() {
                Some(task) => {
                    let poll = task.as_mut().poll(cx);
                    if poll.is_ready() {
                        this.task = None;
                    }
                    poll
                }
                None => Poll::Ready(()),
            }
        }
    }

    impl<F: ?Sized> Drop for Entered<F> {
        fn drop(&mut self) {
            let _entered = self.runtime.enter();
            self.task = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_goes_to_the_loop_only_while_one_is_offered() {
        assert!(!on_loop_thread());
        assert!(spawn(Box::pin(async {})).is_err(), "no loop yet");
        let offered = offer();
        assert!(on_loop_thread());
        assert!(spawn(Box::pin(async {})).is_ok());
        assert!(spawn(Box::pin(async {})).is_ok());
        assert!(has_spawned());
        let mut taken = Vec::new();
        assert!(take_spawned(&mut taken));
        assert_eq!(taken.len(), 2);
        assert!(!has_spawned());
        assert!(!take_spawned(&mut taken));
        drop(offered);
        assert!(!on_loop_thread());
        assert!(spawn(Box::pin(async {})).is_err(), "the loop is gone");
    }

    /// On a loop's thread, a task goes to the loop only from inside a
    /// runtime's context (a task the loop polls); from a callback of the
    /// loop's own, outside any runtime, `spawn_beside` panics as
    /// `tokio::spawn` does instead of queueing a task whose first timer
    /// would.
    #[cfg(any(feature = "socket", feature = "mux"))]
    #[test]
    fn spawn_beside_takes_the_loop_only_inside_a_runtime() {
        let _offered = offer();
        let outside = std::panic::catch_unwind(|| spawn_beside(async {}));
        assert!(outside.is_err(), "no runtime: tokio's panic");
        assert!(!has_spawned());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let entered = runtime.enter();
        spawn_beside(async {});
        assert!(has_spawned(), "inside a runtime: the loop's");
        drop(entered);
    }

    #[test]
    fn a_task_left_when_the_loop_ends_is_dropped() {
        let dropped = std::sync::Arc::new(());
        let held = dropped.clone();
        let offered = offer();
        assert!(spawn(Box::pin(async move { drop(held) })).is_ok());
        assert_eq!(std::sync::Arc::strong_count(&dropped), 2);
        drop(offered);
        assert_eq!(std::sync::Arc::strong_count(&dropped), 1);
    }
}
