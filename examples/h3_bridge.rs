//! Carries WebSockets from TCP to HTTP/3: each client that upgrades over
//! HTTP/1.1 here gets its WebSocket opened on an HTTP/3 server with an
//! extended CONNECT (RFC 9220, through `rapidws::h3::Client`), and its
//! frames carried both ways as they are.
//!
//! ```text
//! cargo run --release --example h3_bridge -- --listen 127.0.0.1:9444 \
//!     --server 127.0.0.1:9443 --ca PEM [--server-name localhost]
//! ```
//! For clients that speak no HTTP/3: the Autobahn TestSuite runs over
//! HTTP/3 this way (`autobahn/run.sh h3`). The request's path and its
//! `Sec-WebSocket-Protocol`, `-Extensions` and `Origin` go to the server;
//! the client gets a `101` with the key it sent and what the server chose,
//! or the server's status if it refused. One QUIC connection per
//! WebSocket, closed when the WebSocket ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rapidws::h3::quinn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[allow(dead_code)]
mod support;

use support::bridge;

#[derive(Parser, Debug)]
#[command(about = "WebSockets from TCP (HTTP/1.1) to an HTTP/3 server (RFC 9220)")]
struct Args {
    /// Where clients connect (TCP): IP:PORT or HOST:PORT.
    #[arg(long, value_parser = support::socket_addr)]
    listen: SocketAddr,
    /// The HTTP/3 server (UDP): IP:PORT or HOST:PORT.
    #[arg(long, value_parser = support::socket_addr)]
    server: SocketAddr,
    /// The certificates (PEM) to trust: a private CA the server's chain
    /// leads to, or the server's own certificate (self-signed, even one
    /// made CA:TRUE). `--cafile` is the same.
    #[arg(long, value_name = "PEM", alias = "cafile")]
    ca: PathBuf,
    /// The name the server's certificate must carry (and `:authority`'s host).
    #[arg(long, default_value = "localhost")]
    server_name: String,
}

type Error = support::BoxError;

fn main() -> ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), Error> {
    let endpoint = client_endpoint(&args.ca)?;
    tracing::info!(
        "h3_bridge on {} to https://{} over HTTP/3",
        args.listen,
        args.server
    );
    let args = Arc::new(args);
    bridge::accept_each(args.listen, |client| {
        let (endpoint, args) = (endpoint.clone(), args.clone());
        async move { carry(client, &endpoint, &args).await }
    })
    .await
}

/// A QUIC client endpoint trusting `ca` as the other examples trust
/// `--cafile` (roots, and each certificate pinned whatever its CA flag:
/// `support::client_tls`), speaking `h3`.
fn client_endpoint(ca: &std::path::Path) -> Result<quinn::Endpoint, Error> {
    let mut tls = (*support::client_tls(Some(ca), "--ca")?).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    Ok(endpoint)
}

async fn carry(
    mut client: TcpStream,
    endpoint: &quinn::Endpoint,
    args: &Args,
) -> Result<(), Error> {
    let upgrade = bridge::read_upgrade(&mut client).await?;
    // The version is the client library's own to add.
    let fields: Vec<(&str, &[u8])> = upgrade
        .fields()
        .into_iter()
        .filter(|(name, _)| *name != "sec-websocket-version")
        .collect();

    let conn = endpoint.connect(args.server, &args.server_name)?.await?;
    let h3 = rapidws::h3::Client::new(conn.clone()).await?;
    let authority = format!("{}:{}", args.server_name, args.server.port());
    let (response, stream) = h3
        .open_websocket(&authority, &upgrade.path, &fields)
        .await?;
    if response.status() != 200 {
        // The server's reason, its body's first line.
        let mut body = Vec::new();
        let _ = stream.take(1024).read_to_end(&mut body).await;
        let reason = String::from_utf8_lossy(&body);
        let answer = bridge::refusal(response.status(), reason.lines().next().unwrap_or(""));
        client.write_all(answer.as_bytes()).await?;
        conn.close(0x100u32.into(), b"");
        return Ok(());
    }
    let answer = bridge::switching(
        &upgrade.key,
        response.field("sec-websocket-protocol"),
        response.field("sec-websocket-extensions"),
    );
    client.write_all(answer.as_bytes()).await?;

    let carried = bridge::carry(client, stream).await;
    drop(h3);
    conn.close(0x100u32.into(), b"");
    carried?;
    Ok(())
}
