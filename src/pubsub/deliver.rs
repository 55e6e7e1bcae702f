//! A delivery, on the server loop that serves the subscribers it is for
//! (or on the publisher's thread, for connections with a task of their
//! own): the publication queued for each subscriber under the list's
//! lock, by the [`Overflow`] policy, and what became of each counted once
//! at the end.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::envelope::Publication;
use super::meters::{Counts, Sent};
use super::registry::{Local, tell_gap};
use super::{Inner, Overflow, busy};
use crate::connection::conn::Conn;

impl Inner {
    /// Queues `publication` for `local`'s subscribers (but `except`), on
    /// their loop's thread (or, for `Route::Direct`, the publisher's).
    pub(super) fn deliver(
        self: &Arc<Self>,
        local: &Arc<Local>,
        publication: &Arc<Publication>,
        except: Option<usize>,
    ) {
        let (close_on_full, conflate) = match self.config.overflow {
            Overflow::Drop => (None, false),
            Overflow::Close(code) => (Some(code), false),
            Overflow::Conflate { .. } => (None, true),
        };
        let _busy = busy::Busy::enter();
        let offset = publication.position().offset;
        let mut counts = Counts::default();
        // A timed publish: the last subscriber it reached, whose write is
        // timed (a clone only then).
        let sampled = publication.sampled();
        #[cfg_attr(not(feature = "metrics"), allow(unused_mut))]
        let mut timed: Option<Conn> = None;
        let mut subscribers = local.lock();
        if subscribers.is_plain_for(offset, conflate) {
            // The common case, as fast as before positions: one frame for
            // all, nothing to note per subscription.
            for conn in &subscribers.conns {
                if Some(conn.key()) == except {
                    continue;
                }
                let sent = counts.sent(
                    conn.send_prepared(publication.plain(), close_on_full),
                    close_on_full.is_some(),
                );
                #[cfg(feature = "metrics")]
                if sampled.is_some() && sent == Sent::Delivered {
                    timed = Some(conn.clone());
                }
                let _ = sent;
            }
            drop(subscribers);
            probe(timed, sampled);
            self.count(counts);
            return;
        }
        for subscriber in &mut subscribers.list {
            let conn = &subscriber.conn;
            if Some(conn.key()) == except || offset < subscriber.from {
                continue;
            }
            if conflate {
                self.conflate(local, subscriber, publication, &mut counts);
                continue;
            }
            let frame = publication.frame(subscriber.envelope.as_ref());
            let sent = counts.sent(
                conn.send_prepared(&frame, close_on_full),
                close_on_full.is_some(),
            );
            #[cfg(feature = "metrics")]
            if sampled.is_some() && sent == Sent::Delivered {
                timed = Some(conn.clone());
            }
            match sent {
                // Written only when set: most deliveries leave the
                // subscriber's entry (and its cache line) unwritten.
                Sent::Delivered if subscriber.gap => subscriber.gap = false,
                Sent::Dropped => tell_gap(subscriber, publication.topic()),
                _ => {}
            }
        }
        drop(subscribers);
        probe(timed, sampled);
        let flush_now = std::mem::take(&mut counts.flush_now);
        self.count(counts);
        for key in flush_now {
            self.flush(local, key);
        }
    }

    pub(super) fn count(&self, counts: Counts) {
        self.meters.walked(&counts);
        for (counter, n) in [
            (&self.delivered, counts.delivered),
            (&self.dropped, counts.dropped),
            (&self.closed, counts.closed),
            (&self.gone, counts.gone),
            (&self.conflated, counts.conflated),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// Times a sampled publish's delivery on `conn` (the last of a walk it
/// reached: the one that waited for all the others) from `since`, the
/// publish call, to its frame handed to the kernel (feature `metrics`).
/// Set right after the walk: on a server loop nothing is written in
/// between; a connection with a task of its own may have written some of
/// its queue meanwhile, which only makes the time longer.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn probe(conn: Option<Conn>, since: Option<Instant>) {
    #[cfg(feature = "metrics")]
    if let (Some(conn), Some(since)) = (conn, since) {
        conn.shared().lock().probe(since);
    }
}
