//! An axum app on one port: a demo page, a health check, and two echo
//! endpoints, one per rapidws API.
//!
//! ```text
//! cargo run --release --example axum_echo -- --addr 127.0.0.1:9002 [--deflate] \
//!     [--tls-cert PEM --tls-key PEM]
//! ```
//! - `GET /`: a page that connects back (to `/ws`, or `?path=/stream`) and
//!   shows the echoes;
//! - `GET /healthz`: `ok`;
//! - `GET /metrics`: with `--metrics`, rapidws's metrics (Prometheus text);
//! - `/ws`: echoes every message through a [`Handler`] (the callback API);
//! - `/stream`: echoes through the async socket (`recv`/`send`).
//!
//! HTTP/1.1 and HTTP/2 (h2 by ALPN over TLS, prior knowledge in plain), and
//! WebSockets over either: an HTTP/2 extended CONNECT (RFC 8441) is upgraded
//! by the same extractor.
//!
//! `--deflate` offers permessage-deflate on both with the library's
//! defaults. With `--tls-cert` and `--tls-key` everything is served over
//! https and wss. Logging follows `RUST_LOG` (default `info`); Ctrl-C stops
//! accepting and closes the WebSocket connections with 1001; SIGTERM stops
//! accepting and closes them with 1012 spread over `--spread-secs` (default 0: at
//! once), and the process exits 0 when they have ended.
//!
//! Hardened as the standalone servers are, which `axum::serve`'s defaults
//! are not: a request's head must come within 10 s (a slowloris client is
//! cut off) and be at most 64 KiB (431), an upgrade's at most the server's
//! handshake limit, 8 KiB (431, from the extractor).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{Html, Response};
use axum::routing::get;
use axum::{Extension, Router};
use clap::Parser;
use rapidws::Config;
use rapidws::axum::{Sockets, WebSocketUpgrade};

// Only some of it is used here.
#[allow(dead_code)]
mod support;

use support::echo::Echo;

#[derive(Parser, Debug)]
#[command(about = "rapidws inside axum: a page, /healthz, /ws and /stream on one port")]
struct Args {
    /// Address to listen on, IP:PORT or HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:9002", value_parser = support::socket_addr)]
    addr: SocketAddr,
    /// Offer permessage-deflate (RFC 7692) on /ws and /stream, with the
    /// library's defaults.
    #[arg(long)]
    deflate: bool,
    /// With --deflate: send messages shorter than this uncompressed
    /// (default: the library's, 64 bytes).
    #[arg(long, requires = "deflate", value_name = "BYTES")]
    deflate_min_size: Option<usize>,
    /// Serve https and wss with this certificate chain (PEM, with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key for --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// On SIGTERM, close the WebSocket connections with 1012 (service
    /// restart) spread evenly over this many seconds; 0 closes them all at
    /// once. The process exits 0 once every connection has ended.
    #[arg(long, alias = "drain-secs", value_name = "S", default_value_t = 0.0, value_parser = support::spread_secs)]
    spread_secs: f64,
    /// Serve `GET /metrics`: rapidws's metrics in the Prometheus text format.
    #[arg(long)]
    metrics: bool,
    #[command(flatten)]
    origins: support::OriginArgs,
}

/// The demo page (the echo example's): a socket back to this server.
const PAGE: &str = include_str!("assets/page.html");

/// What the routes share.
#[derive(Clone)]
struct App {
    /// `/ws`: the callback API.
    echo: Arc<rapidws::stream::Server<Echo>>,
}

async fn ws(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.serve(&app.echo)
}

/// `GET /metrics` with `--metrics` (404 without).
async fn metrics() -> Response {
    use axum::response::IntoResponse;
    match support::metrics_text() {
        Some(text) => ([("content-type", support::METRICS_TYPE)], text).into_response(),
        None => (axum::http::StatusCode::NOT_FOUND, "start with --metrics\n").into_response(),
    }
}

async fn stream(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket| async move {
        while let Some(received) = socket.recv().await {
            let message = match received {
                Ok(message) => message,
                Err(error) => {
                    tracing::debug!(%error, "stream socket failed");
                    break;
                }
            };
            if let Err(error) = socket.send(message).await {
                tracing::debug!(%error, "echo not sent");
                break;
            }
        }
    })
}

fn main() -> ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), String> {
    if args.metrics {
        // Before the servers: they take their metric handles when made.
        support::install_metrics();
    }
    let config = args.origins.apply(Config::default());
    let config = support::with_deflate(config, args.deflate, args.deflate_min_size);
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(support::tls_server_config(cert, key)?),
        _ => None,
    };
    let echo = Arc::new(rapidws::stream::Server::new(
        Echo::anywhere(),
        config.clone(),
    ));
    let sockets = Sockets::new(config);
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        // CONNECT too: WebSockets over HTTP/2 (RFC 8441) are extended CONNECTs.
        .route("/ws", get(ws).connect(ws))
        .route("/stream", get(stream).connect(stream))
        .layer(Extension(sockets.clone()))
        .with_state(App { echo: echo.clone() });
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.addr))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(
        "axum_echo on {scheme}://{}/ (/ws, /stream, /healthz)",
        args.addr
    );
    let tls = tls.map(|mut tls| {
        // HTTP/2 (and WebSockets over it) for clients that offer h2.
        Arc::make_mut(&mut tls).alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(tls)
    });
    let stop = support::http::serve(listener, tls, app).await;
    // The upgraded connections outlive axum's connections: Ctrl-C closes
    // them with 1001 at once, SIGTERM closes them with 1012 spread over the window.
    match stop {
        support::Stop::Interrupt => {
            tracing::info!("shutting down");
            tokio::join!(echo.shutdown(), sockets.shutdown());
        }
        support::Stop::Terminate => {
            let window = Duration::from_secs_f64(args.spread_secs);
            tracing::info!(
                window_secs = args.spread_secs,
                "shutting down, closes spread"
            );
            tokio::join!(
                echo.shutdown_gracefully(window),
                sockets.shutdown_gracefully(window)
            );
        }
    }
    Ok(())
}
