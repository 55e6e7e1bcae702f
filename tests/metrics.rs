//! Metrics: the examples started with `--metrics`
//! serve `GET /metrics` in the Prometheus text format, and after known
//! traffic from independent clients (tokio-tungstenite, raw HTTP) the
//! counters say what the clients did and agree with the bus's `/stats`.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;

/// The samples of a Prometheus text page: `name{a="1",b="2"}` (labels
/// sorted) to value.
fn samples(page: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in page.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("`name value`");
        let key = match key.split_once('{') {
            Some((name, labels)) => {
                let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                labels.sort_unstable();
                format!("{name}{{{}}}", labels.join(","))
            }
            None => key.to_owned(),
        };
        samples.insert(key, value.parse().expect("a number"));
    }
    samples
}

/// One sample's value (0 if the page does not have it: a counter never
/// touched). `labels` sorted, as [`samples`] keeps them.
fn value(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

/// `GET path` with `Connection: close`; the body, after checking the 200.
async fn get(addr: SocketAddr, path: &str) -> String {
    let response = http_exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let (head, body) = response.split_once("\r\n\r\n").expect("a whole response");
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    body.to_owned()
}

/// Sends `count` texts and reads their echoes.
async fn echo_round(client: &mut Client, count: usize) {
    for i in 0..count {
        let text = format!("message {i}");
        client.send(WsMessage::text(text.clone())).await.unwrap();
        assert_eq!(next(client).await, WsMessage::text(text));
    }
}

/// Closes with `code` and waits for the server's reply.
async fn close_with(mut client: Client, code: u16) {
    client
        .close(Some(CloseFrame {
            code: WsCloseCode::from(code),
            reason: "bye".into(),
        }))
        .await
        .unwrap();
    while let Some(Ok(_)) = client.next().await {}
}

/// Scrapes until `ready` holds of the samples (counts land as the server
/// loops get to them), at most 5 s; returns the last scrape.
async fn scrape_until(
    addr: SocketAddr,
    path: &str,
    ready: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let mut last = BTreeMap::new();
    for _ in 0..100 {
        last = samples(&get(addr, path).await);
        if ready(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}

async fn echo_counts(backend: &str) {
    let (_child, addr) = start_example("echo", &["--backend", backend, "--metrics"]).await;
    let url = format!("ws://{addr}/");
    let connect = || async {
        tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap()
            .0
    };
    let (mut a, mut b, mut c) = (connect().await, connect().await, connect().await);
    echo_round(&mut a, 10).await;
    echo_round(&mut b, 7).await;
    echo_round(&mut c, 3).await;
    close_with(a, 1000).await;
    close_with(b, 4001).await;
    // (4001 is counted as 4xxx: the peer picks the code, so its label is
    // the range.)
    // Two refused upgrades: no key (400), a page of another origin (403).
    let no_key = http_exchange(
        addr,
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n",
    )
    .await;
    assert!(no_key.starts_with("HTTP/1.1 400"), "{no_key}");
    let other_origin = http_exchange(
        addr,
        &upgrade_head(
            "GET",
            "/",
            "HTTP/1.1",
            "Sec-WebSocket-Version: 13\r\nOrigin: http://evil.example\r\n",
        ),
    )
    .await;
    assert!(other_origin.starts_with("HTTP/1.1 403"), "{other_origin}");

    let d = format!("driver=\"{backend}\"");
    // (Counts are added once per loop step: see the bus's test.)
    let got = scrape_until(addr, "/metrics", |s| {
        value(s, &format!("rapidws_connections_open{{{d}}}")) == 1.0
            && value(s, &format!("rapidws_closes_total{{code=\"4xxx\",{d}}}")) == 1.0
            && value(s, &format!("rapidws_messages_sent_total{{{d}}}")) == 20.0
    })
    .await;
    let at = |key: String| value(&got, &key);
    assert_eq!(
        at(format!("rapidws_connections_total{{{d}}}")),
        3.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_connections_open{{{d}}}")),
        1.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_messages_received_total{{{d}}}")),
        20.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_messages_sent_total{{{d}}}")),
        20.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_closes_total{{code=\"1000\",{d}}}")),
        1.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_closes_total{{code=\"4xxx\",{d}}}")),
        1.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!(
            "rapidws_handshake_rejections_total{{{d},reason=\"bad_request\"}}"
        )),
        1.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!(
            "rapidws_handshake_rejections_total{{{d},reason=\"origin\"}}"
        )),
        1.0,
        "{got:#?}"
    );
    assert_eq!(
        at(format!("rapidws_queue_full_total{{{d}}}")),
        0.0,
        "{got:#?}"
    );
    // Each client frame of "message N" is 6 + 9 bytes (masked, short), each
    // echo 2 + 9; the bytes also hold the handshakes and closes.
    let frames_in = 20.0 * 15.0;
    let frames_out = 20.0 * 11.0;
    assert!(
        at(format!("rapidws_bytes_received_total{{{d}}}")) > frames_in,
        "{got:#?}"
    );
    assert!(
        at(format!("rapidws_bytes_sent_total{{{d}}}")) > frames_out,
        "{got:#?}"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_metrics_count_what_the_clients_did_on_both_backends() {
    echo_counts("tokio").await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    echo_counts("uring").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_metrics_agree_with_its_stats_and_time_deliveries() {
    let (_child, addr) = start_example("notify_bus", &["--metrics"]).await;
    let mut subscribers = Vec::new();
    for _ in 0..3 {
        let url = format!("ws://{addr}/ws?topics=news");
        subscribers.push(tokio_tungstenite::connect_async(url).await.unwrap().0);
    }
    // Subscribed once the bus counts three on the topic.
    let occupied = async {
        loop {
            if get(addr, "/topics/news")
                .await
                .contains("\"subscribers\":3")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), occupied)
        .await
        .expect("three subscribers within 5 s");
    for i in 0..20 {
        let response = http_exchange(
            addr,
            &format!(
                "POST /publish/news HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\
                 Content-Length: {}\r\n\r\nitem {i:02}",
                "item 00".len()
            ),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    for subscriber in &mut subscribers {
        for i in 0..20 {
            assert_eq!(
                next(subscriber).await,
                WsMessage::text(format!("item {i:02}"))
            );
        }
    }
    // Messages are counted when written and added once per loop step: a
    // scrape served by one group can come before another group's step,
    // which wrote the last of them, has ended. (Seen in the gate: 58 of
    // 60 once.)
    let got = scrape_until(addr, "/metrics", |s| {
        value(s, "rapidws_pubsub_delivered_total") == 60.0
            && value(s, "rapidws_pubsub_delivery_seconds_count") >= 1.0
            && value(s, "rapidws_messages_sent_total{driver=\"tokio\"}") == 60.0
    })
    .await;
    let stats: serde_json::Value = serde_json::from_str(&get(addr, "/stats").await).unwrap();
    assert_eq!(
        value(&got, "rapidws_pubsub_published_total"),
        20.0,
        "{got:#?}"
    );
    assert_eq!(stats["published"], 20, "{stats}");
    assert_eq!(
        value(&got, "rapidws_pubsub_delivered_total"),
        60.0,
        "{got:#?}"
    );
    assert_eq!(stats["delivered"], 60, "{stats}");
    assert_eq!(
        value(&got, "rapidws_messages_sent_total{driver=\"tokio\"}"),
        60.0
    );
    assert_eq!(
        value(&got, "rapidws_connections_open{driver=\"tokio\"}"),
        3.0
    );
    // Every 64th publish per thread is timed, the first of each included:
    // at least one, each well under the 10 s a test allows.
    let timed = value(&got, "rapidws_pubsub_delivery_seconds_count");
    assert!(timed >= 1.0, "{got:#?}");
    let total = value(&got, "rapidws_pubsub_delivery_seconds_sum");
    assert!(total > 0.0 && total < 10.0 * timed, "{got:#?}");
    let dropped: f64 = got
        .iter()
        .filter(|(key, _)| key.starts_with("rapidws_pubsub_dropped_total"))
        .map(|(_, value)| value)
        .sum();
    assert_eq!(dropped, 0.0, "{got:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_echo_metrics_count_both_apis() {
    let (_child, addr) = start_example("axum_echo", &["--metrics"]).await;
    for path in ["/ws", "/stream"] {
        let url = format!("ws://{addr}{path}");
        let mut client = tokio_tungstenite::connect_async(url).await.unwrap().0;
        echo_round(&mut client, 5).await;
        close_with(client, 1000).await;
    }
    let d = "driver=\"stream\"";
    // Message counts are tallied per thread and added at the end of each
    // driver step, the close counted at once: wait for both (a count
    // lost, not late, still fails below after 5 s).
    let got = scrape_until(addr, "/metrics", |s| {
        value(s, &format!("rapidws_closes_total{{code=\"1000\",{d}}}")) == 2.0
            && value(s, &format!("rapidws_messages_received_total{{{d}}}")) == 10.0
            && value(s, &format!("rapidws_messages_sent_total{{{d}}}")) == 10.0
    })
    .await;
    assert_eq!(
        value(&got, &format!("rapidws_connections_total{{{d}}}")),
        2.0,
        "{got:#?}"
    );
    assert_eq!(
        value(&got, &format!("rapidws_connections_open{{{d}}}")),
        0.0,
        "{got:#?}"
    );
    assert_eq!(
        value(&got, &format!("rapidws_messages_received_total{{{d}}}")),
        10.0,
        "{got:#?}"
    );
    assert_eq!(
        value(&got, &format!("rapidws_messages_sent_total{{{d}}}")),
        10.0,
        "{got:#?}"
    );
    assert_eq!(
        value(&got, &format!("rapidws_closes_total{{code=\"1000\",{d}}}")),
        2.0
    );
}

#[tokio::test]
async fn without_the_flag_there_is_no_metrics_page() {
    let (_child, addr) = start_example("echo", &["--http-fallback"]).await;
    let response = http_exchange(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
}

/// The bus's byte budgets in the metrics: what its topics and history
/// hold and allow (set once a second), against `/stats`'s `"usage"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_budgets_are_in_the_metrics() {
    let args = [
        "--metrics",
        "--history",
        "10",
        "--max-history-bytes",
        "1000000",
    ];
    let (_child, addr) = start_example("notify_bus", &args).await;
    for topic in 0..5 {
        let response = http_exchange(
            addr,
            &format!(
                "POST /publish/t{topic} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\
                 Content-Length: 5\r\n\r\nhello"
            ),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    let history = "rapidws_budget_bytes{budget=\"pubsub_history\"}";
    let got = scrape_until(addr, "/metrics", |s| {
        value(s, history) > 0.0 && value(s, "rapidws_pubsub_topics") == 5.0
    })
    .await;
    let stats: serde_json::Value = serde_json::from_str(&get(addr, "/stats").await).unwrap();
    let usage = &stats["usage"];
    assert_eq!(value(&got, "rapidws_pubsub_topics"), 5.0, "{got:#?}");
    assert_eq!(
        value(&got, history),
        usage["history_bytes"].as_f64().unwrap(),
        "{got:#?} {usage}"
    );
    assert_eq!(
        value(
            &got,
            "rapidws_budget_limit_bytes{budget=\"pubsub_history\"}"
        ),
        1_000_000.0
    );
    assert_eq!(
        value(&got, "rapidws_budget_bytes{budget=\"pubsub_topics\"}"),
        usage["topic_bytes"].as_f64().unwrap()
    );
}

/// The router's counts (the echo example's `--route`, on both backends):
/// connections routed to the server's entrance, and one no route takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_counts_what_it_routed_and_what_nobody_took() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for backend in ["tokio", "uring"] {
        let args = ["--backend", backend, "--metrics", "--route"];
        let (_child, addr) = start_example("echo", &args).await;
        let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
            .await
            .unwrap();
        echo_round(&mut client, 3).await;
        close_with(client, 1000).await;
        // Not HTTP/1: closed by the router, unanswered.
        let mut junk = tokio::net::TcpStream::connect(addr).await.unwrap();
        junk.write_all(&[0u8; 16]).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), junk.read_to_end(&mut answer));
        assert!(matches!(read.await, Ok(Ok(0))), "{backend}: {answer:?}");
        let outcome = |name: &str| format!("rapidws_route_connections_total{{outcome=\"{name}\"}}");
        let got = scrape_until(addr, "/metrics", |s| value(s, &outcome("unclaimed")) >= 1.0).await;
        assert_eq!(value(&got, &outcome("unclaimed")), 1.0, "{backend}");
        // The WebSocket and the scrapes themselves.
        assert!(value(&got, &outcome("routed")) >= 2.0, "{backend}: {got:?}");
        let received = format!("rapidws_messages_received_total{{driver=\"{backend}\"}}");
        assert_eq!(
            value(&got, &received),
            3.0,
            "{backend}: served by its own loops"
        );
    }
}
