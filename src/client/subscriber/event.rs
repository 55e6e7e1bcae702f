//! [`Event`]: what a subscriber tells the application.

use std::time::Duration;

use crate::bus::Data;
use crate::pubsub::Position;

/// What a [`Subscriber`](super::Subscriber) tells the application, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A publication, delivered once: never a position twice, and in
    /// order within its topic.
    Delivery {
        /// Its topic.
        topic: String,
        /// Where it sits in the topic.
        position: Position,
        /// Its payload.
        data: Data,
    },
    /// Something published on `topic` was missed and will not come (the
    /// server's history no longer held it, its epoch ended, or this
    /// subscriber read too slowly); deliveries go on from what is live.
    Discontinuity {
        /// The topic.
        topic: String,
    },
    /// Connected (again): the topics are subscribed, resumed where they
    /// had a position.
    Connected,
    /// The connection ended or could not be made; the next attempt comes
    /// after `retry_in`.
    Disconnected {
        /// Why, in a line.
        why: String,
        /// How long until the next attempt.
        retry_in: Duration,
    },
    /// The bus refused a command or a topic (`{"error":...}`).
    Refused {
        /// Its reason.
        why: String,
    },
}
