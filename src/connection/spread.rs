//! A spread shutdown: one whose closes are spread over a window instead of sent
//! all at once, so that the clients of a server being deployed do not all
//! reconnect (to its successor, or to the other servers behind the load
//! balancer) in the same second. NATS calls it lame duck mode.
//!
//! The server loops hand their open connections to the [`Spreader`] when they
//! see the shutdown, as they would close them; a thread of its own closes
//! them one at a time. The `k`-th of the `n` connections open when the shutdown
//! began is closed at `window × (k + u) / n`, `u` drawn afresh in `[0, 1)`
//! for each: evenly spread, with jitter, whatever order the loops handed
//! them in. Connections handed in late (or more than `n`) are closed at
//! their slot, or at the window's end; once the window has passed, a
//! connection handed in is closed at once.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::connection::conn::Conn;
use crate::proto::{CloseCode, truncate_reason};

/// How a spread shutdown closes connections: over how long, with which code and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spread {
    window: Duration,
    code: CloseCode,
    reason: String,
}

impl Spread {
    /// Closes every connection with 1012 (service restart), spread over
    /// `window` (zero: all at once; at most a day, longer is a day).
    pub fn over(window: Duration) -> Spread {
        Spread {
            window: window.min(Duration::from_secs(86_400)),
            code: CloseCode::SERVICE_RESTART,
            reason: "service restart".into(),
        }
    }

    /// Closes with `code` and `reason` instead of 1012. A code that may not
    /// be sent (1005, 1006, 1015, or outside the ranges of RFC 6455 §7.4)
    /// is replaced by 1012, and a reason longer than a close frame holds
    /// (123 bytes) is cut at a character boundary.
    pub fn code(mut self, code: CloseCode, reason: &str) -> Spread {
        if code.is_sendable() {
            self.code = code;
        }
        self.reason = truncate_reason(reason).to_owned();
        self
    }

    /// The window the closes are spread over.
    pub fn window(&self) -> Duration {
        self.window
    }
}

/// A running spread shutdown (see the module): the connections waiting for their
/// slot, closed by a thread of its own.
pub(crate) struct Spreader {
    spread: Spread,
    start: Instant,
    /// Connections open when the shutdown began: the slots are spread for them.
    expected: usize,
    state: Mutex<State>,
    /// Wakes the thread when the first connections arrive.
    arrived: Condvar,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Conn>,
    /// Connections closed so far (the next one's slot).
    closed: usize,
    /// The window has passed (or the server aborts): close at once.
    over: bool,
}

impl Spreader {
    /// Starts spreading the closes of about `expected` connections, with its thread.
    pub(crate) fn start(spread: Spread, expected: usize) -> Arc<Spreader> {
        let spreader = Arc::new(Spreader {
            spread,
            start: Instant::now(),
            expected: expected.max(1),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        });
        if spreader.spread.window.is_zero() {
            spreader.lock().over = true;
            return spreader;
        }
        let runner = spreader.clone();
        let spawned = std::thread::Builder::new()
            .name("rapidws-spread".into())
            .spawn(move || runner.run());
        if let Err(error) = spawned {
            // Without the thread, close everything at once rather than never.
            tracing::warn!(%error, "cannot start the spread shutdown's thread; closing at once");
            spreader.lock().over = true;
        }
        spreader
    }

    /// The code and reason the connections are closed with.
    pub(crate) fn spread(&self) -> &Spread {
        &self.spread
    }

    /// Takes an open connection: closed at its slot, or at once if the
    /// window has passed.
    pub(crate) fn add(&self, conn: &Conn) {
        let mut state = self.lock();
        if state.over {
            drop(state);
            self.close(conn);
            return;
        }
        state.waiting.push_back(conn.clone());
        if state.waiting.len() == 1 {
            self.arrived.notify_one();
        }
    }

    /// Ends the spread now (the server aborts): whatever waits is closed at
    /// once (the abort then drops it), and the thread stops.
    pub(crate) fn finish(&self) {
        let waiting = {
            let mut state = self.lock();
            state.over = true;
            std::mem::take(&mut state.waiting)
        };
        self.arrived.notify_one();
        waiting.iter().for_each(|conn| self.close(conn));
    }

    fn close(&self, conn: &Conn) {
        // Refused only if it is closing already, which is as good.
        let _ = conn.close(self.spread.code, &self.spread.reason);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the `k`-th connection is due: `window × (k + jitter) / n`.
    fn slot(&self, k: usize) -> Instant {
        let mut bytes = [0u8; 4];
        crate::proto::fill_random(&mut bytes);
        let jitter = f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0);
        let share = ((k as f64 + jitter) / self.expected as f64).min(1.0);
        self.start + self.spread.window.mul_f64(share)
    }

    /// The thread: closes each waiting connection at its slot, then, at the
    /// window's end, whatever is left.
    fn run(&self) {
        let end = self.start + self.spread.window;
        let mut state = self.lock();
        let mut due = self.slot(state.closed);
        loop {
            if state.over {
                return;
            }
            let now = Instant::now();
            if now >= end {
                drop(state);
                self.finish();
                return;
            }
            // Nothing handed in yet (or everything closed): wait for more,
            // or for the window's end; else for the next slot.
            let until = if state.waiting.is_empty() { end } else { due };
            if now < until {
                state = self
                    .arrived
                    .wait_timeout(state, until - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            // Every connection whose slot has come, one slot each.
            let mut batch = Vec::new();
            while due <= now {
                let Some(conn) = state.waiting.pop_front() else {
                    break;
                };
                batch.push(conn);
                state.closed += 1;
                due = self.slot(state.closed);
            }
            drop(state);
            batch.iter().for_each(|conn| self.close(conn));
            state = self.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::MAX_CLOSE_REASON;

    #[test]
    fn a_spread_keeps_a_code_it_may_send_and_cuts_a_long_reason() {
        let spread = Spread::over(Duration::from_secs(1));
        assert_eq!(spread.code, CloseCode::SERVICE_RESTART);
        let custom = spread.clone().code(CloseCode::TRY_AGAIN_LATER, "later");
        assert_eq!(
            (custom.code, custom.reason.as_str()),
            (CloseCode(1013), "later")
        );
        let refused = spread.clone().code(CloseCode::NO_STATUS, "x");
        assert_eq!(refused.code, CloseCode::SERVICE_RESTART);
        let long = "é".repeat(100);
        let cut = spread.code(CloseCode::GOING_AWAY, &long);
        assert!(cut.reason.len() <= MAX_CLOSE_REASON && cut.reason.len() >= 121);
        assert!(long.starts_with(&cut.reason));
    }

    #[test]
    fn slots_spread_evenly_over_the_window_with_jitter() {
        let window = Duration::from_secs(10);
        let spreader = Spreader {
            spread: Spread::over(window),
            start: Instant::now(),
            expected: 10,
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        };
        let offsets: Vec<Duration> = (0..10).map(|k| spreader.slot(k) - spreader.start).collect();
        for (k, offset) in offsets.iter().enumerate() {
            // The k-th lands in the k-th tenth of the window.
            assert!(*offset >= Duration::from_secs(k as u64), "{k}: {offset:?}");
            assert!(
                *offset < Duration::from_secs(k as u64 + 1),
                "{k}: {offset:?}"
            );
        }
        // Jitter: not all on the tenths' starts.
        assert!(offsets.iter().any(|offset| offset.subsec_nanos() != 0));
        // More than expected: at the window's end, not after.
        assert_eq!(spreader.slot(25) - spreader.start, window);
    }
}
