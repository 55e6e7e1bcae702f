//! A stream whose first bytes were read to route it: they are read again,
//! first, by whoever serves it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `S` with the bytes a router read from it put back in front: reads
/// return them before anything more of `S`; writes go to `S`.
#[derive(Debug)]
pub struct Sniffed<S> {
    prefix: BytesMut,
    inner: S,
}

impl<S> Sniffed<S> {
    pub(crate) fn new(prefix: BytesMut, inner: S) -> Sniffed<S> {
        Sniffed { prefix, inner }
    }

    /// The bytes not read again yet, and the stream: for a server that
    /// takes a prefix of its own (`stream::Server::serve`).
    pub fn into_parts(self) -> (BytesMut, S) {
        (self.prefix, self.inner)
    }

    /// The bytes not read again yet.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniffed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniffed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn the_prefix_is_read_first_then_the_stream() {
        let (mut near, far) = tokio::io::duplex(64);
        near.write_all(b" world").await.unwrap();
        drop(near);
        let mut sniffed = Sniffed::new(BytesMut::from(&b"hello"[..]), far);
        let mut small = [0u8; 3];
        sniffed.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"hel");
        assert_eq!(sniffed.prefix(), b"lo");
        let mut rest = String::new();
        sniffed.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "lo world");
    }
}
