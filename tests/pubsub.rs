//! Pub/sub on every backend, with tokio-tungstenite clients: delivery to
//! exactly the subscribers, order per publisher, unsubscribe and
//! disconnect, publishing from other threads and from callbacks (except
//! the sender), a connection's topics, and a subscriber that does not read
//! under each overflow policy. Positions and history: subscribers resuming
//! while a publisher runs at full speed get every publication after their
//! position exactly once and in order; a position older than history, or
//! of another epoch, is told it was not recovered; the latest publication
//! on subscribe.
#![cfg(feature = "pubsub")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Client, Recorder, next, send_text};
use rapidws::pubsub::{
    Envelope, History, Overflow, Position, PubSub, Publication, PublishOptions, Start, Subscribe,
};
use rapidws::{
    Accept, CloseCode, Config, Conn, Handler, Message, OwnedMessage, Reject, Request, ServerHandler,
};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite;

/// A handler that takes commands: `sub:T`, `unsub:T`, `pub:T:text`,
/// `pubx:T:text` (to everyone but the sender), and `topics` (answered with
/// the connection's topics, sorted, comma-separated). It answers each
/// `sub`/`unsub` with `ok` (`again` for a repeated `sub`, `error: ...` for
/// a refused one), so a client knows its subscription is in.
///
/// With positions (deliveries `T o<offset> <payload>`, signals
/// `T r<true|false>`): `subp:T` from now, `latest:T`, and
/// `since:T:<epoch>:<offset>`; each answered `ok` once it is in.
struct Bus {
    pubsub: PubSub,
}

/// The positions tests' envelope.
struct Marked;

impl Envelope for Marked {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let payload = std::str::from_utf8(publication.payload()).unwrap();
        let (topic, offset) = (publication.topic(), publication.position().offset);
        OwnedMessage::Text(format!("{topic} o{offset} {payload}"))
    }

    fn recovery(&self, topic: &str, recovered: bool) -> Option<OwnedMessage> {
        Some(OwnedMessage::Text(format!("{topic} r{recovered}")))
    }
}

impl Handler for Bus {
    type State = ();

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let Message::Text(text) = message else {
            return;
        };
        let (command, rest) = text.split_once(':').unwrap_or((text, ""));
        match command {
            "sub" => {
                let answer = match self.pubsub.subscribe(conn, rest) {
                    Ok(true) => "ok".to_owned(),
                    Ok(false) => "again".to_owned(),
                    Err(error) => format!("error: {error}"),
                };
                conn.send_text(&answer).unwrap();
            }
            "unsub" => {
                assert!(self.pubsub.unsubscribe(conn, rest));
                conn.send_text("ok").unwrap();
            }
            "pub" | "pubx" => {
                let (topic, body) = rest.split_once(':').unwrap();
                if command == "pub" {
                    self.pubsub.publish(topic, Message::Text(body));
                } else {
                    self.pubsub.publish_except(topic, Message::Text(body), conn);
                }
            }
            "subp" | "latest" | "since" => {
                let (topic, start) = match command {
                    "subp" => (rest, Start::Now),
                    "latest" => (rest, Start::Latest),
                    _ => {
                        let (topic, position) = rest.split_once(':').unwrap();
                        (topic, Start::After(position.parse().unwrap()))
                    }
                };
                let how = Subscribe::new().start(start).envelope(Arc::new(Marked));
                self.pubsub.subscribe_with(conn, topic, &how).unwrap();
                conn.send_text("ok").unwrap();
            }
            "topics" => {
                let mut topics: Vec<String> = self
                    .pubsub
                    .topics(conn)
                    .iter()
                    .map(|t| t.to_string())
                    .collect();
                topics.sort();
                conn.send_text(&topics.join(",")).unwrap();
            }
            other => panic!("unknown command {other}"),
        }
    }
}

impl ServerHandler for Bus {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }
}

async fn start(backend: Backend, pubsub: PubSub, config: Config) -> common::TestServer {
    common::serve(
        backend,
        Bus { pubsub },
        config,
        Arc::new(Recorder::default()),
    )
    .await
}

async fn text(client: &mut Client) -> String {
    match next(client).await {
        tungstenite::Message::Text(text) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// A client subscribed to `topics` (each acknowledged).
async fn subscriber(server: &common::TestServer, topics: &[&str]) -> Client {
    let mut client = server.client().await;
    for topic in topics {
        send_text(&mut client, &format!("sub:{topic}")).await;
        assert_eq!(text(&mut client).await, "ok");
    }
    client
}

async fn delivers_to_exactly_the_subscribers(backend: Backend) {
    let pubsub = PubSub::new();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut a = subscriber(&server, &["news"]).await;
    let mut b = subscriber(&server, &["news", "sport"]).await;
    let mut c = subscriber(&server, &["sport"]).await;
    assert_eq!(pubsub.subscribers("news"), 2);
    assert_eq!(pubsub.topic_count(), 2);

    // From the test's thread, not a server loop.
    assert_eq!(pubsub.publish("news", Message::Text("n1")).subscribers, 2);
    assert_eq!(
        pubsub.publish("sport", Message::Binary(b"s1")).subscribers,
        2
    );
    assert_eq!(
        pubsub
            .publish("weather", Message::Text("nobody"))
            .subscribers,
        0
    );
    assert_eq!(text(&mut a).await, "n1");
    assert_eq!(text(&mut b).await, "n1");
    assert_eq!(
        next(&mut b).await,
        tungstenite::Message::Binary(b"s1".to_vec().into())
    );
    // c's first message is sport's: it never got news.
    assert_eq!(
        next(&mut c).await,
        tungstenite::Message::Binary(b"s1".to_vec().into())
    );
    // Nor did a get sport: its next message is the next news.
    pubsub.publish("news", Message::Text("n2"));
    assert_eq!(text(&mut a).await, "n2");
    let stats = pubsub.stats();
    assert_eq!((stats.published, stats.dropped), (3, 0));
    assert!(common::eventually(Duration::from_secs(5), || pubsub.stats().delivered == 6).await);
}

async fn each_publishers_order_is_kept(backend: Backend) {
    let pubsub = PubSub::new();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(subscriber(&server, &["t"]).await);
    }
    const EACH: usize = 2000;
    let publishers: Vec<_> = (0..2)
        .map(|p| {
            let pubsub = pubsub.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    assert_eq!(
                        pubsub
                            .publish("t", Message::Text(&format!("{p}:{i}")))
                            .subscribers,
                        3
                    );
                }
            })
        })
        .collect();
    for publisher in publishers {
        publisher.join().unwrap();
    }
    for client in &mut clients {
        let mut seen = [0usize; 2];
        for _ in 0..2 * EACH {
            let message = text(client).await;
            let (p, i) = message.split_once(':').unwrap();
            let p: usize = p.parse().unwrap();
            assert_eq!(
                i.parse::<usize>().unwrap(),
                seen[p],
                "publisher {p} out of order"
            );
            seen[p] += 1;
        }
        assert_eq!(seen, [EACH, EACH]);
    }
}

async fn unsubscribe_and_disconnect_take_effect(backend: Backend) {
    let pubsub = PubSub::new();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut a = subscriber(&server, &["t", "u"]).await;
    let b = subscriber(&server, &["t"]).await;
    assert_eq!(pubsub.subscribers("t"), 2);

    send_text(&mut a, "unsub:t").await;
    assert_eq!(text(&mut a).await, "ok");
    assert_eq!(pubsub.subscribers("t"), 1);
    send_text(&mut a, "topics").await;
    assert_eq!(text(&mut a).await, "u");

    // A disconnect without a close handshake, and one with.
    drop(b);
    assert!(common::eventually(Duration::from_secs(5), || pubsub.subscribers("t") == 0).await);
    assert_eq!(pubsub.publish("t", Message::Text("nobody")).subscribers, 0);
    a.close(None).await.unwrap();
    assert!(common::eventually(Duration::from_secs(5), || pubsub.topic_count() == 0).await);
}

async fn publish_from_a_callback_skips_the_sender(backend: Backend) {
    let pubsub = PubSub::new();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut a = subscriber(&server, &["room"]).await;
    let mut b = subscriber(&server, &["room"]).await;
    send_text(&mut a, "pubx:room:from a").await;
    assert_eq!(text(&mut b).await, "from a");
    send_text(&mut a, "pub:room:to all").await;
    // a's first message is the second publish: it skipped its own first.
    assert_eq!(text(&mut a).await, "to all");
    assert_eq!(text(&mut b).await, "to all");
    send_text(&mut b, "topics").await;
    assert_eq!(text(&mut b).await, "room");
}

/// A subscriber that reads nothing, beside one that reads everything:
/// under `Overflow::Drop` the stuck one misses messages (counted) and stays
/// open; under `Overflow::Close` it is closed. The reader gets every message
/// either way.
async fn a_subscriber_that_does_not_read(backend: Backend) {
    for overflow in [Overflow::Drop, Overflow::Close(CloseCode::POLICY_VIOLATION)] {
        let pubsub = PubSub::with_overflow(overflow);
        let config = Config::default()
            .max_outbound_bytes(256 * 1024)
            .close_timeout(Duration::from_millis(500));
        let server = start(backend, pubsub.clone(), config).await;
        // The stuck subscriber: subscribes, then never reads again.
        let mut stuck = common::raw_upgraded(server.addr).await;
        stuck
            .write_all(&common::client_frame(true, 1, b"sub:flood"))
            .await
            .unwrap();
        let mut reader = subscriber(&server, &["flood"]).await;
        assert!(
            common::eventually(Duration::from_secs(5), || pubsub.subscribers("flood") == 2).await
        );
        let payload = "x".repeat(16 * 1024);
        // 16 MiB: more than the loopback socket buffers and the queue hold.
        const MESSAGES: usize = 1000;
        let published = {
            let pubsub = pubsub.clone();
            let payload = payload.clone();
            tokio::task::spawn_blocking(move || {
                // At a pace the reader keeps up with (16 MB/s): only the
                // stuck subscriber's queue fills.
                for i in 0..MESSAGES {
                    pubsub.publish("flood", Message::Text(&format!("{i}:{payload}")));
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        for i in 0..MESSAGES {
            let message = text(&mut reader).await;
            assert!(message.starts_with(&format!("{i}:")), "{overflow:?}");
        }
        published.await.unwrap();
        let stats = pubsub.stats();
        match overflow {
            Overflow::Drop => {
                assert!(stats.dropped > 0, "{stats:?}");
                assert_eq!(stats.closed, 0);
                assert_eq!(pubsub.subscribers("flood"), 2, "still subscribed");
            }
            Overflow::Close(_) => {
                assert_eq!((stats.closed, stats.dropped), (1, 0), "{stats:?}");
                // Closed: its subscription ends with it.
                assert!(
                    common::eventually(Duration::from_secs(5), || pubsub.subscribers("flood") == 1)
                        .await
                );
            }
            other => unreachable!("{other:?} is not tested here"),
        }
        drop(stuck);
    }
}

async fn bad_topics_are_refused(backend: Backend) {
    let pubsub = PubSub::new();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut client = subscriber(&server, &["fine"]).await;
    send_text(&mut client, "sub:").await;
    assert_eq!(text(&mut client).await, "error: empty topic name");
    let long = "t".repeat(rapidws::pubsub::MAX_TOPIC_LEN + 1);
    send_text(&mut client, &format!("sub:{long}")).await;
    assert_eq!(
        text(&mut client).await,
        "error: topic name longer than 1024 bytes"
    );
    let longest = "t".repeat(rapidws::pubsub::MAX_TOPIC_LEN);
    send_text(&mut client, &format!("sub:{longest}")).await;
    assert_eq!(text(&mut client).await, "ok");
    send_text(&mut client, "sub:fine").await;
    assert_eq!(text(&mut client).await, "again");
    assert_eq!(pubsub.subscribers("fine"), 1);
    assert_eq!(
        pubsub.publish(&longest, Message::Text("long")).subscribers,
        1
    );
    assert_eq!(text(&mut client).await, "long");
}

/// Reads `topic`'s deliveries (`T o<offset> <payload>`) and signals until
/// the one at offset `last`; returns them as `o<offset>` and `r<bool>`.
async fn marks_until(client: &mut Client, topic: &str, last: u64) -> Vec<String> {
    let mut marks: Vec<String> = Vec::new();
    loop {
        let message = text(client).await;
        if message == "ok" {
            continue;
        }
        let mut parts = message.splitn(3, ' ');
        assert_eq!(parts.next(), Some(topic), "{message}");
        let mark = parts.next().unwrap().to_owned();
        let done = mark == format!("o{last}");
        marks.push(mark);
        if done {
            return marks;
        }
    }
}

fn offsets(range: std::ops::RangeInclusive<u64>) -> Vec<String> {
    range.map(|o| format!("o{o}")).collect()
}

async fn resuming_while_a_publisher_runs_loses_and_doubles_nothing(backend: Backend) {
    let pubsub = PubSub::builder()
        .history(History::new(1 << 20, Duration::from_secs(600)))
        .build();
    let config = Config::default().max_outbound_bytes(256 << 20);
    let server = start(backend, pubsub.clone(), config).await;
    let mut whole = server.client().await;
    send_text(&mut whole, "subp:s").await;
    assert_eq!(text(&mut whole).await, "ok");
    send_text(&mut whole, "sub:s-end").await;
    assert_eq!(text(&mut whole).await, "ok");
    // The publisher runs until every resume below is done (at most 30 s),
    // in bursts of 100 with a pause of 1 ms between them (up to 100,000 a
    // second): flat out, it keeps a busy server loop from reading the
    // resumes until it is done.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (pubsub, stop) = (pubsub.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(30)
            {
                pubsub.publish("s", Message::Text(&format!("{i}")));
                i += 1;
                if i.is_multiple_of(100) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    // The subscriber from the start reads as it goes.
    let whole = tokio::spawn(async move {
        let mut marks = Vec::new();
        loop {
            let message = text(&mut whole).await;
            if message == "end" {
                return marks;
            }
            marks.push(message.split(' ').nth(1).unwrap().to_owned());
        }
    });
    while pubsub.position("s").unwrap().offset < 1000 {
        tokio::task::yield_now().await;
    }
    // Subscribers resuming from positions a little behind the publisher,
    // each while it runs: its `ok` (after its replay and signal) is read
    // before the next starts, and before the publisher stops.
    let mut resumed = Vec::new();
    for behind in [0u64, 1, 10, 500, 3000] {
        let now = pubsub.position("s").unwrap();
        let seen = Position {
            epoch: now.epoch,
            offset: now.offset.saturating_sub(behind),
        };
        let mut client = server.client().await;
        send_text(&mut client, &format!("since:s:{seen}")).await;
        let mut marks = Vec::new();
        loop {
            let message = text(&mut client).await;
            if message == "ok" {
                break;
            }
            marks.push(message.split(' ').nth(1).unwrap().to_owned());
        }
        resumed.push((client, seen, marks));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.await.unwrap();
    let last = pubsub.position("s").unwrap().offset;
    // The end, on another topic the first subscriber's connection takes:
    // after every publication on "s" in its queue.
    pubsub.publish("s-end", Message::Text("end"));
    let whole = whole.await.unwrap();
    assert_eq!(whole, offsets(1..=last));
    for (mut client, seen, mut marks) in resumed {
        marks.extend(marks_until(&mut client, "s", last).await);
        // The replay, the signal, then live: one of each offset after seen.
        let signal = marks.iter().position(|m| m == "rtrue");
        let signal = signal.unwrap_or_else(|| panic!("not recovered from {seen}"));
        let mut without: Vec<String> = marks.clone();
        without.remove(signal);
        assert_eq!(without, offsets(seen.offset + 1..=last), "from {seen}");
        assert_eq!(marks.iter().filter(|m| m.starts_with('r')).count(), 1);
        assert!(
            signal + 1 < marks.len(),
            "live deliveries followed the seam"
        );
    }
    let stats = pubsub.stats();
    assert_eq!(
        (stats.dropped, stats.closed, stats.gone),
        (0, 0, 0),
        "{stats:?}"
    );
}

async fn a_position_history_no_longer_holds_is_not_recovered(backend: Backend) {
    let pubsub = PubSub::builder()
        .history(History::new(5, Duration::from_secs(600)))
        .build();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    for i in 0..20 {
        pubsub.publish("t", Message::Text(&format!("{i}")));
    }
    let now = pubsub.position("t").unwrap();
    assert_eq!(now.offset, 20);
    // Offsets 16 to 20 are kept: after 15 is whole, after 14 is not.
    let mut kept = server.client().await;
    send_text(&mut kept, &format!("since:t:{}:15", now.epoch)).await;
    let mut old = server.client().await;
    send_text(&mut old, &format!("since:t:{}:14", now.epoch)).await;
    let mut other_epoch = server.client().await;
    send_text(
        &mut other_epoch,
        &format!("since:t:{:x}:20", now.epoch.as_u64() ^ 1),
    )
    .await;
    assert!(common::eventually(Duration::from_secs(5), || pubsub.subscribers("t") == 3).await);
    pubsub.publish("t", Message::Text("live"));
    assert_eq!(
        marks_until(&mut kept, "t", 21).await,
        [offsets(16..=20), vec!["rtrue".into()], offsets(21..=21)].concat()
    );
    assert_eq!(marks_until(&mut old, "t", 21).await, ["rfalse", "o21"]);
    assert_eq!(
        marks_until(&mut other_epoch, "t", 21).await,
        ["rfalse", "o21"]
    );
}

async fn the_latest_publication_comes_first_on_subscribe(backend: Backend) {
    let pubsub = PubSub::builder()
        .history(History::new(1, Duration::from_secs(600)))
        .build();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    pubsub.publish("t", Message::Text("a"));
    pubsub.publish("t", Message::Text("b"));
    let mut client = server.client().await;
    send_text(&mut client, "latest:t").await;
    assert_eq!(text(&mut client).await, "t o2 b");
    assert_eq!(text(&mut client).await, "ok");
    pubsub.publish("t", Message::Text("c"));
    assert_eq!(text(&mut client).await, "t o3 c");
}

async fn occupancy_follows_the_first_and_last_subscriber(backend: Backend) {
    let (events, mut told) = tokio::sync::mpsc::unbounded_channel();
    let pubsub = PubSub::builder()
        .on_occupancy(move |topic, occupied| {
            let _ = events.send((topic.to_owned(), occupied));
        })
        .build();
    let server = start(backend, pubsub.clone(), Config::default()).await;
    let mut next_event = async || {
        tokio::time::timeout(Duration::from_secs(5), told.recv())
            .await
            .expect("an occupancy event")
            .unwrap()
    };
    let first = subscriber(&server, &["t"]).await;
    assert_eq!(next_event().await, ("t".to_owned(), true));
    let second = subscriber(&server, &["t"]).await;
    drop(first);
    assert!(common::eventually(Duration::from_secs(5), || pubsub.subscribers("t") == 1).await);
    drop(second);
    assert_eq!(next_event().await, ("t".to_owned(), false));
    assert_eq!(pubsub.topic_count(), 0);
}

async fn conflation_keeps_a_slow_reader_whole_per_key_and_connected(backend: Backend) {
    const PUBLICATIONS: u64 = 5000;
    const KEYS: u64 = 10;
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .build();
    // Room for every key's latest to wait: each counts what it holds
    // (its 4 KiB payload framed plain and in the envelope, about 8.5 KiB).
    let config = Config::default().max_outbound_bytes(256 * 1024);
    let server = start(backend, pubsub.clone(), config).await;
    // Subscribed, then not read from until every publication is out: 20
    // MiB, more than the socket buffers and the queue hold.
    let mut slow = server.client().await;
    send_text(&mut slow, "subp:c").await;
    assert_eq!(text(&mut slow).await, "ok");
    let filler = "x".repeat(4096);
    for i in 1..=PUBLICATIONS {
        let key = format!("k{}", i % KEYS);
        let body = format!("{key}={i}:{filler}");
        let options = PublishOptions::new().key(&key);
        pubsub.publish_with("c", Message::Text(&body), options);
        if i % 200 == 0 {
            // Within the server loop's mailbox bound (16 MiB).
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let mut latest = std::collections::HashMap::new();
    let (mut last_offset, mut gaps) = (0u64, 0);
    loop {
        let message = text(&mut slow).await;
        let mut parts = message.splitn(3, ' ');
        assert_eq!(parts.next(), Some("c"));
        let mark = parts.next().unwrap();
        if mark == "rfalse" {
            gaps += 1;
            continue;
        }
        let offset: u64 = mark[1..].parse().unwrap();
        assert!(
            offset > last_offset,
            "in offset order: {offset} after {last_offset}"
        );
        last_offset = offset;
        let (key, value) = parts.next().unwrap().split_once('=').unwrap();
        let value: u64 = value.split_once(':').unwrap().0.parse().unwrap();
        latest.insert(key.to_owned(), value);
        if offset == PUBLICATIONS {
            break;
        }
    }
    // The latest value of every key arrived, the gap was told.
    for k in 0..KEYS {
        let last_of_key = PUBLICATIONS - (PUBLICATIONS - k) % KEYS;
        assert_eq!(latest[&format!("k{k}")], last_of_key, "k{k}");
    }
    let stats = pubsub.stats();
    assert!(gaps >= 1 && stats.conflated > 0, "{gaps} gaps; {stats:?}");
    assert_eq!(stats.closed, 0);
    // Still connected, and delivered to at once again.
    pubsub.publish_with(
        "c",
        Message::Text("k0=after:"),
        PublishOptions::new().key("k0"),
    );
    let after = text(&mut slow).await;
    assert!(after.contains("k0=after"), "{after}");
    eprintln!("{backend:?}: {stats:?}, {gaps} gaps told");
}

backend_tests!(
    conflation_keeps_a_slow_reader_whole_per_key_and_connected,
    occupancy_follows_the_first_and_last_subscriber,
    resuming_while_a_publisher_runs_loses_and_doubles_nothing,
    a_position_history_no_longer_holds_is_not_recovered,
    the_latest_publication_comes_first_on_subscribe,
    delivers_to_exactly_the_subscribers,
    each_publishers_order_is_kept,
    unsubscribe_and_disconnect_take_effect,
    publish_from_a_callback_skips_the_sender,
    a_subscriber_that_does_not_read,
    bad_topics_are_refused,
);
