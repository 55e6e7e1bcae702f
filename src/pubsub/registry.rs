//! Who is subscribed to what: topics in shards, and each topic's
//! subscribers grouped by the server loop that serves them.
//!
//! A publish looks up its topic (one shard lock, let go), then holds the
//! topic's own lock while it numbers the publication and hands it to one
//! [`Local`] per loop that has subscribers, never to the subscribers
//! themselves: the hand-off to each loop is one job, and the loop walks its
//! own list. A subscribe holds the same topic lock while it replays and
//! joins, so it sees every publication either in the replay or live, never
//! both and never neither. A delivery locks only the loop's list (and then
//! each connection's queue, one at a time).
//!
//! Locks are taken in one order: shard, topic, list, connection queue (a
//! removal holds the shard while it takes the topic; nothing takes a shard
//! while holding a topic), so they cannot cross.
//!
//! A topic that nothing needs is forgotten, and made again when it is
//! next used. A topic with history starts in its *first epoch*, named by
//! its name and by a count of its shard's: a topic forgotten with nothing
//! published comes back in the epoch it had, so a subscriber told
//! `(epoch, 0)` that was away meanwhile still resumes with everything
//! published since. Whatever could make a position in a first epoch name
//! something else moves the shard's count on, so no topic there starts
//! again in that epoch: a topic forgotten after publishing (or in another
//! epoch), a publication refused for the topics' budget (not numbered),
//! and a handoff that failed (the successor numbered in them). A topic
//! without history (whose publications are not numbered while nobody is
//! subscribed) starts in a random epoch.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::budget::{Limits, Tally};
use super::envelope::Envelope;
use super::histories::Histories;
use super::history::{Epoch, History};
use super::log::Log;
use super::pending::Pending;
use super::sessions::SessionSubscribers;
use crate::connection::conn::Conn;
use crate::connection::wake::{ConnWake, WokenList};

/// Shards of the topic map: enough that publishers and subscribers on a
/// few dozen threads rarely meet on one lock.
pub(super) const SHARDS: usize = 64;

/// Where a subscriber's deliveries run.
#[derive(Clone)]
pub(super) enum Route {
    /// On the server loop that serves it (a tokio group, an io_uring
    /// reactor): one job per publish for all its subscribers there.
    Loop(Arc<dyn WokenList>),
    /// On the publisher's thread: a connection with a task of its own (the
    /// stream driver: TLS, hyper's and axum's upgrades over TLS or HTTP/2)
    /// has no loop to hand a job to, and its queue is the hand-off.
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

/// One subscription.
pub(super) struct Subscriber {
    pub(super) conn: Conn,
    /// The first offset it is delivered live: the ones before it came
    /// from history, or were published before it subscribed (a delivery
    /// job already on its way when it did must pass it by).
    pub(super) from: u64,
    /// How its client is shown a delivery; `None`: the payload alone.
    pub(super) envelope: Option<Arc<dyn Envelope>>,
    /// It was told of a gap (`Envelope::recovery` with false) and has
    /// been delivered nothing since: another missed delivery is the same
    /// gap, and is not told again.
    pub(super) gap: bool,
    /// Publications waiting for room in its queue (`Overflow::Conflate`):
    /// while any wait, every later one waits behind them.
    pub(super) pending: Option<Box<Pending>>,
}

/// A list to walk fast, and where each connection sits in it, to remove
/// one without a search.
#[derive(Default)]
pub(super) struct Subscribers {
    pub(super) list: Vec<Subscriber>,
    /// The same connections, in the same order: what a delivery walks when
    /// no subscription here needs more than its connection (`is_plain_for`),
    /// an eighth of the bytes of `list`.
    pub(super) conns: Vec<Conn>,
    at: HashMap<usize, usize>,
    /// Subscriptions with an envelope.
    enveloped: usize,
    /// The highest `from` of any subscription (never lowered: a bound).
    max_from: u64,
}

impl Subscribers {
    /// Whether a publication at `offset` goes to every connection here as
    /// its plain frame, with nothing to note per subscription: no envelope
    /// here, no subscription that starts after it, and no conflation.
    pub(super) fn is_plain_for(&self, offset: u64, conflate: bool) -> bool {
        self.enveloped == 0 && offset >= self.max_from && !conflate
    }

    /// The subscriber whose connection's key is `key`.
    pub(super) fn find(&mut self, key: usize) -> Option<&mut Subscriber> {
        let index = *self.at.get(&key)?;
        self.list.get_mut(index)
    }
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

    fn contains(&self, key: usize) -> bool {
        self.lock().at.contains_key(&key)
    }

    fn add(&self, subscriber: Subscriber) -> bool {
        let mut subscribers = self.lock();
        let s = &mut *subscribers;
        if s.at.contains_key(&subscriber.conn.key()) {
            return false;
        }
        s.at.insert(subscriber.conn.key(), s.list.len());
        s.enveloped += usize::from(subscriber.envelope.is_some());
        s.max_from = s.max_from.max(subscriber.from);
        s.conns.push(subscriber.conn.clone());
        s.list.push(subscriber);
        self.count.store(s.list.len(), Ordering::Relaxed);
        true
    }

    /// Takes the subscriber out; `None` if it was not there.
    fn remove(&self, key: usize) -> Option<Subscriber> {
        let mut subscribers = self.lock();
        let s = &mut *subscribers;
        let index = s.at.remove(&key)?;
        let removed = s.list.swap_remove(index);
        s.conns.swap_remove(index);
        s.enveloped -= usize::from(removed.envelope.is_some());
        if let Some(moved) = s.list.get(index) {
            s.at.insert(moved.conn.key(), index);
        }
        self.count.store(s.list.len(), Ordering::Relaxed);
        Some(removed)
    }
}

/// A topic: its subscribers by route, its position, what it keeps.
pub(super) struct Topic {
    /// The name, one allocation shared by whoever holds it.
    pub(super) name: Arc<str>,
    state: Mutex<TopicState>,
}

/// A topic's state, under its lock: publishes take it to number and send
/// in one order; subscribes take it to replay and join at one point.
pub(super) struct TopicState {
    pub(super) locals: Vec<Arc<Local>>,
    /// This history of the topic.
    pub(super) epoch: Epoch,
    /// The latest publication's offset (0: none yet in this epoch).
    pub(super) last: u64,
    /// What it keeps; `None` with history off.
    pub(super) log: Option<Log>,
    /// Taken out of the registry: whoever holds it looks it up again.
    pub(super) gone: bool,
    /// Who numbers its publications.
    pub(super) numbering: Numbering,
    /// Taken over from the previous process (a handoff): kept until then,
    /// whatever it holds, so that its numbering is there for the
    /// subscribers on their way (a handoff takes far less).
    pub(super) pinned_until: Option<Instant>,
    /// Where the previous epoch ended when `PubSub::renumber` began this
    /// one: a subscriber that had everything up to there missed nothing.
    pub(super) renumbered_from: Option<super::history::Position>,
    /// WebTransport sessions subscribed (feature `http3`).
    pub(super) sessions: SessionSubscribers,
}

/// Who numbers a topic's publications.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Numbering {
    /// This node: no Redis history, or none seen yet for this topic.
    Here,
    /// Redis (the bridge's history): epoch and offsets are Redis's, the
    /// same on every node.
    Redis,
    /// Redis did, until a publication here could not be recorded: this
    /// node numbers in an epoch of its own until Redis's come back, and
    /// its subscribers are told of the gap then.
    Lost,
}

/// What a topic holds besides its name's bytes, as the topics' budget
/// counts it: its state, the name's allocation, its entry in a shard's
/// map, and one route's subscriber list.
const TOPIC_OVERHEAD: usize = std::mem::size_of::<Topic>()
    + 16
    + 16
    + 48
    + std::mem::size_of::<Local>()
    + std::mem::size_of::<Subscribers>()
    + 16;

/// What a topic named `name` counts against the topics' budget.
fn topic_cost(name: &str) -> usize {
    TOPIC_OVERHEAD + name.len()
}

impl Topic {
    fn new(name: Arc<str>, epoch: Epoch, history: History, histories: &Arc<Histories>) -> Topic {
        Topic {
            name,
            state: Mutex::new(TopicState {
                locals: Vec::new(),
                epoch,
                last: 0,
                log: history
                    .is_on()
                    .then(|| Log::new(history, histories.clone())),
                gone: false,
                numbering: Numbering::Here,
                pinned_until: None,
                renumbered_from: None,
                sessions: SessionSubscribers::default(),
            }),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, TopicState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl TopicState {
    /// Subscribers now, on every route, and sessions.
    pub(super) fn subscribers(&self) -> usize {
        self.locals.iter().map(|l| l.count()).sum::<usize>() + self.sessions.len()
    }

    /// Whether nobody is subscribed: no connection, no session.
    pub(super) fn unoccupied(&self) -> bool {
        self.locals.is_empty() && self.sessions.is_empty()
    }

    /// Whether the connection `key` on `route` is subscribed.
    pub(super) fn contains(&self, route: &Route, key: usize) -> bool {
        self.locals
            .iter()
            .any(|l| l.route.same(route) && l.contains(key))
    }

    /// Adds a subscriber; false if its connection was subscribed already.
    pub(super) fn add(&mut self, subscriber: Subscriber) -> bool {
        let route = Route::of(&subscriber.conn);
        let local = match self.locals.iter().find(|l| l.route.same(&route)) {
            Some(local) => local.clone(),
            None => {
                let local = Arc::new(Local::new(route));
                self.locals.push(local.clone());
                local
            }
        };
        local.add(subscriber)
    }

    /// Takes Redis's numbering from `position` on (the next publication
    /// is `position`): the log restarts, subscriptions that started past
    /// it start there, and with `tell` every subscriber is told of a gap,
    /// in order: after what is on its way to it already.
    pub(super) fn renumber(
        &mut self,
        topic: &Arc<str>,
        position: super::history::Position,
        tell: bool,
    ) {
        self.epoch = position.epoch;
        self.last = position.offset.saturating_sub(1);
        self.numbering = Numbering::Redis;
        if let Some(log) = &mut self.log {
            log.clear();
        }
        for local in &self.locals {
            let mut subscribers = local.lock();
            let s = &mut *subscribers;
            s.max_from = 0;
            for subscriber in &mut s.list {
                subscriber.from = subscriber.from.min(self.last + 1);
                s.max_from = s.max_from.max(subscriber.from);
            }
            if !tell {
                continue;
            }
            let told: Vec<usize> = s.list.iter().map(|s| s.conn.key()).collect();
            drop(subscribers);
            let (held, topic) = (local.clone(), topic.clone());
            let job = move || {
                let mut subscribers = held.lock();
                for key in told {
                    if let Some(subscriber) = subscribers.find(key) {
                        tell_gap(subscriber, &topic);
                    }
                }
            };
            match &local.route {
                // Behind the deliveries posted before it.
                Route::Loop(list) => {
                    // A loop too far behind to take it has dropped
                    // deliveries, and told of that gap.
                    list.post(Box::new(job), 0);
                }
                Route::Direct => job(),
            }
        }
    }

    /// Whether nothing needs it kept: no subscribers, nothing to replay.
    pub(super) fn idle(&self) -> bool {
        let pinned = self
            .pinned_until
            .is_some_and(|until| Instant::now() < until);
        !pinned && self.unoccupied() && self.log.as_ref().is_none_or(Log::is_empty)
    }
}

type Shard = HashMap<Arc<str>, Arc<Topic>>;

/// Per shard, what names its topics' first epochs: the topics forgotten
/// there with publications (or in an epoch not their first), changed
/// under the shard's lock.
struct Generations {
    key: RandomState,
    forgotten: Box<[AtomicU64]>,
}

impl Generations {
    fn new() -> Generations {
        Generations {
            key: RandomState::new(),
            forgotten: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The epoch `name` starts in, made in shard `index` now (the caller
    /// holds that shard's lock).
    fn first_epoch(&self, index: usize, name: &str) -> Epoch {
        let generation = self.forgotten[index].load(Ordering::Relaxed);
        Epoch::from_u64(self.key.hash_one((name, generation)))
    }

    /// Counts the topic `name` of shard `index` out, if what it numbered
    /// could be mistaken for what a topic made again would (the caller
    /// holds that shard's lock and the topic's). A topic without history
    /// never starts in a first epoch (see `Registry::open`).
    fn forget(&self, index: usize, name: &str, state: &TopicState) {
        if state.log.is_none() {
            return;
        }
        if state.last > 0 || state.epoch != self.first_epoch(index, name) {
            self.move_on(index);
        }
    }

    /// No topic of shard `index` made from now on starts in an epoch
    /// handed out before (the caller holds that shard's lock).
    fn move_on(&self, index: usize) {
        self.forgotten[index].fetch_add(1, Ordering::Relaxed);
    }
}

/// Told when a topic gets its first subscriber (`true`) and loses its
/// last (`false`), under the topic's lock.
pub(super) type Occupancy = Arc<dyn Fn(&str, bool) + Send + Sync>;

/// Every topic that has subscribers or keeps publications.
pub(super) struct Registry {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// What names each shard's topics' first epochs.
    generations: Generations,
    /// Topics with at least one subscriber.
    occupied: AtomicUsize,
    /// Every topic here.
    kept: AtomicUsize,
    /// What the topics hold (`Limits::topic_bytes`).
    budget: Tally,
    /// Topics not made because the budget was full.
    refused: AtomicU64,
    /// Every topic's history.
    pub(super) histories: Arc<Histories>,
    occupancy: Option<Occupancy>,
}

impl Registry {
    pub(super) fn new(occupancy: Option<Occupancy>, limits: Limits) -> Registry {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            generations: Generations::new(),
            occupied: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            budget: Tally::new(limits.topics),
            refused: AtomicU64::new(0),
            histories: Arc::new(Histories::new(limits.history)),
            occupancy,
        }
    }

    fn shard(&self, topic: &str) -> MutexGuard<'_, Shard> {
        self.lock_shard(self.index(topic))
    }

    /// The shard `topic` is in.
    fn index(&self, topic: &str) -> usize {
        self.hasher.hash_one(topic) as usize % self.shards.len()
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Shard> {
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The topic, if it has subscribers or keeps publications.
    pub(super) fn find(&self, topic: &str) -> Option<Arc<Topic>> {
        self.shard(topic).get(topic).cloned()
    }

    /// The topic, made (keeping `history`) if it is not there; `None` if
    /// it is not there and the topics' budget has no room for it (counted).
    pub(super) fn open(&self, topic: &str, history: History) -> Option<Arc<Topic>> {
        let index = self.index(topic);
        let mut shard = self.lock_shard(index);
        if let Some(found) = shard.get(topic) {
            return Some(found.clone());
        }
        if !self.budget.take(topic_cost(topic)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            // A publication refused here is not numbered: a topic made
            // after it must not take a position told before for whole.
            self.generations.move_on(index);
            return None;
        }
        let name: Arc<str> = Arc::from(topic);
        // Without history a publication with nobody subscribed is not
        // numbered either: such a topic starts in an epoch of its own.
        let epoch = if history.is_on() {
            self.generations.first_epoch(index, topic)
        } else {
            Epoch::new()
        };
        let made = Arc::new(Topic::new(name.clone(), epoch, history, &self.histories));
        shard.insert(name, made.clone());
        self.kept.fetch_add(1, Ordering::Relaxed);
        Some(made)
    }

    /// Moves every shard on (see `Generations::move_on`): after a handoff
    /// that failed, the successor numbered in this process's first epochs
    /// meanwhile, topics forgotten here included.
    pub(super) fn move_on_all(&self) {
        for index in 0..self.shards.len() {
            let _shard = self.lock_shard(index);
            self.generations.move_on(index);
        }
    }

    /// Whether `topic` is here, or the topics' budget has room for it now.
    pub(super) fn has_room_for(&self, topic: &str) -> bool {
        let cost = topic_cost(topic);
        self.shard(topic).contains_key(topic)
            || self.budget.used().saturating_add(cost) <= self.budget.limit()
    }

    /// Takes an idle topic out of its shard (the caller holds both
    /// locks): whoever holds it looks it up again.
    fn forget(&self, index: usize, shard: &mut Shard, name: &str, state: &mut TopicState) {
        state.gone = true;
        if shard.remove(name).is_some() {
            self.generations.forget(index, name, state);
            self.budget.give(topic_cost(name));
            self.kept.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Lets go of the oldest kept publications, whatever their topic,
    /// until every topic's history is within its budget (the caller holds
    /// no lock of the registry). Topics left with nothing to keep them
    /// are forgotten. Returns how many were let go.
    pub(super) fn shed_history(&self) -> u64 {
        let mut total = 0;
        while self.histories.over() {
            // Everything left is charged to logs on their way out.
            let Some(publication) = self.histories.oldest() else {
                break;
            };
            let Some(topic) = self.find(publication.topic()) else {
                continue;
            };
            let mut state = topic.lock();
            let shed = state
                .log
                .as_mut()
                .map_or(0, |log| log.shed_through(&publication));
            let idle = state.idle();
            drop(state);
            total += shed as u64;
            if idle {
                self.forget_if_idle(publication.topic());
            }
        }
        if total > 0 {
            self.histories.shed(total);
        }
        total
    }

    /// Forgets `topic` if nothing needs it kept any more.
    pub(super) fn forget_if_idle(&self, topic: &str) {
        let index = self.index(topic);
        let mut shard = self.lock_shard(index);
        let Some(entry) = shard.get(topic).cloned() else {
            return;
        };
        let mut state = entry.lock();
        if state.idle() {
            self.forget(index, &mut shard, topic, &mut state);
        }
    }

    /// Counts a topic that got its first subscriber, and says so (the
    /// caller holds the topic's lock).
    pub(super) fn occupy(&self, topic: &str) {
        self.occupied.fetch_add(1, Ordering::Relaxed);
        if let Some(occupancy) = &self.occupancy {
            occupancy(topic, true);
        }
    }

    /// Removes the connection whose [`Conn::key`] is `key` from `topic`;
    /// a topic left with no subscribers and nothing kept goes. Returns the
    /// subscription, `None` if it was not there.
    pub(super) fn remove(&self, topic: &str, key: usize, route: &Route) -> Option<Subscriber> {
        let index = self.index(topic);
        let mut shard = self.lock_shard(index);
        let entry = shard.get(topic).cloned()?;
        let mut state = entry.lock();
        let at = state.locals.iter().position(|l| l.route.same(route))?;
        let removed = state.locals[at].remove(key);
        if state.locals[at].count() == 0 {
            state.locals.swap_remove(at);
            self.left(topic, &state);
        }
        if state.idle() {
            self.forget(index, &mut shard, topic, &mut state);
        }
        removed
    }

    /// Counts a topic that lost its last subscriber, if it did, and says
    /// so (the caller holds the topic's lock).
    fn left(&self, topic: &str, state: &TopicState) {
        if state.unoccupied() {
            self.occupied.fetch_sub(1, Ordering::Relaxed);
            if let Some(occupancy) = &self.occupancy {
                occupancy(topic, false);
            }
        }
    }

    /// Removes the session `key`'s subscription to `topic` (only the one
    /// `token` names, if given), as [`remove`] does a connection's; false
    /// if it was not there.
    ///
    /// [`remove`]: Registry::remove
    #[cfg(feature = "http3")]
    pub(super) fn remove_session(
        &self,
        topic: &str,
        key: (usize, u64),
        token: Option<u64>,
    ) -> bool {
        let index = self.index(topic);
        let mut shard = self.lock_shard(index);
        let Some(entry) = shard.get(topic).cloned() else {
            return false;
        };
        let mut state = entry.lock();
        if !state.sessions.remove(key, token) {
            return false;
        }
        self.left(topic, &state);
        if state.idle() {
            self.forget(index, &mut shard, topic, &mut state);
        }
        true
    }

    /// Subscribers to `topic` now.
    pub(super) fn count(&self, topic: &str) -> usize {
        self.find(topic).map_or(0, |t| t.lock().subscribers())
    }

    /// Topics with at least one subscriber.
    pub(super) fn topics(&self) -> usize {
        self.occupied.load(Ordering::Relaxed)
    }

    /// Every topic here (with subscribers, or only history), what they
    /// hold in bytes, and how many were refused for the budget so far.
    pub(super) fn kept(&self) -> (usize, usize, u64) {
        (
            self.kept.load(Ordering::Relaxed),
            self.budget.used(),
            self.refused.load(Ordering::Relaxed),
        )
    }

    /// Every topic with subscribers.
    pub(super) fn occupied(&self) -> Vec<Arc<str>> {
        self.collect(|name, state| (!state.unoccupied()).then(|| name.clone()))
    }

    /// Every topic numbered by Redis here, with its latest position.
    pub(super) fn numbered_by_redis(&self) -> Vec<(Arc<str>, super::history::Position)> {
        self.collect(|name, state| {
            (state.numbering == Numbering::Redis).then(|| {
                let position = super::history::Position {
                    epoch: state.epoch,
                    offset: state.last,
                };
                (name.clone(), position)
            })
        })
    }

    /// What `pick` takes from each topic, one shard (and one topic) locked
    /// at a time.
    pub(super) fn collect<T>(&self, pick: impl Fn(&Arc<str>, &TopicState) -> Option<T>) -> Vec<T> {
        let mut found = Vec::new();
        for index in 0..self.shards.len() {
            let shard = self.lock_shard(index);
            for (name, topic) in shard.iter() {
                found.extend(pick(name, &topic.lock()));
            }
        }
        found
    }

    /// Lets every topic drop the publications it kept too long, counts
    /// again what the rest hold if asked (frames made for them since), and
    /// forgets the topics left with nothing: one shard (and one topic) at
    /// a time. Run on time, not on traffic (see `PubSub`'s sweeper).
    pub(super) fn sweep(&self, now: Instant, recount: bool) {
        for index in 0..self.shards.len() {
            let mut shard = self.lock_shard(index);
            let (mut topics, mut bytes) = (0, 0);
            shard.retain(|name, topic| {
                let mut state = topic.lock();
                if let Some(log) = &mut state.log {
                    log.expire(now);
                    if recount {
                        log.recount();
                    }
                }
                if state.idle() {
                    state.gone = true;
                    self.generations.forget(index, name, &state);
                    topics += 1;
                    bytes += topic_cost(name);
                    return false;
                }
                true
            });
            self.budget.give(bytes);
            self.kept.fetch_sub(topics, Ordering::Relaxed);
        }
    }
}

/// Tells `subscriber` of a gap (once per gap): its envelope's "not
/// recovered" message, queued even past a full queue.
pub(super) fn tell_gap(subscriber: &mut Subscriber, topic: &str) {
    if subscriber.gap {
        return;
    }
    subscriber.gap = true;
    let signal = subscriber
        .envelope
        .as_ref()
        .and_then(|e| e.recovery(topic, false));
    if let Some(signal) = signal {
        let _ = subscriber
            .conn
            .send_signal(&super::envelope::prepare(&signal));
    }
}
