//! One port, every protocol: downloads, a WebSocket echo, gRPC's health
//! service and an smux echo, plain and over TLS, on one listening port,
//! each connection routed by its first bytes (`rapidws::route`).
//!
//! ```text
//! cargo run --release --example one_port -- --addr 127.0.0.1:12345 \
//!     --tls-cert cert.pem --tls-key key.pem --files ./public
//! ```
//!
//! - Plain HTTP/1.1: `GET /files/NAME` downloads `DIR/NAME`, `GET /whoami`
//!   answers the client's address as the server sees it (`IP:PORT`), and
//!   `GET /ws` is a WebSocket echo (text and binary).
//! - TLS: terminated here, then by the protocol agreed in ALPN: `h2` is
//!   gRPC with the standard health service, tonic's (tonic-health, served
//!   on the connection by hyper's HTTP/2: `grpc.health.v1.Health/Check`
//!   answers SERVING for the service ""), `smux` an smux session echoing
//!   every stream the client opens, `http/1.1` or none the routes of plain
//!   HTTP (wss at `/ws`). The server prefers `smux`, then `http/1.1`, then
//!   `h2`: a browser or curl offering both HTTP versions gets HTTP/1.1, a
//!   gRPC client (which offers only `h2`) gets gRPC.
//! - Plain smux (the first bytes a SYN, versions 1 and 2): the same echo.
//! - `--proxy-protocol`: every connection starts with a PROXY protocol
//!   header (version 1 or 2, as HAProxy's `send-proxy-v2` sends it);
//!   `/whoami` answers the address it names; a connection without one is
//!   closed.

#[path = "support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use rapidws::mux::{Config as MuxConfig, Mux, Side};
use rapidws::route::{Matcher, Routed, Router};
use rapidws::{
    Accept, Config, Conn, Handler, HttpResponse, Message, ProxyProtocol, Reject, Request,
    ServerHandler,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
#[command(about = "HTTP, WebSockets, gRPC health and smux, plain and over TLS, on one port")]
struct Args {
    /// The one address to listen on.
    #[arg(long, value_parser = support::socket_addr, default_value = "127.0.0.1:12345")]
    addr: SocketAddr,
    /// The certificate chain (PEM) for TLS on the same port.
    #[arg(long)]
    tls_cert: PathBuf,
    /// Its private key (PEM).
    #[arg(long)]
    tls_key: PathBuf,
    /// The folder `GET /files/NAME` serves.
    #[arg(long)]
    files: PathBuf,
    /// Every connection starts with a PROXY protocol header (v1 or v2).
    #[arg(long)]
    proxy_protocol: bool,
}

fn main() -> std::process::ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), String> {
    let mut tls = (*support::tls_server_config(&args.tls_cert, &args.tls_key)?).clone();
    tls.alpn_protocols = vec![b"smux".to_vec(), b"http/1.1".to_vec(), b"h2".to_vec()];
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let files = std::fs::canonicalize(&args.files)
        .map_err(|error| format!("cannot use --files {}: {error}", args.files.display()))?;
    let web = Arc::new(rapidws::stream::Server::new(
        Web { files },
        Config::default(),
    ));
    let (plain_web, tls_web) = (web.clone(), web);
    let mut router = Router::new()
        .route_to(Matcher::http1(), move |routed: Routed<TcpStream>| {
            // The stream driver takes the bytes read so far as its prefix.
            let (prefix, tcp) = routed.stream.into_parts();
            plain_web.serve(tcp, routed.peer, &prefix)
        })
        .route_to(Matcher::smux(), |routed: Routed<TcpStream>| {
            echo_streams(routed.stream)
        })
        .route_to(Matcher::tls(), move |routed: Routed<TcpStream>| {
            let (tls, web) = (tls.clone(), tls_web.clone());
            async move {
                let peer = routed.peer;
                let stream = match tls.accept(routed.stream).await {
                    Ok(stream) => stream,
                    Err(error) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                };
                let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                match alpn.as_deref() {
                    Some(b"h2") => grpc_health(stream).await,
                    Some(b"smux") => echo_streams(stream).await,
                    _ => web.serve(stream, peer, &[]).await,
                }
            }
        });
    if args.proxy_protocol {
        router = router.proxy_protocol(ProxyProtocol::required());
    }
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.addr))?;
    tracing::info!(addr = %args.addr, proxy_protocol = args.proxy_protocol, "one_port listening");
    router
        .serve(listener)
        .await
        .map_err(|error| format!("serving: {error}"))
}

/// Plain HTTP's routes (and the same over TLS): downloads, who am I, and
/// the WebSocket echo at `/ws`.
struct Web {
    files: PathBuf,
}

impl Handler for Web {
    type State = ();

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for Web {
    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        match request.path() {
            "/ws" => Ok(()),
            _ => Err(Reject::not_found("the WebSocket echo is at /ws")),
        }
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        if request.method() != "GET" {
            return Some(HttpResponse::text(405, "GET only\n"));
        }
        let path = request.path();
        if path == "/whoami" {
            let peer = request
                .peer_addr()
                .map_or("unknown".into(), |p| p.to_string());
            return Some(HttpResponse::text(200, peer));
        }
        let Some(name) = path.strip_prefix("/files/") else {
            return Some(HttpResponse::text(
                404,
                "routes: /files/NAME, /whoami, /ws\n",
            ));
        };
        Some(download(&self.files, name))
    }
}

/// `dir/name`, if `name` is a plain file name there (no `/`, no `..`).
fn download(dir: &Path, name: &str) -> HttpResponse {
    let plain = !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..";
    if !plain {
        return HttpResponse::text(404, "no such file\n");
    }
    match std::fs::read(dir.join(name)) {
        Ok(body) => HttpResponse::new(200, "application/octet-stream", body),
        Err(_) => HttpResponse::text(404, "no such file\n"),
    }
}

/// An smux session over `io` that echoes every stream the client opens.
async fn echo_streams<T>(io: T)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // The version the client speaks (1 or 2).
    let config = MuxConfig {
        version: None,
        ..MuxConfig::default()
    };
    let mux = Mux::new(io, Side::Acceptor, config);
    while let Some(stream) = mux.accept_stream().await {
        tokio::spawn(async move {
            let (mut reader, mut writer) = tokio::io::split(stream);
            if tokio::io::copy(&mut reader, &mut writer).await.is_ok() {
                let _ = writer.shutdown().await;
            }
        });
    }
}

/// gRPC over HTTP/2: tonic's standard health service (tonic-health), on
/// this one connection. The server as a whole (the service "") is
/// SERVING; any other service is NOT_FOUND.
async fn grpc_health<T>(io: T)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (_reporter, health) = tonic_health::server::health_reporter();
    let routes = tonic::service::Routes::new(health);
    let service = hyper_util::service::TowerToHyperService::new(routes);
    let builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    let io = hyper_util::rt::TokioIo::new(io);
    if let Err(error) = builder.serve_connection(io, service).await {
        tracing::debug!(%error, "gRPC connection ended");
    }
}
