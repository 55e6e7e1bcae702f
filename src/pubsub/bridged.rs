//! What the Redis bridge calls on a `PubSub`: its own publishes handed to
//! the relay, and publications from other nodes delivered here, either
//! relayed (numbered here) or numbered in Redis (delivered in offset
//! order, duplicates and gaps found), history loaded from Redis, and what
//! this node's history lacks to answer a resume as Redis's would.

use std::sync::Arc;
use std::time::Instant;

use super::registry::Numbering;
use super::relay::{Loaded, Outbound, Placed, Relay, Relayed, Reply};
use super::{
    Epoch, Position, PubSub, Publication, PublishOptions, Published, Start, busy, check_topic,
};
use crate::connection::conn::Conn;
use crate::proto::OpCode;

impl PubSub {
    /// Hands a publish of this node to the relay, if there is one (the
    /// topic's history looked up only then: a node without a bridge pays
    /// nothing here).
    pub(super) fn relay(
        &self,
        topic: &str,
        options: &PublishOptions<'_>,
        (opcode, payload): (OpCode, &[u8]),
        reply: Option<Reply>,
    ) -> Relayed {
        if check_topic(topic).is_err() {
            return Relayed::Sent; // nobody can be subscribed to it, anywhere
        }
        let relay = self.inner.relay.read().unwrap_or_else(|p| p.into_inner());
        match relay.as_ref() {
            Some(relay) => relay.relay(Outbound {
                topic,
                key: options.key,
                opcode,
                payload,
                history: self.inner.config.history_of(topic),
                except: options.except,
                reply,
            }),
            None => Relayed::Sent,
        }
    }

    /// Sets where this node's publishes also go, unless something is set
    /// already (false then).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn set_relay_if_none(&self, relay: Arc<dyn Relay>) -> bool {
        let mut slot = self.inner.relay.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(relay);
        true
    }

    /// Clears where this node's publishes also go, if it is `relay`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn clear_relay_if(&self, relay: &Arc<dyn Relay>) {
        let mut slot = self.inner.relay.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|set| Arc::ptr_eq(set, relay)) {
            *slot = None;
        }
    }

    /// Publishes a message that came from another node: to this node's
    /// subscribers only, never relayed again.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) fn publish_relayed(
        &self,
        topic: &str,
        key: Option<&str>,
        opcode: OpCode,
        payload: &[u8],
    ) -> Published {
        let options = PublishOptions {
            key,
            ..PublishOptions::default()
        };
        self.publish_frame(topic, options, opcode, payload, false)
    }

    /// Delivers a publication numbered elsewhere (Redis), at `position`,
    /// to this node's subscribers, in offset order: one this node has
    /// delivered already is a duplicate, one after a gap is refused
    /// unless `over_gap` (then every subscriber is told of the gap). A
    /// new epoch restarts the topic's numbering here (its subscribers told
    /// of the gap if it had one from Redis before).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn publish_at(
        &self,
        topic: &str,
        position: Position,
        (key, opcode, payload): (Option<&str>, OpCode, &[u8]),
        except: Option<&Conn>,
        over_gap: bool,
    ) -> Placed {
        let inner = &*self.inner;
        let history = inner.config.history_of(topic);
        let options = PublishOptions {
            key,
            except,
            datagram: false,
        };
        if check_topic(topic).is_err() || !history.is_on() {
            // Not kept here: numbered here, like a relayed publish.
            return Placed::Delivered(self.publish_frame(topic, options, opcode, payload, false));
        }
        let placed = loop {
            let Some(entry) = inner.registry.open(topic, history) else {
                // No room for the topic here: nobody can be subscribed to it.
                break Placed::Delivered(Published {
                    subscribers: 0,
                    position: None,
                });
            };
            let _busy = busy::Busy::enter();
            let mut state = entry.lock();
            if state.gone {
                continue;
            }
            match state.numbering {
                Numbering::Here => state.renumber(&entry.name, position, false),
                Numbering::Lost => state.renumber(&entry.name, position, true),
                Numbering::Redis if state.epoch != position.epoch => {
                    state.renumber(&entry.name, position, true);
                }
                Numbering::Redis if position.offset <= state.last => return Placed::Duplicate,
                Numbering::Redis if position.offset > state.last + 1 => {
                    if !over_gap {
                        return Placed::Missing { after: state.last };
                    }
                    state.renumber(&entry.name, position, true);
                }
                Numbering::Redis => {}
            }
            let published = self.publish_locked(&entry, &mut state, options, opcode, payload);
            break Placed::Delivered(published);
        };
        inner.shed_history();
        placed
    }

    /// Takes what Redis keeps of `topic` (its `epoch`, its `last` offset,
    /// and its latest publications, oldest first) into this node's
    /// history: all of it if this node did not follow Redis's numbering
    /// yet, else only what is older than what it keeps. Nothing is
    /// delivered: subscribing afterwards replays from it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn load(&self, topic: &str, epoch: Epoch, last: u64, loaded: Vec<Loaded>) {
        let inner = &*self.inner;
        let history = inner.config.history_of(topic);
        if check_topic(topic).is_err() || !history.is_on() {
            return;
        }
        let Some(entry) = inner.registry.open(topic, history) else {
            return; // no room for the topic: subscribers resume not recovered
        };
        // Looked at and changed under one guard: a topic let go between
        // two (the sweeper forgets an empty one) would take it with it.
        let mut state = entry.lock();
        if state.gone {
            drop(state);
            return self.load(topic, epoch, last, loaded); // made again
        }
        match state.numbering {
            Numbering::Redis if state.epoch == epoch => {}
            numbering => {
                let tell = numbering != Numbering::Here;
                state.renumber(
                    &entry.name,
                    Position {
                        epoch,
                        offset: last + 1,
                    },
                    tell,
                );
                state.last = last;
            }
        }
        let now = Instant::now();
        let publications = loaded
            .into_iter()
            .filter(|l| l.offset <= state.last)
            .map(|l| {
                let position = Position {
                    epoch,
                    offset: l.offset,
                };
                Arc::new(Publication::new(
                    entry.name.clone(),
                    position,
                    l.key.as_deref(),
                    l.opcode,
                    &l.payload,
                    l.at,
                ))
            })
            .collect();
        let last = state.last;
        if let Some(log) = &mut state.log {
            log.prepend(publications, last, now);
        }
        drop(state);
        inner.shed_history();
    }

    /// What this node's history of `topic` lacks to answer `start` as
    /// Redis's would: the publications after the first offset and before
    /// the second (`None`: up to the latest); `None` if it lacks nothing
    /// (it follows Redis's numbering and holds what follows the position,
    /// or, for the latest, has one).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn missing(&self, topic: &str, start: Start) -> Option<(u64, Option<u64>)> {
        let after = match start {
            Start::Now => return None,
            Start::Latest => 0,
            Start::After(seen) => seen.offset,
        };
        let Some(entry) = self.inner.registry.find(topic) else {
            return Some((after, None));
        };
        let state = entry.lock();
        if state.gone || state.numbering != Numbering::Redis {
            return Some((after, None));
        }
        let log = state.log.as_ref()?;
        let first = log.first().unwrap_or(state.last + 1);
        let covered = match start {
            Start::Now => true,
            Start::Latest => state.last == 0 || !log.is_empty(),
            Start::After(seen) => {
                seen.epoch != state.epoch || seen.offset >= state.last || first <= seen.offset + 1
            }
        };
        (!covered).then_some((after, Some(first)))
    }

    /// Whether a subscribe to `topic` would find it, or room for it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has_room_for(&self, topic: &str) -> bool {
        self.inner.registry.has_room_for(topic)
    }

    /// The topics with subscribers here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn occupied(&self) -> Vec<Arc<str>> {
        self.inner.registry.occupied()
    }

    /// Whether this node takes `topic`'s numbering from Redis now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn is_numbered_by_redis(&self, topic: &str) -> bool {
        self.inner
            .registry
            .find(topic)
            .is_some_and(|entry| entry.lock().numbering == Numbering::Redis)
    }

    /// The topics whose numbering this node takes from Redis, and their
    /// latest offsets here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn numbered_by_redis(&self) -> Vec<(Arc<str>, Position)> {
        self.inner.registry.numbered_by_redis()
    }
}
