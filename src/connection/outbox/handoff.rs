//! What a handoff (feature `handoff`, Linux) does with an outbox: what is
//! queued leaves with the connection, or is put back, in wire order.

use super::{Outbox, Waiters};
use crate::pool::BufferPool;
use crate::proto::deflate::Compressor;

impl Outbox {
    /// Whether [`Outbox::hand_off`] would let the connection go now.
    pub(crate) fn may_hand_off(&self) -> bool {
        self.is_open()
            && self
                .rare
                .as_ref()
                .is_none_or(|rare| rare.close_request.is_none())
            && !self.abort
            && self.sending == 0
            && !self.deflate.as_ref().is_some_and(Compressor::keeps_context)
    }

    /// The connection leaves for another process (the handoff): what is
    /// queued, in the order it would have been written (the rest of a
    /// frame begun on the wire first), and the compressor; sends fail from
    /// now on. `None`, changing nothing, if it cannot leave: a close was
    /// asked for or sent, the server gave up on it, a write owns part of
    /// the queue (io_uring), or the compressor keeps its context.
    pub(crate) fn hand_off(
        &mut self,
        pool: &BufferPool,
    ) -> Option<(Vec<u8>, Option<Compressor>, Option<Waiters>)> {
        if !self.may_hand_off() {
            return None;
        }
        let compressor = self.deflate.take();
        let (queued, waiting) = self.give_up(pool);
        Some((queued, compressor, waiting))
    }

    /// Puts what a connection handed over from another process had queued
    /// (see [`Outbox::hand_off`]) at the head of its queue, and its
    /// compressor in place.
    pub(crate) fn take_over(&mut self, queued: &[u8], compressor: Option<Compressor>) {
        if !queued.is_empty() {
            self.queue.push_started(queued);
        }
        self.deflate = compressor;
    }

    /// A write that owned `unsent` (io_uring's) stopped short for a
    /// handoff: its bytes go back to the head of the queue, counting as
    /// started (the first may be the rest of a frame on the wire), ahead
    /// of everything queued since; they are no longer being sent.
    #[cfg(all(target_os = "linux", feature = "handoff", feature = "uring"))]
    pub(crate) fn put_back(&mut self, unsent: &mut crate::proto::WriteQueue, pool: &BufferPool) {
        let n = unsent.len();
        // Everything, in the order it would have gone (what was queued
        // since, replies included, after it), counts as started: nothing
        // queued later overtakes any of it.
        let mut bytes = Vec::with_capacity(n + self.queue.len());
        unsent.move_into(&mut bytes);
        self.queue.move_into(&mut bytes);
        for queue in [unsent, &mut self.queue] {
            if let Some(buf) = queue.take_buffer() {
                pool.give(buf);
            }
        }
        self.queue.push_started(&bytes);
        self.sending = self
            .sending
            .saturating_sub(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// What is queued, in the order it would have been written, and no
    /// more sends: for a connection handed over that its handler refused,
    /// which goes with a last write of these.
    pub(crate) fn give_up(&mut self, pool: &BufferPool) -> (Vec<u8>, Option<Waiters>) {
        let mut queued = Vec::new();
        self.queue.move_into(&mut queued);
        (queued, self.clear(pool))
    }
}
