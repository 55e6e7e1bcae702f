//! A server loop's mailbox: [`Job`]s other threads hand it (pub/sub
//! deliveries), one hand-off per loop, run on the loop's thread at the start
//! of its next turn, so that the sends they make to its connections go out
//! with that turn's writes. The hand-off is bounded ([`POSTED_LIMIT`]): a
//! loop that falls that far behind the threads posting to it refuses jobs
//! until it catches up.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::connection::wake::Job;

/// The most the jobs waiting for one loop may weigh: the bytes they hold,
/// plus [`JOB_WEIGHT`] each. Enough for a burst of 100,000 small publishes,
/// or 16 of a megabyte; a loop further behind than that is not going to
/// deliver them soon, and memory must not grow with the backlog.
#[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
pub(crate) const POSTED_LIMIT: usize = 16 << 20;

/// What a posted job weighs besides its bytes: its box and its place in
/// the list, rounded up.
#[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
pub(crate) const JOB_WEIGHT: usize = 64;

/// The jobs posted to a loop and not run yet.
#[derive(Default)]
pub(crate) struct Posted {
    /// Set after a push: a loop with nothing posted pays one atomic load
    /// per turn, not a lock.
    any: AtomicBool,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    jobs: Vec<Job>,
    /// What `jobs` weigh (see [`POSTED_LIMIT`]).
    weight: usize,
}

impl Posted {
    /// A panic elsewhere cannot leave the list half-pushed, nor its weight
    /// apart from it (both change together, after the push), so poisoning is
    /// ignored.
    fn lock_pending(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a job holding `bytes`, unless that would take the waiting jobs
    /// past [`POSTED_LIMIT`] (one job is always taken); if added, the caller
    /// then wakes the loop.
    #[cfg_attr(not(feature = "pubsub"), allow(dead_code))]
    pub(crate) fn push(&self, job: Job, bytes: usize) -> bool {
        // At most the limit each: the sums cannot overflow.
        let weight = bytes.saturating_add(JOB_WEIGHT).min(POSTED_LIMIT);
        let mut pending = self.lock_pending();
        if !pending.jobs.is_empty() && pending.weight.saturating_add(weight) > POSTED_LIMIT {
            return false;
        }
        pending.jobs.push(job);
        pending.weight += weight;
        self.any.store(true, Ordering::Release);
        true
    }

    /// Runs the jobs posted so far, in order, with `spare` as the list to
    /// run them from (kept by the loop, so a turn allocates nothing);
    /// false if there were none. A job that panics is logged and costs
    /// only itself.
    pub(crate) fn run(&self, spare: &mut Vec<Job>) -> bool {
        if !self.any.swap(false, Ordering::AcqRel) {
            return false;
        }
        // The jobs taken weigh until they have run: what waits and what
        // runs together stay within the limit.
        let taken = {
            let mut pending = self.lock_pending();
            std::mem::swap(&mut pending.jobs, spare);
            pending.weight
        };
        for job in spare.drain(..) {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("a job posted to a server loop panicked");
            }
        }
        self.lock_pending().weight -= taken;
        true
    }
}

/// Locks a list; a panic elsewhere cannot leave a `Vec` half-pushed, so
/// poisoning is ignored.
pub(crate) fn lock<T>(list: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    list.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn posted_jobs_run_once_in_order_and_a_panic_costs_only_its_job() {
        let posted = Posted::default();
        let mut spare = Vec::new();
        assert!(!posted.run(&mut spare), "nothing posted");
        let ran = Arc::new(Mutex::new(Vec::new()));
        for n in 0..3 {
            let ran = ran.clone();
            assert!(posted.push(
                Box::new(move || {
                    assert_ne!(n, 1, "the second job panics");
                    lock(&ran).push(n);
                }),
                100,
            ));
        }
        assert!(posted.run(&mut spare));
        assert_eq!(*lock(&ran), [0, 2]);
        assert!(!posted.run(&mut spare), "each job runs once");
    }

    #[test]
    fn posted_jobs_stop_at_their_limit_until_the_loop_runs_them() {
        let posted = Posted::default();
        let mut spare = Vec::new();
        assert!(
            posted.push(Box::new(|| {}), usize::MAX),
            "one job always goes"
        );
        assert!(!posted.push(Box::new(|| {}), 0));
        assert!(posted.run(&mut spare));
        let each = 1000;
        let fit = POSTED_LIMIT / (each + JOB_WEIGHT);
        for n in 0..fit {
            assert!(posted.push(Box::new(|| {}), each), "job {n}");
        }
        assert!(!posted.push(Box::new(|| {}), each), "past the limit");
        assert!(posted.run(&mut spare));
        assert!(posted.push(Box::new(|| {}), each), "room again");
    }

    #[test]
    fn jobs_being_run_still_count_against_the_limit() {
        let posted = Arc::new(Posted::default());
        let mut spare = Vec::new();
        let during = Arc::new(Mutex::new(Vec::new()));
        let (inner, seen) = (posted.clone(), during.clone());
        let heavy = Box::new(move || {
            // The loop is running a full batch: one job still goes (a
            // message as large as the limit must get through), no more.
            lock(&seen).push(inner.push(Box::new(|| {}), 10));
            lock(&seen).push(inner.push(Box::new(|| {}), 10));
        });
        assert!(posted.push(heavy, POSTED_LIMIT));
        assert!(posted.run(&mut spare));
        assert_eq!(*lock(&during), [true, false]);
        // Run, the batch weighs nothing: only the job that went remains.
        assert!(posted.push(Box::new(|| {}), POSTED_LIMIT / 2));
    }
}
