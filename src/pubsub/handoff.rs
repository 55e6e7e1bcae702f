//! A bus's topics as data, for a deploy that keeps every connection (the
//! handoff, feature `handoff` of the tokio server): each topic's epoch,
//! latest offset, who numbers it, and the publications it keeps, so that
//! the successor numbers on where the predecessor stopped and a
//! subscriber that moves resumes from the kept publications exactly once
//! ([`Subscribe::after_handoff`](super::Subscribe::after_handoff)).
//!
//! ```text
//! topics = version:u8 count:u32 topic*
//! topic  = name:bytes epoch:u64 last:u64 numbering:u8 count:u32 kept*
//! kept   = offset:u64 keyed:bool [key:bytes] text:bool payload:bytes age_ms:u64
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use rapidws_core::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

use super::registry::{Numbering, Route};
use super::{Epoch, Position, PubSub, Publication, check_topic};
use crate::connection::conn::Conn;
use crate::proto::{MessageKind, OpCode};

const VERSION: u8 = 1;

impl PubSub {
    /// Every topic's numbering and kept publications as bytes, for the
    /// next process's [`PubSub::take_over`] (a server's
    /// `ServerHandler::hand_off_server` returns them). Take it once
    /// nothing publishes here any more (the handoff moves the requests
    /// being read first, and calls that hook after).
    pub fn hand_off(&self) -> Vec<u8> {
        let now = Instant::now();
        let topics = self.inner.registry.collect(|name, state| {
            let mut out = SnapshotWriter::new();
            out.bytes(name.as_bytes())
                .u64(state.epoch.as_u64())
                .u64(state.last)
                .u8(match state.numbering {
                    Numbering::Here => 0,
                    Numbering::Redis => 1,
                    Numbering::Lost => 2,
                });
            let kept: Vec<&Arc<Publication>> = state
                .log
                .as_ref()
                .map_or_else(Vec::new, |log| log.iter().collect());
            out.u32(kept.len() as u32);
            for publication in kept {
                out.u64(publication.position().offset)
                    .bool(publication.key().is_some());
                if let Some(key) = publication.key() {
                    out.bytes(key.as_bytes());
                }
                let age = now.saturating_duration_since(publication.at());
                out.bool(publication.kind() == MessageKind::Text)
                    .bytes(publication.payload())
                    .u64(age.as_millis() as u64);
            }
            Some(out.finish())
        });
        let mut out = SnapshotWriter::new();
        out.u8(VERSION).u32(topics.len() as u32);
        for topic in &topics {
            out.bytes(topic);
        }
        out.finish()
    }

    /// Takes the topics [`PubSub::hand_off`] made in the previous process:
    /// each numbers on from where it was, and keeps what it kept there
    /// (within this bus's own [`History`](super::History) for it), and is
    /// kept a minute even with nothing in it, for its subscribers on their
    /// way. Call before anything subscribes or
    /// publishes here. Every field is checked (topic names as
    /// [`check_topic`] wants them, offsets from 1, consecutive and ending at
    /// the topic's latest, far from overflowing); nothing is taken unless
    /// all of it reads. Returns how many topics it took: a topic this bus's
    /// budget for topics ([`Limits::topic_bytes`](super::Limits::topic_bytes))
    /// has no room for is not taken (logged), and its subscribers resume
    /// as not recovered.
    pub fn take_over(&self, bytes: &[u8]) -> Result<usize, SnapshotError> {
        let mut from = SnapshotReader::new(bytes);
        let version = from.u8()?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        let count = from.u32()?;
        let mut topics = Vec::new();
        for _ in 0..count {
            let mut topic = SnapshotReader::new(from.bytes()?);
            topics.push(read_topic(&mut topic)?);
            topic.finish()?;
        }
        from.finish()?;
        let offered = topics.len();
        let mut taken = 0;
        for topic in topics {
            taken += usize::from(self.take_topic(topic));
        }
        if taken < offered {
            let refused = offered - taken;
            tracing::warn!(
                refused,
                "topics not taken over: the topics' byte budget is full"
            );
        }
        self.inner.shed_history();
        Ok(taken)
    }

    /// Takes one topic; false if the topics' budget had no room for it.
    fn take_topic(&self, topic: TakenTopic) -> bool {
        let TakenTopic {
            name,
            epoch,
            last,
            numbering,
            kept,
        } = topic;
        let history = self.inner.config.history_of(&name);
        // Under one guard: a topic let go between a look and the change
        // (the sweeper forgets an empty one) would take the change along.
        loop {
            let Some(entry) = self.inner.registry.open(&name, history) else {
                return false;
            };
            let mut state = entry.lock();
            if state.gone {
                continue;
            }
            state.epoch = epoch;
            state.last = last;
            state.numbering = numbering;
            state.pinned_until = Some(Instant::now() + PINNED_FOR);
            if let Some(log) = &mut state.log {
                log.clear();
                log.prepend(kept, last, Instant::now());
            }
            return true;
        }
    }

    /// How far `conn`'s subscription to `topic` has been sent: the topic's
    /// latest position, or, for a conflating subscriber with publications
    /// waiting for room, the one before the first of them. What a
    /// subscriber moving to the next process resumes after
    /// ([`Subscribe::after_handoff`](super::Subscribe::after_handoff)). Exact
    /// when nothing is published meanwhile and the deliveries posted to the
    /// connection's loop have run, as in a handoff (`Handler::hand_off`);
    /// `None` if it is not subscribed.
    pub fn sent_up_to(&self, conn: &Conn, topic: &str) -> Option<Position> {
        let entry = self.inner.registry.find(topic)?;
        let state = entry.lock();
        let route = Route::of(conn);
        let local = state.locals.iter().find(|l| l.route.same(&route))?;
        let mut subscribers = local.lock();
        let subscriber = subscribers.find(conn.key())?;
        let waiting = subscriber
            .pending
            .as_ref()
            .and_then(|p| p.front())
            .map(|first| first.position().offset);
        Some(Position {
            epoch: state.epoch,
            offset: waiting.map_or(state.last, |first| first.saturating_sub(1)),
        })
    }

    /// Gives every topic numbered here a new epoch, numbering from 1 again, its history
    /// let go: after a handoff that failed once the successor had taken
    /// the topics (`ServerHandler::take_back_server`), so that what it
    /// numbered meanwhile is never taken for this bus's. Subscribers here
    /// go on with the next publication; a subscriber that resumes from
    /// where the old epoch ended (one the handoff gave back) missed
    /// nothing, any other position from before (or from the successor)
    /// resumes as not recovered.
    pub fn renumber(&self) {
        // Topics forgotten here meanwhile too: none is made again in an
        // epoch the successor numbered in.
        self.inner.registry.move_on_all();
        let topics = self.inner.registry.collect(|name, _| Some(name.clone()));
        for name in topics {
            let Some(entry) = self.inner.registry.find(&name) else {
                continue;
            };
            let mut state = entry.lock();
            // Redis numbers those, the same on every node.
            if state.gone || state.numbering == Numbering::Redis {
                continue;
            }
            let ended = Position {
                epoch: state.epoch,
                offset: state.last,
            };
            let fresh = Position {
                epoch: Epoch::new(),
                offset: 1,
            };
            state.renumber(&name, fresh, false);
            state.numbering = Numbering::Here;
            state.renumbered_from = Some(ended);
        }
    }
}

/// A topic read from a predecessor's bytes, not applied yet.
struct TakenTopic {
    name: Arc<str>,
    epoch: Epoch,
    last: u64,
    numbering: Numbering,
    kept: Vec<Arc<Publication>>,
}

/// How long a topic taken over is kept with nothing in it.
const PINNED_FOR: Duration = Duration::from_secs(60);

/// The most a topic's latest offset may be: far from where adding one
/// would overflow.
const MAX_OFFSET: u64 = u64::MAX / 2;

fn read_topic(from: &mut SnapshotReader<'_>) -> Result<TakenTopic, SnapshotError> {
    let name =
        std::str::from_utf8(from.bytes()?).map_err(|_| SnapshotError::Invalid("topic name"))?;
    check_topic(name).map_err(|_| SnapshotError::Invalid("topic name"))?;
    let epoch = Epoch::from_u64(from.u64()?);
    let last = from.u64()?;
    if last > MAX_OFFSET {
        return Err(SnapshotError::Invalid("latest offset"));
    }
    let numbering = match from.u8()? {
        0 => Numbering::Here,
        1 => Numbering::Redis,
        2 => Numbering::Lost,
        _ => return Err(SnapshotError::Invalid("numbering")),
    };
    let name: Arc<str> = Arc::from(name);
    let now = Instant::now();
    let mut kept: Vec<Arc<Publication>> = Vec::new();
    for _ in 0..from.u32()? {
        let offset = from.u64()?;
        let expected = kept.last().map(|p| p.position().offset + 1);
        if offset == 0 || offset > last || expected.is_some_and(|next| next != offset) {
            return Err(SnapshotError::Invalid("kept publications"));
        }
        let key = if from.bool("keyed")? {
            let key =
                std::str::from_utf8(from.bytes()?).map_err(|_| SnapshotError::Invalid("key"))?;
            Some(key.to_owned())
        } else {
            None
        };
        let opcode = if from.bool("text")? {
            OpCode::Text
        } else {
            OpCode::Binary
        };
        let payload = from.bytes()?;
        if opcode == OpCode::Text && std::str::from_utf8(payload).is_err() {
            return Err(SnapshotError::Invalid("text payload"));
        }
        let age = Duration::from_millis(from.u64()?);
        let at = now.checked_sub(age).unwrap_or(now);
        let position = Position { epoch, offset };
        kept.push(Arc::new(Publication::new(
            name.clone(),
            position,
            key.as_deref(),
            opcode,
            payload,
            at,
        )));
    }
    if kept.last().is_some_and(|p| p.position().offset != last) {
        return Err(SnapshotError::Invalid("kept publications"));
    }
    Ok(TakenTopic {
        name,
        epoch,
        last,
        numbering,
        kept,
    })
}
