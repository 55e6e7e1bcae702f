//! This node's publishes to Redis: a batch per round trip, each signed
//! and counted as it leaves, a recorded one's sender waiting for it to
//! come back; and what never reached Redis, lost or delivered here
//! unrecorded.

use std::sync::atomic::Ordering;

use super::{Run, Waiter};
use crate::pubsub::redis::link::{self, Commands};
use crate::pubsub::redis::shared::Outgoing;
use crate::pubsub::redis::streams::{self, Scripts};
use crate::pubsub::redis::wire;

impl Run {
    /// Sends one batch in one round trip (each publish on its channel, each
    /// recorded one through the record script).
    pub(super) async fn send(
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
    /// (see the `redis` module docs).
    /// (The caller has taken their bytes off the queue's count.)
    pub(super) fn not_sent(&mut self, outgoing: Vec<Outgoing>) {
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
}
