//! `echo`: closed-loop echo. Each connection keeps `depth` messages in flight;
//! every reply read is answered with a new message in one write per read.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Instant;

use crate::wire::Stream;
use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::{SharedStats, Stats};
use crate::wire::{self, FrameReader, Seen};
use crate::{Phase, SharedPhase, TargetArgs, Window, emit, note_failure};

#[derive(Args, Debug, Clone)]
pub struct EchoArgs {
    #[command(flatten)]
    pub shape: LoopArgs,
    /// Send text (ASCII) instead of binary.
    #[arg(long)]
    pub text: bool,
}

/// What a closed-loop run (`echo`, `deflate`) is made of.
#[derive(Args, Debug, Clone)]
pub struct LoopArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub window: Window,
    /// Connections.
    #[arg(long, default_value_t = 100)]
    pub conns: usize,
    /// Payload bytes per message (for `deflate`: before compression).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Messages in flight per connection.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
}

pub async fn run(args: EchoArgs) -> io::Result<()> {
    let shape = &args.shape;
    let target = shape.target.target();
    let sources = shape.target.sources();
    let mut connections = Vec::with_capacity(shape.conns);
    for i in 0..shape.conns {
        connections.push(wire::open(&target, sources.nth(i)).await?);
    }
    let opcode = if args.text { wire::TEXT } else { wire::BINARY };
    let payload: Vec<u8> = (0..shape.size).map(|i| b'a' + (i % 26) as u8).collect();
    let expect = Seen {
        opcode,
        len: shape.size as u64,
    };
    let frame = |mask| wire::masked_frame(opcode, &payload, mask);
    let replies = || {
        let mut reader = FrameReader::default();
        move |buf: &mut BytesMut| {
            let mut count = 0;
            while let Some(seen) = reader.next(buf).map_err(io::Error::other)? {
                if seen != expect {
                    return Err(io::Error::other(format!(
                        "expected {expect:?}, got {seen:?}"
                    )));
                }
                count += 1;
            }
            Ok(count)
        }
    };
    let result = run_loops("echo", shape, connections, frame, replies).await;
    // The connection tasks end with the process, right after this returns.
    emit(&result);
    Ok(())
}

/// Runs [`closed_loop`] on every connection, each sending `frame(mask)` and
/// counting its replies with a counter from `replies`, through the warm-up
/// and the measured window. Returns the summary, tagged with `mode` and the
/// run's shape.
pub(crate) async fn run_loops<R>(
    mode: &str,
    shape: &LoopArgs,
    connections: Vec<(Stream, BytesMut)>,
    frame: impl Fn([u8; 4]) -> Vec<u8>,
    replies: impl Fn() -> R,
) -> serde_json::Value
where
    R: FnMut(&mut BytesMut) -> io::Result<usize> + 'static,
{
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    for (i, (stream, buf)) in connections.into_iter().enumerate() {
        let mask = (i as u32).wrapping_mul(0x9e37_79b9).to_le_bytes();
        let (frame, replies) = (frame(mask), replies());
        let (phase, stats) = (phase.clone(), stats.clone());
        let depth = shape.depth;
        tokio::task::spawn_local(async move {
            let result = closed_loop(stream, buf, frame, depth, &phase, &stats, replies).await;
            note_failure(result, &phase, &stats);
        });
    }
    let secs = shape.window.run(&phase).await.secs;
    let mut result = stats.borrow().summary(secs);
    result["mode"] = json!(mode);
    result["conns"] = json!(shape.conns);
    result["size"] = json!(shape.size);
    result["depth"] = json!(shape.depth);
    result
}

/// Keeps `depth` copies of `frame` in flight: every read's replies (counted by
/// `replies`, which consumes them from the buffer and checks them) are answered
/// with as many new frames, in one write. Records each reply's round trip.
async fn closed_loop(
    mut stream: Stream,
    mut buf: BytesMut,
    frame: Vec<u8>,
    depth: usize,
    phase: &SharedPhase,
    stats: &SharedStats,
    mut replies: impl FnMut(&mut BytesMut) -> io::Result<usize>,
) -> io::Result<()> {
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(depth);
    let mut out = Vec::with_capacity(frame.len() * depth);
    let mut due = depth;
    buf.reserve(64 * 1024);
    loop {
        if phase.get() == Phase::Stop {
            return Ok(());
        }
        out.clear();
        let now = Instant::now();
        for _ in 0..due {
            out.extend_from_slice(&frame);
            sent.push_back(now);
        }
        stream.write_all(&out).await?;
        // TLS keeps records until flushed; plain TCP has nothing to flush.
        stream.flush().await?;
        due = 0;
        while due == 0 {
            if stream.read_buf(&mut buf).await? == 0 {
                return Err(io::Error::other("server closed the connection"));
            }
            let now = Instant::now();
            let measuring = phase.get() == Phase::Measure;
            for _ in 0..replies(&mut buf)? {
                let sent_at = sent
                    .pop_front()
                    .ok_or_else(|| io::Error::other("unsolicited"))?;
                if measuring {
                    stats.borrow_mut().record(now - sent_at);
                }
                due += 1;
            }
            if buf.capacity() - buf.len() < 16 * 1024 {
                buf.reserve(64 * 1024);
            }
        }
    }
}
