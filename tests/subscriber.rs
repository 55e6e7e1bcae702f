//! `rapidws::client::Subscriber` against the notify_bus example (started as
//! its command line gives it), through a TCP proxy the test cuts: every
//! publication arrives exactly once and in order across many cuts, with no
//! discontinuity; a cut longer than the bus's history is a discontinuity,
//! then live deliveries; `stop` closes with 1000. The same over wss
//! (resumed across cuts) and HTTP/3, with the bus in this process. And the
//! `subscribe` example prints `TOPIC EPOCH:OFFSET DATA` lines and exits 0
//! on SIGINT.
#![cfg(all(feature = "bus", feature = "client", feature = "socket"))]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::cut_proxy::CutProxy;
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
    // The cuts were felt (those during a backoff cost no connection).
    assert!(connects >= 5, "{connects} connections over {cuts} cuts");
    subscriber.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_longer_than_history_is_a_discontinuity_then_live() {
    let (_bus, bus) = start_example("notify_bus", &["--history", "5"]).await;
    let proxy = CutProxy::start(bus).await;
    let mut subscriber = subscriber(&proxy, &["a"]);
    let last = warm_up(bus, &mut subscriber, &["a"]).await["a"];

    proxy.hold();
    for n in 0..50 {
        publish(bus, "a", &format!("missed {n}")).await;
    }
    proxy.release();
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

/// A topic that had no delivery before the cut is resumed from where the
/// bus said it started (`starts=1`): what was published on it during the
/// cut arrives. (Another subscriber keeps the topic: one that nobody holds
/// and that kept nothing is forgotten, and comes back in a new epoch, which
/// is a discontinuity.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_without_deliveries_resumes_from_where_it_started() {
    let (_bus, bus) = start_example("notify_bus", &["--history", "100"]).await;
    let proxy = CutProxy::start(bus).await;
    let (_keeper, _) = tokio_tungstenite::connect_async(format!("ws://{bus}/ws?topics=quiet"))
        .await
        .unwrap();
    let mut subscriber = subscriber(&proxy, &["quiet", "busy"]);
    // Subscribed to both once "busy" delivers (one connection, one query).
    warm_up(bus, &mut subscriber, &["busy"]).await;
    proxy.hold();
    let mut missed = Vec::new();
    for n in 0..5 {
        missed.push(publish(bus, "quiet", &format!("while away {n}")).await);
    }
    proxy.release();
    let mut connects = 0;
    let mut got = Vec::new();
    while got.len() < missed.len() {
        match next_news(&mut subscriber, &mut connects).await {
            Event::Delivery {
                topic, position, ..
            } if topic == "quiet" => got.push(position),
            Event::Delivery { .. } => {}
            other => panic!("deliveries only, got {other:?}"),
        }
    }
    assert_eq!(got, missed);
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

/// The bus in this process on wss (tokio, through the cutting proxy) and
/// on HTTP/3: the subscriber resumes over wss across cuts, and receives
/// over HTTP/3.
#[cfg(all(feature = "rustls", feature = "http3", feature = "tokio"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_speaks_wss_and_http3() {
    use rapidws::bus::Bus;
    use rapidws::client::Client;
    use rapidws::pubsub::{History, PubSub};
    use rapidws::{Config, Message};

    let pubsub = PubSub::builder()
        .history(History::new(1000, Duration::from_secs(60)))
        .build();
    let bus = Bus::builder(pubsub.clone()).build();
    let wss = rapidws::tokio::Server::bind("127.0.0.1:0", bus.clone(), Config::default())
        .await
        .unwrap()
        .tls(common::tls::server_config());
    let wss_addr = wss.local_addr().unwrap();
    tokio::spawn(wss.serve());
    let h3 = rapidws::stream::Server::new(bus, Config::default());
    let (endpoint, h3_addr) = common::tls::h3_endpoint();
    tokio::spawn(async move { rapidws::h3::serve(endpoint, &h3).await });

    let proxy = CutProxy::start(wss_addr).await;
    let fast = Backoff {
        base: Duration::from_millis(20),
        cap: Duration::from_millis(200),
    };
    let client = Client::new(Config::default()).tls(common::tls::client_config());
    let mut over_tls = Subscriber::builder(format!("wss://localhost:{}/ws", proxy.addr.port()))
        .topics(["t"])
        .backoff(fast)
        .client(client.clone())
        .start();
    let mut over_quic = Subscriber::builder(format!("wss://localhost:{}/ws", h3_addr.port()))
        .topics(["t"])
        .backoff(fast)
        .client(client.http3())
        .start();
    // Both subscribed once a publish reaches both.
    let (mut tls_last, mut quic_last) = (None, None);
    while tls_last.is_none() || quic_last.is_none() {
        pubsub.publish("t", Message::Text("warm-up"));
        for (subscriber, last) in [
            (&mut over_tls, &mut tls_last),
            (&mut over_quic, &mut quic_last),
        ] {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
            while let Ok(Some(event)) = tokio::time::timeout_at(deadline, subscriber.next()).await {
                if let Event::Delivery { position, .. } = event {
                    *last = Some(position);
                }
            }
        }
    }
    let mut published = Vec::new();
    for n in 0..200 {
        published.push(
            pubsub
                .publish("t", Message::Text(&format!("m{n}")))
                .position
                .unwrap(),
        );
        if n % 20 == 0 {
            proxy.cut();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    for (name, subscriber, last) in [
        ("wss", &mut over_tls, tls_last.unwrap()),
        ("http3", &mut over_quic, quic_last.unwrap()),
    ] {
        let mut connects = 0;
        let mut got = Vec::new();
        while got.last() != published.last() {
            match next_news(subscriber, &mut connects).await {
                Event::Delivery { position, .. } => got.push(position),
                other => panic!("{name}: only deliveries, got {other:?}"),
            }
        }
        let expected: Vec<Position> = published
            .iter()
            .copied()
            .filter(|p| p.offset > last.offset)
            .collect();
        assert_eq!(got, expected, "{name}: each once, in order");
        if name == "wss" {
            // Cuts while it waits to reconnect cost nothing more.
            assert!(connects >= 2, "wss: resumed after a cut ({connects})");
        }
    }
    over_tls.stop().await;
    over_quic.stop().await;
}
