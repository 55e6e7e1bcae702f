//! Counters and a latency histogram shared by a mode's connection tasks.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

pub struct Stats {
    /// Latencies in nanoseconds, recorded only in the measured window.
    pub latency: Histogram<u64>,
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

pub type SharedStats = Rc<RefCell<Stats>>;

impl Stats {
    pub fn shared() -> SharedStats {
        let latency = Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid bounds");
        Rc::new(RefCell::new(Stats {
            latency,
            completed: 0,
            errors: 0,
            first_error: None,
        }))
    }

    pub fn record(&mut self, latency: Duration) {
        self.completed += 1;
        let _ = self.latency.record(latency.as_nanos().max(1) as u64);
    }

    pub fn error(&mut self, error: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(error.to_string());
        }
    }

    /// Rate over `secs`, latency percentiles in microseconds, errors.
    pub fn summary(&self, secs: f64) -> Value {
        let us = |ns: u64| ns as f64 / 1000.0;
        json!({
            "completed": self.completed,
            "per_sec": self.completed as f64 / secs,
            "secs": secs,
            "avg_us": self.latency.mean() / 1000.0,
            "p50_us": us(self.latency.value_at_quantile(0.50)),
            "p99_us": us(self.latency.value_at_quantile(0.99)),
            "p999_us": us(self.latency.value_at_quantile(0.999)),
            "max_us": us(self.latency.max()),
            "errors": self.errors,
            "first_error": self.first_error,
        })
    }
}
