//! [`Mux`]'s application side: opening, accepting, reading, writing,
//! finishing and closing streams, and ending the session.

use bytes::Bytes;

use super::buffer::Buffer;
use super::multiplexer::{Control, Mux, give_turn, sendable};
use super::{OpenError, Read, StreamError, Version};

impl Mux {
    /// Opens a stream; its SYN goes out with the next
    /// [`poll_transmit`](Mux::poll_transmit).
    pub fn open(&mut self) -> Result<u32, OpenError> {
        if self.failed.is_some() || self.ending {
            return Err(OpenError::Ended);
        }
        if self.streams.len() >= self.config.max_streams {
            return Err(OpenError::TooManyStreams);
        }
        if self.account.crowding() {
            self.account.refused();
            self.stats.budget_refused += 1;
            return Err(OpenError::Budget);
        }
        let id = loop {
            self.last_id = self.last_id.checked_add(2).ok_or(OpenError::IdsExhausted)?;
            // A peer may have used one of our ids (smux does not check the
            // parity of the ids it is sent): skip it.
            if !self.streams.contains_key(&self.last_id) {
                break self.last_id;
            }
        };
        self.streams.insert(id, self.new_stream());
        self.control.push_back(Control::Syn(id));
        self.stats.opened += 1;
        Ok(id)
    }

    /// The next stream the peer opened, if one waits.
    pub fn accept(&mut self) -> Option<u32> {
        while let Some(id) = self.incoming.pop_front() {
            if self.streams.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Streams waiting in the accept queue.
    pub fn incoming(&self) -> usize {
        self.incoming.len()
    }

    /// Copies received bytes of `id` into `buf`.
    ///
    /// After the session failed, what was received is still read, then
    /// [`StreamError::Ended`] (unless the peer's FIN came first: then
    /// [`Read::End`]).
    pub fn read(&mut self, id: u32, buf: &mut [u8]) -> Result<Read, StreamError> {
        self.take_received(id, |recv| {
            let n = recv.read(buf);
            (n, n)
        })
    }

    /// Takes up to `max` received bytes of `id` as they are, not copied:
    /// the front of one of the stream's blocks (so at most 32 KiB), which
    /// stays allocated while the bytes are held. Otherwise as
    /// [`read`](Mux::read).
    pub fn read_bytes(&mut self, id: u32, max: usize) -> Result<Read<Bytes>, StreamError> {
        self.take_received(id, |recv| {
            let bytes = recv.read_bytes(max);
            let n = bytes.len();
            (bytes, n)
        })
    }

    /// A read of either kind: `take` takes from the stream's receive
    /// buffer (not empty) and says how many bytes it took.
    fn take_received<T>(
        &mut self,
        id: u32,
        take: impl FnOnce(&mut Buffer) -> (T, usize),
    ) -> Result<Read<T>, StreamError> {
        let v2 = self.version == Some(Version::V2);
        let wanted = self.wants_input();
        let stream = self.streams.get_mut(&id).ok_or(StreamError::Unknown)?;
        stream.readable_told = false;
        if stream.recv.is_empty() {
            if stream.fin_received {
                return Ok(Read::End);
            }
            if self.failed.is_some() {
                return Err(StreamError::Ended);
            }
            return Ok(Read::Empty);
        }
        let (taken, n) = take(&mut stream.recv);
        self.buffered -= n;
        self.account.release(n);
        if v2 && self.failed.is_none() && n > 0 {
            let first = stream.consumed == 0;
            stream.consumed = stream.consumed.wrapping_add(n as u32);
            // As smux: on the first read, then every half window.
            let since = stream.consumed.wrapping_sub(stream.announced);
            if (first || since >= self.config.stream_window / 2) && !stream.update_owed {
                stream.update_owed = true;
                self.updates.push_back(id);
            }
        }
        self.note_resumed(wanted);
        Ok(Read::Data(taken))
    }

    /// Queues as much of `data` as the stream's send buffer takes and
    /// returns how much; 0 (for a non-empty `data`) means full: wait for
    /// [`Event::Writable`](super::Event::Writable).
    pub fn write(&mut self, id: u32, data: &[u8]) -> Result<usize, StreamError> {
        self.queue(id, data.len(), |send, n| send.copy(&data[..n]))
    }

    /// Queues as much of `data` as the stream's send buffer takes, not
    /// copied (but for a piece shorter than 8 KiB), and takes it off the
    /// front of `data`; returns how much. What it queues keeps its whole
    /// allocation (with whatever else shares it) alive until it is
    /// written, while the budget counts only the bytes queued. Otherwise
    /// as [`write`](Mux::write); on `Err`, what was taken off `data` is
    /// dropped with the session.
    pub fn write_bytes(&mut self, id: u32, data: &mut Bytes) -> Result<usize, StreamError> {
        self.queue(id, data.len(), |send, n| send.push(data.split_to(n)))
    }

    /// A write of either kind, of `len` bytes: `put` puts the first `n`
    /// of them, as many as there is room for, into the send buffer.
    fn queue(
        &mut self,
        id: u32,
        len: usize,
        put: impl FnOnce(&mut Buffer, usize),
    ) -> Result<usize, StreamError> {
        if self.failed.is_some() {
            return Err(StreamError::Ended);
        }
        if self.account.is_shed() {
            self.shed();
            return Err(StreamError::Ended);
        }
        let stream = self.streams.get_mut(&id).ok_or(StreamError::Unknown)?;
        if stream.fin_wanted || stream.released {
            return Err(StreamError::Finished);
        }
        let room = self.config.send_buffer.saturating_sub(stream.send.len());
        let n = room.min(len);
        if n < len {
            stream.write_blocked = true;
        }
        if n == 0 {
            return Ok(0);
        }
        put(&mut stream.send, n);
        let v2 = self.version != Some(Version::V1);
        if sendable(stream, v2, self.config.max_frame_size) {
            give_turn(&mut self.schedule, id, stream);
        }
        if self.hold(n).is_err() {
            return Err(StreamError::Ended);
        }
        Ok(n)
    }

    /// Ends the stream's write side: a FIN follows what was written (a
    /// half-close: the peer's data is still read).
    pub fn finish(&mut self, id: u32) -> Result<(), StreamError> {
        if self.failed.is_some() {
            return Err(StreamError::Ended);
        }
        let stream = self.streams.get_mut(&id).ok_or(StreamError::Unknown)?;
        if !stream.fin_wanted {
            stream.fin_wanted = true;
            give_turn(&mut self.schedule, id, stream);
        }
        Ok(())
    }

    /// The application is done with the stream: FIN after what was
    /// written (if not sent yet), and what arrives from now on is dropped.
    /// The stream is gone once its FIN is out.
    pub fn close(&mut self, id: u32) {
        let wanted = self.wants_input();
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.released {
            return;
        }
        stream.released = true;
        let unread = stream.recv.clear();
        self.buffered -= unread;
        self.account.release(unread);
        if stream.fin_sent || self.failed.is_some() {
            self.streams.remove(&id);
            self.note_resumed(wanted);
            return;
        }
        stream.fin_wanted = true;
        give_turn(&mut self.schedule, id, stream);
        self.note_resumed(wanted);
    }

    /// Stops taking in streams the peer opens, for an application that can
    /// no longer accept them: those waiting are closed (a FIN each), and a
    /// SYN from now on gets a FIN.
    pub fn refuse_incoming(&mut self) {
        self.refusing = true;
        while let Some(id) = self.incoming.pop_front() {
            self.close(id);
        }
    }

    /// Streams with data or a FIN still to send (some perhaps waiting for
    /// the peer's window): what a clean end waits for.
    pub fn unsent(&self) -> usize {
        self.streams
            .values()
            .filter(|stream| !stream.send.is_empty() || (stream.fin_wanted && !stream.fin_sent))
            .count()
    }

    /// How many bytes of `id` are there to read now.
    pub fn readable(&self, id: u32) -> usize {
        self.streams.get(&id).map_or(0, |stream| stream.recv.len())
    }

    /// Gives a stream a priority: streams of a higher one send before those
    /// of a lower one; streams of the same priority take turns. Default 0.
    pub fn set_priority(&mut self, id: u32, priority: u8) -> Result<(), StreamError> {
        let stream = self.streams.get_mut(&id).ok_or(StreamError::Unknown)?;
        stream.priority = priority;
        Ok(())
    }

    /// Whether the peer's FIN arrived on `id` (it may still have data
    /// unread before it).
    pub fn is_finished_by_peer(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .is_some_and(|stream| stream.fin_received)
    }

    /// Starts ending the session: no new streams either way (a SYN gets a
    /// FIN), every stream not finished yet gets its FIN after its data.
    /// Once [`has_output`](Mux::has_output) is false, the transport can be
    /// shut down: smux has no frame that ends a session.
    pub fn shut_down(&mut self) {
        self.ending = true;
        for (&id, stream) in &mut self.streams {
            if !stream.fin_wanted {
                stream.fin_wanted = true;
                give_turn(&mut self.schedule, id, stream);
            }
        }
    }

    /// Whether [`shut_down`](Mux::shut_down) was called.
    pub fn is_ending(&self) -> bool {
        self.ending
    }
}
