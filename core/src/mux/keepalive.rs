//! [`Mux`]'s clock: the keepalive's NOPs, its timeouts for a peer that is
//! silent or does not read, and the transport's report that feeds the latter.

use std::time::Instant;

use super::multiplexer::{Control, Mux, give_turn, room};
use super::{MuxError, Version};

impl Mux {
    /// When [`handle_timeout`](Mux::handle_timeout) is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.failed.is_some() {
            return None;
        }
        if self.resumed || self.account.is_shed() {
            // Due now: the keepalive clock restarts, or the session ends.
            return Some(self.last_received.min(self.last_progress));
        }
        let silence = match self.config.keepalive_timeout {
            Some(timeout) if self.wants_input() => self.last_received.checked_add(timeout),
            _ => None,
        };
        let stalled = match self.config.keepalive_timeout {
            Some(timeout) if self.waiting_on_peer => self.last_progress.checked_add(timeout),
            _ => None,
        };
        [self.next_keepalive, silence, stalled]
            .into_iter()
            .flatten()
            .min()
    }

    /// What the transport did with our frames since the last call: whether
    /// it took some (`wrote`) and whether some still wait for it
    /// (`waiting`: it takes no more now). A driver calls it after each
    /// attempt to write. Frames that waited and then went are the peer's
    /// progress; frames taken at once prove nothing (our own NOPs go out
    /// whether the peer reads or not, into the kernel's buffers).
    pub fn handle_transport_write(&mut self, wrote: bool, waiting: bool) {
        self.progressed |= wrote && self.output_waiting;
        self.output_waiting = waiting;
    }

    /// Whether something of ours waits for the peer: frames the transport
    /// has not taken, or (version 2) a stream's data its window holds back.
    fn waits_on_peer(&self) -> bool {
        if self.output_waiting {
            return true;
        }
        if self.version != Some(Version::V2) {
            return false;
        }
        let max_frame = self.config.max_frame_size;
        self.streams
            .values()
            .any(|stream| !stream.send.is_empty() && room(stream, true, max_frame) == 0)
    }

    /// Sends a NOP if its interval passed. Ends the session if the peer
    /// was silent for the keepalive timeout (not counting time in which we
    /// were the ones not reading), or if for as long something of ours
    /// waited for it and it took none of it ([`MuxError::NoProgress`]: a
    /// peer that sends NOPs, or anything else, but never reads what we
    /// send is no more alive than a silent one), or if the session was
    /// shed for the budget ([`MuxError::Budget`]).
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), MuxError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if self.account.is_shed() {
            return Err(self.shed());
        }
        // Progress: the peer took some of what we sent, or nothing of ours
        // waits for it. (Whether we read meanwhile does not matter: a peer
        // that does not read can stall our application, and so our reading.
        // A session stuck both ways is over either way.)
        self.waiting_on_peer = self.waits_on_peer();
        if self.progressed || !self.waiting_on_peer {
            self.progressed = false;
            self.last_progress = now;
        } else if self
            .config
            .keepalive_timeout
            .and_then(|timeout| self.last_progress.checked_add(timeout))
            .is_some_and(|due| now >= due)
        {
            return Err(self.fail(MuxError::NoProgress));
        }
        let due = self.next_keepalive.filter(|next| now >= *next);
        if let (Some(_), Some(interval)) = (due, self.config.keepalive_interval) {
            if !self.control.iter().any(|c| matches!(c, Control::Nop)) {
                self.control.push_back(Control::Nop);
            }
            if self.version == Some(Version::V2) {
                self.give_up_stuck();
            }
            self.next_keepalive = now.checked_add(interval);
        }
        let silent_until = self
            .config
            .keepalive_timeout
            .and_then(|timeout| self.last_received.checked_add(timeout));
        if self.resumed || !self.wants_input() {
            self.resumed = false;
            self.last_received = now;
        } else if silent_until.is_some_and(|due| now >= due) {
            return Err(self.fail(MuxError::KeepaliveTimeout));
        }
        Ok(())
    }

    /// Version 2: streams the application let go of, whose peer has sent
    /// its FIN and has given them no window for what they still have to
    /// send through two keepalive ticks, give up: their data is dropped,
    /// their FIN sent, and they go. (A FIN does not say whether the peer
    /// still reads, smux's `CloseWrite`, or forgot the stream, its
    /// `Close`, after which no window update ever comes: only time tells.)
    fn give_up_stuck(&mut self) {
        let max_frame = self.config.max_frame_size;
        for (&id, stream) in &mut self.streams {
            let stuck = stream.released
                && stream.fin_received
                && !stream.send.is_empty()
                && room(stream, true, max_frame) == 0;
            if !stuck {
                stream.stale = false;
            } else if !stream.stale {
                stream.stale = true;
            } else {
                self.account.release(stream.send.clear());
                give_turn(&mut self.schedule, id, stream);
            }
        }
    }
}
