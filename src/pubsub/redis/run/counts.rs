//! Occupancy across nodes: this node's subscriber count of each topic
//! written to Redis (each good for three times [`COUNTS_EVERY`]), and
//! every node's counts of a topic read back with its position.

use std::sync::Arc;

use super::{CATCH_UP, COUNTS_EVERY, Run};
use crate::pubsub::redis::link::{self, Commands};
use crate::pubsub::redis::shared::{Occupancy, Shared};
use crate::pubsub::redis::streams::{self, Scripts};

impl Run {
    /// Writes this node's subscriber counts of `topics` to Redis (0 takes
    /// the node out of a topic's total).
    pub(super) async fn write_counts(
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
}

/// A node id as hex.
fn hex(node: &[u8; 16]) -> String {
    node.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `topic`'s subscribers on every node, and its position in Redis.
pub(in crate::pubsub::redis) async fn occupancy(
    shared: &Arc<Shared>,
    topic: &str,
) -> Option<Occupancy> {
    let commands = shared.commands();
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
