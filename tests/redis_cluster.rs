//! notify_bus nodes on a real 3-shard Redis Cluster (Debian's
//! `redis-server --cluster-enabled yes`, made with `redis-cli --cluster
//! create` on free loopback ports): sharded pub/sub carries every topic
//! between the nodes, positions come from each topic's shard, a
//! subscriber resumes on the other node; with one shard killed (SIGKILL),
//! the topics of the other shards go on untouched and the dead shard's
//! are still delivered on the node they were published on; brought back
//! (empty), its topics' subscribers are told of the gap, and everything
//! flows again.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use common::redis::{bridge, command, next_json, publish_json, redis_server_with, wait_for_port};
use common::{Child, Client, debian_binary, free_port_with, start_example};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

const TOPICS: usize = 12;

fn shard(port: u16, dir: &std::path::Path) -> Child {
    let config = format!("nodes-{port}.conf");
    let cluster = [
        "--cluster-enabled",
        "yes",
        "--cluster-node-timeout",
        "1000",
        "--cluster-require-full-coverage",
        "no",
        "--cluster-config-file",
        &config,
    ];
    redis_server_with(port, &cluster, Some(dir))
}

/// Waits until every shard says the cluster is whole.
async fn cluster_ok(ports: &[u16]) {
    for _ in 0..400 {
        let mut ok = true;
        for &port in ports {
            ok &= command(port, &[b"CLUSTER", b"INFO"])
                .await
                .contains("cluster_state:ok");
        }
        if ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the cluster never became ok");
}

/// Whether `slot` is served by the shard on `port`.
async fn owns(port: u16, slot: u16) -> bool {
    let nodes = command(port, &[b"CLUSTER", b"NODES"]).await;
    let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
    me.split(' ').skip(8).any(|range| {
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        match (low.parse::<u16>(), high.parse::<u16>()) {
            (Ok(low), Ok(high)) => (low..=high).contains(&slot),
            _ => false,
        }
    })
}

async fn json_message(client: &mut Client) -> Value {
    next_json(client).await.expect("the connection stays")
}

/// Nothing arrives within `quiet`.
async fn silent(client: &mut Client, quiet: Duration) {
    if let Ok(next) = tokio::time::timeout(quiet, client.next()).await {
        panic!("expected nothing, got {next:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_shard_cluster_carries_topics_and_survives_a_shard_killed_and_back() {
    let dir = std::env::temp_dir().join(format!("rapidws-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (Each node's cluster bus listens on its port + 10000.)
    let ports = [
        free_port_with(10_000),
        free_port_with(10_000),
        free_port_with(10_000),
    ];
    let mut shards: Vec<Child> = ports.iter().map(|&p| shard(p, &dir)).collect();
    for &port in &ports {
        wait_for_port(port).await;
    }
    let cli = debian_binary("/usr/bin/redis-cli", "redis-tools");
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let made = std::process::Command::new(cli)
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stdout)
    );
    cluster_ok(&ports).await;

    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let nodes = urls.join(",");
    let args = ["--redis-cluster", &nodes, "--history", "100"];
    let (_a, a) = start_example("notify_bus", &args).await;
    let (_b, b) = start_example("notify_bus", &args).await;
    for node in [a, b] {
        for _ in 0..400 {
            if bridge(node).await["connected"] == true {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let topics: Vec<String> = (0..TOPICS).map(|i| format!("t{i}")).collect();
    let mut on_a = tokio_tungstenite::connect_async(format!(
        "ws://{a}/ws?positions=1&topics={}",
        topics.join(",")
    ))
    .await
    .unwrap()
    .0;
    // Subscribed on each topic's shard: wait until B's publishes arrive.
    let mut epochs = Vec::new();
    for topic in &topics {
        let mut arrived = None;
        for attempt in 0..100 {
            let answer = publish_json(b, topic, &format!("hello {attempt}")).await;
            if let Ok(Ok(Some(Ok(WsMessage::Text(text))))) =
                tokio::time::timeout(Duration::from_millis(100), on_a.next())
                    .await
                    .map(Ok::<_, ()>)
            {
                let delivery: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(delivery["topic"], topic.as_str());
                assert_eq!(delivery["offset"], answer["offset"], "{delivery} {answer}");
                arrived = Some(delivery);
                break;
            }
        }
        let delivery = arrived.unwrap_or_else(|| panic!("{topic} never reached A"));
        epochs.push((
            delivery["epoch"].clone(),
            delivery["offset"].as_u64().unwrap(),
        ));
    }

    // Resume on B, for every topic, after its last position.
    let since: Vec<String> = topics
        .iter()
        .zip(&epochs)
        .map(|(t, (e, o))| format!("since={t}:{}:{o}", e.as_str().unwrap()))
        .collect();
    for (topic, (_, offset)) in topics.iter().zip(&epochs) {
        let answer = publish_json(a, topic, "while away").await;
        assert_eq!(answer["offset"], offset + 1);
        assert_eq!(json_message(&mut on_a).await["data"], "while away");
    }
    let mut on_b =
        tokio_tungstenite::connect_async(format!("ws://{b}/ws?positions=1&{}", since.join("&")))
            .await
            .unwrap()
            .0;
    let mut recovered = 0;
    let mut replayed = 0;
    while recovered < TOPICS {
        let message = json_message(&mut on_b).await;
        if message.get("recovered").is_some() {
            assert_eq!(message["recovered"], true, "{message}");
            recovered += 1;
        } else {
            assert_eq!(message["data"], "while away");
            replayed += 1;
        }
    }
    assert_eq!(replayed, TOPICS);

    // Which topics live on the shard about to die.
    let victim = 1;
    let mut doomed = Vec::new();
    for topic in &topics {
        let slot = command(ports[0], &[b"CLUSTER", b"KEYSLOT", topic.as_bytes()]).await;
        let slot: u16 = slot.trim().trim_start_matches(':').parse().unwrap();
        doomed.push(owns(ports[victim], slot).await);
    }
    assert!(
        doomed.iter().any(|d| *d) && doomed.iter().any(|d| !*d),
        "{doomed:?}"
    );
    shards[victim].0.kill().unwrap();
    shards[victim].0.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The other shards' topics: untouched. The dead shard's: still
    // delivered on the node that published them.
    for ((topic, &dead), (epoch, _)) in topics.iter().zip(&doomed).zip(&epochs) {
        let answer = publish_json(b, topic, "during").await;
        // B's own subscriber gets it either way.
        assert_eq!(answer["delivered"], 1, "{answer}");
        assert_eq!(json_message(&mut on_b).await["data"], "during");
        if dead {
            // Numbered by B alone: an epoch of its own.
            assert_ne!(&answer["epoch"], epoch, "{answer}");
        } else {
            assert_eq!(&answer["epoch"], epoch, "{answer}");
            let delivery = json_message(&mut on_a).await;
            assert_eq!(delivery["topic"], topic.as_str());
            assert_eq!(delivery["data"], "during");
            assert_eq!(delivery["offset"], answer["offset"]);
        }
    }
    silent(&mut on_a, Duration::from_millis(300)).await;
    let stats = bridge(b).await;
    let dead_count = doomed.iter().filter(|d| **d).count() as u64;
    assert!(
        stats["unrecorded"].as_u64().unwrap() >= dead_count,
        "{stats}"
    );

    // Back (empty, same cluster identity): the dead shard's topics get a
    // new epoch, told as a gap to their subscribers; all flow again.
    shards[victim] = shard(ports[victim], &dir);
    wait_for_port(ports[victim]).await;
    cluster_ok(&ports).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (topic, &dead) in topics.iter().zip(&doomed) {
        let mut delivered = false;
        for attempt in 0..15 {
            publish_json(b, topic, &format!("after {attempt}")).await;
            let Ok(Some(Ok(WsMessage::Text(text)))) =
                tokio::time::timeout(Duration::from_millis(200), on_a.next()).await
            else {
                continue;
            };
            let mut message: Value = serde_json::from_str(&text).unwrap();
            if dead {
                assert_eq!(message, json!({"topic": topic, "recovered": false}));
                message = json_message(&mut on_a).await;
            }
            assert_eq!(message["topic"], topic.as_str());
            assert!(
                message["data"].as_str().unwrap().starts_with("after"),
                "{message}"
            );
            // Earlier attempts that arrived late: this topic's, no gap.
            while let Ok(Some(Ok(WsMessage::Text(text)))) =
                tokio::time::timeout(Duration::from_millis(300), on_a.next()).await
            {
                let late: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(late["topic"], topic.as_str(), "{late}");
                assert!(late.get("recovered").is_none(), "{late}");
            }
            delivered = true;
            break;
        }
        assert!(
            delivered,
            "{topic} never flowed again: A {}, B {}, last answer {}",
            bridge(a).await,
            bridge(b).await,
            publish_json(b, topic, "last").await
        );
    }
    eprintln!(
        "cluster: {TOPICS} topics, {dead_count} on the killed shard; B: {}",
        bridge(b).await
    );
    drop(shards);
    let _ = std::fs::remove_dir_all(&dir);
}
