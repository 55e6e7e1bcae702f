//! A request stream after its head, as a byte stream: what the peer sends
//! in DATA frames is read, what is written goes out in DATA frames. This
//! is all a WebSocket over HTTP/3 needs (RFC 9220, section 3: the
//! WebSocket's bytes are the DATA frames' payload, in order), and the
//! stream driver serves it as it serves TCP.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use quinn::{Connection, RecvStream, SendStream};
use rapidws_core::h3::code;
use rapidws_core::h3::frame::{self, FrameHead, kind};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::wire::{MAX_SKIPPED, close, code_of, head_bytes_needed};

/// The largest DATA frame written: a write of more goes out as several.
const MAX_DATA_FRAME: usize = 64 * 1024;

/// A request stream's DATA as a byte stream (tokio `AsyncRead` and
/// `AsyncWrite`).
///
/// Shutting it down finishes the stream (the WebSocket's orderly end, RFC
/// 9220 section 3), and so does dropping it; a DATA frame cut short (a
/// write left unfinished) resets it instead, with `H3_REQUEST_CANCELLED`,
/// and shutting down then fails. A frame the peer may not send on a
/// request stream closes the connection (`H3_FRAME_UNEXPECTED`, RFC 9114
/// section 4.1) and fails the read.
pub struct DataStream {
    conn: Connection,
    /// `Some` until dropped, when it goes back to the request's task (to
    /// wait for the peer to have it all before the connection may close).
    send: Option<SendStream>,
    returned: Option<oneshot::Sender<SendStream>>,
    recv: RecvStream,
    /// Reading: the current frame's payload bytes still to come (0: a head
    /// comes next), whether it is DATA, and the head being read.
    left: u64,
    in_data: bool,
    head: [u8; 16],
    head_len: usize,
    skipped: u64,
    /// The peer's trailers came: only the stream's end may follow.
    ended: bool,
    /// Writing: the frame head not yet written, and the payload bytes the
    /// current frame still owes.
    out_head: [u8; 16],
    out_head_len: usize,
    out_head_sent: usize,
    owed: usize,
}

impl std::fmt::Debug for DataStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataStream")
            .field("id", &self.send.as_ref().map(SendStream::id))
            .finish_non_exhaustive()
    }
}

impl DataStream {
    /// The stream of `conn`, its head read and answered; its send side
    /// goes to `returned`, if given, when this is dropped.
    pub(crate) fn new(
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        returned: Option<oneshot::Sender<SendStream>>,
    ) -> DataStream {
        DataStream {
            conn,
            send: Some(send),
            returned,
            recv,
            left: 0,
            in_data: false,
            head: [0; 16],
            head_len: 0,
            skipped: 0,
            ended: false,
            out_head: [0; 16],
            out_head_len: 0,
            out_head_sent: 0,
            owed: 0,
        }
    }

    /// Resets the stream's sending side with `code` (an HTTP/3 error).
    pub(crate) fn reset(&mut self, code: u64) {
        if let Some(send) = &mut self.send {
            let _ = send.reset(code_of(code));
        }
    }

    fn send(&mut self) -> Pin<&mut SendStream> {
        Pin::new(self.send.as_mut().expect("present until dropped"))
    }

    /// Whether a DATA frame was begun and not finished.
    fn cut_short(&self) -> bool {
        self.owed > 0 || self.out_head_len > 0
    }

    /// A frame the peer may not send here: the connection's error.
    fn unexpected(&self, why: &'static str) -> io::Error {
        close(&self.conn, code::FRAME_UNEXPECTED, why);
        io::Error::new(io::ErrorKind::InvalidData, why)
    }

    /// Reads a frame head, a byte at a time at most as far as it goes
    /// (nothing of the payload is taken). `Ok(false)`: the stream ended
    /// cleanly between frames.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        loop {
            if let Some(head) = FrameHead::decode(&self.head[..self.head_len]) {
                self.head_len = 0;
                return Poll::Ready(self.take_head(head).map(|()| true));
            }
            // How many bytes the varints being read still need.
            let need = head_bytes_needed(&self.head[..self.head_len]);
            let mut buf = ReadBuf::new(&mut self.head[self.head_len..self.head_len + need]);
            ready!(self.recv.poll_read_buf(cx, &mut buf)).map_err(io::Error::from)?;
            let n = buf.filled().len();
            if n == 0 {
                if self.head_len == 0 {
                    return Poll::Ready(Ok(false));
                }
                return Poll::Ready(Err(broken("the stream ended inside a frame head")));
            }
            self.head_len += n;
        }
    }

    fn take_head(&mut self, head: FrameHead) -> io::Result<()> {
        if head.is_http2_only() {
            return Err(self.unexpected("a frame type HTTP/3 reserves"));
        }
        match head.kind {
            kind::DATA => {
                self.in_data = true;
                self.skipped = 0;
            }
            kind::CANCEL_PUSH
            | kind::SETTINGS
            | kind::PUSH_PROMISE
            | kind::GOAWAY
            | kind::MAX_PUSH_ID => {
                return Err(self.unexpected("a control frame on a request stream"));
            }
            // Trailers (the peer's last word) or an unknown frame: skipped.
            _ => {
                self.ended |= head.kind == kind::HEADERS;
                self.in_data = false;
                self.skipped = self.skipped.saturating_add(head.length);
                if self.skipped > MAX_SKIPPED {
                    return Err(broken("too many bytes of trailers or unknown frames"));
                }
            }
        }
        self.left = head.length;
        Ok(())
    }

    /// Discards the rest of a frame that is not DATA.
    fn poll_skip(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 512];
        while self.left > 0 {
            let n = usize::try_from(self.left).map_or(scratch.len(), |n| n.min(scratch.len()));
            let mut buf = ReadBuf::new(&mut scratch[..n]);
            ready!(self.recv.poll_read_buf(cx, &mut buf)).map_err(io::Error::from)?;
            if buf.filled().is_empty() {
                return Poll::Ready(Err(broken("the stream ended inside a frame")));
            }
            self.left -= buf.filled().len() as u64;
        }
        Poll::Ready(Ok(()))
    }

    /// After the trailers: the stream's end, or the peer's error.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut probe = [0u8; 1];
        let mut end = ReadBuf::new(&mut probe);
        ready!(self.recv.poll_read_buf(cx, &mut end)).map_err(io::Error::from)?;
        if !end.filled().is_empty() {
            return Poll::Ready(Err(self.unexpected("a frame after the trailers")));
        }
        Poll::Ready(Ok(()))
    }

    /// Starts a DATA frame for `len` bytes (at most a frame's worth) unless
    /// one is under way, and writes its head; `Ready(Ok(n))`: up to `n`
    /// payload bytes may go now.
    fn poll_frame(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        if self.owed == 0 && self.out_head_len == 0 {
            // The bytes written next, whichever they are, fill it: a byte
            // stream's writes continue one another.
            let n = len.min(MAX_DATA_FRAME);
            let mut head = &mut self.out_head[..];
            frame::put_head(&mut head, kind::DATA, n as u64);
            self.out_head_len = 16 - head.len();
            self.out_head_sent = 0;
            self.owed = n;
        }
        while self.out_head_sent < self.out_head_len {
            let head = &self.out_head[self.out_head_sent..self.out_head_len];
            let send = Pin::new(self.send.as_mut().expect("present until dropped"));
            let n = ready!(send.poll_write(cx, head))?;
            self.out_head_sent += n;
        }
        self.out_head_len = 0;
        Poll::Ready(Ok(self.owed))
    }
}

fn broken(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

impl AsyncRead for DataStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.left == 0 {
                if this.ended {
                    return this.poll_end(cx);
                }
                if !ready!(this.poll_head(cx))? {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if !this.in_data {
                ready!(this.poll_skip(cx))?;
                continue;
            }
            let room = buf
                .remaining()
                .min(usize::try_from(this.left).unwrap_or(usize::MAX));
            let unfilled = buf.initialize_unfilled_to(room);
            let n = ready!(this.recv.poll_read(cx, unfilled)).map_err(io::Error::from)?;
            if n == 0 {
                return Poll::Ready(Err(broken("the stream ended inside a DATA frame")));
            }
            buf.advance(n);
            this.left -= n as u64;
            return Poll::Ready(Ok(()));
        }
    }
}

impl AsyncWrite for DataStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let owed = ready!(this.poll_frame(cx, buf.len()))?;
        let n = buf.len().min(owed);
        let n = ready!(this.send().poll_write(cx, &buf[..n]))?;
        this.owed -= n;
        Poll::Ready(Ok(n))
    }

    /// The slices in one DATA frame (the stream driver writes a frame's
    /// header and its payload as two).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|buf| buf.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        let owed = ready!(this.poll_frame(cx, total))?;
        let mut written = 0;
        for buf in bufs {
            let n = buf.len().min(owed - written);
            if n == 0 {
                continue;
            }
            match this.send().poll_write(cx, &buf[..n]) {
                Poll::Ready(Ok(wrote)) => {
                    this.owed -= wrote;
                    written += wrote;
                    if wrote < n || written == owed {
                        break;
                    }
                }
                Poll::Ready(Err(error)) if written == 0 => return Poll::Ready(Err(error.into())),
                Poll::Pending if written == 0 => return Poll::Pending,
                // What went out is told; the error or the wait comes again.
                Poll::Ready(Err(_)) | Poll::Pending => break,
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().send().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.cut_short() {
            // A FIN now would end the stream inside a frame.
            let _ = this
                .send()
                .get_mut()
                .reset(code_of(code::REQUEST_CANCELLED));
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shut down inside a DATA frame: the stream is reset",
            )));
        }
        this.send().poll_shutdown(cx)
    }
}

impl Drop for DataStream {
    fn drop(&mut self) {
        // Nothing more is read: the peer may stop sending, without error
        // (RFC 9114, 4.1.1).
        let _ = self.recv.stop(code_of(code::NO_ERROR));
        let Some(mut send) = self.send.take() else {
            return;
        };
        // A frame cut short: the peer must not take it for a clean end
        // (quinn finishes a dropped stream).
        if self.cut_short() {
            let _ = send.reset(code_of(code::REQUEST_CANCELLED));
        }
        if let Some(returned) = self.returned.take() {
            let _ = returned.send(send);
        }
    }
}
