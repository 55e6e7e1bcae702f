//! One connection on tokio: a state machine the connection's group drives
//! whenever its socket is ready or something woke it.
//!
//! Reads happen only when the socket is readable: then a buffer is taken from
//! the pool, and it goes back before the connection sleeps unless a partial
//! frame is left in it. Everything the callbacks and the protocol queue while
//! handling one read goes out in one `writev`. While a write is
//! blocked the connection does not read, so a peer that does not read its
//! replies stops being read from.
//!
//! Nothing here waits: `advance` does what can be done without blocking and
//! returns. Readiness comes from the group's epoll (`on_event`); sends, close
//! requests, aborts and the connection's timers wake it through the waker in
//! the `Context` it is given.

use std::future::Future;
use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

use bytes::{Buf, BytesMut};
use tokio::time::{Instant, Sleep, sleep};

use crate::conn::{Conn, ConnShared};
use crate::dispatch::{Accepted, Dispatch};
use crate::handler::Handler;
use crate::handshake::{self, HandshakeError};
use crate::keepalive::Sweep;
use crate::pool::BufferPool;
use crate::proto::WriteQueue;
use crate::proto::deflate::DeflateParams;
use crate::read_buf::{self, DRAIN_LIMIT};
use crate::server::{LiveGuard, Registration, ServerCore, deadline_after};
use crate::slot_waker::ConnWake;
use crate::upgrade::{self, Answer};

use super::sys::recv_into_spare;

/// How many iovecs one `writev` takes at most.
const MAX_IOVECS: usize = 64;

/// Reads one connection may do in one turn before the others get theirs.
const READS_PER_TURN: usize = 16;

/// What a group shares with all its connections.
pub(crate) struct Env<H> {
    pub(crate) core: Arc<ServerCore>,
    pub(crate) handler: Arc<H>,
}

/// Whether the group keeps the connection after a turn.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Waiting for readiness, a wake-up or a timer.
    Pending,
    /// Over: drop it (which closes the socket and ends the registration).
    Done,
}

/// An accepted TCP connection, from the handshake to the last byte.
pub(crate) struct Connection<H: Handler> {
    // Declared first, so the socket is closed before the live guard in `stage`
    // is dropped: once `serve` sees no live connection, none is open.
    socket: Socket,
    stage: Stage<H>,
}

// `Open` is the stage a connection spends its life in, and the whole
// `Connection` is boxed by its group already: boxing `Open` too would add an
// allocation and a pointer to every connection.
#[allow(clippy::large_enum_variant)]
enum Stage<H: Handler> {
    /// Reading the request, or answering it with an HTTP error (boxed: it is
    /// short-lived, and an upgraded connection should not carry its size).
    Handshake(Box<Handshake>),
    Open(Open<H>),
    /// Between two stages; never seen by `advance`.
    Gone,
}

struct Handshake {
    peer: SocketAddr,
    /// The handshake timeout; once refused, the close timeout.
    deadline: Pin<Box<Sleep>>,
    /// The `101` (moved into the connection's queue) or the error response.
    response: WriteQueue,
    refused: bool,
    /// Set once the error response is out and FIN sent: bytes discarded since.
    discarded: Option<usize>,
    live: LiveGuard,
}

/// An upgraded connection.
struct Open<H: Handler> {
    dispatch: Dispatch<H>,
    /// Once a close frame is queued (ours, our reply, or a failure), every
    /// remaining step, writes included, is bounded by this deadline.
    close_deadline: Option<Pin<Box<Sleep>>>,
    /// Set once our FIN is sent: bytes discarded while waiting for the peer's.
    discarded: Option<usize>,
    _registration: Registration,
    _live: LiveGuard,
}

impl<H: Handler> Connection<H> {
    pub(crate) fn accept(
        stream: mio::net::TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        env: &Env<H>,
    ) -> Self {
        let handshake = Handshake {
            peer,
            deadline: Box::pin(sleep(env.core.config.handshake_timeout)),
            response: WriteQueue::new(),
            refused: false,
            discarded: None,
            live,
        };
        Connection {
            socket: Socket {
                stream,
                read_buf: BytesMut::new(),
                readable: false,
                writable: false,
                read_closed: false,
                blocked: false,
                drained: false,
            },
            stage: Stage::Handshake(Box::new(handshake)),
        }
    }

    /// Records what the group's epoll reported for this socket. Errors and
    /// hang-ups count as both, so the next read or write reports them.
    pub(crate) fn on_event(&mut self, event: &mio::event::Event) {
        let failed = event.is_error();
        let read_closed = failed || event.is_read_closed();
        self.socket.read_closed |= read_closed;
        self.socket.readable |= read_closed || event.is_readable();
        self.socket.writable |= failed || event.is_write_closed() || event.is_writable();
    }

    /// Does everything that can be done now. `cx` carries the connection's own
    /// waker, for its timers and its `Conn`.
    pub(crate) fn advance(&mut self, cx: &mut Context<'_>, env: &Env<H>) -> Progress {
        let progress = loop {
            match &mut self.stage {
                Stage::Handshake(handshake) if handshake.refused => {
                    break self.socket.refuse(handshake, cx, env);
                }
                Stage::Handshake(handshake) => match self.socket.read_upgrade(handshake, cx, env) {
                    Upgrade::Pending => break Progress::Pending,
                    Upgrade::Gone => break Progress::Done,
                    Upgrade::Refused => {
                        handshake.refused = true;
                        let close_by =
                            Instant::from_std(deadline_after(env.core.config.close_timeout));
                        handshake.deadline.as_mut().reset(close_by);
                    }
                    Upgrade::Accepted(state, deflate) => {
                        let Stage::Handshake(handshake) =
                            std::mem::replace(&mut self.stage, Stage::Gone)
                        else {
                            unreachable!("matched above");
                        };
                        let wake = ConnWake::Waker(cx.waker().clone());
                        let opened = self.socket.open(*handshake, state, deflate, wake, env);
                        self.stage = Stage::Open(opened);
                    }
                },
                Stage::Open(open) => break self.socket.drive(open, cx, env),
                Stage::Gone => break Progress::Done,
            }
        };
        if progress == Progress::Done {
            self.socket.read_buf.clear();
            self.socket.release_buffer(&env.core.pool);
        }
        progress
    }

    /// One keepalive sweep, if the connection is open (see `keepalive`).
    pub(crate) fn sweep(&mut self, sweep: &Sweep) {
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.sweep(sweep);
        }
    }

    /// The connection's handle, once upgraded.
    pub(crate) fn conn(&self) -> Option<&Conn> {
        match &self.stage {
            Stage::Open(open) => Some(open.dispatch.conn()),
            _ => None,
        }
    }
}

/// What reading the upgrade request came to.
enum Upgrade<S> {
    Pending,
    /// The `101` is queued and the request is gone from the read buffer;
    /// with the permessage-deflate parameters, if agreed.
    Accepted(S, Option<DeflateParams>),
    /// An error response is queued.
    Refused,
    /// The peer left, or the socket failed: nothing to answer.
    Gone,
}

/// The TCP stream, what epoll last said about it, and the read buffer, which
/// is borrowed from the pool only while there is something in it.
struct Socket {
    stream: mio::net::TcpStream,
    read_buf: BytesMut,
    /// Reads may find data: set by an epoll event, cleared by a read that
    /// found the kernel's queue empty (edge-triggered, so a later arrival
    /// brings a new event).
    readable: bool,
    /// Writes may make progress: set by an event, cleared by `WouldBlock`.
    writable: bool,
    /// The peer's FIN (or an error) was reported: there is no later event, so
    /// the socket stays readable until a read returns the end (or the error).
    read_closed: bool,
    /// The last write stopped at `WouldBlock`: the kernel's buffers are full.
    blocked: bool,
    /// A write made progress after one was blocked, since the flag was last
    /// taken: the peer is reading (for the keepalive sweep). A write that
    /// never blocked proves nothing: the kernel takes bytes for a peer that
    /// reads nothing, until its buffers are full.
    drained: bool,
}

impl Socket {
    /// Reads until the upgrade request is complete, then answers it into
    /// `handshake.response`.
    fn read_upgrade<H: Handler>(
        &mut self,
        handshake: &mut Handshake,
        cx: &mut Context<'_>,
        env: &Env<H>,
    ) -> Upgrade<H::State> {
        let core = &env.core;
        let max_head_len = core.config.max_handshake_size;
        let refuse = |out: &mut WriteQueue, e: HandshakeError| {
            handshake::write_error(out, e.status(), e.reason());
            Upgrade::Refused
        };
        loop {
            if core.is_shutting_down() {
                handshake::write_error(&mut handshake.response, 503, "server shutting down");
                return Upgrade::Refused;
            }
            if !self.readable {
                // Checked only when nothing more can be read: a request that
                // has arrived is answered, even at the deadline.
                if handshake.deadline.as_mut().poll(cx).is_ready() {
                    return refuse(&mut handshake.response, HandshakeError::TimedOut);
                }
                self.release_buffer(&core.pool);
                return Upgrade::Pending;
            }
            let before = self.read_buf.len();
            let read_size = core.config.read_buffer_size;
            match self.read(max_head_len + 1, &core.pool, read_size) {
                Ok(0) if before == 0 => {
                    // Connected and left (a port check): nothing to answer.
                    return Upgrade::Gone;
                }
                Ok(0) => return refuse(&mut handshake.response, HandshakeError::Incomplete),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return Upgrade::Gone,
            }
            if core.is_shutting_down() {
                continue;
            }
            let out = &mut handshake.response;
            match upgrade::answer(&self.read_buf, before, &*env.handler, core, out) {
                Answer::Incomplete => continue,
                Answer::Refused => return Upgrade::Refused,
                Answer::Accepted {
                    state,
                    head_len,
                    deflate,
                } => {
                    self.read_buf.advance(head_len);
                    return Upgrade::Accepted(state, deflate);
                }
            }
        }
    }

    /// Opens the upgraded connection: counts it, queues the `101` first (so
    /// whatever `on_open` sends follows it in the same write), calls `on_open`,
    /// and handles frames that arrived together with the request. Its `Conn`
    /// wakes the group through `wake`.
    fn open<H: Handler>(
        &mut self,
        handshake: Handshake,
        state: H::State,
        deflate: Option<DeflateParams>,
        wake: ConnWake,
        env: &Env<H>,
    ) -> Open<H> {
        let Handshake {
            peer,
            mut response,
            live,
            ..
        } = handshake;
        let accepted = Accepted {
            peer,
            response: &mut response,
            state,
            deflate,
        };
        let (mut dispatch, registration) =
            Dispatch::upgrade(&env.core, &env.handler, accepted, wake);
        if !self.read_buf.is_empty() {
            dispatch.input(&mut self.read_buf);
        }
        Open {
            dispatch,
            close_deadline: None,
            discarded: None,
            _registration: registration,
            _live: live,
        }
    }

    /// Writes the error response of a refused handshake (within the close
    /// timeout), then ends TCP.
    fn refuse<H: Handler>(
        &mut self,
        handshake: &mut Handshake,
        cx: &mut Context<'_>,
        env: &Env<H>,
    ) -> Progress {
        let config = &env.core.config;
        if handshake.discarded.is_none() {
            match self.write(&mut handshake.response) {
                Ok(true) => {
                    self.end_tcp();
                    handshake.discarded = Some(0);
                    let close_by = Instant::from_std(deadline_after(config.close_timeout));
                    handshake.deadline.as_mut().reset(close_by);
                }
                Ok(false) if handshake.deadline.as_mut().poll(cx).is_pending() => {
                    return Progress::Pending;
                }
                Ok(false) | Err(_) => return Progress::Done,
            }
        }
        let discarded = handshake.discarded.as_mut().expect("set above");
        self.drain(discarded, &mut handshake.deadline, cx, env)
    }

    /// One turn of an upgraded connection: act on what other tasks asked for,
    /// write the queue, then read and handle frames until the socket is empty,
    /// the turn's reads are used up, or a write blocks.
    fn drive<H: Handler>(
        &mut self,
        open: &mut Open<H>,
        cx: &mut Context<'_>,
        env: &Env<H>,
    ) -> Progress {
        let config = &env.core.config;
        let pool = &env.core.pool;
        let dispatch = &mut open.dispatch;
        let conn = dispatch.conn().clone();
        let shared = conn.shared();
        let mut reads = 0;
        loop {
            if shared.take_attention() {
                dispatch.attend();
            }
            if dispatch.is_aborted() {
                return Progress::Done;
            }
            if let Some(discarded) = &mut open.discarded {
                let deadline = open.close_deadline.as_mut().expect("set before FIN");
                return self.drain(discarded, deadline, cx, env);
            }
            if !dispatch.is_open() && open.close_deadline.is_none() {
                open.close_deadline = Some(Box::pin(sleep(config.close_timeout)));
            }
            let expired = |deadline: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>| {
                deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready())
            };
            let flushed = self.flush(shared);
            if std::mem::take(&mut self.drained) {
                dispatch.heard_from_peer();
            }
            match flushed {
                Ok(true) => {}
                Ok(false) if expired(&mut open.close_deadline, cx) => {
                    dispatch.abnormal("write failed: close timeout passed");
                    return Progress::Done;
                }
                // A writable event, an abort or the deadline comes next.
                Ok(false) => return Progress::Pending,
                Err(error) => {
                    dispatch.abnormal(&format!("write failed: {error}"));
                    return Progress::Done;
                }
            }
            dispatch.flushed();
            if dispatch.is_closed() {
                if dispatch.peer_closed() {
                    // Both close frames are through and ours is written: the
                    // peer may send nothing more, so the socket is closed at
                    // once (the server closes TCP first, RFC 6455 §7.1.1).
                    // Waiting for its FIN would cost a shutdown, a read and a
                    // wake-up per connection.
                    return Progress::Done;
                }
                self.end_tcp();
                open.discarded = Some(0);
                open.close_deadline
                    .get_or_insert_with(|| Box::pin(sleep(config.close_timeout)));
                continue;
            }
            if expired(&mut open.close_deadline, cx) {
                dispatch.abnormal("close handshake timed out");
                return Progress::Done;
            }
            if !self.readable {
                if shared.has_pending_work() {
                    continue;
                }
                self.release_buffer(pool);
                return Progress::Pending;
            }
            if reads == READS_PER_TURN {
                // More may be waiting; let the group's other connections go first.
                cx.waker().wake_by_ref();
                return Progress::Pending;
            }
            reads += 1;
            match self.read(dispatch.bytes_wanted(), pool, config.read_buffer_size) {
                Ok(0) => {
                    dispatch.abnormal("connection closed without a close frame");
                    return Progress::Done;
                }
                Ok(_) => dispatch.input(&mut self.read_buf),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => {
                    dispatch.abnormal(&format!("read failed: {error}"));
                    return Progress::Done;
                }
            }
        }
    }

    /// Writes the connection's queue; true once it is empty. The buffer of an
    /// emptied queue goes back to the pool.
    fn flush(&mut self, shared: &ConnShared) -> io::Result<bool> {
        let mut outbox = shared.lock();
        if outbox.queue.is_empty() {
            outbox.flush_scheduled = false;
            return Ok(true);
        }
        if !self.writable {
            // Senders need not wake us: the writable event will.
            return Ok(false);
        }
        outbox.flush_scheduled = false;
        let done = self.write(&mut outbox.queue)?;
        if done {
            if let Some(buf) = outbox.queue.take_buffer() {
                shared.pool().give(buf);
            }
        }
        Ok(done)
    }

    /// Writes as much of `queue` as the socket takes without blocking. Returns
    /// true once the queue is empty.
    fn write(&mut self, queue: &mut WriteQueue) -> io::Result<bool> {
        while !queue.is_empty() {
            let written = {
                let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
                let n = queue.io_slices(&mut slices);
                self.stream.write_vectored(&slices[..n])
            };
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    queue.advance(n);
                    self.drained |= std::mem::take(&mut self.blocked);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    self.blocked = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads once into the pooled buffer, sized for the frame in progress.
    /// A read that leaves room in the buffer emptied the kernel's queue, so the
    /// socket counts as not readable until the next event: at one message per
    /// wake-up that saves a read that could only return EAGAIN.
    fn read(
        &mut self,
        bytes_wanted: usize,
        pool: &BufferPool,
        read_size: usize,
    ) -> io::Result<usize> {
        self.prepare_buffer(bytes_wanted, pool, read_size);
        let room = self.read_buf.capacity() - self.read_buf.len();
        loop {
            match recv_into_spare(self.stream.as_fd(), &mut self.read_buf) {
                Ok(n) => {
                    if n < room && !self.read_closed {
                        self.readable = false;
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        self.readable = false;
                    }
                    return Err(e);
                }
            }
        }
    }

    fn prepare_buffer(&mut self, bytes_wanted: usize, pool: &BufferPool, read_size: usize) {
        read_buf::prepare(&mut self.read_buf, bytes_wanted, pool, read_size);
    }

    fn release_buffer(&mut self, pool: &BufferPool) {
        read_buf::release(&mut self.read_buf, pool);
    }

    /// The server closes TCP first (RFC 6455 §7.1.1): sends FIN.
    fn end_tcp(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// After our FIN: reads and discards until the peer's FIN, so that unread
    /// bytes do not turn our close (or error response) into a reset, up to the
    /// deadline and [`DRAIN_LIMIT`] bytes.
    fn drain<H>(
        &mut self,
        discarded: &mut usize,
        deadline: &mut Pin<Box<Sleep>>,
        cx: &mut Context<'_>,
        env: &Env<H>,
    ) -> Progress {
        let pool = &env.core.pool;
        loop {
            if *discarded >= DRAIN_LIMIT || deadline.as_mut().poll(cx).is_ready() {
                return Progress::Done;
            }
            if !self.readable {
                self.release_buffer(pool);
                return Progress::Pending;
            }
            self.read_buf.clear();
            match self.read(0, pool, env.core.config.read_buffer_size) {
                Ok(0) => return Progress::Done,
                Ok(n) => *discarded += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Progress::Done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each idle connection is one of these (boxed, in its group's slab); its
    /// size is a large share of what a connection costs (BENCHMARKS.md,
    /// scenario 4). The handshake stage is boxed and must not size it.
    #[test]
    fn an_upgraded_connection_is_sized_by_its_open_state() {
        struct Quiet;
        impl Handler for Quiet {
            type State = ();
            fn on_upgrade(
                &self,
                _: &crate::Request<'_>,
                _: &mut crate::Accept,
            ) -> Result<(), crate::Reject> {
                Ok(())
            }
            fn on_message(&self, _: &crate::Conn, _: &mut (), _: crate::Message<'_>) {}
        }
        let open = size_of::<Open<Quiet>>();
        let connection = size_of::<Connection<Quiet>>();
        assert!(
            connection <= open + size_of::<Socket>() + 8,
            "connection is {connection} bytes, its open state {open}"
        );
    }
}
