//! [`Stream`]: one stream of a mux, as tokio's `AsyncRead` and
//! `AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rapidws_core::mux::{Read, StreamError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Error;
use super::shared::{Shared, State};

/// One stream of a [`Mux`](super::Mux): bytes in order both ways, with its
/// own end each way.
///
/// - Reading gives what the peer wrote, then end of file at the peer's FIN
///   (its `shutdown`), or an error if the mux ended first
///   ([`io::ErrorKind::ConnectionReset`], the reason in the message).
/// - Writing queues up to [`Config::send_buffer`](super::Config::send_buffer)
///   bytes and waits when that is full; the mux's driver sends them
///   without being asked, so `flush` returns at once (before the bytes
///   leave: [`Mux::close`](super::Mux::close) waits for them).
/// - `shutdown` sends our FIN after what was written (a half-close: reading
///   goes on).
/// - Dropping the stream sends the FIN if `shutdown` did not, and drops
///   whatever the peer sends on it afterwards.
pub struct Stream {
    shared: Arc<Shared>,
    id: u32,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("id", &self.id).finish()
    }
}

impl Stream {
    pub(crate) fn new(shared: Arc<Shared>, id: u32) -> Stream {
        Stream { shared, id }
    }

    /// The stream's id: odd if the side that dialled opened it.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Gives the stream a priority for sending: a higher one's frames go
    /// before a lower one's; the same ones take turns. Default 0.
    pub fn set_priority(&self, priority: u8) {
        let _ = self.shared.lock().protocol.set_priority(self.id, priority);
    }
}

fn ended(state: &State) -> io::Error {
    let why = state
        .ended
        .clone()
        .unwrap_or_else(|| match state.protocol.error() {
            Some(error) => Error::Protocol(error),
            None => Error::Closed,
        });
    io::Error::new(io::ErrorKind::ConnectionReset, why)
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut state = self.shared.lock();
        let was_blocked = !state.protocol.wants_input();
        // Only as much of the buffer as there is to read is initialized.
        let available = state.protocol.readable(self.id).min(buf.remaining());
        match state
            .protocol
            .read(self.id, buf.initialize_unfilled_to(available))
        {
            Ok(Read::Data(n)) => {
                buf.advance(n);
                // Reading may have made room in the budget or owe an UPD.
                if (was_blocked && state.protocol.wants_input()) || state.protocol.has_output() {
                    state.wake_driver();
                }
                Poll::Ready(Ok(()))
            }
            Ok(Read::End) => Poll::Ready(Ok(())),
            Ok(Read::Empty) if state.ended.is_none() => {
                state.park_reader(self.id, cx.waker());
                Poll::Pending
            }
            Ok(Read::Empty) | Err(StreamError::Ended | StreamError::Unknown) => {
                Poll::Ready(Err(ended(&state)))
            }
            Err(StreamError::Finished) => unreachable!("reads are never refused as finished"),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.shared.lock();
        if state.ended.is_some() {
            return Poll::Ready(Err(ended(&state)));
        }
        match state.protocol.write(self.id, buf) {
            Ok(0) if !buf.is_empty() => {
                state.park_writer(self.id, cx.waker());
                Poll::Pending
            }
            Ok(n) => {
                state.wake_driver();
                Poll::Ready(Ok(n))
            }
            Err(StreamError::Finished) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                StreamError::Finished,
            ))),
            Err(StreamError::Ended | StreamError::Unknown) => Poll::Ready(Err(ended(&state))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.shared.lock();
        match state.protocol.finish(self.id) {
            Ok(()) => {
                state.wake_driver();
                Poll::Ready(Ok(()))
            }
            Err(_) => Poll::Ready(Err(ended(&state))),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.forget(self.id);
        state.protocol.close(self.id);
        state.wake_driver();
    }
}
