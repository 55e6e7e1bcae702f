//! Runs each WebSocket a client opens over HTTP/1.1 through HTTP/2: it
//! reads the client's upgrade request, opens an HTTP/2 connection to the
//! server (prior knowledge, no TLS), sends an extended CONNECT (RFC 8441)
//! with the request's path and `Sec-WebSocket-*` fields, answers the client
//! `101` with the key it sent and what the server chose (subprotocol,
//! extensions), and then carries the bytes each way, ends included. Any
//! other answer from the server goes back to the client as that status.
//!
//! `h2-bridge LISTEN_ADDR SERVER_ADDR`: for Autobahn over HTTP/2
//! (`autobahn/run.sh axum-h2-ws axum-h2-stream`), since kosoku speaks
//! HTTP/1.1 only. The WebSocket frames are untouched: every case runs
//! end to end against the server, over one h2 stream per connection.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The request fields passed on to the server.
const PASSED: [&str; 3] = [
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
];

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(server)) = (args.next(), args.next()) else {
        eprintln!("usage: h2-bridge LISTEN_ADDR SERVER_ADDR");
        std::process::exit(2);
    };
    let server: SocketAddr = server.parse().expect("SERVER_ADDR");
    let listener = TcpListener::bind(&listen).await.expect("LISTEN_ADDR");
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        tokio::spawn(async move {
            if let Err(error) = bridge(client, server).await {
                eprintln!("h2-bridge: {error}");
            }
        });
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn bridge(mut client: TcpStream, server: SocketAddr) -> Result<(), Error> {
    // The client's request head (nothing follows it before our answer).
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = client.read(&mut chunk).await?;
        if n == 0 || head.len() > 64 * 1024 {
            return Err("no complete request head".into());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut fields);
    request.parse(&head)?;
    let path = request.path.unwrap_or("/").to_owned();
    let field = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.to_vec())
    };
    let key = field("sec-websocket-key").ok_or("no Sec-WebSocket-Key")?;
    let mut connect = hyper::Request::builder()
        .method(hyper::Method::CONNECT)
        .uri(format!("http://{server}{path}"));
    for name in PASSED {
        if let Some(value) = field(name) {
            connect = connect.header(name, value);
        }
    }
    let connect = connect.body(http_body_util::Empty::<bytes::Bytes>::new())?;

    let tcp = TcpStream::connect(server).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let mut response = send(&mut sender, connect).await?;
    let status = response.status();
    if status != hyper::StatusCode::OK {
        let reason = status.canonical_reason().unwrap_or("");
        let answer = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            status.as_u16()
        );
        client.write_all(answer.as_bytes()).await?;
        return Ok(());
    }
    let mut answer = String::from(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    );
    let mut sha = Sha1::new();
    sha.update(&key);
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    answer.push_str(&format!("Sec-WebSocket-Accept: {accept}\r\n"));
    for name in ["sec-websocket-protocol", "sec-websocket-extensions"] {
        if let Some(value) = response.headers().get(name) {
            answer.push_str(&format!("{name}: {}\r\n", value.to_str()?));
        }
    }
    answer.push_str("\r\n");
    let upgraded = hyper::upgrade::on(&mut response).await?;
    client.write_all(answer.as_bytes()).await?;
    let (mut from_server, mut to_server) = tokio::io::split(TokioIo::new(upgraded));
    let (mut from_client, mut to_client) = client.into_split();
    // Each way on its own: the server may reset its stream (RST_STREAM
    // NO_ERROR, "stop sending") once it has ended it, while the client is
    // still sending. That fails the client-to-server copy, and must not
    // drop what the server sent before it.
    let up = async {
        let copied = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
        copied
    };
    let down = async {
        let copied = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
        copied
    };
    // The client-to-server copy's failure is that reset; if anything went
    // wrong before it, the case's report shows it.
    let (_, down) = tokio::join!(up, down);
    down?;
    Ok(())
}

/// Sends `request`, retrying while the server's SETTINGS (which allow the
/// extended CONNECT) have not arrived.
async fn send(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    request: hyper::Request<http_body_util::Empty<bytes::Bytes>>,
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
