//! A party that can write to Redis but does not know `--redis-secret`,
//! against two notify_bus nodes keeping history in Redis Streams (a real
//! `redis-server`, the attacker speaking RESP from the test): a captured
//! publication published again at the next offsets is refused by every
//! node, the publisher's own too, and the real publications after it are
//! still delivered, each once; a real entry copied to the end of the
//! topic's stream (its counter moved on) is not replayed to a subscriber
//! that resumes on a node started afterwards, which is told it was not
//! recovered, nor given by `latest=`, and a node that follows the topic
//! is told of the hole before the next real one; and a node restarted
//! after a capture refuses the captured message, having remembered
//! nothing.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::redis::{
    bridge, command, next_json, next_pmessage, publish_json, redis_server, spy, wait_for_port,
};
use common::{Child, Client, free_port};
use serde_json::{Value, json};

const SECRET: &str = "a secret the nodes share, 32 chars";

async fn bus(url: &str) -> (Child, SocketAddr) {
    common::redis::node(url, &["--redis-secret", SECRET, "--history", "100"]).await
}

async fn connect(addr: SocketAddr, query: &str) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{addr}/ws?positions=1&{query}"))
        .await
        .unwrap()
        .0
}

async fn refused(addr: SocketAddr) -> u64 {
    bridge(addr).await["refused"].as_u64().unwrap()
}

async fn until_refused(addr: SocketAddr, at_least: u64) {
    for _ in 0..400 {
        if refused(addr).await >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("refused never reached {at_least}: {}", bridge(addr).await);
}

/// A recorded message's node message (what follows `r<epoch><offset>:`).
fn inner(recorded: &[u8]) -> &[u8] {
    let colon = recorded.iter().position(|&b| b == b':').unwrap();
    &recorded[colon + 1..]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_at_new_positions_and_copies_in_streams_are_refused() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let (_a, a) = bus(&url).await;
    let (b_node, b) = bus(&url).await;
    let mut on_a = connect(a, "topics=t").await;
    let mut on_b = connect(b, "topics=t").await;
    let mut spy = spy(port).await;

    let first = publish_json(a, "t", "transfer $100").await;
    assert_eq!(first["delivered"], 1);
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    for client in [&mut on_a, &mut on_b] {
        let got = next_json(client).await.unwrap();
        assert_eq!(
            (&got["data"], &got["offset"]),
            (&json!("transfer $100"), &json!(1))
        );
    }
    let captured_at = Instant::now();
    let (_, capture) = next_pmessage(&mut spy).await;
    let message = inner(&capture).to_vec();

    // Published again at the next two offsets: refused by both nodes (a's
    // own message too), nothing delivered.
    for offset in [2, 3] {
        let mut replay = format!("r{epoch}{offset}:").into_bytes();
        replay.extend_from_slice(&message);
        command(port, &[b"PUBLISH", b"rapidws:t", &replay]).await;
    }
    until_refused(a, 2).await;
    until_refused(b, 2).await;

    // The real publications that follow take those offsets, and arrive.
    for (n, body) in ["real 2", "real 3"].iter().enumerate() {
        let answer = publish_json(a, "t", body).await;
        assert_eq!(answer["delivered"], 1, "{answer}");
        assert_eq!(answer["offset"], n + 2, "{answer}");
        for client in [&mut on_a, &mut on_b] {
            let got = next_json(client).await.unwrap();
            assert_eq!(
                (&got["data"], &got["offset"]),
                (&json!(body), &json!(n + 2))
            );
        }
    }

    // The real first entry copied to the end of the stream, the counter
    // moved on to it, as a party with write access can.
    let hincr = command(port, &[b"HINCRBY", b"rapidws:{t}:m", b"o", b"1"]).await;
    assert!(hincr.starts_with(":4"), "{hincr}");
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let added = command(
        port,
        &[
            b"XADD",
            b"rapidws:{t}:s",
            b"0-4",
            b"t",
            time.as_bytes(),
            b"m",
            &message,
        ],
    )
    .await;
    assert!(added.contains("0-4"), "{added}");
    // A node started now reads the stream for a subscriber resuming after
    // 3: it is told it was not recovered, and gets nothing replayed.
    let (_c, c) = bus(&url).await;
    let mut resumed = connect(c, &format!("since=t:{epoch}:3")).await;
    let told = next_json(&mut resumed).await.unwrap();
    assert_eq!(told, json!({"topic": "t", "recovered": false}));
    // `latest=` gives nothing from such a stream either.
    let mut latest = connect(c, "latest=t").await;
    let quiet = tokio::time::timeout(Duration::from_millis(500), next_json(&mut latest)).await;
    assert!(quiet.is_err(), "latest gave {quiet:?}");
    assert!(refused(c).await >= 1, "{}", bridge(c).await);

    // b restarted: it remembers nothing, and still refuses the capture
    // (signed before it started listening, past the clocks' skew).
    drop(b_node);
    let wait = Duration::from_secs(11).saturating_sub(captured_at.elapsed());
    tokio::time::sleep(wait).await;
    let (_b2, b2) = bus(&url).await;
    let mut on_b2 = connect(b2, "topics=t").await;
    let before = refused(b2).await;
    let mut replay = format!("r{epoch}5:").into_bytes();
    replay.extend_from_slice(&message);
    command(port, &[b"PUBLISH", b"rapidws:t", &replay]).await;
    until_refused(b2, before + 1).await;
    // The next real one is delivered there (its offset is Redis's next).
    let answer = publish_json(a, "t", "after the restart").await;
    let got = next_json(&mut on_b2).await.unwrap();
    assert_eq!(got["data"], "after the restart", "{answer} {got}");
    // On a, which never took the copy at 4, the publication at 5 comes
    // after a hole it cannot fill from a stream that does not hang
    // together: told, then delivered; and nothing was delivered twice.
    let told = next_json(&mut on_a).await.unwrap();
    assert_eq!(told, json!({"topic": "t", "recovered": false}));
    let got: Value = next_json(&mut on_a).await.unwrap();
    assert_eq!(
        (&got["data"], &got["offset"]),
        (&json!("after the restart"), &json!(5))
    );
}
