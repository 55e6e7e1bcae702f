//! WebSockets over HTTP/3 for the load generator's modes (`--h3`): a QUIC
//! connection per WebSocket (as a browser opens them), HTTP/3's control
//! streams from `rapidws::h3::Client`, and then the harness's own request
//! and DATA framing, the same for every server, so that a run compares the
//! servers and not two client stacks.
//!
//! Two dialects: RFC 9220's extended CONNECT with `:protocol` websocket
//! (rapidws, aioquic), and sockudo-ws 3.1's, whose HTTP/3 server (on h3
//! 0.0.8, which refuses `:protocol` websocket) takes `:protocol`
//! webtransport and then WebSocket frames in DATA frames, as its own client
//! sends them.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use clap::ValueEnum;
use rapidws::h3::{Client, quinn};
use rapidws::rapidws_core::h3::{FrameHead, frame, put_headers, qpack};
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Which extended CONNECT opens the WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dialect {
    /// RFC 9220: `:protocol` websocket.
    Rfc9220,
    /// sockudo-ws 3.1's HTTP/3: `:protocol` webtransport, WebSocket frames after.
    Sockudo,
}

/// How much of each idle connection `idle --h3-hold` holds, to break an
/// idle WebSocket's memory down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Hold {
    /// The QUIC connection only (the server's HTTP/3 streams, none of ours).
    Quic,
    /// Also HTTP/3: our control stream, SETTINGS both ways.
    H3,
    /// Also a WebSocket on it (what a client holds).
    Ws,
}

/// A connection held without a WebSocket (`Hold::Quic`, `Hold::H3`).
pub struct Bare {
    pub conn: quinn::Connection,
    _client: Option<Client>,
}

/// Where HTTP/3 WebSockets are opened from: one client endpoint (one UDP
/// socket) for every connection of the process.
#[derive(Clone, Debug)]
pub struct H3Target {
    pub endpoint: quinn::Endpoint,
    pub dialect: Dialect,
}

impl H3Target {
    /// Closes every connection (`H3_NO_ERROR`) and waits, at most 1 s, for
    /// the server to hear it: a server serving run after run (`lossy.sh`)
    /// is not left pushing to the connections of a process that ended.
    pub async fn close(&self) {
        self.endpoint.close(0x100u32.into(), b"");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }

    /// A client endpoint (on every local address) trusting `tls`'s roots, ALPN `h3`,
    /// keepalives every 10 s (under servers' 30 s idle timeouts).
    pub fn new(tls: &ClientConfig, dialect: Dialect) -> io::Result<H3Target> {
        let mut tls = tls.clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(io::Error::other)?;
        // 4 MiB of socket buffer, as `rapidws::h3::QuicConfig` asks by
        // default: the kernel's 208 KiB drops datagrams under load.
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        let state = quinn::udp::UdpSocketState::new((&socket).into())?;
        state.set_recv_buffer_size((&socket).into(), 4 << 20)?;
        state.set_send_buffer_size((&socket).into(), 4 << 20)?;
        let runtime = quinn::default_runtime().ok_or_else(|| io::Error::other("no runtime"))?;
        let mut endpoint =
            quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(10)));
        config.transport_config(Arc::new(transport));
        endpoint.set_default_client_config(config);
        Ok(H3Target { endpoint, dialect })
    }

    /// Opens a QUIC connection to `addr` and, with `Hold::H3`, starts
    /// HTTP/3 on it; no WebSocket.
    pub async fn hold(&self, addr: SocketAddr, hold: Hold) -> io::Result<Bare> {
        let conn = self
            .endpoint
            .connect(addr, "localhost")
            .map_err(io::Error::other)?
            .await?;
        let client = match hold {
            Hold::Quic => None,
            Hold::H3 | Hold::Ws => Some(Client::new(conn.clone()).await?),
        };
        Ok(Bare {
            conn,
            _client: client,
        })
    }

    /// Opens a QUIC connection to `addr` and a WebSocket at `path` on it,
    /// offering `extensions` if not empty. Returns the stream and the
    /// response's `sec-websocket-extensions`.
    pub async fn open(
        &self,
        addr: SocketAddr,
        path: &str,
        extensions: &str,
    ) -> io::Result<(H3Stream, String)> {
        let conn = self
            .endpoint
            .connect(addr, "localhost")
            .map_err(io::Error::other)?
            .await?;
        let client = Client::new(conn.clone()).await?;
        let (send, mut recv) = conn.open_bi().await?;
        let protocol: &[u8] = match self.dialect {
            Dialect::Rfc9220 => b"websocket",
            Dialect::Sockudo => b"webtransport",
        };
        let authority = format!("localhost:{}", addr.port());
        let mut head: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"CONNECT"),
            (b":protocol", protocol),
            (b":scheme", b"https"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"sec-websocket-version", b"13"),
        ];
        if !extensions.is_empty() {
            head.push((b"sec-websocket-extensions", extensions.as_bytes()));
        }
        let mut request = Vec::new();
        put_headers(head, &mut request);
        let mut writer = H3Writer {
            send,
            out: BytesMut::from(&request[..]),
            accepted: 0,
        };
        std::future::poll_fn(|cx| writer.poll_out(cx)).await?;
        let mut raw = BytesMut::with_capacity(4096);
        let answer = tokio::time::timeout(Duration::from_secs(10), response(&mut recv, &mut raw))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no response within 10 s"))??;
        if raw.is_empty() {
            // An idle WebSocket holds no buffer of ours.
            raw = BytesMut::new();
        }
        Ok((
            H3Stream {
                reader: H3Reader {
                    recv,
                    raw,
                    data_left: 0,
                    skip_left: 0,
                },
                writer,
                _client: client,
            },
            answer,
        ))
    }
}

/// Reads the response's HEADERS frame: a `200`, or an error with the status.
/// Gives back its `sec-websocket-extensions` (empty if none).
async fn response(recv: &mut quinn::RecvStream, raw: &mut BytesMut) -> io::Result<String> {
    loop {
        if let Some(head) = FrameHead::decode(raw) {
            let end = head.len + head.length as usize;
            if head.kind != frame::kind::HEADERS {
                return Err(io::Error::other(format!(
                    "frame type {:#x} where the response was due",
                    head.kind
                )));
            }
            if raw.len() >= end {
                let section = qpack::decode(&raw[head.len..end], 16 * 1024)
                    .map_err(|error| io::Error::other(format!("response head: {error:?}")))?;
                raw.advance(end);
                let status = section
                    .iter()
                    .find(|(name, _)| *name == b":status")
                    .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
                    .unwrap_or_default();
                match status.as_str() {
                    "200" => {}
                    s if s.starts_with('1') => continue,
                    _ => return Err(io::Error::other(format!("status {status}"))),
                }
                let extensions = section
                    .iter()
                    .find(|(name, _)| *name == b"sec-websocket-extensions")
                    .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
                return Ok(extensions.unwrap_or_default());
            }
            if end > 16 * 1024 {
                return Err(io::Error::other("a response head over 16 KiB"));
            }
        }
        if !read_more(recv, raw).await? {
            return Err(io::Error::other("the stream ended before the response"));
        }
    }
}

/// Reads what has arrived on `recv` onto `raw`; false at the stream's end.
async fn read_more(recv: &mut quinn::RecvStream, raw: &mut BytesMut) -> io::Result<bool> {
    raw.reserve(64 * 1024);
    let got = tokio::io::AsyncReadExt::read_buf(recv, raw).await?;
    Ok(got > 0)
}

/// A WebSocket's bytes over HTTP/3: what is written goes out in DATA
/// frames, what is read is the DATA frames' payloads.
pub struct H3Stream {
    reader: H3Reader,
    writer: H3Writer,
    _client: Client,
}

impl H3Stream {
    /// The two halves, for a mode that reads and writes from two tasks.
    /// (The QUIC connection lives as long as its streams.)
    pub fn into_split(self) -> (H3Reader, H3Writer) {
        (self.reader, self.writer)
    }
}

/// The reading half: DATA frames' payloads, other frames skipped.
pub struct H3Reader {
    recv: quinn::RecvStream,
    /// Bytes read and not yet handed out (frame heads among them).
    raw: BytesMut,
    /// The current DATA frame's payload bytes still to hand out.
    data_left: u64,
    /// The current unknown frame's payload bytes still to skip.
    skip_left: u64,
}

/// The writing half: each write one DATA frame, all or nothing: a write
/// left pending must be called again with the same bytes (as `write_all`
/// does); other bytes then are refused (`InvalidInput`), not mixed in.
pub struct H3Writer {
    send: quinn::SendStream,
    /// A framed write not yet all taken by quinn.
    out: BytesMut,
    /// The caller's bytes `out` carries, reported once it is all taken.
    accepted: usize,
}

impl H3Writer {
    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.send).poll_write(cx, &self.out))?;
            self.out.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H3Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.is_empty() && buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // A write left pending is finished first; the caller retries with
        // the same bytes (as `write_all` does), which it then carried.
        if !this.out.is_empty() && buf.len() != this.accepted {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a write after a pending one, with other bytes",
            )));
        }
        if this.out.is_empty() {
            let mut head = Vec::with_capacity(16);
            frame::put_head(&mut head, frame::kind::DATA, buf.len() as u64);
            this.out.reserve(head.len() + buf.len());
            this.out.extend_from_slice(&head);
            this.out.extend_from_slice(buf);
            this.accepted = buf.len();
        }
        ready!(this.poll_out(cx))?;
        Poll::Ready(Ok(this.accepted))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_out(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_out(cx))?;
        Pin::new(&mut this.send).poll_shutdown(cx)
    }
}

impl AsyncRead for H3Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // Skip what is to be skipped, hand out what is data.
            if this.skip_left > 0 && !this.raw.is_empty() {
                let n = this.skip_left.min(this.raw.len() as u64) as usize;
                this.raw.advance(n);
                this.skip_left -= n as u64;
                continue;
            }
            if this.data_left > 0 && !this.raw.is_empty() {
                let n = (this.data_left.min(this.raw.len() as u64) as usize).min(buf.remaining());
                buf.put_slice(&this.raw[..n]);
                this.raw.advance(n);
                this.data_left -= n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.data_left == 0
                && this.skip_left == 0
                && let Some(head) = FrameHead::decode(&this.raw)
            {
                this.raw.advance(head.len);
                if head.kind == frame::kind::DATA {
                    this.data_left = head.length;
                } else {
                    this.skip_left = head.length;
                }
                continue;
            }
            // More bytes are needed.
            this.raw.reserve(64 * 1024);
            let got = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.recv),
                cx,
                &mut this.raw
            ))?;
            if got == 0 {
                if this.data_left > 0 || this.skip_left > 0 || !this.raw.is_empty() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream ended inside a frame",
                    )));
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl AsyncRead for H3Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for H3Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_shutdown(cx)
    }
}
