//! [`Mux`]: one side of an smux session.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::buffer::Buffer;
use super::schedule::Schedule;
use super::{Config, Event, INITIAL_WINDOW, MuxError, MuxStats, Side, Version};
use crate::budget::{Account, Charge};

/// Control frames owed to the peer (SYNs, refusing FINs) past which the
/// session stops reading its input: a peer that opens streams and never
/// reads our answers is not read either, so nothing grows.
pub(crate) const CONTROL_LIMIT: usize = 1024;

/// A control frame owed to the peer.
#[derive(Clone, Copy, Debug)]
pub(super) enum Control {
    Syn(u32),
    /// A refused SYN's answer (a FIN for a stream we never took in).
    Refuse(u32),
    Nop,
}

/// One stream's state.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// Received, not yet read by the application.
    pub(super) recv: Buffer,
    /// Written by the application, not yet framed.
    pub(super) send: Buffer,
    /// Version 2, receiving: bytes received in all, bytes the application
    /// read in all, and the latter as last announced in an UPD.
    pub(super) received: u32,
    pub(super) consumed: u32,
    pub(super) announced: u32,
    /// Version 2, sending: payload bytes framed in all, and the peer's
    /// latest consumed count and window.
    pub(super) written: u32,
    pub(super) peer_consumed: u32,
    pub(super) peer_window: u32,
    pub(super) priority: u8,
    /// The peer's FIN arrived.
    pub(super) fin_received: bool,
    /// The application finished writing: a FIN follows the data.
    pub(super) fin_wanted: bool,
    pub(super) fin_sent: bool,
    /// The application let go of the stream: what arrives is dropped, and
    /// the stream goes once its FIN is out.
    pub(super) released: bool,
    /// In the schedule (at most once).
    pub(super) scheduled: bool,
    /// An UPD is owed (it is in `updates`).
    pub(super) update_owed: bool,
    /// A `Readable` or `Writable` event is out and not yet followed by a
    /// read or a write.
    pub(super) readable_told: bool,
    /// A write found the send buffer full: tell the writer when it is not.
    pub(super) write_blocked: bool,
    /// Released, finished by the peer, and without window at the last
    /// keepalive tick (see `give_up_stuck`).
    pub(super) stale: bool,
}

/// One side of an smux session, sans-I/O. Inputs are `handle_*` (the
/// peer's bytes, the clock, what the transport did with our frames),
/// outputs `poll_*` (events, frames, the next deadline); the application's
/// side is [`open`](Mux::open), [`accept`](Mux::accept),
/// [`read`](Mux::read), [`write`](Mux::write), [`finish`](Mux::finish)
/// (our FIN: a half-close) and [`close`](Mux::close). What bounds a peer
/// is in [`Config`].
///
/// # Call order
///
/// 1. after reading from the transport,
///    [`handle_input`](Mux::handle_input) with the whole input buffer (it
///    takes what it can and leaves a partial frame), then
///    [`poll_event`](Mux::poll_event) until `None`;
/// 2. while [`wants_input`](Mux::wants_input) is false, read nothing more:
///    the application has [`Config::receive_buffer`] bytes unread (or the
///    peer is not reading our answers);
/// 3. whenever [`has_output`](Mux::has_output),
///    [`poll_transmit`](Mux::poll_transmit) into a buffer and write it out;
/// 4. at [`poll_timeout`](Mux::poll_timeout), [`handle_timeout`](Mux::handle_timeout);
/// 5. after each attempt to write,
///    [`handle_transport_write`](Mux::handle_transport_write): whether the
///    transport took some of our frames and whether some still wait for it
///    (the keepalive's test of a peer that does not read);
/// 6. when the budget's waker ([`set_waker`](Mux::set_waker)) wakes it,
///    [`poll_timeout`](Mux::poll_timeout) is due at once: the session was
///    shed.
///
/// After any of the application's calls, output may be owed (step 3), and
/// after a [`read`](Mux::read), input may be wanted again (step 2).
#[derive(Debug)]
pub struct Mux {
    pub(super) side: Side,
    pub(super) config: Config,
    /// The version spoken; `None` until the peer's first frame if the
    /// configuration leaves it to the peer.
    pub(super) version: Option<Version>,
    /// The last id this side used (ids go up by 2).
    pub(super) last_id: u32,
    pub(super) streams: HashMap<u32, Stream>,
    pub(super) incoming: VecDeque<u32>,
    pub(super) events: VecDeque<Event>,
    pub(super) control: VecDeque<Control>,
    /// Streams owed an UPD.
    pub(super) updates: VecDeque<u32>,
    pub(super) schedule: Schedule,
    /// Received bytes not yet read, all streams.
    pub(super) buffered: usize,
    /// Input was not wanted and is again: the peer's silence meanwhile
    /// was ours, so the keepalive clock restarts at the next timeout call.
    pub(super) resumed: bool,
    /// Refusals (FINs for SYNs not taken in) owed to the peer.
    pub(super) refusals: usize,
    /// No more streams are taken in (the application can no longer
    /// accept them): a SYN gets a FIN.
    pub(super) refusing: bool,
    /// Ending: no new streams either way.
    pub(super) ending: bool,
    pub(super) failed: Option<MuxError>,
    pub(super) stats: MuxStats,
    /// What the session holds (received and unread, written and unsent)
    /// in the budget every session of the configuration shares.
    pub(super) account: Account,
    pub(super) last_received: Instant,
    /// The last time the peer showed it takes what we send: a window
    /// update that moves, the transport taking our frames, or nothing of
    /// ours waiting for it (see `handle_timeout`).
    pub(super) last_progress: Instant,
    /// Progress seen since the last keepalive check.
    pub(super) progressed: bool,
    /// Some of our frames wait for the transport (the driver says so).
    pub(super) output_waiting: bool,
    /// At the last check, something of ours waited for the peer.
    pub(super) waiting_on_peer: bool,
    /// What `handle_input` left in its input last time.
    pub(super) unread: usize,
    pub(super) next_keepalive: Option<Instant>,
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
    pub(super) fn hold(&mut self, bytes: usize) -> Result<(), MuxError> {
        match self.account.charge(bytes) {
            Charge::Shed => Err(self.shed()),
            Charge::Taken | Charge::OverCap => Ok(()),
        }
    }

    /// The session was shed: it ends, and lets go of what it holds.
    pub(super) fn shed(&mut self) -> MuxError {
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
    pub(super) fn note_resumed(&mut self, wanted_before: bool) {
        if !wanted_before && self.wants_input() {
            self.resumed = true;
        }
    }

    pub(super) fn new_stream(&self) -> Stream {
        Stream {
            peer_window: INITIAL_WINDOW,
            ..Stream::default()
        }
    }

    pub(super) fn fail(&mut self, error: MuxError) -> MuxError {
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
                stream.send.clear();
                if shed {
                    self.buffered -= stream.recv.clear();
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
}

/// Version 2: what the peer's window lets the stream send now (at most a
/// frame); version 1: a frame.
pub(super) fn room(stream: &Stream, v2: bool, max_frame: u16) -> usize {
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
pub(super) fn sendable(stream: &Stream, v2: bool, max_frame: u16) -> bool {
    if stream.send.is_empty() {
        return stream.fin_wanted && !stream.fin_sent;
    }
    room(stream, v2, max_frame) > 0
}

/// Gives the stream a turn to send, unless it already waits for one.
pub(super) fn give_turn(schedule: &mut Schedule, id: u32, stream: &mut Stream) {
    if !stream.scheduled {
        stream.scheduled = true;
        schedule.push(id, stream.priority);
    }
}

pub(super) fn tell_readable(events: &mut VecDeque<Event>, id: u32, stream: &mut Stream) {
    if !stream.readable_told {
        stream.readable_told = true;
        events.push_back(Event::Readable(id));
    }
}
