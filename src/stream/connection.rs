//! One connection over an async byte stream: one tokio task, the stream, a
//! read buffer borrowed from the pool only while it holds bytes, and a timer,
//! around the connection's [`Lifecycle`]. Everything here is plumbing: the
//! lifecycle decides, this file moves bytes through `poll_read` and
//! `poll_write_vectored`.
//!
//! The task wakes for the stream (readable, writable), for its `Conn` (a
//! send from elsewhere, a close request, an abort), for its timer (the
//! lifecycle's deadline, the keepalive sweep), and for the server's shutdown
//! and abort.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::{Env, Lifecycle};
use crate::connection::upgrade::Upgraded;
use crate::connection::wake::ConnWake;
use crate::driver::shutdown::ShutdownSeen;
use crate::driver::timer::Timer;
use crate::driver::turn::{Transport, Turn, turn};

/// How long an ended connection's last bytes may take to leave the stream
/// (see `Stream::close`).
const END_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How a connection over a stream starts.
pub(crate) enum Start<S> {
    /// The upgrade request comes next; `prefix` holds its first bytes,
    /// already read from the stream.
    Request { prefix: BytesMut },
    /// The upgrade was done elsewhere.
    Upgraded(Box<Upgraded<S>>),
}

/// Serves one connection over `stream` until it is over. `started` is when
/// the connection arrived: the handshake timeout counts from there (a TLS
/// handshake before the upgrade request uses part of it).
///
/// The future is the connection's whole task, so its size is what an idle
/// connection costs: an async block keeps room for everything it captures
/// for its whole life, beside whatever that is moved into. So it captures
/// the start boxed (a pointer, freed once the connection is built) and
/// `env`, and the connection is built inside, once.
pub(crate) fn serve<S, H>(
    stream: S,
    peer: SocketAddr,
    start: Start<H::State>,
    live: LiveGuard,
    env: Env<H>,
    started: Instant,
) -> impl Future<Output = ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let begin = Box::new(Begin {
        stream,
        peer,
        start,
        live,
        started,
    });
    async move {
        // The task's own waker: how the connection's `Conn` wakes it.
        let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        let mut connection = Connection::begin(begin, ConnWake::Waker(waker), &env);
        loop {
            // Re-armed after each shutdown or abort signal, so both are seen.
            let signal = env.hub.signaled();
            tokio::pin!(signal);
            signal.as_mut().enable();
            let over = poll_fn(|cx| {
                if signal.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                connection.poll(cx, &env).map(|()| true)
            })
            .await;
            if over {
                return;
            }
        }
    }
}

/// What a connection starts from (see [`serve`]).
struct Begin<S, T> {
    stream: S,
    peer: SocketAddr,
    start: Start<T>,
    live: LiveGuard,
    started: Instant,
}

struct Connection<S, H: Handler> {
    stream: Stream<S>,
    read_buf: BytesMut,
    timer: Timer,
    /// Keepalive pings and the idle timeout, when configured: the sweep, its
    /// timer, and when it is next due.
    /// Boxed: most servers have none, and the task's size is every idle
    /// connection's cost.
    keepalive: Option<Box<(Sweep, Timer, Instant)>>,
    seen: ShutdownSeen,
    life: Lifecycle<H>,
}

/// The stream and where its reads, writes and end stand.
struct Stream<S> {
    io: S,
    /// The stream has reported its end or an error: no more reads.
    read_done: bool,
    /// A read found nothing in this poll: the stream wakes the task when
    /// it has bytes.
    read_blocked: bool,
    /// The stream took nothing more in this poll: it wakes the task when
    /// it does. Reading goes on meanwhile.
    write_blocked: bool,
    /// Bytes were written that the stream may still hold (a TLS stream
    /// keeps records until flushed).
    unflushed: bool,
    /// The lifecycle asked for FIN and `poll_shutdown` has not finished.
    shutting_down: bool,
    /// Once over: until when the last bytes may take to go out.
    end_by: Option<Instant>,
}

impl<S: AsyncRead + AsyncWrite + Unpin, H: Handler> Connection<S, H> {
    /// The connection `begin` describes, woken through `wake`; `begin`'s
    /// box is freed here (taking it by value is the point: the task's
    /// future holds only the pointer).
    #[allow(clippy::boxed_local)]
    fn begin(begin: Box<Begin<S, H::State>>, wake: ConnWake, env: &Env<H>) -> Self {
        let Begin {
            stream,
            peer,
            start,
            live,
            started,
        } = *begin;
        let (life, mut read_buf) = match start {
            Start::Request { prefix } => {
                let life = Lifecycle::accept(peer, live, wake, env, started);
                (life, prefix)
            }
            Start::Upgraded(upgraded) => Lifecycle::upgraded(peer, live, wake, *upgraded, env),
        };
        let mut connection = Connection {
            stream: Stream {
                io: stream,
                read_done: false,
                read_blocked: false,
                write_blocked: false,
                unflushed: false,
                shutting_down: false,
                end_by: None,
            },
            read_buf: BytesMut::new(),
            timer: Timer::default(),
            keepalive: Sweep::new(&env.hub.config)
                .map(|sweep| Box::new((sweep, Timer::default(), started))),
            seen: ShutdownSeen::default(),
            life,
        };
        if !read_buf.is_empty() {
            connection.life.handle_input(&mut read_buf, env, started);
            // Kept only while it holds bytes (its capacity would be kept
            // across the connection's life otherwise).
            connection.read_buf = read_buf;
        }
        connection
    }

    /// Does everything that can be done now; ready once the connection is
    /// over.
    fn poll(&mut self, cx: &mut Context<'_>, env: &Env<H>) -> Poll<()> {
        let hub = &env.hub;
        // An open connection closes with 1001 (a handshake answers 503 when
        // it sees the flag), or drops at once after the timeout.
        let life = &self.life;
        self.seen
            .act(hub, |act| life.conn().into_iter().for_each(act));
        // One clock read per turn (see the tokio driver).
        let now = Instant::now();
        self.sweep_if_due(cx, now, hub.input_frozen());
        // Both are per poll: the stream wakes the task when either changes.
        self.stream.read_blocked = false;
        self.stream.write_blocked = false;
        let (stream, read_buf) = (&mut self.stream, &mut self.read_buf);
        let poll = match turn(&mut self.life, stream, read_buf, cx, env, now) {
            Turn::Pending => Poll::Pending,
            Turn::Done => Poll::Ready(()),
        };
        // What this poll counted, added once.
        hub.meters().flush();
        let deadline = self.stream.end_by.or_else(|| self.life.poll_timeout());
        self.timer.follow(deadline, cx);
        poll
    }

    /// Runs the keepalive sweep over this one connection when it is due.
    /// (Not while `waits`: see `Hub::input_frozen`.)
    fn sweep_if_due(&mut self, cx: &mut Context<'_>, now: Instant, waits: bool) {
        let Some((sweep, timer, due)) = self.keepalive.as_deref_mut() else {
            return;
        };
        if now >= *due {
            *due = now + sweep.period;
            if !waits {
                self.life.handle_sweep(sweep);
            }
        }
        timer.follow(Some(*due), cx);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream<S> {
    /// Flushes what was written, then ends the stream's sending side (FIN;
    /// a TLS stream sends its close_notify first).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(_) => self.unflushed = false,
            }
        }
        Pin::new(&mut self.io).poll_shutdown(cx).map(|_| ())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Transport for Stream<S> {
    fn progress(&mut self, cx: &mut Context<'_>) {
        if self.shutting_down && self.poll_end(cx).is_ready() {
            self.shutting_down = false;
        }
    }

    fn writable(&self) -> bool {
        !self.write_blocked
    }

    fn write(&mut self, cx: &mut Context<'_>, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.unflushed = true;
        match Pin::new(&mut self.io).poll_write_vectored(cx, slices) {
            Poll::Ready(result) => result,
            Poll::Pending => {
                self.write_blocked = true;
                Err(io::ErrorKind::WouldBlock.into())
            }
        }
    }

    fn written(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.unflushed {
            return Ok(());
        }
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(result) => {
                self.unflushed = false;
                result
            }
            Poll::Pending => Ok(()),
        }
    }

    fn readable(&self) -> bool {
        !self.read_done && !self.read_blocked
    }

    fn read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, buf);
        match &read {
            Poll::Ready(Ok(0) | Err(_)) => self.read_done = true,
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => self.read_blocked = true,
        }
        read
    }

    fn shut_down(&mut self, _: &mut Context<'_>) {
        self.shutting_down = true;
    }

    /// The last bytes (a close frame) and a TLS close_notify get a bounded
    /// while to go out: a stream may pass them on over a few polls (an h2
    /// stream hands them to its connection's task), and one dropped with
    /// them unsent resets and loses them. A peer that reads nothing holds
    /// the task END_GRACE at most; an abort, not at all.
    fn end(&mut self, cx: &mut Context<'_>, now: Instant, aborting: bool) -> bool {
        let end_by = *self.end_by.get_or_insert(now + END_GRACE);
        self.poll_end(cx).is_ready() || now >= end_by || aborting
    }
}
