//! A rustls session over an async byte stream, itself an async byte stream:
//! what the tokio server's wss and the client's wss run the stream driver
//! over. Written here on rustls's own API rather than taken from
//! tokio-rustls, so that TLS costs no runtime crate beyond what the stream
//! driver already has, and io_uring users of `rustls` pull in no tokio.
//!
//! The session keeps rustls's buffers: records read but not yet decrypted,
//! plaintext not yet read, records not yet written. Writes are bounded by
//! them: a write is refused (`Pending`) while records from the last one are
//! still waiting for the stream, so plaintext never piles up in the
//! session beyond one write's worth.
//!
//! The peer's TCP end without a `close_notify` reads as an end, as a clean
//! one does: WebSocket's own close handshake is what says a connection
//! ended whole (a truncated one is reported 1006 either way), and most
//! clients do not send the alert.

use std::io::{self, Read, Write};
use std::ops::DerefMut;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream `S` carrying a TLS session `C` (a `ServerConnection` or a
/// `ClientConnection`), after the handshake.
pub(crate) struct TlsStream<S, C> {
    io: S,
    session: C,
    /// Plaintext bytes the session holds, ready to read (from the last
    /// `process_new_packets`, less what was read since).
    plaintext: usize,
    /// The peer sent its `close_notify`, or the stream ended: nothing more
    /// will be read once `plaintext` is.
    read_ended: bool,
    /// Our `close_notify` is queued.
    closing: bool,
}

impl<S> TlsStream<S, ServerConnection>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// The server's side of a handshake over `io`.
    pub(crate) async fn accept(config: Arc<ServerConfig>, io: S) -> io::Result<Self> {
        let session = ServerConnection::new(config).map_err(tls_error)?;
        TlsStream::new(io, session).handshake().await
    }
}

impl<S> TlsStream<S, ClientConnection>
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
    ) -> io::Result<Self> {
        let session = ClientConnection::new(config, name).map_err(tls_error)?;
        TlsStream::new(io, session).handshake().await
    }
}

impl<S, C, D> TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
{
    fn new(io: S, session: C) -> Self {
        TlsStream {
            io,
            session,
            plaintext: 0,
            read_ended: false,
            closing: false,
        }
    }

    async fn handshake(mut self) -> io::Result<Self> {
        std::future::poll_fn(|cx| self.poll_handshake(cx)).await?;
        Ok(self)
    }

    /// Writes and reads records until the session is established, then
    /// writes out what it still has to say (a client's Finished, a TLS 1.3
    /// server's tickets). A failure to write those is not the handshake's:
    /// a peer that sent its data and left at once is still read, and the
    /// next write reports the failure.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.session.is_handshaking() {
            ready!(self.poll_write_records(cx))?;
            if !self.session.is_handshaking() {
                break;
            }
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

    /// Writes the session's records to the stream until none is left
    /// (`Ready`) or the stream takes no more (`Pending`).
    fn poll_write_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.session.wants_write() {
            let mut io = Blocking {
                io: &mut self.io,
                cx,
            };
            match self.session.write_tls(&mut io) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads records from the stream once and processes them: how many
    /// bytes came (0: the stream ended).
    fn poll_read_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut io = Blocking {
            io: &mut self.io,
            cx,
        };
        let read = match self.session.read_tls(&mut io) {
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
            Err(error) => return Poll::Ready(Err(error)),
        };
        match self.session.process_new_packets() {
            Ok(state) => {
                self.plaintext = state.plaintext_bytes_to_read();
                self.read_ended |= read == 0 || state.peer_has_closed();
                Poll::Ready(Ok(read))
            }
            Err(error) => {
                // The session queued an alert saying why: it goes out if
                // the stream takes it now.
                let _ = self.poll_write_records(cx);
                Poll::Ready(Err(tls_error(error)))
            }
        }
    }
}

impl<S, C, D> AsyncRead for TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.plaintext > 0 && buf.remaining() > 0 {
                // Only what is there is initialized: a read buffer's spare
                // room is not zeroed at every read.
                let wanted = this.plaintext.min(buf.remaining());
                let read = this
                    .session
                    .reader()
                    .read(buf.initialize_unfilled_to(wanted))?;
                buf.advance(read);
                this.plaintext -= read;
                return Poll::Ready(Ok(()));
            }
            if this.read_ended || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            // Whatever the session has to send (a key update's answer)
            // goes first, as far as the stream takes it; a failure there is
            // the next write's to report, and what was sent is still read.
            let _ = this.poll_write_records(cx);
            ready!(this.poll_read_records(cx))?;
        }
    }
}

impl<S, C, D> AsyncWrite for TlsStream<S, C>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: DerefMut<Target = ConnectionCommon<D>> + Unpin,
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
        let taken = this.session.writer().write_vectored(bufs)?;
        if let Poll::Ready(Err(error)) = this.poll_write_records(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.session.writer().flush()?;
        ready!(this.poll_write_records(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    /// Sends `close_notify`, then ends the stream's sending side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.session.send_close_notify();
            this.closing = true;
        }
        ready!(this.poll_write_records(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// A rustls error as an I/O error that still carries it (callers tell the
/// two apart with `get_ref().downcast_ref::<rustls::Error>()`).
fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// The stream as the blocking `Read` and `Write` that rustls's record I/O
/// takes: `Pending` becomes `WouldBlock`, with the task's waker registered.
struct Blocking<'a, 'b, S> {
    io: &'a mut S,
    cx: &'a mut Context<'b>,
}

impl<S: AsyncRead + Unpin> Read for Blocking<'_, '_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut buf) {
            Poll::Ready(Ok(())) => Ok(buf.filled().len()),
            Poll::Ready(Err(error)) => Err(error),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<S: AsyncWrite + Unpin> Write for Blocking<'_, '_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, buf) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match Pin::new(&mut *self.io).poll_flush(self.cx) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each side against tokio-rustls as the independent peer, over an
    //! in-memory pipe small enough that every read and write of a big
    //! message waits (`Pending`) many times.

    use std::sync::Arc;

    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use rustls::{ClientConfig, RootCertStore, ServerConfig};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::TlsStream;

    /// A small pipe: a megabyte crosses it in hundreds of waits.
    const PIPE: usize = 4096;

    fn configs() -> (Arc<ServerConfig>, Arc<ClientConfig>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert: CertificateDer<'static> = made.cert.der().clone();
        let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key))
            .unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
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
        let mut tls = TlsStream::accept(server_config, near).await.unwrap();
        let got = read_all(&mut tls, 1 << 20).await;
        assert_eq!(got, payload(1 << 20));
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
        let mut tls = TlsStream::connect(client_config, localhost(), near)
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
        let mut tls = TlsStream::accept(server_config, near).await.unwrap();
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
        let error = match TlsStream::accept(server_config, near).await {
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
        let error = match TlsStream::accept(server_config, near).await {
            Ok(_) => panic!("a handshake with nobody succeeded"),
            Err(error) => error,
        };
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
