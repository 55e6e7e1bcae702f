//! What the publishers and the bridge's task share: the settings, the
//! relay that takes this node's publishes onto the queue, the topics
//! published unrecorded, the occupancy changes to follow, and this node's
//! members of topics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;

use super::link::{self, Target};
use super::members::Local;
use super::replay::Replays;
use super::{streams, wire};
use crate::connection::conn::Conn;
use crate::pubsub::History;
use crate::pubsub::relay::{Outbound, Relay, Relayed, Reply};

/// The most topics remembered as published here unrecorded (to give them
/// a new epoch when Redis is back); past it, the oldest is forgotten, and
/// a subscriber of it may resume as recovered over what it missed.
pub(super) const BROKEN: usize = 65_536;

/// Occupancy changes waiting for the bridge's task at most.
pub(super) const CHANGES: usize = 65_536;

/// A topic across every node: [`Bridge::occupancy`](super::Bridge::occupancy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Subscribers on every node (each node's count is written every 5 s
    /// and when its first subscriber comes or its last goes, and is
    /// dropped 15 s after its node stopped writing).
    pub subscribers: usize,
    /// Its latest position in Redis; `None` if Redis keeps no history of
    /// it.
    pub position: Option<crate::pubsub::Position>,
}

/// What the bridge's task and the publishers share.
pub(super) struct Shared {
    /// Who this node is, in every message it sends.
    pub(super) node: [u8; 16],
    /// This node's messages so far: the count each carries.
    pub(super) sent: AtomicU64,
    /// The last count heard from each node on each topic, to refuse
    /// replays (with a secret): the task's deliveries and every read of a
    /// stream note what they take.
    pub(super) replays: Mutex<Replays>,
    pub(super) settings: Builder,
    pub(super) outbound: mpsc::Sender<Outgoing>,
    /// The bytes of the messages queued or in flight to Redis.
    pub(super) queued_bytes: AtomicUsize,
    /// The bridge thread's runtime, for loads asked for elsewhere (set
    /// once it runs).
    pub(super) runtime: OnceLock<tokio::runtime::Handle>,
    /// The connection commands go on, while connected, and its scripts.
    pub(super) commands: Mutex<Option<(link::Commands, streams::Scripts)>>,
    /// Topics with history published here while Redis could not record
    /// them: they get a new epoch in Redis when it is back.
    pub(super) broken: Mutex<Vec<String>>,
    pub(super) relayed: AtomicU64,
    pub(super) recorded: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) unrecorded: AtomicU64,
    pub(super) filled: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) reconnects: AtomicU64,
    pub(super) connected: AtomicBool,
    /// Messages from a cluster that did not fit the bridge's queue.
    pub(super) dropped_in: AtomicU64,
    /// On a cluster: topics that got their first subscriber here (true)
    /// or lost their last (false), for the task to (un)subscribe.
    pub(super) changes: Mutex<Vec<(String, bool)>>,
    pub(super) changed: tokio::sync::Notify,
    /// This node's members of topics, and their changes for the task to
    /// write ([`Bridge::join_member`](super::Bridge::join_member)).
    pub(super) members: Mutex<Local>,
    pub(super) members_changed: tokio::sync::Notify,
}

/// A publish on its way to Redis: the channel and the encoded message.
pub(super) struct Outgoing {
    pub(super) channel: String,
    pub(super) message: Vec<u8>,
    /// What it counts for in `Shared::queued_bytes`.
    pub(super) bytes: usize,
    /// Stamped (count, time) and signed: it left for Redis.
    pub(super) sealed: bool,
    /// For a topic with history: how Redis keeps it.
    pub(super) record: Option<Record>,
}

/// A publication of a topic with history, to be numbered by Redis.
pub(super) struct Record {
    pub(super) topic: String,
    pub(super) history: History,
    /// Its node count (what its return from Redis is known by), once
    /// sealed.
    pub(super) count: u64,
    pub(super) except: Option<Conn>,
    pub(super) reply: Option<Reply>,
}

impl Relay for Shared {
    fn relay(&self, outbound: Outbound<'_>) -> Relayed {
        let Outbound {
            topic,
            key,
            opcode,
            payload,
            history,
            except,
            reply,
        } = outbound;
        let record = history.is_on() && self.settings.record_history;
        // A key over 64 KiB is not carried: relayed keyless.
        let key = key.filter(|key| u16::try_from(key.len()).is_ok());
        let refused = || {
            if record {
                self.unrecorded(topic);
                Relayed::Unrecorded
            } else {
                self.lost.fetch_add(1, Ordering::Relaxed);
                Relayed::Sent
            }
        };
        if record && !self.connected.load(Ordering::Relaxed) {
            return refused();
        }
        let channel = self.channel(topic);
        let bytes = channel.len()
            + key.map_or(0, |k| 2 + k.len())
            + payload.len()
            + wire::HEADER
            + wire::TAG;
        let queued = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if queued + bytes > self.settings.max_queued_bytes {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return refused();
        }
        // Stamped and signed by the bridge's task as it leaves (see
        // `wire::seal`).
        let message = wire::unsealed(self.node, (key, opcode, payload));
        let outgoing = Outgoing {
            channel,
            message,
            bytes,
            sealed: false,
            record: record.then(|| Record {
                topic: topic.to_owned(),
                history,
                count: 0,
                except: except.cloned(),
                reply,
            }),
        };
        match self.outbound.try_send(outgoing) {
            Ok(()) if record => Relayed::Recorded,
            Ok(()) => Relayed::Sent,
            Err(_) => {
                self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                refused()
            }
        }
    }

    fn occupancy(&self, topic: &str, occupied: bool) {
        let mut changes = self.changes();
        // Bounded: past it, the periodic rewrite of every count catches
        // up (and a cluster subscribes again to every topic).
        if changes.len() < CHANGES {
            changes.push((topic.to_owned(), occupied));
        }
        drop(changes);
        self.changed.notify_one();
    }
}

impl Shared {
    /// The channel of `topic`: `<prefix><topic>`, or on a cluster
    /// `<prefix>{<topic>}` (in the slot of the topic's history keys).
    pub(super) fn channel(&self, topic: &str) -> String {
        let prefix = &self.settings.prefix;
        match self.settings.target {
            Target::Single(_) => format!("{prefix}{topic}"),
            Target::Cluster(_) => format!("{prefix}{{{topic}}}"),
        }
    }

    /// The topic of a channel; `None` if it is not one of ours.
    pub(super) fn topic_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        let named = channel.strip_prefix(self.settings.prefix.as_str())?;
        match self.settings.target {
            Target::Single(_) => Some(named),
            Target::Cluster(_) => named.strip_prefix('{')?.strip_suffix('}'),
        }
    }

    pub(super) fn members(&self) -> std::sync::MutexGuard<'_, Local> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn changes(&self) -> std::sync::MutexGuard<'_, Vec<(String, bool)>> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What refuses replays, locked.
    pub(super) fn replays(&self) -> std::sync::MutexGuard<'_, Replays> {
        self.replays.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes what a read of `topic`'s stream took as heard: other nodes'
    /// messages (this node's own come back live to the publishes waiting
    /// for them, and are known by those).
    pub(super) fn heard_in_stream(&self, topic: &str, stamps: &[wire::Stamp]) {
        if self.settings.secret.is_none() || stamps.is_empty() {
            return;
        }
        let now = wire::unix_millis();
        let mut replays = self.replays();
        for stamp in stamps.iter().filter(|stamp| stamp.node != self.node) {
            replays.note(topic, *stamp, now);
        }
    }

    pub(super) fn broken(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.broken.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection commands go on and its scripts (a clone: a command
    /// waits on its own copy, not under the lock), while connected.
    pub(super) fn commands(&self) -> Option<(link::Commands, streams::Scripts)> {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn set_commands(&self, commands: Option<(link::Commands, streams::Scripts)>) {
        *self.commands.lock().unwrap_or_else(|p| p.into_inner()) = commands;
    }

    /// Counts a publish of `topic` Redis could not record, and remembers
    /// the topic to give it a new epoch when Redis is back.
    pub(super) fn unrecorded(&self, topic: &str) {
        self.unrecorded.fetch_add(1, Ordering::Relaxed);
        let mut broken = self.broken();
        if broken.iter().any(|t| t == topic) {
            return;
        }
        if broken.len() >= BROKEN {
            broken.remove(0);
        }
        broken.push(topic.to_owned());
    }
}

/// How a [`Bridge`](super::Bridge) is set up: [`Bridge::builder`](super::Bridge::builder).
#[derive(Clone)]
pub struct Builder {
    pub(super) target: Target,
    pub(super) prefix: String,
    pub(super) secret: Option<Vec<u8>>,
    pub(super) max_message_size: usize,
    pub(super) max_queued_bytes: usize,
    pub(super) timeout: Duration,
    pub(super) record_history: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("secret", &self.secret.as_ref().map(|_| "…"))
            .field("max_message_size", &self.max_message_size)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .field("timeout", &self.timeout)
            .field("record_history", &self.record_history)
            .finish()
    }
}

impl Builder {
    /// Channels are named `<prefix><topic>` (default `rapidws:`), and
    /// history keys `<prefix>{<topic>}:m` and `:s`: nodes that share a
    /// prefix share their topics.
    pub fn prefix(mut self, prefix: &str) -> Builder {
        self.prefix = prefix.to_owned();
        self
    }

    /// A secret every node of the cluster shares (any length; 32 random
    /// bytes is plenty): each message is signed with it, and only messages
    /// signed with it are delivered. See the module docs, and "Redis is
    /// not trusted" in `docs/delivery.md` in the repository.
    pub fn secret(mut self, secret: &[u8]) -> Builder {
        self.secret = Some(secret.to_vec());
        self
    }

    /// The longest payload taken from Redis (default 16 MiB, the
    /// connection's default limit): set it to the node's own
    /// `Config::max_message_size`.
    pub fn max_message_size(mut self, bytes: usize) -> Builder {
        self.max_message_size = bytes;
        self
    }

    /// The most bytes of this node's publishes waiting for Redis or in
    /// flight (default 16 MiB); a publish past it is lost (counted).
    pub fn max_queued_bytes(mut self, bytes: usize) -> Builder {
        self.max_queued_bytes = bytes;
        self
    }

    /// How long connecting, subscribing, and each round trip may take
    /// before Redis is taken for gone (default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.timeout = timeout;
        self
    }

    /// Whether topics with history are numbered and kept by Redis
    /// (default true; see the module docs). Off, every node numbers and
    /// keeps its own, and positions differ between nodes.
    pub fn record_history(mut self, on: bool) -> Builder {
        self.record_history = on;
        self
    }
}

/// `prefix` with the glob characters of a Redis pattern escaped.
pub(super) fn escape_pattern(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_escaped_in_patterns() {
        assert_eq!(escape_pattern("rapidws:"), "rapidws:");
        assert_eq!(escape_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
