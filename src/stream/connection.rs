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

use crate::connection::endpoint::LiveGuard;
use crate::connection::handler::Handler;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::{Action, Env, Lifecycle};
use crate::connection::upgrade::Upgraded;
use crate::connection::wake::ConnWake;
use crate::driver::read_buf;
use crate::driver::shutdown::ShutdownSeen;
use crate::driver::timer::Timer;

/// Reads one connection may do in one poll before its task yields.
const READS_PER_POLL: usize = 16;

/// How long an ended connection's last bytes may take to leave the stream
/// (see `Action::Close` in `Connection::poll`).
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
pub(crate) async fn serve<S, H>(
    stream: S,
    peer: SocketAddr,
    start: Start<H::State>,
    live: LiveGuard,
    env: Env<H>,
    started: Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    // The task's own waker: how the connection's `Conn` wakes it.
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    let wake = ConnWake::Waker(waker);
    let (life, mut read_buf) = match start {
        Start::Request { prefix } => {
            let life = Lifecycle::accept(peer, live, wake, &env, started);
            (life, prefix)
        }
        Start::Upgraded(upgraded) => Lifecycle::upgraded(peer, live, wake, *upgraded, &env),
    };
    let mut connection = Connection {
        stream,
        read_buf: BytesMut::new(),
        read_done: false,
        unflushed: false,
        shutting_down: false,
        timer: Timer::default(),
        keepalive: Sweep::new(&env.endpoint.config).map(|sweep| (sweep, Timer::default(), started)),
        seen: ShutdownSeen::default(),
        end_by: None,
        life,
    };
    if read_buf.is_empty() {
        // Not kept across the connection's life (its capacity would be).
        drop(read_buf);
    } else {
        connection.life.receive(&mut read_buf, &env, started);
        connection.read_buf = read_buf;
    }
    let endpoint = env.endpoint.clone();
    loop {
        // Re-armed after each shutdown or abort signal, so both are seen.
        let signal = endpoint.signaled();
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

struct Connection<S, H: Handler> {
    stream: S,
    read_buf: BytesMut,
    /// The stream has reported its end or an error: no more reads.
    read_done: bool,
    /// Bytes were written that the stream may still hold (a TLS stream
    /// keeps records until flushed).
    unflushed: bool,
    /// The lifecycle asked for FIN and `poll_shutdown` has not finished.
    shutting_down: bool,
    timer: Timer,
    /// Keepalive pings and the idle timeout, when configured: the sweep, its
    /// timer, and when it is next due.
    keepalive: Option<(Sweep, Timer, Instant)>,
    seen: ShutdownSeen,
    /// Once over: until when the last bytes may take to go out.
    end_by: Option<Instant>,
    life: Lifecycle<H>,
}

impl<S: AsyncRead + AsyncWrite + Unpin, H: Handler> Connection<S, H> {
    /// Does everything that can be done now; ready once the connection is
    /// over.
    fn poll(&mut self, cx: &mut Context<'_>, env: &Env<H>) -> Poll<()> {
        let endpoint = &env.endpoint;
        // An open connection closes with 1001 (a handshake answers 503 when
        // it sees the flag), or drops at once after the timeout.
        let life = &self.life;
        self.seen
            .act(endpoint, |act| life.conn().into_iter().for_each(act));
        // One clock read per turn (see the tokio driver).
        let now = Instant::now();
        self.sweep_if_due(cx, now);
        let pool = &endpoint.pool;
        let mut reads = 0;
        // The stream took nothing more in this poll: it wakes the task when
        // it does. Reading goes on meanwhile.
        let mut write_blocked = false;
        let poll = loop {
            if self.shutting_down && self.poll_end(cx).is_ready() {
                self.shutting_down = false;
            }
            match self.life.poll(env, now) {
                Action::Close => {
                    // The last bytes (a close frame) and a TLS close_notify
                    // get a bounded while to go out: a stream may pass them
                    // on over a few polls (an h2 stream hands them to its
                    // connection's task), and one dropped with them unsent
                    // resets and loses them. A peer that reads nothing holds
                    // the task END_GRACE at most; an abort, not at all.
                    let end_by = *self.end_by.get_or_insert(now + END_GRACE);
                    let ended = self.poll_end(cx).is_ready();
                    if ended || now >= end_by || endpoint.is_aborting() {
                        break Poll::Ready(());
                    }
                    break Poll::Pending;
                }
                Action::ShutDown => {
                    self.shutting_down = true;
                    self.read_buf.clear();
                    continue;
                }
                Action::Write if !write_blocked => {
                    let (stream, life) = (&mut self.stream, &mut self.life);
                    life.write_in_place(pool, |slices| {
                        match Pin::new(&mut *stream).poll_write_vectored(cx, slices) {
                            Poll::Ready(result) => result,
                            Poll::Pending => {
                                write_blocked = true;
                                Err(io::ErrorKind::WouldBlock.into())
                            }
                        }
                    });
                    self.unflushed = true;
                    continue;
                }
                Action::Write => {}
                Action::Wait => {
                    if self.unflushed {
                        match Pin::new(&mut self.stream).poll_flush(cx) {
                            Poll::Ready(Ok(())) => self.unflushed = false,
                            Poll::Ready(Err(error)) => {
                                self.unflushed = false;
                                self.life.write_failed(&error);
                                continue;
                            }
                            Poll::Pending => {}
                        }
                    }
                }
            }
            if self.life.holds_input() {
                // The queue drained: what waited in the buffer goes first.
                self.life.receive(&mut self.read_buf, env, now);
                continue;
            }
            if self.read_done || !self.life.wants_read() {
                break Poll::Pending;
            }
            if reads == READS_PER_POLL {
                // More may be waiting; let other tasks run first.
                cx.waker().wake_by_ref();
                break Poll::Pending;
            }
            reads += 1;
            let wanted = self.life.bytes_wanted(env);
            let read_size = endpoint.config.read_buffer_size;
            read_buf::prepare(&mut self.read_buf, wanted, pool, read_size);
            let stream = Pin::new(&mut self.stream);
            match tokio_util::io::poll_read_buf(stream, cx, &mut self.read_buf) {
                Poll::Ready(Ok(0)) => {
                    self.read_done = true;
                    self.life.receive_eof();
                }
                Poll::Ready(Ok(_)) => self.life.receive(&mut self.read_buf, env, now),
                Poll::Ready(Err(error)) => {
                    self.read_done = true;
                    self.life.read_failed(&error);
                }
                Poll::Pending => break Poll::Pending,
            }
        };
        // An idle connection holds no read buffer of ours.
        read_buf::release(&mut self.read_buf, pool);
        self.timer
            .follow(self.end_by.or_else(|| self.life.deadline()), cx);
        poll
    }

    /// Flushes what was written, then ends the stream's sending side (FIN;
    /// a TLS stream sends its close_notify first).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.unflushed {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(_) => self.unflushed = false,
            }
        }
        Pin::new(&mut self.stream).poll_shutdown(cx).map(|_| ())
    }

    /// Runs the keepalive sweep over this one connection when it is due.
    fn sweep_if_due(&mut self, cx: &mut Context<'_>, now: Instant) {
        let Some((sweep, timer, due)) = &mut self.keepalive else {
            return;
        };
        if now >= *due {
            *due = now + sweep.period;
            self.life.sweep(sweep);
        }
        timer.follow(Some(*due), cx);
    }
}
