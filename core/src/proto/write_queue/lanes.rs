//! What a queue needs once it backs up: segments, the reply lane, and where
//! replies may go.
//!
//! The ordered lane is one run of bytes (segments, then the tail). A reply
//! may go out only at a message boundary that the writer has not passed, and
//! not before the rest of a message the writer has started. Recording every
//! boundary would cost the echo path a push per message; instead a boundary
//! is remembered at least every [`BOUNDARY_EVERY`] bytes, and after every
//! message at least that long. A reply then waits for the message being
//! written and at most [`BOUNDARY_EVERY`] bytes of small ones after it.
//!
//! `started` is how many bytes from the ordered lane's front must go out
//! before the reply lane: the rest of the message being written, up to the
//! next remembered boundary. It is set when a write goes past it into bytes
//! nobody had started, grows while a fragmented message that has started
//! goes on, and is zero when the writer stands on a boundary. When a spill
//! is made for a queue that already holds bytes, they all count as started:
//! nobody knows how far the writer got in them.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

/// A boundary is remembered once this many bytes of the ordered lane have
/// passed the last one.
pub(super) const BOUNDARY_EVERY: usize = 16 * 1024;

/// Where a reply goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// At the end of the ordered lane: it would go out there anyway.
    Ordered,
    /// Into the reply lane, ahead of what has not started.
    Urgent,
}

/// Made on demand by a queue that holds shared payloads, replies, or more
/// than [`BOUNDARY_EVERY`] bytes; dropped once the queue is empty.
#[derive(Debug)]
pub(super) struct Spill {
    /// Segments of the ordered lane before the queue's tail, oldest first.
    pub(super) segments: VecDeque<Bytes>,
    /// The reply lane: whole frames, in the order they were pushed.
    pub(super) urgent: BytesMut,
    /// Where the pongs at the end of `urgent` start, if it ends with pongs
    /// of which nothing has been written: what a newer pong may replace.
    pub(super) pong: Option<usize>,
    /// Bytes from the ordered lane's front that go out before the reply
    /// lane (see the module docs).
    pub(super) started: usize,
    /// Remembered message boundaries, as positions in the ordered lane
    /// counted from when the spill was made, oldest first.
    boundaries: VecDeque<u64>,
    /// The ordered lane's front, counted the same way.
    front: u64,
}

impl Spill {
    /// A spill for a queue whose ordered lane holds `started` bytes, all of
    /// which count as started.
    pub(super) fn new(started: usize) -> Self {
        Spill {
            segments: VecDeque::new(),
            urgent: BytesMut::new(),
            pong: None,
            started,
            boundaries: VecDeque::new(),
            front: 0,
        }
    }

    /// The last boundary, in bytes from the front: the last remembered one
    /// or the end of what has started, whichever is later.
    pub(super) fn last_boundary(&self) -> usize {
        let remembered = self
            .boundaries
            .back()
            .map_or(0, |&at| at.saturating_sub(self.front) as usize);
        remembered.max(self.started)
    }

    /// Remembers a message boundary `at` bytes from the front.
    pub(super) fn mark(&mut self, at: usize) {
        self.boundaries.push_back(self.front + at as u64);
    }

    /// How far from the front the first boundary at or past `min` bytes is;
    /// `ordered` (the lane's end) if none is remembered.
    pub(super) fn boundary_at_or_after(&self, min: usize, ordered: usize) -> usize {
        self.boundaries
            .iter()
            .filter_map(|&at| at.checked_sub(self.front))
            .map(|at| at as usize)
            .find(|&at| at >= min)
            .unwrap_or(ordered)
    }

    /// How far from the front the next boundary is (zero if the front is
    /// on one); `ordered` if none is remembered. Forgets the ones passed.
    pub(super) fn distance_to_next_boundary(&mut self, ordered: usize) -> usize {
        while self.boundaries.front().is_some_and(|&at| at < self.front) {
            self.boundaries.pop_front();
        }
        self.boundaries
            .front()
            .map_or(ordered, |&at| (at - self.front) as usize)
    }

    /// Drops the first `n` bytes of the ordered lane (segments, then `tail`).
    pub(super) fn advance_ordered(&mut self, tail: &mut BytesMut, mut n: usize) {
        self.front += n as u64;
        while n > 0 {
            let Some(front) = self.segments.front_mut() else {
                break;
            };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.segments.pop_front();
        }
        tail.advance(n);
    }

    /// Moves the first `n` bytes of the ordered lane out, as pieces in order
    /// (no copy: the tail's bytes are split off its buffer).
    pub(super) fn take_ordered(
        &mut self,
        tail: &mut BytesMut,
        mut n: usize,
        out: &mut impl FnMut(Bytes),
    ) {
        self.front += n as u64;
        while n > 0 {
            match self.segments.front_mut() {
                Some(front) if front.len() > n => {
                    out(front.split_to(n));
                    return;
                }
                Some(_) => {
                    let whole = self.segments.pop_front().expect("a segment");
                    n -= whole.len();
                    out(whole);
                }
                None => {
                    out(tail.split_to(n).freeze());
                    return;
                }
            }
        }
    }

    /// Drops the first `n` bytes of the reply lane; pongs they reach can no
    /// longer be replaced.
    pub(super) fn advance_urgent(&mut self, n: usize) {
        self.urgent.advance(n);
        self.pong = self.pong.and_then(|at| at.checked_sub(n));
    }
}
