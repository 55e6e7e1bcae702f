//! Topics: subscribe connections, publish a message to all of a topic's
//! subscribers, framed once (feature `pubsub`).
//!
//! ```no_run
//! use rapidws::pubsub::PubSub;
//! use rapidws::{Accept, Conn, Handler, Message, Reject, Request, ServerHandler};
//!
//! struct Chat {
//!     rooms: PubSub,
//! }
//!
//! impl Handler for Chat {
//!     type State = ();
//!
//!     fn on_open(&self, conn: &Conn, _: &mut ()) {
//!         let _ = self.rooms.subscribe(conn, "lobby");
//!     }
//!     fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
//!         // Everyone in the lobby but the sender.
//!         self.rooms.publish_except("lobby", message, conn);
//!     }
//! }
//!
//! impl ServerHandler for Chat {
//!     fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! **Framed once.** A publish frames its message once ([`Prepared`]); every
//! server connection's queue takes a reference to the same bytes. With
//! permessage-deflate, subscribers that compress each message on its own
//! (no server context takeover: rapidws's default) share one compressed
//! frame per distinct set of parameters, made by the first of them to need
//! it. A subscriber that keeps its compression context gets the message
//! uncompressed (RFC 7692 lets any message go uncompressed): its
//! compressed messages depend on what that one connection was sent
//! before, so nothing can be shared with it, and even a frame compressed
//! on its own would leave its peer's window out of step with its own
//! compressor. Measured (`cargo bench --bench deflate -- publish`, 1 KiB
//! JSON-like messages): compressing for such a subscriber costs 2.5 µs of
//! CPU per subscriber per message, against 27 ns for queuing the shared
//! frame (92x), to send 25% of the bytes instead of all of them (a shared
//! frame compressed on its own is 46%). At 10,000 subscribers that is
//! 25 ms of CPU per message; a server that wants the bytes saved should
//! leave server context takeover off (the default), so that its
//! subscribers share one compression.
//!
//! **Fan-out.** A topic's subscribers are kept by the server loop that
//! serves them (a tokio connection group, an io_uring reactor). A publish
//! hands each loop that has subscribers one job, from any thread; the loop
//! runs it at the start of its next turn, queues the message for each of
//! its subscribers, and writes each connection once in that turn, with
//! whatever else was queued for it (many publishes to one subscriber go out
//! in one write). Connections with a task of their own (the stream driver:
//! wss on tokio, hyper and axum upgrades) are sent to from the publishing
//! thread; their queue is the hand-off.
//!
//! **Bounded.** A subscriber whose queue holds `max_outbound_bytes` is not
//! sent the message: by default it is dropped for that subscriber and
//! counted ([`Stats::dropped`]); with [`Overflow::Close`] the subscriber is
//! closed with the given code instead. `Config::slow_consumer` plays no
//! part. The hand-off to a loop is bounded too: while the deliveries
//! waiting for one loop, or being run by it, weigh 16 MiB (their frames,
//! plus 64 bytes each), publishes are not handed to it (but one always
//! is, so a message that large still gets through), and its subscribers
//! miss them (counted in [`Stats::dropped`] under either policy, and not
//! in what `publish` returns). A burst of 100,000 small publishes fits;
//! a loop further behind than that would not deliver them soon anyway.
//! Nothing else a publish makes waits anywhere.
//!
//! **Life.** Subscriptions end with their connection (when it closes, or
//! when its close starts: no message could reach it after that).
//!
//! [`Prepared`]: crate::proto::Prepared

#[cfg(feature = "redis")]
pub mod redis;
mod registry;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::connection::conn::{Conn, SendError};
use crate::connection::membership::Membership;
use crate::connection::wake::ConnWake;
use crate::proto::{CloseCode, Message, MessageKind, OpCode, Prepared, validate_utf8};
use registry::{Local, Registry, Route};

/// The longest topic name, in bytes.
pub const MAX_TOPIC_LEN: usize = 1024;

/// What happens to a published message for a subscriber whose outbound
/// queue is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// That subscriber misses the message; it is counted in
    /// [`Stats::dropped`]. The default: one slow reader costs itself
    /// messages, and nobody else anything.
    #[default]
    Drop,
    /// That subscriber is closed with this code (1008 or 1013, typically),
    /// after what is already queued for it; counted in [`Stats::closed`].
    /// (A message its server loop was too far behind to take is still
    /// missed, not closed for: see "Bounded" in the module docs.)
    Close(CloseCode),
}

/// Why a subscription was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PubSubError {
    /// The topic name is empty.
    EmptyTopic,
    /// The topic name is longer than [`MAX_TOPIC_LEN`] bytes.
    TopicTooLong,
    /// The connection is closing or closed.
    Closed,
}

impl std::fmt::Display for PubSubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PubSubError::EmptyTopic => "empty topic name",
            PubSubError::TopicTooLong => "topic name longer than 1024 bytes",
            PubSubError::Closed => "connection closed",
        })
    }
}

impl std::error::Error for PubSubError {}

/// Counts since the `PubSub` was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Publishes that had at least one subscriber.
    pub published: u64,
    /// Messages queued for a subscriber.
    pub delivered: u64,
    /// Messages a subscriber missed because its queue was full
    /// ([`Overflow::Drop`]), or, under either policy, because its server
    /// loop was too far behind its publishers to take them (see "Bounded"
    /// in the module docs).
    pub dropped: u64,
    /// Subscribers closed because their queue was full
    /// ([`Overflow::Close`]).
    pub closed: u64,
}

/// Where a node's own publishes go besides its subscribers: other nodes
/// (the Redis bridge). Called on the publisher's thread; must not block.
pub(crate) trait Relay: Send + Sync {
    fn relay(&self, topic: &str, opcode: OpCode, payload: &[u8]);
}

/// Topics and their subscribers. Cheap to clone (a handle); share one
/// between the handler, other tasks and threads. See the module docs.
#[derive(Clone, Default)]
pub struct PubSub {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    registry: Registry,
    /// Where this node's own publishes also go (the Redis bridge), if
    /// anywhere.
    relay: RwLock<Option<Arc<dyn Relay>>>,
    overflow: Overflow,
    published: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    closed: AtomicU64,
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSub")
            .field("overflow", &self.inner.overflow)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PubSub {
    /// No topics yet; full subscriber queues drop messages
    /// ([`Overflow::Drop`]).
    pub fn new() -> PubSub {
        PubSub::default()
    }

    /// No topics yet; full subscriber queues are handled by `overflow`.
    pub fn with_overflow(overflow: Overflow) -> PubSub {
        PubSub {
            inner: Arc::new(Inner {
                overflow,
                ..Inner::default()
            }),
        }
    }

    /// Subscribes `conn` to `topic`, from a callback or any thread. Returns
    /// false if it was subscribed already.
    pub fn subscribe(&self, conn: &Conn, topic: &str) -> Result<bool, PubSubError> {
        check_topic(topic)?;
        let (name, added) = self.inner.registry.add(topic, conn);
        if !added {
            return Ok(false);
        }
        // Recorded on the connection after the registry: if the connection
        // has started closing, it ends (or has ended) without this topic
        // in its list, so the registry entry is taken back here.
        match conn.join(&self.membership(), &name) {
            Ok(_) => Ok(true),
            Err(_) => {
                self.inner
                    .registry
                    .remove(topic, conn.key(), &Route::of(conn));
                Err(PubSubError::Closed)
            }
        }
    }

    /// Unsubscribes `conn` from `topic`; false if it was not subscribed.
    pub fn unsubscribe(&self, conn: &Conn, topic: &str) -> bool {
        if !conn.part(&self.membership(), topic) {
            return false;
        }
        self.inner
            .registry
            .remove(topic, conn.key(), &Route::of(conn));
        true
    }

    /// The topics `conn` is subscribed to here, in no particular order.
    pub fn topics(&self, conn: &Conn) -> Vec<Arc<str>> {
        conn.joined(&self.membership())
    }

    /// How many connections are subscribed to `topic` now.
    pub fn subscribers(&self, topic: &str) -> usize {
        self.inner.registry.count(topic)
    }

    /// How many topics have at least one subscriber.
    pub fn topic_count(&self) -> usize {
        self.inner.registry.topics()
    }

    /// Publishes `message` to every subscriber of `topic`, from anywhere (a
    /// callback, another task, another thread). Returns how many
    /// subscribers it was handed to; each gets it in its loop's next turn,
    /// unless its queue is full then (see [`Overflow`]). A publisher's
    /// messages reach each subscriber in the order they were published.
    pub fn publish(&self, topic: &str, message: Message<'_>) -> usize {
        let opcode = data_opcode(message.kind());
        self.relay(topic, opcode, message.as_bytes());
        self.publish_frame(topic, opcode, message.as_bytes(), None)
    }

    /// [`PubSub::publish`] to everyone but `except` (typically the sender).
    pub fn publish_except(&self, topic: &str, message: Message<'_>, except: &Conn) -> usize {
        let opcode = data_opcode(message.kind());
        self.relay(topic, opcode, message.as_bytes());
        self.publish_frame(topic, opcode, message.as_bytes(), Some(except))
    }

    /// [`PubSub::publish`] for a payload given as bytes: text is checked
    /// for UTF-8 ([`SendError::InvalidUtf8`] if it is not).
    pub fn publish_bytes(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
    ) -> Result<usize, SendError> {
        if kind == MessageKind::Text {
            validate_utf8(payload).map_err(|_| SendError::InvalidUtf8)?;
        }
        let opcode = data_opcode(kind);
        self.relay(topic, opcode, payload);
        Ok(self.publish_frame(topic, opcode, payload, None))
    }

    /// Counts since this `PubSub` was made.
    pub fn stats(&self) -> Stats {
        let inner = &self.inner;
        Stats {
            published: inner.published.load(Ordering::Relaxed),
            delivered: inner.delivered.load(Ordering::Relaxed),
            dropped: inner.dropped.load(Ordering::Relaxed),
            closed: inner.closed.load(Ordering::Relaxed),
        }
    }

    /// Hands a publish of this node to the relay, if there is one.
    fn relay(&self, topic: &str, opcode: OpCode, payload: &[u8]) {
        if check_topic(topic).is_err() {
            return; // nobody can be subscribed to it, anywhere
        }
        let relay = self.inner.relay.read().unwrap_or_else(|p| p.into_inner());
        if let Some(relay) = relay.as_ref() {
            relay.relay(topic, opcode, payload);
        }
    }

    /// Sets (or, with `None`, clears) where this node's publishes also go.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn set_relay(&self, relay: Option<Arc<dyn Relay>>) {
        *self.inner.relay.write().unwrap_or_else(|p| p.into_inner()) = relay;
    }

    /// Publishes a message that came from another node: to this node's
    /// subscribers only, never relayed again.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn publish_relayed(&self, topic: &str, opcode: OpCode, payload: &[u8]) -> usize {
        self.publish_frame(topic, opcode, payload, None)
    }

    fn membership(&self) -> Arc<dyn Membership> {
        self.inner.clone()
    }

    fn publish_frame(
        &self,
        topic: &str,
        opcode: OpCode,
        payload: &[u8],
        except: Option<&Conn>,
    ) -> usize {
        let mut targets = Vec::new();
        let mut reached = self.inner.registry.targets(topic, &mut targets);
        if reached == 0 {
            return 0;
        }
        // The sender's key, and its route if it is among the subscribers.
        let mut sender_route = None;
        let except = except.map(|conn| {
            if conn
                .joined(&self.membership())
                .iter()
                .any(|t| **t == *topic)
            {
                reached -= 1;
                sender_route = Some(Route::of(conn));
            }
            conn.key()
        });
        self.inner.published.fetch_add(1, Ordering::Relaxed);
        let message = Arc::new(Prepared::new(opcode, payload));
        let bytes = message.frame().len();
        for local in targets {
            match &local.route {
                Route::Loop(list) => {
                    let list = list.clone();
                    // Counted now, without the lock a delivery may hold:
                    // the publisher never waits.
                    let sender_here = sender_route.as_ref().is_some_and(|r| r.same(&local.route));
                    let missed = local.count().saturating_sub(usize::from(sender_here));
                    let (inner, message) = (self.inner.clone(), message.clone());
                    let job = Box::new(move || inner.deliver(&local, &message, except));
                    if !list.post(job, bytes) {
                        // The loop is far behind its publishers: its
                        // subscribers miss this message, as a full queue's would.
                        reached = reached.saturating_sub(missed);
                        self.inner
                            .dropped
                            .fetch_add(missed as u64, Ordering::Relaxed);
                    }
                }
                Route::Direct => self.inner.deliver(&local, &message, except),
            }
        }
        reached
    }
}

impl Inner {
    /// Queues `message` for `local`'s subscribers (but `except`), on their
    /// loop's thread (or, for `Route::Direct`, the publisher's).
    fn deliver(&self, local: &Local, message: &Prepared, except: Option<usize>) {
        let close_on_full = match self.overflow {
            Overflow::Drop => None,
            Overflow::Close(code) => Some(code),
        };
        let (mut delivered, mut full) = (0u64, 0u64);
        let subscribers = local.lock();
        for conn in &subscribers.conns {
            if Some(conn.key()) == except {
                continue;
            }
            match conn.send_prepared(message, close_on_full) {
                Ok(()) => delivered += 1,
                Err(SendError::QueueFull) => full += 1,
                // Closing: its end takes it off the topic.
                Err(_) => {}
            }
        }
        drop(subscribers);
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        let counter = match self.overflow {
            Overflow::Drop => &self.dropped,
            Overflow::Close(_) => &self.closed,
        };
        counter.fetch_add(full, Ordering::Relaxed);
    }
}

impl Membership for Inner {
    fn leave(&self, key: usize, wake: &ConnWake, names: Vec<Arc<str>>) {
        let route = Route::of_wake(wake);
        for name in names {
            self.registry.remove(&name, key, &route);
        }
    }
}

/// Whether `topic` can be subscribed to: not empty, at most
/// [`MAX_TOPIC_LEN`] bytes. `subscribe` checks the same; call this to check
/// a name before there is a connection (an upgrade's query, say).
pub fn check_topic(topic: &str) -> Result<(), PubSubError> {
    if topic.is_empty() {
        Err(PubSubError::EmptyTopic)
    } else if topic.len() > MAX_TOPIC_LEN {
        Err(PubSubError::TopicTooLong)
    } else {
        Ok(())
    }
}

fn data_opcode(kind: MessageKind) -> OpCode {
    match kind {
        MessageKind::Text => OpCode::Text,
        MessageKind::Binary => OpCode::Binary,
    }
}
