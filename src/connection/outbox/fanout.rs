//! What pub/sub needs of an outbox (feature `pubsub`): a frame built once
//! for many connections queued by reference, and the topics joined.

#[cfg(feature = "metrics")]
use super::Probe;
use super::{ConnShared, Outbox};
use crate::connection::membership::Memberships;
use crate::proto::{Prepared, Role};

impl Outbox {
    /// Queues a message framed once for many connections (see
    /// `Conn::send_prepared`). A server's plain frame is queued here, in a
    /// few instructions (a fan-out's loop runs this once per subscriber);
    /// a compressor or a client's mask takes the way out of line.
    #[inline]
    pub(crate) fn push_prepared(&mut self, message: &Prepared) {
        if self.deflate.is_some() || self.queue.role() == Role::Client {
            return self.push_prepared_framed(message);
        }
        self.queue
            .push_prepared(message.opcode(), message.frame().clone());
    }

    /// [`Outbox::push_prepared`] with a compressor, or for a client.
    #[inline(never)]
    fn push_prepared_framed(&mut self, message: &Prepared) {
        let opcode = message.opcode();
        if self.queue.role() == Role::Client {
            if !self.push_compressed(opcode, message.payload()) {
                self.queue.push_frame(true, 0, opcode, message.payload());
            }
            return;
        }
        let compressed = self
            .deflate
            .as_ref()
            .and_then(|c| message.compressed_frame(c));
        let frame = compressed.unwrap_or_else(|| message.frame().clone());
        self.queue.push_prepared(opcode, frame);
    }

    /// The message just queued is a sampled delivery of a publish called
    /// at `since`: once it is written, the time it took goes to
    /// `rapidws_pubsub_delivery_seconds` (see `counting.rs`).
    #[cfg(feature = "metrics")]
    pub(crate) fn probe(&mut self, since: std::time::Instant) {
        let ahead = self.queued();
        let probe = &mut self.rare().probe;
        if probe.is_none() {
            *probe = Some(Probe::new(since, ahead));
        }
    }
}

impl ConnShared {
    /// The pub/sub memberships this connection joined.
    pub(crate) fn memberships(&self) -> &Memberships {
        &self.memberships
    }
}
