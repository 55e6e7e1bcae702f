//! The mux's driver: a task that reads the transport into the
//! protocol, writes the protocol's frames out, and keeps its time.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use rapidws_core::mux::frame::{HEADER_LEN, Header};
use rapidws_core::mux::{Output, Transmit as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;

use super::Error;
use super::shared::Shared;

/// Bytes read from the transport at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Frames gathered before they are written: enough for few, large writes
/// (a 100-stream echo over TCP on loopback moved about 40% more with
/// 256 KiB than with 64 KiB, and about 4% more with 512 KiB), small enough
/// that a stream's write, a window update or a NOP waits behind little
/// (256 KiB leave loopback in about 0.2 ms; a slow link takes longer).
const WRITE_BATCH: usize = 256 * 1024;

/// How long a mux that is ending waits for streams whose last bytes
/// wait for the peer's window (version 2).
const CLOSE_LINGER: Duration = Duration::from_secs(5);

pub(crate) struct Driver<T> {
    io: T,
    shared: Arc<Shared>,
    input: BytesMut,
    /// Frames gathered, their payloads as the streams wrote them.
    output: Output,
    /// Written, not flushed yet.
    unflushed: bool,
    timer: Pin<Box<Sleep>>,
    /// The deadline the timer is set to.
    armed: Option<Instant>,
    /// The transport's read side ended.
    eof: bool,
    /// Ending: when to stop waiting for streams' last bytes.
    ending_by: Option<Instant>,
}

/// What the driver reads from and writes to.
pub(crate) trait Transport: Unpin {
    /// Reads into `buf`; `Ok(0)` is the end.
    fn poll_read_into<B: BufMut>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut B,
    ) -> Poll<io::Result<usize>>;

    /// Writes from the front of `output` and takes what it wrote off it.
    fn poll_write_out(
        &mut self,
        cx: &mut Context<'_>,
        output: &mut Output,
    ) -> Poll<io::Result<usize>>;

    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    fn poll_shutdown_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// Any async byte stream (TCP, TLS): the frames' headers and payloads in
/// one vectored write where the stream takes one (TCP does).
pub(crate) struct Plain<T>(pub(crate) T);

impl<T: AsyncRead + AsyncWrite + Unpin> Transport for Plain<T> {
    fn poll_read_into<B: BufMut>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut B,
    ) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(&mut self.0), cx, buf)
    }

    fn poll_write_out(
        &mut self,
        cx: &mut Context<'_>,
        output: &mut Output,
    ) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_write_buf(Pin::new(&mut self.0), cx, output)
    }

    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// What a pass found.
enum Step {
    Again,
    Wait,
    Done(Error),
}

impl<T: Transport> Driver<T> {
    pub(crate) fn new(io: T, shared: Arc<Shared>) -> Driver<T> {
        Driver {
            io,
            shared,
            input: BytesMut::new(),
            output: Output::new(),
            unflushed: false,
            timer: Box::pin(tokio::time::sleep_until(tokio::time::Instant::now())),
            armed: None,
            eof: false,
            ending_by: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let why = poll_fn(|cx| self.poll(cx)).await;
        count_end(&why);
        {
            // Everyone learns at once; the transport's shutdown may wait.
            let mut state = self.shared.lock();
            state.end(why);
            state.dispatch();
        }
        // Shut the transport down (bounded: a peer that does not read gets
        // no more than the shutdown's own try).
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            poll_fn(|cx| self.io.poll_shutdown_out(cx)),
        )
        .await;
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        // Bounded passes before giving the runtime back its thread.
        for _ in 0..32 {
            match self.pass(cx) {
                Step::Again => continue,
                Step::Wait => return Poll::Pending,
                Step::Done(why) => return Poll::Ready(why),
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// One pass: write, read, gather frames, keep time.
    fn pass(&mut self, cx: &mut Context<'_>) -> Step {
        let mut progress = false;

        // Write out what was gathered.
        let mut wrote = false;
        while !self.output.is_empty() {
            match self.io.poll_write_out(cx, &mut self.output) {
                Poll::Ready(Ok(0)) => {
                    return Step::Done(transport(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(_)) => {
                    self.unflushed = true;
                    progress = true;
                    wrote = true;
                }
                Poll::Ready(Err(error)) => return Step::Done(transport(error)),
                Poll::Pending => break,
            }
        }
        if self.output.is_empty() && self.unflushed {
            match self.io.poll_flush_out(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(error)) => return Step::Done(transport(error)),
                Poll::Pending => {}
            }
        }

        // Read, if the protocol wants input.
        let wants_input = {
            let mut state = self.shared.lock();
            state.park_driver(cx.waker());
            // The keepalive's test of a peer that does not read: what the
            // transport took, and whether frames still wait for it.
            state
                .protocol
                .handle_transport_write(wrote, !self.output.is_empty());
            state.protocol.wants_input()
        };
        // No more than a chunk at a time, and none while a chunk's worth of
        // whole frames waits (version 1's budget holds frames back here):
        // the buffer stays small and its pages stay mapped.
        if wants_input && !self.eof && (self.input.len() < READ_CHUNK || !holds_frame(&self.input))
        {
            if self.input.capacity() - self.input.len() < READ_CHUNK / 4 {
                self.input.reserve(READ_CHUNK);
            }
            let mut limited = (&mut self.input).limit(READ_CHUNK);
            match self.io.poll_read_into(cx, &mut limited) {
                Poll::Ready(Ok(n)) => {
                    self.eof = n == 0;
                    progress = true;
                }
                Poll::Ready(Err(error)) => return Step::Done(transport(error)),
                Poll::Pending => {}
            }
        }
        // Frames already read wait here while the budget is spent: take
        // them whenever input is wanted, new bytes or not.
        if wants_input && !self.input.is_empty() {
            let before = self.input.len();
            let mut state = self.shared.lock();
            let received = state.protocol.handle_input(&mut self.input, Instant::now());
            state.dispatch();
            if let Err(error) = received {
                return Step::Done(Error::Protocol(error));
            }
            progress |= self.input.len() != before;
        }

        // Gather frames, keep time, see whether it is over.
        let mut state = self.shared.lock();
        if self.output.len() < WRITE_BATCH && state.protocol.has_output() {
            state.protocol.poll_transmit(&mut self.output, WRITE_BATCH);
            state.dispatch();
            progress = true;
        }
        let now = Instant::now();
        if let Some(deadline) = state.protocol.poll_timeout()
            && deadline <= now
        {
            let timed = state.protocol.handle_timeout(now);
            state.dispatch();
            if let Err(error) = timed {
                return Step::Done(Error::Protocol(error));
            }
            progress = true;
        }
        let mut deadline = state.protocol.poll_timeout();
        let quiet = self.output.is_empty() && !state.protocol.has_output();
        // At the transport's end, frames the budget kept back are still
        // taken as the application reads.
        if self.eof && quiet && !holds_frame(&self.input) {
            return Step::Done(Error::Closed);
        }
        if quiet && (state.protocol.is_ending() || state.abandoned()) {
            if !state.protocol.is_ending() {
                state.protocol.shut_down();
                return Step::Again;
            }
            // Streams waiting for the peer's window to send their last
            // bytes and FIN get a while, not forever.
            let limit = *self.ending_by.get_or_insert(now + CLOSE_LINGER);
            if state.protocol.unsent() == 0 || now >= limit {
                return Step::Done(Error::Closed);
            }
            deadline = Some(deadline.map_or(limit, |deadline| deadline.min(limit)));
        }
        drop(state);
        if progress {
            return Step::Again;
        }
        if deadline != self.armed {
            self.armed = deadline;
            if let Some(deadline) = deadline {
                self.timer.as_mut().reset(deadline.into());
            }
        }
        if self.armed.is_some() && self.timer.as_mut().poll(cx).is_ready() {
            return Step::Again;
        }
        Step::Wait
    }
}

/// Counts the mux's end by its reason (feature `metrics`):
/// `rapidws_mux_sessions_ended_total`.
#[cfg(feature = "metrics")]
fn count_end(why: &Error) {
    use rapidws_core::mux::MuxError;
    let reason = match why {
        Error::Closed => "closed",
        Error::Transport(_) => "transport",
        Error::Protocol(MuxError::KeepaliveTimeout) => "keepalive",
        Error::Protocol(MuxError::NoProgress) => "no_progress",
        Error::Protocol(MuxError::Budget { .. }) => "budget",
        Error::Protocol(_) | Error::Open(_) => "protocol",
    };
    metrics::counter!("rapidws_mux_sessions_ended_total", "reason" => reason).increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count_end(_: &Error) {}

/// Whether `input` starts with a whole frame.
fn holds_frame(input: &[u8]) -> bool {
    Header::decode(input)
        .is_some_and(|header| input.len() >= HEADER_LEN + usize::from(header.length))
}

fn transport(error: io::Error) -> Error {
    Error::Transport(Arc::new(error))
}
