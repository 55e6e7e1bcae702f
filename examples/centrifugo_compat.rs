//! A server Centrifugo's client SDKs connect to unchanged: its client
//! protocol v2 at `/connection/websocket` (JSON, or Protobuf with the
//! `centrifuge-protobuf` subprotocol) on rapidws's pub/sub
//! (`rapidws::centrifuge`). Anonymous clients subscribe to any channel;
//! with `--history N` channels keep their last N publications for
//! `--history-secs`, and a client that comes back recovers what it missed
//! (or is told it did not).
//!
//! ```text
//! cargo run --example centrifugo_compat -- --addr 127.0.0.1:8000 --history 100 --history-secs 300
//! ```
//!
//! With `--join-leave`, subscribers that ask (`joinLeave` in the SDKs) are
//! told who subscribes and leaves. With `--presence`, subscribers may ask
//! who is subscribed to their channels (`presence`, `presence_stats`).
//!
//! With `--redis URL`, publications (and history) go between the nodes
//! that share the Redis, a client recovers on any of them, and presence
//! counts every node's clients. With `--jwt-secret S`, clients connect with a
//! token (HS256) and refresh it before it expires; a subscription may
//! carry a token too (its `sub` the user's, its `channel` the channel, its
//! `exp` refreshed with sub_refresh, its `info` the channel info). With `--api-key K`, the server HTTP API
//! (`POST /api/publish`, `broadcast`, `history`, and with `--presence`
//! `presence`, `presence_stats`) answers requests with
//! `X-API-Key: K`. One RPC method is served: `echo` answers with the data
//! it was given; any other method is answered with 104 (method not found).

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rapidws::centrifuge::{
    Application, Centrifuge, ClientContext, Error, JOIN_LEAVE_PREFIX, Options, disconnect, error,
};
use rapidws::pubsub::redis::Bridge;
use rapidws::pubsub::{History, Overflow, PubSub};
use rapidws::{Bytes, CloseCode};

#[derive(Parser, Debug)]
#[command(about = "Centrifugo's client protocol v2 on rapidws's pub/sub")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// Keep each channel's last N publications for recovery and history
    /// (0: none, channels are not recoverable).
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// How long kept publications last, in seconds.
    #[arg(long, default_value_t = 300)]
    history_secs: u64,
    /// Seconds between the server's pings (the connect reply's `ping`).
    #[arg(long, default_value_t = 25)]
    ping_secs: u64,
    /// How long a connection whose token expired may wait for its
    /// refresh before it is closed with 3005.
    #[arg(long, default_value_t = 25)]
    expired_grace_secs: u64,
    /// How long a subscription whose token expired may wait for its
    /// sub_refresh before the server unsubscribes it (2501).
    #[arg(long, default_value_t = 25)]
    expired_sub_grace_secs: u64,
    /// Answer presence and presence_stats (with --redis, every node's
    /// clients).
    #[arg(long)]
    presence: bool,
    /// Push joins and leaves to the subscribers that ask for them.
    #[arg(long)]
    join_leave: bool,
    /// Let clients publish to channels.
    #[arg(long)]
    client_publish: bool,
    /// Serve the server HTTP API (`POST /api/publish`, `broadcast`,
    /// `history`, `presence`, `presence_stats`) to requests with this key
    /// in `X-API-Key`.
    #[arg(long)]
    api_key: Option<String>,
    /// Clients connect with a token (a JWT signed with HS256 and this
    /// secret: `sub` the user, `exp` when it must be refreshed); none may
    /// connect without one.
    #[arg(long)]
    jwt_secret: Option<String>,
    /// Relay publications between nodes through this Redis.
    #[arg(long)]
    redis: Option<String>,
}

/// The application's RPC: `echo` gives back its data, nothing else is
/// known.
struct Echo;

impl Application for Echo {
    fn rpc(&self, _: &ClientContext<'_>, method: &str, data: &[u8]) -> Result<Bytes, Error> {
        match method {
            "echo" => Ok(Bytes::copy_from_slice(data)),
            _ => Err(Error::new(error::METHOD_NOT_FOUND)),
        }
    }
}

fn main() -> std::process::ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:8000");
    let mut builder = PubSub::builder().overflow(Overflow::Close(CloseCode(disconnect::SLOW)));
    if args.history > 0 {
        builder = builder.history(History::new(
            args.history,
            Duration::from_secs(args.history_secs),
        ));
    }
    // Joins and leaves are for who is there now: not kept.
    builder = builder.history_for(JOIN_LEAVE_PREFIX, History::OFF);
    let pubsub = builder.build();
    let mut options = Options::new()
        .ping(Duration::from_secs(args.ping_secs))
        .client_publish(args.client_publish)
        .presence(args.presence)
        .join_leave(args.join_leave)
        .expired_grace(Duration::from_secs(args.expired_grace_secs))
        .expired_sub_grace(Duration::from_secs(args.expired_sub_grace_secs))
        .application(Arc::new(Echo));
    if let Some(key) = &args.api_key {
        options = options.api_key(key);
    }
    if let Some(secret) = &args.jwt_secret {
        options = options.jwt_secret(secret.as_bytes()).anonymous(false);
    }
    let redis = args.redis.clone();
    support::serve("centrifugo_compat", &args.serve, move |_runtime| {
        let bridge = redis.map(|url| {
            Bridge::builder(&url)
                .start(&pubsub)
                .unwrap_or_else(|error| {
                    eprintln!("error: --redis {url}: {error}");
                    std::process::exit(2);
                })
        });
        let centrifuge = Centrifuge::new(pubsub, options);
        match bridge {
            Some(bridge) => centrifuge.bridge(bridge),
            None => centrifuge,
        }
    })
}
