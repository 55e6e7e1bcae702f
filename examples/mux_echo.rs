//! Many streams on one connection: an smux echo server.
//!
//! `/mux` takes a WebSocket whose binary messages carry an smux session
//! (xtaci/smux's protocol, the version the peer speaks); with `--tcp-addr`,
//! plain smux over TCP as well. Every stream the peer opens is echoed until
//! the peer closes it; with `--open N` the server also opens N streams to
//! each peer and echoes on them (so a peer can test accepting).
//!
//! ```text
//! cargo run --release --example mux_echo -- --addr 127.0.0.1:9005 --tcp-addr 127.0.0.1:9006
//! ```

mod support;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use rapidws::Reject;
use rapidws::mux::{Config, Mux, Side, Stream, Version};
use rapidws::socket::SocketHandler;
use tokio::io::AsyncWriteExt;

#[derive(Parser, Debug)]
#[command(about = "smux echo over WebSockets at /mux (and over TCP with --tcp-addr)")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// Also serve plain smux over TCP on this address.
    #[arg(long, value_name = "ADDR")]
    tcp_addr: Option<SocketAddr>,
    /// Open this many streams to each peer too, and echo on them (they go
    /// out once the peer has sent its first frame, which sets the version).
    #[arg(long, value_name = "N", default_value_t = 0)]
    open: usize,
    /// Speak only this smux version (1 or 2); default: the peer's.
    #[arg(long)]
    version: Option<Version>,
    /// The most streams open at once per session; a SYN past it gets a FIN.
    #[arg(long, value_name = "N", default_value_t = Config::default().max_streams)]
    max_streams: usize,
}

fn main() -> ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9005");
    let config = Config {
        version: args.version,
        max_streams: args.max_streams,
        ..Config::default()
    };
    // Bound here, so a taken port is an error before anything runs.
    let tcp = match args.tcp_addr.map(std::net::TcpListener::bind).transpose() {
        Ok(tcp) => tcp,
        Err(error) => {
            eprintln!("error: cannot listen on --tcp-addr: {error}");
            return ExitCode::from(2);
        }
    };
    let open = args.open;
    support::serve("mux_echo", &args.serve, move |runtime| {
        if let Some(listener) = tcp {
            runtime.spawn(serve_tcp(listener, config.clone(), open));
        }
        SocketHandler::with_upgrade(
            |request, _| match request.path() {
                "/mux" => Ok(()),
                path => Err(Reject::new(
                    404,
                    format!("no endpoint at {path}: smux over WebSockets is at /mux"),
                )),
            },
            move |socket, ()| {
                let config = config.clone();
                // Inside the future: it runs on the runtime, where the
                // session's driver is spawned (io_uring's callbacks are not).
                async move {
                    let mux = Mux::over_websocket(socket, Side::Acceptor, config);
                    serve_session(mux, open).await
                }
            },
        )
        .runtime(runtime)
    })
}

async fn serve_tcp(listener: std::net::TcpListener, config: Config, open: usize) {
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
                tokio::spawn(serve_session(mux, open));
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Echoes every stream of one session until it ends.
async fn serve_session(mux: Mux, open: usize) {
    for _ in 0..open {
        match mux.open_stream().await {
            Ok(stream) => {
                tokio::spawn(echo(stream));
            }
            Err(error) => {
                tracing::warn!(%error, "cannot open a stream to the peer");
                break;
            }
        }
    }
    while let Some(stream) = mux.accept_stream().await {
        tokio::spawn(echo(stream));
    }
    match mux.closed().await {
        Ok(()) => tracing::debug!(stats = ?mux.stats(), "mux session ended"),
        Err(error) => tracing::info!(%error, stats = ?mux.stats(), "mux session failed"),
    }
}

/// Writes back what the stream reads until the peer's FIN, then sends ours.
async fn echo(stream: Stream) {
    let id = stream.id();
    let (mut reader, mut writer) = tokio::io::split(stream);
    match tokio::io::copy(&mut reader, &mut writer).await {
        Ok(_) => {
            let _ = writer.shutdown().await;
        }
        Err(error) => tracing::debug!(id, %error, "stream ended early"),
    }
}
