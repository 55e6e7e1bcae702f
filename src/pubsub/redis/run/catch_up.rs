//! What a topic missed, read from its stream and delivered here in
//! order: every followed topic after a reconnect (topics published
//! unrecorded given a new epoch first), a gap in what was heard, a shard
//! subscribed again; and, for a subscriber about to resume here, the
//! history loaded without delivering it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::Value;

use super::{CATCH_UP, Run};
use crate::pubsub::redis::link::{self, Commands};
use crate::pubsub::redis::shared::Shared;
use crate::pubsub::redis::streams::{self, Check, Scripts};
use crate::pubsub::{History, Position, PubSub};

impl Run {
    /// After (re)connecting: topics published here unrecorded get a new
    /// epoch in Redis, and every topic this node follows gets what it
    /// missed meanwhile.
    pub(super) async fn recover(
        &mut self,
        commands: &mut Commands,
        scripts: &Scripts,
    ) -> redis::RedisResult<()> {
        let Some(pubsub) = self.pubsub() else {
            return Ok(());
        };
        let prefix = self.shared.settings.prefix.clone();
        self.reset_broken(commands, scripts).await?;
        let followed = pubsub.numbered_by_redis();
        for chunk in followed.chunks(CATCH_UP) {
            let mut pipe = link::pipe();
            for (topic, position) in chunk {
                let count = pubsub.history(topic).max_messages();
                streams::read(
                    &mut pipe,
                    scripts,
                    &prefix,
                    topic,
                    position.offset,
                    None,
                    count,
                );
            }
            let answers = commands.run(&pipe, self.shared.settings.timeout).await?;
            for ((topic, position), answer) in chunk.iter().zip(&answers) {
                match answer {
                    Ok(answer) => {
                        let take = pubsub.history(topic).max_messages();
                        self.catch_up(&pubsub, topic, (*position, take), answer);
                    }
                    Err(error) => tracing::debug!(%error, %topic, "not caught up"),
                }
            }
        }
        Ok(())
    }

    /// Gives every topic published here unrecorded a new epoch in Redis.
    pub(super) async fn reset_broken(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
    ) -> redis::RedisResult<()> {
        let Some(pubsub) = self.pubsub() else {
            return Ok(());
        };
        let prefix = &self.shared.settings.prefix;
        let broken = std::mem::take(&mut *self.shared.broken());
        for chunk in broken.chunks(CATCH_UP) {
            let mut pipe = link::pipe();
            for topic in chunk {
                streams::reset(&mut pipe, scripts, prefix, topic, pubsub.history(topic));
            }
            let answers = match commands.run(&pipe, self.shared.settings.timeout).await {
                Ok(answers) => answers,
                Err(error) => {
                    // Tried again on the next connection.
                    self.shared.broken().extend(broken);
                    return Err(error);
                }
            };
            // A shard that refused keeps its topics broken, for later.
            for (topic, answer) in chunk.iter().zip(answers) {
                if answer.is_err() {
                    self.shared.broken().push(topic.clone());
                }
            }
        }
        Ok(())
    }

    /// Delivers what `topic` missed after `position` here, from a read of
    /// its stream; a new epoch in Redis is taken as the topic's history
    /// now (its subscribers told of the gap).
    fn catch_up(
        &self,
        pubsub: &PubSub,
        topic: &str,
        (position, take): (Position, usize),
        answer: &Value,
    ) {
        let Some(read) = self.read_back(pubsub, topic, (position.offset, take), answer) else {
            return;
        };
        let Some(epoch) = read.epoch else {
            return; // Redis holds nothing of it: its next publish says more
        };
        self.shared.heard_in_stream(topic, &read.stamps);
        if epoch != position.epoch {
            pubsub.load(topic, epoch, read.last, read.loaded);
            return;
        }
        for loaded in read.loaded {
            let at = Position {
                epoch,
                offset: loaded.offset,
            };
            let payload = &loaded.payload;
            pubsub.publish_at(
                topic,
                at,
                (loaded.key.as_deref(), loaded.opcode, payload),
                None,
                true,
            );
            self.shared.filled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`streams::read_back`] with this node's checks, refusals counted.
    fn read_back(
        &self,
        pubsub: &PubSub,
        topic: &str,
        (after, take): (u64, usize),
        answer: &Value,
    ) -> Option<streams::Read> {
        let settings = &self.shared.settings;
        let channel = self.shared.channel(topic);
        let check = Check {
            after,
            take,
            channel: &channel,
            secret: settings.secret.as_deref(),
            max_message_size: settings.max_message_size,
            history: pubsub.history(topic),
        };
        let read = streams::read_back(answer, &check);
        let refused = read.as_ref().map_or(1, |read| read.refused);
        self.shared.refused.fetch_add(refused, Ordering::Relaxed);
        read
    }

    /// A cluster connection subscribed to `channel` again after losing
    /// its shard: delivers what was published on it meanwhile.
    pub(super) async fn resubscribed(
        &mut self,
        commands: &mut Commands,
        scripts: &Scripts,
        channel: &str,
    ) {
        let (Some(topic), Some(pubsub)) = (self.shared.topic_of(channel), self.pubsub()) else {
            return;
        };
        let Some(position) = pubsub.position(topic) else {
            return;
        };
        if pubsub.is_numbered_by_redis(topic) {
            let read = (position, None, usize::MAX);
            self.read_into(commands, scripts, &pubsub, topic, read)
                .await;
        }
    }

    /// Reads from `topic`'s stream what follows `since` (before the offset
    /// given, at most the count given and the history's count) and
    /// delivers it here, in order ([`Run::catch_up`]); on no answer in
    /// time, nothing (a gap that stays is told to its subscribers).
    pub(super) async fn read_into(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
        pubsub: &PubSub,
        topic: &str,
        (since, before, count): (Position, Option<u64>, usize),
    ) {
        let count = count.min(pubsub.history(topic).max_messages());
        let mut pipe = link::pipe();
        let prefix = &self.shared.settings.prefix;
        streams::read(
            &mut pipe,
            scripts,
            prefix,
            topic,
            since.offset,
            before,
            count,
        );
        let timeout = self.shared.settings.timeout;
        let answer = tokio::time::timeout(timeout, commands.run(&pipe, timeout)).await;
        if let Ok(Ok(answers)) = answer
            && let Some(Ok(answer)) = answers.first()
        {
            self.catch_up(pubsub, topic, (since, count), answer);
        }
    }
}

/// Reads what Redis keeps of `topic` after `after` (and before `before`,
/// at most `count`) into this node's history: for a subscriber about to
/// resume here. Errors leave the node's history as it was.
pub(in crate::pubsub::redis) async fn load(
    shared: &Arc<Shared>,
    pubsub: &PubSub,
    topic: &str,
    history: History,
    (after, before, count): (u64, Option<u64>, usize),
) {
    let commands = shared.commands();
    let Some((mut commands, scripts)) = commands else {
        return;
    };
    let settings = &shared.settings;
    let mut pipe = link::pipe();
    streams::read_or_open(
        &mut pipe,
        &scripts,
        &settings.prefix,
        (topic, history),
        after,
        before,
        count,
    );
    let answer = match commands.run(&pipe, settings.timeout).await {
        Ok(mut answers) if !answers.is_empty() => answers.swap_remove(0),
        Ok(_) => Err("no answer".to_owned()),
        Err(error) => Err(error.to_string()),
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(error) => {
            tracing::debug!(%error, topic, "history from Redis not read");
            return;
        }
    };
    let channel = shared.channel(topic);
    let check = Check {
        after,
        take: count,
        channel: &channel,
        secret: settings.secret.as_deref(),
        max_message_size: settings.max_message_size,
        history,
    };
    let Some(read) = streams::read_back(&answer, &check) else {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    shared.refused.fetch_add(read.refused, Ordering::Relaxed);
    shared.heard_in_stream(topic, &read.stamps);
    if let Some(epoch) = read.epoch {
        pubsub.load(topic, epoch, read.last, read.loaded);
    }
}
