//! Many nodes: a bridge that relays publishes between server processes
//! through Redis pub/sub (feature `redis`).
//!
//! ```no_run
//! # async fn run() -> Result<(), rapidws::pubsub::redis::BridgeError> {
//! let pubsub = rapidws::pubsub::PubSub::new();
//! // On a tokio runtime: the bridge's task runs there.
//! let bridge = rapidws::pubsub::redis::Bridge::start(&pubsub, "redis://127.0.0.1:6379")?;
//! // Every node's publishes now reach this node's subscribers too.
//! # drop(bridge);
//! # Ok(())
//! # }
//! ```
//!
//! Every publish on a node goes to its own subscribers at once, as without
//! the bridge, and is also handed to the bridge, which publishes it on the
//! Redis channel `rapidws:<topic>` (the prefix is [`Bridge::start_with`]'s
//! to choose). Each node's bridge listens to `rapidws:*` and publishes what
//! other nodes sent to its own subscribers; a message carries the node it
//! came from, so a node never delivers its own publishes twice. The count
//! a publish returns is this node's subscribers.
//!
//! **At most once.** Redis pub/sub keeps nothing: a message published while
//! a node is not connected never reaches that node, and a message a node
//! cannot hand to Redis (Redis gone, or the bridge's queue of 4096
//! messages full) is dropped and counted in [`BridgeStats::lost`]. Nothing
//! is retried, so nothing arrives twice or out of order from one node.
//!
//! **Redis going away.** Local delivery never stops. The bridge reconnects
//! with backoff (100 ms doubling to 5 s), subscribes again, and counts the
//! reconnects; [`BridgeStats::connected`] says whether it is connected now.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;

use super::{Inner, PubSub, Relay};
use crate::proto::OpCode;

/// Messages waiting for Redis at most; more are lost (and counted).
const QUEUE: usize = 4096;

/// The most messages sent to Redis in one round trip.
const BATCH: usize = 256;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why a bridge could not start.
#[derive(Debug)]
pub enum BridgeError {
    /// The Redis URL is not one the client understands.
    Url(redis::RedisError),
    /// Not called within a tokio runtime.
    NoRuntime,
}

impl std::fmt::Display for BridgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BridgeError::Url(error) => write!(f, "bad Redis URL: {error}"),
            BridgeError::NoRuntime => f.write_str("the Redis bridge needs a tokio runtime"),
        }
    }
}

impl std::error::Error for BridgeError {}

/// Counts since the bridge started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// This node's publishes handed to Redis.
    pub relayed: u64,
    /// Messages from other nodes published here.
    pub received: u64,
    /// This node's publishes that never reached Redis (see the module docs).
    pub lost: u64,
    /// Connections to Redis made after the first.
    pub reconnects: u64,
    /// Connected to Redis now (publishing and subscribed).
    pub connected: bool,
}

/// A running bridge between one [`PubSub`] and Redis. Dropping it stops
/// the bridge: publishes stay local from then on.
pub struct Bridge {
    shared: Arc<Shared>,
    pubsub: PubSub,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What the bridge's task and the publishers share.
struct Shared {
    /// Who this node is, in every message it sends.
    node: [u8; 16],
    prefix: String,
    outbound: mpsc::Sender<Outgoing>,
    relayed: AtomicU64,
    received: AtomicU64,
    lost: AtomicU64,
    reconnects: AtomicU64,
    connected: AtomicBool,
}

/// A publish on its way to Redis: the channel and the encoded message.
struct Outgoing {
    channel: String,
    message: Vec<u8>,
}

impl Relay for Shared {
    fn relay(&self, topic: &str, opcode: OpCode, payload: &[u8]) {
        let message = encode(&self.node, opcode, payload);
        let outgoing = Outgoing {
            channel: format!("{}{topic}", self.prefix),
            message,
        };
        if self.outbound.try_send(outgoing).is_err() {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Bridge {
    /// Starts relaying `pubsub`'s publishes through the Redis server at
    /// `url` (`redis://host:port/`), on channels `rapidws:<topic>`. Returns
    /// at once: the bridge connects, and keeps reconnecting, on its own
    /// task on the current tokio runtime.
    pub fn start(pubsub: &PubSub, url: &str) -> Result<Bridge, BridgeError> {
        Bridge::start_with(pubsub, url, "rapidws:")
    }

    /// [`Bridge::start`] with channels named `<prefix><topic>`: nodes that
    /// share a prefix share their topics.
    pub fn start_with(pubsub: &PubSub, url: &str, prefix: &str) -> Result<Bridge, BridgeError> {
        let client = redis::Client::open(url).map_err(BridgeError::Url)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BridgeError::NoRuntime)?;
        let (outbound, queue) = mpsc::channel(QUEUE);
        let mut node = [0u8; 16];
        crate::proto::fill_random(&mut node);
        let shared = Arc::new(Shared {
            node,
            prefix: prefix.to_owned(),
            outbound,
            relayed: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            connected: AtomicBool::new(false),
        });
        pubsub.set_relay(Some(shared.clone()));
        let run = Run {
            client,
            shared: shared.clone(),
            pubsub: Arc::downgrade(&pubsub.inner),
            queue,
        };
        let task = runtime.spawn(run.forever());
        Ok(Bridge {
            shared,
            pubsub: pubsub.clone(),
            task,
        })
    }

    /// Counts since the bridge started.
    pub fn stats(&self) -> BridgeStats {
        let shared = &self.shared;
        BridgeStats {
            relayed: shared.relayed.load(Ordering::Relaxed),
            received: shared.received.load(Ordering::Relaxed),
            lost: shared.lost.load(Ordering::Relaxed),
            reconnects: shared.reconnects.load(Ordering::Relaxed),
            connected: shared.connected.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.pubsub.set_relay(None);
        self.task.abort();
    }
}

/// The bridge's task.
struct Run {
    client: redis::Client,
    shared: Arc<Shared>,
    /// Weak: a bridge left running does not keep a dropped `PubSub`.
    pubsub: Weak<Inner>,
    queue: mpsc::Receiver<Outgoing>,
}

impl Run {
    /// Connects, relays until the connection fails, waits, and again.
    async fn forever(mut self) {
        let mut backoff = MIN_BACKOFF;
        let mut first = true;
        loop {
            match self.connect().await {
                Ok((publisher, messages)) => {
                    if !first {
                        self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    first = false;
                    backoff = MIN_BACKOFF;
                    self.shared.connected.store(true, Ordering::Relaxed);
                    tracing::info!("pub/sub bridge connected to Redis");
                    let why = self.relay(publisher, messages).await;
                    self.shared.connected.store(false, Ordering::Relaxed);
                    if self.pubsub.strong_count() == 0 {
                        return;
                    }
                    tracing::warn!(%why, "pub/sub bridge lost Redis; reconnecting");
                }
                Err(error) => {
                    tracing::warn!(%error, ?backoff, "pub/sub bridge cannot reach Redis");
                }
            }
            // Local publishes meanwhile cannot reach Redis: counted lost,
            // so that the queue holds nothing stale when Redis is back.
            let wait = tokio::time::sleep(backoff);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    dropped = self.queue.recv() => match dropped {
                        Some(_) => {
                            self.shared.lost.fetch_add(1, Ordering::Relaxed);
                        }
                        None => return,
                    },
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn connect(
        &self,
    ) -> redis::RedisResult<(redis::aio::MultiplexedConnection, redis::aio::PubSubStream)> {
        let mut subscriber = self.client.get_async_pubsub().await?;
        subscriber
            .psubscribe(format!("{}*", escape_pattern(&self.shared.prefix)))
            .await?;
        let publisher = self.client.get_multiplexed_async_connection().await?;
        Ok((publisher, subscriber.into_on_message()))
    }

    /// Relays both ways until something fails; returns what.
    async fn relay(
        &mut self,
        mut publisher: redis::aio::MultiplexedConnection,
        mut messages: redis::aio::PubSubStream,
    ) -> String {
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                taken = self.queue.recv_many(&mut batch, BATCH) => {
                    if taken == 0 {
                        return "the bridge was stopped".into();
                    }
                    let mut pipe = redis::pipe();
                    for Outgoing { channel, message } in &batch {
                        pipe.cmd("PUBLISH").arg(channel).arg(message).ignore();
                    }
                    let sent: redis::RedisResult<()> = pipe.query_async(&mut publisher).await;
                    let n = batch.len() as u64;
                    batch.clear();
                    if let Err(error) = sent {
                        self.shared.lost.fetch_add(n, Ordering::Relaxed);
                        return error.to_string();
                    }
                    self.shared.relayed.fetch_add(n, Ordering::Relaxed);
                }
                message = std::future::poll_fn(|cx| std::pin::Pin::new(&mut messages).poll_next(cx)) => {
                    let Some(message) = message else {
                        return "the subscription ended".into();
                    };
                    self.deliver(&message);
                }
            }
        }
    }

    /// Publishes a message from another node to this node's subscribers.
    fn deliver(&self, message: &redis::Msg) {
        let Some(topic) = message
            .get_channel_name()
            .strip_prefix(self.shared.prefix.as_str())
        else {
            return;
        };
        let Some((node, opcode, payload)) = decode(message.get_payload_bytes()) else {
            tracing::debug!(
                channel = message.get_channel_name(),
                "not a bridge message; ignored"
            );
            return;
        };
        if node == self.shared.node {
            // Our own publish, back from Redis: delivered already.
            return;
        }
        let Some(inner) = self.pubsub.upgrade() else {
            return;
        };
        let pubsub = PubSub { inner };
        if opcode == OpCode::Text && crate::proto::validate_utf8(payload).is_err() {
            tracing::debug!(
                topic,
                "a text message from another node is not UTF-8; ignored"
            );
            return;
        }
        self.shared.received.fetch_add(1, Ordering::Relaxed);
        pubsub.publish_relayed(topic, opcode, payload);
    }
}

/// A message on the wire: the version (1), the node (16 bytes), the kind
/// (`t` or `b`), then the payload.
fn encode(node: &[u8; 16], opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(18 + payload.len());
    message.push(1);
    message.extend_from_slice(node);
    message.push(if opcode == OpCode::Text { b't' } else { b'b' });
    message.extend_from_slice(payload);
    message
}

/// [`encode`] read back; `None` for anything else.
fn decode(message: &[u8]) -> Option<([u8; 16], OpCode, &[u8])> {
    let (&version, rest) = message.split_first()?;
    if version != 1 || rest.len() < 17 {
        return None;
    }
    let (node, rest) = rest.split_at(16);
    let (&kind, payload) = rest.split_first()?;
    let opcode = match kind {
        b't' => OpCode::Text,
        b'b' => OpCode::Binary,
        _ => return None,
    };
    Some((node.try_into().ok()?, opcode, payload))
}

/// `prefix` with the glob characters of a Redis pattern escaped.
fn escape_pattern(prefix: &str) -> String {
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
    fn messages_carry_their_node_and_kind() {
        let node = [7u8; 16];
        for (opcode, payload) in [
            (OpCode::Text, &b"hello"[..]),
            (OpCode::Binary, &[0u8, 255, 1][..]),
            (OpCode::Text, &b""[..]),
        ] {
            let wire = encode(&node, opcode, payload);
            assert_eq!(decode(&wire), Some((node, opcode, payload)));
        }
        assert_eq!(decode(b""), None);
        assert_eq!(decode(&[1; 17]), None, "no kind");
        assert_eq!(decode(&[2; 40]), None, "another version");
        let mut unknown = encode(&node, OpCode::Text, b"x");
        unknown[17] = b'?';
        assert_eq!(decode(&unknown), None);
    }

    #[test]
    fn prefixes_are_escaped_in_patterns() {
        assert_eq!(escape_pattern("rapidws:"), "rapidws:");
        assert_eq!(escape_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
