//! `stream`: the "WebSocket Stream Benchmark" pattern. The server pushes large
//! binary messages on a timer; on the same connection the client sends a small
//! text request every interval and measures each echo's round-trip time.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::MissedTickBehavior;

use crate::stats::{SharedStats, Stats};
use crate::wire::{self, FrameReader};
use crate::{Phase, SharedPhase, TargetArgs, Window, emit, note_failure};

#[derive(Args, Debug, Clone)]
pub struct StreamArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub window: Window,
    /// Connections.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Microseconds between requests on each connection.
    #[arg(long, default_value_t = 1000)]
    pub interval_us: u64,
    /// Request payload bytes (text).
    #[arg(long, default_value_t = 16)]
    pub size: usize,
}

#[derive(Default)]
struct Pushes {
    messages: Cell<u64>,
    bytes: Cell<u64>,
}

pub async fn run(args: StreamArgs) -> io::Result<()> {
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let pushes = Rc::new(Pushes::default());
    let target = args.target.target();
    let sources = args.target.sources();
    for i in 0..args.conns {
        let (stream, buf) = wire::open(&target, sources.nth(i)).await?;
        let (read, write) = stream.into_plain()?.into_split();
        let sent = Rc::new(RefCell::new(VecDeque::new()));
        let request = wire::masked_frame(wire::TEXT, &vec![b'r'; args.size], [9, 8, 7, 6]);
        let every = Duration::from_micros(args.interval_us.max(1));
        let (p, s, q) = (phase.clone(), stats.clone(), sent.clone());
        tokio::task::spawn_local(async move {
            let result = send_requests(write, request, every, &q).await;
            note_failure(result, &p, &s);
        });
        let (p, s, pushes) = (phase.clone(), stats.clone(), pushes.clone());
        tokio::task::spawn_local(async move {
            let result = read_replies(read, buf, &sent, &p, &s, &pushes).await;
            note_failure(result, &p, &s);
        });
    }
    let secs = args.window.run(&phase).await;
    let mut result = stats.borrow().summary(secs);
    result["mode"] = json!("stream");
    result["conns"] = json!(args.conns);
    result["pushes_per_sec"] = json!(pushes.messages.get() as f64 / secs);
    result["push_mb_per_sec"] = json!(pushes.bytes.get() as f64 / secs / 1e6);
    // The connection tasks end with the process, right after this returns.
    emit(&result);
    Ok(())
}

async fn send_requests(
    mut write: OwnedWriteHalf,
    request: Vec<u8>,
    every: Duration,
    sent: &RefCell<VecDeque<Instant>>,
) -> io::Result<()> {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        sent.borrow_mut().push_back(Instant::now());
        write.write_all(&request).await?;
    }
}

async fn read_replies(
    mut read: OwnedReadHalf,
    mut buf: BytesMut,
    sent: &RefCell<VecDeque<Instant>>,
    phase: &SharedPhase,
    stats: &SharedStats,
    pushes: &Pushes,
) -> io::Result<()> {
    let mut reader = FrameReader::default();
    loop {
        buf.reserve(256 * 1024);
        if read.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::other("server closed the connection"));
        }
        let now = Instant::now();
        let measuring = phase.get() == Phase::Measure;
        while let Some(seen) = reader.next(&mut buf).map_err(io::Error::other)? {
            match seen.opcode {
                wire::TEXT => {
                    let sent_at = sent.borrow_mut().pop_front();
                    let sent_at = sent_at.ok_or_else(|| io::Error::other("unsolicited text"))?;
                    if measuring {
                        stats.borrow_mut().record(now - sent_at);
                    }
                }
                wire::BINARY if measuring => {
                    pushes.messages.set(pushes.messages.get() + 1);
                    pushes.bytes.set(pushes.bytes.get() + seen.len);
                }
                wire::CLOSE => return Err(io::Error::other("server sent close")),
                _ => {}
            }
        }
    }
}
