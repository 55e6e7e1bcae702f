//! [`Overflow::Conflate`]: publications that wait for a subscriber whose
//! queue is full, the latest per key, and the flush that sends them once
//! it has room.
//!
//! A publication that does not fit waits in the subscriber's [`Pending`]
//! (a newer one with the same key takes the older one's place in one
//! step), bounded by the connection's queue bound and by the `PubSub`'s
//! budget for all waits: past either, the subscriber misses the
//! publication and is told of the gap, or is closed when the policy says
//! so.
//!
//! [`Overflow::Conflate`]: super::Overflow::Conflate

use std::sync::Arc;

use super::envelope::Publication;
use super::meters::Counts;
use super::pending::Pending;
use super::registry::{Local, Route, Subscriber, tell_gap};
use super::{Inner, Overflow, busy};
use crate::connection::conn::{Conn, SendError};

impl Inner {
    /// One delivery under [`Overflow::Conflate`]: sent if it fits and
    /// nothing waits; else it waits (replacing one with its key), is
    /// dropped, or closes the subscriber.
    pub(super) fn conflate(
        self: &Arc<Self>,
        local: &Arc<Local>,
        subscriber: &mut Subscriber,
        publication: &Arc<Publication>,
        counts: &mut Counts,
    ) {
        let conn = &subscriber.conn;
        // Its frame for this subscriber, made now: it is sent (and counted
        // while it waits) with it.
        let frame = publication.frame(subscriber.envelope.as_ref());
        if subscriber.pending.is_none() {
            match conn.send_prepared(&frame, None) {
                Ok(()) => {
                    counts.delivered += 1;
                    subscriber.gap = false;
                    return;
                }
                Err(SendError::QueueFull) => {}
                Err(_) => {
                    counts.gone += 1;
                    return;
                }
            }
        }
        drop(frame);
        let limit = conn.shared().outbound().max_bytes;
        let waiting = subscriber.pending.is_some();
        let pending = subscriber
            .pending
            .get_or_insert_with(|| Box::new(Pending::new(self.waiting.clone())));
        match pending.replace(publication, limit) {
            // The older value goes; the newer one goes to the end (offsets
            // stay in order).
            Some(true) => {
                pending.gap = true;
                counts.conflated += 1;
            }
            // Larger than what it replaces, past a bound: the older value
            // stays, and the newer is past the bounds as any other.
            Some(false) => self.overflow_keyless(conn, pending, counts),
            None if publication.key().is_some() || waiting => {
                if !pending.push(publication, limit) {
                    self.overflow_keyless(conn, pending, counts);
                }
            }
            None => {
                // Keyless, nothing waiting: the fallback policy.
                self.overflow_keyless(conn, pending, counts);
            }
        }
        if pending.is_empty() {
            // Nothing waits after all (a keyless one was dropped).
            let gap = pending.gap;
            subscriber.pending = None;
            if gap {
                tell_gap(subscriber, publication.topic());
            }
            return;
        }
        if !waiting && self.flush_when_room(local, subscriber.conn.key(), &subscriber.conn) {
            // Room already: flushed once the list's lock is let go.
            counts.flush_now.push(subscriber.conn.key());
        }
    }

    /// A publication that cannot wait: dropped (told as a gap before the
    /// next one sent), or the subscriber closed.
    fn overflow_keyless(&self, conn: &Conn, pending: &mut Pending, counts: &mut Counts) {
        match self.config.overflow {
            Overflow::Conflate { close: Some(code) } => {
                let _ = conn.close(code, "outbound queue full: peer reads too slowly");
                counts.closed += 1;
            }
            _ => {
                counts.dropped += 1;
                pending.gap = true;
            }
        }
    }

    /// Asks for `flush` once `conn`'s queue has room; true if it has room
    /// now (then nothing was asked: the caller flushes, once it holds no
    /// lock of the registry).
    fn flush_when_room(self: &Arc<Self>, local: &Arc<Local>, key: usize, conn: &Conn) -> bool {
        let wake = FlushWake {
            inner: Arc::downgrade(self),
            local: Arc::downgrade(local),
            key,
        };
        conn.when_room(&std::task::Waker::from(Arc::new(wake)))
    }

    /// Sends a conflating subscriber what waits for it, as far as its
    /// queue takes; asks again for what does not fit.
    pub(super) fn flush(self: &Arc<Self>, local: &Arc<Local>, key: usize) {
        // Again while the queue had room by the time the rest would wait.
        while self.flush_once(local, key) {}
    }

    /// One pass of [`Inner::flush`]; true if it should run again at once.
    fn flush_once(self: &Arc<Self>, local: &Arc<Local>, key: usize) -> bool {
        let _busy = busy::Busy::enter();
        let mut counts = Counts::default();
        let mut subscribers = local.lock();
        let Some(subscriber) = subscribers.find(key) else {
            return false; // unsubscribed or ended meanwhile
        };
        let Some(mut pending) = subscriber.pending.take() else {
            return false;
        };
        let conn = subscriber.conn.clone();
        if pending.gap
            && let Some(first) = pending.front()
        {
            // Told where the gap is: before the values that replaced
            // others or followed a dropped one.
            let topic = first.topic().to_owned();
            subscriber.gap = false;
            tell_gap(subscriber, &topic);
            pending.gap = false;
        }
        while let Some(next) = pending.front() {
            match conn.send_prepared(&next.frame(subscriber.envelope.as_ref()), None) {
                Ok(()) => {
                    counts.delivered += 1;
                    subscriber.gap = false;
                    pending.pop_front();
                }
                Err(SendError::QueueFull) => break,
                Err(_) => {
                    counts.gone += pending.len() as u64;
                    while pending.pop_front().is_some() {}
                }
            }
        }
        let again = if pending.is_empty() {
            drop(subscribers);
            false
        } else {
            subscriber.pending = Some(pending);
            drop(subscribers);
            self.flush_when_room(local, key, &conn)
        };
        self.count(counts);
        again
    }
}

/// Wakes a conflating subscriber's flush: on its server loop (a job), or
/// here for a connection with a task of its own.
struct FlushWake {
    inner: std::sync::Weak<Inner>,
    local: std::sync::Weak<Local>,
    key: usize,
}

impl std::task::Wake for FlushWake {
    fn wake(self: Arc<Self>) {
        let (Some(inner), Some(local)) = (self.inner.upgrade(), self.local.upgrade()) else {
            return;
        };
        let key = self.key;
        match &local.route {
            Route::Loop(list) => {
                let job_local = local.clone();
                list.post(Box::new(move || inner.flush(&job_local, key)), 64);
            }
            // Here, unless this thread is inside the registry (a send there
            // can wake it: a close's waiters): then once it is out.
            Route::Direct => busy::later_or_now(move || inner.flush(&local, key)),
        }
    }
}
