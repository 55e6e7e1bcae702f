//! Who is subscribed to what: topics in shards, and each topic's
//! subscribers grouped by the server loop that serves them.
//!
//! A publish looks up its topic once (one shard lock) and comes away with
//! one [`Local`] per loop that has subscribers, never with the subscribers
//! themselves: the hand-off to each loop is one job, and the loop walks its
//! own list. Subscribing locks the topic's shard and then that loop's list;
//! a delivery locks only the loop's list (and then each connection's queue,
//! one at a time). No path takes a shard or a list while holding a
//! connection's queue, so the locks cannot cross.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::connection::conn::Conn;
use crate::connection::wake::{ConnWake, WokenList};

/// Shards of the topic map: enough that publishers and subscribers on a
/// few dozen threads rarely meet on one lock.
const SHARDS: usize = 64;

/// Where a subscriber's deliveries run.
#[derive(Clone)]
pub(super) enum Route {
    /// On the server loop that serves it (a tokio group, an io_uring
    /// reactor): one job per publish for all its subscribers there.
    Loop(Arc<dyn WokenList>),
    /// On the publisher's thread: a connection with a task of its own (the
    /// stream driver: TLS, hyper and axum upgrades) has no loop to hand a
    /// job to, and its queue is the hand-off.
    Direct,
}

impl Route {
    pub(super) fn of(conn: &Conn) -> Route {
        Route::of_wake(conn.shared().wake())
    }

    /// The route of a connection its driver wakes through `wake`.
    pub(super) fn of_wake(wake: &ConnWake) -> Route {
        match wake.list() {
            Some(list) => Route::Loop(list.clone()),
            None => Route::Direct,
        }
    }

    pub(super) fn same(&self, other: &Route) -> bool {
        match (self, other) {
            (Route::Loop(a), Route::Loop(b)) => std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)),
            (Route::Direct, Route::Direct) => true,
            _ => false,
        }
    }
}

/// One topic's subscribers on one route.
pub(super) struct Local {
    pub(super) route: Route,
    subscribers: Mutex<Subscribers>,
    /// `subscribers`' length, readable without the lock (publish counts).
    count: AtomicUsize,
}

/// A list to walk fast, and where each connection sits in it, to remove
/// one without a search.
#[derive(Default)]
pub(super) struct Subscribers {
    pub(super) conns: Vec<Conn>,
    at: HashMap<usize, usize>,
}

impl Local {
    fn new(route: Route) -> Local {
        Local {
            route,
            subscribers: Mutex::default(),
            count: AtomicUsize::new(0),
        }
    }

    /// The subscribers, locked for a delivery.
    pub(super) fn lock(&self) -> MutexGuard<'_, Subscribers> {
        self.subscribers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    fn add(&self, conn: &Conn) -> bool {
        let mut subscribers = self.lock();
        let Subscribers { conns, at } = &mut *subscribers;
        if at.contains_key(&conn.key()) {
            return false;
        }
        at.insert(conn.key(), conns.len());
        conns.push(conn.clone());
        self.count.store(conns.len(), Ordering::Relaxed);
        true
    }

    fn remove(&self, key: usize) -> bool {
        let mut subscribers = self.lock();
        let Subscribers { conns, at } = &mut *subscribers;
        let Some(index) = at.remove(&key) else {
            return false;
        };
        conns.swap_remove(index);
        if let Some(moved) = conns.get(index) {
            at.insert(moved.key(), index);
        }
        self.count.store(conns.len(), Ordering::Relaxed);
        true
    }
}

/// A topic: its subscribers, by route.
#[derive(Default)]
struct Topic {
    locals: Vec<Arc<Local>>,
}

type Shard = HashMap<Arc<str>, Topic>;

/// Every topic that has subscribers.
pub(super) struct Registry {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Registry {
    fn shard(&self, topic: &str) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(topic) as usize % self.shards.len();
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `conn` to `topic`. Returns the topic's name as the registry
    /// keeps it (one allocation per topic, shared by whoever holds it), and
    /// whether `conn` was new there.
    pub(super) fn add(&self, topic: &str, conn: &Conn) -> (Arc<str>, bool) {
        let route = Route::of(conn);
        let mut shard = self.shard(topic);
        let name = match shard.get_key_value(topic) {
            Some((name, _)) => name.clone(),
            None => {
                let name: Arc<str> = Arc::from(topic);
                shard.insert(name.clone(), Topic::default());
                name
            }
        };
        let entry = shard.get_mut(topic).expect("inserted above");
        let local = match entry.locals.iter().find(|l| l.route.same(&route)) {
            Some(local) => local.clone(),
            None => {
                let local = Arc::new(Local::new(route));
                entry.locals.push(local.clone());
                local
            }
        };
        // Under the shard's lock, so that a removal cannot drop the list
        // between the lookup and the add.
        let added = local.add(conn);
        (name, added)
    }

    /// Removes the connection whose [`Conn::key`] is `key` from `topic`;
    /// a topic left with no subscribers goes. False if it was not there.
    pub(super) fn remove(&self, topic: &str, key: usize, route: &Route) -> bool {
        let mut shard = self.shard(topic);
        let Some(entry) = shard.get_mut(topic) else {
            return false;
        };
        let Some(at) = entry.locals.iter().position(|l| l.route.same(route)) else {
            return false;
        };
        let removed = entry.locals[at].remove(key);
        if entry.locals[at].count() == 0 {
            entry.locals.swap_remove(at);
            if entry.locals.is_empty() {
                shard.remove(topic);
            }
        }
        removed
    }

    /// The routes with subscribers to `topic`, into `into`; returns how
    /// many subscribers they hold.
    pub(super) fn targets(&self, topic: &str, into: &mut Vec<Arc<Local>>) -> usize {
        let shard = self.shard(topic);
        let Some(entry) = shard.get(topic) else {
            return 0;
        };
        into.extend(entry.locals.iter().cloned());
        entry.locals.iter().map(|l| l.count()).sum()
    }

    /// Subscribers to `topic` now.
    pub(super) fn count(&self, topic: &str) -> usize {
        let shard = self.shard(topic);
        shard
            .get(topic)
            .map_or(0, |entry| entry.locals.iter().map(|l| l.count()).sum())
    }

    /// Topics with at least one subscriber.
    pub(super) fn topics(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}
