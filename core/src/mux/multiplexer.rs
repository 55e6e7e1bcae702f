//! [`Mux`]: one side of an smux session.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::{Buf, BufMut, BytesMut};

use super::frame::{Command, HEADER_LEN, Header, UPD_LEN};
use super::schedule::Schedule;
use super::{
    Config, Event, INITIAL_WINDOW, MuxError, MuxStats, OpenError, Read, Side, StreamError, Version,
};
use crate::budget::{Account, Charge};

/// Control frames owed to the peer (SYNs, refusing FINs) past which the
/// session stops reading its input: a peer that opens streams and never
/// reads our answers is not read either, so nothing grows.
pub(crate) const CONTROL_LIMIT: usize = 1024;

/// A buffer emptied with more capacity than this is given back, so an idle
/// stream holds no buffer at all.
const KEEP_CAPACITY: usize = 4096;

/// A control frame owed to the peer.
#[derive(Clone, Copy, Debug)]
enum Control {
    Syn(u32),
    /// A refused SYN's answer (a FIN for a stream we never took in).
    Refuse(u32),
    Nop,
}

/// One stream's state.
#[derive(Debug, Default)]
struct Stream {
    /// Received, not yet read by the application.
    recv: BytesMut,
    /// Written by the application, not yet framed.
    send: BytesMut,
    /// Version 2, receiving: bytes received in all, bytes the application
    /// read in all, and the latter as last announced in an UPD.
    received: u32,
    consumed: u32,
    announced: u32,
    /// Version 2, sending: payload bytes framed in all, and the peer's
    /// latest consumed count and window.
    written: u32,
    peer_consumed: u32,
    peer_window: u32,
    priority: u8,
    /// The peer's FIN arrived.
    fin_received: bool,
    /// The application finished writing: a FIN follows the data.
    fin_wanted: bool,
    fin_sent: bool,
    /// The application let go of the stream: what arrives is dropped, and
    /// the stream goes once its FIN is out.
    released: bool,
    /// In the schedule (at most once).
    scheduled: bool,
    /// An UPD is owed (it is in `updates`).
    update_owed: bool,
    /// A `Readable` or `Writable` event is out and not yet followed by a
    /// read or a write.
    readable_told: bool,
    /// A write found the send buffer full: tell the writer when it is not.
    write_blocked: bool,
    /// Released, finished by the peer, and without window at the last
    /// keepalive tick (see `give_up_stuck`).
    stale: bool,
}

/// One side of an smux session, sans-I/O: see the module's documentation
/// for the calls and what bounds a peer.
///
/// Call contract, for a driver:
/// 1. after reading from the transport, [`receive`](Mux::receive) with the
///    whole input buffer (it takes what it can and leaves a partial
///    frame), then [`poll_event`](Mux::poll_event) until `None`;
/// 2. while [`wants_input`](Mux::wants_input) is false, read nothing more:
///    the application has [`Config::receive_buffer`] bytes unread (or the
///    peer is not reading our answers);
/// 3. whenever [`has_output`](Mux::has_output), [`transmit`](Mux::transmit)
///    into a buffer and write it out;
/// 4. at [`poll_timeout`](Mux::poll_timeout), [`handle_timeout`](Mux::handle_timeout);
/// 5. after each attempt to write, [`note_transport`](Mux::note_transport):
///    whether the transport took some of our frames and whether some still
///    wait for it (the keepalive's test of a peer that does not read);
/// 6. when the budget's waker ([`set_waker`](Mux::set_waker)) wakes it,
///    [`poll_timeout`](Mux::poll_timeout) is due at once: the session was
///    shed.
///
/// After any of the application's calls, output may be owed (steps 3), and
/// after a [`read`](Mux::read), input may be wanted again (step 2).
#[derive(Debug)]
pub struct Mux {
    side: Side,
    config: Config,
    /// The version spoken; `None` until the peer's first frame if the
    /// configuration leaves it to the peer.
    version: Option<Version>,
    /// The last id this side used (ids go up by 2).
    last_id: u32,
    streams: HashMap<u32, Stream>,
    incoming: VecDeque<u32>,
    events: VecDeque<Event>,
    control: VecDeque<Control>,
    /// Streams owed an UPD.
    updates: VecDeque<u32>,
    schedule: Schedule,
    /// Received bytes not yet read, all streams.
    buffered: usize,
    /// Input was not wanted and is again: the peer's silence meanwhile
    /// was ours, so the keepalive clock restarts at the next timeout call.
    resumed: bool,
    /// Refusals (FINs for SYNs not taken in) owed to the peer.
    refusals: usize,
    /// No more streams are taken in (the application can no longer
    /// accept them): a SYN gets a FIN.
    refusing: bool,
    /// Ending: no new streams either way.
    ending: bool,
    failed: Option<MuxError>,
    stats: MuxStats,
    /// What the session holds (received and unread, written and unsent)
    /// in the budget every session of the configuration shares.
    account: Account,
    last_received: Instant,
    /// The last time the peer showed it takes what we send: a window
    /// update that moves, the transport taking our frames, or nothing of
    /// ours waiting for it (see `handle_timeout`).
    last_progress: Instant,
    /// Progress seen since the last keepalive check.
    progressed: bool,
    /// Some of our frames wait for the transport (the driver says so).
    output_waiting: bool,
    /// At the last check, something of ours waited for the peer.
    waiting_on_peer: bool,
    /// What `receive` left in its input last time.
    unread: usize,
    next_keepalive: Option<Instant>,
}

impl Mux {
    /// A session on `side` with `config` (which must pass
    /// [`Config::check`]), starting at `now`.
    pub fn new(side: Side, config: Config, now: Instant) -> Mux {
        debug_assert!(config.check().is_ok(), "{:?}", config.check());
        Mux {
            side,
            version: config.version,
            last_id: match side {
                Side::Dialer => 1,
                Side::Acceptor => 0,
            },
            streams: HashMap::new(),
            incoming: VecDeque::new(),
            events: VecDeque::new(),
            control: VecDeque::new(),
            updates: VecDeque::new(),
            schedule: Schedule::default(),
            buffered: 0,
            resumed: false,
            refusals: 0,
            refusing: false,
            ending: false,
            failed: None,
            stats: MuxStats::default(),
            account: config.budget.account(),
            last_received: now,
            last_progress: now,
            progressed: false,
            output_waiting: false,
            waiting_on_peer: false,
            unread: 0,
            next_keepalive: config
                .keepalive_interval
                .and_then(|interval| now.checked_add(interval)),
            config,
        }
    }

    /// Which side this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The version spoken, once known.
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the session counted.
    pub fn stats(&self) -> MuxStats {
        self.stats
    }

    /// Streams open (see [`Config::max_streams`] for which count).
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Received bytes the application has not read, all streams.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// What the session holds against its budget ([`Config::budget`]):
    /// received and unread, written and unsent, every stream.
    pub fn held(&self) -> usize {
        self.account.held()
    }

    /// Who to wake when the session is shed for the budget (the driver's
    /// task): it then finds [`poll_timeout`](Mux::poll_timeout) due.
    pub fn set_waker(&self, waker: &std::task::Waker) {
        self.account.set_waker(waker);
    }

    /// Takes `bytes` more held from the budget; `Err` if that shed this
    /// session (it holds the most when the budget went past its limit).
    fn hold(&mut self, bytes: usize) -> Result<(), MuxError> {
        match self.account.charge(bytes) {
            Charge::Shed => Err(self.shed()),
            Charge::Taken | Charge::OverCap => Ok(()),
        }
    }

    /// The session was shed: it ends, and lets go of what it holds.
    fn shed(&mut self) -> MuxError {
        self.fail(MuxError::Budget {
            held: self.account.held_when_shed(),
            limit: self.account.budget().limit(),
        })
    }

    /// Why the session ended, if it did.
    pub fn error(&self) -> Option<MuxError> {
        self.failed
    }

    /// Whether the session ended with an error.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Whether the driver should read more input: false in version 1 while
    /// the application's unread bytes reach the budget, while the peer
    /// owes it reading our answers, and after the session failed.
    ///
    /// Version 2 never stops for the budget: its streams' windows bound
    /// what each may receive, and a session that stopped reading would not
    /// see the window updates its own writers wait for (xtaci/smux does
    /// stop, and two of its version 2 peers echoing to each other can
    /// deadlock that way).
    pub fn wants_input(&self) -> bool {
        self.failed.is_none()
            && (self.buffered < self.config.receive_buffer || self.version != Some(Version::V1))
            && self.refusals < CONTROL_LIMIT
    }

    /// Notes that the application's call may have made input wanted again.
    fn note_resumed(&mut self, wanted_before: bool) {
        if !wanted_before && self.wants_input() {
            self.resumed = true;
        }
    }

    // ---- the peer's side: bytes in ----

    /// Takes every whole frame from `input` (a partial one stays) while
    /// the budget allows, at `now`. An error ends the session: every
    /// stream becomes readable (to see the end), nothing more is sent.
    pub fn receive(&mut self, input: &mut BytesMut, now: Instant) -> Result<(), MuxError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if self.account.is_shed() {
            return Err(self.shed());
        }
        // New bytes since the last call (not a partial frame seen again)
        // show the peer alive.
        if input.len() != self.unread {
            self.last_received = now;
        }
        let result = self.take_frames(input);
        self.unread = input.len();
        result
    }

    fn take_frames(&mut self, input: &mut BytesMut) -> Result<(), MuxError> {
        loop {
            if !self.wants_input() {
                return Ok(());
            }
            let Some(header) = Header::decode(input) else {
                return Ok(());
            };
            let version = match self.version {
                Some(version) => version,
                None => match Version::from_byte(header.version) {
                    Some(version) => {
                        self.version = Some(version);
                        version
                    }
                    None => {
                        return Err(self.fail(MuxError::Frame(super::FrameError::Version {
                            got: header.version,
                            want: Version::V1.byte(),
                        })));
                    }
                },
            };
            let command = match header.check(version.byte(), self.config.max_receive_frame) {
                Ok(command) => command,
                Err(error) => return Err(self.fail(error.into())),
            };
            let length = usize::from(header.length);
            if input.len() < HEADER_LEN + length {
                return Ok(());
            }
            input.advance(HEADER_LEN);
            let result = match command {
                Command::Syn => {
                    self.on_syn(header.stream);
                    Ok(())
                }
                Command::Fin => {
                    self.on_fin(header.stream);
                    Ok(())
                }
                Command::Psh => self.on_data(header.stream, &input[..length]),
                Command::Nop => Ok(()),
                Command::Upd => {
                    let consumed = u32::from_le_bytes(input[..4].try_into().expect("8 bytes"));
                    let window = u32::from_le_bytes(input[4..UPD_LEN].try_into().expect("8 bytes"));
                    self.on_update(header.stream, consumed, window)
                }
            };
            input.advance(length);
            if let Err(error) = result {
                return Err(self.fail(error));
            }
        }
    }

    fn on_syn(&mut self, id: u32) {
        if self.streams.contains_key(&id) {
            // smux ignores a SYN for a stream it has.
            return;
        }
        if id == 0 {
            // Stream 0 is NOP's: never a stream, and not answered either.
            self.stats.refused += 1;
            return;
        }
        // The peer opens streams with its own ids: odd from the dialer, even
        // from the acceptor. One of ours would collide with a stream we
        // open (xtaci/smux does not check; we refuse it).
        let ours = (id % 2 == 1) == (self.side == Side::Dialer);
        let budget_full = self.account.crowding();
        if ours
            || budget_full
            || self.ending
            || self.refusing
            || self.streams.len() >= self.config.max_streams
        {
            self.stats.refused += 1;
            if ours {
                self.stats.wrong_parity += 1;
            } else if budget_full {
                self.stats.budget_refused += 1;
                self.account.refused();
            }
            self.refusals += 1;
            self.control.push_back(Control::Refuse(id));
            return;
        }
        self.streams.insert(id, self.new_stream());
        self.stats.incoming += 1;
        self.incoming.push_back(id);
        self.events.push_back(Event::Incoming);
    }

    fn new_stream(&self) -> Stream {
        Stream {
            peer_window: INITIAL_WINDOW,
            ..Stream::default()
        }
    }

    fn on_fin(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.fin_received {
            return;
        }
        stream.fin_received = true;
        if !stream.released {
            tell_readable(&mut self.events, id, stream);
        }
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
                self.account.release(stream.send.len());
                stream.send = BytesMut::new();
                give_turn(&mut self.schedule, id, stream);
            }
        }
    }

    fn on_data(&mut self, id: u32, payload: &[u8]) -> Result<(), MuxError> {
        let v2 = self.version == Some(Version::V2);
        let window = self.config.stream_window.max(INITIAL_WINDOW);
        let Some(stream) = self
            .streams
            .get_mut(&id)
            .filter(|stream| !stream.released && !stream.fin_received)
        else {
            self.stats.discarded_frames += 1;
            self.stats.discarded_bytes += payload.len() as u64;
            return Ok(());
        };
        let length = payload.len() as u32;
        if v2 {
            let unacknowledged = stream
                .received
                .wrapping_add(length)
                .wrapping_sub(stream.announced);
            if unacknowledged > window {
                return Err(MuxError::Window {
                    stream: id,
                    unacknowledged,
                });
            }
            stream.received = stream.received.wrapping_add(length);
        }
        if payload.is_empty() {
            return Ok(());
        }
        stream.recv.extend_from_slice(payload);
        self.buffered += payload.len();
        tell_readable(&mut self.events, id, stream);
        self.hold(payload.len())
    }

    fn on_update(&mut self, id: u32, consumed: u32, window: u32) -> Result<(), MuxError> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if (stream.written.wrapping_sub(consumed) as i32) < 0 {
            // More consumed than was ever sent (smux's ErrConsumed).
            return Err(MuxError::Update { stream: id });
        }
        if consumed != stream.peer_consumed {
            // The peer read some of what we sent: progress.
            self.progressed = true;
        }
        stream.peer_consumed = consumed;
        stream.peer_window = window;
        if sendable(stream, true, self.config.max_frame_size) {
            give_turn(&mut self.schedule, id, stream);
        }
        Ok(())
    }

    fn fail(&mut self, error: MuxError) -> MuxError {
        if self.failed.is_none() {
            self.failed = Some(error);
            self.control.clear();
            self.refusals = 0;
            self.updates.clear();
            // Nothing more is sent: what waited to be goes. Shed for the
            // budget, what was received goes too (reads then fail, saying
            // why); otherwise it is still read.
            let shed = matches!(error, MuxError::Budget { .. });
            for stream in self.streams.values_mut() {
                stream.send = BytesMut::new();
                if shed {
                    self.buffered -= stream.recv.len();
                    stream.recv = BytesMut::new();
                }
            }
            self.account.release(self.account.held() - self.buffered);
            for (&id, stream) in &mut self.streams {
                if !stream.released {
                    tell_readable(&mut self.events, id, stream);
                    if stream.write_blocked {
                        stream.write_blocked = false;
                        self.events.push_back(Event::Writable(id));
                    }
                }
            }
            if !self.incoming.is_empty() {
                self.events.push_back(Event::Incoming);
            }
        }
        error
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- the application's side ----

    /// Opens a stream; its SYN goes out with the next
    /// [`transmit`](Mux::transmit).
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
        if buf.is_empty() {
            return Ok(Read::Data(0));
        }
        let n = buf.len().min(stream.recv.len());
        buf[..n].copy_from_slice(&stream.recv[..n]);
        stream.recv.advance(n);
        if stream.recv.is_empty() && stream.recv.capacity() > KEEP_CAPACITY {
            stream.recv = BytesMut::new();
        }
        self.buffered -= n;
        self.account.release(n);
        if v2 && self.failed.is_none() {
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
        Ok(Read::Data(n))
    }

    /// Queues as much of `data` as the stream's send buffer takes and
    /// returns how much; 0 (for a non-empty `data`) means full: wait for
    /// [`Event::Writable`].
    pub fn write(&mut self, id: u32, data: &[u8]) -> Result<usize, StreamError> {
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
        let n = room.min(data.len());
        if n < data.len() {
            stream.write_blocked = true;
        }
        if n == 0 {
            return Ok(0);
        }
        stream.send.extend_from_slice(&data[..n]);
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
        self.buffered -= stream.recv.len();
        self.account.release(stream.recv.len());
        stream.recv = BytesMut::new();
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

    // ---- frames out ----

    /// Whether [`transmit`](Mux::transmit) would write anything now.
    pub fn has_output(&self) -> bool {
        self.failed.is_none()
            && self.version.is_some()
            && (!self.control.is_empty() || !self.updates.is_empty() || !self.schedule.is_empty())
    }

    /// Appends frames to `out` until it holds `limit` bytes or nothing is
    /// left to send: control frames first (SYN, refusing FIN, UPD, NOP),
    /// then one data frame per stream in turn, a stream's FIN after its
    /// data. Nothing is sent before the version is known, or after the
    /// session failed.
    pub fn transmit(&mut self, out: &mut BytesMut, limit: usize) {
        let Some(version) = self.version else {
            return;
        };
        if self.failed.is_some() {
            return;
        }
        let version = version.byte();
        while out.len() < limit {
            let Some(control) = self.control.pop_front() else {
                break;
            };
            let (command, id) = match control {
                Control::Syn(id) => (Command::Syn, id),
                Control::Refuse(id) => {
                    self.refusals -= 1;
                    (Command::Fin, id)
                }
                Control::Nop => (Command::Nop, 0),
            };
            put_header(out, version, command, 0, id);
        }
        while out.len() < limit {
            let Some(id) = self.updates.pop_front() else {
                break;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            stream.update_owed = false;
            if stream.released {
                continue;
            }
            stream.announced = stream.consumed;
            put_header(out, version, Command::Upd, UPD_LEN as u16, id);
            out.put_u32_le(stream.consumed);
            out.put_u32_le(self.config.stream_window);
        }
        let v2 = version == Version::V2.byte();
        let max_frame = self.config.max_frame_size;
        while out.len() < limit {
            let Some(id) = self.schedule.pop() else {
                break;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            stream.scheduled = false;
            let n = stream.send.len().min(room(stream, v2, max_frame));
            if n > 0 {
                put_header(out, version, Command::Psh, n as u16, id);
                out.extend_from_slice(&stream.send[..n]);
                stream.send.advance(n);
                self.account.release(n);
                stream.written = stream.written.wrapping_add(n as u32);
                if stream.send.is_empty() && stream.send.capacity() > KEEP_CAPACITY {
                    stream.send = BytesMut::new();
                }
                if stream.write_blocked && stream.send.len() <= self.config.send_buffer / 2 {
                    stream.write_blocked = false;
                    self.events.push_back(Event::Writable(id));
                }
            }
            if stream.send.is_empty() && stream.fin_wanted && !stream.fin_sent {
                put_header(out, version, Command::Fin, 0, id);
                stream.fin_sent = true;
                if stream.released {
                    self.streams.remove(&id);
                    continue;
                }
            }
            if sendable(stream, v2, max_frame) {
                give_turn(&mut self.schedule, id, stream);
            }
        }
    }

    // ---- time ----

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
    pub fn note_transport(&mut self, wrote: bool, waiting: bool) {
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
}

/// Version 2: what the peer's window lets the stream send now (at most a
/// frame); version 1: a frame.
fn room(stream: &Stream, v2: bool, max_frame: u16) -> usize {
    let frame = usize::from(max_frame);
    if !v2 {
        return frame;
    }
    let inflight = stream.written.wrapping_sub(stream.peer_consumed) as i32;
    let window = stream
        .peer_window
        .saturating_sub(inflight.max(0) as u32)
        .min(stream.peer_window);
    frame.min(window as usize)
}

/// Whether the stream has a frame to send now: data the window allows, or
/// its FIN after all its data.
fn sendable(stream: &Stream, v2: bool, max_frame: u16) -> bool {
    if stream.send.is_empty() {
        return stream.fin_wanted && !stream.fin_sent;
    }
    room(stream, v2, max_frame) > 0
}

/// Gives the stream a turn to send, unless it already waits for one.
fn give_turn(schedule: &mut Schedule, id: u32, stream: &mut Stream) {
    if !stream.scheduled {
        stream.scheduled = true;
        schedule.push(id, stream.priority);
    }
}

fn tell_readable(events: &mut VecDeque<Event>, id: u32, stream: &mut Stream) {
    if !stream.readable_told {
        stream.readable_told = true;
        events.push_back(Event::Readable(id));
    }
}

fn put_header(out: &mut BytesMut, version: u8, command: Command, length: u16, stream: u32) {
    out.extend_from_slice(
        &Header {
            version,
            command: command.byte(),
            length,
            stream,
        }
        .encode(),
    );
}
