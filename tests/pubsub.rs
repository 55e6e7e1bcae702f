//! Pub/sub on every backend, with tokio-tungstenite clients: delivery to
//! exactly the subscribers, order per publisher, unsubscribe and
//! disconnect, publishing from other threads and from callbacks (except
//! the sender), a connection's topics, and a subscriber that does not read
//! under each overflow policy.
#![cfg(feature = "pubsub")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Client, Recorder, next, send_text};
use rapidws::pubsub::{Overflow, PubSub};
use rapidws::{Accept, CloseCode, Config, Conn, Handler, Message, Reject, Request, ServerHandler};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite;

/// A handler that takes commands: `sub:T`, `unsub:T`, `pub:T:text`,
/// `pubx:T:text` (to everyone but the sender), and `topics` (answered with
/// the connection's topics, sorted, comma-separated). It answers each
/// `sub`/`unsub` with `ok` (`again` for a repeated `sub`, `error: ...` for
/// a refused one), so a client knows its subscription is in.
struct Bus {
    pubsub: PubSub,
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
    assert_eq!(pubsub.publish("news", Message::Text("n1")), 2);
    assert_eq!(pubsub.publish("sport", Message::Binary(b"s1")), 2);
    assert_eq!(pubsub.publish("weather", Message::Text("nobody")), 0);
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
                    assert_eq!(pubsub.publish("t", Message::Text(&format!("{p}:{i}"))), 3);
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
    assert_eq!(pubsub.publish("t", Message::Text("nobody")), 0);
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
    assert_eq!(pubsub.publish(&longest, Message::Text("long")), 1);
    assert_eq!(text(&mut client).await, "long");
}

backend_tests!(
    delivers_to_exactly_the_subscribers,
    each_publishers_order_is_kept,
    unsubscribe_and_disconnect_take_effect,
    publish_from_a_callback_skips_the_sender,
    a_subscriber_that_does_not_read,
    bad_topics_are_refused,
);
