//! The bus mounted on an axum router (`Bus::router`) beside the app's own
//! route, over real sockets with tokio-tungstenite as the subscriber:
//! subscribe with positions, publish over HTTP with the publish token,
//! resume with `since=` exactly once, and the refusals the standalone
//! servers give (401 without the token, 413 past the body limit, 400 for a
//! bad `since`, 403 for a page of another origin).
#![cfg(all(feature = "bus", feature = "axum"))]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rapidws::bus::{Bus, Incoming};
use rapidws::pubsub::{History, PubSub};

const TOKEN: &str = "publish-token-0123456789";

/// An axum app with `/` of its own and the bus merged in; its address.
async fn app() -> SocketAddr {
    let pubsub = PubSub::builder()
        .history(History::new(100, Duration::from_secs(60)))
        .build();
    let bus = Bus::builder(pubsub).publish_token(TOKEN).build();
    let config = rapidws::Config::default().max_http_body_size(1024);
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the app's own page" }))
        .merge(bus.router(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn publish(addr: SocketAddr, topic: &str, body: &str, token: &str) -> String {
    let head = format!(
        "POST /publish/{topic} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    http_exchange(addr, &head).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_on_a_router_subscribes_publishes_and_resumes() {
    let addr = app().await;
    let page = http_exchange(
        addr,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(page.ends_with("the app's own page"), "{page}");

    let url = format!("ws://{addr}/ws?topics=news&positions=1");
    let (mut subscriber, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    // Subscribed once the first publish reaches it.
    let mut first = String::new();
    for _ in 0..100 {
        first = publish(addr, "news", "one", TOKEN).await;
        if first.contains("\"delivered\":1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let got = deliveries(&mut subscriber, 1).await;
    let (epoch, offset) = (got[0].0.clone(), got[0].1);
    assert_eq!(got[0].2, "one");
    drop(subscriber);

    for n in 0..5 {
        let answer = publish(addr, "news", &format!("missed {n}"), TOKEN).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let url = format!("ws://{addr}/ws?positions=1&since=news:{epoch}:{offset}");
    let (mut resumed, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let replayed = deliveries(&mut resumed, 5).await;
    let offsets: Vec<u64> = replayed.iter().map(|d| d.1).collect();
    assert_eq!(offsets, (offset + 1..offset + 6).collect::<Vec<_>>());
    let message = next(&mut resumed).await;
    let Ok(Incoming::Recovery { topic, recovered }) = message.to_text().unwrap().parse() else {
        panic!("the recovery: {message:?}")
    };
    assert_eq!((topic.as_str(), recovered), ("news", true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_refuses_as_the_servers_do() {
    let addr = app().await;
    let refused = publish(addr, "news", "x", "guess-guess-guess-guess").await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        refused.to_lowercase().contains("www-authenticate: bearer"),
        "{refused}"
    );
    let large = publish(addr, "news", &"x".repeat(2000), TOKEN).await;
    assert!(large.starts_with("HTTP/1.1 413"), "{large}");
    let stats = http_exchange(
        addr,
        "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        stats.starts_with("HTTP/1.1 401"),
        "the counters need the token: {stats}"
    );
    let version = "Sec-WebSocket-Version: 13\r\n";
    let head = upgrade_head("GET", "/ws?since=news", "HTTP/1.1", version);
    let bad = http_exchange(addr, &head).await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.contains("since is <topic>:<epoch>:<offset>"), "{bad}");
    let foreign = format!("{version}Origin: https://elsewhere.example\r\n");
    let head = upgrade_head("GET", "/ws?topics=news", "HTTP/1.1", &foreign);
    let foreign = http_exchange(addr, &head).await;
    assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
    let plain = http_exchange(
        addr,
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(plain.starts_with("HTTP/1.1 426"), "{plain}");
}
