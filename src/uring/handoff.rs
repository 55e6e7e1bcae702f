//! An io_uring server's part in a handoff (feature `handoff`): its
//! reactors as the handoff's [`Loops`] (what both sides do is
//! `handoff::leave` and `handoff::arrive`, the same for tokio), and what a
//! reactor does when asked.
//!
//! A connection leaves only when quiet (no receive armed, no send in
//! flight: the kernel holds none of its buffers and owes it no
//! completion). So a reactor asked for a batch picks up to a batch's worth
//! of connections, quietens them (cancels their receives: what arrives
//! meanwhile waits in the socket, and moves with it), and answers once
//! they are quiet, or after [`QUIET_WITHIN`], leaving those that are not
//! (a later pass takes them). Connections picked are frozen for that
//! wait and their batch's trip, not the whole handoff.
//!
//! Declared inside `reactor.rs`: the reactor's fields are its own.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{REACTOR, Reactor, Shared};
use crate::connection::handler::Handler;
use crate::connection::record::Arriving;
use crate::connection::wake::{ConnWake, SlotWake, WokenList};
use crate::driver::mailbox::lock;
use crate::handoff::channel::MAX_FDS;
use crate::handoff::protocol::{Departure, batch_is_full};
use crate::handoff::{Leaving, Loops, Phase, departure, read_back};
use crate::uring::connection::Connection;

/// How long a reactor waits for the connections it picked to be quiet
/// before it answers without those that are not.
const QUIET_WITHIN: Duration = Duration::from_millis(200);

/// What the handoff leaves for a reactor (in its `Shared`).
#[derive(Default)]
pub(crate) struct Mailbox {
    asked: Mutex<Option<(u32, Phase, Leaving)>>,
    arriving: Mutex<Vec<(OwnedFd, Arriving)>>,
    stop_accepting: AtomicBool,
    /// In a server that took over: the listening socket to accept on, come
    /// at the end of the handoff.
    listener: Mutex<Option<std::net::TcpListener>>,
    /// The reactor ended (see [`Mailbox::close`]).
    closed: AtomicBool,
}

impl Mailbox {
    /// The reactor ended: a handoff waiting for it hears it has nothing,
    /// and connections on their way are closed (`post` and `arrive` after
    /// this drop theirs at once).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(self.asked.lock().unwrap_or_else(|p| p.into_inner()).take());
        lock(&self.arriving).clear();
    }
}

/// A reactor's handoff state.
#[derive(Default)]
pub(super) struct Handing {
    /// A batch being made: answered once quiet.
    departing: Option<Departing>,
    /// Not accepting: the successor has the listening sockets.
    pub(super) paused: bool,
}

struct Departing {
    /// The slots picked, in order.
    picked: Vec<u32>,
    /// Where the next batch starts, if anything is left.
    next: Option<u32>,
    reply: Leaving,
    until: Instant,
}

impl Handing {
    /// When the reactor must look again even if nothing completes.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.departing.as_ref().map(|d| d.until)
    }
}

impl<H: Handler> Reactor<H> {
    /// Once a turn, after the connections' turns: connections arriving
    /// start, a request from the handoff is taken, and a batch is answered
    /// once its connections are quiet.
    pub(super) fn handoff_turn(&mut self) {
        self.take_arriving();
        let listener = (self.shared.handoff.listener)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(listener) = listener
            && !self.seen.shutdown()
        {
            // The predecessor's: accepted on from this turn (`arm_accept`).
            self.listener = Some(listener);
        }
        if self
            .shared
            .handoff
            .stop_accepting
            .swap(false, Ordering::SeqCst)
        {
            self.pause_accepting();
        }
        if self.handing.departing.is_none() {
            let asked = self
                .shared
                .handoff
                .asked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            match asked {
                None => {}
                Some((_, Phase::Freeze, reply)) => {
                    let _ = reply.give((Vec::new(), None));
                    // Their receives are cancelled at their next turn.
                    for slot in 0..self.slots.end() {
                        self.mark_dirty(slot);
                    }
                }
                Some((_, Phase::Thaw, reply)) => {
                    self.thaw();
                    let _ = reply.give((Vec::new(), None));
                }
                Some((from, Phase::Move, reply)) => {
                    // (Asked before `stop_accepting`: stop now all the same.)
                    self.pause_accepting();
                    self.pick(from, reply);
                }
            }
        }
        self.answer_when_quiet();
    }

    fn pause_accepting(&mut self) {
        self.handing.paused = true;
        if self.accepting {
            self.parts.ring.cancel(super::Op::Accept);
        }
    }

    /// Quietens up to a batch's worth of connections from slot `from` on.
    fn pick(&mut self, from: u32, reply: Leaving) {
        let mut picked = Vec::new();
        let mut next = None;
        for slot in from..self.slots.end() {
            if picked.len() >= MAX_FDS {
                next = Some(slot);
                break;
            }
            let mut io = self.parts.io(slot);
            if let Some(connection) = self.slots.get_mut(slot)
                && connection.quieten(&mut io)
            {
                picked.push(slot);
            }
        }
        self.handing.departing = Some(Departing {
            picked,
            next,
            reply,
            until: Instant::now() + QUIET_WITHIN,
        });
    }

    /// Answers the batch being made once every connection picked is quiet
    /// (and the accept has ended: what it accepted is ours to move), or
    /// its time is up: those quiet leave, the others read again.
    fn answer_when_quiet(&mut self) {
        let Some(departing) = &self.handing.departing else {
            return;
        };
        let quiet = |slot: &u32| self.slots.get(*slot).is_none_or(Connection::is_quiet);
        let ready = !self.accepting && departing.picked.iter().all(quiet);
        if !ready && Instant::now() < departing.until {
            return;
        }
        let Some(Departing {
            picked,
            mut next,
            reply,
            ..
        }) = self.handing.departing.take()
        else {
            return;
        };
        let mut departures = Vec::new();
        let (mut bytes, mut stayed) = (0, 0usize);
        for slot in picked {
            if next.is_some_and(|next| slot >= next) {
                // Past a full batch: read again, and come next time.
                if let Some(connection) = self.slots.get_mut(slot) {
                    connection.resume();
                }
                self.mark_dirty(slot);
                continue;
            }
            // (A slot freed and taken by an arrival meanwhile is not ours
            // to move.)
            let Some(connection) = self.slots.get_mut(slot).filter(|c| c.is_quieting()) else {
                continue;
            };
            let moved = match connection.hand_off(&self.env) {
                Ok(moved) => moved,
                Err(reason) => {
                    stayed += 1;
                    tracing::debug!(reason, "a connection stays for the handoff");
                    connection.resume();
                    self.mark_dirty(slot);
                    continue;
                }
            };
            let Some(leaving) = self.slots.remove(slot) else {
                continue;
            };
            self.refile_timer(slot, leaving.deadline(), None);
            if let Some(departure) = departure(leaving.into_stream(), moved) {
                bytes += departure.record.len();
                departures.push(departure);
                if batch_is_full(&departures, bytes) && next.is_none_or(|next| slot + 1 < next) {
                    next = Some(slot + 1);
                }
            }
        }
        if stayed > 0 {
            tracing::info!(
                stayed,
                "connections that cannot move yet stay, for a later pass or 1012"
            );
        }
        if let Err((departures, _)) = reply.give((departures, next)) {
            // The handoff stopped waiting: they stay here after all.
            self.take_back(departures);
        }
    }

    /// Connections a handoff that stopped waiting did not take.
    fn take_back(&mut self, departures: Vec<Departure>) {
        let hub = self.env.hub.clone();
        for (fd, arriving) in read_back(departures, &hub) {
            self.arrive(fd, arriving);
        }
    }

    /// After a failed handoff: every connection a turn (a request that
    /// waited is handled), reading again, and accepting again.
    fn thaw(&mut self) {
        self.handing.paused = false;
        for connection in self.slots.iter_mut() {
            connection.thaw(&self.env);
        }
        for slot in 0..self.slots.end() {
            self.mark_dirty(slot);
        }
    }

    fn take_arriving(&mut self) {
        let arriving = std::mem::take(&mut *lock(&self.shared.handoff.arriving));
        for (fd, arriving) in arriving {
            self.arrive(fd, arriving);
        }
    }

    /// Starts serving a connection handed over, where it was.
    fn arrive(&mut self, fd: OwnedFd, arriving: Arriving) {
        // From a process with other settings, maybe: this one's apply.
        crate::driver::tcp::prepare(&fd, &self.env.hub.config, arriving.peer);
        let stream = std::net::TcpStream::from(fd);
        let live = self.env.hub.enter();
        let slot = self.slots.next_slot();
        if self.marked.len() <= slot as usize {
            self.marked.resize(slot as usize + 1, false);
        }
        let wake = ConnWake::Slot(SlotWake::new(self.shared.clone(), slot));
        match Connection::take_over(stream, live, wake, arriving, &self.env) {
            Ok(connection) => {
                self.refile_timer(slot, None, connection.deadline());
                self.slots.insert(connection);
                self.mark_dirty(slot);
            }
            Err((stream, goodbye)) => {
                // Refused by the handler: what it had queued, a close
                // frame, and the end (without waiting: it blocks).
                if stream.set_nonblocking(true).is_ok() {
                    let _ = std::io::Write::write(&mut &stream, &goodbye);
                }
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

/// The reactors, as the handoff sees them.
pub(crate) struct ReactorLoops {
    pub(crate) reactors: Vec<Arc<Shared>>,
    /// Where the next arriving connection goes: each in turn.
    next: AtomicUsize,
}

impl ReactorLoops {
    pub(crate) fn new(reactors: Vec<Arc<Shared>>) -> Self {
        ReactorLoops {
            reactors,
            next: AtomicUsize::new(0),
        }
    }
}

impl ReactorLoops {
    /// Gives the reactors the listening sockets a server that took over
    /// was handed at the end: reactor *i* accepts on socket *i*, and
    /// reactors beyond them share (a tokio predecessor's one socket lacks
    /// `SO_REUSEPORT`, so new ones could not join its port).
    pub(crate) fn listen(&self, listeners: &[std::net::TcpListener]) -> std::io::Result<()> {
        if listeners.is_empty() {
            return Ok(());
        }
        for (index, shared) in self.reactors.iter().enumerate() {
            let listener = listeners[index % listeners.len()].try_clone()?;
            *shared
                .handoff
                .listener
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(listener);
            shared.push_woken(REACTOR);
        }
        Ok(())
    }
}

impl Loops for ReactorLoops {
    fn count(&self) -> usize {
        self.reactors.len()
    }

    fn post(&self, index: usize, slot: u32, phase: Phase, reply: Leaving) {
        let shared = &self.reactors[index];
        *shared
            .handoff
            .asked
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((slot, phase, reply));
        if shared.handoff.closed.load(Ordering::SeqCst) {
            // It ended meanwhile: nobody will answer.
            shared.handoff.close();
        }
        shared.push_woken(REACTOR);
    }

    fn stop_accepting(&self) {
        for shared in &self.reactors {
            shared.handoff.stop_accepting.store(true, Ordering::SeqCst);
            shared.push_woken(REACTOR);
        }
    }

    fn arrive(&self, fd: OwnedFd, arriving: Arriving) {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.reactors.len();
        let shared = &self.reactors[index];
        lock(&shared.handoff.arriving).push((fd, arriving));
        if shared.handoff.closed.load(Ordering::SeqCst) {
            shared.handoff.close();
        }
        shared.push_woken(REACTOR);
    }
}
