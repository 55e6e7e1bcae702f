//! `fanout`'s other shapes: publishers over HTTP (`--publish http`: the
//! bus's `POST /publish/<topic>`, or Centrifugo's `POST /api/publish`), and
//! subscribers that speak Centrifugo's client protocol (`--protocol
//! centrifuge`: connect and subscribe in one frame, publication pushes in
//! JSON, `{}` pings answered), so that notify_bus, centrifugo_compat and
//! Centrifugo itself meet the same client.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::wire::{self, TEXT, masked_frame};
use crate::{Phase, SharedPhase};

/// What the subscribers speak.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `<path>?topics=t<k>`; each delivery is the payload itself.
    Plain,
    /// Centrifugo's client protocol v2 (JSON) at `<path>`.
    Centrifuge,
}

/// How publications get to the server.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// One WebSocket, `t<k>\n<payload>` messages (the fan-out servers').
    Ws,
    /// Kept-alive HTTP connections (`--publishers`), each publishing its
    /// share of the rate and waiting for each answer.
    Http,
}

/// The path subscriber `topic` opens.
pub fn subscribe_path(protocol: Protocol, base: &str, topic: usize) -> String {
    match protocol {
        Protocol::Plain => format!("{base}?topics=t{topic}"),
        Protocol::Centrifuge => base.to_owned(),
    }
}

/// What a subscriber sends once upgraded: nothing, or Centrifugo's connect
/// and subscribe in one frame (as its JavaScript SDK does).
pub async fn greet(stream: &mut wire::Stream, protocol: Protocol, topic: usize) -> io::Result<()> {
    if protocol == Protocol::Centrifuge {
        let hello = format!(
            "{{\"id\":1,\"connect\":{{}}}}\n{{\"id\":2,\"subscribe\":{{\"channel\":\"t{topic}\"}}}}"
        );
        stream
            .write_all(&masked_frame(TEXT, hello.as_bytes(), [7, 7, 7, 7]))
            .await?;
    }
    Ok(())
}

/// What a subscriber makes of a text message.
pub enum Read {
    /// A delivery sent at this time (ns on the generator's clock).
    Delivery(u64),
    /// A server ping to answer with `{}`.
    Ping,
    /// Something else (a reply): nothing to do.
    Other,
}

/// Reads a text message in `protocol`, and how many deliveries it holds
/// (Centrifugo may put several pushes in one frame, one per line; the
/// first one's timestamp stands for them all). One pass over the text, with
/// `memchr`'s searches: at a million messages a second the reading is the
/// client's own largest cost.
pub fn read(protocol: Protocol, text: &[u8]) -> Option<(Read, usize)> {
    let hex = |bytes: &[u8]| {
        std::str::from_utf8(bytes.get(..16)?)
            .ok()
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
    };
    match protocol {
        Protocol::Plain => hex(text).map(|at| (Read::Delivery(at), 1)),
        Protocol::Centrifuge => {
            if text == b"{}" {
                return Some((Read::Ping, 0));
            }
            // `{"push":{"channel":..,"pub":{"data":{"t":"<hex>..."},...}}}`.
            let Some(at) = memchr::memmem::find(text, b"\"pub\"") else {
                return Some((Read::Other, 0));
            };
            let rest = &text[at..];
            let start = memchr::memmem::find(rest, b"\"t\":\"")? + 5;
            let sent = hex(&rest[start..])?;
            let count = if memchr::memchr(b'\n', text).is_none() {
                1
            } else {
                text.split(|&b| b == b'\n')
                    .filter(|line| memchr::memmem::find(line, b"\"pub\"").is_some())
                    .count()
            };
            Some((Read::Delivery(sent), count))
        }
    }
}

/// The answer to a ping.
pub async fn pong(stream: &mut wire::Stream) -> io::Result<()> {
    stream
        .write_all(&masked_frame(TEXT, b"{}", [1, 2, 3, 4]))
        .await
}

/// One HTTP publisher: `rate` publishes a second (or as many as the server
/// answers, if fewer), topics round-robin from `first` in steps of
/// `stride`, each payload `size` bytes starting with its send time.
pub struct HttpPublisher {
    pub addr: SocketAddr,
    pub protocol: Protocol,
    pub api_key: String,
    pub topics: usize,
    pub first: usize,
    pub stride: usize,
    pub rate: f64,
    pub size: usize,
}

impl HttpPublisher {
    pub async fn run(
        self,
        now: impl Fn() -> u64,
        phase: &SharedPhase,
        measured: &Cell<u64>,
    ) -> io::Result<()> {
        let filler = "x".repeat(self.size.saturating_sub(16));
        let start = Instant::now();
        let mut connection: Option<BufReader<TcpStream>> = None;
        let mut n = 0u64;
        while phase.get() != Phase::Stop {
            let due = start + Duration::from_secs_f64(n as f64 / self.rate);
            tokio::time::sleep_until(due.into()).await;
            let topic = (self.first + n as usize * self.stride) % self.topics;
            let payload = format!("{:016x}{filler}", now());
            let request = match self.protocol {
                Protocol::Plain => format!(
                    "POST /publish/t{topic} HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n{payload}",
                    payload.len()
                ),
                Protocol::Centrifuge => {
                    let body =
                        format!("{{\"channel\":\"t{topic}\",\"data\":{{\"t\":\"{payload}\"}}}}");
                    format!(
                        "POST /api/publish HTTP/1.1\r\nHost: bus\r\nX-API-Key: {}\r\n\
                         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        self.api_key,
                        body.len()
                    )
                }
            };
            if connection.is_none() {
                let stream = TcpStream::connect(self.addr).await?;
                stream.set_nodelay(true)?;
                connection = Some(BufReader::new(stream));
            }
            let stream = connection.as_mut().expect("connected above");
            let answered = async {
                stream.get_mut().write_all(request.as_bytes()).await?;
                answer(stream).await
            };
            match answered.await {
                Ok(200) => {
                    if phase.get() == Phase::Measure {
                        measured.set(measured.get() + 1);
                    }
                }
                Ok(status) => return Err(io::Error::other(format!("a publish answered {status}"))),
                // The server ended the connection (it keeps one for so
                // many requests): a new one.
                Err(_) => connection = None,
            }
            n += 1;
        }
        Ok(())
    }
}

/// Reads one answer (head, then its `Content-Length` body); its status.
pub async fn answer(stream: &mut BufReader<TcpStream>) -> io::Result<u16> {
    let mut status = 0;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(io::Error::other("closed"));
        }
        if status == 0 {
            status = line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(status)
}
