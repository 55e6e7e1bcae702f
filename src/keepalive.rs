//! Keepalive pings and the idle timeout, both off unless configured.
//!
//! A connection keeps one counter: sweeps since its peer last sent anything
//! (any bytes count, a pong included). Each server loop (a tokio group, an
//! io_uring reactor) sweeps its open connections every [`Sweep::period`], a
//! quarter of the shorter of the two settings, and bumps their counters. No
//! per-connection timer exists, so an idle connection costs four bytes for
//! this, and a sweep costs one pass over the loop's connections. The price is
//! precision: a ping or an idle close comes up to one period late.

use std::time::Duration;

use crate::config::Config;
use crate::conn::Conn;
use crate::proto::CloseCode;

/// Sweeps are never more frequent than this, however short the settings.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// When a quiet connection is pinged and when it is closed, in sweeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sweep {
    pub(crate) period: Duration,
    /// Ping after this many quiet sweeps, and again every as many.
    ping_every: Option<u32>,
    /// Close with 1001 after this many quiet sweeps.
    close_after: Option<u32>,
}

impl Sweep {
    /// The sweep `config` asks for; `None` when neither is on.
    pub(crate) fn new(config: &Config) -> Option<Sweep> {
        let shortest = match (config.ping_interval, config.idle_timeout) {
            (None, None) => return None,
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).expect("one is set"),
        };
        let period = (shortest / 4).max(MIN_PERIOD);
        let sweeps = |d: Duration| {
            let n = d.as_nanos().div_ceil(period.as_nanos()).max(1);
            u32::try_from(n).unwrap_or(u32::MAX)
        };
        Some(Sweep {
            period,
            ping_every: config.ping_interval.map(sweeps),
            close_after: config.idle_timeout.map(sweeps),
        })
    }

    /// One sweep of an open connection whose peer has been quiet for `quiet`
    /// sweeps before this one: pings or closes it if it is due. Both go
    /// through `conn` like a handler's own ping or close, so they wake the
    /// connection's loop and are written with everything else.
    pub(crate) fn visit(&self, quiet: &mut u32, conn: &Conn) {
        *quiet = quiet.saturating_add(1);
        if self.close_after.is_some_and(|n| *quiet >= n) {
            // Refused only if it is closing already.
            let _ = conn.close(CloseCode::GOING_AWAY, "idle timeout");
        } else if self.ping_every.is_some_and(|n| *quiet % n == 0) {
            // A full queue means the peer has data to read anyway.
            let _ = conn.ping(b"");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(ping: Option<u64>, idle: Option<u64>) -> Option<Sweep> {
        let config = Config::default()
            .ping_interval(ping.map(Duration::from_millis))
            .idle_timeout(idle.map(Duration::from_millis));
        Sweep::new(&config)
    }

    #[test]
    fn off_unless_configured() {
        assert!(sweep(None, None).is_none());
    }

    #[test]
    fn the_period_is_a_quarter_of_the_shorter_setting() {
        let s = sweep(Some(20_000), Some(60_000)).unwrap();
        assert_eq!(s.period, Duration::from_secs(5));
        assert_eq!((s.ping_every, s.close_after), (Some(4), Some(12)));
        let s = sweep(None, Some(1_000)).unwrap();
        assert_eq!(s.period, Duration::from_millis(250));
        assert_eq!((s.ping_every, s.close_after), (None, Some(4)));
        // Never below the minimum period; counts round up.
        let s = sweep(Some(1), Some(25)).unwrap();
        assert_eq!(s.period, MIN_PERIOD);
        assert_eq!((s.ping_every, s.close_after), (Some(1), Some(3)));
    }
}
