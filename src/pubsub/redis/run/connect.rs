//! A connection's life: made (one Redis server, or a Redis Cluster's
//! shards), recovered, then relaying both ways until something fails, and
//! made again after a backoff, with what was published meanwhile lost or
//! delivered here unrecorded.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::{COUNTS_EVERY, Run, timed_out};
use crate::pubsub::redis::link::{self, Commands, Incoming, Messages, Target};
use crate::pubsub::redis::shared::escape_pattern;
use crate::pubsub::redis::streams::Scripts;

/// The most messages sent to Redis in one round trip.
const BATCH: usize = 256;

/// How often a connected bridge looks for topics published unrecorded.
const BROKEN_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a cluster connection that lost a shard subscribes again to
/// every topic with subscribers here, until all succeed.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(1);

const MIN_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);

impl Run {
    /// Connects, relays until the connection fails, waits, and again.
    pub(in crate::pubsub::redis) async fn forever(mut self) {
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
        // Members written again, under new writers: what Redis holds of
        // this node's from before may be stale.
        let writes = self.shared.members().rewrite_all();
        if let Err(error) = self.write_members(&mut commands, &scripts, writes).await {
            return error.to_string();
        }
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
                () = self.shared.members_changed.notified() => {
                    let writes = self.shared.members().take();
                    if let Err(error) = self.write_members(&mut commands, &scripts, writes).await {
                        return error.to_string();
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
                    if let Err(error) = self.renew_members(&mut commands, &scripts).await {
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
}
