//! [`Stream`]: one stream of a mux, as tokio's `AsyncRead` and
//! `AsyncWrite`, and as `Bytes` read and written without a copy.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use rapidws_core::mux::{Mux as Protocol, Read, StreamError};
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
///
/// Reading and writing through `AsyncRead` and `AsyncWrite` copy the bytes
/// out of the stream's receive buffer and into its send buffer;
/// [`read_bytes`](Stream::read_bytes) and
/// [`write_bytes`](Stream::write_bytes) take and give them as `Bytes`
/// instead, so a stream that forwards what it reads (an echo, a proxy)
/// copies nothing itself. They take `&mut self`: a stream read by one task
/// and written by another is split (`tokio::io::split`) and uses
/// `AsyncRead` and `AsyncWrite`.
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

impl Stream {
    /// Reads up to `max` bytes as they are, not copied (a slice of the
    /// stream's receive buffer, at most 32 KiB, which stays allocated
    /// while the bytes are held); `None` at the peer's FIN. Errors as
    /// reading does.
    pub async fn read_bytes(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_read_bytes(cx, max)).await
    }

    /// [`read_bytes`](Stream::read_bytes) as a poll.
    pub fn poll_read_bytes(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<io::Result<Option<Bytes>>> {
        self.poll_received(cx, |protocol, id| protocol.read_bytes(id, max))
    }

    /// Writes all of `data` as it is, not copied (a piece shorter than
    /// 8 KiB is copied), waiting while the send buffer is full. Errors as
    /// writing does.
    ///
    /// `data`'s whole allocation (with whatever else shares it) stays
    /// alive until its last byte is sent, while the mux's budget counts
    /// only the bytes queued: give buffers that own their memory (not a
    /// small slice of a large one). Not cancel-safe, as `write_all` is
    /// not: dropped half-way, what was queued still goes and the rest does
    /// not; [`poll_write_bytes`](Stream::poll_write_bytes) says how much
    /// was taken.
    pub async fn write_bytes(&mut self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            std::future::poll_fn(|cx| self.poll_write_bytes(cx, &mut data)).await?;
        }
        Ok(())
    }

    /// Queues as much of `data` as the send buffer takes, taking it off the
    /// front of `data`, and returns how much; `Pending` (the task woken
    /// when there is room) if it takes nothing. As
    /// [`write_bytes`](Stream::write_bytes) otherwise.
    pub fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        self.poll_queue(cx, data.len(), |protocol, id| {
            protocol.write_bytes(id, data)
        })
    }

    /// A read of either kind: `take` reads from the mux; `None` at the end.
    fn poll_received<T>(
        &self,
        cx: &mut Context<'_>,
        take: impl FnOnce(&mut Protocol, u32) -> Result<Read<T>, StreamError>,
    ) -> Poll<io::Result<Option<T>>> {
        let mut state = self.shared.lock();
        let was_blocked = !state.protocol.wants_input();
        match take(&mut state.protocol, self.id) {
            Ok(Read::Data(taken)) => {
                // Reading may have made room in the budget or owe an UPD.
                if (was_blocked && state.protocol.wants_input()) || state.protocol.has_output() {
                    state.wake_driver();
                }
                Poll::Ready(Ok(Some(taken)))
            }
            Ok(Read::End) => Poll::Ready(Ok(None)),
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

    /// A write of either kind, of `len` bytes: `put` queues what the mux
    /// takes of them and says how many.
    fn poll_queue(
        &self,
        cx: &mut Context<'_>,
        len: usize,
        put: impl FnOnce(&mut Protocol, u32) -> Result<usize, StreamError>,
    ) -> Poll<io::Result<usize>> {
        let mut state = self.shared.lock();
        if state.ended.is_some() {
            return Poll::Ready(Err(ended(&state)));
        }
        match put(&mut state.protocol, self.id) {
            Ok(0) if len > 0 => {
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
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = self.poll_received(cx, |protocol, id| {
            // Only as much of the buffer as there is to read is initialized.
            let available = protocol.readable(id).min(buf.remaining());
            protocol.read(id, buf.initialize_unfilled_to(available))
        });
        read.map_ok(|read| buf.advance(read.unwrap_or(0)))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_queue(cx, buf.len(), |protocol, id| protocol.write(id, buf))
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
