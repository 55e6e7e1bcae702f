//! What an outbox counts for feature `metrics`: the data messages queued,
//! and one sampled pub/sub delivery's time to the wire. Without the
//! feature it counts nothing and takes no bytes.

/// The outbox's counts (a field of `Outbox`).
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(super) struct Counting {
    /// Data messages queued since the driver last took the count.
    messages: u32,
    /// A sampled pub/sub delivery waiting to be written (see
    /// `Outbox::probe`); boxed, as it is rare.
    probe: Option<Box<Probe>>,
}

/// Without feature `metrics`: nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Default)]
pub(super) struct Counting {}

/// A sampled pub/sub delivery in a connection's queue: when its publish
/// was called, and how many bytes are to be written up to its end.
#[cfg(feature = "metrics")]
struct Probe {
    since: std::time::Instant,
    ahead: usize,
}

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

    /// The message just queued, whose end is `ahead` bytes away, is a
    /// sampled delivery of a publish called at `since`: once those bytes
    /// are written, the time it took goes to
    /// `rapidws_pubsub_delivery_seconds`. One at a time per connection (a
    /// later sample waits for the next).
    pub(super) fn probe(&mut self, since: std::time::Instant, ahead: usize) {
        if self.probe.is_none() {
            self.probe = Some(Box::new(Probe { since, ahead }));
        }
    }

    /// `n` bytes were handed to the kernel: a probe they complete is recorded.
    #[inline]
    pub(super) fn written(&mut self, n: usize) {
        let Some(probe) = self.probe.as_mut() else {
            return;
        };
        if probe.ahead > n {
            probe.ahead -= n;
            return;
        }
        let since = probe.since;
        self.probe = None;
        metrics::histogram!("rapidws_pubsub_delivery_seconds")
            .record(since.elapsed().as_secs_f64());
    }

    /// The connection is over: a waiting probe will never be written.
    pub(super) fn forget_probe(&mut self) {
        self.probe = None;
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

    #[inline(always)]
    pub(super) fn written(&mut self, _n: usize) {}

    #[inline(always)]
    pub(super) fn forget_probe(&mut self) {}
}
