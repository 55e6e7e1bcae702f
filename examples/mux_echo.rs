//! Many streams on one connection: an smux echo server.
//!
//! `/mux` takes a WebSocket whose binary messages carry a mux (smux)
//! (xtaci/smux's protocol, the version the peer speaks); with `--tcp-addr`,
//! plain smux over TCP as well. Every stream the peer opens is echoed until
//! the peer closes it; with `--open N` the server also opens N streams to
//! each peer and echoes on them (so a peer can test accepting).
//!
//! ```text
//! cargo run --release --example mux_echo -- --addr 127.0.0.1:9006 --tcp-addr 127.0.0.1:9010
//! ```
//!
//! Every mux, over TCP and over `/mux`, shares one byte budget
//! (`--budget`, default the library's 256 MiB): what all of them hold,
//! received and unread or written and unsent. Past seven eighths of it new
//! streams are refused; past all of it the mux holding the most is
//! shed (logged with its reason, counted in `/metrics` with `--metrics`).
//!
//! With `--push-size BYTES` the server also opens one stream to each peer
//! and writes `BYTES` on it every `--push-every-us` microseconds (at the
//! reader's pace: a write waits while the stream's send buffer is full),
//! and the streams the peer opens are echoed at a higher priority, so a
//! reply goes out ahead of the pushes: the load harness's Stream Benchmark
//! with pushes and requests as two streams of one mux (`rapidws-load
//! stream --mux`).
//!
//! With `--on-server-loop` (io_uring), each `/mux` mux runs on the reactor
//! serving its WebSocket, its streams' tasks beside it
//! (`rapidws::socket::spawn`): no message crosses a thread.

mod support;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rapidws::Reject;
use rapidws::mux::{Budget, Config, Mux, Side, Stream, Version};
use rapidws::socket::{SocketHandler, spawn};
use tokio::io::AsyncWriteExt;

#[derive(Parser, Debug)]
#[command(about = "smux echo over WebSockets at /mux (and over TCP with --tcp-addr)")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// Also serve plain smux over TCP on this address.
    #[arg(long, value_name = "ADDR", value_parser = support::socket_addr)]
    tcp_addr: Option<SocketAddr>,
    /// Open this many streams to each peer too, and echo on them (they go
    /// out once the peer has sent its first frame, which sets the version).
    #[arg(long, value_name = "N", default_value_t = 0)]
    open: usize,
    /// Speak only this smux version (1 or 2); default: the peer's.
    #[arg(long)]
    version: Option<Version>,
    /// The most streams open at once per mux; a SYN past it gets a FIN.
    #[arg(long, value_name = "N", default_value_t = Config::default().max_streams)]
    max_streams: usize,
    /// Push this many bytes every `--push-every-us` on a stream the server
    /// opens to each peer; 0 (the default): no pushes.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    push_size: usize,
    /// Microseconds between pushes.
    #[arg(long, value_name = "US", default_value_t = 500)]
    push_every_us: u64,
    /// What every mux together may hold, in bytes (received and
    /// unread, written and unsent); default: the library's process-wide
    /// budget (256 MiB).
    #[arg(long, value_name = "BYTES")]
    budget: Option<usize>,
    /// A mux whose peer is silent, or takes none of what waits for
    /// it, this many seconds is ended (NOPs go every third of it);
    /// default: the library's 30.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    keepalive_secs: Option<u64>,
    /// On io_uring, run each `/mux` mux and its streams' tasks on the
    /// reactor that serves its WebSocket (`SocketHandler::on_server_loop`),
    /// so its messages cross no thread; on tokio this changes nothing.
    #[arg(long)]
    on_server_loop: bool,
}

/// What the server does on each mux besides echoing.
#[derive(Clone)]
struct Plan {
    /// Streams to open and echo on.
    open: usize,
    /// One payload shared by every push; empty: no pushes.
    push: rapidws::Bytes,
    push_every: Duration,
}

fn main() -> ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9006");
    // One budget for every mux, TCP and /mux: the configuration's
    // clones share it.
    let config = Config {
        version: args.version,
        max_streams: args.max_streams,
        budget: args
            .budget
            .map_or_else(rapidws::mux::default_budget, Budget::new),
        ..Config::default()
    };
    let config = match args.keepalive_secs.map(Duration::from_secs) {
        Some(timeout) => Config {
            keepalive_interval: Some(timeout / 3),
            keepalive_timeout: Some(timeout),
            ..config
        },
        None => config,
    };
    // Bound here, so a taken port is an error before anything runs.
    let tcp = match args.tcp_addr.map(std::net::TcpListener::bind).transpose() {
        Ok(tcp) => tcp,
        Err(error) => {
            eprintln!("error: cannot listen on --tcp-addr: {error}");
            return ExitCode::from(2);
        }
    };
    let plan = Plan {
        open: args.open,
        push: rapidws::Bytes::from(vec![0x5a; args.push_size]),
        push_every: Duration::from_micros(args.push_every_us.max(1)),
    };
    let on_server_loop = args.on_server_loop;
    support::serve("mux_echo", &args.serve, move |runtime| {
        if let Some(listener) = tcp {
            runtime.spawn(serve_tcp(listener, config.clone(), plan.clone()));
        }
        tracing::info!(bytes = config.budget.limit(), "the mux budget of every mux");
        let handler = SocketHandler::with_upgrade(
            |request, _| match request.path() {
                "/mux" => Ok(()),
                path => Err(Reject::new(
                    404,
                    format!("no endpoint at {path}: smux over WebSockets is at /mux"),
                )),
            },
            move |socket, ()| {
                let (config, plan) = (config.clone(), plan.clone());
                // Inside the future, which runs on the server loop (or the
                // runtime): the mux's driver and its streams' tasks are
                // spawned beside it (io_uring's callbacks are not).
                async move {
                    let mux = Mux::over_websocket(socket, Side::Acceptor, config);
                    serve_mux(mux, plan).await
                }
            },
        )
        .on_http(|request| support::metrics_page(request.method(), request.path()))
        .runtime(runtime);
        if on_server_loop {
            handler.on_server_loop()
        } else {
            handler
        }
    })
}

async fn serve_tcp(listener: std::net::TcpListener, config: Config, plan: Plan) {
    let listener = listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener));
    let listener = match listener {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "cannot serve --tcp-addr");
            return;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "mux_echo serving smux over TCP");
    }
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                let _ = tcp.set_nodelay(true);
                let mux = Mux::new(tcp, Side::Acceptor, config.clone());
                tokio::spawn(serve_mux(mux, plan.clone()));
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Echoes every stream of one mux until it ends; its tasks go beside it
/// (on the reactor, over a WebSocket on io_uring; else on the runtime).
async fn serve_mux(mux: Mux, plan: Plan) {
    for _ in 0..plan.open {
        match mux.open_stream().await {
            Ok(stream) => spawn(echo(stream)),
            Err(error) => {
                tracing::warn!(%error, "cannot open a stream to the peer");
                break;
            }
        }
    }
    let pushing = !plan.push.is_empty();
    if pushing {
        match mux.open_stream().await {
            Ok(stream) => spawn(push(stream, plan.push.clone(), plan.push_every)),
            Err(error) => tracing::warn!(%error, "cannot open the push stream"),
        }
    }
    while let Some(stream) = mux.accept_stream().await {
        if pushing {
            // Replies before pushes.
            stream.set_priority(1);
        }
        spawn(echo(stream));
    }
    match mux.closed().await {
        Ok(()) => tracing::debug!(stats = ?mux.stats(), "mux session ended"),
        Err(error) => tracing::info!(%error, stats = ?mux.stats(), "mux session failed"),
    }
}

/// Writes `payload` every `every` until the stream or mux ends; a
/// write waits while the stream's send buffer is full, and ticks missed
/// meanwhile are caught up (tokio's default), as `examples/stream` does.
async fn push(mut stream: Stream, payload: rapidws::Bytes, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        if let Err(error) = stream.write_all(&payload).await {
            tracing::debug!(id = stream.id(), %error, "pushes stopped");
            return;
        }
    }
}

/// Writes back what the stream reads until the peer's FIN, then sends ours.
/// The bytes read are the bytes written: nothing is copied.
async fn echo(mut stream: Stream) {
    let id = stream.id();
    let echoed = async {
        while let Some(bytes) = stream.read_bytes(64 * 1024).await? {
            stream.write_bytes(bytes).await?;
        }
        stream.shutdown().await
    };
    if let Err(error) = echoed.await {
        tracing::debug!(id, %error, "stream ended early");
    }
}
