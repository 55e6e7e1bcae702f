//! How long a subscriber waits before it reconnects: capped exponential
//! backoff with full jitter, so that clients cut together come back spread
//! over the window instead of in one instant.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// The delays before each reconnect: attempt `n` (from 0) waits a uniformly
/// random time in `[0, min(cap, base * 2^n))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first attempt's window.
    pub base: Duration,
    /// The widest window.
    pub cap: Duration,
}

impl Default for Backoff {
    /// 250 ms, doubling up to 30 s.
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The window of attempt `attempt`: `min(cap, base * 2^attempt)`.
    pub fn window(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A delay for attempt `attempt`, drawn from its window with `random`
    /// (a uniformly random `u64`).
    pub(crate) fn delay(&self, attempt: u32, random: u64) -> Duration {
        let window = self.window(attempt).as_nanos();
        if window == 0 {
            return Duration::ZERO;
        }
        // Below 2^64 ns (584 years) the modulo's bias is nothing here.
        let nanos = u128::from(random) % window;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// A random `u64` (not for secrets: the standard library's per-process
/// keys over a count).
pub(crate) fn random() -> u64 {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    RandomState::new().hash_one(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_double_up_to_the_cap() {
        let backoff = Backoff::default();
        assert_eq!(backoff.window(0), Duration::from_millis(250));
        assert_eq!(backoff.window(1), Duration::from_millis(500));
        assert_eq!(backoff.window(6), Duration::from_millis(16_000));
        assert_eq!(backoff.window(7), Duration::from_secs(30));
        assert_eq!(backoff.window(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn delays_fill_the_window() {
        let backoff = Backoff::default();
        let window = backoff.window(3);
        let delays: Vec<Duration> = (0..10_000).map(|_| backoff.delay(3, random())).collect();
        assert!(delays.iter().all(|d| *d < window));
        // Full jitter: spread over the whole window, not bunched at its end.
        let low = delays.iter().filter(|d| **d < window / 4).count();
        let high = delays.iter().filter(|d| **d >= window * 3 / 4).count();
        assert!((2_000..3_000).contains(&low), "{low} in the first quarter");
        assert!((2_000..3_000).contains(&high), "{high} in the last quarter");
        let zero = Backoff {
            base: Duration::ZERO,
            cap: Duration::ZERO,
        };
        assert_eq!(zero.delay(5, random()), Duration::ZERO);
    }
}
