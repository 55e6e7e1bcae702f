//! One connection on io_uring: a state machine its reactor feeds with
//! completions (bytes received, a send finished) and advances once per loop
//! turn in which something happened to it.
//!
//! Receiving: one multishot receive per connection fills the reactor's
//! provided buffers. The bytes are handled where they landed, and the buffer
//! goes back to the kernel right after; only a partial frame is copied, into
//! a pooled buffer of the connection's own. Sending: whatever the callbacks
//! and the protocol queued during the turn is moved out of the connection's
//! queue and sent with one send; a partial send is sent on from where it
//! stopped before anything newer.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BytesMut};

use super::reactor::Shared;
use super::ring::{Op, Outgoing, Received, Ring};
use crate::conn::Conn;
use crate::dispatch::{Accepted, Dispatch};
use crate::handler::Handler;
use crate::handshake::{self, HandshakeError};
use crate::keepalive::Sweep;
use crate::proto::WriteQueue;
use crate::read_buf::{self, DRAIN_LIMIT};
use crate::server::{LiveGuard, Registration, ServerCore, deadline_after};
use crate::slot_waker::{ConnWake, SlotWake};
use crate::upgrade::{self, Answer};

/// What a reactor shares with all its connections.
pub(crate) struct Env<H> {
    pub(crate) core: Arc<ServerCore>,
    pub(crate) handler: Arc<H>,
    /// The reactor's woken list, for the connections' `Conn`s.
    pub(crate) woken: Arc<Shared>,
}

/// The reactor's means a connection acts through.
pub(crate) struct Io<'a> {
    pub(crate) ring: &'a mut Ring,
    pub(crate) slot: u32,
    /// Emptied send queues, reused.
    #[allow(
        clippy::vec_box,
        reason = "the ring takes them boxed: the kernel keeps pointers into them"
    )]
    pub(crate) spare: &'a mut Vec<Box<Outgoing>>,
}

/// Whether the reactor keeps the connection after a turn.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Pending,
    /// Over, and the kernel has finished with its socket: free the slot.
    Done,
    /// Its state cannot be trusted (ending it panicked): never reuse the slot.
    Leak,
}

/// An accepted TCP connection, from the handshake to the last completion.
pub(crate) struct Connection<H: Handler> {
    // Declared first, so the socket is closed before the live guard is
    // dropped: once `serve` sees no live connection, none is open.
    stream: TcpStream,
    /// A partial frame (or request head) waiting for the rest, or bytes held
    /// while reading is paused. Empty and without capacity otherwise.
    read_buf: BytesMut,
    /// A multishot receive is armed: its last completion has not come.
    receiving: bool,
    /// A send is in flight.
    sending: bool,
    /// The peer ended its side of the stream, or reading failed.
    read_closed: bool,
    /// A send is blocked, or too much waits to be written: received bytes
    /// are kept, not handled, and the receive is not armed again until the
    /// queue has drained.
    paused: bool,
    /// `paused` was set where the ring was out of reach: cancel the receive at
    /// the next turn.
    cancel_receive: bool,
    /// Set once the connection fails or starts to close.
    ending: Option<Box<Ending>>,
    stage: Stage<H>,
    _live: LiveGuard,
}

/// What only a failing or closing connection needs: boxed, so that an open
/// connection does not carry its size (most connections are open and idle).
#[derive(Default)]
struct Ending {
    /// How reading or writing failed, if one did.
    failure: Option<String>,
    /// The close timeout.
    deadline: Option<Instant>,
    /// Set once our FIN is sent: bytes discarded while waiting for the peer's.
    discarded: Option<usize>,
}

enum Stage<H: Handler> {
    /// Reading the request, or answering it with an HTTP error (boxed: it is
    /// short-lived, and an upgraded connection should not carry its size).
    Handshake(Box<Handshake>),
    Open(Open<H>),
    /// Over; waiting for the kernel to finish the socket's operations.
    Ended,
}

struct Handshake {
    peer: SocketAddr,
    /// The handshake timeout; once refused, the close timeout.
    deadline: Instant,
    /// The `101` (moved into the connection's queue) or the error response.
    response: WriteQueue,
    refused: bool,
    /// Set once the error response is out and FIN sent: bytes discarded since.
    discarded: Option<usize>,
}

struct Open<H: Handler> {
    dispatch: Dispatch<H>,
    _registration: Registration,
}

impl<H: Handler> Connection<H> {
    /// Starts serving an accepted connection: arms its receive and its
    /// handshake timeout.
    pub(crate) fn accept(
        stream: TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        env: &Env<H>,
        io: &mut Io<'_>,
    ) -> Self {
        let mut connection = Connection {
            stream,
            read_buf: BytesMut::new(),
            receiving: false,
            sending: false,
            read_closed: false,
            paused: false,
            cancel_receive: false,
            ending: None,
            stage: Stage::Handshake(Box::new(Handshake {
                peer,
                deadline: deadline_after(env.core.config.handshake_timeout),
                response: WriteQueue::new(),
                refused: false,
                discarded: None,
            })),
            _live: live,
        };
        connection.receive(io);
        connection
    }

    /// Handles a receive's completion.
    pub(crate) fn on_received(
        &mut self,
        result: io::Result<Received>,
        more: bool,
        env: &Env<H>,
        io: &mut Io<'_>,
    ) {
        if !more {
            self.receiving = false;
        }
        match result {
            // The reactor gives the buffer back afterwards, whatever happens here.
            Ok(Received::Data { buffer, len }) => {
                let chunk = io.ring.received(buffer, len);
                self.take(chunk, env, io.slot);
            }
            Ok(Received::End) => self.read_closed = true,
            // Out of provided buffers, or cancelled by us: armed again by the
            // next turn if still wanted (by then this turn's buffers are back).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ECANCELED)) => {}
            Err(error) => {
                self.read_closed = true;
                self.fail(|| format!("read failed: {error}"));
            }
        }
    }

    /// Handles a send's completion: sends on what is left, or keeps the
    /// emptied queue for reuse.
    pub(crate) fn on_sent(
        &mut self,
        result: io::Result<usize>,
        mut outgoing: Box<Outgoing>,
        env: &Env<H>,
        io: &mut Io<'_>,
    ) {
        self.sending = false;
        let written = match result {
            Ok(0) => Err(io::ErrorKind::WriteZero.into()),
            other => other,
        };
        match written {
            Ok(n) => {
                outgoing.queue.advance(n);
                if let Stage::Open(open) = &mut self.stage {
                    open.dispatch.conn().shared().lock().sending -= n;
                    if self.paused {
                        // The send had to wait for room: the peer made it
                        // by reading. (One that completes at once proves
                        // nothing: the kernel takes bytes for a peer that
                        // reads nothing, until its buffers are full.)
                        open.dispatch.heard_from_peer();
                    }
                }
            }
            // What is left unsent is dropped below.
            Err(error) => self.fail(|| format!("write failed: {error}")),
        }
        if !outgoing.queue.is_empty()
            && !failed(&self.ending)
            && !matches!(self.stage, Stage::Ended)
        {
            // A partial send: the rest goes before anything queued since.
            self.sending = true;
            io.ring.send(io.slot, self.stream.as_raw_fd(), outgoing);
            return;
        }
        self.forget_unsent(&mut outgoing);
        if let Some(buf) = outgoing.queue.take_buffer() {
            env.core.pool.give(buf);
        }
        io.spare.push(outgoing);
    }

    /// Does everything that can be done now.
    pub(crate) fn advance(&mut self, env: &Env<H>, io: &mut Io<'_>) -> Progress {
        let done = match self.stage {
            Stage::Handshake(_) => self.advance_handshake(env, io),
            Stage::Open(_) => self.advance_open(env, io),
            Stage::Ended => true,
        };
        if done {
            self.end(env, io);
            if self.receiving || self.sending {
                return Progress::Pending;
            }
            return Progress::Done;
        }
        if self.wants_to_read() && !self.receiving {
            self.receive(io);
        }
        Progress::Pending
    }

    /// Ends the connection now (the server gives up on it): the protocol state
    /// goes (calling `on_close`), and the socket's operations are cancelled.
    pub(crate) fn end(&mut self, env: &Env<H>, io: &mut Io<'_>) {
        if !matches!(self.stage, Stage::Ended) {
            // Dropping `Open` runs `on_close` and empties the connection's queue.
            self.stage = Stage::Ended;
            self.read_buf.clear();
            read_buf::release(&mut self.read_buf, &env.core.pool);
            if self.receiving {
                io.ring.cancel(Op::Recv(io.slot));
            }
            if self.sending {
                io.ring.cancel(Op::Send(io.slot));
            }
        }
    }

    /// True once ended and the kernel has finished with the socket.
    pub(crate) fn is_finished(&self) -> bool {
        matches!(self.stage, Stage::Ended) && !self.receiving && !self.sending
    }

    fn wants_to_read(&self) -> bool {
        !self.read_closed && !self.paused && !matches!(self.stage, Stage::Ended)
    }

    fn receive(&mut self, io: &mut Io<'_>) {
        self.receiving = true;
        io.ring.receive(io.slot, self.stream.as_raw_fd());
    }

    /// The handshake timeout, or once closing, the close timeout. The
    /// reactor watches it: it gives the connection a turn when it passes.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &self.stage {
            Stage::Handshake(handshake) => Some(handshake.deadline),
            Stage::Open(_) => self.ending.as_ref().and_then(|ending| ending.deadline),
            Stage::Ended => None,
        }
    }

    fn set_deadline(&mut self, timeout: std::time::Duration) {
        let at = deadline_after(timeout);
        match &mut self.stage {
            Stage::Handshake(handshake) => handshake.deadline = at,
            _ => self.ending().deadline = Some(at),
        }
    }

    fn expired(&self) -> bool {
        self.deadline().is_some_and(|at| Instant::now() >= at)
    }

    fn ending(&mut self) -> &mut Ending {
        self.ending.get_or_insert_with(Box::default)
    }

    /// Notes how reading or writing failed (the first failure counts).
    fn fail(&mut self, failure: impl FnOnce() -> String) {
        self.ending().failure.get_or_insert_with(failure);
    }

    /// One keepalive sweep, if the connection is open (see `keepalive`).
    pub(crate) fn sweep(&mut self, sweep: &Sweep) {
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.sweep(sweep);
        }
    }

    /// Once upgraded, the connection's handle.
    pub(crate) fn conn(&self) -> Option<&Conn> {
        match &self.stage {
            Stage::Open(open) => Some(open.dispatch.conn()),
            _ => None,
        }
    }

    /// Sends `queue`'s contents: moves them into a send queue of the ring's.
    fn send(&mut self, queue: &mut WriteQueue, io: &mut Io<'_>) {
        let mut outgoing = io.spare.pop().unwrap_or_else(Outgoing::new);
        std::mem::swap(&mut outgoing.queue, queue);
        self.sending = true;
        io.ring.send(io.slot, self.stream.as_raw_fd(), outgoing);
    }

    /// Drops whatever a failed send left unsent, and its count in the outbox.
    fn forget_unsent(&mut self, outgoing: &mut Outgoing) {
        let unsent = outgoing.queue.len();
        outgoing.queue.advance(unsent);
        if let Stage::Open(open) = &self.stage {
            let mut outbox = open.dispatch.conn().shared().lock();
            outbox.sending = outbox.sending.saturating_sub(unsent);
        }
    }

    /// Handles bytes that just arrived, where they landed.
    fn take(&mut self, chunk: &mut BytesMut, env: &Env<H>, slot: u32) {
        let read_size = env.core.config.read_buffer_size;
        let pool = &env.core.pool;
        match &mut self.stage {
            Stage::Handshake(handshake) => {
                if let Some(discarded) = &mut handshake.discarded {
                    *discarded += chunk.len();
                    return;
                }
                if handshake.refused {
                    return;
                }
                let before = self.read_buf.len();
                read_buf::prepare(&mut self.read_buf, 0, pool, read_size);
                self.read_buf.extend_from_slice(chunk);
                self.answer(before, env, slot);
            }
            Stage::Open(open) => {
                if let Some(discarded) = self.ending.as_mut().and_then(|e| e.discarded.as_mut()) {
                    *discarded += chunk.len();
                    return;
                }
                if open.dispatch.is_closed() {
                    return;
                }
                if self.sending && !self.paused {
                    // The reactor hands out send completions before receives,
                    // so a send still out did not go through at once: the
                    // peer is not reading. Like a blocked write on tokio, that
                    // stops the reading (see `pause`).
                    self.paused = true;
                    self.cancel_receive = true;
                }
                if self.paused || !self.read_buf.is_empty() {
                    let wanted = open.dispatch.bytes_wanted();
                    read_buf::prepare(&mut self.read_buf, wanted, pool, read_size);
                    self.read_buf.extend_from_slice(chunk);
                    if self.paused {
                        open.dispatch.heard_from_peer();
                    } else {
                        open.dispatch.input(&mut self.read_buf);
                        keep_partial_frame(&open.dispatch, &mut self.read_buf, env);
                    }
                    return;
                }
                open.dispatch.input(chunk);
                if !chunk.is_empty() && !open.dispatch.is_closed() {
                    // A partial frame: the only bytes ever copied out.
                    let wanted = open.dispatch.bytes_wanted().max(chunk.len());
                    read_buf::prepare(&mut self.read_buf, wanted, pool, read_size);
                    self.read_buf.extend_from_slice(chunk);
                }
            }
            Stage::Ended => {}
        }
    }

    /// Answers the request head once it is complete.
    fn answer(&mut self, arrived_from: usize, env: &Env<H>, slot: u32) {
        let Stage::Handshake(handshake) = &mut self.stage else {
            return;
        };
        let core = &env.core;
        if core.is_shutting_down() {
            return;
        }
        let response = &mut handshake.response;
        match upgrade::answer(&self.read_buf, arrived_from, &*env.handler, core, response) {
            Answer::Incomplete => {}
            Answer::Refused => handshake.refused = true,
            Answer::Accepted {
                state,
                head_len,
                deflate,
            } => {
                self.read_buf.advance(head_len);
                let peer = handshake.peer;
                // Sends from other threads, close requests and aborts list
                // this slot on the reactor's woken list.
                let wake = ConnWake::Slot(SlotWake::new(env.woken.clone(), slot));
                let accepted = Accepted {
                    peer,
                    response,
                    state,
                    deflate,
                };
                let (mut dispatch, registration) =
                    Dispatch::upgrade(core, &env.handler, accepted, wake);
                if !self.read_buf.is_empty() {
                    dispatch.input(&mut self.read_buf);
                }
                keep_partial_frame(&dispatch, &mut self.read_buf, env);
                self.stage = Stage::Open(Open {
                    dispatch,
                    _registration: registration,
                });
            }
        }
    }

    /// The handshake's turn; true once the connection is over.
    fn advance_handshake(&mut self, env: &Env<H>, io: &mut Io<'_>) -> bool {
        let expired = self.expired();
        let Stage::Handshake(handshake) = &mut self.stage else {
            unreachable!("called in the handshake stage");
        };
        let config = &env.core.config;
        if !handshake.refused {
            let refusal = if env.core.is_shutting_down() {
                Some((503, "server shutting down"))
            } else if failed(&self.ending) || (self.read_closed && self.read_buf.is_empty()) {
                // Connected and left (a port check), or broke: nothing to answer.
                return true;
            } else if self.read_closed {
                let e = HandshakeError::Incomplete;
                Some((e.status(), e.reason()))
            } else if expired {
                let e = HandshakeError::TimedOut;
                Some((e.status(), e.reason()))
            } else {
                None
            };
            match refusal {
                Some((status, reason)) => {
                    handshake::write_error(&mut handshake.response, status, reason);
                    handshake.refused = true;
                }
                None => return false,
            }
        }
        if failed(&self.ending) {
            return true;
        }
        if handshake.discarded.is_none() {
            if self.sending {
                return expired;
            }
            if !handshake.response.is_empty() {
                let mut response = std::mem::take(&mut handshake.response);
                // Refused: the rest is bounded by the close timeout.
                self.set_deadline(config.close_timeout);
                self.send(&mut response, io);
                return false;
            }
            // The response is out: FIN, then drain until the peer's.
            let _ = self.stream.shutdown(Shutdown::Write);
            self.read_buf.clear();
            read_buf::release(&mut self.read_buf, &env.core.pool);
            if let Stage::Handshake(handshake) = &mut self.stage {
                handshake.discarded = Some(0);
            }
            self.set_deadline(config.close_timeout);
            return false;
        }
        let discarded = handshake.discarded.unwrap_or(0);
        self.read_closed || discarded >= DRAIN_LIMIT || expired
    }

    /// An upgraded connection's turn; true once the connection is over.
    fn advance_open(&mut self, env: &Env<H>, io: &mut Io<'_>) -> bool {
        let config = &env.core.config;
        loop {
            let Stage::Open(open) = &mut self.stage else {
                unreachable!("called in the open stage");
            };
            let dispatch = &mut open.dispatch;
            let conn = dispatch.conn().clone();
            let shared = conn.shared();
            if std::mem::take(&mut self.cancel_receive) && self.receiving {
                io.ring.cancel(Op::Recv(io.slot));
            }
            if shared.take_attention() {
                dispatch.attend();
            }
            if dispatch.is_aborted() {
                return true;
            }
            let ending = self.ending.as_deref();
            if let Some(discarded) = ending.and_then(|ending| ending.discarded) {
                return self.read_closed || discarded >= DRAIN_LIMIT || self.expired();
            }
            if let Some(failure) = ending.and_then(|ending| ending.failure.as_deref()) {
                dispatch.abnormal(failure);
                return true;
            }
            if !dispatch.is_open() && ending.is_none_or(|ending| ending.deadline.is_none()) {
                self.set_deadline(config.close_timeout);
                continue;
            }
            if !self.sending {
                let mut outbox = shared.lock();
                if !outbox.queue.is_empty() {
                    // Senders need not wake us until this send is through: its
                    // completion looks at the queue again.
                    outbox.sending += outbox.queue.len();
                    let mut queue = std::mem::take(&mut outbox.queue);
                    let over = outbox.queued() >= config.max_outbound_bytes;
                    drop(outbox);
                    self.send(&mut queue, io);
                    if over && !self.paused {
                        self.pause(io);
                    }
                } else {
                    outbox.flush_scheduled = false;
                    drop(outbox);
                    dispatch.flushed();
                    if shared.has_pending_work() {
                        continue;
                    }
                    if dispatch.is_closed() {
                        if dispatch.peer_closed() {
                            // Both close frames are through and ours is
                            // written: close at once (RFC 6455 §7.1.1).
                            return true;
                        }
                        let _ = self.stream.shutdown(Shutdown::Write);
                        self.paused = false;
                        self.read_buf.clear();
                        read_buf::release(&mut self.read_buf, &env.core.pool);
                        let ending = self.ending();
                        ending.discarded = Some(0);
                        if ending.deadline.is_none() {
                            self.set_deadline(config.close_timeout);
                        }
                        continue;
                    }
                    if self.paused {
                        self.paused = false;
                        if !self.read_buf.is_empty() {
                            dispatch.input(&mut self.read_buf);
                            keep_partial_frame(dispatch, &mut self.read_buf, env);
                            continue;
                        }
                    }
                }
            }
            if self.expired() {
                let Stage::Open(open) = &mut self.stage else {
                    unreachable!("checked above");
                };
                let reason = if self.sending {
                    "write failed: close timeout passed"
                } else {
                    "close handshake timed out"
                };
                open.dispatch.abnormal(reason);
                return true;
            }
            let Stage::Open(open) = &mut self.stage else {
                unreachable!("checked above");
            };
            if self.read_closed && !open.dispatch.is_closed() {
                open.dispatch
                    .abnormal("connection closed without a close frame");
                return true;
            }
            return false;
        }
    }

    /// Stops handling received bytes until the queue has drained: a peer that
    /// does not read its replies stops being read from.
    fn pause(&mut self, io: &mut Io<'_>) {
        self.paused = true;
        if self.receiving {
            io.ring.cancel(Op::Recv(io.slot));
        }
    }
}

/// Whether reading or writing failed (a field's view, for where the stage is
/// borrowed).
fn failed(ending: &Option<Box<Ending>>) -> bool {
    ending
        .as_ref()
        .is_some_and(|ending| ending.failure.is_some())
}

/// After input: an emptied read buffer goes back to the pool; a closed
/// session's leftovers are dropped.
fn keep_partial_frame<H: Handler>(dispatch: &Dispatch<H>, buf: &mut BytesMut, env: &Env<H>) {
    if dispatch.is_closed() {
        buf.clear();
    }
    read_buf::release(buf, &env.core.pool);
}
