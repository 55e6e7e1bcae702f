//! A message from Redis delivered here, if it passes every check: another
//! node's publish of a topic without history, or any node's (this one's
//! too) recorded one, at its position, with a gap before it read from the
//! topic's stream first.

use std::sync::atomic::Ordering;

use super::Run;
use crate::proto::OpCode;
use crate::pubsub::redis::link::Commands;
use crate::pubsub::redis::streams::Scripts;
use crate::pubsub::redis::wire;
use crate::pubsub::relay::Placed;
use crate::pubsub::{Position, Published};

impl Run {
    /// Publishes a message from Redis to this node's subscribers, if it
    /// passes every check (see "Redis is not trusted" in
    /// `docs/delivery.md`): another node's publish of a topic without
    /// history, or any node's (this one's too) recorded one, at its
    /// position.
    pub(super) async fn deliver(
        &mut self,
        commands: &mut Commands,
        scripts: &Scripts,
        channel: &str,
        bytes: &[u8],
    ) {
        let Some(topic) = self.shared.topic_of(channel) else {
            return;
        };
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let refused = |why: &str| {
            tracing::debug!(channel, why, "a message from Redis refused");
            shared.refused.fetch_add(1, Ordering::Relaxed);
        };
        // A recorded message is its node's message behind a position.
        let (position, bytes) = match wire::recorded(bytes) {
            Some((position, inner)) => (Some(position), inner),
            None => (None, bytes),
        };
        if bytes.len() > settings.max_message_size + wire::HEADER + wire::TAG {
            return refused("longer than the node's message size limit");
        }
        let Some(decoded) = wire::decode(bytes, channel, settings.secret.as_deref()) else {
            return refused("not a bridge message, or its MAC does not match");
        };
        let own = decoded.stamp.node == self.shared.node;
        if own && position.is_none() {
            // Our own publish, back from Redis: delivered already.
            return;
        }
        if decoded.payload.len() > settings.max_message_size {
            return refused("longer than the node's message size limit");
        }
        if decoded.opcode == OpCode::Text && crate::proto::validate_utf8(decoded.payload).is_err() {
            return refused("text that is not UTF-8");
        }
        if settings.secret.is_some()
            && let Err(why) = self
                .shared
                .replays()
                .check(topic, decoded.stamp, wire::unix_millis())
        {
            return refused(why);
        }
        let Some(pubsub) = self.pubsub() else {
            return;
        };
        let Some(position) = position else {
            self.shared.received.fetch_add(1, Ordering::Relaxed);
            pubsub.publish_relayed(topic, decoded.key, decoded.opcode, decoded.payload);
            return;
        };
        let waiter = if own {
            // Older ones of ours that never came back will not now.
            let newer = self.waiting.split_off(&decoded.stamp.count);
            for (_, lost) in std::mem::replace(&mut self.waiting, newer) {
                lost.give_up();
            }
            self.waiting.remove(&decoded.stamp.count)
        } else {
            self.shared.received.fetch_add(1, Ordering::Relaxed);
            None
        };
        let except = waiter.as_ref().and_then(|w| w.except.as_ref());
        let (key, opcode, payload) = (decoded.key, decoded.opcode, decoded.payload);
        let mut placed = pubsub.publish_at(topic, position, (key, opcode, payload), except, false);
        if let Placed::Missing { after } = placed {
            // What was missed, from the stream: after `after`, before this.
            let count = usize::try_from(position.offset - after - 1).unwrap_or(usize::MAX);
            let since = Position {
                epoch: position.epoch,
                offset: after,
            };
            let read = (since, Some(position.offset), count);
            self.read_into(commands, scripts, &pubsub, topic, read)
                .await;
            placed = pubsub.publish_at(topic, position, (key, opcode, payload), except, true);
        }
        let published = match placed {
            Placed::Delivered(published) => published,
            Placed::Duplicate | Placed::Missing { .. } => Published {
                subscribers: 0,
                position: Some(position),
            },
        };
        if let Some(reply) = waiter.and_then(|w| w.reply) {
            reply(published);
        }
    }
}
