//! Handing live connections to the next process (feature `handoff`,
//! Linux): a deploy that keeps every connection. docs/handoff.md has the
//! whole story; in short, the running process (the
//! predecessor) listens on a Unix socket, and a new process of the same
//! program (the successor) connects to it, takes the listening sockets,
//! then every connection that can move: its descriptor (`SCM_RIGHTS`) and
//! its state as a record. The predecessor closes what stays with 1012 and
//! exits.
//!
//! | file | job |
//! |---|---|
//! | `channel.rs` | the Unix socket between the two processes: messages with descriptors (`SCM_RIGHTS`), bounded |
//! | `protocol.rs` | what the two say: the greeting with the listeners, acknowledged batches, the end |
//! //! | `socket.rs` | where a running process waits for its successor: a socket no other user can reach |
//! | `identity.rs` | who is at the other end (`SO_PEERCRED`): the same user, both ways |
//! | `leave.rs` | the running process's side: freezing requests, the state, batch after batch out of the loops |
//! | `arrive.rs` | the successor's side: meeting, the state applied, batches into the loops |
//!
//! The connection's own part (what moves, what stays, and the record it
//! moves as) is the connection layer's: `connection/lifecycle/handoff.rs`
//! and `connection/record.rs`; the driver's (a loop giving up a batch
//! of its connections, taking them in) is in the driver
//! (`tokio/group.rs`, `uring/handoff.rs`), behind [`Loops`]: so either
//! driver hands over to either.

pub(crate) mod arrive;
pub(crate) mod channel;
pub(crate) mod identity;
pub(crate) mod leave;
pub(crate) mod protocol;
pub(crate) mod socket;

use protocol::Departure;
use std::sync::Arc;

use crate::connection::record::{Arriving, Moved, Record};

/// What a handoff asks a server loop (a tokio group, an io_uring reactor)
/// for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing but an answer, between two turns: a loop that answers has
    /// seen what the handoff set before it asked (input frozen).
    Freeze,
    /// A batch of what can move, from a slot on.
    Move,
    /// Every connection a turn, and accepting again (after a failed
    /// handoff: requests thawed wait in their buffers).
    Thaw,
}

/// A loop's answer: a batch of connections leaving, and the slot to go on
/// from (`None`: it has no more).
pub(crate) type Answer = (Vec<Departure>, Option<u32>);

/// Where a loop puts its answer, for the handoff waiting in [`ask`].
pub(crate) struct Leaving(Arc<AnswerSlot>);

#[derive(Default)]
struct AnswerSlot {
    /// The answer, and whether the handoff stopped waiting for it.
    state: std::sync::Mutex<(Option<Answer>, bool)>,
    given: std::sync::Condvar,
}

impl Leaving {
    /// Gives the answer; `Err` with it if the handoff stopped waiting (its
    /// connections are then the loop's again). Decided under one lock, so
    /// an answer is either taken by the handoff or back with the loop,
    /// never lost between the two.
    pub(crate) fn give(self, answer: Answer) -> Result<(), Answer> {
        let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.1 {
            return Err(answer);
        }
        state.0 = Some(answer);
        self.0.given.notify_one();
        Ok(())
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        // A loop that ended without answering: the handoff need not wait.
        let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.is_none() {
            state.1 = true;
        }
        self.0.given.notify_one();
    }
}

/// A server's loops, as the handoff sees them, whatever the driver.
pub(crate) trait Loops {
    /// How many there are.
    fn count(&self) -> usize;

    /// Posts `phase` from `slot` to loop `index`: the loop answers on
    /// `reply` between two of its turns. (A loop that ended drops it.)
    fn post(&self, index: usize, slot: u32, phase: Phase, reply: Leaving);

    /// Stops accepting: the successor has the listening sockets from now.
    /// (A loop that accepts stops, and answers its next `Move` only once
    /// its accept has ended, so what it accepted meanwhile moves too.)
    fn stop_accepting(&self) {}

    /// A connection arriving (from the predecessor, or back after a failed
    /// handoff), with its socket, for a loop to take in.
    fn arrive(&self, fd: std::os::fd::OwnedFd, arriving: Arriving);
}

/// How long the handoff waits for one of this server's own loops to
/// answer (or for the requests being handled to end). Not the successor's
/// doing: its answers have [`protocol::ANSWER_TIMEOUT`].
pub(crate) const LOOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks loop `index` of `loops` for `phase` from `slot`, and waits (at
/// most [`LOOP_TIMEOUT`]) for a batch and where to go on. A
/// loop that ended has nothing; after the timeout, `None`, and a late
/// batch stays with its loop (its giving fails, and it takes them back).
pub(crate) fn ask(loops: &dyn Loops, index: usize, slot: u32, phase: Phase) -> Option<Answer> {
    let waiting = Arc::new(AnswerSlot::default());
    loops.post(index, slot, phase, Leaving(waiting.clone()));
    let deadline = std::time::Instant::now() + LOOP_TIMEOUT;
    let mut state = waiting.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(answer) = state.0.take() {
            return Some(answer);
        }
        if state.1 {
            // The loop ended without a word.
            return Some(Answer::default());
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            // Stopped waiting: a late answer goes back to its loop.
            state.1 = true;
            return None;
        }
        state = waiting
            .given
            .wait_timeout(state, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Connections that left and were not taken (the handoff failed, or
/// stopped waiting for a loop's answer), on their way back: their own
/// records read again. One that does not read, which only a bug could
/// make of a record this process made, is logged and closed.
pub(crate) fn read_back(
    departures: Vec<Departure>,
    hub: &crate::connection::hub::Hub,
) -> impl Iterator<Item = (std::os::fd::OwnedFd, Arriving)> {
    let (limits, pool) = (hub.config.limits, hub.pool.clone());
    departures
        .into_iter()
        .filter_map(
            move |Departure { fd, record }| match Arriving::read(&record, limits, &pool) {
                Ok(arriving) => Some((fd, arriving)),
                Err(error) => {
                    tracing::error!(%error, "a connection's own record did not read back; closed");
                    None
                }
            },
        )
}

/// [`read_back`] into `loops`.
pub(crate) fn take_back(
    departures: Vec<Departure>,
    loops: &dyn Loops,
    hub: &crate::connection::hub::Hub,
) {
    for (fd, arriving) in read_back(departures, hub) {
        loops.arrive(fd, arriving);
    }
}

/// A connection leaving with its record, its socket out of its loop.
/// `None` if it has no peer any more (it went away meanwhile).
pub(crate) fn departure(stream: std::net::TcpStream, moved: Moved) -> Option<Departure> {
    let peer = stream.peer_addr().ok()?;
    Some(Departure {
        fd: stream.into(),
        record: Record { peer, stage: moved }.encode(),
    })
}

/// Makes a socket handed over non-blocking, as epoll (the tokio groups)
/// needs it. io_uring's operations work either way, so a socket is never
/// set back to blocking: the mode belongs to the socket, which both
/// processes share until the handoff ends, and a predecessor that takes a
/// socket back, or serves on after a failure, must find it as it works.
pub(crate) fn set_nonblocking(fd: std::os::fd::BorrowedFd<'_>) {
    if let Err(error) = rustix::io::ioctl_fionbio(fd, true) {
        tracing::warn!(%error, "could not make a handed-over socket non-blocking");
    }
}
