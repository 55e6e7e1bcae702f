//! The byte budgets under the floods they are for: history over many
//! topics, topics made by publishes, conflation waits of many stuck
//! subscribers. Each bound holds, the oldest (history) or the offender
//! (a new topic, a subscriber's wait) goes first, and whoever misses
//! something is told.

use super::*;

/// A payload of `n` bytes.
fn payload(n: usize) -> String {
    "p".repeat(n)
}

#[test]
fn history_is_bounded_in_bytes_across_topics_and_the_oldest_goes_first() {
    let limit = 200 << 10;
    let pubsub = PubSub::builder()
        .history(History::new(100, Duration::from_secs(3600)))
        .limits(Limits::new().history_bytes(limit))
        .build();
    let body = payload(4 << 10);
    let mut first = Vec::new();
    // 1,000 topics, one 4 KiB publication each: 4 MiB offered, 200 KiB kept.
    for topic in 0..1000 {
        let published = pubsub.publish(&format!("t{topic}"), Message::Text(&body));
        first.push(published.position.unwrap());
        let usage = pubsub.usage();
        assert!(usage.history_bytes <= limit, "{topic}: {usage:?}");
    }
    let usage = pubsub.usage();
    assert!(usage.history_shed > 900, "{usage:?}");
    assert!(usage.history_publications < 50, "{usage:?}");
    // What the budget let go went oldest first: the last topics keep their
    // publication (a resume from before it is whole), the first do not
    // (told: not recovered), and topics left with nothing are forgotten.
    let list = Arc::new(Loop::default());
    let resume = |topic: usize, slot| {
        let conn = conn(&list, slot, 1 << 20);
        let mut from = first[topic];
        from.offset -= 1;
        let how = Subscribe::new().start(Start::After(from));
        let name = format!("t{topic}");
        pubsub.subscribe_with(&conn, &name, &how).unwrap().recovered
    };
    assert_eq!(resume(999, 1), Some(true));
    assert_eq!(resume(0, 2), Some(false));
    assert!(usage.topics < 60, "{usage:?}");
}

#[test]
fn one_topic_over_the_history_budget_keeps_its_newest() {
    let pubsub = PubSub::builder()
        .history(History::new(1000, Duration::from_secs(3600)))
        .limits(Limits::new().history_bytes(64 << 10))
        .build();
    let body = payload(1 << 10);
    let mut last = None;
    for _ in 0..1000 {
        last = pubsub.publish("t", Message::Text(&body)).position;
    }
    let usage = pubsub.usage();
    assert!(usage.history_bytes <= 64 << 10, "{usage:?}");
    assert!((30..64).contains(&usage.history_publications), "{usage:?}");
    // The newest are kept: a subscriber that missed the last ten gets them.
    let list = Arc::new(Loop::default());
    let conn = conn(&list, 1, 1 << 20);
    let mut from = last.unwrap();
    from.offset -= 10;
    let how = Subscribe::new().start(Start::After(from));
    let subscribed = pubsub.subscribe_with(&conn, "t", &how).unwrap();
    assert_eq!(
        (subscribed.recovered, subscribed.replayed),
        (Some(true), 10)
    );
}

#[test]
fn topics_are_bounded_in_bytes_and_a_new_one_past_it_is_refused() {
    // Room for about a hundred topics with short names.
    let pubsub = PubSub::builder()
        .history(History::new(1, Duration::from_secs(3600)))
        .limits(Limits::new().topic_bytes(100 * 1024))
        .build();
    let long = "n".repeat(900);
    for topic in 0..1000 {
        pubsub.publish(&format!("{long}{topic}"), Message::Text("x"));
    }
    let usage = pubsub.usage();
    assert!(usage.topic_bytes <= 100 * 1024, "{usage:?}");
    assert!((30..110).contains(&usage.topics), "{usage:?}");
    assert_eq!(
        usage.topics_refused,
        1000 - usage.topics as u64,
        "{usage:?}"
    );
    let list = Arc::new(Loop::default());
    let conn = conn(&list, 1, 1 << 20);
    assert_eq!(
        pubsub.subscribe(&conn, &format!("{long}new")),
        Err(PubSubError::TooManyTopics)
    );
    // One that is there takes subscribers as before.
    assert_eq!(pubsub.subscribe(&conn, &format!("{long}0")), Ok(true));
    // Subscribers and topics gone: the room is given back.
    let pubsub = PubSub::builder()
        .limits(Limits::new().topic_bytes(100 * 1024))
        .build();
    for topic in 0..50 {
        assert_eq!(pubsub.subscribe(&conn, &format!("{long}{topic}")), Ok(true));
    }
    for topic in 0..50 {
        assert!(pubsub.unsubscribe(&conn, &format!("{long}{topic}")));
    }
    let usage = pubsub.usage();
    assert_eq!((usage.topics, usage.topic_bytes), (0, 0), "{usage:?}");
}

#[test]
fn conflation_waits_are_counted_as_they_cost_and_bounded_per_subscriber() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .build();
    let marks: Arc<dyn Envelope> = Arc::new(Marks);
    let bound = 64 << 10;
    let stuck = conn(&list, 1, bound);
    pubsub
        .subscribe_with(&stuck, "t", &Subscribe::new().envelope(marks))
        .unwrap();
    // Tiny publications with distinct keys: each costs far more than its
    // frame's few bytes, and that is what is counted.
    for key in 0..100_000 {
        let key = key.to_string();
        pubsub.publish_with("t", Message::Text("x"), PublishOptions::new().key(&key));
    }
    list.run(usize::MAX);
    let usage = pubsub.usage();
    assert!(usage.waiting_bytes <= bound, "{usage:?}");
    let stats = pubsub.stats();
    // The queue took its share (about 64 KiB of 5-8 byte frames); at most
    // a few hundred wait, and the rest were dropped, told as a gap.
    let waiting = 100_000 - stats.delivered - stats.dropped;
    assert!(waiting > 0 && waiting < 300, "{waiting} waiting; {stats:?}");
    assert!(stats.dropped > 80_000, "{stats:?}");
    let _ = frames(&stuck);
    written_out(&stuck);
    list.run(usize::MAX);
    let frames = frames(&stuck);
    assert!(frames.contains(&"rfalse".to_owned()), "the gap is told");
}

#[test]
fn every_subscribers_waits_together_stay_within_their_budget() {
    let list = Arc::new(Loop::default());
    let limit = 100 << 10;
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .limits(Limits::new().waiting_bytes(limit))
        .build();
    // Twenty stuck subscribers, each allowed 1 MiB: together they would
    // hold 20 MiB without the budget.
    let stuck: Vec<Conn> = (0..20)
        .map(|slot| {
            let conn = conn(&list, slot, 1 << 20);
            pubsub.subscribe(&conn, "t").unwrap();
            conn
        })
        .collect();
    let body = payload(1 << 10);
    for key in 0..10_000 {
        let key = key.to_string();
        pubsub.publish_with("t", Message::Text(&body), PublishOptions::new().key(&key));
        if key.ends_with("00") {
            list.run(usize::MAX);
            let usage = pubsub.usage();
            assert!(usage.waiting_bytes <= limit, "{key}: {usage:?}");
        }
    }
    list.run(usize::MAX);
    let stats = pubsub.stats();
    assert!(stats.dropped > 0, "{stats:?}");
    for conn in &stuck {
        assert!(pubsub.unsubscribe(conn, "t"));
    }
    assert_eq!(pubsub.usage().waiting_bytes, 0);
}

#[test]
fn a_replacement_past_the_bound_leaves_the_older_value_waiting() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .build();
    let bound = 16 << 10;
    let slow = conn(&list, 1, bound);
    pubsub.subscribe(&slow, "t").unwrap();
    fn keyed(key: &str) -> PublishOptions<'_> {
        PublishOptions::new().key(key)
    }
    // Fill the queue, then one small value of "a" waits.
    let filler = payload(1 << 10);
    for n in 0..20 {
        let key = format!("fill{n}");
        pubsub.publish_with("t", Message::Text(&filler), keyed(&key));
    }
    pubsub.publish_with("t", Message::Text("a small"), keyed("a"));
    list.run(usize::MAX);
    let waited = pubsub.usage().waiting_bytes;
    assert!(waited > 0);
    // A newer "a" too large for what waits: refused, the older stays.
    let huge = payload(bound);
    pubsub.publish_with("t", Message::Text(&huge), keyed("a"));
    list.run(usize::MAX);
    assert_eq!(pubsub.usage().waiting_bytes, waited);
    let stats = pubsub.stats();
    assert_eq!((stats.conflated, stats.closed), (0, 0), "{stats:?}");
    let _ = frames(&slow);
    written_out(&slow);
    list.run(usize::MAX);
    let sent = frames(&slow);
    assert!(
        sent.iter().any(|f| f == "a small"),
        "the older value is sent"
    );
    assert!(sent.iter().all(|f| f.len() < bound), "not the huge one");
}
