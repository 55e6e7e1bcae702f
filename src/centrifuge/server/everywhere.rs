//! Presence across nodes: with a Redis bridge, each subscription with
//! presence is also a member of its channel in the bridge (the client's
//! id, and who it is as a join push carries it), and `presence` and
//! `presence_stats` answer from every live node's members, later, from the
//! bridge's thread; without a bridge, or when Redis does not answer within
//! the bridge's timeout, from this node's own clients.

use std::collections::HashSet;

use super::Centrifuge;
use crate::centrifuge::ClientInfo;

impl Centrifuge {
    /// `info`'s client is subscribed to `channel`: here, and on every
    /// node through the bridge.
    pub(super) fn present(&self, channel: &str, info: &ClientInfo) {
        self.presence.join(channel, info.clone());
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            let who = super::join_leave::encode(super::join_leave::Kind::Join, info);
            bridge.join_member(channel, &info.client, &who);
        }
    }

    /// `client` left `channel` (or never made it).
    pub(super) fn absent(&self, channel: &str, client: &str) {
        self.presence.leave(channel, client);
        #[cfg(feature = "redis")]
        if let Some(bridge) = self.bridge.as_ref().filter(|_| self.options.presence) {
            bridge.leave_member(channel, client);
        }
    }

    /// Who is subscribed to `channel`, given to `then`: at once without a
    /// bridge; with one, once Redis answered (every node's clients) or the
    /// bridge's timeout passed (this node's), on the bridge's thread. This
    /// thread never waits for Redis.
    pub(super) fn presence_with(
        &self,
        channel: &str,
        then: impl FnOnce(Vec<(String, ClientInfo)>) + Send + 'static,
    ) {
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            return bridge.members_with(channel, move |members| then(clients_of(members)));
        }
        then(self.presence.list(channel))
    }

    /// [`Centrifuge::presence_with`], waited for on this thread (up to
    /// twice the bridge's timeout): for the HTTP API, whose answer cannot
    /// come later.
    pub(super) fn presence_wait(&self, channel: &str) -> Vec<(String, ClientInfo)> {
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            return clients_of(bridge.members_wait(channel));
        }
        self.presence.list(channel)
    }
}

/// The bridge's members as clients: one that does not read (not written
/// by a node of ours: Redis is not trusted) is left out, as is another
/// node's connection info that is not JSON (the JSON format carries it as
/// it is), and a client id seen twice.
#[cfg(feature = "redis")]
fn clients_of(members: crate::pubsub::redis::Members) -> Vec<(String, ClientInfo)> {
    let mut seen = HashSet::new();
    let mut clients = Vec::with_capacity(members.members.len());
    for member in members.members {
        let Some((_, mut info)) = super::join_leave::decode(&member.data) else {
            continue;
        };
        if !member.here && !crate::centrifuge::is_json(&info.conn_info) {
            info.conn_info = bytes::Bytes::new();
        }
        info.client.clone_from(&member.id);
        if seen.insert(member.id.clone()) {
            clients.push((member.id, info));
        }
    }
    clients
}

/// Clients, and distinct users among them.
pub(super) fn stats(clients: &[(String, ClientInfo)]) -> (u32, u32) {
    let users: HashSet<&str> = clients.iter().map(|(_, info)| info.user.as_str()).collect();
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    (count(clients.len()), count(users.len()))
}
