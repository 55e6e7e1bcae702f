//! Who is subscribed to each channel on this node, for `presence` and
//! `presence_stats` (with the Redis bridge, each node answers for its own
//! clients). One entry per subscription, gone with it.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use crate::centrifuge::ClientInfo;

/// Channel → client id → who.
#[derive(Default)]
pub(super) struct Presence {
    channels: Mutex<HashMap<String, HashMap<String, ClientInfo>>>,
}

impl Presence {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, ClientInfo>>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn join(&self, channel: &str, info: ClientInfo) {
        self.lock()
            .entry(channel.to_owned())
            .or_default()
            .insert(info.client.clone(), info);
    }

    pub(super) fn leave(&self, channel: &str, client: &str) {
        let mut channels = self.lock();
        if let Some(clients) = channels.get_mut(channel) {
            clients.remove(client);
            if clients.is_empty() {
                channels.remove(channel);
            }
        }
    }

    pub(super) fn list(&self, channel: &str) -> Vec<(String, ClientInfo)> {
        let channels = self.lock();
        let clients = channels.get(channel).into_iter().flatten();
        clients
            .map(|(id, info)| (id.clone(), info.clone()))
            .collect()
    }

    /// Clients, and distinct users among them.
    pub(super) fn stats(&self, channel: &str) -> (u32, u32) {
        let channels = self.lock();
        let Some(clients) = channels.get(channel) else {
            return (0, 0);
        };
        let users: HashSet<&str> = clients.values().map(|info| info.user.as_str()).collect();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (count(clients.len()), count(users.len()))
    }
}
