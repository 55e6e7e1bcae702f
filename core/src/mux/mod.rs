//! Many streams on one connection: the smux protocol (xtaci/smux, versions
//! 1 and 2), sans-I/O. [`Mux`] is one side of an smux session over some
//! byte stream (TCP, TLS, or a WebSocket's binary messages); like the
//! WebSocket [`Session`], it does no I/O and reads no clock, and its
//! documentation gives the order a driver calls it in. [`Config`] says
//! what bounds a peer, alone and, through a shared [`Budget`], together.
//!
//! | file | concern |
//! |---|---|
//! | `frame.rs` | the 8-byte header and what each command allows |
//! | `multiplexer.rs` | [`Mux`]: its state, its contract, what the files below share |
//! | `receive.rs` | the peer's frames in: SYN, FIN, PSH, UPD, NOP |
//! | `transmit.rs` | frames out: control frames, window updates, data in turn |
//! | `buffer.rs` | a stream's bytes one way, in blocks that never move |
//! | `output.rs` | [`Output`]: frames waiting for the transport, payloads not copied |
//! | `keepalive.rs` | the clock: NOPs, the silent and the non-reading peer |
//! | `streams.rs` | the application's side: open, accept, read, write, close |
//! | `schedule.rs` | whose turn it is to send |
//!
//! [`Session`]: crate::proto::Session

mod buffer;
pub mod frame;
mod keepalive;
mod multiplexer;
mod output;
mod receive;
mod schedule;
mod streams;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
mod transmit;

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

pub use crate::budget::Budget;
pub use frame::{Command, FrameError, Header};
pub use multiplexer::Mux;
pub use output::{Output, Transmit};

/// The limit of the budget every session shares unless its configuration
/// names another: 256 MiB. One session at its stream limit holds at most
/// `max_streams` × (window + send buffer), 512 × 384 KiB = 192 MiB, so
/// the default takes one such session whole and any number of them
/// together in about a hundredth of a 24 GiB machine; past it the largest
/// are shed.
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// The budget of every session whose configuration names no other (of
/// [`DEFAULT_BUDGET`] bytes): one for the whole process, so the bound
/// holds across all sessions of every server in it by default.
pub fn default_budget() -> Budget {
    static DEFAULT: OnceLock<Budget> = OnceLock::new();
    DEFAULT.get_or_init(|| Budget::new(DEFAULT_BUDGET)).clone()
}

/// Which side of the byte stream this is: the one that dialled opens
/// streams with odd ids (3, 5, ...), the one that accepted with even ids
/// (2, 4, ...), as smux's client and server do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The side that dialled (smux's client).
    Dialer,
    /// The side that accepted (smux's server).
    Acceptor,
}

/// The smux protocol version. Both sides must speak the same one: smux does
/// not negotiate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// Version 1: no flow control per stream, one receive budget for the
    /// whole session (a stream nobody reads stalls the others).
    V1 = 1,
    /// Version 2: each stream has a window the receiver moves with UPD
    /// frames, so a stream nobody reads stalls only itself.
    V2 = 2,
}

impl Version {
    /// The version's byte on the wire.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// The version a byte names, if any.
    pub const fn from_byte(byte: u8) -> Option<Version> {
        match byte {
            1 => Some(Version::V1),
            2 => Some(Version::V2),
            _ => None,
        }
    }
}

/// `"1"` or `"2"`, as a command line gives it.
impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(value: &str) -> Result<Version, String> {
        match value {
            "1" => Ok(Version::V1),
            "2" => Ok(Version::V2),
            _ => Err("smux speaks version 1 or 2".into()),
        }
    }
}

/// The window a version 2 sender assumes for a stream before the
/// receiver's first UPD (xtaci/smux's `initialPeerWindow`). A receiver
/// must accept this much whatever window it announces later.
pub const INITIAL_WINDOW: u32 = 256 * 1024;

/// A session's settings. The defaults are xtaci/smux's, but for the
/// stream window (256 KiB: what its senders assume anyway) and the limits
/// smux does not have. Sessions made with clones of one configuration
/// share its [`budget`](Config::budget).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The version to speak; `None`: the version of the peer's first
    /// frame, with nothing sent until it arrives (for a server that serves
    /// peers of both versions). Default: version 1, smux's default.
    pub version: Option<Version>,
    /// The longest data frame sent (at most 65535). Default 32768. A
    /// stream with more to send waits for its next turn after each.
    pub max_frame_size: u16,
    /// The longest data frame accepted; a longer one ends the session.
    /// Default 65535 (smux's own maximum: any smux sender is accepted).
    pub max_receive_frame: u16,
    /// The most streams open at once, both directions together (opened,
    /// accepted or waiting to be accepted, or closed by the application
    /// with data still to send). A SYN past it is answered with a FIN.
    /// Default 512 (with version 2's windows, at most 128 MiB received and
    /// unread per session).
    pub max_streams: usize,
    /// Version 2: the window announced for each stream, the most bytes a
    /// stream's peer may send ahead of what the application has read
    /// (never below [`INITIAL_WINDOW`] in effect). Default 256 KiB.
    pub stream_window: u32,
    /// Version 1: received bytes the application has not read yet, all
    /// streams together, at which the session stops reading its input
    /// until the application reads (smux's `MaxReceiveBuffer`; one stream
    /// nobody reads then stalls them all). Default 4 MiB. Version 2 is
    /// bounded by its windows instead: at most `max_streams` ×
    /// `max(stream_window, INITIAL_WINDOW)`.
    pub receive_buffer: usize,
    /// Bytes a stream may have queued and not yet sent; a write past it
    /// waits for [`Event::Writable`]. Default 128 KiB.
    pub send_buffer: usize,
    /// How often a NOP is sent; `None`: never. Default 10 s.
    pub keepalive_interval: Option<Duration>,
    /// How long the peer may stay silent before the session ends; and how
    /// long it may take none of what we send while something of ours waits
    /// for it (frames the transport does not take, or a version 2 stream's
    /// data its window holds back), whatever else it sends (NOPs, data),
    /// before the session ends ([`MuxError::NoProgress`]). `None`: forever.
    /// Default 30 s.
    pub keepalive_timeout: Option<Duration>,
    /// What this session and every other of the same budget may hold
    /// together: bytes received and not yet read, written and not yet
    /// sent, on every stream. Past seven eighths of it a session holding
    /// at least its share (the limit divided among the sessions, and one
    /// more) takes no new stream; past all of it the session holding the most is shed
    /// (see [`MuxError::Budget`]). Default: [`default_budget`], one for
    /// the whole process ([`DEFAULT_BUDGET`], 256 MiB).
    pub budget: Budget,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            version: Some(Version::V1),
            max_frame_size: 32768,
            max_receive_frame: u16::MAX,
            max_streams: 512,
            stream_window: INITIAL_WINDOW,
            receive_buffer: 4 << 20,
            send_buffer: 128 << 10,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Some(Duration::from_secs(30)),
            budget: default_budget(),
        }
    }
}

impl Config {
    /// Says what is wrong with the settings, if anything: a zero frame size,
    /// stream limit, window or buffer, or a keepalive timeout not longer
    /// than its interval.
    pub fn check(&self) -> Result<(), String> {
        if self.max_frame_size == 0 || self.max_receive_frame == 0 {
            return Err("mux frame sizes must be at least 1 byte".into());
        }
        if self.max_streams == 0 {
            return Err("max_streams must be at least 1".into());
        }
        if self.stream_window == 0 || self.receive_buffer == 0 || self.send_buffer == 0 {
            return Err("the mux's windows and buffers must be at least 1 byte".into());
        }
        let (interval, timeout) = (self.keepalive_interval, self.keepalive_timeout);
        if let (Some(interval), Some(timeout)) =
            (interval, timeout.filter(|t| Some(*t) <= interval))
        {
            return Err(format!(
                "keepalive_timeout ({timeout:?}) must be longer than keepalive_interval ({interval:?}), or the peer's NOPs cannot keep the session alive"
            ));
        }
        Ok(())
    }
}

/// What happened that the application may want to act on. Each is given
/// once per change: a stream already readable is not announced again until
/// it has been read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A stream the peer opened waits in the accept queue ([`Mux::accept`]).
    Incoming,
    /// The stream has data to read, or the peer's FIN, or the session ended.
    Readable(u32),
    /// The stream's send buffer, full before, has room again.
    Writable(u32),
}

/// What a [`Mux::read`] (or a [`Mux::read_bytes`]) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read<T = usize> {
    /// What was read: how many bytes were copied (or the bytes
    /// themselves).
    Data(T),
    /// Nothing yet: wait for [`Event::Readable`].
    Empty,
    /// The peer's FIN: everything it sent has been read.
    End,
}

impl<T> Read<T> {
    /// The same, with what was read changed by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Read<U> {
        match self {
            Read::Data(data) => Read::Data(f(data)),
            Read::Empty => Read::Empty,
            Read::End => Read::End,
        }
    }
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MuxError {
    /// A frame no smux receiver accepts.
    Frame(FrameError),
    /// Version 2: the peer sent a stream more than the window it had.
    Window {
        /// The stream.
        stream: u32,
        /// Its bytes not acknowledged by our UPDs, with this frame.
        unacknowledged: u32,
    },
    /// The peer stayed silent past the keepalive timeout.
    KeepaliveTimeout,
    /// For the keepalive timeout, something of ours waited for the peer
    /// (frames its transport did not take, or data its window held back)
    /// and it took none of it: it may have sent NOPs or data, but it does
    /// not read.
    NoProgress,
    /// The session was shed for the budget: every session of it together
    /// went past its limit, and this one held the most.
    Budget {
        /// What it held when it was shed.
        held: usize,
        /// The budget's limit.
        limit: usize,
    },
    /// Version 2: a window update that says more was consumed than was
    /// ever sent on the stream.
    Update {
        /// The stream.
        stream: u32,
    },
}

impl fmt::Display for MuxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MuxError::Frame(error) => error.fmt(f),
            MuxError::Window {
                stream,
                unacknowledged,
            } => write!(
                f,
                "the peer sent stream {stream} {unacknowledged} bytes ahead of its window (a version 2 peer must wait for window updates)"
            ),
            MuxError::KeepaliveTimeout => {
                f.write_str("the peer sent nothing within the keepalive timeout")
            }
            MuxError::NoProgress => f.write_str(
                "the peer took none of what we sent within the keepalive timeout (it does not read)",
            ),
            MuxError::Budget { held, limit } => write!(
                f,
                "shed for the mux budget: every session together went past its {limit} bytes, and this one held the most ({held} bytes received and unread or written and unsent)"
            ),
            MuxError::Update { stream } => write!(
                f,
                "the peer's window update for stream {stream} counts more bytes consumed than were sent"
            ),
        }
    }
}

impl std::error::Error for MuxError {}

impl From<FrameError> for MuxError {
    fn from(error: FrameError) -> Self {
        MuxError::Frame(error)
    }
}

/// Why a stream operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// No such stream (never opened, or closed and gone).
    Unknown,
    /// A write after [`Mux::finish`] or [`Mux::close`].
    Finished,
    /// The session ended (or is ending: [`Mux::shut_down`]).
    Ended,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamError::Unknown => "no such mux stream",
            StreamError::Finished => "the mux stream's write side is finished (FIN sent)",
            StreamError::Ended => "the mux session ended",
        })
    }
}

impl std::error::Error for StreamError {}

/// Why [`Mux::open`] could not open a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// [`Config::max_streams`] streams are open.
    TooManyStreams,
    /// Every stream id of this side has been used (smux's "go away").
    IdsExhausted,
    /// The session ended or is ending.
    Ended,
    /// The budget every session shares is nearly full and this session
    /// holds at least its share of it ([`Config::budget`]).
    Budget,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpenError::TooManyStreams => {
                "max_streams mux streams are open (close some or raise the limit)"
            }
            OpenError::IdsExhausted => {
                "this mux session has used all its stream ids: open a new session"
            }
            OpenError::Ended => "the mux session ended",
            OpenError::Budget => {
                "the mux budget is nearly full and this session holds its share: no new streams until it drains"
            }
        })
    }
}

impl std::error::Error for OpenError {}

/// What a session counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MuxStats {
    /// Streams opened by this side.
    pub opened: u64,
    /// Streams the peer opened that were taken in.
    pub incoming: u64,
    /// SYNs answered with a FIN: past `max_streams`, id 0, with one of our
    /// own ids, while the budget is nearly full, or while ending.
    pub refused: u64,
    /// Of those, SYNs with an id of our side's parity (the dialer's are
    /// odd, the acceptor's even).
    pub wrong_parity: u64,
    /// Streams not taken on because the budget was nearly full and the
    /// session held its share: the peer's SYNs refused and our own opens
    /// that failed.
    pub budget_refused: u64,
    /// Data frames dropped: for a stream unknown, closed by the
    /// application, or after the peer's own FIN.
    pub discarded_frames: u64,
    /// Their payload bytes.
    pub discarded_bytes: u64,
}
