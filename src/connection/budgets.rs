//! The byte budgets' metrics (feature `metrics`), reported on time: one
//! thread for the process sets, once a second, what every live budget of
//! each kind (`mux`, `webtransport`) holds and allows, and adds what they
//! shed and refused since, however quiet their sessions are. A budget that
//! is dropped leaves the list at the next pass. Without the feature,
//! nothing.

/// Reports `budget` under `kind` from now on, for as long as it lives
/// (once, however often it is given).
#[cfg(not(feature = "metrics"))]
pub(crate) fn watch(_budget: &rapidws_core::budget::Budget, _kind: &'static str) {}

#[cfg(feature = "metrics")]
pub(crate) use sweep::watch;

#[cfg(feature = "metrics")]
mod sweep {
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use metrics::{Counter, Gauge};
    use rapidws_core::budget::{Budget, WeakBudget};

    /// How often the gauges are set.
    const EVERY: Duration = Duration::from_secs(1);

    /// One budget watched, and what of its counts was reported.
    struct Watched {
        budget: WeakBudget,
        kind: &'static str,
        shed: u64,
        refused: u64,
    }

    /// One kind's handles.
    struct Kind {
        kind: &'static str,
        held: Gauge,
        limit: Gauge,
        shed: Counter,
        refused: Counter,
    }

    impl Kind {
        fn new(kind: &'static str) -> Kind {
            Kind {
                kind,
                held: metrics::gauge!("rapidws_budget_bytes", "budget" => kind),
                limit: metrics::gauge!("rapidws_budget_limit_bytes", "budget" => kind),
                shed: metrics::counter!("rapidws_budget_shed_total", "budget" => kind),
                refused: metrics::counter!("rapidws_budget_refused_total", "budget" => kind),
            }
        }
    }

    struct Sweeper {
        watched: Mutex<Vec<Watched>>,
    }

    fn sweeper() -> &'static Sweeper {
        static SWEEPER: OnceLock<Sweeper> = OnceLock::new();
        SWEEPER.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("rapidws-budgets".into())
                .spawn(run);
            if let Err(error) = spawned {
                tracing::error!(%error, "no thread to report the byte budgets' metrics");
            }
            Sweeper {
                watched: Mutex::new(Vec::new()),
            }
        })
    }

    /// Reports `budget` under `kind` from now on, for as long as it lives
    /// (once, however often it is given).
    pub(crate) fn watch(budget: &Budget, kind: &'static str) {
        let mut watched = sweeper().watched.lock().unwrap_or_else(|p| p.into_inner());
        let known = watched
            .iter()
            .any(|w| w.kind == kind && w.budget.upgrade().as_ref() == Some(budget));
        if !known {
            watched.push(Watched {
                budget: budget.downgrade(),
                kind,
                shed: budget.shed(),
                refused: budget.refused(),
            });
        }
    }

    fn run() {
        let mut kinds: Vec<Kind> = Vec::new();
        loop {
            std::thread::sleep(EVERY);
            let mut watched = sweeper().watched.lock().unwrap_or_else(|p| p.into_inner());
            let mut sums: Vec<(&'static str, usize, usize)> = Vec::new();
            watched.retain_mut(|w| {
                let Some(budget) = w.budget.upgrade() else {
                    return false;
                };
                let kind = match kinds.iter().position(|k| k.kind == w.kind) {
                    Some(at) => &kinds[at],
                    None => {
                        kinds.push(Kind::new(w.kind));
                        &kinds[kinds.len() - 1]
                    }
                };
                let (shed, refused) = (budget.shed(), budget.refused());
                kind.shed.increment(shed - w.shed);
                kind.refused.increment(refused - w.refused);
                (w.shed, w.refused) = (shed, refused);
                match sums.iter_mut().find(|(k, _, _)| *k == w.kind) {
                    Some((_, held, limit)) => {
                        *held += budget.used();
                        *limit += budget.limit();
                    }
                    None => sums.push((w.kind, budget.used(), budget.limit())),
                }
                true
            });
            drop(watched);
            for kind in &kinds {
                let (held, limit) = sums
                    .iter()
                    .find(|(k, _, _)| *k == kind.kind)
                    .map_or((0, 0), |&(_, held, limit)| (held, limit));
                kind.held.set(held as f64);
                kind.limit.set(limit as f64);
            }
        }
    }
}
