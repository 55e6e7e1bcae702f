//! One connection on io_uring: its socket, its read buffer and the state of
//! its two operations (a multishot receive, a send), around the connection's
//! [`Lifecycle`]. The reactor feeds it completions and advances it once per
//! loop turn in which something happened to it; every decision is the
//! lifecycle's, this file only moves bytes.
//!
//! Receiving: one multishot receive per connection fills the reactor's
//! provided buffers. The bytes are handled where they landed, and the buffer
//! goes back to the kernel right after; only a partial frame (or request
//! head) is copied, into a pooled buffer of the connection's own. Sending:
//! whatever the callbacks and the protocol queued during the turn is moved
//! out of the connection's queue and sent with one send; a partial send is
//! sent on from where it stopped before anything newer.
//!
//! With TLS (`tls.rs`), received bytes are decrypted before the lifecycle
//! sees them, and what the lifecycle queued is encrypted before the send;
//! records of the session's own (the handshake, close_notify) go out
//! between the lifecycle's writes.

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use bytes::BytesMut;

use super::ring::{Op, Outgoing, Received, Ring};
use super::tls::Tls;
use crate::connection::conn::Conn;
use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::keepalive::Sweep;
use crate::connection::lifecycle::{Action, Env, Lifecycle};
use crate::connection::wake::ConnWake;
use crate::driver::read_buf;
use crate::pool::BufferPool;
use crate::proto::WriteQueue;

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
    // Declared first, so the socket is closed before the live guard in the
    // lifecycle is dropped: once `serve` sees no live connection, none is open.
    stream: TcpStream,
    /// A partial frame (or request head) waiting for the rest, or bytes the
    /// lifecycle holds (see `Lifecycle::holds_input`). Empty and without
    /// capacity otherwise.
    read_buf: BytesMut,
    /// The receive in the ring. (It and `send` are one byte each, so that
    /// the connection's socket and flags share a word: every connection
    /// is one of these.)
    receive: Receive,
    /// The send in the ring.
    send: Send,
    /// TLS: end our side of TCP once close_notify has been sent.
    shut_down_after_send: bool,
    /// wss: the TLS session. Boxed: most connections have none.
    tls: Option<Box<Tls>>,
    /// A handoff is taking it: its receive is not armed again (see
    /// `quieten`).
    quieting: bool,
    life: Lifecycle<H>,
}

/// A connection's receive, as far as the ring has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receive {
    Off,
    /// A multishot receive is armed: its last completion has not come.
    Armed,
    /// The armed receive is being cancelled (reading is paused, or a
    /// handoff is taking the connection).
    Cancelling,
}

/// A connection's send, as far as the ring has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Send {
    Off,
    /// In flight with TLS records of the session's own only.
    Records,
    /// In flight with what the lifecycle took (`take_queue`).
    Taken,
}

impl<H: Handler> Connection<H> {
    /// Starts serving an accepted connection (over `tls`, for wss): arms
    /// its receive. Its `Conn` will wake the reactor through `wake`. The
    /// handshake timeout covers the TLS handshake too.
    pub(crate) fn accept(
        stream: TcpStream,
        peer: SocketAddr,
        tls: Option<Box<Tls>>,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
        io: &mut Io<'_>,
    ) -> Self {
        let mut connection = Connection::new(stream, peer, tls, live, wake, env);
        // With TLS too: the header comes before the TLS handshake.
        connection.life.expect_proxy_header(env, Instant::now());
        connection.receive(io);
        connection
    }

    /// Starts serving a connection accepted elsewhere (through the
    /// `Entrance`): arms its receive. What was read from it already comes
    /// next, through [`Connection::receive_read`]. No PROXY header is
    /// expected: the router read it, and `peer` is what it named.
    pub(crate) fn admit(
        stream: TcpStream,
        peer: SocketAddr,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
        io: &mut Io<'_>,
    ) -> Self {
        let mut connection = Connection::new(stream, peer, None, live, wake, env);
        connection.receive(io);
        connection
    }

    /// Handles `read` (what a router read before handing the connection
    /// over) as if it had just been received.
    pub(crate) fn receive_read(&mut self, mut read: BytesMut, env: &Env<H>) {
        if !read.is_empty() {
            self.take(&mut read, env);
        }
    }

    /// Refused before its request was read (see `Lifecycle::is_refused`).
    pub(crate) fn is_refused(&self) -> bool {
        self.life.is_refused()
    }

    fn new(
        stream: TcpStream,
        peer: SocketAddr,
        tls: Option<Box<Tls>>,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
    ) -> Self {
        Connection {
            stream,
            read_buf: BytesMut::new(),
            receive: Receive::Off,
            send: Send::Off,
            shut_down_after_send: false,
            tls,
            quieting: false,
            life: Lifecycle::accept(peer, live, wake, env, Instant::now()),
        }
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
            self.receive = Receive::Off;
        }
        match result {
            // The reactor gives the buffer back afterwards, whatever happens here.
            Ok(Received::Data { buffer, len }) => {
                let chunk = io.ring.received(buffer, len);
                match &self.tls {
                    None => self.take(chunk, env),
                    // The PROXY header comes before TLS: it is read off
                    // the raw bytes (held in `read_buf` until whole; no
                    // plaintext is there yet), the rest goes to TLS.
                    Some(_) if self.life.awaits_proxy_header() => {
                        self.read_buf.extend_from_slice(chunk);
                        let now = Instant::now();
                        if self.life.handle_proxy_header(&mut self.read_buf, env, now) {
                            let mut raw = std::mem::take(&mut self.read_buf);
                            self.open_tls(&mut raw, env);
                        }
                    }
                    Some(_) => self.open_tls(chunk, env),
                }
            }
            Ok(Received::End) => self.life.handle_eof(),
            // Out of provided buffers, or cancelled by us: armed again by the
            // next turn if still wanted (by then this turn's buffers are back).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ECANCELED)) => {}
            Err(error) => self.life.handle_read_error(&error),
        }
    }

    /// Hands `chunk`, bytes received under TLS, to rustls, and the
    /// plaintext it gives to the lifecycle.
    fn open_tls(&mut self, chunk: &mut BytesMut, env: &Env<H>) {
        let Some(tls) = &mut self.tls else {
            return;
        };
        let pool = &env.hub.pool;
        let mut plain = BytesMut::new();
        let handshaking = tls.is_handshaking();
        match tls.open(chunk, &mut plain, pool) {
            Ok(()) if !plain.is_empty() => self.take(&mut plain, env),
            Ok(()) => {}
            Err(error) => {
                if handshaking {
                    let peer = self.stream.peer_addr().ok();
                    tracing::debug!(?peer, %error, "TLS handshake failed; connection closed");
                }
                self.life.handle_read_error(&error);
            }
        }
        // What the lifecycle left was copied by `take`.
        plain.clear();
        read_buf::release(&mut plain, pool);
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
        let was = std::mem::replace(&mut self.send, Send::Off);
        let taken = was == Send::Taken;
        #[cfg(feature = "handoff")]
        if self.quieting && taken && self.give_back(&result, &mut outgoing, env) {
            io.spare.push(outgoing);
            return;
        }
        let written = match result {
            Ok(0) => Err(io::ErrorKind::WriteZero.into()),
            other => other,
        };
        if let Ok(n) = written {
            outgoing.queue.advance(n);
        }
        let failed = match written {
            // With TLS, plaintext counts as sent once sealed.
            Ok(_) if self.tls.is_some() => false,
            written => self.count_written(written, env),
        };
        if !outgoing.queue.is_empty() && !failed && !self.life.is_done() {
            // A partial send: the rest goes before anything queued since.
            self.send = was;
            io.ring.send(io.slot, self.stream.as_raw_fd(), outgoing);
            return;
        }
        let unsent = outgoing.queue.len();
        outgoing.queue.advance(unsent);
        if taken {
            // Unsent records are not the lifecycle's bytes: it counted them.
            self.life
                .handle_write_finished(if self.tls.is_some() { 0 } else { unsent });
        }
        if let Some(buf) = outgoing.queue.take_buffer() {
            env.hub.pool.give(buf);
        }
        io.spare.push(outgoing);
    }

    /// Tells the lifecycle (and the meters) what became of bytes it
    /// queued: `n` of them sent (with TLS: sealed), or the error that ends
    /// its writing. True if it failed.
    fn count_written(&mut self, written: io::Result<usize>, env: &Env<H>) -> bool {
        match written {
            Ok(n) => {
                self.life.handle_sent(n);
                env.hub.meters().sent(0, n as u64);
                false
            }
            Err(error) => {
                self.life.handle_write_error(&error);
                true
            }
        }
    }

    /// Does everything that can be done now: what the lifecycle asks for.
    pub(crate) fn advance(&mut self, env: &Env<H>, io: &mut Io<'_>) -> Progress {
        // One clock read per turn (see the tokio driver).
        let now = Instant::now();
        let overdue = self
            .life
            .poll_timeout()
            .is_some_and(|deadline| now >= deadline);
        if overdue && self.tls.as_ref().is_some_and(|tls| tls.is_handshaking()) {
            let peer = self.stream.peer_addr().ok();
            tracing::debug!(?peer, "TLS handshake timed out; connection closed");
        }
        loop {
            match self.life.poll_action(env, now) {
                Action::End => {
                    self.say_goodbye(&env.hub.pool);
                    self.end(env, io);
                    if !self.is_quiet() {
                        return Progress::Pending;
                    }
                    return Progress::Done;
                }
                Action::ShutDown => {
                    match &mut self.tls {
                        // close_notify first, sent below.
                        Some(tls) => {
                            tls.close(&env.hub.pool);
                            self.shut_down_after_send = true;
                        }
                        None => {
                            let _ = self.stream.shutdown(Shutdown::Write);
                        }
                    }
                    self.read_buf.clear();
                    read_buf::release(&mut self.read_buf, &env.hub.pool);
                }
                // (Quieting for a handoff: what is queued moves with it.)
                Action::Write if self.send != Send::Off || self.quieting => break,
                Action::Write => {
                    let mut outgoing = io.spare.pop().unwrap_or_else(Outgoing::new);
                    self.life.take_queue(&mut outgoing.queue);
                    if outgoing.queue.is_empty() {
                        io.spare.push(outgoing);
                        break;
                    }
                    if let Some(tls) = &mut self.tls {
                        let pool = &env.hub.pool;
                        let sealed = tls.seal(&mut outgoing.queue, pool);
                        if sealed.is_ok() {
                            tls.take_records(&mut outgoing.queue, pool);
                        }
                        let failed = self.count_written(sealed, env);
                        // A failure's alert, if any, goes out with the
                        // session's own records.
                        if failed || outgoing.queue.is_empty() {
                            self.life.handle_write_finished(0);
                            io.spare.push(outgoing);
                            continue;
                        }
                    }
                    self.send = Send::Taken;
                    io.ring.send(io.slot, self.stream.as_raw_fd(), outgoing);
                }
                Action::Wait if self.life.holds_input(env) => {
                    // Reading resumed: what waited goes first.
                    self.life.handle_input(&mut self.read_buf, env, now);
                    read_buf::release(&mut self.read_buf, &env.hub.pool);
                }
                Action::Wait => break,
            }
        }
        self.send_records(&env.hub.pool, io);
        // (Frozen for a handoff: a multishot receive would go on reading.)
        let frozen = self.life.wants_read() && !self.life.reads_now(env);
        if (self.life.is_paused() || frozen) && self.receive != Receive::Off {
            // A peer that does not read its replies stops being read from.
            self.cancel_receive(io);
        } else if self.life.reads_now(env) && self.receive == Receive::Off && !self.quieting {
            self.receive(io);
        }
        Progress::Pending
    }

    /// TLS records of the session's own (the handshake, alerts,
    /// close_notify) go out when no send is in flight; then, after
    /// close_notify, our side of TCP ends.
    fn send_records(&mut self, pool: &BufferPool, io: &mut Io<'_>) {
        let Some(tls) = &mut self.tls else {
            return;
        };
        if self.send != Send::Off || self.life.is_done() {
            return;
        }
        if tls.wants_write() {
            let mut outgoing = io.spare.pop().unwrap_or_else(Outgoing::new);
            tls.take_records(&mut outgoing.queue, pool);
            self.send = Send::Records;
            io.ring.send(io.slot, self.stream.as_raw_fd(), outgoing);
            return;
        }
        if std::mem::take(&mut self.shut_down_after_send) {
            let _ = self.stream.shutdown(Shutdown::Write);
        }
    }

    /// TLS: one attempt, without waiting, to send close_notify before the
    /// socket closes (as the stream driver makes one attempt to end its
    /// stream), unless a send is still out or our FIN went already; a peer
    /// that reads on after the close handshake then sees the end of TLS,
    /// not a truncation.
    fn say_goodbye(&mut self, pool: &BufferPool) {
        let Some(tls) = &mut self.tls else {
            return;
        };
        if self.send != Send::Off || self.shut_down_after_send || tls.is_handshaking() {
            return;
        }
        tls.close(pool);
        let mut records = WriteQueue::new();
        tls.take_records(&mut records, pool);
        if !records.is_empty() && self.stream.set_nonblocking(true).is_ok() {
            let mut bytes = Vec::new();
            records.move_into(&mut bytes);
            let _ = (&self.stream).write(&bytes);
        }
    }

    /// Ends the connection now (the server gives up on it, or its lifecycle
    /// is over): the protocol state goes (calling `on_close`), and the
    /// socket's operations are cancelled.
    pub(crate) fn end(&mut self, env: &Env<H>, io: &mut Io<'_>) {
        self.life.end();
        self.read_buf.clear();
        read_buf::release(&mut self.read_buf, &env.hub.pool);
        if self.receive != Receive::Off {
            io.ring.cancel(Op::Recv(io.slot));
        }
        if self.send != Send::Off {
            io.ring.cancel(Op::Send(io.slot));
        }
    }

    /// True once ended and the kernel has finished with the socket.
    pub(crate) fn is_finished(&self) -> bool {
        self.life.is_done() && self.is_quiet()
    }

    /// No operation in flight: no receive and no send in the ring.
    pub(crate) fn is_quiet(&self) -> bool {
        self.receive == Receive::Off && self.send == Send::Off
    }

    fn receive(&mut self, io: &mut Io<'_>) {
        self.receive = Receive::Armed;
        io.ring.receive(io.slot, self.stream.as_raw_fd());
    }

    /// Cancels the armed receive, once.
    fn cancel_receive(&mut self, io: &mut Io<'_>) {
        if self.receive == Receive::Armed {
            self.receive = Receive::Cancelling;
            io.ring.cancel(Op::Recv(io.slot));
        }
    }

    /// The handshake timeout, or once closing, the close deadline. The
    /// reactor watches it: it gives the connection a turn when it passes.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.life.poll_timeout()
    }

    /// One keepalive sweep, if the connection is open (see `keepalive`).
    pub(crate) fn sweep(&mut self, sweep: &Sweep) {
        self.life.handle_sweep(sweep);
    }

    /// Once upgraded, the connection's handle.
    pub(crate) fn conn(&self) -> Option<&Conn> {
        self.life.conn()
    }

    /// Handles bytes that just arrived, where they landed when it can.
    fn take(&mut self, chunk: &mut BytesMut, env: &Env<H>) {
        env.hub.meters().received(0, chunk.len() as u64);
        let pool = &env.hub.pool;
        let read_size = env.hub.config.read_buffer_size;
        if self.life.is_paused() || !self.read_buf.is_empty() {
            let wanted = self.life.bytes_wanted(env);
            read_buf::prepare(&mut self.read_buf, wanted, pool, read_size);
            self.read_buf.extend_from_slice(chunk);
            if self.life.is_paused() {
                self.life.handle_held_input();
            } else {
                self.life
                    .handle_input(&mut self.read_buf, env, Instant::now());
                read_buf::release(&mut self.read_buf, pool);
            }
            return;
        }
        self.life.handle_input(chunk, env, Instant::now());
        if !chunk.is_empty() {
            // A partial frame or request head: the only bytes ever copied out.
            let wanted = self.life.bytes_wanted(env).max(chunk.len());
            read_buf::prepare(&mut self.read_buf, wanted, pool, read_size);
            self.read_buf.extend_from_slice(chunk);
        }
    }
}

/// The handoff (feature `handoff`): a connection can leave only when
/// quiet, with no operation in flight (the kernel holds no buffer of its,
/// and no completion is to come), so a reactor first quietens it: cancels
/// its receive and does not arm one again.
#[cfg(feature = "handoff")]
impl<H: Handler> Connection<H> {
    /// Quietens the connection for a handoff: false if it cannot move at all
    /// (TLS, or over).
    pub(crate) fn quieten(&mut self, io: &mut Io<'_>) -> bool {
        if self.tls.is_some() || self.life.is_done() {
            return false;
        }
        self.quieting = true;
        self.cancel_receive(io);
        if self.send == Send::Taken && self.life.conn().is_some() {
            // A peer slow to read can hold a send for ever: what it has
            // not written comes back (see `give_back`).
            io.ring.cancel(Op::Send(io.slot));
        }
        true
    }

    /// A send of what the lifecycle took ended while quieting (done, cut
    /// short, or cancelled before a byte went): what was written counts,
    /// the rest goes back to the lifecycle's queue, to move with the
    /// connection. False if it failed, or the connection is not open (a
    /// response is never cut): then it is handled as any send.
    fn give_back(
        &mut self,
        result: &io::Result<usize>,
        outgoing: &mut Outgoing,
        env: &Env<H>,
    ) -> bool {
        if self.life.conn().is_none() {
            return false;
        }
        let n = match result {
            Ok(n) if *n > 0 => *n,
            Err(error) if error.raw_os_error() == Some(libc::ECANCELED) => 0,
            _ => return false,
        };
        if n > 0 {
            outgoing.queue.advance(n);
            self.life.handle_sent(n);
            env.hub.meters().sent(0, n as u64);
        }
        let pool = &env.hub.pool;
        if outgoing.queue.is_empty() {
            self.life.handle_write_finished(0);
            if let Some(buf) = outgoing.queue.take_buffer() {
                pool.give(buf);
            }
        } else {
            self.life.give_back(&mut outgoing.queue, pool);
        }
        true
    }

    /// Being quietened for a handoff.
    pub(crate) fn is_quieting(&self) -> bool {
        self.quieting
    }

    /// Not taken after all: it reads again at its next turn.
    pub(crate) fn resume(&mut self) {
        self.quieting = false;
    }

    /// The connection as a record (see `Lifecycle::hand_off`), if it is
    /// quiet; then drop it with `into_stream`.
    pub(crate) fn hand_off(
        &mut self,
        env: &Env<H>,
    ) -> Result<crate::connection::record::Moved, &'static str> {
        if self.tls.is_some() {
            return Err("TLS");
        }
        if !self.is_quiet() {
            return Err("an operation is in flight");
        }
        self.life.hand_off(&mut self.read_buf, env)
    }

    /// Requests are handled again after a failed handoff: one waiting in
    /// the read buffer is handled now (see `Lifecycle::thaw`), and it reads
    /// again.
    pub(crate) fn thaw(&mut self, env: &Env<H>) {
        self.quieting = false;
        self.life.thaw(&mut self.read_buf, env);
    }

    /// The socket, without a word to the peer (after `hand_off`).
    pub(crate) fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// A connection handed over by the previous process (or back after a
    /// failed handoff): what it had read and not handled is handled now;
    /// its receive is armed at its first turn. `Err` with the socket and
    /// the bytes to write before closing it, if the handler refused it.
    pub(crate) fn take_over(
        stream: TcpStream,
        live: LiveGuard,
        wake: ConnWake,
        arriving: crate::connection::record::Arriving,
        env: &Env<H>,
    ) -> Result<Self, (TcpStream, Vec<u8>)> {
        let now = Instant::now();
        let (life, read_buf) = match Lifecycle::take_over(arriving, live, wake, env, now) {
            Ok(taken) => taken,
            Err(goodbye) => return Err((stream, goodbye)),
        };
        let mut connection = Connection {
            stream,
            read_buf,
            receive: Receive::Off,
            send: Send::Off,
            shut_down_after_send: false,
            tls: None,
            quieting: false,
            life,
        };
        if !connection.read_buf.is_empty() {
            connection
                .life
                .handle_input(&mut connection.read_buf, env, now);
            read_buf::release(&mut connection.read_buf, &env.hub.pool);
        }
        Ok(connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::handler::Quiet;

    /// Each idle connection is one of these (boxed, in its reactor's slab):
    /// 264 bytes take a 272-byte glibc chunk, 8 more a 288-byte one
    /// (docs/memory.md). Every feature is on in the gate's tests.
    #[test]
    fn an_idle_connection_fits_its_chunk() {
        let connection = size_of::<Connection<Quiet>>();
        assert!(connection <= 264, "connection is {connection} bytes");
    }
}
