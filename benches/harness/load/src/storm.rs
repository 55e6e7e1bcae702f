//! `storm`: a reconnect storm. Subscribers connect to
//! `<path>?topics=t0&positions=1` (deliveries come as
//! `<epoch>:<offset>\n<payload>`), one publisher connection publishes to
//! `t0` at a fixed rate for the whole run, and after the warm-up every
//! subscriber's connection is dropped at once. Each reconnects right away
//! with `since=t0:<epoch>:<offset>` of the last delivery it read, reads the
//! replay, then `recovered:true|false`, then live deliveries. The figures:
//! how many were recovered, the time from the drop until the last one was
//! (and the median), and, over every subscriber's deliveries before and
//! after, the offsets missing and those delivered twice (both must be 0).

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::wire::{self, FrameReader};
use crate::{TargetArgs, Window, emit};

#[derive(Args, Debug, Clone)]
pub struct StormArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// `--warmup`: seconds before the drop; `--duration`: the most seconds
    /// given to the resumes.
    #[command(flatten)]
    pub window: Window,
    /// Subscriber connections.
    #[arg(long, default_value_t = 10_000)]
    pub subscribers: usize,
    /// Publishes per second to the one topic.
    #[arg(long, default_value_t = 20)]
    pub rate: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
}

/// One subscriber's view, across its two connections.
#[derive(Default)]
struct Seen {
    epoch: String,
    /// The last offset read (0: none yet).
    last: u64,
    missing: u64,
    doubled: u64,
    /// When its resume said whether it was recovered, and what it said.
    resumed: Option<(Duration, bool)>,
    /// Gaps the server told of (a queue that overflowed).
    told: u64,
}

impl Seen {
    /// Notes a delivery at `epoch:offset`.
    fn deliver(&mut self, epoch: &str, offset: u64) {
        if self.last == 0 || epoch != self.epoch {
            self.epoch = epoch.to_owned();
        } else if offset <= self.last {
            self.doubled += 1;
            return;
        } else {
            self.missing += offset - self.last - 1;
        }
        self.last = offset;
    }
}

type Shared = Rc<RefCell<Seen>>;

pub async fn run(args: StormArgs) -> io::Result<()> {
    let mut target = args.target.target();
    let base = args.target.path.clone();
    let sources = args.target.sources();
    let stop = Rc::new(Cell::new(false));
    let seen: Vec<Shared> = (0..args.subscribers).map(|_| Shared::default()).collect();
    let mut first = Vec::with_capacity(args.subscribers);
    target.path = format!("{base}?topics=t0&positions=1");
    for (i, seen) in seen.iter().enumerate() {
        let (stream, buf) = wire::open(&target, sources.nth(i)).await?;
        let (seen, stop) = (seen.clone(), stop.clone());
        first.push(tokio::task::spawn_local(async move {
            let _ = read(stream, buf, &seen, &stop, None).await;
        }));
    }
    target.path = base.clone();
    let (publisher, _) = wire::open(&target, sources.nth(args.subscribers)).await?;
    let publishing = {
        let (args, stop) = (args.clone(), stop.clone());
        tokio::task::spawn_local(async move { publish(publisher, &args, &stop).await })
    };
    tokio::time::sleep(Duration::from_secs_f64(args.window.warmup)).await;

    // The storm: every subscriber gone at once, then all back.
    emit(&json!({ "event": "measure" }));
    for task in first {
        task.abort();
    }
    tokio::task::yield_now().await;
    let dropped = Instant::now();
    let failed = Rc::new(Cell::new(0u64));
    let mut second = Vec::with_capacity(args.subscribers);
    for (i, seen) in seen.iter().enumerate() {
        let since = {
            let seen = seen.borrow();
            format!("{base}?positions=1&since=t0:{}:{}", seen.epoch, seen.last)
        };
        let mut target = target.clone();
        target.path = since;
        let source = sources.nth(i);
        let (seen, stop, failed) = (seen.clone(), stop.clone(), failed.clone());
        second.push(tokio::task::spawn_local(async move {
            // A connect the listen queue refused is tried again.
            for attempt in 0..20 {
                match wire::open(&target, source).await {
                    Ok((stream, buf)) => {
                        let _ = read(stream, buf, &seen, &stop, Some(dropped)).await;
                        return;
                    }
                    Err(_) if attempt < 19 => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(_) => failed.set(failed.get() + 1),
                }
            }
        }));
    }
    let deadline = dropped + Duration::from_secs_f64(args.window.duration);
    while Instant::now() < deadline && seen.iter().any(|s| s.borrow().resumed.is_none()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A moment of live deliveries after the last resume, to catch a seam
    // that loses or doubles.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.set(true);
    let _ = publishing.await;
    for task in second {
        task.abort();
    }

    let mut times: Vec<f64> = Vec::new();
    let (mut recovered, mut not_recovered, mut missing, mut doubled) = (0u64, 0u64, 0u64, 0u64);
    let mut told = 0;
    for seen in &seen {
        let seen = seen.borrow();
        match seen.resumed {
            Some((after, true)) => {
                recovered += 1;
                times.push(after.as_secs_f64());
            }
            Some((_, false)) => not_recovered += 1,
            None => {}
        }
        missing += seen.missing;
        doubled += seen.doubled;
        told += seen.told;
    }
    times.sort_by(f64::total_cmp);
    let all = times.last().copied().unwrap_or(f64::NAN);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let unanswered = args.subscribers as u64 - recovered - not_recovered;
    emit(&json!({
        "mode": "storm",
        "subscribers": args.subscribers,
        "rate": args.rate,
        "completed": recovered,
        "recovered": recovered,
        "not_recovered": not_recovered,
        "unanswered": unanswered,
        "connect_failed": failed.get(),
        "missing": missing,
        "doubled": doubled,
        "told_gaps": told,
        "recover_all_secs": all,
        "recover_p50_secs": median,
        "per_sec": recovered as f64 / all,
        "secs": all,
        "errors": unanswered + not_recovered + missing + doubled,
    }));
    Ok(())
}

/// Publishes `t0\n<payload>` at `args.rate` a second until `stop`.
async fn publish(mut stream: wire::Stream, args: &StormArgs, stop: &Cell<bool>) -> io::Result<()> {
    let mut message = b"t0\n".to_vec();
    message.resize(3 + args.size, b'x');
    wire::paced(
        &mut stream,
        args.rate,
        || !stop.get(),
        |_, out| {
            out.extend_from_slice(&message);
        },
    )
    .await
}

/// Reads deliveries (`<epoch>:<offset>\n...`) and a resume's outcome
/// (`recovered:<bool>`, timed from `dropped`) until `stop`.
async fn read(
    mut stream: wire::Stream,
    mut buf: BytesMut,
    seen: &Shared,
    stop: &Cell<bool>,
    dropped: Option<Instant>,
) -> io::Result<()> {
    let mut reader = FrameReader::default();
    let mut text = Vec::new();
    while !stop.get() {
        while let Some(frame) = reader
            .next_with_payload(&mut buf, &mut text)
            .map_err(io::Error::other)?
        {
            if frame.opcode != wire::TEXT {
                continue;
            }
            let text = std::str::from_utf8(&text).map_err(io::Error::other)?;
            if let Some(outcome) = text.strip_prefix("recovered:") {
                let mut seen = seen.borrow_mut();
                match dropped {
                    Some(dropped) if seen.resumed.is_none() => {
                        seen.resumed = Some((dropped.elapsed(), outcome == "true"));
                    }
                    _ => seen.told += 1,
                }
                continue;
            }
            let position = text.split('\n').next().unwrap_or("");
            let (epoch, offset) = position
                .split_once(':')
                .and_then(|(e, o)| Some((e, o.parse::<u64>().ok()?)))
                .ok_or_else(|| io::Error::other("a delivery without its position"))?;
            seen.borrow_mut().deliver(epoch, offset);
        }
        buf.reserve(4096);
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::other("the server closed a subscriber"));
        }
    }
    Ok(())
}
