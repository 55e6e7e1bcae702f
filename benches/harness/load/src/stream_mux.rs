//! `stream --mux`: the Stream Benchmark with pushes and requests as two
//! streams of one smux session over one WebSocket, against `mux_echo
//! --push-size B` at `--path /mux`.
//!
//! The client is the harness's own, as cheap as the raw-frame one: it
//! writes masked binary frames, reads the server's frames and the smux
//! frames inside them as they arrive, counts the push stream's bytes
//! without copying them, keeps the request stream's bytes to match replies
//! to requests, and (version 2) gives the server window as it reads, when
//! xtaci/smux does (an UPD on the first read and every half window), of
//! `--mux-window` bytes (256 KiB, rapidws's default; xtaci/smux's is 64
//! KiB, and 256 KiB is what a sender assumes before the first UPD). The
//! request stream is opened first (its SYN is the session's first frame,
//! which sets the version); the server then opens the push stream.
//!
//! `--mux-client library` runs the same through rapidws's own client and
//! `rapidws::mux` instead: the figure then includes our client's costs.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::stats::{SharedStats, Stats};
use crate::stream_requests::{
    MuxClient, Pending, StreamArgs, answered, finish, request, send_all, start_requests,
};
use crate::wire;
use crate::{Phase, SharedPhase, emit, note_failure};

/// The request stream's id: the first a dialling xtaci/smux session uses.
const REQUESTS: u32 = 3;

const SYN: u8 = 0;
const FIN: u8 = 1;
const PSH: u8 = 2;
const UPD: u8 = 4;

/// An smux frame inside a masked binary WebSocket frame.
fn frame(version: u8, command: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut smux = Vec::with_capacity(8 + payload.len());
    smux.push(version);
    smux.push(command);
    smux.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    smux.extend_from_slice(&stream.to_le_bytes());
    smux.extend_from_slice(payload);
    wire::masked_frame(wire::BINARY, &smux, [3, 1, 4, 1])
}

#[derive(Default)]
struct Counted {
    push_bytes: Cell<u64>,
}

impl Counted {
    /// The run's result: pushes counted from their bytes (a stream carries
    /// bytes, not messages), `--push-size` each.
    async fn finish(
        &self,
        args: &StreamArgs,
        stats: &SharedStats,
        phase: &SharedPhase,
        secs: f64,
    ) -> serde_json::Value {
        let bytes = self.push_bytes.get();
        let pushes = bytes as f64 / args.push_size.max(1) as f64;
        finish(args, stats, phase, secs, "stream-mux", pushes, bytes).await
    }
}

pub async fn run(args: StreamArgs) -> io::Result<()> {
    if args.mux_client == MuxClient::Library {
        return run_library(args).await;
    }
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let counted = Rc::new(Counted::default());
    let target = args.target.target();
    let sources = args.target.sources();
    let version = args.mux_version;
    let size = args.size.max(20);
    let mut connections = Vec::new();
    for i in 0..args.conns {
        let (stream, buf) = wire::open(&target, sources.nth(i)).await?;
        let (read, mut write) = stream.into_plain()?.into_split();
        // One writer per connection: requests and window updates.
        let (out, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::task::spawn_local(async move {
            while let Some(bytes) = queued.recv().await {
                if write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let _ = out.send(frame(version, SYN, REQUESTS, &[]));
        let pending = Rc::new(Pending::default());
        let session = Session {
            version,
            size,
            window: args.mux_window,
            out: out.clone(),
            pending: pending.clone(),
            phase: phase.clone(),
            stats: stats.clone(),
            counted: counted.clone(),
            ws: WsState::default(),
            smux: [0; 8],
            header_len: 0,
            payload_left: 0,
            payload_stream: 0,
            push: None,
            replies: Vec::new(),
            windows: HashMap::new(),
        };
        let (p, s) = (phase.clone(), stats.clone());
        tokio::task::spawn_local(async move {
            let result = session.read(read, buf).await;
            note_failure(result, &p, &s);
        });
        connections.push((out, pending));
    }
    let start = start_requests(&args, &phase).await;
    let every = Duration::from_micros(args.interval_us.max(1));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for n in 0..args.requests {
        ticks.tick().await;
        let text = request(&args, n);
        for (out, pending) in &connections {
            pending.borrow_mut().insert(n, Instant::now());
            if out
                .send(frame(version, PSH, REQUESTS, text.as_bytes()))
                .is_err()
            {
                stats
                    .borrow_mut()
                    .error(io::Error::other("the connection's writer ended"));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let result = counted.finish(&args, &stats, &phase, secs).await;
    drop(connections);
    emit(&result);
    Ok(())
}

/// Where the reader is in the server's WebSocket frames.
#[derive(Default)]
struct WsState {
    /// Payload bytes left in the current frame.
    left: u64,
    /// The current frame carries a binary message's bytes (else: control).
    data: bool,
}

/// What one stream has read, for its window updates (version 2).
#[derive(Default)]
struct Window {
    consumed: u32,
    announced: u32,
    told: bool,
}

struct Session {
    version: u8,
    size: usize,
    /// The window each stream announces.
    window: u32,
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Rc<Pending>,
    phase: SharedPhase,
    stats: SharedStats,
    counted: Rc<Counted>,
    ws: WsState,
    /// The smux header being gathered (it may span WebSocket frames).
    smux: [u8; 8],
    header_len: usize,
    payload_left: usize,
    payload_stream: u32,
    push: Option<u32>,
    /// Reply bytes not yet a whole reply.
    replies: Vec<u8>,
    windows: HashMap<u32, Window>,
}

impl Session {
    async fn read(
        mut self,
        mut read: tokio::net::tcp::OwnedReadHalf,
        mut buf: BytesMut,
    ) -> io::Result<()> {
        loop {
            self.take(&mut buf)?;
            buf.reserve(256 * 1024);
            if read.read_buf(&mut buf).await? == 0 {
                return Err(io::Error::other("the server closed the connection"));
            }
        }
    }

    /// Takes every whole WebSocket frame header and every payload byte in `buf`.
    fn take(&mut self, buf: &mut BytesMut) -> io::Result<()> {
        loop {
            if self.ws.left == 0 {
                let Some((opcode, header, len)) = ws_header(buf)? else {
                    return Ok(());
                };
                if opcode == wire::CLOSE {
                    return Err(io::Error::other("the server sent a close"));
                }
                buf.advance(header);
                self.ws = WsState {
                    left: len,
                    data: opcode < 0x8,
                };
                continue;
            }
            if buf.is_empty() {
                return Ok(());
            }
            let take = self.ws.left.min(buf.len() as u64) as usize;
            if self.ws.data {
                self.smux_bytes(&buf[..take])?;
            }
            buf.advance(take);
            self.ws.left -= take as u64;
        }
    }

    /// Feeds bytes of the smux byte stream.
    fn smux_bytes(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(bytes.len());
                let stream = self.payload_stream;
                if Some(stream) == self.push {
                    if self.phase.get() == Phase::Measure {
                        self.counted
                            .push_bytes
                            .set(self.counted.push_bytes.get() + take as u64);
                    }
                } else if stream == REQUESTS {
                    self.replies.extend_from_slice(&bytes[..take]);
                    self.match_replies()?;
                }
                self.consumed(stream, take);
                self.payload_left -= take;
                bytes = &bytes[take..];
                continue;
            }
            let take = (8 - self.header_len).min(bytes.len());
            self.smux[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len < 8 {
                continue;
            }
            self.header_len = 0;
            let h = self.smux;
            if h[0] != self.version {
                return Err(io::Error::other(format!(
                    "smux version {} from the server",
                    h[0]
                )));
            }
            let length = usize::from(u16::from_le_bytes([h[2], h[3]]));
            let stream = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            match h[1] {
                SYN if stream.is_multiple_of(2) && self.push.is_none() => self.push = Some(stream),
                SYN => return Err(io::Error::other("a second stream from the server")),
                FIN => {
                    return Err(io::Error::other(format!(
                        "the server ended stream {stream}"
                    )));
                }
                // Data, or a window update's eight bytes (ignored: our
                // requests stay far inside the server's window).
                PSH | UPD => {
                    self.payload_left = length;
                    self.payload_stream = if h[1] == PSH { stream } else { 0 };
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn match_replies(&mut self) -> io::Result<()> {
        let now = Instant::now();
        let mut at = 0;
        while self.replies.len() - at >= self.size {
            let sent_at = answered(&self.pending, &self.replies[at..at + self.size])?;
            at += self.size;
            self.stats.borrow_mut().record(now - sent_at);
        }
        self.replies.drain(..at);
        Ok(())
    }

    /// Counts bytes read on `stream` and, in version 2, gives window back
    /// on the first read and every half window, as xtaci/smux does.
    fn consumed(&mut self, stream: u32, n: usize) {
        if self.version != 2 || stream == 0 {
            return;
        }
        let window = self.windows.entry(stream).or_default();
        window.consumed = window.consumed.wrapping_add(n as u32);
        if !window.told || window.consumed.wrapping_sub(window.announced) >= self.window / 2 {
            window.told = true;
            window.announced = window.consumed;
            let mut update = [0u8; 8];
            update[..4].copy_from_slice(&window.consumed.to_le_bytes());
            update[4..].copy_from_slice(&self.window.to_le_bytes());
            let _ = self.out.send(frame(self.version, UPD, stream, &update));
        }
    }
}

/// `(opcode, header length, payload length)` of the server frame starting
/// `buf`, or `None` if its header is not whole yet.
fn ws_header(buf: &[u8]) -> io::Result<Option<(u8, usize, u64)>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    if buf[1] & 0x80 != 0 {
        return Err(io::Error::other("a masked frame from the server"));
    }
    let opcode = buf[0] & 0x0f;
    Ok(match buf[1] & 0x7f {
        126 if buf.len() < 4 => None,
        126 => Some((opcode, 4, u64::from(u16::from_be_bytes([buf[2], buf[3]])))),
        127 if buf.len() < 10 => None,
        127 => Some((
            opcode,
            10,
            u64::from_be_bytes(buf[2..10].try_into().expect("eight bytes")),
        )),
        len => Some((opcode, 2, u64::from(len))),
    })
}

/// `--mux-client library`: the same run through rapidws's client and
/// `rapidws::mux`.
async fn run_library(args: StreamArgs) -> io::Result<()> {
    use rapidws::mux::{Config, Mux, Side, Version};
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let counted = Rc::new(Counted::default());
    let client = rapidws::client::Client::new(rapidws::Config::default());
    let url = format!("ws://{}{}", args.target.addr, args.target.path);
    let config = Config {
        version: Some(if args.mux_version == 2 {
            Version::V2
        } else {
            Version::V1
        }),
        stream_window: args.mux_window,
        ..Config::default()
    };
    let mut connections = Vec::new();
    for _ in 0..args.conns {
        let (socket, _) = client
            .connect(url.as_str())
            .await
            .map_err(io::Error::other)?;
        let mux = Mux::over_websocket(socket, Side::Dialer, config.clone());
        let requests = mux.open_stream().await.map_err(io::Error::other)?;
        requests.set_priority(1);
        // Our first frame tells the server the version; it opens the push stream.
        let push = tokio::time::timeout(Duration::from_secs(10), mux.accept_stream())
            .await
            .ok()
            .flatten()
            .ok_or_else(|| {
                io::Error::other("the server opened no push stream (mux_echo --push-size?)")
            })?;
        let (p, s, c) = (phase.clone(), stats.clone(), counted.clone());
        tokio::task::spawn_local(async move {
            let result = read_pushes(push, &p, &c).await;
            note_failure(result, &p, &s);
        });
        let (read, write) = tokio::io::split(requests);
        let pending = Rc::new(Pending::default());
        let (p, s, q, size) = (
            phase.clone(),
            stats.clone(),
            pending.clone(),
            args.size.max(20),
        );
        tokio::task::spawn_local(async move {
            let result = read_mux_replies(read, size, &q, &s).await;
            note_failure(result, &p, &s);
        });
        connections.push((write, pending, mux));
    }
    let start = start_requests(&args, &phase).await;
    let (connections, sessions): (Vec<_>, Vec<_>) = connections
        .into_iter()
        .map(|(write, pending, mux)| ((write, pending), mux))
        .unzip();
    let writers = send_all(connections, &args, &stats, <[u8]>::to_vec).await;
    let secs = start.elapsed().as_secs_f64();
    let result = counted.finish(&args, &stats, &phase, secs).await;
    drop(writers);
    drop(sessions);
    emit(&result);
    Ok(())
}

/// Reads the echoed requests, `size` bytes each, and records each round trip.
async fn read_mux_replies(
    mut read: tokio::io::ReadHalf<rapidws::mux::Stream>,
    size: usize,
    pending: &Pending,
    stats: &SharedStats,
) -> io::Result<()> {
    let mut record = vec![0; size];
    loop {
        read.read_exact(&mut record).await?;
        let now = Instant::now();
        let sent_at = answered(pending, &record)?;
        stats.borrow_mut().record(now - sent_at);
    }
}

/// Reads the push stream as fast as it comes, counting its bytes while measuring.
async fn read_pushes(
    mut push: rapidws::mux::Stream,
    phase: &SharedPhase,
    counted: &Counted,
) -> io::Result<()> {
    let mut buffer = vec![0; 256 * 1024];
    loop {
        let n = push.read(&mut buffer).await?;
        if n == 0 {
            return Err(io::Error::other("the server ended the push stream"));
        }
        if phase.get() == Phase::Measure {
            counted.push_bytes.set(counted.push_bytes.get() + n as u64);
        }
    }
}
