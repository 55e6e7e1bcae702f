//! Positions and history: where a publication sits in its topic, and the
//! last ones kept to replay to a subscriber that comes back.
//!
//! A topic's publications are numbered 1, 2, 3... in publish order (the
//! *offset*) within one *epoch*: a name for one unbroken history of the
//! topic. When that history is lost (the topic had neither subscribers
//! nor kept publications and was forgotten after publishing, or the node
//! restarted) the next one starts with a new epoch and offset 1, so a
//! position from before can never be taken for one after. A topic with
//! history forgotten before its first publication lost nothing: it comes
//! back in the epoch it had, unless something could have been missed
//! meanwhile (see the registry's first epochs).

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::str::FromStr;
use std::time::Duration;

/// One unbroken history of a topic (see the module docs). Shown as 16
/// lowercase hex digits, and parsed back from them; its `Debug` shows the
/// same digits (`Epoch(00000000000000ab)`), so a logged [`Position`]
/// shows its epoch as clients see it on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Epoch(u64);

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Epoch({self})")
    }
}

impl Epoch {
    /// A new epoch, unlike any other with overwhelming likelihood.
    pub(crate) fn new() -> Epoch {
        // The standard library's per-process random keys, and a count so
        // that two epochs made in one process never collide.
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Epoch(RandomState::new().hash_one(n))
    }

    /// The epoch as a number (what [`Epoch::from_u64`] takes back).
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// The epoch named by `n` (from [`Epoch::as_u64`], or a store's).
    pub const fn from_u64(n: u64) -> Epoch {
        Epoch(n)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Why a position or an epoch could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePositionError(&'static str);

impl fmt::Display for ParsePositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ParsePositionError {}

impl FromStr for Epoch {
    type Err = ParsePositionError;

    fn from_str(text: &str) -> Result<Epoch, ParsePositionError> {
        if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParsePositionError("an epoch is 1 to 16 hex digits"));
        }
        u64::from_str_radix(text, 16)
            .map(Epoch)
            .map_err(|_| ParsePositionError("an epoch is 1 to 16 hex digits"))
    }
}

/// Where a publication sits in its topic: its epoch, and its offset in it
/// (1 for the epoch's first publication). A subscriber that has seen up to
/// a position resumes after it ([`Start::After`]).
///
/// Shown and parsed as `<epoch>:<offset>`.
///
/// [`Start::After`]: super::Start::After
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    /// The topic's history this offset belongs to.
    pub epoch: Epoch,
    /// The publication's number in that history, from 1; 0 names the
    /// point before the first.
    pub offset: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.epoch, self.offset)
    }
}

impl FromStr for Position {
    type Err = ParsePositionError;

    fn from_str(text: &str) -> Result<Position, ParsePositionError> {
        let (epoch, offset) = text
            .split_once(':')
            .ok_or(ParsePositionError("a position is <epoch>:<offset>"))?;
        let offset = offset
            .parse()
            .map_err(|_| ParsePositionError("an offset is a number from 0"))?;
        Ok(Position {
            epoch: epoch.parse()?,
            offset,
        })
    }
}

/// How much of a topic's past is kept to replay: the last `max_messages`
/// publications, each for at most `max_age`. The default keeps none and
/// costs nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct History {
    max_messages: usize,
    max_age: Duration,
}

impl Default for History {
    fn default() -> History {
        History::OFF
    }
}

impl History {
    /// Nothing kept: a subscriber can resume only from the latest position
    /// (it missed nothing), never replay.
    pub const OFF: History = History {
        max_messages: 0,
        max_age: Duration::ZERO,
    };

    /// The last `max_messages` publications, each kept for at most
    /// `max_age` (so memory is bounded by the count and by the rate times
    /// the age). `max_messages` 1 is what "last value on subscribe" needs
    /// ([`Start::Latest`]).
    ///
    /// [`Start::Latest`]: super::Start::Latest
    pub fn new(max_messages: usize, max_age: Duration) -> History {
        if max_messages == 0 || max_age.is_zero() {
            return History::OFF;
        }
        History {
            max_messages,
            max_age,
        }
    }

    /// Whether anything is kept.
    pub fn is_on(&self) -> bool {
        self.max_messages > 0
    }

    /// The most publications kept per topic.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// The longest a publication is kept.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_print_and_parse() {
        let position = Position {
            epoch: Epoch::from_u64(0xab),
            offset: 42,
        };
        assert_eq!(position.to_string(), "00000000000000ab:42");
        assert_eq!("00000000000000ab:42".parse(), Ok(position));
        assert_eq!("ab:42".parse(), Ok(position));
        assert!("ab".parse::<Position>().is_err());
        assert!("xy:1".parse::<Position>().is_err());
        assert!("ab:-1".parse::<Position>().is_err());
        assert!("ab:".parse::<Position>().is_err());
        assert!("12345678901234567:1".parse::<Position>().is_err());
        assert_ne!(Epoch::new(), Epoch::new());
    }

    #[test]
    fn debug_shows_the_epoch_as_the_wire_does() {
        let position = Position {
            epoch: Epoch::from_u64(0xab),
            offset: 42,
        };
        assert_eq!(
            format!("{position:?}"),
            "Position { epoch: Epoch(00000000000000ab), offset: 42 }"
        );
    }

    #[test]
    fn off_is_off() {
        assert!(!History::default().is_on());
        assert!(!History::new(0, Duration::from_secs(1)).is_on());
        assert!(!History::new(5, Duration::ZERO).is_on());
        assert!(History::new(1, Duration::from_secs(1)).is_on());
    }
}
