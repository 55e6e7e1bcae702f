//! A bus's topics as data, for a deploy that keeps every connection (the
//! handoff, feature `handoff` of the tokio server): each topic's epoch,
//! latest offset, who numbers it, and the publications it keeps, so that
//! the successor numbers on where the predecessor stopped and a
//! subscriber that moves resumes from the kept publications exactly once
//! ([`Subscribe::after_handoff`]).
//!
//! ```text
//! topics = version:u8 count:u32 topic*
//! topic  = name:bytes epoch:u64 last:u64 numbering:u8 count:u32 kept*
//! kept   = offset:u64 keyed:bool [key:bytes] text:bool payload:bytes age_ms:u64
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use rapidws_core::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

use super::registry::Numbering;
use super::{Epoch, Position, PubSub, Publication, check_topic};
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
    /// (within this bus's own [`History`](super::History) for it). Call
    /// before anything subscribes or publishes here. Every field is
    /// checked (topic names as [`check_topic`] wants them, offsets
    /// consecutive and ending at the topic's latest); returns how many
    /// topics it took.
    pub fn take_over(&self, bytes: &[u8]) -> Result<usize, SnapshotError> {
        let mut from = SnapshotReader::new(bytes);
        let version = from.u8()?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        let count = from.u32()?;
        let mut taken = 0;
        for _ in 0..count {
            let mut topic = SnapshotReader::new(from.bytes()?);
            self.take_topic(&mut topic)?;
            topic.finish()?;
            taken += 1;
        }
        from.finish()?;
        Ok(taken)
    }

    fn take_topic(&self, from: &mut SnapshotReader<'_>) -> Result<(), SnapshotError> {
        let name =
            std::str::from_utf8(from.bytes()?).map_err(|_| SnapshotError::Invalid("topic name"))?;
        check_topic(name).map_err(|_| SnapshotError::Invalid("topic name"))?;
        let epoch = Epoch::from_u64(from.u64()?);
        let last = from.u64()?;
        let numbering = match from.u8()? {
            0 => Numbering::Here,
            1 => Numbering::Redis,
            2 => Numbering::Lost,
            _ => return Err(SnapshotError::Invalid("numbering")),
        };
        let name: Arc<str> = Arc::from(name);
        let now = Instant::now();
        let mut kept = Vec::new();
        for _ in 0..from.u32()? {
            let offset = from.u64()?;
            let key = if from.bool("keyed")? {
                let key = std::str::from_utf8(from.bytes()?)
                    .map_err(|_| SnapshotError::Invalid("key"))?;
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
        let consecutive = kept
            .windows(2)
            .all(|w| w[0].position().offset + 1 == w[1].position().offset);
        if !consecutive || kept.last().is_some_and(|p| p.position().offset != last) {
            return Err(SnapshotError::Invalid("kept publications"));
        }
        let history = self.inner.config.history_of(&name);
        let entry = loop {
            let entry = self.inner.registry.open(&name, history);
            if !entry.lock().gone {
                break entry;
            }
        };
        let mut state = entry.lock();
        state.epoch = epoch;
        state.last = last;
        state.numbering = numbering;
        if let Some(log) = &mut state.log {
            log.clear();
            log.prepend(kept, last, now);
        }
        Ok(())
    }
}
