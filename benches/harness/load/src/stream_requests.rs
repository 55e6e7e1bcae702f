//! What `stream` and `stream --mux` share: their arguments, and the
//! requests' bookkeeping (sending one every interval, matching each reply
//! to its request, waiting for the last ones and giving the result).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::MissedTickBehavior;

use crate::stats::SharedStats;
use crate::{Phase, SharedPhase, TargetArgs, Window, emit};

/// How long replies may come after the last request before the ones
/// missing count as lost.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

#[derive(Args, Debug, Clone)]
pub struct StreamArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// `--warmup`: pushes run this long before the first request;
    /// `--duration` is not used (the run lasts `--requests` intervals).
    #[command(flatten)]
    pub window: Window,
    /// Connections.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Microseconds between requests on each connection.
    #[arg(long, default_value_t = 10_000)]
    pub interval_us: u64,
    /// Request payload bytes (text): its number, padded.
    #[arg(long, default_value_t = 36)]
    pub size: usize,
    /// Requests per connection.
    #[arg(long, default_value_t = 1000)]
    pub requests: u64,
    /// Writes every reply (`reply <sent_s> <rtt_us>`) and every read
    /// (`read <at_s> <bytes>`) to this file, times in seconds from the
    /// first request: to tell one stall from many slow replies, and a
    /// server that stopped reading from a client that read slowly.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Pushes and requests as two streams of one smux session over the
    /// WebSocket, against `mux_echo --push-size B` at `--path /mux`: the
    /// client opens the request stream, the server opens the push stream;
    /// requests are `--size` bytes each, echoed back whole. See
    /// `stream_mux.rs`.
    #[arg(long)]
    pub mux: bool,
    /// With `--mux`: the harness's own frames (`raw`) or rapidws's client.
    #[arg(long, value_enum, default_value_t = MuxClient::Raw)]
    pub mux_client: MuxClient,
    /// With `--mux`: the smux version (2 has per-stream windows).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mux_version: u8,
    /// With `--mux`: the server's push size, to count pushes from bytes
    /// (a stream carries bytes, not messages).
    #[arg(long, default_value_t = 1 << 20)]
    pub push_size: u64,
    /// With `--mux`: the receive window each of our streams announces
    /// (version 2), default rapidws's (256 KiB).
    #[arg(long, default_value_t = rapidws::mux::INITIAL_WINDOW)]
    pub mux_window: u32,
}

/// Which client `stream --mux` runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MuxClient {
    /// The harness's own frames (the server's figure).
    Raw,
    /// rapidws's client and `rapidws::mux`.
    Library,
}

/// Requests sent and not answered yet, by number.
pub(crate) type Pending = RefCell<HashMap<u64, Instant>>;

/// Warms up, then starts the measured window: the time it started.
pub(crate) async fn start_requests(args: &StreamArgs, phase: &SharedPhase) -> Instant {
    tokio::time::sleep(Duration::from_secs_f64(args.window.warmup)).await;
    phase.set(Phase::Measure);
    emit(&json!({ "event": "measure" }));
    Instant::now()
}

/// The request with number `n`: its number, zero-padded to `--size` bytes
/// (at least 20).
pub(crate) fn request(args: &StreamArgs, n: u64) -> String {
    format!("{n:0>size$}", size = args.size.max(20))
}

/// Sends `--requests` requests on each connection, one per
/// `--interval-us`, each as `encode` makes it of its text; gives back
/// the connections' write sides (the run ends before they close), and
/// counts a connection whose write failed as an error.
pub(crate) async fn send_all<W: AsyncWrite + Unpin + 'static>(
    connections: Vec<(W, Rc<Pending>)>,
    args: &StreamArgs,
    stats: &SharedStats,
    encode: fn(&[u8]) -> Vec<u8>,
) -> Vec<W> {
    let every = Duration::from_micros(args.interval_us.max(1));
    let senders: Vec<_> = connections
        .into_iter()
        .map(|(mut write, pending)| {
            let args = args.clone();
            tokio::task::spawn_local(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
                for n in 0..args.requests {
                    ticks.tick().await;
                    let bytes = encode(request(&args, n).as_bytes());
                    pending.borrow_mut().insert(n, Instant::now());
                    write.write_all(&bytes).await?;
                    // TLS keeps a record until flushed.
                    write.flush().await?;
                }
                Ok::<_, io::Error>(write)
            })
        })
        .collect();
    let mut writers = Vec::new();
    for sender in senders {
        match sender.await.expect("sender task") {
            Ok(write) => writers.push(write),
            Err(error) => stats.borrow_mut().error(error),
        }
    }
    writers
}

/// The request a reply answers (its text is the request's number), taken
/// off `pending`: when it was sent.
pub(crate) fn answered(pending: &Pending, reply: &[u8]) -> io::Result<Instant> {
    let number = std::str::from_utf8(reply)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| io::Error::other("a reply that is no request's"))?;
    let sent_at = pending.borrow_mut().remove(&number);
    sent_at.ok_or_else(|| io::Error::other("an unsolicited reply"))
}

/// Waits (at most [`GRACE`]) for the replies still owed, ends the run and
/// gives its result: `pushes` pushes and `push_bytes` bytes in `secs`.
pub(crate) async fn finish(
    args: &StreamArgs,
    stats: &SharedStats,
    phase: &SharedPhase,
    secs: f64,
    mode: &str,
    pushes: f64,
    push_bytes: u64,
) -> serde_json::Value {
    let requests = args.requests * args.conns as u64;
    let deadline = Instant::now() + GRACE;
    while stats.borrow().completed < requests && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    phase.set(Phase::Stop);
    let mut result = stats.borrow().summary(secs);
    let answered = stats.borrow().completed;
    result["mode"] = json!(mode);
    result["conns"] = json!(args.conns);
    result["requests"] = json!(requests);
    result["missing"] = json!(requests - answered.min(requests));
    result["pushes_per_sec"] = json!(pushes / secs);
    result["push_mb_per_sec"] = json!(push_bytes as f64 / secs / 1e6);
    result
}
