//! The few bits of the WebSocket wire format a load generator needs: an upgrade
//! request, masked client frames, and a reader that finds message boundaries in
//! server frames while discarding payload bytes (so a 1 MiB push costs no copy).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::h3wire::{H3Reader, H3Stream, H3Target, H3Writer};

pub const TEXT: u8 = 0x1;
pub const BINARY: u8 = 0x2;
pub const CLOSE: u8 = 0x8;
pub const PING: u8 = 0x9;
pub const PONG: u8 = 0xA;

/// Where to connect and how to open the connection.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: String,
    /// Skip the HTTP upgrade: the peer is the raw TCP echo server.
    pub raw: bool,
    /// wss: the TLS client configuration (the server is `localhost`).
    pub tls: Option<Arc<ClientConfig>>,
    /// Over HTTP/3 (`--h3`): the QUIC client endpoint and the dialect.
    pub h3: Option<H3Target>,
}

/// A connection: plain TCP, TLS over it (wss), or a WebSocket over HTTP/3.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    H3(Box<H3Stream>),
}

/// A connection's reading half, for modes that read and write from two tasks.
pub enum ReadHalf {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Box<TlsStream<TcpStream>>>),
    H3(H3Reader),
}

/// A connection's writing half.
pub enum WriteHalf {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Box<TlsStream<TcpStream>>>),
    H3(H3Writer),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
            Stream::H3(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
            Stream::H3(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
            Stream::H3(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
            Stream::H3(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Stream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> io::Result<&TcpStream> {
        match self {
            Stream::Plain(s) => Ok(s),
            Stream::Tls(s) => Ok(s.get_ref().0),
            Stream::H3(_) => Err(io::Error::other("this mode does not run over HTTP/3")),
        }
    }

    /// The plain TCP connection, for a mode that does not speak TLS.
    pub fn into_plain(self) -> io::Result<TcpStream> {
        match self {
            Stream::Plain(s) => Ok(s),
            Stream::Tls(_) => Err(io::Error::other("this mode does not speak TLS")),
            Stream::H3(_) => Err(io::Error::other("this mode does not run over HTTP/3")),
        }
    }

    /// The two halves (TLS's share the stream behind a lock).
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (read, write) = s.into_split();
                (ReadHalf::Tcp(read), WriteHalf::Tcp(write))
            }
            Stream::Tls(s) => {
                let (read, write) = tokio::io::split(s);
                (ReadHalf::Tls(read), WriteHalf::Tls(write))
            }
            Stream::H3(s) => {
                let (read, write) = s.into_split();
                (ReadHalf::H3(read), WriteHalf::H3(write))
            }
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::Tls(s) => Pin::new(s).poll_read(cx, buf),
            ReadHalf::H3(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::Tls(s) => Pin::new(s).poll_write(cx, buf),
            WriteHalf::H3(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::Tls(s) => Pin::new(s).poll_flush(cx),
            WriteHalf::H3(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::Tls(s) => Pin::new(s).poll_shutdown(cx),
            WriteHalf::H3(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A TLS client configuration (ring) that trusts the certificates in `ca`.
pub fn tls_client(ca: &Path) -> io::Result<Arc<ClientConfig>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(io::Error::other)? {
        roots
            .add(cert.map_err(io::Error::other)?)
            .map_err(io::Error::other)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Source addresses 127.0.0.(offset+1) ..= 127.0.0.(offset+count), used in turn
/// so one client is not limited to one address's ephemeral ports.
#[derive(Clone, Copy, Debug)]
pub struct Sources {
    pub count: u8,
    pub offset: u8,
}

impl Sources {
    pub fn nth(&self, i: usize) -> Option<IpAddr> {
        if self.count == 0 {
            return None;
        }
        let last = self.offset as usize + 1 + i % self.count as usize;
        Some(IpAddr::from([127, 0, 0, last.min(254) as u8]))
    }
}

/// Connects (from `source` if given), sets TCP_NODELAY and upgrades. Returns the
/// stream and any bytes that arrived after the 101 response.
pub async fn open(target: &Target, source: Option<IpAddr>) -> io::Result<(Stream, BytesMut)> {
    let (stream, buf, _) = open_with(target, source, "").await?;
    Ok((stream, buf))
}

/// [`open`], offering `extensions` (if not empty) in `Sec-WebSocket-Extensions`;
/// also returns the response head.
pub async fn open_with(
    target: &Target,
    source: Option<IpAddr>,
    extensions: &str,
) -> io::Result<(Stream, BytesMut, String)> {
    if let Some(h3) = &target.h3 {
        // The response's extensions as a head's line, for the same parsing.
        let (stream, accepted) = h3.open(target.addr, &target.path, extensions).await?;
        let head = format!("sec-websocket-extensions: {accepted}\r\n");
        return Ok((Stream::H3(Box::new(stream)), BytesMut::new(), head));
    }
    let socket = TcpSocket::new_v4()?;
    if let Some(ip) = source {
        bind_address_no_port(&socket)?;
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let tcp = socket.connect(target.addr).await?;
    tcp.set_nodelay(true)?;
    let mut stream = match &target.tls {
        None => Stream::Plain(tcp),
        Some(config) => {
            let name = ServerName::try_from("localhost").unwrap();
            let tls = TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await?;
            Stream::Tls(Box::new(tls))
        }
    };
    let mut buf = BytesMut::with_capacity(4096);
    if target.raw {
        return Ok((stream, buf, String::new()));
    }
    let offer = if extensions.is_empty() {
        String::new()
    } else {
        format!("Sec-WebSocket-Extensions: {extensions}\r\n")
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n",
        target.path, target.addr
    );
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    loop {
        if let Some(end) = find_head_end(&buf) {
            if !buf.starts_with(b"HTTP/1.1 101") {
                let line = buf[..end].split(|&b| b == b'\r').next().unwrap_or_default();
                return Err(io::Error::other(format!(
                    "upgrade refused: {}",
                    String::from_utf8_lossy(line)
                )));
            }
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.advance(end);
            return Ok((stream, buf, head));
        }
        if buf.len() > 16 * 1024 {
            return Err(io::Error::other("response head too long"));
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Lets the kernel pick the source port at connect time (IP_BIND_ADDRESS_NO_PORT),
/// so ports are shared across destinations instead of reserved at bind.
fn bind_address_no_port(socket: &TcpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a pointer to a c_int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// A complete client frame (FIN set) with a fixed mask, ready to be written as
/// many times as needed.
pub fn masked_frame(opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + 14);
    frame.push(0x80 | opcode);
    match payload.len() {
        len @ 0..=125 => frame.push(0x80 | len as u8),
        len @ 126..=0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// One whole message seen by [`FrameReader`]: its opcode and total length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub opcode: u8,
    pub len: u64,
}

/// Finds message boundaries in a byte stream of frames, dropping payload bytes
/// as they arrive. Handles masked frames too (the raw TCP echo reflects ours).
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Payload bytes still to skip in the current frame.
    remaining: u64,
    in_frame: bool,
    fin: bool,
    opcode: u8,
    /// Opcode and length so far of a fragmented data message.
    message: Option<(u8, u64)>,
}

impl FrameReader {
    /// The next complete message in `buf`, consuming what it has read.
    /// `Err` on a frame header no WebSocket server may send.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Seen>, &'static str> {
        self.next_keeping(buf, None)
    }

    /// [`FrameReader::next`], keeping the payload of text messages (their
    /// first 4 KiB) in `text`, which holds the last text message's once
    /// it is returned.
    pub fn next_with_payload(
        &mut self,
        buf: &mut BytesMut,
        text: &mut Vec<u8>,
    ) -> Result<Option<Seen>, &'static str> {
        self.next_keeping(buf, Some(text))
    }

    fn next_keeping(
        &mut self,
        buf: &mut BytesMut,
        mut text: Option<&mut Vec<u8>>,
    ) -> Result<Option<Seen>, &'static str> {
        loop {
            if !self.in_frame {
                let Some((fin, opcode, header, len)) = parse_header(buf)? else {
                    return Ok(None);
                };
                buf.advance(header);
                self.in_frame = true;
                self.fin = fin;
                self.opcode = opcode;
                self.remaining = len;
                if opcode < 0x8 {
                    let (first, so_far) = self.message.take().unwrap_or((opcode, 0));
                    self.message = Some((first, so_far + len));
                    if let (Some(text), 0) = (text.as_deref_mut(), so_far) {
                        text.clear();
                    }
                }
            }
            let take = self.remaining.min(buf.len() as u64) as usize;
            let texting = self.opcode < 0x8 && matches!(self.message, Some((TEXT, _)));
            if let (Some(text), true) = (text.as_deref_mut(), texting) {
                let room = 4096usize.saturating_sub(text.len()).min(take);
                text.extend_from_slice(&buf[..room]);
            }
            buf.advance(take);
            self.remaining -= take as u64;
            if self.remaining > 0 {
                return Ok(None);
            }
            self.in_frame = false;
            if self.opcode >= 0x8 {
                return Ok(Some(Seen {
                    opcode: self.opcode,
                    len: 0,
                }));
            }
            if self.fin {
                let (opcode, len) = self.message.take().unwrap_or_default();
                return Ok(Some(Seen { opcode, len }));
            }
        }
    }
}

/// `(fin, opcode, header length, payload length)` or `None` if incomplete.
fn parse_header(buf: &[u8]) -> Result<Option<(bool, u8, usize, u64)>, &'static str> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (fin, opcode) = (buf[0] & 0x80 != 0, buf[0] & 0x0f);
    let masked = buf[1] & 0x80 != 0;
    let (mut header, len) = match buf[1] & 0x7f {
        126 if buf.len() < 4 => return Ok(None),
        126 => (4, u16::from_be_bytes([buf[2], buf[3]]) as u64),
        127 if buf.len() < 10 => return Ok(None),
        127 => (10, u64::from_be_bytes(buf[2..10].try_into().unwrap())),
        len => (2, len as u64),
    };
    if masked {
        header += 4;
    }
    if buf.len() < header {
        return Ok(None);
    }
    if matches!(opcode, 0x3..=0x7 | 0xB..=0xF) {
        return Err("reserved opcode from server");
    }
    Ok(Some((fin, opcode, header, len)))
}

/// A server frame (unmasked) whose first byte is `first` (FIN, RSV, opcode).
#[cfg(test)]
pub(crate) fn server_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = masked_frame(first & 0x0f, payload, [0; 4]);
    frame[0] = first;
    // Drop the mask bit and the four zero mask bytes.
    frame[1] &= 0x7f;
    let header = frame.len() - payload.len();
    frame.drain(header - 4..header);
    frame
}

/// Sends text messages at `rate` a second, in one write per millisecond,
/// until `going` says stop: `next(n, message)` fills the `n`-th message's
/// payload (cleared before), and each goes out masked.
pub async fn paced(
    stream: &mut Stream,
    rate: u64,
    going: impl Fn() -> bool,
    mut next: impl FnMut(u64, &mut Vec<u8>),
) -> io::Result<()> {
    let (start, mut sent) = (std::time::Instant::now(), 0u64);
    let mut ticks = tokio::time::interval(std::time::Duration::from_millis(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut batch, mut message) = (Vec::new(), Vec::new());
    while going() {
        ticks.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        batch.clear();
        while sent < due {
            message.clear();
            next(sent, &mut message);
            let mask = (sent as u32).wrapping_mul(0x9e37_79b9).to_le_bytes();
            batch.extend_from_slice(&masked_frame(TEXT, &message, mask));
            sent += 1;
        }
        if !batch.is_empty() {
            stream.write_all(&batch).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_messages_across_any_split() {
        let mut stream = server_frame(0x80 | TEXT, b"hello");
        stream.extend(server_frame(BINARY, &[1; 300]));
        stream.extend(server_frame(0x80 | PING, b"p"));
        stream.extend(server_frame(0x80, &[2; 70000]));
        let expected = vec![
            Seen {
                opcode: TEXT,
                len: 5,
            },
            Seen {
                opcode: PING,
                len: 0,
            },
            Seen {
                opcode: BINARY,
                len: 70300,
            },
        ];
        for chunk in [1, 3, 7, 1000, stream.len()] {
            let (mut reader, mut buf, mut seen) = (FrameReader::default(), BytesMut::new(), vec![]);
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(message) = reader.next(&mut buf).unwrap() {
                    seen.push(message);
                }
            }
            assert_eq!(seen, expected, "chunk size {chunk}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn keeps_text_payloads_across_fragments_and_splits() {
        let mut stream = server_frame(TEXT, b"00012");
        stream.extend(server_frame(0x80 | 0x9, b"ping"));
        stream.extend(server_frame(0x80, b"345"));
        stream.extend(server_frame(0x80 | BINARY, &[7; 500]));
        stream.extend(server_frame(0x80 | TEXT, b"next"));
        for split in [1, 3, 7, 600, stream.len()] {
            let (mut reader, mut text) = (FrameReader::default(), Vec::new());
            let (mut buf, mut texts) = (BytesMut::new(), Vec::new());
            for chunk in stream.chunks(split) {
                buf.extend_from_slice(chunk);
                while let Some(message) = reader.next_with_payload(&mut buf, &mut text).unwrap() {
                    if message.opcode == TEXT {
                        texts.push(String::from_utf8(text.clone()).unwrap());
                    }
                }
            }
            assert_eq!(texts, ["00012345", "next"], "split {split}");
        }
    }

    #[test]
    fn reads_masked_frames_reflected_by_raw_echo() {
        let mut buf = BytesMut::from(&masked_frame(BINARY, &[9; 1024], [1, 2, 3, 4])[..]);
        let seen = FrameReader::default().next(&mut buf).unwrap();
        assert_eq!(
            seen,
            Some(Seen {
                opcode: BINARY,
                len: 1024
            })
        );
    }

    #[test]
    fn masks_payload() {
        let frame = masked_frame(TEXT, b"abcd", [1, 2, 3, 4]);
        assert_eq!(
            frame,
            [
                0x81,
                0x84,
                1,
                2,
                3,
                4,
                b'a' ^ 1,
                b'b' ^ 2,
                b'c' ^ 3,
                b'd' ^ 4
            ]
        );
    }
}
