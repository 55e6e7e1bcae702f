//! What pub/sub needs of a `Conn` (feature `pubsub`): frames built once for
//! many connections, signals past a full queue, waiting for room, and the
//! topics joined.

use std::sync::Arc;

use super::{Conn, SendError, Sender};
use crate::connection::membership::Membership;
use crate::proto::{CloseCode, Prepared};

impl Conn {
    /// Tells connections apart across servers (ids are unique only within
    /// one): the address of the shared state, fixed while a handle lives.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Queues a message framed once for many connections (pub/sub): the
    /// shared compressed frame if this connection's compressor can take
    /// one, else the shared plain frame; a client's connection frames it
    /// itself (its frames are masked). When the queue is full the message
    /// is not queued: with `close_on_full` the connection is also asked to
    /// close with that code. `Config::slow_consumer` plays no part.
    #[inline]
    pub(crate) fn send_prepared(
        &self,
        message: &Prepared,
        close_on_full: Option<CloseCode>,
    ) -> Result<(), SendError> {
        let sender = Sender::Published { close_on_full };
        // The frame is queued by reference, or copied into a buffer the
        // queue holds already: a subscriber with nothing queued takes no
        // buffer for it (10,000 subscribers would hold 40 MiB of them).
        self.enqueue_as(sender, None, |outbox| outbox.push_prepared(message))
    }

    /// Whether the queue has room now (below the producers' limit); if
    /// not, `waker` is woken once it has (or the connection takes no more
    /// sends). A conflating subscriber's flush waits this way.
    pub(crate) fn when_room(&self, waker: &std::task::Waker) -> bool {
        let shared = &*self.shared;
        let mut outbox = shared.lock();
        if !outbox.is_open() || outbox.queued() < shared.outbound().producer_limit() {
            return true;
        }
        outbox.wait_for_room(waker);
        false
    }

    /// Queues a pub/sub signal (a subscriber told whether it was kept
    /// whole), even past a full queue: it is small, and at most one is
    /// sent per message delivered or per subscribe, so the queue's bound
    /// still holds within a frame each.
    pub(crate) fn send_signal(&self, message: &Prepared) -> Result<(), SendError> {
        self.enqueue_as(Sender::Signal, None, |outbox| outbox.push_prepared(message))
    }

    /// Records that this connection joined `name` in `membership` (a
    /// pub/sub topic); false if it had already. Refused once the
    /// connection is closing: nothing would reach it.
    pub(crate) fn join(
        &self,
        membership: &Arc<dyn Membership>,
        name: &Arc<str>,
    ) -> Result<bool, SendError> {
        self.shared
            .memberships()
            .join(membership, name, || self.shared.lock().is_open())
            .ok_or(SendError::Closed)
    }

    /// Records that this connection left `name` in `membership`; false if
    /// it was not there.
    pub(crate) fn part(&self, membership: &Arc<dyn Membership>, name: &str) -> bool {
        self.shared.memberships().part(membership, name)
    }

    /// The names this connection joined in `membership`.
    pub(crate) fn joined(&self, membership: &Arc<dyn Membership>) -> Vec<Arc<str>> {
        self.shared.memberships().joined(membership)
    }

    /// Lets go of every topic joined: the connection ended.
    pub(super) fn leave_memberships(&self) {
        for (membership, names) in self.shared.memberships().leave_all() {
            membership.leave(self.key(), self.shared.wake(), names);
        }
    }
}
