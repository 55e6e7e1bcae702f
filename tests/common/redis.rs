//! Redis for the tests: Debian's `redis-server` on a free loopback port
//! (installed if missing), commands in RESP, and notify_bus nodes' HTTP
//! routes and JSON deliveries.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{Child, Client, debian_binary};

/// A `redis-server` on `port`, persisting nothing (a restart loses all),
/// with `extra` arguments, run in `dir` (for files it writes).
pub fn redis_server_with(port: u16, extra: &[&str], dir: Option<&Path>) -> Child {
    let binary = debian_binary("/usr/bin/redis-server", "redis-server");
    let mut command = std::process::Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(std::process::Stdio::null());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    Child(command.spawn().expect("redis-server runs"))
}

/// A `redis-server` on `port`, persisting nothing.
pub fn redis_server(port: u16) -> Child {
    redis_server_with(port, &[], None)
}

pub async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing listens on port {port}");
}

/// `args` as one RESP command.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command to the Redis on `port` and returns its answer (what
/// one read brings: the whole of a short one).
pub async fn command(port: u16, args: &[&[u8]]) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(&resp(args)).await.unwrap();
    let mut answer = vec![0u8; 65536];
    let n = stream.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A plain HTTP request to a node (`Connection: close`); its body.
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    body.to_owned()
}

/// `POST /publish/<topic>`'s answer as JSON.
pub async fn publish_json(addr: SocketAddr, topic: &str, body: &str) -> Value {
    let answer = http(addr, "POST", &format!("/publish/{topic}"), body.as_bytes()).await;
    serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not JSON: {answer}"))
}

/// The node's bridge counters (`/stats`).
pub async fn bridge(addr: SocketAddr) -> Value {
    let stats = http(addr, "GET", "/stats", b"").await;
    serde_json::from_str::<Value>(&stats).unwrap()["bridge"].clone()
}

/// Waits until the node's bridge is connected (or, with `false`, not).
pub async fn until_connected(addr: SocketAddr, connected: bool) -> Value {
    for _ in 0..400 {
        let stats = bridge(addr).await;
        if stats["connected"] == connected {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the bridge of {addr} never became connected={connected}");
}

/// The next JSON text message (pings passed by); `None` if the connection
/// ended. Panics after 10 s of nothing.
pub async fn next_json(client: &mut Client) -> Option<Value> {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("a message within 10 s");
        match next {
            Some(Ok(WsMessage::Text(text))) => return Some(serde_json::from_str(&text).unwrap()),
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
            Some(Ok(other)) => panic!("expected JSON text, got {other:?}"),
            Some(Err(_)) | None => return None,
        }
    }
}

/// A connection to the Redis on `port` that listens on every bridge
/// channel (`PSUBSCRIBE rapidws:*`), as any Redis client can; its
/// confirmation read.
pub async fn spy(port: u16) -> tokio::io::BufReader<tokio::net::TcpStream> {
    use tokio::io::AsyncBufReadExt;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(&resp(&[b"PSUBSCRIBE", b"rapidws:*"]))
        .await
        .unwrap();
    let mut stream = tokio::io::BufReader::new(stream);
    // `*3`, then `psubscribe`, the pattern and the count, each a line or two.
    let mut ack = String::new();
    for _ in 0..6 {
        stream.read_line(&mut ack).await.unwrap();
    }
    stream
}

/// Reads one `pmessage` from a connection [`spy`] made: its channel and
/// its data.
pub async fn next_pmessage<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> (String, Vec<u8>) {
    use tokio::io::AsyncBufReadExt;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).await.unwrap();
        let count: usize = header.trim_start_matches('*').trim().parse().unwrap();
        let mut parts = Vec::new();
        for _ in 0..count {
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            if let Some(len) = line.strip_prefix('$') {
                let len: usize = len.trim().parse().unwrap();
                let mut data = vec![0; len + 2];
                reader.read_exact(&mut data).await.unwrap();
                data.truncate(len);
                parts.push(data);
            } else {
                parts.push(line.trim().as_bytes().to_vec());
            }
        }
        if parts[0] == b"pmessage" {
            return (
                String::from_utf8(parts[2].clone()).unwrap(),
                parts[3].clone(),
            );
        }
    }
}

/// A notify_bus node with `--redis url` and `extra`, its bridge connected.
pub async fn node(url: &str, extra: &[&str]) -> (Child, SocketAddr) {
    let mut args = vec!["--redis", url];
    args.extend_from_slice(extra);
    let (child, addr) = super::start_example("notify_bus", &args).await;
    until_connected(addr, true).await;
    (child, addr)
}
