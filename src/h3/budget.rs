//! What WebTransport sessions hold of their peers' streams: a budget for
//! every connection of an endpoint together and a cap for each one, and
//! the reading of a stream whole within them ([`WebTransportSession::read_to_end`]).
//!
//! QUIC's flow control bounds what a connection's streams hold unread in
//! quinn (`QuicConfig::connection_window`, 1 MiB). What it does not bound
//! is what an application takes out and keeps until a stream ends: a
//! handler that reads each stream whole before it acts on it holds every
//! byte of every stream the peer never finishes (16 streams of 1 MiB on
//! each of 10 connections held 170 MiB of `h3_echo`). Read through
//! [`WebTransportSession::read_to_end`], those bytes are counted, as the memory they
//! take (the buffer's capacity), until the result is dropped:
//!
//! - past a connection's cap ([`StreamBudget::per_connection`], 4 MiB by
//!   default) the stream whose read would pass it is stopped with
//!   `H3_EXCESSIVE_LOAD` and the read fails ([`ReadToEndError::OverBudget`]);
//!   the connection's other streams go on;
//! - past the endpoint's budget ([`StreamBudget::total`], 256 MiB by
//!   default, for the whole process unless the handler gives its own) the
//!   connection holding the most is closed with `H3_EXCESSIVE_LOAD`, and
//!   its reads fail (the one that read last may be another's).
//!
//! [`WebTransportSession::read_to_end`]: super::WebTransportSession::read_to_end

use std::sync::{Arc, OnceLock};
use std::task::Wake;

use quinn::{Connection, RecvStream};
use rapidws_core::budget::{Account, Budget, Charge};
use rapidws_core::h3::code;

use super::wire::code_of;

/// What every connection of an endpoint may hold of its peers' streams
/// read whole, together ([`total`](StreamBudget::total)) and each
/// ([`per_connection`](StreamBudget::per_connection)); given by
/// [`WebTransport::stream_budget`](super::WebTransport::stream_budget).
/// Cheap to clone: clones share the total.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamBudget {
    total: Budget,
    per_connection: usize,
}

/// [`StreamBudget::default`]'s total: 256 MiB for the whole process.
pub const DEFAULT_TOTAL: usize = 256 << 20;

/// [`StreamBudget::default`]'s cap per connection: 4 MiB, four streams of
/// `h3_echo`'s largest (1 MiB) at once, four times what QUIC lets a
/// connection's peer send unread (`QuicConfig::connection_window`).
pub const DEFAULT_PER_CONNECTION: usize = 4 << 20;

impl Default for StreamBudget {
    /// One budget for the whole process ([`DEFAULT_TOTAL`]), so the bound
    /// holds across every endpoint in it, and [`DEFAULT_PER_CONNECTION`]
    /// for each connection.
    fn default() -> StreamBudget {
        static TOTAL: OnceLock<Budget> = OnceLock::new();
        StreamBudget {
            total: TOTAL.get_or_init(|| Budget::new(DEFAULT_TOTAL)).clone(),
            per_connection: DEFAULT_PER_CONNECTION,
        }
    }
}

impl StreamBudget {
    /// A budget of `total` bytes for every connection together and
    /// `per_connection` for each (both at least 1).
    pub fn new(total: usize, per_connection: usize) -> StreamBudget {
        StreamBudget {
            total: Budget::new(total),
            per_connection: per_connection.max(1),
        }
    }

    /// What every connection together may hold.
    pub fn total(&self) -> usize {
        self.total.limit()
    }

    /// What one connection may hold.
    pub fn per_connection(&self) -> usize {
        self.per_connection
    }

    /// What every connection holds now.
    pub fn held(&self) -> usize {
        self.total.used()
    }

    /// Connections shed so far (closed for holding the most when the total
    /// was passed).
    pub fn shed(&self) -> u64 {
        self.total.shed()
    }

    /// The budget behind the total (for its metrics).
    pub(crate) fn budget(&self) -> &Budget {
        &self.total
    }

    /// One connection's account in it: shed, the connection is closed.
    pub(crate) fn connection(&self, conn: &Connection) -> Arc<ConnectionBudget> {
        let account = self.total.account();
        let closer = Arc::new(CloseOnShed(conn.clone()));
        account.set_waker(&closer.into());
        Arc::new(ConnectionBudget {
            account,
            cap: self.per_connection,
        })
    }
}

/// Closes its connection when woken: its account was shed.
struct CloseOnShed(Connection);

impl Wake for CloseOnShed {
    fn wake(self: Arc<Self>) {
        close_shed(&self.0);
    }
}

fn close_shed(conn: &Connection) {
    conn.close(
        code_of(code::EXCESSIVE_LOAD),
        b"over the WebTransport stream budget: this connection held the most",
    );
}

/// One connection's share of a [`StreamBudget`].
pub(crate) struct ConnectionBudget {
    account: Account,
    cap: usize,
}

impl std::fmt::Debug for ConnectionBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionBudget")
            .field("held", &self.account.held())
            .field("cap", &self.cap)
            .finish()
    }
}

/// Bytes taken from a connection's budget, given back when dropped.
struct Taken {
    budget: Arc<ConnectionBudget>,
    bytes: usize,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.budget.account.release(self.bytes);
    }
}

/// A stream read whole by [`WebTransportSession::read_to_end`](super::WebTransportSession::read_to_end):
/// its bytes, counted against the connection's budget until this is
/// dropped.
pub struct Whole {
    bytes: Vec<u8>,
    _taken: Taken,
}

impl std::ops::Deref for Whole {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::fmt::Debug for Whole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Whole")
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// Why [`WebTransportSession::read_to_end`](super::WebTransportSession::read_to_end) gave no
/// stream.
#[derive(Debug)]
pub enum ReadToEndError {
    /// The stream is longer than the `max` asked for (it is left as it
    /// is: stop it, or read it otherwise).
    TooLong,
    /// Reading it whole would pass the connection's cap or the endpoint's
    /// budget ([`StreamBudget`]): the stream was stopped with
    /// `H3_EXCESSIVE_LOAD` (past the cap), or the connection closed with it
    /// (it held the most when the budget was passed).
    OverBudget,
    /// Reading failed (the peer reset the stream, the connection ended).
    Read(quinn::ReadError),
}

impl std::fmt::Display for ReadToEndError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadToEndError::TooLong => f.write_str("the stream is longer than asked for"),
            ReadToEndError::OverBudget => f.write_str(
                "reading the stream whole would pass the WebTransport stream budget: stopped",
            ),
            ReadToEndError::Read(error) => write!(f, "reading the stream failed: {error}"),
        }
    }
}

impl std::error::Error for ReadToEndError {}

/// The first buffer a stream read whole gets; it doubles from there, as
/// the stream grows, up to its `max`.
const FIRST_BUFFER: usize = 4096;

/// Reads `recv` to its end, at most `max` bytes, within `budget`: see
/// [`WebTransportSession::read_to_end`](super::WebTransportSession::read_to_end).
pub(crate) async fn read_to_end(
    budget: &Arc<ConnectionBudget>,
    conn: &Connection,
    recv: &mut RecvStream,
    max: usize,
) -> Result<Whole, ReadToEndError> {
    let mut taken = Taken {
        budget: budget.clone(),
        bytes: 0,
    };
    let mut bytes: Vec<u8> = Vec::new();
    // Chunks as quinn holds them, copied out at once: a chunk keeps its
    // whole packet's buffer alive, a copy only its bytes.
    while let Some(chunk) = recv
        .read_chunk(usize::MAX, true)
        .await
        .map_err(ReadToEndError::Read)?
    {
        let needed = bytes.len() + chunk.bytes.len();
        if needed > max {
            return Err(ReadToEndError::TooLong);
        }
        if needed > bytes.capacity() {
            // What it takes is the buffer's growth: its memory.
            let grown = needed
                .max(bytes.capacity().saturating_mul(2))
                .max(FIRST_BUFFER)
                .min(max);
            let more = grown - bytes.capacity();
            match budget.account.charge_within(more, budget.cap) {
                Charge::Taken => taken.bytes += more,
                Charge::OverCap => {
                    let _ = recv.stop(code_of(code::EXCESSIVE_LOAD));
                    return Err(ReadToEndError::OverBudget);
                }
                Charge::Shed => {
                    // Charged all the same: given back with `taken`.
                    taken.bytes += more;
                    close_shed(conn);
                    return Err(ReadToEndError::OverBudget);
                }
            }
            bytes.reserve_exact(grown - bytes.len());
        }
        bytes.extend_from_slice(&chunk.bytes);
    }
    Ok(Whole {
        bytes,
        _taken: taken,
    })
}
