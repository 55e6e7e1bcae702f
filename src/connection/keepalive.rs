//! Keepalive pings and the idle timeout, both off unless configured.
//!
//! A connection keeps one counter: sweeps since its peer last showed it is
//! alive (it sent bytes, a pong included, or read when our writes waited for
//! room). Each server loop (a tokio group, an io_uring reactor) sweeps its
//! open connections every [`Sweep::period`], a quarter of the shorter of the
//! two settings, and bumps their counters. No per-connection timer exists: an
//! idle connection costs a four-byte counter for this (it fits in padding
//! `Dispatch` had already), and a sweep costs one pass over the loop's
//! connections. The price is precision: a ping or an idle close comes up to
//! one period late, never early.

use std::time::Duration;

use crate::connection::config::Config;
use crate::connection::conn::Conn;
use crate::proto::CloseCode;

/// Sweeps are never more frequent than this, however short the settings.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// When a quiet connection is pinged and when it is closed, in sweeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sweep {
    pub(crate) period: Duration,
    /// The first ping after this many quiet sweeps, then one every
    /// `ping_every` more.
    ping_after: Option<u32>,
    ping_every: u32,
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
        // The first sweep after the peer's last sign of life comes anywhere
        // up to one period later, so `n` more sweeps mean at least `n - 1`
        // periods: one more sweep than the setting needs makes sure it has
        // passed.
        let ping_every = config.ping_interval.map_or(u32::MAX, sweeps);
        let ping_after = config.ping_interval.map(|d| sweeps(d).saturating_add(1));
        let close_after = config.idle_timeout.map(|d| {
            let n = sweeps(d).saturating_add(1);
            // With both on and the ping the shorter, a ping must go out (and
            // its pong have a chance) before the close, even when the
            // minimum period rounds them to the same sweep.
            match ping_after {
                Some(ping) if config.ping_interval < config.idle_timeout => {
                    n.max(ping.saturating_add(1))
                }
                _ => n,
            }
        });
        Some(Sweep {
            period,
            ping_after,
            ping_every,
            close_after,
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
        } else if self.ping_due(*quiet) {
            conn.keepalive_ping();
        }
    }

    fn ping_due(&self, quiet: u32) -> bool {
        self.ping_after
            .is_some_and(|first| quiet >= first && (quiet - first).is_multiple_of(self.ping_every))
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
        // One sweep more than the setting: the first may come at once.
        assert_eq!(
            (s.ping_after, s.ping_every, s.close_after),
            (Some(5), 4, Some(13))
        );
        let s = sweep(None, Some(1_000)).unwrap();
        assert_eq!(s.period, Duration::from_millis(250));
        assert_eq!((s.ping_after, s.close_after), (None, Some(5)));
        // Never below the minimum period; counts round up.
        let s = sweep(Some(1), Some(25)).unwrap();
        assert_eq!(s.period, MIN_PERIOD);
        assert_eq!(
            (s.ping_after, s.ping_every, s.close_after),
            (Some(2), 1, Some(4))
        );
    }

    /// Sweep `n` of a connection that is quiet throughout: what it does.
    fn plan(s: &Sweep, sweeps: u32) -> Vec<(u32, &'static str)> {
        (1..=sweeps)
            .filter_map(|q| {
                if s.close_after.is_some_and(|n| q >= n) {
                    Some((q, "close"))
                } else {
                    s.ping_due(q).then_some((q, "ping"))
                }
            })
            .take_while(|&(q, _)| s.close_after.is_none_or(|n| q <= n))
            .collect()
    }

    #[test]
    fn pings_repeat_until_the_close_and_never_come_early() {
        // Ping every 300 ms, close after 1.2 s: period 75 ms.
        let s = sweep(Some(300), Some(1_200)).unwrap();
        // At sweep q, at least (q - 1) periods have passed.
        assert_eq!(
            plan(&s, 20),
            [(5, "ping"), (9, "ping"), (13, "ping"), (17, "close")]
        );
        for (q, _) in plan(&s, 20) {
            assert!(s.period * (q - 1) >= Duration::from_millis(300));
        }
        // The minimum period rounds ping and close to the same sweep: the
        // ping still comes first.
        let s = sweep(Some(12), Some(15)).unwrap();
        assert_eq!(plan(&s, 10), [(3, "ping"), (4, "close")]);
    }
}
