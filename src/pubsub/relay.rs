//! What a `PubSub` hands the Redis bridge, and is handed back: the
//! [`Relay`] its own publishes also go to, and what a publication numbered
//! elsewhere did here ([`Placed`]) or brought with it ([`Loaded`]).

use std::time::Instant;

use super::Published;
use super::history::History;
use crate::connection::conn::Conn;
use crate::proto::OpCode;

/// Where a node's own publishes go besides its subscribers: other nodes
/// (the Redis bridge). Called on the publisher's thread; must not block.
pub(crate) trait Relay: Send + Sync {
    fn relay(&self, outbound: Outbound<'_>) -> Relayed;

    /// A topic got its first subscriber here (`true`) or lost its last
    /// (under the topic's lock: must not block).
    fn occupancy(&self, _topic: &str, _occupied: bool) {}
}

/// A publish of this node, handed to the [`Relay`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Outbound<'a> {
    pub(crate) topic: &'a str,
    pub(crate) key: Option<&'a str>,
    pub(crate) opcode: OpCode,
    pub(crate) payload: &'a [u8],
    /// The topic's history here: on, Redis numbers and keeps it.
    pub(crate) history: History,
    pub(crate) except: Option<&'a Conn>,
    /// Told what became of a recorded publish, once this node has
    /// delivered it (or given up waiting for it).
    pub(crate) reply: Option<Reply>,
}

/// Told what a publish numbered elsewhere did here.
pub(crate) type Reply = Box<dyn FnOnce(Published) + Send>;

/// What the relay did with a publish.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Passed on (or lost on the way, counted there): deliver it here now.
    Sent,
    /// Numbered and kept elsewhere: it comes back to be delivered here
    /// with every other node's, in the order of its position.
    Recorded,
    /// It has history but could not be recorded (Redis gone, or too far
    /// behind): deliver it here now, numbered here, and the topic's
    /// history is broken (see [`Numbering::Lost`]).
    ///
    /// [`Numbering::Lost`]: super::registry::Numbering::Lost
    Unrecorded,
}

/// What became of a publication numbered elsewhere.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
pub(crate) enum Placed {
    Delivered(Published),
    /// At or before the topic's latest here: delivered already.
    Duplicate,
    /// After a gap: the publications after `after` are missing here.
    Missing {
        after: u64,
    },
}

/// A publication read back from elsewhere's history.
#[derive(Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Loaded {
    pub(crate) offset: u64,
    pub(crate) key: Option<String>,
    pub(crate) opcode: OpCode,
    pub(crate) payload: Vec<u8>,
    pub(crate) at: Instant,
}
