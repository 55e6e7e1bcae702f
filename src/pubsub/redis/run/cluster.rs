//! On a Redis Cluster, a node hears only the topics it has subscribers
//! for: each subscribed (`SSUBSCRIBE`) on its shard when it gets its first
//! and unsubscribed when it loses its last, and all of them again after a
//! shard was lost.

use super::{Run, timed_out};
use crate::pubsub::redis::link::Commands;

impl Run {
    /// On a cluster: subscribes to the topics that got their first
    /// subscriber here, and unsubscribes from those that lost their last.
    pub(super) async fn follow(&mut self, commands: &mut Commands, changes: &[(String, bool)]) {
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

    /// On a cluster: subscribes again to every topic with subscribers
    /// here (each answer's confirmation has the topic caught up); true if
    /// every one succeeded.
    pub(super) async fn subscribe_all(&mut self, commands: &mut Commands) -> bool {
        match commands {
            Commands::Cluster(connection) => self.subscribe_occupied(connection).await.is_ok(),
            Commands::Single(_) => true,
        }
    }

    /// Subscribes `connection` to every topic with subscribers here, each
    /// on its shard and within the timeout; the last failure, if any (the
    /// others are still tried).
    pub(super) async fn subscribe_occupied(
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
}
