//! The publish: a topic's publication numbered, kept and handed to each
//! server loop that serves its subscribers (one job each, bounded), to
//! each connection with a task of its own, and to its WebTransport
//! sessions, all under the topic's lock, so that every subscriber gets a
//! topic's publications in the order of their offsets.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::meters;
use super::registry::{Numbering, Route, Topic, TopicState};
use super::relay::{Relayed, Reply};
use super::{Epoch, Position, PubSub, Publication, PublishOptions, Published, busy, check_topic};
use crate::connection::conn::{Conn, SendError};
use crate::proto::{Message, MessageKind, OpCode};

impl PubSub {
    /// Publishes `message` to every subscriber of `topic`, from anywhere (a
    /// callback, another task, another thread): see [`Published`]. A
    /// topic's subscribers get its publications in one order, the order
    /// of their offsets (so a publisher's own are in the order it
    /// published them).
    pub fn publish(&self, topic: &str, message: Message<'_>) -> Published {
        self.publish_with(topic, message, PublishOptions::new())
    }

    /// [`PubSub::publish`] to everyone but `except` (typically the sender).
    pub fn publish_except(&self, topic: &str, message: Message<'_>, except: &Conn) -> Published {
        self.publish_with(topic, message, PublishOptions::new().except(except))
    }

    /// [`PubSub::publish`] with a key, or to everyone but one connection:
    /// see [`PublishOptions`].
    pub fn publish_with(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Published {
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        self.publish_through(topic, message, options, None)
            .unwrap_or(nobody)
    }

    /// [`PubSub::publish_with`], and `None` if the relay took it to be
    /// numbered elsewhere (then `reply` is told what it did here, later).
    pub(crate) fn publish_through(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
        reply: Option<Reply>,
    ) -> Option<Published> {
        let opcode = data_opcode(message.kind());
        let payload = message.as_bytes();
        let relayed = self.relay(topic, &options, (opcode, payload), reply);
        let unrecorded = match relayed {
            Relayed::Recorded => return None,
            Relayed::Sent => false,
            Relayed::Unrecorded => true,
        };
        Some(self.publish_frame(topic, options, opcode, payload, unrecorded))
    }

    /// [`PubSub::publish`] for a payload given as bytes: text is checked
    /// for UTF-8 ([`SendError::InvalidUtf8`] if it is not).
    pub fn publish_bytes(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
    ) -> Result<Published, SendError> {
        let message = match kind {
            MessageKind::Text => {
                Message::Text(std::str::from_utf8(payload).map_err(|_| SendError::InvalidUtf8)?)
            }
            MessageKind::Binary => Message::Binary(payload),
        };
        Ok(self.publish(topic, message))
    }

    pub(super) fn publish_frame(
        &self,
        topic: &str,
        options: PublishOptions<'_>,
        opcode: OpCode,
        payload: &[u8],
        unrecorded: bool,
    ) -> Published {
        let inner = &*self.inner;
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        if check_topic(topic).is_err() {
            return nobody;
        }
        let history = inner.config.history_of(topic);
        loop {
            let found = if history.is_on() {
                inner.registry.open(topic, history)
            } else {
                inner.registry.find(topic)
            };
            // No subscribers, and (with history) no room to keep it.
            let Some(entry) = found else {
                return nobody;
            };
            let _busy = busy::Busy::enter();
            let mut state = entry.lock();
            if state.gone {
                if history.is_on() {
                    continue; // forgotten meanwhile: made again
                }
                return nobody; // its last subscriber left meanwhile
            }
            if unrecorded && state.numbering == Numbering::Redis {
                // Redis's history of it misses this one from here on: an
                // epoch of this node's own until Redis numbers it again.
                state.numbering = Numbering::Lost;
                state.epoch = Epoch::new();
                if let Some(log) = &mut state.log {
                    log.clear();
                }
            }
            let published = self.publish_locked(&entry, &mut state, options, opcode, payload);
            drop(state);
            if history.is_on() {
                inner.shed_history();
            }
            return published;
        }
    }

    /// Numbers the publication, keeps it, and hands it to every route,
    /// under the topic's lock (so that every subscriber gets a topic's
    /// publications in the order of their offsets).
    pub(super) fn publish_locked(
        &self,
        entry: &Topic,
        state: &mut TopicState,
        options: PublishOptions<'_>,
        opcode: OpCode,
        payload: &[u8],
    ) -> Published {
        let inner = &self.inner;
        let PublishOptions { key, except, .. } = options;
        let sampled = meters::sample();
        state.last += 1;
        let position = Position {
            epoch: state.epoch,
            offset: state.last,
        };
        let now = match state.log {
            Some(_) => Instant::now(),
            None => epoch_start(),
        };
        let publication = Arc::new(
            Publication::new(entry.name.clone(), position, key, opcode, payload, now)
                .timed(sampled),
        );
        if let Some(log) = &mut state.log {
            log.push(publication.clone(), now);
        }
        let mut reached = state.subscribers();
        if reached == 0 {
            return Published {
                subscribers: 0,
                position: Some(position),
            };
        }
        // The sender's key, and its route if it is among the subscribers.
        let mut sender_route = None;
        let except = except.map(|conn| {
            let route = Route::of(conn);
            if state.contains(&route, conn.key()) {
                reached -= 1;
                sender_route = Some(route);
            }
            conn.key()
        });
        if reached > 0 {
            inner.published.fetch_add(1, Ordering::Relaxed);
            inner.meters.published();
        }
        let bytes = publication.plain().frame().len();
        for local in &state.locals {
            match &local.route {
                Route::Loop(list) => {
                    // Counted now, without the lock a delivery may hold:
                    // the publisher never waits.
                    let sender_here = sender_route.as_ref().is_some_and(|r| r.same(&local.route));
                    let missed = local.count().saturating_sub(usize::from(sender_here));
                    let (shared, local, publication) =
                        (inner.clone(), local.clone(), publication.clone());
                    let job = Box::new(move || shared.deliver(&local, &publication, except));
                    if !list.post(job, bytes) {
                        // The loop is far behind its publishers: its
                        // subscribers miss this message, as a full queue's would.
                        inner.dropped.fetch_add(missed as u64, Ordering::Relaxed);
                        inner.meters.loop_behind(missed as u64);
                    }
                }
                Route::Direct => inner.deliver(local, &publication, except),
            }
        }
        #[cfg(feature = "http3")]
        if !state.sessions.is_empty() {
            let handed = state
                .sessions
                .deliver(&entry.name, payload, options.datagram);
            inner
                .delivered
                .fetch_add(handed.delivered, Ordering::Relaxed);
            inner.dropped.fetch_add(handed.dropped, Ordering::Relaxed);
        }
        Published {
            subscribers: reached,
            position: Some(position),
        }
    }
}

/// A time to stamp publications that no history keeps (never read).
fn epoch_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn data_opcode(kind: MessageKind) -> OpCode {
    match kind {
        MessageKind::Text => OpCode::Text,
        MessageKind::Binary => OpCode::Binary,
    }
}
