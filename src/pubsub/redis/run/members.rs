//! Members across nodes: this node's written to Redis as they change and
//! renewed with its counts (each writer good for three times
//! [`COUNTS_EVERY`]), and every node's members of a topic read back.

use std::sync::Arc;

use super::{CATCH_UP, COUNTS_EVERY, Run};
use crate::pubsub::redis::link::{self, Commands};
use crate::pubsub::redis::members::{self, MAX_MEMBER_BYTES, MAX_MEMBERS, Member, Write};
use crate::pubsub::redis::shared::Shared;
use crate::pubsub::redis::streams::Scripts;

/// The most members one script call adds or removes.
const OPS: usize = 256;

impl Run {
    /// Writes `writes` to Redis; the topics whose writer had lapsed there
    /// (renewed too late: its members may be gone) are written again
    /// under a new writer.
    pub(super) async fn write_members(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
        writes: Vec<Write>,
    ) -> redis::RedisResult<()> {
        let lapsed = self.send_members(commands, scripts, &writes).await?;
        if lapsed.is_empty() {
            return Ok(());
        }
        let again: Vec<Write> = {
            let mut local = self.shared.members();
            lapsed.iter().flat_map(|t| local.rewrite(t)).collect()
        };
        // Once: a writer that lapsed again is renewed on the next round.
        self.send_members(commands, scripts, &again).await?;
        Ok(())
    }

    /// Renews every writer of this node's (with its counts).
    pub(super) async fn renew_members(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
    ) -> redis::RedisResult<()> {
        let renewals = self.shared.members().renewals();
        self.write_members(commands, scripts, renewals).await
    }

    /// Sends `writes`, a batch per round trip; the topics of live writes
    /// whose writer Redis did not have alive.
    async fn send_members(
        &self,
        commands: &mut Commands,
        scripts: &Scripts,
        writes: &[Write],
    ) -> redis::RedisResult<Vec<String>> {
        let prefix = &self.shared.settings.prefix;
        let good_for = (COUNTS_EVERY * 3).as_millis() as u64;
        // One call per `OPS` members: (its topic, whether it is a
        // renewal, the call). A renewal carries no member, and says
        // whether its writer had lapsed.
        let mut calls: Vec<(&str, bool, redis::Cmd)> = Vec::new();
        for write in writes {
            let renewal = write.alive && write.ops.is_empty();
            let groups: Vec<&[(String, Option<bytes::Bytes>)]> = if renewal {
                vec![&[]]
            } else {
                write.ops.chunks(OPS).collect()
            };
            for ops in groups {
                let [writers, all] = members::keys(prefix, &write.topic);
                let mut cmd = redis::cmd(scripts.eval);
                cmd.arg(&scripts.members_write)
                    .arg(2)
                    .arg(writers)
                    .arg(all)
                    .arg(&write.writer)
                    .arg(if write.alive { good_for } else { 0 });
                for (id, data) in ops {
                    match data {
                        Some(data) if members::shared(id, data) => {
                            cmd.arg(format!("+{id}")).arg(&data[..]);
                        }
                        _ => {
                            cmd.arg(format!("-{id}")).arg("");
                        }
                    }
                }
                calls.push((&write.topic, renewal, cmd));
            }
        }
        let mut lapsed = Vec::new();
        for chunk in calls.chunks(CATCH_UP) {
            let mut pipe = link::pipe();
            for (_, _, cmd) in chunk {
                pipe.add_command(cmd.clone());
            }
            let answers = commands.run(&pipe, self.shared.settings.timeout).await?;
            for ((topic, renewal, _), answer) in chunk.iter().zip(&answers) {
                // (A new writer's first write finds it absent too: only a
                // renewal's answer counts.)
                if *renewal && matches!(answer, Ok(redis::Value::Int(0))) {
                    lapsed.push((*topic).to_owned());
                }
            }
        }
        Ok(lapsed)
    }
}

/// Reads `topic`'s members on every node whose writer is alive, as
/// (writer, member); `None` if Redis did not answer.
pub(in crate::pubsub::redis) async fn members(
    shared: &Arc<Shared>,
    topic: &str,
) -> Option<Vec<(String, Member)>> {
    let commands = shared.commands();
    let (mut commands, scripts) = commands?;
    let [writers, all] = members::keys(&shared.settings.prefix, topic);
    let mut pipe = link::pipe();
    pipe.cmd(scripts.eval)
        .arg(&scripts.members_read)
        .arg(2)
        .arg(writers)
        .arg(all)
        .arg(MAX_MEMBERS)
        .arg(MAX_MEMBER_BYTES);
    let answers = commands.run(&pipe, shared.settings.timeout).await.ok()?;
    Some(members::read_of(answers.first()?.as_ref().ok()?))
}
