//! What an outbox counts for feature `metrics`: the data messages queued,
//! and one sampled pub/sub delivery's time to the wire. Without the
//! feature it counts nothing and takes no bytes.

/// The outbox's count of data messages (a field of `Outbox`; 4 bytes,
/// beside its other small fields).
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(super) struct Counting {
    /// Data messages queued since the driver last took the count.
    messages: u32,
}

/// Without feature `metrics`: nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Default)]
pub(super) struct Counting {}

/// A sampled pub/sub delivery in a connection's queue: when its publish
/// was called, and how many bytes are to be written up to its end. Kept in
/// the outbox's rare state, one at a time per connection (a later sample
/// waits for the next).
#[cfg(feature = "metrics")]
pub(super) struct Probe {
    since: std::time::Instant,
    ahead: usize,
}

/// Without feature `metrics` there are no probes.
#[cfg(not(feature = "metrics"))]
pub(super) enum Probe {}

#[cfg(feature = "metrics")]
impl Counting {
    /// A data message was queued.
    #[inline(always)]
    pub(super) fn count_message(&mut self) {
        self.messages = self.messages.wrapping_add(1);
    }

    /// The data messages queued since the last call.
    pub(super) fn take_messages(&mut self) -> u64 {
        u64::from(std::mem::take(&mut self.messages))
    }
}

#[cfg(feature = "metrics")]
impl Probe {
    /// The message just queued, whose end is `ahead` bytes away, is a
    /// sampled delivery of a publish called at `since`.
    pub(super) fn new(since: std::time::Instant, ahead: usize) -> Self {
        Probe { since, ahead }
    }

    /// `n` bytes were handed to the kernel. True once they complete the
    /// delivery: the time it took went to `rapidws_pubsub_delivery_seconds`,
    /// and the probe is done.
    #[inline]
    pub(super) fn written(&mut self, n: usize) -> bool {
        if self.ahead > n {
            self.ahead -= n;
            return false;
        }
        metrics::histogram!("rapidws_pubsub_delivery_seconds")
            .record(self.since.elapsed().as_secs_f64());
        true
    }
}

#[cfg(not(feature = "metrics"))]
impl Counting {
    #[inline(always)]
    pub(super) fn count_message(&mut self) {}

    #[inline(always)]
    pub(super) fn take_messages(&mut self) -> u64 {
        0
    }
}

#[cfg(not(feature = "metrics"))]
impl Probe {
    #[inline(always)]
    pub(super) fn written(&mut self, _n: usize) -> bool {
        match *self {}
    }
}
