//! `fanout`: pub/sub. Subscribers connect to `<path>?topics=t<k>` (the
//! `i`-th to topic `i % topics`), one publisher connection sends text
//! messages `t<k>\n<payload>` at a fixed total rate, round-robin over the
//! topics, and every fan-out server of the harness publishes `<payload>` to
//! topic `t<k>`. Each payload starts with the time it was sent (16 hex
//! digits of nanoseconds on this process's clock), so each subscriber
//! records the publish-to-delivery latency of every message it reads.
//! The figure is deliveries per second; the result also says how many
//! were expected (publishes sent × subscribers per topic). With `--publish
//! http` and `--protocol centrifuge` the same run meets the bus and
//! Centrifugo (`fanout_http.rs`).

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::fanout_http::{self, HttpPublisher, Protocol, Publish, Read};
use crate::stats::{SharedStats, Stats};
use crate::wire::{self, FrameReader};
use crate::{Phase, SharedPhase, TargetArgs, Window, emit, note_failure};

#[derive(Args, Debug, Clone)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub window: Window,
    /// Subscriber connections.
    #[arg(long, default_value_t = 10_000)]
    pub subscribers: usize,
    /// Topics; subscriber `i` is on topic `i % topics`.
    #[arg(long, default_value_t = 1)]
    pub topics: usize,
    /// Publishes per second, over all topics.
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    /// Payload bytes per message (at least 16: the timestamp).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// What the subscribers speak.
    #[arg(long, value_enum, default_value_t = Protocol::Plain)]
    pub protocol: Protocol,
    /// How publications reach the server.
    #[arg(long, value_enum, default_value_t = Publish::Ws)]
    pub publish: Publish,
    /// With `--publish http`: kept-alive publisher connections.
    #[arg(long, default_value_t = 16)]
    pub publishers: usize,
    /// With `--protocol centrifuge --publish http`: the API key.
    #[arg(long, default_value = "api-key")]
    pub api_key: String,
}

/// The clock every timestamp is on.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

pub async fn run(args: FanoutArgs) -> io::Result<()> {
    if args.size < 16 || args.topics == 0 || args.subscribers < args.topics {
        return Err(io::Error::other(
            "fanout: --size of at least 16, and at least one subscriber per topic",
        ));
    }
    epoch();
    let mut target = args.target.target();
    let base = args.target.path.clone();
    let sources = args.target.sources();
    let mut subscribers = Vec::with_capacity(args.subscribers);
    for i in 0..args.subscribers {
        let topic = i % args.topics;
        target.path = fanout_http::subscribe_path(args.protocol, &base, topic);
        let (mut stream, buf) = wire::open(&target, sources.nth(i)).await?;
        fanout_http::greet(&mut stream, args.protocol, topic).await?;
        subscribers.push((stream, buf));
    }
    target.path = base;

    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    for (stream, buf) in subscribers {
        let (phase, stats) = (phase.clone(), stats.clone());
        let protocol = args.protocol;
        tokio::task::spawn_local(async move {
            let result = subscribe(stream, buf, protocol, &phase, &stats).await;
            note_failure(result, &phase, &stats);
        });
    }
    // Publishes sent (answered, over HTTP) in the measured window.
    let sent = Rc::new(Cell::new(0u64));
    match args.publish {
        Publish::Ws => {
            let (publisher, _) = wire::open(&target, sources.nth(args.subscribers)).await?;
            let (phase, stats, sent) = (phase.clone(), stats.clone(), sent.clone());
            let args = args.clone();
            tokio::task::spawn_local(async move {
                let result = publish(publisher, &args, &phase, &sent).await;
                note_failure(result, &phase, &stats);
            });
        }
        Publish::Http => {
            let publishers = args.publishers.max(1);
            for j in 0..publishers {
                let publisher = HttpPublisher {
                    addr: args.target.addr,
                    protocol: args.protocol,
                    api_key: args.api_key.clone(),
                    topics: args.topics,
                    first: j,
                    stride: publishers,
                    rate: args.rate as f64 / publishers as f64,
                    size: args.size,
                };
                let (phase, stats, sent) = (phase.clone(), stats.clone(), sent.clone());
                tokio::task::spawn_local(async move {
                    let now = || epoch().elapsed().as_nanos() as u64;
                    let result = publisher.run(now, &phase, &sent).await;
                    note_failure(result, &phase, &stats);
                });
            }
        }
    }
    let measured = args.window.run(&phase).await;
    let published = sent.get();
    let per_topic = args.subscribers as f64 / args.topics as f64;
    let mut result = stats.borrow().summary(measured.secs);
    result["mode"] = json!("fanout");
    result["subscribers"] = json!(args.subscribers);
    result["topics"] = json!(args.topics);
    result["rate"] = json!(args.rate);
    result["size"] = json!(args.size);
    result["published"] = json!(published);
    result["published_per_sec"] = json!(published as f64 / measured.secs);
    result["protocol"] = json!(format!("{:?}", args.protocol).to_lowercase());
    result["publish"] = json!(format!("{:?}", args.publish).to_lowercase());
    result["expected_per_sec"] = json!(published as f64 * per_topic / measured.secs);
    result["client_cpu_secs"] = json!(measured.cpu_secs);
    emit(&result);
    Ok(())
}

/// Sends `args.rate` messages a second, in a write per millisecond;
/// counts in `measured` those sent in the measured window.
async fn publish(
    mut stream: wire::Stream,
    args: &FanoutArgs,
    phase: &SharedPhase,
    measured: &Cell<u64>,
) -> io::Result<()> {
    let filler = vec![b'x'; args.size - 16];
    let going = || phase.get() != Phase::Stop;
    wire::paced(&mut stream, args.rate, going, |sent, message| {
        let now = epoch().elapsed().as_nanos() as u64;
        let topic = sent % args.topics as u64;
        message.extend_from_slice(format!("t{topic}\n{now:016x}").as_bytes());
        message.extend_from_slice(&filler);
        if phase.get() == Phase::Measure {
            measured.set(measured.get() + 1);
        }
    })
    .await
}

/// Reads deliveries and records each one's latency from its timestamp
/// (answering Centrifugo's pings).
async fn subscribe(
    mut stream: wire::Stream,
    mut buf: BytesMut,
    protocol: Protocol,
    phase: &SharedPhase,
    stats: &SharedStats,
) -> io::Result<()> {
    let mut reader = FrameReader::default();
    let mut text = Vec::new();
    loop {
        while let Some(seen) = reader
            .next_with_payload(&mut buf, &mut text)
            .map_err(io::Error::other)?
        {
            if seen.opcode != wire::TEXT {
                continue;
            }
            let (sent_at, count) = match fanout_http::read(protocol, &text) {
                Some((Read::Delivery(at), count)) => (at, count),
                Some((Read::Ping, _)) => {
                    fanout_http::pong(&mut stream).await?;
                    continue;
                }
                Some((Read::Other, _)) => continue,
                None => return Err(io::Error::other("a delivery without a timestamp")),
            };
            if phase.get() == Phase::Measure {
                let now = epoch().elapsed().as_nanos() as u64;
                let latency = Duration::from_nanos(now.saturating_sub(sent_at));
                let mut stats = stats.borrow_mut();
                for _ in 0..count {
                    stats.record(latency);
                }
            }
        }
        buf.reserve(4096);
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::other("the server closed a subscriber"));
        }
    }
}
