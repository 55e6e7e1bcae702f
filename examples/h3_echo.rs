//! Echo over HTTP/3 and over TCP on one port number.
//!
//! ```text
//! cargo run --release --example h3_echo -- --addr 127.0.0.1:9443 \
//!     --tls-cert PEM --tls-key PEM [--deflate [--deflate-min-size BYTES]]
//! ```
//! - UDP: HTTP/3 (QUIC). An extended CONNECT with `:protocol` websocket to
//!   `/ws` (RFC 9220) opens a WebSocket that echoes every message; one
//!   with `:protocol` webtransport to `/wt` opens a WebTransport session
//!   that echoes every stream (a bidirectional one on itself, a
//!   unidirectional one on a new stream of its own, at most 1 MiB, read
//!   whole within the stream budget: `--wt-budget` for every connection,
//!   `--wt-connection-budget` for each) and every datagram. A session's
//!   peer may have 100 streams open each way (`--wt-streams`); a stream
//!   it resets or stops gets its own code back.
//! - TCP, TLS: HTTP/1.1 and HTTP/2. `GET /` is the demo page, `/ws` the
//!   same echo (an upgrade, or an HTTP/2 extended CONNECT); every answer
//!   offers HTTP/3 with `Alt-Svc`. `GET /cert-hash` is the SHA-256 of the
//!   certificate, in hex: what a page gives `new WebTransport(url, {
//!   serverCertificateHashes })` to trust a self-signed certificate
//!   valid for at most 14 days (the page's self-test does). With
//!   `--metrics`, `GET /metrics` (the stream budget's among them).
//!
//! One [`Handler`] serves both: the same limits, the same answers to a
//! bad request (400, 426), the same origin check (pages of this server's
//! own origin, and those `--allow-origin` names), the same shutdown. Ctrl-C or SIGTERM stops
//! accepting, closes the WebSockets with 1001 and exits 0 once they are
//! done. Logging follows `RUST_LOG` (default `info`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use clap::Parser;
use rapidws::axum::WebSocketUpgrade;
use rapidws::h3::{ReadToEndError, RequestHead, StreamBudget, WebTransport, WebTransportSession};
use rapidws::{Config, Reject};
use sha2::Digest;

#[allow(dead_code)]
mod support;

use support::echo::Echo;

#[derive(Parser, Debug)]
#[command(about = "rapidws echo over HTTP/3 (RFC 9220) and over TCP on one port")]
struct Args {
    /// Address to listen on, UDP (HTTP/3) and TCP (HTTP/1.1, HTTP/2): IP:PORT
    /// or HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:9443", value_parser = support::socket_addr)]
    addr: SocketAddr,
    /// The certificate chain (PEM): QUIC needs TLS.
    #[arg(long, value_name = "PEM")]
    tls_cert: PathBuf,
    /// The private key for --tls-cert (PEM).
    #[arg(long, value_name = "PEM")]
    tls_key: PathBuf,
    /// Offer permessage-deflate (RFC 7692) with the library's defaults.
    #[arg(long)]
    deflate: bool,
    /// With --deflate: send messages shorter than this uncompressed
    /// (default: the library's, 64 bytes).
    #[arg(long, requires = "deflate", value_name = "BYTES")]
    deflate_min_size: Option<usize>,
    /// What unidirectional streams read whole may hold, every connection
    /// together, in bytes (default: the library's, 256 MiB for the
    /// process). Past it the connection holding the most is closed.
    #[arg(long, value_name = "BYTES")]
    wt_budget: Option<usize>,
    /// What they may hold on one connection, in bytes (default 4 MiB);
    /// past it a stream is stopped with H3_EXCESSIVE_LOAD.
    #[arg(long, value_name = "BYTES")]
    wt_connection_budget: Option<usize>,
    /// Streams a WebTransport session's peer may have open at once, each
    /// way (default: the library's, 100, as Chromium expects).
    #[arg(long, value_name = "N", default_value_t = rapidws::h3::DEFAULT_SESSION_STREAMS)]
    wt_streams: u32,
    /// Serve `GET /metrics` on TCP: rapidws's metrics, Prometheus's text.
    #[arg(long)]
    metrics: bool,
    #[command(flatten)]
    origins: support::OriginArgs,
}

/// The demo page: a socket back to this server's `/ws`.
const PAGE: &str = include_str!("assets/page.html");

/// The longest unidirectional stream echoed (it is read whole first).
const MAX_UNI_ECHO: usize = 1024 * 1024;

/// The application's code a stream is stopped with when it is over
/// [`MAX_UNI_ECHO`].
const TOO_LONG: u32 = 1;

/// WebTransport at `/wt`: every stream and datagram echoed, with its
/// stream budget.
struct WtEcho {
    budget: StreamBudget,
    streams: u32,
}

impl WebTransport for WtEcho {
    fn stream_budget(&self) -> StreamBudget {
        self.budget.clone()
    }

    fn max_streams(&self) -> u32 {
        self.streams
    }

    fn on_request(&self, request: &RequestHead) -> Result<(), Reject> {
        let path = request.path().unwrap_or_default();
        match path.split_once('?').map_or(path, |(path, _)| path) {
            "/wt" => Ok(()),
            path => Err(Reject::new(
                404,
                format!("no WebTransport endpoint at {path}: the echo is at /wt"),
            )),
        }
    }

    async fn serve(&self, session: WebTransportSession) {
        let session = Arc::new(session);
        tracing::debug!(id = session.id(), peer = %session.remote_address(), "WebTransport session");
        let mut streams = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                Some((send, recv)) = session.accept_bi() => {
                    streams.spawn(echo_bi(send, recv));
                }
                Some(recv) = session.accept_uni() => {
                    streams.spawn(echo_uni(session.clone(), recv));
                }
                Some(datagram) = session.read_datagram() => {
                    if let Err(error) = session.send_datagram(&datagram) {
                        tracing::debug!(%error, "datagram not echoed");
                    }
                }
                Some(_) = streams.join_next(), if !streams.is_empty() => {}
                else => break,
            }
        }
        let closed = session.closed().await;
        tracing::info!(
            id = session.id(),
            code = closed.code,
            reason = %closed.reason,
            by_peer = closed.by_peer,
            "WebTransport session closed"
        );
    }
}

/// Echoes a bidirectional stream on itself, chunk by chunk. A reset or a
/// stop from the peer is passed back with the peer's own code, as the
/// draft asks: the application on the other side reads its code back.
async fn echo_bi(
    mut send: rapidws::h3::quinn::SendStream,
    mut recv: rapidws::h3::quinn::RecvStream,
) {
    use rapidws::h3::quinn::{ReadError, WriteError};
    loop {
        tokio::select! {
            read = recv.read_chunk(64 * 1024, true) => match read {
                Ok(Some(chunk)) => match send.write_all(&chunk.bytes).await {
                    Ok(()) => {}
                    Err(WriteError::Stopped(code)) => {
                        let _ = recv.stop(code);
                        return;
                    }
                    Err(_) => return,
                },
                Ok(None) => {
                    let _ = send.finish();
                    return;
                }
                Err(ReadError::Reset(code)) => {
                    let _ = send.reset(code);
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, "stream not echoed");
                    let _ = send.reset(rapidws::h3::error_code(0));
                    return;
                }
            },
            // The peer will not read the echo (quinn leaves the answer to a
            // stop to us): it is reset, and reading stopped, with its code.
            stopped = send.stopped() => {
                if let Ok(Some(code)) = stopped {
                    let _ = send.reset(code);
                    let _ = recv.stop(code);
                }
                return;
            }
        }
    }
}

/// Echoes a unidirectional stream, read whole (within the stream
/// budget: a peer that never finishes its streams holds no more), on a
/// new one.
async fn echo_uni(session: Arc<WebTransportSession>, mut recv: rapidws::h3::quinn::RecvStream) {
    let bytes = match session.read_to_end(&mut recv, MAX_UNI_ECHO).await {
        Ok(bytes) => bytes,
        Err(ReadToEndError::TooLong) => {
            tracing::debug!("stream not echoed: over 1 MiB");
            let _ = recv.stop(rapidws::h3::error_code(TOO_LONG));
            return;
        }
        // Stopped or closed already, or reset by the peer.
        Err(error) => {
            tracing::debug!(%error, "stream not echoed");
            return;
        }
    };
    let Ok(mut send) = session.open_uni().await else {
        return;
    };
    if send.write_all(&bytes).await.is_ok() {
        let _ = send.finish();
    }
}

#[derive(Clone)]
struct App {
    echo: rapidws::stream::Server<Echo>,
    /// `Alt-Svc`'s value: HTTP/3 on the same port.
    alt_svc: Arc<str>,
    /// The certificate's SHA-256, in hex.
    cert_hash: Arc<str>,
}

async fn certificate_hash(State(app): State<App>) -> Response {
    ([("alt-svc", &*app.alt_svc)], app.cert_hash.to_string()).into_response()
}

async fn metrics_page() -> Response {
    match support::metrics_text() {
        Some(text) => ([("content-type", support::METRICS_TYPE)], text).into_response(),
        None => (axum::http::StatusCode::NOT_FOUND, "start with --metrics").into_response(),
    }
}

async fn page(State(app): State<App>) -> Response {
    ([("alt-svc", &*app.alt_svc)], Html(PAGE)).into_response()
}

async fn ws(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    let mut response = upgrade.serve(&app.echo);
    if let Ok(value) = app.alt_svc.parse() {
        response.headers_mut().insert("alt-svc", value);
    }
    response
}

fn main() -> ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), String> {
    if args.metrics {
        support::install_metrics();
    }
    let budget = match (args.wt_budget, args.wt_connection_budget) {
        (None, None) => StreamBudget::default(),
        (total, per_connection) => StreamBudget::new(
            total.unwrap_or(rapidws::h3::DEFAULT_TOTAL),
            per_connection.unwrap_or(rapidws::h3::DEFAULT_PER_CONNECTION),
        ),
    };
    let config = args.origins.apply(Config::default());
    let config = support::with_deflate(config, args.deflate, args.deflate_min_size);
    let tls = support::tls_server_config(&args.tls_cert, &args.tls_key)?;
    let leaf = support::pem_certs(&args.tls_cert)
        .ok()
        .and_then(|chain| chain.into_iter().next())
        .ok_or("--tls-cert holds no certificate")?;
    let cert_hash: String = sha2::Sha256::digest(leaf.as_ref())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let echo = rapidws::stream::Server::new(Echo::at("/ws"), config);

    let mut quic_tls = (*tls).clone();
    quic_tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = rapidws::h3::QuicConfig::default();
    let endpoint = rapidws::h3::endpoint(args.addr, quic_tls, &quic)
        .map_err(|error| format!("cannot listen on UDP {}: {error}", args.addr))?;

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|error| format!("cannot listen on TCP {}: {error}", args.addr))?;
    let mut tcp_tls = (*tls).clone();
    tcp_tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tcp_tls));
    let app = App {
        echo: echo.clone(),
        alt_svc: format!("h3=\":{}\"; ma=86400", args.addr.port()).into(),
        cert_hash: cert_hash.into(),
    };
    let router = Router::new()
        .route("/", get(page))
        .route("/cert-hash", get(certificate_hash))
        .route("/metrics", get(metrics_page))
        // CONNECT too: WebSockets over HTTP/2 (RFC 8441).
        .route("/ws", get(ws).connect(ws))
        .with_state(app);
    tracing::info!(
        "h3_echo on https://{0}/ (TCP: HTTP/1.1, HTTP/2) and UDP {0} (HTTP/3): /ws, /wt",
        args.addr
    );
    let quic_loop = tokio::spawn({
        let echo = echo.clone();
        let streams = args.wt_streams;
        async move { rapidws::h3::serve_with(endpoint, &echo, WtEcho { budget, streams }).await }
    });
    let stop = support::http::serve(listener, Some(acceptor), router).await;
    tracing::info!(?stop, "shutting down");
    echo.shutdown().await;
    let _ = quic_loop.await;
    Ok(())
}
