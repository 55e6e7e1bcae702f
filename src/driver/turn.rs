//! What a readiness driver owes, as code: a [`Transport`] (a socket it can
//! try to read and write without blocking) and, once per wake-up, one call
//! of [`turn`], which drives the connection's [`Lifecycle`] through the
//! call contract written on it (poll, write, read, receive) as far as the
//! transport allows.
//!
//! Both readiness drivers are this and nothing more: the tokio groups
//! (`tokio/connection.rs`: a raw socket in the group's epoll) and the stream
//! driver (`stream/connection.rs`: any `AsyncRead + AsyncWrite`, one task
//! each). A new one, over another kind of socket or stream, is a folder
//! with a `Transport`, a loop that wakes it, and a timer on
//! [`Lifecycle::poll_timeout`]. The io_uring reactor cannot be one: its writes
//! own their buffers until the kernel completes them, so it follows the
//! lifecycle's other writing path (`take_queue`, `sent`, `write_finished`)
//! by itself.

use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::BytesMut;

use crate::connection::handler::Handler;
use crate::connection::lifecycle::{Action, Env, Lifecycle};
use crate::driver::read_buf;

/// Reads one connection may do in one turn before the others (the group's
/// other connections, the runtime's other tasks) get theirs.
pub(crate) const READS_PER_TURN: usize = 16;

/// A connection's socket or stream, as [`turn`] uses it. Every method
/// returns at once: a transport that cannot go on now says so, and its
/// driver runs the next turn when it can.
pub(crate) trait Transport {
    /// Called before each look at the lifecycle: carry on with anything
    /// started in an earlier step (a stream's ending).
    fn progress(&mut self, cx: &mut Context<'_>) {
        let _ = cx;
    }

    /// Whether a write may make progress now.
    fn writable(&self) -> bool;

    /// One vectored write; `WouldBlock` when it takes nothing more now (and
    /// then [`writable`](Transport::writable) is false until it may).
    fn write(&mut self, cx: &mut Context<'_>, slices: &[io::IoSlice<'_>]) -> io::Result<usize>;

    /// Nothing is left to write: finish what the writes left undone (a
    /// stream's flush). An error fails the connection.
    fn written(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let _ = cx;
        Ok(())
    }

    /// Whether a read may find bytes now.
    fn readable(&self) -> bool;

    /// One read, appended to `buf` (which has room): `Ok(0)` at the peer's
    /// end; `Pending` when nothing is there now.
    fn read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;

    /// The lifecycle asks to end our side (FIN): start it, at once or over
    /// the next steps (through [`progress`](Transport::progress)).
    fn shut_down(&mut self, cx: &mut Context<'_>);

    /// The connection is over: true once the transport may be dropped,
    /// false while its last bytes still need the next turns to leave.
    fn end(&mut self, cx: &mut Context<'_>, now: Instant, aborting: bool) -> bool;
}

/// How a [`turn`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Waiting for the transport, a wake-up or the deadline.
    Pending,
    /// Over: drop the connection.
    Done,
}

/// Does everything that can be done now for one connection: what the
/// lifecycle asks for, as far as `transport` allows, reading into
/// `read_buf` (a pooled buffer, taken while it holds bytes; it is given back
/// here before the connection sleeps). At most [`READS_PER_TURN`] reads:
/// then `cx` is woken for another turn. The caller sets its timer on
/// [`Lifecycle::poll_timeout`] afterwards.
pub(crate) fn turn<H: Handler>(
    life: &mut Lifecycle<H>,
    transport: &mut impl Transport,
    read_buf: &mut BytesMut,
    cx: &mut Context<'_>,
    env: &Env<H>,
    now: Instant,
) -> Turn {
    let pool = &env.hub.pool;
    let meters = env.hub.meters();
    let mut reads = 0;
    let turn = loop {
        transport.progress(cx);
        match life.poll_action(env, now) {
            Action::End => {
                if transport.end(cx, now, env.hub.is_aborting()) {
                    break Turn::Done;
                }
                break Turn::Pending;
            }
            Action::ShutDown => {
                transport.shut_down(cx);
                // The buffer's bytes are of no use any more.
                read_buf.clear();
                continue;
            }
            Action::Write if transport.writable() => {
                life.write_in_place(pool, |slices| {
                    let written = transport.write(cx, slices);
                    if let Ok(n) = written {
                        meters.sent(0, n as u64);
                    }
                    written
                });
                continue;
            }
            // Nothing to write, or the transport takes nothing more now:
            // either way, read. Requests are read (and answered, ahead of
            // queued pushes) while writes are blocked.
            Action::Write => {}
            Action::Wait => {
                if let Err(error) = transport.written(cx) {
                    life.handle_write_error(&error);
                    continue;
                }
            }
        }
        if life.holds_input(env) {
            // The queue was written down: what waited in the buffer goes first.
            life.handle_input(read_buf, env, now);
            continue;
        }
        if !life.reads_now(env) || !transport.readable() {
            break Turn::Pending;
        }
        if reads == READS_PER_TURN {
            // More may be waiting; let the others go first.
            cx.waker().wake_by_ref();
            break Turn::Pending;
        }
        reads += 1;
        let wanted = life.bytes_wanted(env);
        read_buf::prepare(read_buf, wanted, pool, env.hub.config.read_buffer_size);
        match transport.read(cx, read_buf) {
            Poll::Ready(Ok(0)) => life.handle_eof(),
            Poll::Ready(Ok(n)) => {
                meters.received(0, n as u64);
                life.handle_input(read_buf, env, now);
            }
            Poll::Ready(Err(error)) => life.handle_read_error(&error),
            Poll::Pending => {}
        }
    };
    if turn == Turn::Done {
        read_buf.clear();
    }
    // An idle connection holds no read buffer of ours.
    read_buf::release(read_buf, pool);
    turn
}
