//! The live connections of a server, so a shutdown can reach every one of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::conn::ConnShared;

const SHARDS: usize = 16;

/// Connections by id, sharded so that connects and disconnects on different
/// threads rarely meet on one lock.
pub(crate) struct Registry {
    shards: [Mutex<HashMap<u64, Arc<ConnShared>>>; SHARDS],
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }
}

impl Registry {
    pub(crate) fn insert(&self, id: u64, conn: Arc<ConnShared>) {
        self.shard(id).insert(id, conn);
    }

    pub(crate) fn remove(&self, id: u64) {
        self.shard(id).remove(&id);
    }

    /// Calls `f` for every registered connection. `f` must not touch the registry.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Arc<ConnShared>)) {
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.values().for_each(&mut f);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    fn shard(&self, id: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnShared>>> {
        self.shards[id as usize % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}
