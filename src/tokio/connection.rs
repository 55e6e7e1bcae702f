//! One connection on tokio: its socket, what epoll last said about it, its
//! read buffer and its timer, around the connection's [`Lifecycle`]. The
//! group calls [`Connection::advance`] whenever the socket is ready or
//! something woke the connection; this file only moves bytes and keeps the
//! timer on the lifecycle's deadline.
//!
//! Reads happen only when the socket is readable: then a buffer is taken from
//! the pool, and it goes back before the connection sleeps unless a partial
//! frame is left in it. Everything the callbacks and the protocol queue while
//! handling one read goes out in one `writev`.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::BytesMut;

use crate::connection::conn::Conn;
use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::{Env, Lifecycle};
use crate::connection::upgrade::Upgraded;
use crate::connection::wake::{ConnWake, SlotWake};
use crate::driver::timer::Timer;
use crate::driver::turn::{Transport, Turn, turn};

use super::sys::recv_into_spare;

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
    // Declared first, so the socket is closed before the live guard in the
    // lifecycle is dropped: once `serve` sees no live connection, none is open.
    socket: Socket,
    /// Borrowed from the pool only while there is something in it.
    read_buf: BytesMut,
    /// On the lifecycle's deadline.
    timer: Timer,
    life: Lifecycle<H>,
}

impl<H: Handler> Connection<H> {
    /// A new connection; its `Conn` will wake the group through `wake`.
    pub(crate) fn accept(
        stream: mio::net::TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
        proxy_header: bool,
    ) -> Self {
        let now = std::time::Instant::now();
        let mut life = Lifecycle::accept(peer, live, wake, env, now);
        if proxy_header {
            life.expect_proxy_header(env, now);
        }
        Connection {
            socket: Socket::new(stream),
            read_buf: BytesMut::new(),
            timer: Timer::default(),
            life,
        }
    }

    /// A connection whose handshake was done before it came (a client's):
    /// it opens at once, calling `on_open`, with the bytes read after the
    /// handshake in its read buffer (see [`Connection::receive_pending`]).
    pub(crate) fn opened(
        stream: mio::net::TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        wake: ConnWake,
        upgraded: Upgraded<H::State>,
        env: &Env<H>,
    ) -> Self {
        let (life, prefix) = Lifecycle::upgraded(peer, live, wake, upgraded, env);
        Connection {
            socket: Socket::new(stream),
            read_buf: prefix,
            timer: Timer::default(),
            life,
        }
    }

    /// Hands bytes already in the read buffer (frames that came with a
    /// client's `101`) to the lifecycle; the next turn writes what they
    /// caused.
    pub(crate) fn receive_pending(&mut self, env: &Env<H>) {
        if !self.read_buf.is_empty() {
            let now = std::time::Instant::now();
            self.life.handle_input(&mut self.read_buf, env, now);
        }
    }

    /// Hands `read` (what a router read before handing the connection
    /// over) to the lifecycle, as if it had just been received.
    pub(crate) fn receive_read(&mut self, read: BytesMut, env: &Env<H>) {
        // Counted as the turn counts what it reads.
        env.hub.meters().received(0, read.len() as u64);
        self.read_buf = read;
        self.receive_pending(env);
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

    /// Does everything that can be done now: what the lifecycle asks for, as
    /// far as the socket allows (the shared [`turn`]). `cx` carries the
    /// connection's own waker, for its timer.
    pub(crate) fn advance(&mut self, cx: &mut Context<'_>, env: &Env<H>) -> Progress {
        // One clock read per turn: a turn is short, and deadlines are far
        // coarser than it.
        let now = Instant::now();
        let (socket, read_buf) = (&mut self.socket, &mut self.read_buf);
        let progress = match turn(&mut self.life, socket, read_buf, cx, env, now) {
            Turn::Pending => Progress::Pending,
            Turn::Done => Progress::Done,
        };
        self.timer.follow(self.life.poll_timeout(), cx);
        progress
    }

    /// One keepalive sweep, if the connection is open (see `keepalive`).
    pub(crate) fn sweep(&mut self, sweep: &Sweep) {
        self.life.handle_sweep(sweep);
    }

    /// The connection's handle, once upgraded.
    pub(crate) fn conn(&self) -> Option<&Conn> {
        self.life.conn()
    }

    /// The group's wake state for this connection, kept by the lifecycle
    /// (the slot keeps no copy); none once the connection is done.
    pub(crate) fn slot_wake(&self) -> Option<&Arc<SlotWake>> {
        self.life.wake().and_then(ConnWake::shared)
    }
}

/// The handoff (feature `handoff`): a connection leaving for the next
/// process, or arriving from the previous one.
#[cfg(all(target_os = "linux", feature = "handoff"))]
impl<H: Handler> Connection<H> {
    /// The connection's state as a record, its read buffer in it; then
    /// only its socket is left (see [`Connection::into_stream`]). `Err`
    /// says why it stays, unchanged.
    pub(crate) fn hand_off(
        &mut self,
        env: &Env<H>,
    ) -> Result<crate::connection::record::Moved, &'static str> {
        self.life.hand_off(&mut self.read_buf, env)
    }

    /// Requests are handled again after a failed handoff: one waiting in
    /// the read buffer is handled now (see `Lifecycle::thaw`).
    pub(crate) fn thaw(&mut self, env: &Env<H>) {
        self.life.thaw(&mut self.read_buf, env);
    }

    /// The socket, without a word to the peer (after `hand_off`, or to
    /// hand back one that could not start).
    pub(crate) fn into_stream(self) -> mio::net::TcpStream {
        let Connection { socket, .. } = self;
        socket.stream
    }

    /// A connection handed over by the previous process. The socket counts
    /// as readable and writable until it says otherwise: it may hold bytes
    /// the previous process never read. `Err` with the socket and the
    /// bytes to write before closing it, if the handler refused it.
    pub(crate) fn take_over(
        stream: mio::net::TcpStream,
        live: LiveGuard,
        wake: ConnWake,
        arriving: crate::connection::record::Arriving,
        env: &Env<H>,
    ) -> Result<Self, (mio::net::TcpStream, Vec<u8>)> {
        let now = std::time::Instant::now();
        match Lifecycle::take_over(arriving, live, wake, env, now) {
            Ok((life, read_buf)) => Ok(Connection {
                socket: Socket {
                    stream,
                    readable: true,
                    writable: true,
                    read_closed: false,
                },
                read_buf,
                timer: Timer::default(),
                life,
            }),
            Err(goodbye) => Err((stream, goodbye)),
        }
    }
}

/// The TCP stream and what epoll last said about it.
struct Socket {
    stream: mio::net::TcpStream,
    /// Reads may find data: set by an epoll event, cleared by a read that
    /// found the kernel's queue empty (edge-triggered, so a later arrival
    /// brings a new event).
    readable: bool,
    /// Writes may make progress: set by an event, cleared by `WouldBlock`.
    writable: bool,
    /// The peer's FIN (or an error) was reported: there is no later event, so
    /// the socket stays readable until a read returns the end (or the error).
    read_closed: bool,
}

impl Socket {
    /// A socket just accepted or connected: no event seen yet.
    fn new(stream: mio::net::TcpStream) -> Self {
        Socket {
            stream,
            readable: false,
            writable: false,
            read_closed: false,
        }
    }
}

impl Transport for Socket {
    fn writable(&self) -> bool {
        self.writable
    }

    /// One non-blocking `writev`; `WouldBlock` marks the socket not writable
    /// until the next event.
    fn write(&mut self, _: &mut Context<'_>, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let written = self.stream.write_vectored(slices);
        if matches!(&written, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.writable = false;
        }
        written
    }

    fn readable(&self) -> bool {
        self.readable
    }

    /// Reads once into the pooled buffer, sized for the frame in progress.
    /// A read that leaves room in the buffer emptied the kernel's queue, so the
    /// socket counts as not readable until the next event: at one message per
    /// wake-up that saves a read that could only return EAGAIN.
    fn read(&mut self, _: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let room = buf.capacity() - buf.len();
        loop {
            match recv_into_spare(self.stream.as_fd(), buf) {
                Ok(n) => {
                    if n < room && !self.read_closed {
                        self.readable = false;
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Sends FIN.
    fn shut_down(&mut self, _: &mut Context<'_>) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Dropping the socket closes it; the kernel sends what it holds.
    fn end(&mut self, _: &mut Context<'_>, _: Instant, _: bool) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::handler::Quiet;

    /// Each idle connection is one of these (boxed, in its group's slab); its
    /// size is a large share of what a connection costs (BENCHMARKS.md,
    /// scenario 4). The handshake stage is boxed and must not size it.
    #[test]
    fn an_upgraded_connection_is_sized_by_its_lifecycle_and_socket() {
        let life = size_of::<Lifecycle<Quiet>>();
        let connection = size_of::<Connection<Quiet>>();
        assert!(
            connection <= life + size_of::<Socket>() + size_of::<BytesMut>() + 8,
            "connection is {connection} bytes, its lifecycle {life}"
        );
        // glibc's chunks grow in 16-byte steps and keep 8 bytes of each
        // (docs/memory.md has the sums). Every feature is on in the gate's
        // tests. The lifecycle is in every driver's connection: 216 bytes
        // keep io_uring's in a 272-byte chunk.
        assert!(life <= 216, "the lifecycle is {life} bytes");
        // With the `Arc`'s two counts, 216 bytes: a 224-byte chunk.
        let shared = size_of::<crate::connection::outbox::ConnShared>();
        assert!(shared <= 200, "ConnShared is {shared} bytes");
    }
}
