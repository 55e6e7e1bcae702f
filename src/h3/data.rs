//! A request stream after its head, as a byte stream: what the peer sends
//! in DATA frames is read, what is written goes out in DATA frames. This
//! is all a WebSocket over HTTP/3 needs (RFC 9220, section 3: the
//! WebSocket's bytes are the DATA frames' payload, in order), and the
//! stream driver serves it as it serves TCP.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use quinn::{RecvStream, SendStream};
use rapidws_core::h3::code;
use rapidws_core::h3::frame::{self, FrameHead, kind};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// The largest DATA frame written: a write of more goes out as several.
const MAX_DATA_FRAME: usize = 64 * 1024;

/// The most bytes of frames other than DATA skipped in a row before the
/// stream is refused: unknown frames may be sent, not without end.
const MAX_SKIPPED: u64 = 64 * 1024;

/// A request stream's DATA as a byte stream (tokio `AsyncRead` and
/// `AsyncWrite`). Shutting it down finishes the stream (the WebSocket's
/// orderly end, RFC 9220 section 3); dropping it without that resets it.
pub struct DataStream {
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
    /// The peer's trailers came: nothing more may be read.
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
    /// The stream, its head read and answered; its send side goes to
    /// `returned`, if given, when this is dropped.
    pub(crate) fn new(
        send: SendStream,
        recv: RecvStream,
        returned: Option<oneshot::Sender<SendStream>>,
    ) -> DataStream {
        DataStream {
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

    fn send(&mut self) -> Pin<&mut SendStream> {
        Pin::new(self.send.as_mut().expect("present until dropped"))
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
            return Err(broken("a frame type HTTP/3 reserves"));
        }
        match head.kind {
            kind::DATA => {
                self.in_data = true;
                self.skipped = 0;
            }
            kind::HEADERS => {
                // Trailers: the request's last word. Nothing may follow.
                self.ended = true;
                self.in_data = false;
            }
            kind::CANCEL_PUSH
            | kind::SETTINGS
            | kind::PUSH_PROMISE
            | kind::GOAWAY
            | kind::MAX_PUSH_ID => {
                return Err(broken("a control frame on a request stream"));
            }
            _ => {
                self.in_data = false;
                self.skipped += head.length;
                if self.skipped > MAX_SKIPPED {
                    return Err(broken("too many bytes of unknown frames"));
                }
            }
        }
        self.left = head.length;
        Ok(())
    }

    /// Discards up to `left` bytes of a frame that is not DATA.
    fn poll_skip(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 512];
        while self.left > 0 {
            let n = scratch.len().min(self.left as usize);
            let mut buf = ReadBuf::new(&mut scratch[..n]);
            ready!(self.recv.poll_read_buf(cx, &mut buf)).map_err(io::Error::from)?;
            if buf.filled().is_empty() {
                return Poll::Ready(Err(broken("the stream ended inside a frame")));
            }
            self.left -= buf.filled().len() as u64;
        }
        Poll::Ready(Ok(()))
    }
}

/// Bytes to read next so that a frame head in progress gets no further
/// than its own end: one byte to learn each varint's length, then the
/// rest of it.
pub(crate) fn head_bytes_needed(head: &[u8]) -> usize {
    let Some(&first) = head.first() else {
        return 1;
    };
    let type_len = 1usize << (first >> 6);
    if head.len() < type_len {
        return type_len - head.len();
    }
    match head.get(type_len) {
        None => 1,
        Some(&second) => (type_len + (1usize << (second >> 6))) - head.len(),
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
                if !ready!(this.poll_head(cx))? {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if !this.in_data {
                ready!(this.poll_skip(cx))?;
                if this.ended {
                    // After trailers, only the stream's end may come.
                    let mut probe = [0u8; 1];
                    let mut end = ReadBuf::new(&mut probe);
                    ready!(this.recv.poll_read_buf(cx, &mut end)).map_err(io::Error::from)?;
                    if !end.filled().is_empty() {
                        return Poll::Ready(Err(broken("data after the trailers")));
                    }
                    return Poll::Ready(Ok(()));
                }
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
        if this.owed == 0 && this.out_head_len == 0 {
            // A new frame for what is given (at most a frame's worth): the
            // bytes written next, whichever they are, fill it.
            let n = buf.len().min(MAX_DATA_FRAME);
            let mut head = Vec::with_capacity(16);
            frame::put_head(&mut head, kind::DATA, n as u64);
            this.out_head[..head.len()].copy_from_slice(&head);
            this.out_head_len = head.len();
            this.out_head_sent = 0;
            this.owed = n;
        }
        while this.out_head_sent < this.out_head_len {
            let head = &this.out_head[this.out_head_sent..this.out_head_len];
            let send = Pin::new(this.send.as_mut().expect("present until dropped"));
            let n = ready!(send.poll_write(cx, head))?;
            this.out_head_sent += n;
        }
        this.out_head_len = 0;
        let n = buf.len().min(this.owed);
        let n = ready!(this.send().poll_write(cx, &buf[..n]))?;
        this.owed -= n;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().send().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().send().poll_shutdown(cx)
    }
}

impl Drop for DataStream {
    fn drop(&mut self) {
        let Some(mut send) = self.send.take() else {
            return;
        };
        // A frame cut short: the peer must not take it for a clean end
        // (quinn finishes a dropped stream).
        if self.owed > 0 || self.out_head_len > 0 {
            let code = quinn::VarInt::from_u64(code::REQUEST_CANCELLED).unwrap_or_default();
            let _ = send.reset(code);
        }
        if let Some(returned) = self.returned.take() {
            let _ = returned.send(send);
        }
    }
}
