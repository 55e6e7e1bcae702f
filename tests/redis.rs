//! Two notify_bus nodes sharing topics through a real `redis-server`
//! (Debian's, installed by the test if missing, on a free loopback port):
//! a publish on one node reaches the other's subscribers, each subscriber
//! gets each message once, and Redis going away and coming back costs only
//! the relays made meanwhile (counted) while local delivery goes on.
//!
//! Redis as an adversary (spoken to in RESP by the test itself): a paused
//! Redis (`CLIENT PAUSE`) under 400 publishes of 1 MiB costs a bounded
//! amount of memory and counts what was lost; a message over the node's
//! size limit published straight to the channel is refused, and one large
//! enough that Redis drops the subscription costs a reconnect; with
//! `--redis-secret`, a forged message, a replay of a real one, and one that
//! claims another node's id are refused and counted; two bridges on one
//! `PubSub` are refused, and dropping one leaves its successor relaying.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis::{bridge, command, http, next_pmessage, redis_server, spy, wait_for_port};
use common::{Client, delivered, free_port, next, resident_of, start_example};
use tokio_tungstenite::tungstenite::Message as WsMessage;

async fn publish(addr: SocketAddr, topic: &str, body: &str) -> String {
    http(addr, "POST", &format!("/publish/{topic}"), body.as_bytes()).await
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
    assert_eq!(delivered(&publish(a, "news", "one").await), 1);
    assert_eq!(text(&mut on_a).await, "one");
    assert_eq!(text(&mut on_b).await, "one");
    assert_eq!(delivered(&publish(b, "news", "two").await), 1);
    // Once each: the next message on a is the next publish, not "one"
    // again back from Redis.
    assert_eq!(text(&mut on_a).await, "two");
    assert_eq!(text(&mut on_b).await, "two");
    // A topic with subscribers on the other node only.
    let mut only_b = subscriber(b, "b-only").await;
    assert_eq!(delivered(&publish(a, "b-only", "across").await), 0);
    assert_eq!(text(&mut only_b).await, "across");

    // Redis goes away: local delivery goes on, relays are lost and counted.
    drop(redis);
    for _ in 0..200 {
        if bridge(a).await["connected"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(delivered(&publish(a, "news", "local only").await), 1);
    assert_eq!(text(&mut on_a).await, "local only");
    // The relay is counted lost by the bridge's own task, after the
    // publish has answered: wait for it (bounded).
    until_counter(a, "lost", 1).await;

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
    assert_eq!(delivered(&publish(a, "news", "back").await), 1);
    assert_eq!(text(&mut on_a).await, "back");
    assert_eq!(text(&mut on_b).await, "back");
    assert_eq!(delivered(&publish(b, "news", "and back").await), 1);
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
    assert_eq!(delivered(&publish(addr, "t", "hi").await), 1);
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

/// A bridge message as a node without a secret writes it (version 3:
/// node, count, time, kind, payload): what anyone with access to Redis
/// can write too.
fn forged(node: [u8; 16], count: u64, payload: &[u8]) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut message = vec![3];
    message.extend_from_slice(&node);
    message.extend_from_slice(&count.to_be_bytes());
    message.extend_from_slice(&now.to_be_bytes());
    message.push(b't');
    message.extend_from_slice(payload);
    message
}

async fn counter(addr: SocketAddr, name: &str) -> u64 {
    bridge(addr).await[name].as_u64().unwrap()
}

async fn until_counter(addr: SocketAddr, name: &str, at_least: u64) -> u64 {
    for _ in 0..400 {
        let value = counter(addr, name).await;
        if value >= at_least {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name} never reached {at_least}: {}", bridge(addr).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_costs_bounded_memory_and_counts_what_it_lost() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let args = ["--redis", &url, "--max-message-size", "2000000"];
    let (node, addr) = start_example("notify_bus", &args).await;
    connected(addr).await;
    let before = resident_of(&node);
    assert_eq!(
        command(port, &[b"CLIENT", b"PAUSE", b"6000", b"ALL"]).await,
        "+OK\r\n"
    );
    let body = "x".repeat(1 << 20);
    for _ in 0..400 {
        publish(addr, "big", &body).await;
    }
    let grown = resident_of(&node).saturating_sub(before);
    let lost = counter(addr, "lost").await;
    eprintln!(
        "paused Redis: RSS grew {} MiB over 400 MiB published; lost {lost}",
        grown >> 20
    );
    // At most 16 MiB waits for Redis; the rest is lost and counted.
    assert!(lost >= 300, "{}", bridge(addr).await);
    assert!(grown < 96 << 20, "grew {} MiB", grown >> 20);
    // Redis back: relaying again.
    command(port, &[b"CLIENT", b"UNPAUSE"]).await;
    connected(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_comes_from_redis_gets_the_nodes_limits() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let args = ["--redis", &url, "--max-message-size", "1000000"];
    let (node, addr) = start_example("notify_bus", &args).await;
    connected(addr).await;
    let mut reader = subscriber(addr, "t").await;
    let before = resident_of(&node);
    // 20 MiB straight to the channel: refused, not delivered.
    let large = forged([9; 16], 1, &vec![b'x'; 20 << 20]);
    command(port, &[b"PUBLISH", b"rapidws:t", &large]).await;
    until_counter(addr, "refused", 1).await;
    // Not UTF-8 as text, and not the bridge's format: refused.
    command(
        port,
        &[b"PUBLISH", b"rapidws:t", &forged([9; 16], 2, &[0xff])],
    )
    .await;
    command(port, &[b"PUBLISH", b"rapidws:t", b"hello"]).await;
    until_counter(addr, "refused", 3).await;
    // 64 MiB: past Redis's own pub/sub output limit, so Redis drops the
    // node's subscription; the node reconnects (and counts it).
    let huge = forged([9; 16], 3, &vec![b'x'; 64 << 20]);
    command(port, &[b"PUBLISH", b"rapidws:t", &huge]).await;
    until_counter(addr, "reconnects", 1).await;
    connected(addr).await;
    // Within the limits and in the format (no secret set): delivered, and
    // the subscriber got nothing before it.
    command(
        port,
        &[b"PUBLISH", b"rapidws:t", &forged([9; 16], 4, b"fits")],
    )
    .await;
    assert_eq!(text(&mut reader).await, "fits");
    let grown = resident_of(&node).saturating_sub(before);
    eprintln!("RSS grew {} MiB; {}", grown >> 20, bridge(addr).await);
    assert!(grown < 128 << 20, "grew {} MiB", grown >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_forged_replayed_and_misattributed_messages_are_refused() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let secret = "a secret the nodes share, 32 chars";
    let args = ["--redis", &url, "--redis-secret", secret];
    let (_a, a) = start_example("notify_bus", &args).await;
    let (_b, b) = start_example("notify_bus", &args).await;
    connected(a).await;
    connected(b).await;
    let mut on_b = subscriber(b, "t").await;
    // The test listens on the channel like any Redis client can.
    let mut spy = spy(port).await;
    assert_eq!(delivered(&publish(a, "t", "real").await), 0);
    assert_eq!(text(&mut on_b).await, "real");
    let (channel, captured) = next_pmessage(&mut spy).await;
    assert_eq!(channel, "rapidws:t");
    // A replay of the real message: refused by b (its count is not new).
    command(port, &[b"PUBLISH", b"rapidws:t", &captured]).await;
    until_counter(b, "refused", 1).await;
    // Unsigned, and claiming a's id (read from the capture): refused.
    let a_id: [u8; 16] = captured[1..17].try_into().unwrap();
    command(
        port,
        &[b"PUBLISH", b"rapidws:t", &forged(a_id, 99, b"as a")],
    )
    .await;
    command(
        port,
        &[b"PUBLISH", b"rapidws:t", &forged([5; 16], 1, b"new")],
    )
    .await;
    until_counter(b, "refused", 3).await;
    // Moved to another channel: refused.
    command(port, &[b"PUBLISH", b"rapidws:other", &captured]).await;
    until_counter(b, "refused", 4).await;
    // Nothing of it reached the subscriber: the next message is the next
    // real one.
    publish(a, "t", "next").await;
    assert_eq!(text(&mut on_b).await, "next");
    assert_eq!(counter(b, "received").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bridge_per_pubsub_and_dropping_it_leaves_a_successor_relaying() {
    use rapidws::pubsub::PubSub;
    use rapidws::pubsub::redis::{Bridge, BridgeError};
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let pubsub = PubSub::new();
    let first = Bridge::start(&pubsub, &url).unwrap();
    let second = Bridge::start(&pubsub, &url);
    assert!(matches!(second, Err(BridgeError::Running)), "{second:?}");
    drop(first);
    let successor = Bridge::start(&pubsub, &url).unwrap();
    for _ in 0..400 {
        if successor.stats().connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The test listens on the channel like any Redis client can.
    let mut spy = spy(port).await;
    pubsub.publish("t", rapidws::Message::Text("relayed"));
    let (channel, message) = tokio::time::timeout(Duration::from_secs(5), next_pmessage(&mut spy))
        .await
        .expect("the successor relays");
    assert_eq!(channel, "rapidws:t");
    assert!(message.ends_with(b"relayed"));
    // Counted once Redis has answered (after the message went out).
    for _ in 0..200 {
        if successor.stats().relayed == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("relayed never counted: {:?}", successor.stats());
}
