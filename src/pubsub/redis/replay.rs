//! Replays refused (with a secret): a signed message is delivered once,
//! and only while it is fresh, whatever Redis does with it.
//!
//! Each message carries its node's id, a count that only grows, and when
//! it was published, all under the MAC. A node's messages on one topic
//! reach every node in the order of their counts (one connection to
//! Redis, and one Redis shard per topic keep a publisher's order), so a
//! message whose count is not above the last one heard from its node on
//! its topic is a replay: refused, the node's own included. What is
//! remembered is bounded in time: a message signed more than [`WINDOW_MS`]
//! ago is refused whatever its count, so a node and topic not heard from
//! for that long (and [`SKEW_MS`] more) can be forgotten. A node also
//! refuses what was signed before it started listening (less [`SKEW_MS`]):
//! after a restart, with nothing remembered, a captured message is still
//! refused. Clocks must agree within [`SKEW_MS`]: a message from further in
//! the future is refused too.

use std::collections::HashMap;

use super::wire::Stamp;

/// How long a signed message is good for, on the receiving node's clock.
pub(super) const WINDOW_MS: u64 = 120_000;

/// How far the nodes' clocks may disagree.
pub(super) const SKEW_MS: u64 = 10_000;

/// The most (node, topic) pairs remembered: past it, those heard from
/// longest ago are forgotten early (and a replay of theirs within the
/// window is not caught).
const MAX_PAIRS: usize = 1 << 20;

/// The last count heard from each node on each topic, and when.
pub(super) struct Replays {
    /// When this node started listening (milliseconds since the epoch).
    started: u64,
    heard: HashMap<([u8; 16], Box<str>), Heard>,
    /// When the remembered pairs were last cleared of old ones.
    swept: u64,
}

#[derive(Clone, Copy)]
struct Heard {
    count: u64,
    at: u64,
}

/// Why a message was refused.
pub(super) type Refusal = &'static str;

impl Replays {
    pub(super) fn new(started: u64) -> Replays {
        Replays {
            started,
            heard: HashMap::new(),
            swept: started,
        }
    }

    /// Whether a message stamped `stamp` on `topic`, heard `now`, is new
    /// and fresh; remembered if it is.
    pub(super) fn check(&mut self, topic: &str, stamp: Stamp, now: u64) -> Result<(), Refusal> {
        if stamp.time > now.saturating_add(SKEW_MS) {
            return Err("signed in the future: the nodes' clocks disagree by more than 10 s");
        }
        if stamp.time.saturating_add(WINDOW_MS) < now {
            return Err("signed more than two minutes ago: a replay, or a message held up");
        }
        if stamp.time.saturating_add(SKEW_MS) < self.started {
            return Err("signed before this node started listening: a replay");
        }
        self.sweep(now);
        let key = (stamp.node, Box::from(topic));
        match self.heard.get_mut(&key) {
            Some(heard) if stamp.count <= heard.count => {
                Err("a replay: its count is not above the last one from its node on this topic")
            }
            Some(heard) => {
                *heard = Heard {
                    count: stamp.count,
                    at: now,
                };
                Ok(())
            }
            None => {
                self.heard.insert(
                    key,
                    Heard {
                        count: stamp.count,
                        at: now,
                    },
                );
                Ok(())
            }
        }
    }

    /// Remembers what a read of a stream took (`stamp`, on `topic`), so
    /// that a replay of it live is refused: its count, if above what is
    /// remembered. Nothing signed longer ago than a message stays good
    /// needs remembering (its replay is refused for its age).
    pub(super) fn note(&mut self, topic: &str, stamp: Stamp, now: u64) {
        if stamp.time.saturating_add(WINDOW_MS) < now {
            return;
        }
        self.sweep(now);
        let heard = self
            .heard
            .entry((stamp.node, Box::from(topic)))
            .or_insert(Heard {
                count: stamp.count,
                at: now,
            });
        if stamp.count >= heard.count {
            *heard = Heard {
                count: stamp.count,
                at: now,
            };
        }
    }

    /// Forgets pairs not heard from for longer than a message stays good
    /// (any replay of theirs is refused for its age), now and then; and
    /// past [`MAX_PAIRS`], half of them, those heard from longest ago.
    fn sweep(&mut self, now: u64) {
        let horizon = WINDOW_MS + 2 * SKEW_MS;
        if now.saturating_sub(self.swept) >= horizon / 4 {
            self.swept = now;
            self.heard
                .retain(|_, heard| now.saturating_sub(heard.at) <= horizon);
        }
        if self.heard.len() >= MAX_PAIRS {
            let mut ages: Vec<u64> = self.heard.values().map(|heard| heard.at).collect();
            let middle = ages.len() / 2;
            let (_, &mut cut, _) = ages.select_nth_unstable(middle);
            self.heard.retain(|_, heard| heard.at > cut);
            tracing::warn!(
                kept = self.heard.len(),
                "over a million (node, topic) pairs heard from in two minutes: \
                 the oldest forgotten early, and their replays within the window not caught"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn stamp(node: u8, count: u64, time: u64) -> Stamp {
        Stamp {
            node: [node; 16],
            count,
            time,
        }
    }

    #[test]
    fn a_count_is_taken_once_per_node_and_topic() {
        let mut replays = Replays::new(NOW - 1000);
        assert_eq!(replays.check("t", stamp(1, 5, NOW), NOW), Ok(()));
        assert!(replays.check("t", stamp(1, 5, NOW), NOW).is_err(), "again");
        assert!(replays.check("t", stamp(1, 4, NOW), NOW).is_err(), "older");
        assert_eq!(
            replays.check("t", stamp(1, 7, NOW), NOW),
            Ok(()),
            "a gap is fine"
        );
        assert_eq!(
            replays.check("u", stamp(1, 6, NOW), NOW),
            Ok(()),
            "another topic"
        );
        assert_eq!(
            replays.check("t", stamp(2, 1, NOW), NOW),
            Ok(()),
            "another node"
        );
    }

    #[test]
    fn stale_future_and_pre_start_messages_are_refused() {
        let mut replays = Replays::new(NOW);
        assert!(
            replays
                .check("t", stamp(1, 1, NOW - WINDOW_MS - 1), NOW + 10)
                .is_err()
        );
        assert!(
            replays
                .check("t", stamp(1, 2, NOW + SKEW_MS + 1), NOW)
                .is_err()
        );
        assert!(
            replays
                .check("t", stamp(1, 3, NOW - SKEW_MS - 1), NOW)
                .is_err(),
            "before start"
        );
        assert_eq!(
            replays.check("t", stamp(1, 4, NOW - SKEW_MS), NOW),
            Ok(()),
            "within skew"
        );
    }

    #[test]
    fn what_a_stream_read_took_is_not_taken_again_live() {
        let mut replays = Replays::new(NOW);
        replays.note("t", stamp(1, 20, NOW), NOW);
        assert!(replays.check("t", stamp(1, 20, NOW), NOW).is_err());
        // A lower count noted later changes nothing.
        replays.note("t", stamp(1, 3, NOW), NOW);
        assert!(replays.check("t", stamp(1, 19, NOW), NOW).is_err());
        assert_eq!(replays.check("t", stamp(1, 21, NOW), NOW), Ok(()));
        // Too old to remember: not noted.
        replays.note("u", stamp(1, 5, NOW - WINDOW_MS - 1), NOW);
        assert!(!replays.heard.contains_key(&([1; 16], Box::from("u"))));
    }

    #[test]
    fn what_is_forgotten_is_too_old_to_replay() {
        let mut replays = Replays::new(NOW);
        assert_eq!(replays.check("t", stamp(1, 5, NOW), NOW), Ok(()));
        // Long after: the pair is forgotten, and a replay refused by age.
        let later = NOW + WINDOW_MS + 3 * SKEW_MS;
        assert_eq!(replays.check("u", stamp(2, 1, later), later), Ok(()));
        assert_eq!(replays.heard.len(), 1, "the old pair forgotten");
        assert!(replays.check("t", stamp(1, 5, NOW), later).is_err());
    }
}
