//! A notification bus on one port: browsers subscribe to topics over
//! WebSockets, anyone publishes over HTTP, and each message is framed once
//! for all its subscribers (`rapidws::pubsub`).
//!
//! ```text
//! cargo run --release --example notify_bus -- --addr 127.0.0.1:9004 [--backend tokio|uring] [--deflate] [--redis redis://127.0.0.1:6379] [--history 1000] [--history-secs 300] [--overflow drop|close|conflate]
//! cargo run --release --example notify_bus -- --redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001 [...]
//! NOTIFY_BUS_PUBLISH_TOKEN=$(openssl rand -hex 16) NOTIFY_BUS_JWT_SECRET=$(openssl rand -hex 16) \
//!     cargo run --release --example notify_bus -- [--metrics] [--spread-secs 30]
//! cargo run --release --example notify_bus -- --history 10000 --handoff-socket /tmp/bus.sock
//! cargo run --release --example notify_bus -- --history 10000 --take-over /tmp/bus.sock --handoff-socket /tmp/bus.sock
//! ```
//!
//! The bus itself is `rapidws::bus` (feature `bus`): `GET /ws?topics=a,b`
//! subscribes (`positions=1` for JSON deliveries with positions,
//! `since=<topic>:<epoch>:<offset>` to resume, `latest=a,b` for the last
//! value), `POST /publish/<topic>` and NDJSON `POST /publish` publish,
//! `GET /topics/<topic>` and `GET /stats` tell; the whole contract is in
//! `docs/bus.md`. This example adds the command line, the demo page at
//! `/` (it subscribes with `clients/js`, served at `/rapidws-bus.mjs`) and
//! `--metrics`.
//!
//! `--history N` keeps each topic's last N publications (for at most
//! `--history-secs`) to replay to resuming subscribers; the default, 0,
//! keeps none, and a resume then recovers only a subscriber that missed
//! nothing.
//!
//! Byte budgets for everything clients and publishers can make the bus
//! keep, across all topics and connections (`rapidws::pubsub::Limits`):
//! `--max-history-bytes` (1 GiB: past it the oldest kept publications of
//! any topic go first, and a subscriber resuming from before them is told
//! `recovered: false`), `--max-topic-bytes` (512 MiB: past it a new topic
//! is refused, `error: too many topics...`) and `--max-waiting-bytes`
//! (256 MiB of `--overflow conflate` waits: past it a subscriber misses
//! the publication and is told of the gap). Expired history is let go on
//! time, within a second of its age, publishes or not.
//!
//! With `--redis`, nodes started with the same Redis share their topics: a
//! publish on one reaches the subscribers of all (Redis pub/sub: at most
//! once; a node that cannot reach Redis goes on serving its own
//! subscribers and counts the relays it lost, in `/stats`). With
//! `--history` too, history lives in Redis (a stream per topic): positions
//! are Redis's, the same on every node, so a subscriber resumes on any
//! node, also after its own died; a publish is answered once Redis has
//! numbered it and this node delivered it. A node that cannot reach Redis
//! still delivers its own publishes, in an epoch of its own, and a
//! subscriber that resumes over what Redis missed is told it was not
//! recovered. What comes from Redis gets the node's own limits; with
//! `--redis-secret S` (the same on every node) only messages signed with S
//! are delivered, each once and while fresh, so a party that can write to
//! Redis cannot inject, misattribute or replay one, live or from a
//! stream; it can still withhold or renumber, which subscribers are told
//! of (see `rapidws::pubsub::redis`, "Redis is not trusted", for exactly
//! what is and is not caught; the nodes' clocks must agree within 10 s).
//!
//! A deploy that keeps every connection (Linux, either backend):
//! started with `--handoff-socket PATH`, the bus hands everything to a new
//! process started with the same arguments and `--take-over PATH`, and
//! exits 0: publishing stops there, the topics (numbering and history)
//! go first, then every connection (a publisher's keep-alive connection
//! with it) and each subscriber with its topics, format, token and the
//! position it had been sent up to. The new process replays from
//! history what was published while a subscriber was on its way, so it
//! gets every publication exactly once, in order, and never sees a close;
//! with history too short for that, a `positions=1` subscriber is told
//! `{"topic":"a","recovered":false}` where the gap is.
//!
//! A subscriber that reads too slowly misses messages (they are dropped for
//! it and counted in `/stats`) unless `--overflow close` (or `--close-slow`)
//! asks to close it with 1008 instead, or `--overflow conflate` keeps the
//! latest publication per key waiting for it (`conflated` in `/stats`).
//!
//! Who may come in: with `--publish-token T`, publishing needs
//! `Authorization: Bearer T`; with `--jwt-secret S`, subscribing needs a
//! JWT signed with S (HS256) whose `topics` claim names the topics and
//! whose `exp` says until when, in the `token` query parameter or a text
//! message `token:<jwt>` (`docs/bus.md`, "Who may come in").
//!
//! Each secret (`--publish-token`, `--jwt-secret`, `--redis-secret`) must
//! be at least 16 characters (`openssl rand -hex 16`), and may come from
//! the environment instead (`NOTIFY_BUS_PUBLISH_TOKEN`,
//! `NOTIFY_BUS_JWT_SECRET`, `NOTIFY_BUS_REDIS_SECRET`), where `ps` does not
//! show it; see `secrets.rs`.
//!
//! `--metrics` serves `GET /metrics` (Prometheus text); SIGTERM closes the
//! connections with 1012 spread over `--spread-secs` and exits 0.

use std::time::Duration;

use clap::Parser;
use rapidws::CloseCode;
use rapidws::HttpResponse;
use rapidws::bus::Bus;
use rapidws::pubsub::redis::Bridge;
use rapidws::pubsub::{History, Limits, Overflow, PubSub};

#[path = "../support/mod.rs"]
mod support;

mod secrets;

#[derive(Parser, Debug)]
#[command(about = "A notification bus: topics over WebSockets, publishing over HTTP, one port")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// The largest message, and so the largest body `POST /publish/` takes.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES", value_parser = message_size)]
    max_message_size: usize,
    /// What a subscriber whose queue is full gets: `drop` misses the
    /// message (and, with positions=1, is told of the gap), `close` is
    /// closed with 1008, `conflate` keeps the latest publication per key
    /// (`?key=`) waiting for it and drops keyless ones (told as a gap).
    #[arg(long, value_enum, default_value_t = OverflowArg::Drop)]
    overflow: OverflowArg,
    /// The same as `--overflow close`.
    #[arg(long, conflicts_with = "overflow")]
    close_slow: bool,
    /// Publications each topic keeps to replay to resuming subscribers (0:
    /// none).
    #[arg(long, default_value_t = 0, value_name = "N")]
    history: usize,
    /// The longest a kept publication is kept, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    history_secs: u64,
    /// Share topics with other nodes through this Redis server.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Share topics with other nodes through this Redis Cluster (any of its
    /// nodes, comma-separated): sharded pub/sub, history on each topic's
    /// shard.
    #[arg(
        long,
        value_name = "URL,URL",
        conflicts_with = "redis",
        value_delimiter = ','
    )]
    redis_cluster: Vec<String>,
    /// With --redis or --redis-cluster: a secret every node shares;
    /// messages are signed with it, and only signed ones from Redis are
    /// delivered (see `rapidws::pubsub::redis`). At least 16 characters.
    #[arg(
        long,
        value_name = "SECRET",
        env = "NOTIFY_BUS_REDIS_SECRET",
        hide_env_values = true
    )]
    redis_secret: Option<String>,
    /// `POST /publish...` needs `Authorization: Bearer <T>` (401 without);
    /// so do `/stats`, `/topics/<t>` and `/metrics`, unless `--open-stats`.
    /// At least 16 characters (`openssl rand -hex 16`).
    #[arg(
        long,
        value_name = "T",
        env = "NOTIFY_BUS_PUBLISH_TOKEN",
        hide_env_values = true
    )]
    publish_token: Option<String>,
    /// `/stats`, `/topics/<t>` and `/metrics` answer anyone, even with
    /// tokens on (they show topic names' counts, positions and traffic).
    #[arg(long)]
    open_stats: bool,
    /// What every topic's history may hold in all, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_history_bytes())]
    max_history_bytes: usize,
    /// What the topics themselves may hold in all (names and state), in
    /// bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_topic_bytes())]
    max_topic_bytes: usize,
    /// What may wait for conflating subscribers in all, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_waiting_bytes())]
    max_waiting_bytes: usize,
    /// Subscribers need a JWT signed with this secret (HS256), in the
    /// `token` query parameter or a first message `token:<jwt>`, naming the
    /// topics they may join (claim `topics`) and when it expires (`exp`).
    /// At least 16 characters.
    #[arg(
        long,
        value_name = "S",
        env = "NOTIFY_BUS_JWT_SECRET",
        hide_env_values = true
    )]
    jwt_secret: Option<String>,
}

impl Args {
    /// The secrets as given, for `secrets::check`.
    fn secrets(&self) -> [secrets::Secret<'_>; 3] {
        use secrets::Secret;
        [
            Secret {
                flag: "--redis-secret",
                env: "NOTIFY_BUS_REDIS_SECRET",
                value: self.redis_secret.as_deref(),
            },
            Secret {
                flag: "--publish-token",
                env: "NOTIFY_BUS_PUBLISH_TOKEN",
                value: self.publish_token.as_deref(),
            },
            Secret {
                flag: "--jwt-secret",
                env: "NOTIFY_BUS_JWT_SECRET",
                value: self.jwt_secret.as_deref(),
            },
        ]
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OverflowArg {
    Drop,
    Close,
    Conflate,
}

/// `--max-message-size`: a bus that takes no message is no bus.
fn message_size(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1 byte (the default is 1048576, 1 MiB)".into()),
        Ok(bytes) => Ok(bytes),
        Err(error) => Err(format!("{error}: a size in bytes, at least 1")),
    }
}

/// The demo page at `/`.
const PAGE: &str = include_str!("../assets/notify_bus.html");
/// The JavaScript subscriber the page uses (`clients/js`).
const CLIENT: &str = include_str!("../../clients/js/rapidws-bus.mjs");

/// The pages the bus itself does not serve: the demo page, the
/// JavaScript subscriber it uses, and `/metrics` with `--metrics` (which
/// the bus guards like `/stats`).
fn pages(request: &rapidws::Request<'_>) -> Option<HttpResponse> {
    let (method, path) = (request.method(), request.path());
    if let Some(page) = support::metrics_page(method, path) {
        return Some(page);
    }
    match (method, path) {
        ("GET" | "HEAD", "/") => Some(HttpResponse::html(PAGE)),
        ("GET" | "HEAD", "/rapidws-bus.mjs") => {
            Some(HttpResponse::new(200, "text/javascript", CLIENT))
        }
        _ => None,
    }
}

fn main() -> std::process::ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9004");
    let bridged = args.redis.is_some() || !args.redis_cluster.is_empty();
    if let Err(why) = secrets::check(&args.secrets(), bridged) {
        eprintln!("error: {why}");
        return std::process::ExitCode::from(2);
    }
    let config = args
        .serve
        .config()
        .max_message_size(args.max_message_size)
        .max_frame_size(args.max_message_size)
        .max_http_body_size(args.max_message_size);
    let overflow = match args.overflow {
        _ if args.close_slow => Overflow::Close(CloseCode::POLICY_VIOLATION),
        OverflowArg::Close => Overflow::Close(CloseCode::POLICY_VIOLATION),
        OverflowArg::Drop => Overflow::Drop,
        OverflowArg::Conflate => Overflow::Conflate { close: None },
    };
    if args.serve.metrics {
        // Before the PubSub: it takes its metric handles when built.
        support::install_metrics();
    }
    let history = History::new(args.history, Duration::from_secs(args.history_secs));
    let limits = Limits::new()
        .history_bytes(args.max_history_bytes)
        .topic_bytes(args.max_topic_bytes)
        .waiting_bytes(args.max_waiting_bytes);
    let pubsub = PubSub::builder()
        .overflow(overflow)
        .history(history)
        .limits(limits)
        .build();
    if args.publish_token.is_none() {
        tracing::warn!(
            addr = %args.serve.addr,
            "anyone who reaches this address may publish: set --publish-token"
        );
    }
    let bridge = match (&args.redis, args.redis_cluster.as_slice()) {
        (Some(url), _) => Some((Bridge::builder(url), format!("--redis {url}"))),
        (None, []) => None,
        (None, nodes) => {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let flag = format!("--redis-cluster {}", nodes.join(","));
            Some((Bridge::cluster(&nodes), flag))
        }
    };
    let (secret, max_message_size) = (args.redis_secret.clone(), args.max_message_size);
    let (publish_token, jwt_secret) = (args.publish_token.clone(), args.jwt_secret.clone());
    let open_stats = args.open_stats;
    support::serve_with("notify_bus", &args.serve, config, move |_runtime| {
        let mut bus = Bus::builder(pubsub.clone())
            .open_stats(open_stats)
            .fallback(pages);
        // The bridge runs on a thread of its own.
        if let Some((builder, flag)) = bridge {
            let mut builder = builder.max_message_size(max_message_size);
            if let Some(secret) = &secret {
                builder = builder.secret(secret.as_bytes());
            }
            let bridge = builder.start(&pubsub).unwrap_or_else(|error| {
                eprintln!("error: {flag}: {error}");
                std::process::exit(2);
            });
            bus = bus.bridge(bridge);
        }
        if let Some(token) = publish_token {
            bus = bus.publish_token(token);
        }
        if let Some(secret) = jwt_secret {
            bus = bus.jwt_secret(secret);
        }
        bus.build()
    })
}
