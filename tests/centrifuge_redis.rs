//! Centrifugo's protocol on two `centrifugo_compat` nodes that share a
//! Redis (`--redis`; one node on tokio, the other on io_uring where there
//! is one). With history: a client that leaves one node and comes back on
//! the other recovers there what it missed, exactly once and in order,
//! round after round, though that node never had a subscriber of the
//! channel before; both nodes give a channel the same epoch. With
//! presence: a client on either node, and either node's HTTP API, sees
//! every node's clients, with their users and info, and stops seeing one
//! that unsubscribed, disconnected, or whose node was killed (once its
//! node's entry lapsed). The client is tokio-tungstenite speaking the JSON
//! format.
#![cfg(all(feature = "centrifuge", feature = "redis"))]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis::{command, redis_server, wait_for_port};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Ws;

type Ws2 =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Publishes `{"n": n}` to `channel` through `node`'s server HTTP API.
async fn publish(node: SocketAddr, channel: &str, n: u64) {
    let body = json!({"channel": channel, "data": {"n": n}});
    let answer = centrifugo::api(node, "k", "publish", &body).await;
    assert!(answer.get("error").is_none(), "{answer}");
}

/// The next JSON message, past (and answering) the server's pings.
async fn next_json(client: &mut Ws2) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("a message within 10 s")
            .expect("the connection is open")
            .expect("a frame");
        match message {
            Ws::Text(text) if text.as_str() == "{}" => client.send(Ws::text("{}")).await.unwrap(),
            Ws::Text(text) => return serde_json::from_str(&text).unwrap(),
            other => panic!("not text: {other:?}"),
        }
    }
}

/// Connects to `node` and subscribes to `channel`, recovering from
/// `since` (epoch, offset) if given; the client and the subscribe reply.
async fn subscribe(node: SocketAddr, channel: &str, since: Option<(&str, u64)>) -> (Ws2, Value) {
    let url = format!("ws://{node}/connection/websocket");
    let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let mut subscribe = json!({"channel": channel});
    if let Some((epoch, offset)) = since {
        subscribe["recover"] = json!(true);
        subscribe["epoch"] = json!(epoch);
        subscribe["offset"] = json!(offset);
    }
    let batch = format!(
        "{}\n{}",
        json!({"id": 1, "connect": {}}),
        json!({"id": 2, "subscribe": subscribe})
    );
    client.send(Ws::text(batch)).await.unwrap();
    let connect = next_json(&mut client).await;
    assert_eq!(connect["id"], 1, "{connect}");
    let reply = next_json(&mut client).await;
    assert_eq!(reply["id"], 2, "{reply}");
    (client, reply["subscribe"].clone())
}

/// A publication push's `n` and offset.
fn delivery(push: &Value) -> (u64, u64) {
    let publication = &push["push"]["pub"];
    let n = publication["data"]["n"].as_u64();
    let offset = publication["offset"].as_u64();
    n.zip(offset)
        .unwrap_or_else(|| panic!("not a publication: {push}"))
}

/// Three deliveries after `(n, offset)`: at the next three offsets, in
/// order, carrying the next three `n`s, each once. (Their order among
/// themselves is Redis's: an API publish is answered once its node took
/// it, before Redis numbered it, so two nodes' publishes may be numbered
/// in either order.) The last `n` and offset.
fn batch(pushes: &[Value], (n, offset): (u64, u64), round: usize) -> (u64, u64) {
    let got: Vec<(u64, u64)> = pushes.iter().map(delivery).collect();
    let offsets: Vec<u64> = got.iter().map(|&(_, at)| at).collect();
    assert_eq!(
        offsets,
        [offset + 1, offset + 2, offset + 3],
        "round {round}: {got:?}"
    );
    let mut ns: Vec<u64> = got.iter().map(|&(n, _)| n).collect();
    ns.sort_unstable();
    assert_eq!(ns, [n + 1, n + 2, n + 3], "round {round}: {got:?}");
    (n + 3, offset + 3)
}

/// The backend of the second node: io_uring where there is one.
fn second_backend() -> &'static str {
    if cfg!(all(target_os = "linux", feature = "uring")) {
        "uring"
    } else {
        "tokio"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_recovers_on_the_other_node_round_after_round() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let common = ["--redis", &url, "--history", "100", "--api-key", "k"];
    let (_a, a) = start_example("centrifugo_compat", &common).await;
    let b_args = [&common[..], &["--backend", second_backend()]].concat();
    let (_b, b) = start_example("centrifugo_compat", &b_args).await;

    let channel = "scores";
    // Both bridges connected: a first subscribe gives the channel its epoch
    // in Redis (`rapidws:{scores}:m`), which a node answers only once its
    // bridge is up (before, the channel is numbered on the node alone).
    let up = |node| async move {
        for _ in 0..200 {
            let (client, first) = subscribe(node, channel, None).await;
            let redis = command(port, &[b"HGET", b"rapidws:{scores}:m", b"e"]).await;
            if redis.contains(first["epoch"].as_str().unwrap()) {
                return (client, first);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{node}'s bridge did not come up");
    };
    let (_on_b, _) = up(b).await;
    let (mut client, first) = up(a).await;
    assert_eq!(first["recoverable"], true, "{first}");
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    // Delivered so far: `n` counts up from 1, offsets follow one another.
    let (mut n, mut offset) = (0u64, first["offset"].as_u64().unwrap_or(0));
    let nodes = [a, b];
    for round in 0..12 {
        let (here, there) = (nodes[round % 2], nodes[(round + 1) % 2]);
        // Live on this node, published on either.
        for k in 0..3u64 {
            publish(if k == 1 { there } else { here }, channel, n + k + 1).await;
        }
        let mut live = Vec::new();
        for _ in 0..3 {
            live.push(next_json(&mut client).await);
        }
        (n, offset) = batch(&live, (n, offset), round);
        // Gone; three more published meanwhile, on both nodes; back on
        // the other node.
        drop(client);
        for k in 0..3u64 {
            publish(nodes[k as usize % 2], channel, n + k + 1).await;
        }
        let (back, reply) = subscribe(there, channel, Some((&epoch, offset))).await;
        client = back;
        assert_eq!(
            (reply["was_recovering"].clone(), reply["recovered"].clone()),
            (json!(true), json!(true)),
            "round {round}: {reply}"
        );
        assert_eq!(reply["epoch"], json!(epoch), "round {round}: {reply}");
        // What it missed, in the reply and then live if any was still on
        // its way through Redis: each once, in order.
        let mut missed: Vec<Value> = reply["publications"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|p| json!({"push": {"pub": p}}))
            .collect();
        while missed.len() < 3 {
            missed.push(next_json(&mut client).await);
        }
        (n, offset) = batch(&missed, (n, offset), round);
    }
    assert_eq!(n, 12 * 6);
    // A fresh subscribe on either node: the same epoch, at the top.
    for node in nodes {
        let (_client, reply) = subscribe(node, channel, None).await;
        assert_eq!(
            (reply["epoch"].clone(), reply["offset"].clone()),
            (json!(epoch), json!(offset)),
            "{reply}"
        );
    }
}

const SECRET: &str = "presence-secret";

/// A connection token for `user`, whose info names it and its node.
fn token(user: &str, node: &str) -> String {
    let claims = json!({"sub": user, "info": {"name": user, "node": node}});
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

/// A client of `node` as `user`, subscribed to `channel`: the client, and
/// how presence shows it.
async fn present(node: SocketAddr, name: &str, user: &str, channel: &str) -> (Ws2, String, Value) {
    let url = format!("ws://{node}/connection/websocket");
    let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let batch = format!(
        "{}\n{}",
        json!({"id": 1, "connect": {"token": token(user, name)}}),
        json!({"id": 2, "subscribe": {"channel": channel}})
    );
    client.send(Ws::text(batch)).await.unwrap();
    let connect = next_json(&mut client).await;
    let id = connect["connect"]["client"]
        .as_str()
        .unwrap_or_else(|| panic!("not connected: {connect}"))
        .to_owned();
    let subscribed = next_json(&mut client).await;
    assert_eq!(subscribed["id"], 2, "{subscribed}");
    assert!(subscribed.get("error").is_none(), "{subscribed}");
    let shown = json!({
        "user": user,
        "client": id,
        "conn_info": {"name": user, "node": name},
    });
    (client, id, shown)
}

/// `method` (`presence` or `presence_stats`) of `channel` asked by a
/// client, as command `id`: its result.
async fn ask(client: &mut Ws2, id: u64, method: &str, channel: &str) -> Value {
    let command = json!({"id": id, method: {"channel": channel}});
    client.send(Ws::text(command.to_string())).await.unwrap();
    let reply = next_json(client).await;
    assert_eq!(reply["id"], id, "{reply}");
    reply[method].clone()
}

/// What each asker sees of `channel`: (presence, stats) from each client
/// in `askers` and each node's HTTP API.
async fn views(
    askers: &mut [&mut Ws2],
    nodes: &[SocketAddr],
    channel: &str,
) -> Vec<(Value, Value)> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);
    let mut seen = Vec::new();
    for client in askers.iter_mut() {
        let id = NEXT.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        let presence = ask(client, id, "presence", channel).await;
        let stats = ask(client, id + 1, "presence_stats", channel).await;
        seen.push((presence["presence"].clone(), stats));
    }
    for &node in nodes {
        let body = json!({"channel": channel});
        let presence = centrifugo::api(node, "k", "presence", &body).await;
        let stats = centrifugo::api(node, "k", "presence_stats", &body).await;
        seen.push((
            presence["result"]["presence"].clone(),
            stats["result"].clone(),
        ));
    }
    seen
}

/// Asks until every asker sees exactly `clients` (shown as `present`
/// shows them) and `users` distinct users, within `within`.
async fn until_seen(
    askers: &mut [&mut Ws2],
    nodes: &[SocketAddr],
    clients: &[&(String, Value)],
    users: u64,
    within: Duration,
) {
    let mut presence = json!({});
    for (id, shown) in clients {
        presence[id.as_str()] = shown.clone();
    }
    let stats = json!({"num_clients": clients.len(), "num_users": users});
    let want = vec![(presence, stats); askers.len() + nodes.len()];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = views(askers, nodes, "room").await;
        if seen == want {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            assert_eq!(seen, want, "not seen within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_every_nodes_and_forgets_a_dead_node() {
    let port = free_port();
    let _redis = redis_server(port);
    wait_for_port(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let common = [
        "--redis",
        &url,
        "--presence",
        "--api-key",
        "k",
        "--jwt-secret",
        SECRET,
    ];
    let (_a, a) = start_example("centrifugo_compat", &common).await;
    let b_args = [&common[..], &["--backend", second_backend()]].concat();
    let (mut b_node, b) = start_example("centrifugo_compat", &b_args).await;

    // Four users' five clients: alice on both nodes.
    let (mut alice_a, id, shown) = present(a, "a", "alice", "room").await;
    let alice_a_is = (id, shown);
    let (mut bob_a, id, shown) = present(a, "a", "bob", "room").await;
    let bob_a_is = (id, shown);
    let (mut alice_b, id, shown) = present(b, "b", "alice", "room").await;
    let alice_b_is = (id, shown);
    let (carol_b, id, shown) = present(b, "b", "carol", "room").await;
    let carol_b_is = (id, shown);
    let (_dave_b, id, shown) = present(b, "b", "dave", "room").await;
    let dave_b_is = (id, shown);

    // What no node wrote, under a live writer: left out, never shown.
    let till = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 600_000;
    let till = till.to_string();
    command(
        port,
        &[b"HSET", b"rapidws:{room}:w", b"evil", till.as_bytes()],
    )
    .await;
    for (field, value) in [(&b"evil:x"[..], &b"not a client"[..]), (b"nowriter", b"x")] {
        command(port, &[b"HSET", b"rapidws:{room}:p", field, value]).await;
    }

    let nodes = [a, b];
    let every = [&alice_a_is, &bob_a_is, &alice_b_is, &carol_b_is, &dave_b_is];
    let soon = Duration::from_secs(10);
    until_seen(&mut [&mut alice_a, &mut alice_b], &nodes, &every, 4, soon).await;

    // Bob unsubscribes on node a: gone on both.
    bob_a
        .send(Ws::text(
            json!({"id": 3, "unsubscribe": {"channel": "room"}}).to_string(),
        ))
        .await
        .unwrap();
    assert_eq!(next_json(&mut bob_a).await["id"], 3);
    let left = [&alice_a_is, &alice_b_is, &carol_b_is, &dave_b_is];
    until_seen(&mut [&mut alice_a, &mut alice_b], &nodes, &left, 3, soon).await;

    // Carol disconnects from node b: gone on both.
    drop(carol_b);
    let left = [&alice_a_is, &alice_b_is, &dave_b_is];
    until_seen(&mut [&mut alice_a, &mut alice_b], &nodes, &left, 2, soon).await;

    // Node b is killed: its clients drop out of node a's answer once its
    // entry lapses (written every 5 s, good for 15 s).
    b_node.0.kill().unwrap();
    b_node.0.wait().unwrap();
    let left = [&alice_a_is];
    let lapse = Duration::from_secs(30);
    until_seen(&mut [&mut alice_a], &[a], &left, 1, lapse).await;
}
