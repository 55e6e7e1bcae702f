//! The bridge's task: connects, relays both ways, numbers through Redis,
//! closes gaps from the streams, and reconnects. One [`Run`] owns the
//! connection and this node's recorded publishes on their way; its work is
//! split by job:
//!
//! | file | concern |
//! |---|---|
//! | `connect.rs` | connecting, the loop that relays both ways until the connection fails, reconnecting with backoff |
//! | `outgoing.rs` | this node's publishes to Redis, a batch per round trip, and what could not be sent |
//! | `incoming.rs` | a message from Redis checked and delivered here, at its position |
//! | `catch_up.rs` | what a topic missed read from its stream: after a reconnect, a gap, a resubscribe, a resume |
//! | `cluster.rs` | on a Redis Cluster: subscribed to the topics with subscribers here, each on its shard |
//! | `counts.rs` | this node's subscriber counts written to Redis, and every node's read back |
//! | `members.rs` | this node's members of topics written to Redis and renewed, and every node's read back |

mod catch_up;
mod cluster;
mod connect;
mod counts;
mod incoming;
mod members;
mod outgoing;

pub(super) use catch_up::load;
pub(super) use counts::occupancy;
pub(super) use members::members;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::shared::{Outgoing, Shared};
use crate::connection::conn::Conn;
use crate::pubsub::relay::Reply;
use crate::pubsub::{Inner, Position, PubSub, Published};

/// The most topics read in one round trip when catching up.
const CATCH_UP: usize = 256;

/// How often a node writes its subscriber counts to Redis (each good for
/// three times as long: a node that died drops out of the totals within
/// that).
pub(super) const COUNTS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A recorded publish of this node that its sender waits for, or that
/// must leave one connection out: until it comes back from Redis.
struct Waiter {
    except: Option<Conn>,
    reply: Option<Reply>,
    /// Where Redis put it, once its script answered.
    position: Option<Position>,
}

impl Waiter {
    /// Tells the sender it was not delivered here (yet): its position if
    /// Redis gave one, and no subscribers.
    fn give_up(self) {
        if let Some(reply) = self.reply {
            reply(Published {
                subscribers: 0,
                position: self.position,
            });
        }
    }
}

pub(super) struct Run {
    shared: Arc<Shared>,
    /// Weak: a bridge left running does not keep a dropped `PubSub`.
    pubsub: Weak<Inner>,
    queue: mpsc::Receiver<Outgoing>,
    /// This node's recorded publishes on their way, by count.
    waiting: BTreeMap<u64, Waiter>,
    /// On a cluster: a shard was lost, so subscriptions may be missing.
    resync: bool,
}

impl Run {
    pub(super) fn new(
        shared: Arc<Shared>,
        pubsub: &PubSub,
        queue: mpsc::Receiver<Outgoing>,
    ) -> Run {
        Run {
            shared,
            pubsub: Arc::downgrade(&pubsub.inner),
            queue,
            waiting: BTreeMap::new(),
            resync: false,
        }
    }

    fn pubsub(&self) -> Option<PubSub> {
        self.pubsub.upgrade().map(|inner| PubSub { inner })
    }
}

/// Redis did not answer within `timeout`.
fn timed_out(timeout: std::time::Duration) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {timeout:?}"),
    ))
}
