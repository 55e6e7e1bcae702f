//! Carries WebSockets from HTTP/1.1 to HTTP/2: each client that upgrades
//! here gets its WebSocket opened on an HTTP/2 server with an extended
//! CONNECT (RFC 8441, hyper's h2 client, prior knowledge, no TLS), and its
//! frames carried both ways as they are.
//!
//! ```text
//! cargo run --release --example h2_bridge -- --listen 127.0.0.1:9009 \
//!     --server 127.0.0.1:9002
//! ```
//! For clients that speak no HTTP/2: the Autobahn TestSuite runs over
//! HTTP/2 this way (`autobahn/run.sh axum-h2-ws axum-h2-stream`). The
//! request's path and its `Sec-WebSocket-Version`, `-Protocol`,
//! `-Extensions` and `Origin` go to the server; the client gets a `101`
//! with the key it sent and what the server chose, or the server's status
//! if it refused. One HTTP/2 connection per WebSocket.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[allow(dead_code)]
mod support;

use support::bridge;

#[derive(Parser, Debug)]
#[command(about = "WebSockets from HTTP/1.1 to an HTTP/2 server (RFC 8441)")]
struct Args {
    /// Where clients connect, IP:PORT or HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:9009", value_parser = support::socket_addr)]
    listen: SocketAddr,
    /// The HTTP/2 server (prior knowledge, no TLS), IP:PORT or HOST:PORT:
    /// e.g. axum_echo on its default 127.0.0.1:9002.
    #[arg(long, value_parser = support::socket_addr)]
    server: SocketAddr,
}

type Error = support::BoxError;

fn main() -> ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), Error> {
    tracing::info!(
        "h2_bridge on {} to http://{} over HTTP/2",
        args.listen,
        args.server
    );
    let server = args.server;
    bridge::accept_each(args.listen, move |client| carry(client, server)).await
}

async fn carry(mut client: TcpStream, server: SocketAddr) -> Result<(), Error> {
    let upgrade = bridge::read_upgrade(&mut client).await?;
    let mut connect = hyper::Request::builder()
        .method(hyper::Method::CONNECT)
        .uri(format!("http://{server}{}", upgrade.path));
    for (name, value) in upgrade.fields() {
        connect = connect.header(name, value);
    }
    let connect = connect.body(Empty::<Bytes>::new())?;

    let tcp = TcpStream::connect(server).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let mut response = send(&mut sender, connect).await?;
    if response.status() != hyper::StatusCode::OK {
        let reason = response.status().canonical_reason().unwrap_or("");
        let answer = bridge::refusal(response.status().as_u16(), reason);
        client.write_all(answer.as_bytes()).await?;
        return Ok(());
    }
    let field = |name| response.headers().get(name).map(|v| v.as_bytes().to_vec());
    let answer = bridge::switching(
        &upgrade.key,
        field("sec-websocket-protocol").as_deref(),
        field("sec-websocket-extensions").as_deref(),
    );
    let upgraded = hyper::upgrade::on(&mut response).await?;
    client.write_all(answer.as_bytes()).await?;
    // The server may reset its stream (RST_STREAM NO_ERROR, "stop
    // sending") once it has ended it while the client still sends: that
    // fails the way up only.
    bridge::carry(client, TokioIo::new(upgraded)).await?;
    Ok(())
}

/// Sends `request`, retrying while the server's SETTINGS (which allow the
/// extended CONNECT) have not arrived.
async fn send(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    request: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, Error> {
    let (parts, body) = request.into_parts();
    let mut attempts = 0;
    loop {
        let mut request = hyper::Request::from_parts(parts.clone(), body);
        request
            .extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        match sender.send_request(request).await {
            Ok(response) => return Ok(response),
            Err(_) if attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}
