//! A WebSocket's binary messages as a byte stream, for a mux over a
//! WebSocket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures_core::Stream as _;
use futures_sink::Sink;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::socket::WebSocket;
use crate::{CloseCode, OwnedMessage};

/// The most bytes put in one message: 32 KiB, the default read limit of
/// coder/websocket's `Conn` (its `NetConn` lifts it) and well within any
/// WebSocket library's, so a peer on its defaults takes every message.
pub const MAX_MESSAGE: usize = 32 * 1024;

/// The close reason sent with 1003 to a peer that sent a text message: a
/// byte stream cannot say where text would go, and a peer that sends text
/// is speaking another protocol (a browser's test page, a wrong URL).
const TEXT_REFUSED: &str = "smux over a WebSocket takes binary messages only";

/// A [`WebSocket`] as `AsyncRead + AsyncWrite`: what is written goes out
/// as binary messages (of at most [`MAX_MESSAGE`] bytes), what is read is
/// the binary messages' bytes one after the other, their boundaries
/// meaning nothing (coder/websocket's `NetConn`). A text message is an
/// error ([`io::ErrorKind::InvalidData`]) and closes the connection with
/// 1003, "smux over a WebSocket takes binary messages only", so its peer
/// learns why; the connection's end is the end of file (a failure code is
/// an error); `shutdown` starts the close handshake with 1000.
pub struct MessageStream {
    socket: WebSocket,
    /// What is left of the message being read.
    reading: Bytes,
}

impl std::fmt::Debug for MessageStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageStream")
            .field("unread", &self.reading.len())
            .finish()
    }
}

impl MessageStream {
    /// The socket's binary messages as a byte stream.
    pub fn new(socket: WebSocket) -> MessageStream {
        MessageStream {
            socket,
            reading: Bytes::new(),
        }
    }

    /// The socket.
    pub fn socket(&self) -> &WebSocket {
        &self.socket
    }

    /// Sends the first `len.min(MAX_MESSAGE)` bytes of what is written as
    /// one binary message, once the socket has room; `take(n)` gives them.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        take: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        ready!(Pin::new(&mut self.socket).poll_ready(cx)).map_err(refused)?;
        let n = len.min(MAX_MESSAGE);
        let message = OwnedMessage::Binary(take(n));
        Pin::new(&mut self.socket)
            .start_send(message)
            .map_err(refused)?;
        Poll::Ready(Ok(n))
    }
}

impl AsyncRead for MessageStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.reading.is_empty() {
            match ready!(Pin::new(&mut this.socket).poll_next(cx)) {
                Some(Ok(OwnedMessage::Binary(data))) => this.reading = data,
                Some(Ok(OwnedMessage::Text(_))) => {
                    // Closed here, before the mux's end closes with
                    // 1000 (a second close is ignored).
                    let _ = this.socket.close(CloseCode::UNSUPPORTED_DATA, TEXT_REFUSED);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text message where the byte stream takes binary messages only",
                    )));
                }
                Some(Err(error)) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, error)));
                }
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = buf.remaining().min(this.reading.len());
        buf.put_slice(&this.reading[..n]);
        this.reading.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// The driver's way in: the gathered frames go out as messages of up to
/// [`MAX_MESSAGE`] bytes, each a slice of a payload where it fits in one
/// (copied together where it spans frames).
impl super::driver::Transport for MessageStream {
    fn poll_read_into<B: bytes::BufMut>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut B,
    ) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(self), cx, buf)
    }

    fn poll_write_out(
        &mut self,
        cx: &mut Context<'_>,
        output: &mut rapidws_core::mux::Output,
    ) -> Poll<io::Result<usize>> {
        use bytes::Buf as _;
        self.poll_send(cx, output.remaining(), |n| output.copy_to_bytes(n))
    }

    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self).poll_flush(cx)
    }

    fn poll_shutdown_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self).poll_shutdown(cx)
    }
}

fn refused(error: crate::socket::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, error)
}

impl AsyncWrite for MessageStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let copy = |n| Bytes::copy_from_slice(&buf[..n]);
        self.get_mut().poll_send(cx, buf.len(), copy)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's driver writes what is queued without being asked.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = self.socket.close(CloseCode::NORMAL, "");
        Poll::Ready(Ok(()))
    }
}
