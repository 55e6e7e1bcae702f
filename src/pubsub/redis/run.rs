//! The bridge's task: connects, relays both ways, numbers through Redis,
//! closes gaps from the streams, and reconnects.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use redis::Value;
use tokio::sync::mpsc;

use super::link::{self, Commands, Incoming, Messages, Target};
use super::shared::{Occupancy, Outgoing, Shared, escape_pattern};
use super::streams::{self, Check, Scripts};
use super::wire;
use crate::connection::conn::Conn;
use crate::proto::OpCode;
use crate::pubsub::{History, Inner, Placed, Position, PubSub, Published, Reply};

/// The most messages sent to Redis in one round trip.
const BATCH: usize = 256;

/// The most topics read in one round trip when catching up.
const CATCH_UP: usize = 256;

/// How often a connected bridge looks for topics published unrecorded.
const BROKEN_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a node writes its subscriber counts to Redis (each good for
/// three times as long: a node that died drops out of the totals within
/// that).
pub(super) const COUNTS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How often a cluster connection that lost a shard subscribes again to
/// every topic with subscribers here, until all succeed.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(1);

const MIN_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);

/// A recorded publish of this node that its sender waits for, or that
/// must leave one connection out: until it comes back from Redis.
struct Waiter {
    except: Option<Conn>,
    reply: Option<Reply>,
    /// Where Redis put it, once its script answered.
    position: Option<Position>,
}

impl Waiter {
    /// Tells the sender it was not delivered here (yet): its position if
    /// Redis gave one, and no subscribers.
    fn give_up(self) {
        if let Some(reply) = self.reply {
            reply(Published {
                subscribers: 0,
                position: self.position,
            });
        }
    }
}

pub(super) struct Run {
    shared: Arc<Shared>,
    /// Weak: a bridge left running does not keep a dropped `PubSub`.
    pubsub: Weak<Inner>,
    queue: mpsc::Receiver<Outgoing>,
    /// This node's recorded publishes on their way, by count.
    waiting: BTreeMap<u64, Waiter>,
    /// On a cluster: a shard was lost, so subscriptions may be missing.
    resync: bool,
}

impl Run {
    pub(super) fn new(
        shared: Arc<Shared>,
        pubsub: &PubSub,
        queue: mpsc::Receiver<Outgoing>,
    ) -> Run {
        Run {
            shared,
            pubsub: Arc::downgrade(&pubsub.inner),
            queue,
            waiting: BTreeMap::new(),
            resync: false,
        }
    }

    fn pubsub(&self) -> Option<PubSub> {
        self.pubsub.upgrade().map(|inner| PubSub { inner })
    }

    /// Connects, relays until the connection fails, waits, and again.
    pub(super) async fn forever(mut self) {
        let mut backoff = MIN_BACKOFF;
        let mut first = true;
        loop {
            let timeout = self.shared.settings.timeout;
            let connected = match tokio::time::timeout(timeout, self.connect()).await {
                Ok(connected) => connected,
                Err(_) => Err(timed_out(timeout)),
            };
            match connected {
                Ok((mut commands, scripts, messages)) => {
                    if !first {
                        self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    first = false;
                    backoff = MIN_BACKOFF;
                    self.shared
                        .set_commands(Some((commands.clone(), scripts.clone())));
                    tracing::info!("pub/sub bridge connected to Redis");
                    // Connected (publishes recorded again) once what was
                    // missed is recovered: a subscriber told so is.
                    let why = match self.recover(&mut commands, &scripts).await {
                        Ok(()) => {
                            self.shared.connected.store(true, Ordering::Relaxed);
                            self.relay(commands, scripts, messages).await
                        }
                        Err(error) => error.to_string(),
                    };
                    self.shared.connected.store(false, Ordering::Relaxed);
                    self.shared.set_commands(None);
                    for (_, waiter) in std::mem::take(&mut self.waiting) {
                        waiter.give_up();
                    }
                    if self.pubsub.strong_count() == 0 {
                        return;
                    }
                    tracing::warn!(%why, "pub/sub bridge lost Redis; reconnecting");
                }
                Err(error) => {
                    tracing::warn!(%error, ?backoff, "pub/sub bridge cannot reach Redis");
                }
            }
            // Local publishes meanwhile cannot reach Redis: counted lost
            // (or delivered here unrecorded), so that the queue holds
            // nothing stale when Redis is back.
            let wait = tokio::time::sleep(backoff);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    dropped = self.queue.recv() => match dropped {
                        Some(outgoing) => {
                            self.shared.queued_bytes.fetch_sub(outgoing.bytes, Ordering::Relaxed);
                            self.not_sent(vec![outgoing]);
                        }
                        None => return,
                    },
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn connect(&self) -> redis::RedisResult<(Commands, Scripts, Messages)> {
        let settings = &self.shared.settings;
        let timeout = settings.timeout;
        match &settings.target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let mut subscriber = client.get_async_pubsub().await?;
                subscriber
                    .psubscribe(format!("{}*", escape_pattern(&settings.prefix)))
                    .await?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout));
                let mut commands = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let scripts = Scripts::load(&mut commands).await?;
                let messages = Messages::Single(subscriber.into_on_message());
                Ok((Commands::Single(commands), scripts, messages))
            }
            Target::Cluster(nodes) => {
                let (pushed, pushes) = mpsc::channel(link::PUSHES);
                let shared = self.shared.clone();
                let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // A shard that is down fails fast: its topics are
                    // delivered here unrecorded, the others go on.
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .push_sender(move |push| {
                        let sent = pushed.try_send(push);
                        if sent.is_err() {
                            // Lost on the way in: a gap the next
                            // publication of its topic shows.
                            shared.dropped_in.fetch_add(1, Ordering::Relaxed);
                        }
                        sent
                    })
                    .build()?;
                let mut connection = client.get_async_connection().await?;
                // The topics with subscribers here, each on its shard.
                self.subscribe_occupied(&mut connection).await?;
                let messages = Messages::Cluster(pushes);
                Ok((
                    Commands::Cluster(connection),
                    Scripts::sent_whole(),
                    messages,
                ))
            }
        }
    }

    /// After (re)connecting: topics published here unrecorded get a new
    /// epoch in Redis, and every topic this node follows gets what it
    /// missed meanwhile.
    async fn recover(
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
    async fn reset_broken(
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

    /// Relays both ways until something fails; returns what.
    async fn relay(
        &mut self,
        mut commands: Commands,
        scripts: Scripts,
        mut messages: Messages,
    ) -> String {
        let mut batch = Vec::with_capacity(BATCH);
        // Publishes made unrecorded while this connection was being made.
        let mut check_broken = tokio::time::interval(BROKEN_CHECK);
        let mut resync = tokio::time::interval(RESYNC);
        let mut counts = tokio::time::interval(COUNTS_EVERY);
        loop {
            tokio::select! {
                _ = check_broken.tick() => {
                    let any = !self.shared.broken().is_empty();
                    if any && let Err(error) = self.reset_broken(&mut commands, &scripts).await {
                        return error.to_string();
                    }
                }
                taken = self.queue.recv_many(&mut batch, BATCH) => {
                    if taken == 0 {
                        return "the bridge was stopped".into();
                    }
                    if let Err(why) = self.send(&mut commands, &scripts, &mut batch).await {
                        return why;
                    }
                }
                () = self.shared.changed.notified() => {
                    let changes = std::mem::take(&mut *self.shared.changes());
                    self.follow(&mut commands, &changes).await;
                    let topics: Vec<String> = changes.into_iter().map(|(topic, _)| topic).collect();
                    if let Err(error) = self.write_counts(&mut commands, &scripts, &topics).await {
                        return error.to_string();
                    }
                }
                _ = counts.tick() => {
                    let topics: Vec<String> = self
                        .pubsub()
                        .map(|p| p.occupied().iter().map(|t| t.to_string()).collect())
                        .unwrap_or_default();
                    if let Err(error) = self.write_counts(&mut commands, &scripts, &topics).await {
                        return error.to_string();
                    }
                }
                incoming = messages.next() => match incoming {
                    None => return "the subscription ended".into(),
                    Some(Incoming::Message { channel, payload }) => {
                        self.deliver(&mut commands, &scripts, &channel, &payload).await;
                    }
                    Some(Incoming::Resubscribed(channel)) => {
                        self.resubscribed(&mut commands, &scripts, &channel).await;
                    }
                    Some(Incoming::ShardLost) => self.resync = true,
                },
                _ = resync.tick(), if self.resync => {
                    self.resync = !self.subscribe_all(&mut commands).await;
                }
            }
        }
    }

    /// Sends one batch in one round trip (each publish on its channel, each
    /// recorded one through the record script).
    async fn send(
        &mut self,
        commands: &mut Commands,
        scripts: &Scripts,
        batch: &mut Vec<Outgoing>,
    ) -> Result<(), String> {
        let prefix = &self.shared.settings.prefix;
        let publish = commands.publish();
        let secret = self.shared.settings.secret.as_deref();
        let mut pipe = link::pipe();
        for outgoing in batch.iter_mut() {
            let Outgoing {
                channel,
                message,
                record,
                sealed,
                ..
            } = outgoing;
            // Counted and signed in the order they leave.
            let count = self.shared.sent.fetch_add(1, Ordering::Relaxed) + 1;
            wire::seal(message, (count, wire::unix_millis()), channel, secret);
            *sealed = true;
            if let Some(record) = record {
                record.count = count;
            }
            match record {
                None => {
                    pipe.cmd(publish).arg(&*channel).arg(&*message);
                }
                Some(record) => {
                    streams::record(
                        &mut pipe,
                        scripts,
                        (prefix, publish),
                        (&record.topic, record.history),
                        channel,
                        message,
                    );
                    // Waiting before the round trip: its return from Redis
                    // may be read before the script's answer.
                    if record.except.is_some() || record.reply.is_some() {
                        let waiter = Waiter {
                            except: record.except.take(),
                            reply: record.reply.take(),
                            position: None,
                        };
                        self.waiting.insert(record.count, waiter);
                    }
                }
            }
        }
        let timeout = self.shared.settings.timeout;
        // On a cluster each command has its own bound; the batch's is for
        // a connection that stopped answering altogether.
        let sent = tokio::time::timeout(timeout * 2, commands.run(&pipe, timeout)).await;
        let bytes: usize = batch.iter().map(|o| o.bytes).sum();
        let answers = match sent {
            Ok(Ok(answers)) if answers.len() == batch.len() => answers,
            failed => {
                let why = match failed {
                    Ok(Ok(_)) => "Redis answered a batch with the wrong count".to_owned(),
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("Redis did not answer within {timeout:?}"),
                };
                self.shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                self.not_sent(std::mem::take(batch));
                return Err(why);
            }
        };
        self.shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        // On a cluster, a node hears only the topics it has subscribers
        // for: a waiter of a topic without any hears nothing back.
        let hearing = match commands {
            Commands::Cluster(_) => self.pubsub(),
            Commands::Single(_) => None,
        };
        for (outgoing, answer) in std::mem::take(batch).into_iter().zip(answers) {
            match (&outgoing.record, answer) {
                (None, Ok(_)) => {
                    self.shared.relayed.fetch_add(1, Ordering::Relaxed);
                }
                (None, Err(_)) => {
                    self.shared.lost.fetch_add(1, Ordering::Relaxed);
                }
                (Some(record), Ok(answer)) => {
                    self.shared.recorded.fetch_add(1, Ordering::Relaxed);
                    let Some(waiter) = self.waiting.get_mut(&record.count) else {
                        continue;
                    };
                    waiter.position = streams::recorded_at(&answer);
                    let unheard = matches!(commands, Commands::Cluster(_))
                        && hearing
                            .as_ref()
                            .is_none_or(|p| p.subscribers(&record.topic) == 0);
                    if unheard && let Some(waiter) = self.waiting.remove(&record.count) {
                        waiter.give_up();
                    }
                }
                (Some(_), Err(error)) => {
                    tracing::warn!(%error, "Redis refused to record a publication");
                    self.resync |= matches!(commands, Commands::Cluster(_));
                    self.not_sent(vec![outgoing]);
                }
            }
        }
        Ok(())
    }

    /// What was never handed to Redis: publishes of topics without history
    /// are lost (counted); recorded ones are delivered here now, unrecorded
    /// (see the module docs).
    /// (The caller has taken their bytes off the queue's count.)
    fn not_sent(&mut self, outgoing: Vec<Outgoing>) {
        let pubsub = self.pubsub();
        for Outgoing {
            channel,
            message,
            record,
            sealed,
            ..
        } in outgoing
        {
            let Some(mut record) = record else {
                self.shared.lost.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            self.shared.unrecorded(&record.topic);
            let waiter = self.waiting.remove(&record.count);
            let (except, reply) = match waiter {
                Some(waiter) => (waiter.except, waiter.reply),
                None => (record.except.take(), record.reply.take()),
            };
            let secret = self.shared.settings.secret.as_deref().filter(|_| sealed);
            let (Some(pubsub), Some(decoded)) = (&pubsub, wire::decode(&message, &channel, secret))
            else {
                continue;
            };
            if secret.is_some() {
                // Should Redis have taken it after all, it comes back as
                // a replay of what is delivered here now.
                let now = wire::unix_millis();
                let _ = self
                    .shared
                    .replays()
                    .check(&record.topic, decoded.stamp, now);
            }
            let mut options = crate::pubsub::PublishOptions::new();
            if let Some(key) = decoded.key {
                options = options.key(key);
            }
            if let Some(except) = &except {
                options = options.except(except);
            }
            let published = pubsub.publish_frame(
                &record.topic,
                options,
                decoded.opcode,
                decoded.payload,
                true,
            );
            if let Some(reply) = reply {
                reply(published);
            }
        }
    }

    /// Publishes a message from Redis to this node's subscribers, if it
    /// passes every check (see "Redis is not trusted"): another node's
    /// publish of a topic without history, or any node's (this one's too)
    /// recorded one, at its position.
    async fn deliver(
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

    /// On a cluster: subscribes to the topics that got their first
    /// subscriber here, and unsubscribes from those that lost their last.
    async fn follow(&mut self, commands: &mut Commands, changes: &[(String, bool)]) {
        let Commands::Cluster(connection) = commands else {
            return;
        };
        let timeout = self.shared.settings.timeout;
        for &(ref topic, occupied) in changes {
            let channel = self.shared.channel(topic);
            let done = if occupied {
                tokio::time::timeout(timeout, connection.ssubscribe(&channel)).await
            } else {
                tokio::time::timeout(timeout, connection.sunsubscribe(&channel)).await
            };
            if !matches!(done, Ok(Ok(()))) {
                // Its shard is away: tried again with every topic.
                self.resync = true;
            }
        }
    }

    /// Writes this node's subscriber counts of `topics` to Redis (0 takes
    /// the node out of a topic's total).
    async fn write_counts(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
        topics: &[String],
    ) -> redis::RedisResult<()> {
        let Some(pubsub) = self.pubsub() else {
            return Ok(());
        };
        let node = hex(&self.shared.node);
        let prefix = &self.shared.settings.prefix;
        for chunk in topics.chunks(CATCH_UP) {
            let mut pipe = link::pipe();
            for topic in chunk {
                let here = pubsub.subscribers(topic);
                streams::count(
                    &mut pipe,
                    scripts,
                    (prefix, &node),
                    topic,
                    here,
                    COUNTS_EVERY * 3,
                );
            }
            // A shard that refused: counted again on the next round.
            commands.run(&pipe, self.shared.settings.timeout).await?;
        }
        Ok(())
    }

    /// On a cluster: subscribes again to every topic with subscribers
    /// here (each answer's confirmation has the topic caught up); true if
    /// every one succeeded.
    async fn subscribe_all(&mut self, commands: &mut Commands) -> bool {
        match commands {
            Commands::Cluster(connection) => self.subscribe_occupied(connection).await.is_ok(),
            Commands::Single(_) => true,
        }
    }

    /// Subscribes `connection` to every topic with subscribers here, each
    /// on its shard and within the timeout; the last failure, if any (the
    /// others are still tried).
    async fn subscribe_occupied(
        &self,
        connection: &mut redis::cluster_async::ClusterConnection,
    ) -> redis::RedisResult<()> {
        let Some(pubsub) = self.pubsub() else {
            return Ok(());
        };
        let timeout = self.shared.settings.timeout;
        let mut outcome = Ok(());
        for topic in pubsub.occupied() {
            let channel = self.shared.channel(&topic);
            match tokio::time::timeout(timeout, connection.ssubscribe(&channel)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => outcome = Err(error),
                Err(_) => outcome = Err(timed_out(timeout)),
            }
        }
        outcome
    }

    /// A cluster connection subscribed to `channel` again after losing
    /// its shard: delivers what was published on it meanwhile.
    async fn resubscribed(&mut self, commands: &mut Commands, scripts: &Scripts, channel: &str) {
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
    async fn read_into(
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
pub(super) async fn load(
    shared: &Arc<Shared>,
    pubsub: &PubSub,
    topic: &str,
    history: History,
    (after, before, count): (u64, Option<u64>, usize),
) {
    let commands = shared
        .commands
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let Some((mut commands, scripts)) = commands else {
        return;
    };
    let settings = &shared.settings;
    let mut pipe = link::pipe();
    streams::read(
        &mut pipe,
        &scripts,
        &settings.prefix,
        topic,
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

/// Redis did not answer within `timeout`.
fn timed_out(timeout: std::time::Duration) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {timeout:?}"),
    ))
}

/// A node id as hex.
fn hex(node: &[u8; 16]) -> String {
    node.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `topic`'s subscribers on every node, and its position in Redis.
pub(super) async fn occupancy(shared: &Arc<Shared>, topic: &str) -> Option<Occupancy> {
    let commands = shared
        .commands
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (mut commands, scripts) = commands?;
    let mut pipe = link::pipe();
    streams::total(&mut pipe, &scripts, &shared.settings.prefix, topic);
    let answers = commands.run(&pipe, shared.settings.timeout).await.ok()?;
    let (subscribers, position) = streams::total_of(answers.first()?.as_ref().ok()?)?;
    Some(Occupancy {
        subscribers,
        position,
    })
}
