//! The bridge's two ways to Redis: one server (pub/sub, a pattern
//! subscription for every topic), or a Redis Cluster (sharded pub/sub:
//! `SPUBLISH` and `SSUBSCRIBE` per topic, each on the shard that owns the
//! topic's slot).

use futures_core::Stream;
use redis::{PushKind, Value};
use tokio::sync::mpsc;

/// Where the bridge connects.
#[derive(Clone, Debug)]
pub(super) enum Target {
    Single(String),
    Cluster(Vec<String>),
}

/// An empty batch for [`Commands::run`]: one command's error is its
/// answer, not the whole batch's.
pub(super) fn pipe() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe
}

/// A connection for commands.
#[derive(Clone)]
pub(super) enum Commands {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// What one command of a batch came to: its answer, or Redis's error.
pub(super) type Answer = Result<Value, String>;

impl Commands {
    /// Runs `pipe`'s commands (made by [`pipe`]) and returns each one's
    /// answer, in order; an
    /// error if the connection failed. On one server the batch is one
    /// round trip; on a cluster each command goes to its own shard, all at
    /// once, each bounded by `timeout` (a shard that is down fails its
    /// commands only).
    pub(super) async fn run(
        &mut self,
        pipe: &redis::Pipeline,
        timeout: std::time::Duration,
    ) -> redis::RedisResult<Vec<Answer>> {
        match self {
            Commands::Single(connection) => {
                let values: Vec<Value> = pipe.query_async(connection).await?;
                Ok(values
                    .into_iter()
                    .map(|value| match value {
                        Value::ServerError(error) => Err(format!("{error:?}")),
                        value => Ok(value),
                    })
                    .collect())
            }
            Commands::Cluster(connection) => {
                // Spawned in order: on the bridge's one thread, each sends
                // before the next, so one shard sees a topic's commands in
                // the order given.
                let pending: Vec<_> = pipe
                    .cmd_iter()
                    .map(|cmd| {
                        let (cmd, mut connection) = (cmd.clone(), connection.clone());
                        tokio::spawn(async move {
                            let query = cmd.query_async::<Value>(&mut connection);
                            tokio::time::timeout(timeout, query).await
                        })
                    })
                    .collect();
                let mut answers = Vec::with_capacity(pending.len());
                for answer in pending {
                    answers.push(match answer.await {
                        Ok(Ok(Ok(Value::ServerError(error)))) => Err(format!("{error:?}")),
                        Ok(Ok(Ok(value))) => Ok(value),
                        Ok(Ok(Err(error))) => Err(error.to_string()),
                        Ok(Err(_)) => Err(format!("no answer within {timeout:?}")),
                        Err(error) => Err(error.to_string()),
                    });
                }
                Ok(answers)
            }
        }
    }

    /// The command that publishes on a channel.
    pub(super) fn publish(&self) -> &'static str {
        match self {
            Commands::Single(_) => "PUBLISH",
            Commands::Cluster(_) => "SPUBLISH",
        }
    }
}

/// What arrives from Redis.
pub(super) enum Incoming {
    Message {
        channel: String,
        payload: Vec<u8>,
    },
    /// A cluster connection subscribed to `channel` again, on its own
    /// after reconnecting to a shard: what was published meanwhile is
    /// missing here.
    Resubscribed(String),
    /// A cluster connection lost one of its shards: its subscriptions
    /// there may be gone.
    ShardLost,
}

/// The stream of what arrives.
pub(super) enum Messages {
    Single(redis::aio::PubSubStream),
    /// From the cluster connection's push sender (bounded: a push that
    /// does not fit is lost, and counted where the bridge counts).
    Cluster(mpsc::Receiver<redis::PushInfo>),
}

impl Messages {
    /// The next message; `None` once the subscription ended.
    pub(super) async fn next(&mut self) -> Option<Incoming> {
        match self {
            Messages::Single(stream) => {
                let message =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *stream).poll_next(cx))
                        .await?;
                Some(Incoming::Message {
                    channel: message.get_channel_name().to_owned(),
                    payload: message.get_payload_bytes().to_vec(),
                })
            }
            Messages::Cluster(pushes) => loop {
                let push = pushes.recv().await?;
                let mut data = push.data.into_iter();
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
                            (data.next(), data.next())
                        else {
                            continue;
                        };
                        let Ok(channel) = String::from_utf8(channel) else {
                            continue;
                        };
                        return Some(Incoming::Message { channel, payload });
                    }
                    PushKind::Disconnection => return Some(Incoming::ShardLost),
                    PushKind::SSubscribe => {
                        if let Some(Value::BulkString(channel)) = data.next()
                            && let Ok(channel) = String::from_utf8(channel)
                        {
                            return Some(Incoming::Resubscribed(channel));
                        }
                    }
                    _ => {}
                }
            },
        }
    }
}

/// Pushes waiting for the bridge's task at most, on a cluster.
pub(super) const PUSHES: usize = 16_384;
