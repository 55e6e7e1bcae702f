//! Who is subscribed to each channel on this node, for `presence` and
//! `presence_stats` (with a Redis bridge, the other nodes' clients are
//! added: `everywhere.rs`). One entry per subscription, gone with it.

use std::collections::HashMap;
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
}
