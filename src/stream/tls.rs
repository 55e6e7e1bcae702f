//! A rustls session over an async byte stream, itself an async byte stream:
//! what the tokio server's wss and the client's wss run the stream driver
//! over. Written here on rustls's own API rather than taken from
//! tokio-rustls, so that TLS costs no runtime crate beyond what the stream
//! driver already has, and io_uring users of `rustls` pull in no tokio.
//!
//! The session and its pooled buffers are `driver/tls.rs`'s `Records`
//! (rustls's unbuffered API; io_uring's wss runs the same): an idle
//! connection holds no buffer of them, nor of the plaintext here.
//!
//! Writes are bounded: a write is refused (`Pending`) while records from the
//! last one still wait for the stream, so ciphertext never piles up beyond
//! one write's worth (`MAX_WRITE`).
//!
//! The peer's TCP end without a `close_notify` reads as an end, as a clean
//! one does: WebSocket's own close handshake is what says a connection
//! ended whole (a truncated one is reported 1006 either way), and most
//! clients do not send the alert.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::server::UnbufferedServerConnection;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::driver::tls::{MAX_RECORD, Need, Records, TlsState, give_back, tls_error};
use crate::pool::BufferPool;

/// Plaintext one write encrypts at most (four full records).
const MAX_WRITE: usize = 64 * 1024;

/// Room taken for a read of records: a whole record and its header.
const READ_SIZE: usize = MAX_RECORD + 256;

/// A stream `S` carrying a TLS session `C` (a server's or a client's),
/// after the handshake.
pub(crate) struct TlsStream<S, C> {
    io: S,
    /// The session and its records in and out (`driver/tls.rs`).
    records: Records<C>,
    pool: Arc<BufferPool>,
    /// Plaintext decrypted and not yet read. Pooled; empty (no capacity)
    /// when idle.
    plain: BytesMut,
    /// The peer sent its `close_notify`, or the stream ended: nothing more
    /// will be read once `plain` is.
    read_ended: bool,
}

impl<S> TlsStream<S, UnbufferedServerConnection>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// The server's side of a handshake over `io`; its buffers come from
    /// `pool`.
    pub(crate) async fn accept(
        config: Arc<ServerConfig>,
        io: S,
        pool: Arc<BufferPool>,
    ) -> io::Result<Self> {
        let session = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        TlsStream::new(io, session, pool).handshake().await
    }
}

impl<S> TlsStream<S, UnbufferedClientConnection>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// The client's side of a handshake over `io` with the server `name`
    /// (SNI, and the name its certificate must carry).
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) async fn connect(
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
        io: S,
        pool: Arc<BufferPool>,
    ) -> io::Result<Self> {
        let session = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
        TlsStream::new(io, session, pool).handshake().await
    }
}

impl<S, C> TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: TlsState,
{
    fn new(io: S, session: C, pool: Arc<BufferPool>) -> Self {
        TlsStream {
            io,
            records: Records::new(session),
            pool,
            plain: BytesMut::new(),
            read_ended: false,
        }
    }

    async fn handshake(mut self) -> io::Result<Self> {
        std::future::poll_fn(|cx| self.poll_handshake(cx)).await?;
        Ok(self)
    }

    /// Processes, writes and reads records until the session is
    /// established, then writes out what it still has to say (a client's
    /// Finished, a TLS 1.3 server's tickets). A failure to write those is
    /// not the handshake's: a peer that sent its data and left at once is
    /// still read, and the next write reports the failure.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let need = match self.process(None) {
                Ok((need, _)) => need,
                Err(error) => {
                    // The alert saying why goes out if the stream takes it.
                    let _ = self.poll_write_records(cx);
                    return Poll::Ready(Err(error));
                }
            };
            if need == Need::Closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the TLS session during its handshake",
                )));
            }
            if need == Need::Nothing && !self.records.is_handshaking() {
                break;
            }
            ready!(self.poll_write_records(cx))?;
            if ready!(self.poll_read_records(cx))? == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer ended the stream during the TLS handshake",
                )));
            }
        }
        if let Ok(()) = ready!(self.poll_write_records(cx)) {
            let _ = ready!(Pin::new(&mut self.io).poll_flush(cx));
        }
        Poll::Ready(Ok(()))
    }

    /// Processes the records read so far (see `Records::process`);
    /// the peer's `close_notify` ends reading.
    fn process(&mut self, data: Option<&[u8]>) -> io::Result<(Need, usize)> {
        let processed = self.records.process(&mut self.plain, data, &self.pool);
        if self.records.peer_closed {
            self.read_ended = true;
        }
        processed
    }

    /// Writes `outgoing` to the stream until it is empty (`Ready`, and the
    /// buffer goes back to the pool) or the stream takes no more.
    fn poll_write_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.records.outgoing.is_empty() {
            let outgoing = &self.records.outgoing;
            let written = ready!(Pin::new(&mut self.io).poll_write(cx, outgoing))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.records.sent(written, &self.pool);
        }
        Poll::Ready(Ok(()))
    }

    /// Reads records from the stream once, into `incoming`: how many bytes
    /// came (0: the stream ended).
    fn poll_read_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let incoming = &mut self.records.incoming;
        if incoming.capacity() == 0 {
            *incoming = self.pool.take(READ_SIZE);
        } else if incoming.capacity() - incoming.len() < READ_SIZE / 4 {
            incoming.reserve(READ_SIZE);
        }
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, incoming);
        if incoming.is_empty() {
            give_back(incoming, &self.pool);
        }
        read
    }
}

impl<S, C> AsyncRead for TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: TlsState,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.plain.is_empty() && buf.remaining() > 0 {
                let n = this.plain.len().min(buf.remaining());
                buf.put_slice(&this.plain[..n]);
                this.plain.advance(n);
                if this.plain.is_empty() {
                    give_back(&mut this.plain, &this.pool);
                }
                return Poll::Ready(Ok(()));
            }
            if this.read_ended || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match this.process(None) {
                Ok((Need::Closed, _)) => this.read_ended = true,
                Ok(_) => {}
                Err(error) => {
                    // The alert saying why goes out if the stream takes it.
                    let _ = this.poll_write_records(cx);
                    return Poll::Ready(Err(error));
                }
            }
            if !this.plain.is_empty() || this.read_ended {
                continue;
            }
            // Whatever the session has to send (a key update's answer)
            // goes first, as far as the stream takes it; a failure there is
            // the next write's to report, and what was sent is still read.
            let _ = this.poll_write_records(cx);
            if ready!(this.poll_read_records(cx))? == 0 {
                this.read_ended = true;
            }
        }
    }
}

impl<S, C> AsyncWrite for TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: TlsState,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The last write's records go first: no more plaintext is taken
        // while they wait for the stream.
        ready!(this.poll_write_records(cx))?;
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(MAX_WRITE);
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        // One slice is encrypted where it is; several are gathered first,
        // so that a frame's header and payload share a record.
        let first = bufs.iter().find(|b| !b.is_empty());
        let taken = if let Some(first) = first.filter(|b| b.len() >= total) {
            this.process(Some(&first[..total]))?
        } else {
            let mut staged = this.pool.take(total);
            for slice in bufs {
                let room = total - staged.len();
                staged.put_slice(&slice[..slice.len().min(room)]);
            }
            let taken = this.process(Some(&staged));
            this.pool.give(staged);
            taken?
        };
        match taken {
            (_, 0) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the TLS session takes no more application data",
            ))),
            (_, taken) => {
                if let Poll::Ready(Err(error)) = this.poll_write_records(cx) {
                    return Poll::Ready(Err(error));
                }
                Poll::Ready(Ok(taken))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_records(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    /// Sends `close_notify`, then ends the stream's sending side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.records.close(&mut this.plain, &this.pool)?;
        ready!(this.poll_write_records(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    //! Each side against tokio-rustls as the independent peer, over an
    //! in-memory pipe small enough that every read and write of a big
    //! message waits (`Pending`) many times.

    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::TlsStream;
    use crate::driver::tls::test_configs as configs;
    use crate::pool::BufferPool;

    /// A small pipe: a megabyte crosses it in hundreds of waits.
    const PIPE: usize = 4096;

    fn pool() -> Arc<BufferPool> {
        Arc::new(BufferPool::default())
    }

    fn localhost() -> ServerName<'static> {
        ServerName::try_from("localhost").unwrap()
    }

    fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// Reads `len` bytes, then expects the end.
    async fn read_all(stream: &mut (impl tokio::io::AsyncRead + Unpin), len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        stream.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn the_server_side_carries_a_megabyte_each_way_and_ends_cleanly() {
        let (server_config, client_config) = configs();
        let (near, far) = duplex(PIPE);
        let peer = tokio::spawn(async move {
            let connector = tokio_rustls::TlsConnector::from(client_config);
            let mut tls = connector.connect(localhost(), far).await.unwrap();
            let sent = payload(1 << 20);
            tls.write_all(&sent).await.unwrap();
            tls.flush().await.unwrap();
            let echoed = read_all(&mut tls, 1 << 20).await;
            assert_eq!(echoed, sent);
            // Our side's shutdown sent close_notify: a clean end.
            let mut rest = Vec::new();
            tls.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        });
        let mut tls = TlsStream::accept(server_config, near, pool())
            .await
            .unwrap();
        let got = read_all(&mut tls, 1 << 20).await;
        assert_eq!(got, payload(1 << 20));
        // Everything read and written: the stream holds no buffer of its
        // own, as an idle connection must not.
        assert_eq!(
            (
                tls.records.incoming.capacity(),
                tls.records.outgoing.capacity(),
                tls.plain.capacity()
            ),
            (0, 0, 0)
        );
        // Vectored writes, as the stream driver makes them.
        let (a, b) = got.split_at(1000);
        let mut written = 0;
        while written < got.len() {
            let slices = if written < a.len() {
                [
                    std::io::IoSlice::new(&a[written..]),
                    std::io::IoSlice::new(b),
                ]
            } else {
                [
                    std::io::IoSlice::new(&b[written - a.len()..]),
                    std::io::IoSlice::new(&[]),
                ]
            };
            written += tls.write_vectored(&slices).await.unwrap();
        }
        tls.flush().await.unwrap();
        tls.shutdown().await.unwrap();
        peer.await.unwrap();
    }

    #[tokio::test]
    async fn the_client_side_carries_a_megabyte_each_way() {
        let (server_config, client_config) = configs();
        let (near, far) = duplex(PIPE);
        let peer = tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
            let mut tls = acceptor.accept(far).await.unwrap();
            let got = read_all(&mut tls, 1 << 20).await;
            tls.write_all(&got).await.unwrap();
            tls.shutdown().await.unwrap();
        });
        let mut tls = TlsStream::connect(client_config, localhost(), near, pool())
            .await
            .unwrap();
        let sent = payload(1 << 20);
        tls.write_all(&sent).await.unwrap();
        tls.flush().await.unwrap();
        assert_eq!(read_all(&mut tls, 1 << 20).await, sent);
        // The peer's close_notify: the end, with nothing more.
        let mut rest = Vec::new();
        tls.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        peer.await.unwrap();
    }

    /// A peer that ends the stream without `close_notify` (as most
    /// WebSocket clients do) reads as an end too, after what it sent.
    #[tokio::test]
    async fn an_end_without_close_notify_reads_as_the_end() {
        let (server_config, client_config) = configs();
        let (near, far) = duplex(PIPE);
        let peer = tokio::spawn(async move {
            let connector = tokio_rustls::TlsConnector::from(client_config);
            let mut tls = connector.connect(localhost(), far).await.unwrap();
            tls.write_all(b"last words").await.unwrap();
            tls.flush().await.unwrap();
            // Dropped: the pipe ends with no alert.
        });
        let mut tls = TlsStream::accept(server_config, near, pool())
            .await
            .unwrap();
        peer.await.unwrap();
        let mut got = Vec::new();
        tls.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
    }

    /// Plain HTTP where a ClientHello belongs fails the handshake with
    /// rustls's own error inside the I/O error, and the peer gets an alert.
    #[tokio::test]
    async fn a_peer_that_is_not_speaking_tls_fails_the_handshake() {
        let (server_config, _) = configs();
        let (near, mut far) = duplex(PIPE);
        far.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let error = match TlsStream::accept(server_config, near, pool()).await {
            Ok(_) => panic!("a handshake with plain HTTP succeeded"),
            Err(error) => error,
        };
        let inner = error.get_ref().expect("an inner error");
        assert!(inner.downcast_ref::<rustls::Error>().is_some(), "{error:?}");
        let mut alert = [0u8; 1];
        far.read_exact(&mut alert).await.unwrap();
        assert_eq!(alert[0], 0x15, "a TLS alert record");
    }

    /// A peer that ends the stream in the middle of the handshake.
    #[tokio::test]
    async fn an_end_during_the_handshake_is_an_unexpected_eof() {
        let (server_config, _) = configs();
        let (near, far): (DuplexStream, DuplexStream) = duplex(PIPE);
        drop(far);
        let error = match TlsStream::accept(server_config, near, pool()).await {
            Ok(_) => panic!("a handshake with nobody succeeded"),
            Err(error) => error,
        };
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
