//! History in Redis Streams, through notify_bus nodes and a real
//! `redis-server` (Debian's, installed by the test if missing, on a free
//! loopback port): positions are the same on every node; a subscriber
//! resumes on another node, and on a node started after what it missed; a
//! node whose Redis connection is cut delivers what was published
//! meanwhile, in order, when it is back; the subscribers of a node killed with SIGKILL
//! while a publisher runs at full speed resume on the other with no gap
//! and no duplicate; a Redis that restarts empty is a discontinuity every
//! subscriber is told of, never a silent gap.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis::{
    bridge, command, http, next_json, publish_json, redis_server, until_connected, wait_for_port,
};
use common::{Child, Client, free_port};
use serde_json::Value;

/// A Redis of the test's own: the server, its port and its URL.
async fn redis() -> (Child, u16, String) {
    let port = free_port();
    let server = redis_server(port);
    wait_for_port(port).await;
    (server, port, format!("redis://127.0.0.1:{port}/"))
}

async fn bus(url: &str, extra: &[&str]) -> (Child, SocketAddr) {
    let mut args = vec!["--history", "5000"];
    args.extend_from_slice(extra);
    common::redis::node(url, &args).await
}

async fn connect(addr: SocketAddr, query: &str) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{addr}/ws?positions=1&{query}"))
        .await
        .unwrap()
        .0
}

fn offset(value: &Value) -> u64 {
    value["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("no offset: {value}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_redis_and_a_subscriber_resumes_on_another_node() {
    let (_redis, _, url) = redis().await;
    let (_a, a) = bus(&url, &[]).await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    let (_b, b) = bus(&url, &["--backend", "uring"]).await;
    #[cfg(not(all(target_os = "linux", feature = "uring")))]
    let (_b, b) = bus(&url, &[]).await;

    let mut on_a = connect(a, "topics=h").await;
    let mut epoch = String::new();
    // Publishes on either node take the next offset of one numbering.
    for (i, node) in [a, b, a, b, a].into_iter().enumerate() {
        let answer = publish_json(node, "h", &format!("m{}", i + 1)).await;
        assert_eq!(offset(&answer), i as u64 + 1, "{answer}");
        let answer_epoch = answer["epoch"].as_str().unwrap().to_owned();
        if epoch.is_empty() {
            epoch = answer_epoch;
        } else {
            assert_eq!(answer_epoch, epoch);
        }
        // A's subscriber is counted in A's answers only.
        assert_eq!(answer["delivered"], u64::from(node == a), "{answer}");
    }
    for i in 1..=5 {
        let delivery = next_json(&mut on_a).await.unwrap();
        assert_eq!(delivery["data"], format!("m{i}"));
        assert_eq!(delivery["epoch"], epoch.as_str());
        assert_eq!(offset(&delivery), i);
    }
    drop(on_a);
    for i in 6..=8 {
        publish_json(b, "h", &format!("m{i}")).await;
    }
    // Resumes on B, which never had a subscriber of the topic.
    let mut on_b = connect(b, &format!("since=h:{epoch}:5")).await;
    for i in 6..=8 {
        let delivery = next_json(&mut on_b).await.unwrap();
        assert_eq!(
            (offset(&delivery), &delivery["data"]),
            (i, &Value::from(format!("m{i}")))
        );
    }
    assert_eq!(
        next_json(&mut on_b).await.unwrap(),
        serde_json::json!({"topic": "h", "recovered": true})
    );
    publish_json(a, "h", "m9").await;
    assert_eq!(offset(&next_json(&mut on_b).await.unwrap()), 9);
    // The same position read on both nodes.
    for node in [a, b] {
        let topic = http(node, "GET", "/topics/h", b"").await;
        let topic: Value = serde_json::from_str(&topic).unwrap();
        assert_eq!(
            (topic["epoch"].as_str(), offset(&topic)),
            (Some(epoch.as_str()), 9)
        );
    }
    // A node started now, that heard none of it: reads Redis's history.
    let (_c, c) = bus(&url, &[]).await;
    let mut on_c = connect(c, &format!("since=h:{epoch}:5")).await;
    for i in 6..=9 {
        assert_eq!(offset(&next_json(&mut on_c).await.unwrap()), i);
    }
    assert_eq!(
        next_json(&mut on_c).await.unwrap(),
        serde_json::json!({"topic": "h", "recovered": true})
    );
    // A position from another epoch: not recovered, then live.
    let mut stale = connect(b, "since=h:0000000000000001:3").await;
    assert_eq!(
        next_json(&mut stale).await.unwrap(),
        serde_json::json!({"topic": "h", "recovered": false})
    );
    publish_json(a, "h", "m10").await;
    assert_eq!(offset(&next_json(&mut stale).await.unwrap()), 10);
    assert_eq!(offset(&next_json(&mut on_c).await.unwrap()), 10);
    let stats = bridge(a).await;
    assert_eq!(stats["unrecorded"], 0, "{stats}");
    assert!(stats["recorded"].as_u64().unwrap() >= 4, "{stats}");
}

/// What one subscriber saw, across its connections.
#[derive(Default)]
struct Seen {
    offsets: Vec<u64>,
    recovered: Vec<bool>,
    connections: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_of_a_node_killed_under_load_resume_on_the_other_without_gaps_or_duplicates() {
    const SUBSCRIBERS: usize = 20;
    const PUBLISHES: u64 = 1500;
    let (_redis, _, url) = redis().await;
    let (mut victim, a) = bus(&url, &[]).await;
    let (_b, b) = bus(&url, &[]).await;

    // The first publish makes the epoch; subscribers start after it.
    let first = publish_json(b, "load", "0").await;
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    assert_eq!(offset(&first), 1);
    let mut watchers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let epoch = epoch.clone();
        watchers.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut last = 1;
            let mut node = a;
            loop {
                let mut client = connect(node, &format!("since=load:{epoch}:{last}")).await;
                seen.connections += 1;
                while let Some(message) = next_json(&mut client).await {
                    if let Some(recovered) = message["recovered"].as_bool() {
                        seen.recovered.push(recovered);
                        continue;
                    }
                    last = offset(&message);
                    seen.offsets.push(last);
                    if last == PUBLISHES + 1 {
                        return seen;
                    }
                }
                // Its node died: the other one.
                node = b;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let publisher = tokio::spawn(async move {
        for i in 1..=PUBLISHES {
            let answer = publish_json(b, "load", &i.to_string()).await;
            assert_eq!(offset(&answer), i + 1, "{answer}");
        }
    });
    // Kill A (SIGKILL) a third of the way through.
    loop {
        let position = http(b, "GET", "/topics/load", b"").await;
        let position: Value = serde_json::from_str(&position).unwrap();
        if offset(&position) > PUBLISHES / 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    victim.0.kill().unwrap();
    let killed_at =
        offset(&serde_json::from_str::<Value>(&http(b, "GET", "/topics/load", b"").await).unwrap());
    publisher.await.unwrap();
    let want: Vec<u64> = (2..=PUBLISHES + 1).collect();
    for watcher in watchers {
        let seen = tokio::time::timeout(Duration::from_secs(60), watcher)
            .await
            .expect("every subscriber sees the last publish")
            .unwrap();
        assert_eq!(seen.connections, 2, "each moved once, to the other node");
        assert!(
            seen.offsets == want,
            "gaps or duplicates: {:?}",
            seen.offsets
        );
        assert!(seen.recovered.iter().all(|&r| r), "{:?}", seen.recovered);
    }
    eprintln!(
        "killed node A at offset {killed_at} of {}; {SUBSCRIBERS} subscribers resumed on B, each saw every offset once",
        PUBLISHES + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_restarts_empty_is_a_discontinuity_never_a_silent_gap() {
    let port = free_port();
    let mut redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let (_a, a) = bus(&url, &[]).await;
    let (_b, b) = bus(&url, &[]).await;
    let mut on_a = connect(a, "topics=r").await;
    let mut on_b = connect(b, "topics=r").await;
    let before = publish_json(a, "r", "before").await;
    let old_epoch = before["epoch"].as_str().unwrap().to_owned();
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(next_json(client).await.unwrap()["data"], "before");
    }

    // Redis gone: A still delivers its own publish, in an epoch of its own.
    drop(redis);
    until_connected(a, false).await;
    let alone = publish_json(a, "r", "alone").await;
    assert_eq!(alone["delivered"], 1, "{alone}");
    assert_ne!(alone["epoch"], before["epoch"]);
    let delivery = next_json(&mut on_a).await.unwrap();
    assert_eq!(delivery["data"], "alone");
    assert!(bridge(a).await["unrecorded"].as_u64().unwrap() >= 1);

    // Redis back, empty: both nodes reconnect; the next publish is in
    // Redis's new epoch, and each subscriber is told of the gap first.
    redis = redis_server(port);
    wait_for_port(port).await;
    until_connected(a, true).await;
    until_connected(b, true).await;
    let after = publish_json(b, "r", "after").await;
    assert_ne!(after["epoch"], before["epoch"]);
    assert_ne!(after["epoch"], alone["epoch"]);
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(
            next_json(client).await.unwrap(),
            serde_json::json!({"topic": "r", "recovered": false})
        );
        let delivery = next_json(client).await.unwrap();
        assert_eq!(delivery["data"], "after");
        assert_eq!(delivery["epoch"], after["epoch"]);
    }
    // Resuming from before the restart, on either node: not recovered.
    for node in [a, b] {
        let mut resumed = connect(node, &format!("since=r:{old_epoch}:1")).await;
        assert_eq!(
            next_json(&mut resumed).await.unwrap(),
            serde_json::json!({"topic": "r", "recovered": false})
        );
    }
    // From A's own epoch of the outage: not recovered either.
    let alone_epoch = alone["epoch"].as_str().unwrap();
    let mut resumed = connect(b, &format!("since=r:{alone_epoch}:2")).await;
    assert_eq!(
        next_json(&mut resumed).await.unwrap(),
        serde_json::json!({"topic": "r", "recovered": false})
    );
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_delivers_what_it_missed_in_order_when_back() {
    let (_redis, port, url) = redis().await;
    let (_a, a) = bus(&url, &[]).await;
    let (_b, b) = bus(&url, &[]).await;
    let mut on_a = connect(a, "topics=c").await;
    publish_json(b, "c", "1").await;
    assert_eq!(offset(&next_json(&mut on_a).await.unwrap()), 1);
    // A's subscription cut (A connected first: its id is the lower): B's
    // publishes meanwhile are recorded, but A hears none of them live.
    let clients = command(port, &[b"CLIENT", b"LIST", b"TYPE", b"pubsub"]).await;
    let ids = clients.lines().filter_map(|line| {
        let id = line
            .split(' ')
            .find_map(|field| field.strip_prefix("id="))?;
        id.parse::<u64>().ok()
    });
    let a_id = ids.min().expect("two subscribed nodes").to_string();
    let killed = command(port, &[b"CLIENT", b"KILL", b"ID", a_id.as_bytes()]).await;
    assert_eq!(killed, ":1\r\n");
    for i in 2..=30 {
        publish_json(b, "c", &i.to_string()).await;
    }
    let offsets: Vec<u64> = {
        let mut seen = Vec::new();
        while seen.last() != Some(&30) {
            let message = next_json(&mut on_a).await.expect("A's subscriber stays");
            assert!(message.get("recovered").is_none(), "no gap: {message}");
            seen.push(offset(&message));
        }
        seen
    };
    assert_eq!(offsets, (2..=30).collect::<Vec<u64>>());
    let stats = bridge(a).await;
    assert!(stats["reconnects"].as_u64().unwrap() >= 1, "{stats}");
    eprintln!(
        "cut off from Redis: A delivered 29 publications in order, {} read from the stream",
        stats["filled"]
    );
}

async fn subscribers_everywhere(node: SocketAddr, topic: &str) -> u64 {
    let answer = http(node, "GET", &format!("/topics/{topic}"), b"").await;
    let answer: Value = serde_json::from_str(&answer).unwrap();
    answer["subscribers"].as_u64().unwrap()
}

/// Polls `/topics/<topic>` on `node` until it says `want` (within 30 s).
async fn until_subscribers(node: SocketAddr, topic: &str, want: u64) -> Duration {
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if subscribers_everywhere(node, topic).await == want {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{node} never counted {want} subscribers to {topic}: {}",
        subscribers_everywhere(node, topic).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_count_every_nodes_subscribers_and_forget_a_dead_node() {
    let (_redis, _, url) = redis().await;
    let (mut victim, a) = bus(&url, &[]).await;
    let (_b, b) = bus(&url, &[]).await;
    let mut on_a = Vec::new();
    for _ in 0..3 {
        on_a.push(connect(a, "topics=occ").await);
    }
    let mut on_b = Vec::new();
    for _ in 0..2 {
        on_b.push(connect(b, "topics=occ").await);
    }
    // Each node's first subscriber is written at once; the rest within a
    // refresh (5 s).
    until_subscribers(a, "occ", 5).await;
    until_subscribers(b, "occ", 5).await;
    // B's last subscriber leaves: taken out at once.
    drop(on_b);
    let left = until_subscribers(a, "occ", 3).await;
    // A dies without a word: its count goes when it is no longer good.
    victim.0.kill().unwrap();
    let forgotten = until_subscribers(b, "occ", 0).await;
    eprintln!(
        "occupancy: B's leaving seen on A after {left:?}; A's death forgotten after {forgotten:?}"
    );
    assert!(forgotten >= Duration::from_secs(5), "{forgotten:?}");
    drop(on_a);
}
