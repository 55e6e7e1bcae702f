//! History swept on time, not on traffic: one thread for the whole
//! process lets every `PubSub`'s kept publications past their age go,
//! counts again what the rest hold (frames made for them since), forgets
//! topics left with nothing, and refreshes the budgets' gauges, however
//! quiet the publishers are. A `PubSub` that is dropped leaves the list
//! at the next pass.

use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::Inner;

/// The `PubSub`s swept, and the thread's wake-up.
struct Sweeper {
    swept: Mutex<Vec<Swept>>,
    added: Condvar,
}

struct Swept {
    inner: Weak<Inner>,
    every: Duration,
    due: Instant,
    /// When what the kept publications hold was last counted again.
    recounted: Instant,
}

/// How often what kept publications hold is counted again (a walk over
/// every one), however often history is swept.
const RECOUNT_EVERY: Duration = Duration::from_secs(1);

/// The longest the thread sleeps (it is woken when a `PubSub` is added).
const MAX_SLEEP: Duration = Duration::from_secs(1);

fn sweeper() -> &'static Sweeper {
    static SWEEPER: OnceLock<Sweeper> = OnceLock::new();
    SWEEPER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("rapidws-pubsub-sweep".into())
            .spawn(run);
        if let Err(error) = spawned {
            tracing::error!(%error, "no thread to sweep pub/sub history: old publications stay");
        }
        Sweeper {
            swept: Mutex::new(Vec::new()),
            added: Condvar::new(),
        }
    })
}

/// Sweeps `inner` every `every` from now on, for as long as it lives.
pub(super) fn start(inner: &Arc<Inner>, every: Duration) {
    let sweeper = sweeper();
    let mut swept = sweeper.swept.lock().unwrap_or_else(|p| p.into_inner());
    swept.push(Swept {
        inner: Arc::downgrade(inner),
        every,
        due: Instant::now() + every,
        recounted: Instant::now(),
    });
    sweeper.added.notify_one();
}

fn run() {
    let sweeper = sweeper();
    let mut swept = sweeper.swept.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        swept.retain_mut(|entry| {
            if entry.inner.strong_count() == 0 {
                return false;
            }
            if entry.due <= now {
                let recount = now.duration_since(entry.recounted) >= RECOUNT_EVERY;
                if recount {
                    entry.recounted = now;
                }
                due.extend(entry.inner.upgrade().map(|inner| (inner, recount)));
                entry.due = now + entry.every;
            }
            true
        });
        let next = swept.iter().map(|entry| entry.due).min();
        drop(swept);
        for (inner, recount) in due {
            inner.sweep(now, recount);
        }
        swept = sweeper.swept.lock().unwrap_or_else(|p| p.into_inner());
        let sleep = next.map_or(MAX_SLEEP, |next| {
            next.saturating_duration_since(Instant::now())
                .min(MAX_SLEEP)
        });
        if !sleep.is_zero() {
            swept = match sweeper.added.wait_timeout(swept, sleep) {
                Ok((swept, _)) => swept,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl Inner {
    /// One pass of the sweeper: kept publications past their age let go,
    /// the rest counted again (with `recount`: at most once a second),
    /// idle topics forgotten, the budget held, the gauges set.
    fn sweep(&self, now: Instant, recount: bool) {
        self.registry.sweep(now, recount);
        self.shed_history();
        self.meters.usage(&self.usage(), &self.config.limits);
    }
}
