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
//! cannot hand to Redis (Redis gone or too slow, or the bridge's queue
//! full: [`Builder::max_queued_bytes`], 16 MiB by default, counting what is
//! in flight) is dropped and counted in [`BridgeStats::lost`]. Nothing is
//! retried, so nothing arrives twice or out of order from one node.
//!
//! **Redis going away.** Local delivery never stops. Connecting and every
//! round trip are bounded in time ([`Builder::timeout`], 2 s by default):
//! a Redis that stops answering (paused, overloaded, a network that drops
//! packets) is treated as gone. The bridge reconnects with backoff (100 ms
//! doubling to 5 s), subscribes again, and counts the reconnects;
//! [`BridgeStats::connected`] says whether it is connected now.
//!
//! **Redis is not trusted.** What arrives from Redis is checked as a peer's
//! message would be: a message longer than the node's limit
//! ([`Builder::max_message_size`]), text that is not UTF-8, or anything not
//! in the bridge's format is refused and counted
//! ([`BridgeStats::refused`]), never delivered. Each message carries its
//! node's random id and a count that only grows; with a secret the nodes
//! share ([`Builder::secret`]), each also carries an HMAC-SHA256 over its
//! channel and contents. Then a party that can publish to Redis but does
//! not know the secret cannot make a node deliver anything: not a message
//! of its own, not one that claims another node's id (which would have that
//! node skip it as its own), not a message moved to another channel, and
//! not a replay of a real one (its count is not above the last one seen
//! from that node). It can still keep messages from arriving (delete,
//! delay, or disconnect subscribers, as anyone who controls Redis can:
//! Redis closes a subscriber whose output buffer passes
//! `client-output-buffer-limit pubsub`, 32 MiB by default, so a flood of
//! large messages on the channels costs every node what was published
//! meanwhile, counted as a reconnect), and it can read what is published
//! (the MAC authenticates; it does not encrypt). Without a secret the
//! node id is only a label: whoever can publish to Redis can make nodes
//! deliver anything within their limits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_core::Stream;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::mpsc;

use super::{Inner, PubSub, Relay};
use crate::proto::OpCode;

/// Messages waiting for Redis at most (besides the bound in bytes); more
/// are lost (and counted).
const QUEUE: usize = 4096;

/// The most messages sent to Redis in one round trip.
const BATCH: usize = 256;

/// The most nodes whose last count is remembered (to refuse replays);
/// the oldest is forgotten past it.
const NODES: usize = 4096;

/// An HMAC-SHA256 tag's length.
const TAG: usize = 32;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why a bridge could not start.
#[derive(Debug)]
pub enum BridgeError {
    /// The Redis URL is not one the client understands.
    Url(redis::RedisError),
    /// Not called within a tokio runtime.
    NoRuntime,
    /// The `PubSub` has a running bridge already: drop it first (two
    /// bridges on one `PubSub` would deliver every other node's message
    /// twice).
    Running,
}

impl std::fmt::Display for BridgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BridgeError::Url(error) => write!(f, "bad Redis URL: {error}"),
            BridgeError::NoRuntime => f.write_str(
                "the Redis bridge needs a tokio runtime: start it inside one (Runtime::enter)",
            ),
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
    /// This node's publishes handed to Redis.
    pub relayed: u64,
    /// Messages from other nodes published here.
    pub received: u64,
    /// This node's publishes that never reached Redis (see the module docs).
    pub lost: u64,
    /// Messages from Redis refused: too long, not UTF-8 text, not in the
    /// bridge's format, a bad or missing MAC (with a secret), or a replay.
    pub refused: u64,
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
    /// This node's messages so far: the count each carries.
    sent: AtomicU64,
    settings: Builder,
    outbound: mpsc::Sender<Outgoing>,
    /// The bytes of the messages queued or in flight to Redis.
    queued_bytes: AtomicUsize,
    relayed: AtomicU64,
    received: AtomicU64,
    lost: AtomicU64,
    refused: AtomicU64,
    reconnects: AtomicU64,
    connected: AtomicBool,
}

/// A publish on its way to Redis: the channel and the encoded message.
struct Outgoing {
    channel: String,
    message: Vec<u8>,
    /// What it counts for in `Shared::queued_bytes`.
    bytes: usize,
}

impl Relay for Shared {
    fn relay(&self, topic: &str, key: Option<&str>, opcode: OpCode, payload: &[u8]) {
        let Ok(key_len) = u16::try_from(key.map_or(0, str::len)) else {
            // A key over 64 KiB is not carried: relayed keyless.
            return self.relay(topic, None, opcode, payload);
        };
        let channel = format!("{}{topic}", self.settings.prefix);
        let bytes = channel.len() + usize::from(key_len) + payload.len() + HEADER + TAG;
        let queued = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if queued + bytes > self.settings.max_queued_bytes {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let count = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        let message = encode(
            &self.node,
            count,
            key,
            opcode,
            payload,
            &channel,
            self.settings.secret.as_deref(),
        );
        let outgoing = Outgoing {
            channel,
            message,
            bytes,
        };
        if self.outbound.try_send(outgoing).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How a [`Bridge`] is set up: [`Bridge::builder`].
#[derive(Clone)]
pub struct Builder {
    url: String,
    prefix: String,
    secret: Option<Vec<u8>>,
    max_message_size: usize,
    max_queued_bytes: usize,
    timeout: Duration,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("secret", &self.secret.as_ref().map(|_| "…"))
            .field("max_message_size", &self.max_message_size)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Builder {
    /// Channels are named `<prefix><topic>` (default `rapidws:`): nodes
    /// that share a prefix share their topics.
    pub fn prefix(mut self, prefix: &str) -> Builder {
        self.prefix = prefix.to_owned();
        self
    }

    /// A secret every node of the cluster shares (any length; 32 random
    /// bytes is plenty): each message is signed with it, and only messages
    /// signed with it are delivered. See "Redis is not trusted" in the
    /// module docs.
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

    /// Starts relaying `pubsub`'s publishes. Returns at once: the bridge
    /// connects, and keeps reconnecting, on its own task on the current
    /// tokio runtime.
    pub fn start(self, pubsub: &PubSub) -> Result<Bridge, BridgeError> {
        let client = redis::Client::open(self.url.as_str()).map_err(BridgeError::Url)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BridgeError::NoRuntime)?;
        let (outbound, queue) = mpsc::channel(QUEUE);
        let mut node = [0u8; 16];
        crate::proto::fill_random(&mut node);
        let shared = Arc::new(Shared {
            node,
            sent: AtomicU64::new(0),
            settings: self,
            outbound,
            queued_bytes: AtomicUsize::new(0),
            relayed: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            connected: AtomicBool::new(false),
        });
        let relay: Arc<dyn Relay> = shared.clone();
        if !pubsub.set_relay_if_none(relay.clone()) {
            return Err(BridgeError::Running);
        }
        let run = Run {
            client,
            shared: shared.clone(),
            pubsub: Arc::downgrade(&pubsub.inner),
            queue,
            last_seen: Default::default(),
        };
        let task = runtime.spawn(run.forever());
        Ok(Bridge {
            shared,
            relay,
            pubsub: pubsub.clone(),
            task,
        })
    }
}

impl Bridge {
    /// A bridge through the Redis server at `url` (`redis://host:port/`),
    /// to set up and start.
    pub fn builder(url: &str) -> Builder {
        Builder {
            url: url.to_owned(),
            prefix: "rapidws:".to_owned(),
            secret: None,
            max_message_size: 16 << 20,
            max_queued_bytes: 16 << 20,
            timeout: Duration::from_secs(2),
        }
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

    /// Counts since the bridge started.
    pub fn stats(&self) -> BridgeStats {
        let shared = &self.shared;
        BridgeStats {
            relayed: shared.relayed.load(Ordering::Relaxed),
            received: shared.received.load(Ordering::Relaxed),
            lost: shared.lost.load(Ordering::Relaxed),
            refused: shared.refused.load(Ordering::Relaxed),
            reconnects: shared.reconnects.load(Ordering::Relaxed),
            connected: shared.connected.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Only this bridge's relay: never one that came after it.
        self.pubsub.clear_relay_if(&self.relay);
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
    /// The last count seen from each node (at most `NODES`), and when, to
    /// refuse replays.
    last_seen: HashMap<[u8; 16], (u64, u64)>,
}

impl Run {
    /// Connects, relays until the connection fails, waits, and again.
    async fn forever(mut self) {
        let mut backoff = MIN_BACKOFF;
        let mut first = true;
        loop {
            let timeout = self.shared.settings.timeout;
            let connected = match tokio::time::timeout(timeout, self.connect()).await {
                Ok(connected) => connected,
                Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                ))),
            };
            match connected {
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
                        Some(outgoing) => self.shared.lose(&[outgoing]),
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
            .psubscribe(format!("{}*", escape_pattern(&self.shared.settings.prefix)))
            .await?;
        let timeout = self.shared.settings.timeout;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let publisher = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
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
                    for Outgoing { channel, message, .. } in &batch {
                        pipe.cmd("PUBLISH").arg(channel).arg(message).ignore();
                    }
                    let timeout = self.shared.settings.timeout;
                    let sent = tokio::time::timeout(timeout, pipe.query_async::<()>(&mut publisher)).await;
                    let bytes: usize = batch.iter().map(|o| o.bytes).sum();
                    let failed = match sent {
                        Ok(Ok(())) => None,
                        Ok(Err(error)) => Some(error.to_string()),
                        Err(_) => Some(format!("Redis did not answer within {timeout:?}")),
                    };
                    if let Some(why) = failed {
                        self.shared.lose(&batch);
                        batch.clear();
                        return why;
                    }
                    self.shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                    self.shared.relayed.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    batch.clear();
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

    /// Publishes a message from another node to this node's subscribers,
    /// if it passes every check (see "Redis is not trusted").
    fn deliver(&mut self, message: &redis::Msg) {
        let channel = message.get_channel_name();
        let Some(topic) = channel.strip_prefix(self.shared.settings.prefix.as_str()) else {
            return;
        };
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let refused = |why: &str| {
            tracing::debug!(channel, why, "a message from Redis refused");
            shared.refused.fetch_add(1, Ordering::Relaxed);
        };
        let bytes = message.get_payload_bytes();
        if bytes.len() > settings.max_message_size + HEADER + TAG {
            return refused("longer than the node's message size limit");
        }
        let Some(decoded) = decode(bytes, channel, settings.secret.as_deref()) else {
            return refused("not a bridge message, or its MAC does not match");
        };
        if decoded.node == self.shared.node {
            // Our own publish, back from Redis: delivered already.
            return;
        }
        if decoded.payload.len() > settings.max_message_size {
            return refused("longer than the node's message size limit");
        }
        if decoded.opcode == OpCode::Text && crate::proto::validate_utf8(decoded.payload).is_err() {
            return refused("text that is not UTF-8");
        }
        if settings.secret.is_some() && !self.count_is_new(decoded.node, decoded.count) {
            return refused("a replay: its count is not above the last one from its node");
        }
        let Some(inner) = self.pubsub.upgrade() else {
            return;
        };
        self.shared.received.fetch_add(1, Ordering::Relaxed);
        PubSub { inner }.publish_relayed(topic, decoded.key, decoded.opcode, decoded.payload);
    }

    /// Whether `count` is above the last one from `node` (and remembers
    /// it). Counts from one node arrive in order (one connection, and
    /// Redis keeps a publisher's order), so anything else is a replay.
    fn count_is_new(&mut self, node: [u8; 16], count: u64) -> bool {
        let tick = self.shared.received.load(Ordering::Relaxed);
        match self.last_seen.get_mut(&node) {
            Some((last, seen)) => {
                if count <= *last {
                    return false;
                }
                (*last, *seen) = (count, tick);
            }
            None => {
                if self.last_seen.len() >= NODES {
                    // Forget the node heard from least recently.
                    let oldest = self
                        .last_seen
                        .iter()
                        .min_by_key(|(_, (_, seen))| *seen)
                        .map(|(node, _)| *node);
                    if let Some(oldest) = oldest {
                        self.last_seen.remove(&oldest);
                    }
                }
                self.last_seen.insert(node, (count, tick));
            }
        }
        true
    }
}

impl Shared {
    /// Counts `batch` lost, and no longer queued.
    fn lose(&self, batch: &[Outgoing]) {
        let bytes: usize = batch.iter().map(|o| o.bytes).sum();
        self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.lost.fetch_add(batch.len() as u64, Ordering::Relaxed);
    }
}

/// A message on the wire, version 2: the version, the node (16 bytes),
/// its count (8 bytes, big-endian), the kind (`t` or `b`, or `T` and `B`
/// with a key: then the key's length, 2 bytes big-endian, and the key),
/// the payload, and with a secret an HMAC-SHA256 tag (32 bytes) over the
/// channel's length (4 bytes), the channel, and everything before the tag.
const HEADER: usize = 1 + 16 + 8 + 1;

fn encode(
    node: &[u8; 16],
    count: u64,
    key: Option<&str>,
    opcode: OpCode,
    payload: &[u8],
    channel: &str,
    secret: Option<&[u8]>,
) -> Vec<u8> {
    let key_len = key.map_or(0, |k| 2 + k.len());
    let mut message = Vec::with_capacity(HEADER + key_len + payload.len() + TAG);
    message.push(2);
    message.extend_from_slice(node);
    message.extend_from_slice(&count.to_be_bytes());
    let text = opcode == OpCode::Text;
    match key {
        None => message.push(if text { b't' } else { b'b' }),
        Some(key) => {
            message.push(if text { b'T' } else { b'B' });
            let len = u16::try_from(key.len()).expect("keys over 64 KiB are not relayed");
            message.extend_from_slice(&len.to_be_bytes());
            message.extend_from_slice(key.as_bytes());
        }
    }
    message.extend_from_slice(payload);
    if let Some(secret) = secret {
        let tag = sign(secret, channel, &message).finalize().into_bytes();
        message.extend_from_slice(&tag);
    }
    message
}

/// A message read back.
#[derive(Debug, PartialEq, Eq)]
struct Decoded<'a> {
    node: [u8; 16],
    count: u64,
    key: Option<&'a str>,
    opcode: OpCode,
    payload: &'a [u8],
}

/// [`encode`] read back (its tag checked with `secret`); `None` for
/// anything else.
fn decode<'a>(message: &'a [u8], channel: &str, secret: Option<&[u8]>) -> Option<Decoded<'a>> {
    let signed = match secret {
        Some(secret) => {
            let at = message.len().checked_sub(TAG)?;
            let (signed, tag) = message.split_at(at);
            sign(secret, channel, signed).verify_slice(tag).ok()?;
            signed
        }
        None => message,
    };
    if signed.len() < HEADER || signed[0] != 2 {
        return None;
    }
    let node = signed[1..17].try_into().ok()?;
    let count = u64::from_be_bytes(signed[17..25].try_into().ok()?);
    let (opcode, keyed) = match signed[25] {
        b't' => (OpCode::Text, false),
        b'b' => (OpCode::Binary, false),
        b'T' => (OpCode::Text, true),
        b'B' => (OpCode::Binary, true),
        _ => return None,
    };
    let rest = &signed[HEADER..];
    let (key, payload) = if keyed {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        let key = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
        (Some(key), &rest[2 + len..])
    } else {
        (None, rest)
    };
    Some(Decoded {
        node,
        count,
        key,
        opcode,
        payload,
    })
}

/// The MAC of a message on `channel`, fed all but its tag.
fn sign(secret: &[u8], channel: &str, signed: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(&(channel.len() as u32).to_be_bytes());
    mac.update(channel.as_bytes());
    mac.update(signed);
    mac
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
    fn messages_carry_their_node_count_and_kind() {
        let node = [7u8; 16];
        for secret in [None, Some(&b"shared"[..])] {
            for (opcode, payload) in [
                (OpCode::Text, &b"hello"[..]),
                (OpCode::Binary, &[0u8, 255, 1][..]),
                (OpCode::Text, &b""[..]),
            ] {
                for key in [None, Some("AAPL"), Some("")] {
                    let wire = encode(&node, 42, key, opcode, payload, "rapidws:t", secret);
                    let want = Decoded {
                        node,
                        count: 42,
                        key,
                        opcode,
                        payload,
                    };
                    assert_eq!(decode(&wire, "rapidws:t", secret), Some(want));
                }
            }
        }
        assert_eq!(decode(b"", "c", None), None);
        assert_eq!(decode(&[2; HEADER - 1], "c", None), None, "too short");
        assert_eq!(decode(&[1; 40], "c", None), None, "version 1");
        let mut unknown = encode(&node, 1, None, OpCode::Text, b"x", "c", None);
        unknown[25] = b'?';
        assert_eq!(decode(&unknown, "c", None), None);
        // A key longer than what follows, and a key that is not UTF-8.
        let mut keyed = encode(&node, 1, Some("k"), OpCode::Text, b"", "c", None);
        keyed[27] = 9;
        assert_eq!(decode(&keyed, "c", None), None);
        let mut keyed = encode(&node, 1, Some("k"), OpCode::Text, b"", "c", None);
        keyed[28] = 0xff;
        assert_eq!(decode(&keyed, "c", None), None);
    }

    #[test]
    fn with_a_secret_only_signed_messages_on_their_channel_pass() {
        let secret = Some(&b"shared"[..]);
        let node = [3u8; 16];
        let signed = encode(
            &node,
            5,
            Some("k"),
            OpCode::Text,
            b"hi",
            "rapidws:a",
            secret,
        );
        assert!(decode(&signed, "rapidws:a", secret).is_some());
        assert_eq!(
            decode(&signed, "rapidws:b", secret),
            None,
            "moved to another channel"
        );
        assert_eq!(
            decode(&signed, "rapidws:a", Some(b"other")),
            None,
            "another secret"
        );
        let unsigned = encode(&node, 5, Some("k"), OpCode::Text, b"hi", "rapidws:a", None);
        assert_eq!(decode(&unsigned, "rapidws:a", secret), None, "not signed");
        for at in 0..signed.len() {
            let mut changed = signed.clone();
            changed[at] ^= 1;
            assert_eq!(
                decode(&changed, "rapidws:a", secret),
                None,
                "byte {at} changed"
            );
        }
        assert_eq!(decode(&signed[..TAG - 1], "rapidws:a", secret), None);
    }

    #[test]
    fn prefixes_are_escaped_in_patterns() {
        assert_eq!(escape_pattern("rapidws:"), "rapidws:");
        assert_eq!(escape_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
