//! `rapidws::client::Subscriber` against the notify_bus example (started as
//! its command line gives it), through a TCP proxy the test cuts: every
//! publication arrives exactly once and in order across many cuts, with no
//! discontinuity; a cut longer than the bus's history is a discontinuity,
//! then live deliveries; `stop` closes with 1000. And the `subscribe`
//! example prints `TOPIC EPOCH:OFFSET DATA` lines and exits 0 on SIGINT.
#![cfg(all(feature = "bus", feature = "client", feature = "socket"))]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::cut::CutProxy;
use common::*;
use rapidws::bus::Data;
use rapidws::client::Subscriber;
use rapidws::client::subscriber::{Backoff, Event};
use rapidws::pubsub::Position;

/// Publishes `body` on `topic`; the position the bus gave it.
async fn publish(bus: SocketAddr, topic: &str, body: &str) -> Position {
    let head = format!(
        "POST /publish/{topic} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = http_exchange(bus, &head).await;
    let json = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let value: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let position = format!("{}:{}", value["epoch"].as_str().unwrap(), value["offset"]);
    position.parse().unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// A subscriber through `proxy` to `topics`, reconnecting quickly.
fn subscriber(proxy: &CutProxy, topics: &[&str]) -> Subscriber {
    let backoff = Backoff {
        base: Duration::from_millis(20),
        cap: Duration::from_millis(200),
    };
    Subscriber::builder(format!("ws://{}/ws", proxy.addr))
        .topics(topics.iter().copied())
        .backoff(backoff)
        .start()
}

/// The next event but connection news, within 20 s; `connects` counts
/// the connections made meanwhile.
async fn next_news(subscriber: &mut Subscriber, connects: &mut usize) -> Event {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), subscriber.next())
            .await
            .expect("an event within 20 s")
            .expect("the subscriber runs");
        match event {
            Event::Connected => *connects += 1,
            Event::Disconnected { .. } => {}
            event => return event,
        }
    }
}

/// Publishes on each topic until the subscriber has a delivery on each
/// (it subscribes from "now": what came before is not its).
async fn warm_up(
    bus: SocketAddr,
    subscriber: &mut Subscriber,
    topics: &[&str],
) -> BTreeMap<String, Position> {
    let mut last = BTreeMap::new();
    while last.len() < topics.len() {
        for topic in topics {
            if !last.contains_key(*topic) {
                publish(bus, topic, "warm-up").await;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, subscriber.next()).await {
            if let Event::Delivery {
                topic, position, ..
            } = event
            {
                last.insert(topic, position);
            }
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publication_arrives_once_and_in_order_across_cuts() {
    let (_bus, bus) = start_example("notify_bus", &["--history", "10000"]).await;
    let proxy = CutProxy::start(bus).await;
    let topics = ["a", "b:c"];
    let mut subscriber = subscriber(&proxy, &topics);
    let mut last = warm_up(bus, &mut subscriber, &topics).await;

    // Publish 800, spread over 30 cuts of every connection (and more
    // while publishing goes on).
    let publishing = tokio::spawn(async move {
        let mut sent = Vec::new();
        for n in 0..800 {
            let topic = if n % 2 == 0 { "a" } else { "b%3Ac" };
            let position = publish(bus, topic, &format!("m{n}")).await;
            sent.push((topic.replace("%3A", ":"), position, format!("m{n}")));
            if n % 20 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        sent
    });
    let mut cuts = 0;
    while cuts < 30 || !publishing.is_finished() {
        tokio::time::sleep(Duration::from_millis(40)).await;
        proxy.cut();
        cuts += 1;
    }
    let sent = publishing.await.unwrap();

    let mut received = Vec::new();
    let mut connects = 0;
    while received.len() < sent.len() {
        match next_news(&mut subscriber, &mut connects).await {
            Event::Delivery {
                topic,
                position,
                data: Data::Text(text),
            } => {
                let previous = last.insert(topic.clone(), position).unwrap();
                assert_eq!(position.epoch, previous.epoch, "{topic}");
                assert_eq!(
                    position.offset,
                    previous.offset + 1,
                    "{topic}: in order, once"
                );
                received.push((topic, position, text));
            }
            other => panic!("only deliveries, got {other:?} after {}", received.len()),
        }
    }
    let mut expected = sent.clone();
    expected.sort_by(|x, y| (&x.0, x.1.offset).cmp(&(&y.0, y.1.offset)));
    received.sort_by(|x, y| (&x.0, x.1.offset).cmp(&(&y.0, y.1.offset)));
    assert_eq!(received, expected);
    // The cuts were felt: most of them cost a connection.
    assert!(connects >= 10, "{connects} connections over {cuts} cuts");
    subscriber.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_longer_than_history_is_a_discontinuity_then_live() {
    let (_bus, bus) = start_example("notify_bus", &["--history", "5"]).await;
    let proxy = CutProxy::start(bus).await;
    let mut subscriber = subscriber(&proxy, &["a"]);
    let last = warm_up(bus, &mut subscriber, &["a"]).await["a"];

    proxy.set_away(true);
    proxy.cut();
    for n in 0..50 {
        publish(bus, "a", &format!("missed {n}")).await;
    }
    proxy.set_away(false);
    let mut connects = 0;
    assert_eq!(
        next_news(&mut subscriber, &mut connects).await,
        Event::Discontinuity { topic: "a".into() }
    );
    // Then what history still held (after the gap), and live ones.
    let live = publish(bus, "a", "live").await;
    loop {
        match next_news(&mut subscriber, &mut connects).await {
            Event::Delivery { position, data, .. } => {
                assert!(
                    position.offset > last.offset + 1,
                    "after the gap: {position}"
                );
                if position == live {
                    assert_eq!(data, Data::Text("live".into()));
                    break;
                }
            }
            other => panic!("a delivery, got {other:?}"),
        }
    }
    subscriber.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscribe_example_prints_deliveries_and_exits_on_sigint() {
    let (_bus, bus) = start_example("notify_bus", &["--history", "100"]).await;
    let mut child = std::process::Command::new(example("subscribe"))
        .arg(format!("ws://{bus}/ws"))
        .args(["--topics", "news,x y"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let child = Child(child);
    // Subscribed once a publish reaches it.
    let first = loop {
        let position = publish(bus, "news", "hello there").await;
        if let Ok(Some(line)) = tokio::time::timeout(Duration::from_millis(300), lines.recv()).await
        {
            break (position, line);
        }
    };
    assert_eq!(first.1, format!("news {} hello there", first.0));
    let position = publish(bus, "x%20y", "two words").await;
    let line = tokio::time::timeout(Duration::from_secs(10), lines.recv())
        .await
        .unwrap();
    assert_eq!(
        line.as_deref(),
        Some(format!("x y {position} two words").as_str())
    );

    let mut child = child;
    let pid = child.0.id().to_string();
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status();
    assert!(interrupted.unwrap().success());
    assert!(
        exits_zero(&mut child, Duration::from_secs(10)).await,
        "exit 0 on SIGINT"
    );
}
