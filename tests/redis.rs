//! Two notify_bus nodes sharing topics through a real `redis-server`
//! (Debian's, installed by the test if missing, on a free loopback port):
//! a publish on one node reaches the other's subscribers, each subscriber
//! gets each message once, and Redis going away and coming back costs only
//! the relays made meanwhile (counted) while local delivery goes on.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Child, Client, debian_binary, free_port, next, start_example};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A `redis-server` on `port`, persisting nothing.
fn redis_server(port: u16) -> Child {
    let binary = debian_binary("/usr/bin/redis-server", "redis-server");
    Child(
        std::process::Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs"),
    )
}

async fn wait_for_port(port: u16) {
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

async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    body.to_owned()
}

async fn publish(addr: SocketAddr, topic: &str, body: &str) -> String {
    http(addr, "POST", &format!("/publish/{topic}"), body.as_bytes()).await
}

async fn bridge(addr: SocketAddr) -> serde_json::Value {
    let stats = http(addr, "GET", "/stats", b"").await;
    serde_json::from_str::<serde_json::Value>(&stats).unwrap()["bridge"].clone()
}

/// Waits until the node's bridge is connected (and subscribed).
async fn connected(addr: SocketAddr) -> serde_json::Value {
    for _ in 0..400 {
        let stats = bridge(addr).await;
        if stats["connected"] == true {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the bridge of {addr} never connected: {}",
        bridge(addr).await
    );
}

async fn subscriber(addr: SocketAddr, topic: &str) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{addr}/ws?topics={topic}"))
        .await
        .unwrap()
        .0
}

async fn text(client: &mut Client) -> String {
    match next(client).await {
        WsMessage::Text(text) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_topics_and_survive_a_redis_restart() {
    let port = free_port();
    let mut redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    // One node on each backend.
    let (_a, a) = start_example("notify_bus", &["--redis", &url]).await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    let b_args = ["--redis", &url, "--backend", "uring"];
    #[cfg(not(all(target_os = "linux", feature = "uring")))]
    let b_args = ["--redis", &url, "--backend", "tokio"];
    let (_b, b) = start_example("notify_bus", &b_args).await;
    connected(a).await;
    connected(b).await;
    let mut on_a = subscriber(a, "news").await;
    let mut on_b = subscriber(b, "news").await;

    // A publish counts the node's own subscribers, and reaches both.
    assert_eq!(publish(a, "news", "one").await, "{\"delivered\": 1}\n");
    assert_eq!(text(&mut on_a).await, "one");
    assert_eq!(text(&mut on_b).await, "one");
    assert_eq!(publish(b, "news", "two").await, "{\"delivered\": 1}\n");
    // Once each: the next message on a is the next publish, not "one"
    // again back from Redis.
    assert_eq!(text(&mut on_a).await, "two");
    assert_eq!(text(&mut on_b).await, "two");
    // A topic with subscribers on the other node only.
    let mut only_b = subscriber(b, "b-only").await;
    assert_eq!(publish(a, "b-only", "across").await, "{\"delivered\": 0}\n");
    assert_eq!(text(&mut only_b).await, "across");

    // Redis goes away: local delivery goes on, relays are lost and counted.
    drop(redis);
    for _ in 0..200 {
        if bridge(a).await["connected"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        publish(a, "news", "local only").await,
        "{\"delivered\": 1}\n"
    );
    assert_eq!(text(&mut on_a).await, "local only");
    let lost = bridge(a).await["lost"].as_u64().unwrap();
    assert!(lost >= 1, "{}", bridge(a).await);

    // Redis comes back on the same port: both bridges reconnect and
    // subscribe again.
    redis = redis_server(port);
    wait_for_port(port).await;
    let stats_a = connected(a).await;
    let stats_b = connected(b).await;
    assert!(stats_a["reconnects"].as_u64().unwrap() >= 1, "{stats_a}");
    assert!(stats_b["reconnects"].as_u64().unwrap() >= 1, "{stats_b}");
    // b never saw the message published while Redis was gone: its next
    // one is the first after the restart (at most once, nothing replayed).
    assert_eq!(publish(a, "news", "back").await, "{\"delivered\": 1}\n");
    assert_eq!(text(&mut on_a).await, "back");
    assert_eq!(text(&mut on_b).await, "back");
    assert_eq!(publish(b, "news", "and back").await, "{\"delivered\": 1}\n");
    assert_eq!(text(&mut on_a).await, "and back");
    assert_eq!(text(&mut on_b).await, "and back");
    let stats_b = bridge(b).await;
    assert!(stats_b["received"].as_u64().unwrap() >= 3, "{stats_b}");
    drop(redis);
}

/// A node whose Redis is not there at all serves its own subscribers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_redis_serves_its_own() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let (_node, addr) = start_example("notify_bus", &["--redis", &url]).await;
    let mut local = subscriber(addr, "t").await;
    assert_eq!(publish(addr, "t", "hi").await, "{\"delivered\": 1}\n");
    assert_eq!(text(&mut local).await, "hi");
    let stats = bridge(addr).await;
    assert_eq!(stats["connected"], false, "{stats}");
    // The bad URL case: refused at start, with a reason.
    let out = std::process::Command::new(common::example("notify_bus"))
        .args(["--addr", "127.0.0.1:0", "--redis", "http://nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad Redis URL"));
}
