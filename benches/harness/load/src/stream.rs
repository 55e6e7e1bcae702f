//! `stream`: the "WebSocket Stream Benchmark" pattern. The server pushes large
//! binary messages on a timer; on the same connection the client sends a
//! small text request every interval, a fixed number of them, and matches
//! each echo to its request by content (its number), as that benchmark's
//! client does. A reply that has not come 5 s after the last request counts
//! as missing.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::stats::{SharedStats, Stats};
use crate::stream_requests::{Pending, StreamArgs, answered, finish, send_all, start_requests};
use crate::wire::{self, FrameReader};
use crate::{Phase, SharedPhase, emit, note_failure};

#[derive(Default)]
struct Pushes {
    messages: Cell<u64>,
    bytes: Cell<u64>,
}

/// What `--trace` writes out.
#[derive(Default)]
struct Trace {
    /// When each answered request was sent, and its round trip.
    replies: Vec<(Instant, Duration)>,
    /// When each read returned, and its size.
    reads: Vec<(Instant, usize)>,
}

impl Trace {
    fn write(&self, path: &std::path::Path, start: Instant) -> io::Result<()> {
        let secs = |at: &Instant| at.saturating_duration_since(start).as_secs_f64();
        let mut lines = String::new();
        for (sent, rtt) in &self.replies {
            lines += &format!("reply {:.6} {}\n", secs(sent), rtt.as_micros());
        }
        for (at, bytes) in &self.reads {
            lines += &format!("read {:.6} {bytes}\n", secs(at));
        }
        std::fs::write(path, lines)
    }
}

/// Kept only with `--trace`.
type SharedTrace = Rc<Option<RefCell<Trace>>>;

pub async fn run(args: StreamArgs) -> io::Result<()> {
    if args.mux {
        return crate::stream_mux::run(args).await;
    }
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let pushes = Rc::new(Pushes::default());
    let trace: SharedTrace = Rc::new(args.trace.as_ref().map(|_| RefCell::default()));
    let target = args.target.target();
    let sources = args.target.sources();
    let mut connections = Vec::new();
    for i in 0..args.conns {
        let (stream, buf) = wire::open(&target, sources.nth(i)).await?;
        let (read, write) = stream.into_split();
        let pending = Rc::new(Pending::default());
        let (p, s, pushes, q, t) = (
            phase.clone(),
            stats.clone(),
            pushes.clone(),
            pending.clone(),
            trace.clone(),
        );
        tokio::task::spawn_local(async move {
            let result = read_replies(read, buf, &q, &p, &s, &pushes, &t).await;
            note_failure(result, &p, &s);
        });
        connections.push((write, pending));
    }
    let start = start_requests(&args, &phase).await;
    let masked = |text: &[u8]| wire::masked_frame(wire::TEXT, text, [9, 8, 7, 6]);
    let writers = send_all(connections, &args, &stats, masked).await;
    // Pushes are counted while requests go out.
    let secs = start.elapsed().as_secs_f64();
    let (pushed, pushed_bytes) = (pushes.messages.get(), pushes.bytes.get());
    let result = finish(
        &args,
        &stats,
        &phase,
        secs,
        "stream",
        pushed as f64,
        pushed_bytes,
    )
    .await;
    if let (Some(path), Some(trace)) = (&args.trace, trace.as_ref()) {
        trace.borrow().write(path, start)?;
    }
    // The connection tasks end with the process, right after this returns;
    // QUIC connections are closed first (a process's end sends nothing).
    drop(writers);
    emit(&result);
    if let Some(h3) = &target.h3 {
        h3.close().await;
    }
    Ok(())
}

async fn read_replies(
    mut read: wire::ReadHalf,
    mut buf: BytesMut,
    pending: &Pending,
    phase: &SharedPhase,
    stats: &SharedStats,
    pushes: &Pushes,
    trace: &SharedTrace,
) -> io::Result<()> {
    let mut reader = FrameReader::default();
    let mut text = Vec::new();
    loop {
        buf.reserve(256 * 1024);
        let got = read.read_buf(&mut buf).await?;
        if got == 0 {
            return Err(io::Error::other("server closed the connection"));
        }
        let now = Instant::now();
        if let Some(trace) = trace.as_ref() {
            trace.borrow_mut().reads.push((now, got));
        }
        let measuring = phase.get() == Phase::Measure;
        while let Some(seen) = reader
            .next_with_payload(&mut buf, &mut text)
            .map_err(io::Error::other)?
        {
            match seen.opcode {
                wire::TEXT => {
                    let sent_at = answered(pending, &text)?;
                    stats.borrow_mut().record(now - sent_at);
                    if let Some(trace) = trace.as_ref() {
                        trace.borrow_mut().replies.push((sent_at, now - sent_at));
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
