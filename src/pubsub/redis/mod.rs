//! Many nodes: a bridge that relays publishes between server processes
//! through Redis (feature `redis`), and keeps topics' history there.
//!
//! ```no_run
//! # fn run() -> Result<(), rapidws::pubsub::redis::BridgeError> {
//! let pubsub = rapidws::pubsub::PubSub::new();
//! let bridge = rapidws::pubsub::redis::Bridge::start(&pubsub, "redis://127.0.0.1:6379")?;
//! // Every node's publishes now reach this node's subscribers too.
//! # drop(bridge);
//! # Ok(())
//! # }
//! ```
//!
//! The bridge runs on a thread of its own (`rapidws-redis`). A publish of
//! a topic without history goes to this node's subscribers at once and is
//! relayed through Redis pub/sub at most once (lost, and counted in
//! [`BridgeStats::lost`], when Redis cannot take it); a topic with history
//! ([`super::Builder::history`]) is numbered and kept by Redis, so that a
//! publication has the same position on every node and a subscriber
//! resumes on any of them ([`Bridge::subscribe_with`]), without gaps or
//! duplicates. Redis going away never stops local delivery: the bridge
//! reconnects with backoff, and a topic published meanwhile gets a new
//! epoch, its subscribers told of the gap. Redis is not trusted: what
//! arrives from it is checked as a peer's message would be, and with a
//! secret ([`Builder::secret`]) every message is signed, and only what a
//! node signed is delivered, once and while fresh. `docs/delivery.md` in the
//! repository has the design, and what a party that can write to Redis
//! can and cannot do.
//!
//! | file | concern |
//! |---|---|
//! | `shared.rs` | what the handle, the relay and the task share; the [`Builder`] |
//! | `run/` | the bridge's task: connects, relays both ways, catches up, counts |
//! | `link.rs` | one Redis server or a Redis Cluster, behind one interface |
//! | `streams.rs` | the scripts: history numbered and kept in Redis Streams, read back and checked |
//! | `wire.rs` | the bridge's message format, signed with the nodes' secret |
//! | `replay.rs` | the last count heard from each node on each topic: a signed message delivered once, while fresh |
//! | `members.rs` | members of topics on every node (for presence): kept in Redis while their node lives |

mod link;
mod members;
mod replay;
mod run;
mod shared;
mod streams;
mod wire;

use shared::Shared;

pub use members::{MAX_MEMBER_BYTES, MAX_MEMBER_ID, MAX_MEMBERS, Member, Members};
pub use shared::{Builder, Occupancy};
/// The bridge's wire format, for the fuzz targets: not part of the API.
#[doc(hidden)]
pub use wire::{Decoded, MAX_OFFSET, Stamp, decode, encode, recorded, seal, unsealed};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::relay::{Relay, Reply};
use super::{History, PubSub, PubSubError, Published, Start, Subscribe, Subscribed};
use crate::connection::conn::Conn;
use crate::proto::{CloseCode, Message};
use crate::pubsub::PublishOptions;
use link::Target;
use run::Run;

/// Messages waiting for Redis at most (besides the bound in bytes); more
/// are lost (and counted).
const QUEUE: usize = 4096;

/// Why a bridge could not start.
#[derive(Debug)]
pub enum BridgeError {
    /// The Redis URL is not one the client understands.
    Url(redis::RedisError),
    /// The bridge's thread could not be started.
    Thread(std::io::Error),
    /// The `PubSub` has a running bridge already: drop it first (two
    /// bridges on one `PubSub` would deliver every other node's message
    /// twice).
    Running,
}

impl std::fmt::Display for BridgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BridgeError::Url(error) => write!(f, "bad Redis URL: {error}"),
            BridgeError::Thread(error) => {
                write!(f, "cannot start the Redis bridge's thread: {error}")
            }
            BridgeError::Running => f.write_str(
                "this PubSub has a running Redis bridge already: drop it before starting another",
            ),
        }
    }
}

impl std::error::Error for BridgeError {}

/// Counts since the bridge started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// This node's publishes of topics without history handed to Redis.
    pub relayed: u64,
    /// This node's publishes of topics with history numbered and kept by
    /// Redis.
    pub recorded: u64,
    /// Messages from other nodes published here.
    pub received: u64,
    /// This node's publishes of topics without history that never reached
    /// Redis (see the module docs).
    pub lost: u64,
    /// This node's publishes of topics with history that Redis could not
    /// record: delivered here only, in an epoch of this node's own.
    pub unrecorded: u64,
    /// Publications read from a stream to close a gap in what this node
    /// heard.
    pub filled: u64,
    /// Messages and stream entries from Redis refused: too long, not UTF-8
    /// text, not in the bridge's format, a bad or missing MAC (with a
    /// secret), or a replay.
    pub refused: u64,
    /// Messages from a Redis Cluster that arrived faster than the bridge
    /// took them and were dropped (a topic with history fills the gap from
    /// its stream when its next publication arrives).
    pub dropped_in: u64,
    /// Connections to Redis made after the first.
    pub reconnects: u64,
    /// Connected to Redis now (publishing and subscribed).
    pub connected: bool,
}

/// A running bridge between one [`PubSub`] and Redis. Dropping it stops
/// the bridge: publishes stay local from then on.
pub struct Bridge {
    shared: Arc<Shared>,
    /// `shared` as the `PubSub` holds it.
    relay: Arc<dyn Relay>,
    pubsub: PubSub,
    /// Dropped to stop the bridge's thread.
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Builder {
    /// Starts relaying `pubsub`'s publishes. Returns at once: the bridge
    /// connects, and keeps reconnecting, on a thread of its own.
    pub fn start(self, pubsub: &PubSub) -> Result<Bridge, BridgeError> {
        match &self.target {
            Target::Single(url) => {
                drop(redis::Client::open(url.as_str()).map_err(BridgeError::Url)?)
            }
            Target::Cluster(nodes) => {
                drop(redis::cluster::ClusterClient::new(nodes.clone()).map_err(BridgeError::Url)?)
            }
        }
        let (outbound, queue) = mpsc::channel(QUEUE);
        let mut node = [0u8; 16];
        crate::proto::fill_random(&mut node);
        let shared = Arc::new(Shared {
            node,
            sent: AtomicU64::new(0),
            replays: Mutex::new(replay::Replays::new(wire::unix_millis())),
            settings: self,
            outbound,
            queued_bytes: AtomicUsize::new(0),
            runtime: OnceLock::new(),
            commands: Mutex::new(None),
            broken: Mutex::new(Vec::new()),
            relayed: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            unrecorded: AtomicU64::new(0),
            filled: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            dropped_in: AtomicU64::new(0),
            changes: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            members: Mutex::new(members::Local::new(&node)),
            members_changed: tokio::sync::Notify::new(),
        });
        let relay: Arc<dyn Relay> = shared.clone();
        if !pubsub.set_relay_if_none(relay.clone()) {
            return Err(BridgeError::Running);
        }
        let run = Run::new(shared.clone(), pubsub, queue);
        let (stop, stopped) = oneshot::channel::<()>();
        let (made, runtime) = std::sync::mpsc::sync_channel(1);
        // The runtime is made, run and dropped on the bridge's thread
        // (dropping one inside another's task is refused).
        let started = std::thread::Builder::new()
            .name("rapidws-redis".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let runtime = match runtime {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = made.send(Err(error));
                        return;
                    }
                };
                let _ = made.send(Ok(runtime.handle().clone()));
                runtime.block_on(async move {
                    tokio::select! {
                        () = run.forever() => {}
                        _ = stopped => {}
                    }
                });
            });
        let runtime = match started {
            Ok(_) => runtime.recv().unwrap_or_else(|_| {
                Err(std::io::Error::other("the bridge's thread ended at once"))
            }),
            Err(error) => Err(error),
        };
        match runtime {
            Ok(runtime) => {
                let _ = shared.runtime.set(runtime);
            }
            Err(error) => {
                pubsub.clear_relay_if(&relay);
                return Err(BridgeError::Thread(error));
            }
        }
        Ok(Bridge {
            shared,
            relay,
            pubsub: pubsub.clone(),
            _stop: stop,
        })
    }
}

/// What [`Bridge::subscribe_with`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subscribing {
    /// Subscribed, from what this node holds.
    Done(Subscribed),
    /// This node is reading the topic's history from Redis first, on the
    /// bridge's thread; the subscription follows (within the bridge's
    /// timeout), with its replay, and the subscriber's envelope tells it
    /// whether it was recovered.
    Loading,
}

/// A publish on its way through Redis: [`Bridge::publish_with`].
#[must_use = "a receipt says nothing until waited for"]
pub struct Receipt {
    ready: Option<Published>,
    waiting: Option<std::sync::mpsc::Receiver<Published>>,
    timeout: Duration,
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipt")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl From<Published> for Receipt {
    /// A receipt for a publish that was not waited for (made without the
    /// bridge): `wait` gives it back.
    fn from(published: Published) -> Receipt {
        Receipt {
            ready: Some(published),
            waiting: None,
            timeout: Duration::ZERO,
        }
    }
}

impl Receipt {
    /// Blocks until this node delivered the publication (or gave up: twice
    /// the bridge's timeout), and says where it sits and how many of this
    /// node's subscribers it was addressed to. `position` is `None` only if
    /// nothing came back in time. Never call it on a server loop's thread
    /// while publishing at a high rate: it waits for a Redis round trip.
    pub fn wait(self) -> Published {
        if let Some(published) = self.ready {
            return published;
        }
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        self.waiting
            .and_then(|waiting| waiting.recv_timeout(self.timeout * 2).ok())
            .unwrap_or(nobody)
    }
}

impl Bridge {
    /// A bridge through the Redis server at `url` (`redis://host:port/`),
    /// to set up and start.
    pub fn builder(url: &str) -> Builder {
        Builder {
            target: Target::Single(url.to_owned()),
            prefix: "rapidws:".to_owned(),
            secret: None,
            max_message_size: 16 << 20,
            max_queued_bytes: 16 << 20,
            timeout: Duration::from_secs(2),
            record_history: true,
        }
    }

    /// A bridge through the Redis Cluster reached at any of `nodes`
    /// (`redis://host:port/`; the rest are found from them), to set up and
    /// start. Publishes go on sharded channels (`SPUBLISH`, Redis 7), each
    /// topic's channel and history on the shard that owns its slot, and a
    /// node subscribes (`SSUBSCRIBE`) only to the topics it has
    /// subscribers for; a shard that is down stops only its own topics.
    pub fn cluster(nodes: &[&str]) -> Builder {
        let mut builder = Bridge::builder("");
        builder.target = Target::Cluster(nodes.iter().map(|n| (*n).to_owned()).collect());
        builder
    }

    /// Starts relaying `pubsub`'s publishes through the Redis server at
    /// `url` (`redis://host:port/`), on channels `rapidws:<topic>`, with
    /// the defaults of [`Bridge::builder`].
    pub fn start(pubsub: &PubSub, url: &str) -> Result<Bridge, BridgeError> {
        Bridge::builder(url).start(pubsub)
    }

    /// [`Bridge::start`] with channels named `<prefix><topic>`: nodes that
    /// share a prefix share their topics.
    pub fn start_with(pubsub: &PubSub, url: &str, prefix: &str) -> Result<Bridge, BridgeError> {
        Bridge::builder(url).prefix(prefix).start(pubsub)
    }

    /// Publishes as [`PubSub::publish_with`] does, and gives a receipt to
    /// learn where Redis put it: for a topic with history, its position
    /// and this node's subscribers once this node delivered it; for any
    /// other, at once. Publish many, then wait for each, to have their
    /// round trips to Redis overlap.
    pub fn publish_with(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Receipt {
        let (tell, waiting) = std::sync::mpsc::sync_channel(1);
        let reply: Reply = Box::new(move |published| {
            let _ = tell.send(published);
        });
        let ready = self
            .pubsub
            .publish_through(topic, message, options, Some(reply));
        Receipt {
            waiting: ready.is_none().then_some(waiting),
            ready,
            timeout: self.shared.settings.timeout,
        }
    }

    /// [`Bridge::publish_with`], waited for on this thread.
    pub fn publish_wait(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Published {
        self.publish_with(topic, message, options).wait()
    }

    /// [`Bridge::publish_with`], awaited.
    pub async fn publish(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Published {
        let (tell, told) = oneshot::channel();
        let reply: Reply = Box::new(move |published| {
            let _ = tell.send(published);
        });
        if let Some(published) = self
            .pubsub
            .publish_through(topic, message, options, Some(reply))
        {
            return published;
        }
        let nobody = Published {
            subscribers: 0,
            position: None,
        };
        let timeout = self.shared.settings.timeout * 2;
        match tokio::time::timeout(timeout, told).await {
            Ok(Ok(published)) => published,
            _ => nobody,
        }
    }

    /// Subscribes as [`PubSub::subscribe_with`] does, but a subscriber
    /// that resumes (or asks for the latest) on a topic whose history this
    /// node does not hold is given Redis's: see [`Subscribing`]. Checks the
    /// topic and the connection first.
    pub fn subscribe_with(
        &self,
        conn: &Conn,
        topic: &str,
        how: &Subscribe,
    ) -> Result<Subscribing, PubSubError> {
        super::check_topic(topic)?;
        let Some((history, load)) = self.missing(topic, how.start) else {
            return self
                .pubsub
                .subscribe_with(conn, topic, how)
                .map(Subscribing::Done);
        };
        // Refused now rather than once Redis answered, when the caller
        // could no longer be told.
        if !self.pubsub.has_room_for(topic) {
            return Err(PubSubError::TooManyTopics);
        }
        let start = how.start;
        let (pubsub, conn, how) = (self.pubsub.clone(), conn.clone(), how.clone());
        let subscribe = move |topic: &str| match pubsub.subscribe_with(&conn, topic, &how) {
            Ok(_) | Err(PubSubError::Closed) => {}
            // Room taken meanwhile: the connection is told by its close.
            Err(error) => {
                let _ = conn.close(CloseCode::TRY_AGAIN_LATER, &error.to_string());
            }
        };
        self.load(topic, start, history, load, subscribe);
        Ok(Subscribing::Loading)
    }

    /// Reads what Redis keeps of `topic` that a subscriber starting at
    /// `start` needs and this node lacks (what [`Bridge::subscribe_with`]
    /// reads first), then calls `then` on the bridge's thread, once Redis
    /// answered or the bridge's timeout passed: `true`. When nothing is
    /// missing (or Redis is away, or the topic keeps no history), `then` is
    /// dropped uncalled and the caller goes on at once: `false`. For a
    /// handler that answers from the history ([`PubSub::kept`]) before it
    /// subscribes, as a Centrifugo recovery does.
    pub fn prepare(&self, topic: &str, start: Start, then: impl FnOnce() + Send + 'static) -> bool {
        match self.missing(topic, start) {
            Some((history, load)) if super::check_topic(topic).is_ok() => {
                self.load(topic, start, history, load, move |_: &str| then());
                true
            }
            _ => false,
        }
    }

    /// What of `topic` this node lacks for a subscriber from `start`, with
    /// the topic's history, when Redis can give it and there is a runtime
    /// to read it on.
    fn missing(&self, topic: &str, start: Start) -> Option<(History, (u64, Option<u64>))> {
        let history = self.pubsub.history(topic);
        let loads = start != Start::Now
            && history.is_on()
            && self.shared.settings.record_history
            && self.shared.connected.load(Ordering::Relaxed)
            && self.shared.runtime.get().is_some();
        if !loads {
            return None;
        }
        Some((history, self.pubsub.missing(topic, start)?))
    }

    /// Reads `topic`'s history from Redis on the bridge's thread (within
    /// its timeout), then calls `then` there.
    fn load(
        &self,
        topic: &str,
        start: Start,
        history: History,
        (after, before): (u64, Option<u64>),
        then: impl FnOnce(&str) + Send + 'static,
    ) {
        let Some(runtime) = self.shared.runtime.get() else {
            return then(topic);
        };
        let (shared, pubsub, topic) = (self.shared.clone(), self.pubsub.clone(), topic.to_owned());
        runtime.spawn(async move {
            let timeout = shared.settings.timeout;
            let count = match start {
                Start::Latest => 1,
                _ => history.max_messages(),
            };
            let load = run::load(&shared, &pubsub, &topic, history, (after, before, count));
            if tokio::time::timeout(timeout, load).await.is_err() {
                tracing::debug!(topic, "history from Redis not read in time");
            }
            then(&topic);
        });
    }

    /// `topic`'s subscribers on every node, and its position in Redis:
    /// see [`Occupancy`]. Asks Redis, and blocks this thread up to the
    /// bridge's timeout; `None` if Redis did not answer.
    pub fn occupancy_wait(&self, topic: &str) -> Option<Occupancy> {
        let runtime = self.shared.runtime.get()?;
        let (tell, told) = std::sync::mpsc::sync_channel(1);
        let (shared, topic) = (self.shared.clone(), topic.to_owned());
        runtime.spawn(async move {
            let _ = tell.send(run::occupancy(&shared, &topic).await);
        });
        told.recv_timeout(self.shared.settings.timeout).ok()?
    }

    /// [`Bridge::occupancy_wait`], awaited.
    pub async fn occupancy(&self, topic: &str) -> Option<Occupancy> {
        let runtime = self.shared.runtime.get()?;
        let (shared, topic) = (self.shared.clone(), topic.to_owned());
        let asked = runtime.spawn(async move { run::occupancy(&shared, &topic).await });
        tokio::time::timeout(self.shared.settings.timeout, asked)
            .await
            .ok()?
            .ok()?
    }

    /// Registers `id` as a member of `topic` on this node, with `data`
    /// (who it is: opaque to the bridge), replacing what `id` had. The
    /// bridge's thread writes it to Redis, where every node reads it
    /// ([`Bridge::members`]), and renews it every 5 s while this node
    /// lives: a node that dies takes its members with it within 15 s. A
    /// member with an id over [`MAX_MEMBER_ID`] or data over
    /// [`MAX_MEMBER_BYTES`] stays on this node only. Never waits for Redis.
    pub fn join_member(&self, topic: &str, id: &str, data: &[u8]) {
        let data = bytes::Bytes::copy_from_slice(data);
        self.shared.members().join(topic, id, data);
        self.shared.members_changed.notify_one();
    }

    /// Takes `id` out of `topic`'s members (on every node, once the
    /// bridge's thread wrote it). Never waits for Redis.
    pub fn leave_member(&self, topic: &str, id: &str) {
        self.shared.members().leave(topic, id);
        self.shared.members_changed.notify_one();
    }

    /// `topic`'s members on every node, given to `then`: on the bridge's
    /// thread once Redis answered, or when the bridge's timeout passed
    /// (then this node's own only, and `everywhere` false); on this thread
    /// at once when Redis is away. Never blocks this thread: for a server
    /// loop's handler, which answers from `then`.
    pub fn members_with(&self, topic: &str, then: impl FnOnce(Members) + Send + 'static) {
        let runtime = self.shared.runtime.get();
        let connected = self.shared.connected.load(Ordering::Relaxed);
        let (Some(runtime), true) = (runtime, connected) else {
            return then(self.members_here(topic));
        };
        let (shared, topic) = (self.shared.clone(), topic.to_owned());
        runtime.spawn(async move {
            let read = run::members(&shared, &topic);
            let read = tokio::time::timeout(shared.settings.timeout, read).await;
            then(members_of(&shared, &topic, read.ok().flatten()));
        });
    }

    /// [`Bridge::members_with`], awaited.
    pub async fn members(&self, topic: &str) -> Members {
        let (tell, told) = oneshot::channel();
        self.members_with(topic, move |members| {
            let _ = tell.send(members);
        });
        // The timeout again, in case the bridge's thread is gone.
        let timeout = self.shared.settings.timeout * 2;
        match tokio::time::timeout(timeout, told).await {
            Ok(Ok(members)) => members,
            _ => self.members_here(topic),
        }
    }

    /// [`Bridge::members_with`], waited for on this thread (up to twice
    /// the bridge's timeout): not on a server loop's thread, which it
    /// would stop for a Redis round trip.
    pub fn members_wait(&self, topic: &str) -> Members {
        let (tell, told) = std::sync::mpsc::sync_channel(1);
        self.members_with(topic, move |members| {
            let _ = tell.send(members);
        });
        told.recv_timeout(self.shared.settings.timeout * 2)
            .unwrap_or_else(|_| self.members_here(topic))
    }

    /// This node's members of `topic` only.
    fn members_here(&self, topic: &str) -> Members {
        members_of(&self.shared, topic, None)
    }

    /// Counts since the bridge started.
    pub fn stats(&self) -> BridgeStats {
        let shared = &self.shared;
        BridgeStats {
            relayed: shared.relayed.load(Ordering::Relaxed),
            recorded: shared.recorded.load(Ordering::Relaxed),
            received: shared.received.load(Ordering::Relaxed),
            lost: shared.lost.load(Ordering::Relaxed),
            unrecorded: shared.unrecorded.load(Ordering::Relaxed),
            filled: shared.filled.load(Ordering::Relaxed),
            refused: shared.refused.load(Ordering::Relaxed),
            dropped_in: shared.dropped_in.load(Ordering::Relaxed),
            reconnects: shared.reconnects.load(Ordering::Relaxed),
            connected: shared.connected.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Only this bridge's relay: never one that came after it. The
        // bridge's thread ends with `_stop`.
        self.pubsub.clear_relay_if(&self.relay);
    }
}

/// What Redis read of `topic` from the other nodes (its entries of this
/// node's are older than this node's own), and this node's own members.
fn members_of(shared: &Shared, topic: &str, read: Option<Vec<(String, Member)>>) -> Members {
    let local = shared.members();
    let everywhere = read.is_some();
    let mut members: Vec<Member> = read
        .into_iter()
        .flatten()
        .filter(|(writer, _)| !local.is_own(writer))
        .map(|(_, member)| member)
        .collect();
    members.extend(local.here(topic));
    Members {
        members,
        everywhere,
    }
}
