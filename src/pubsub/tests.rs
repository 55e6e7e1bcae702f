//! The seam between replay and live delivery, on connections served by a
//! stand-in server loop whose jobs run when the test says: publications
//! posted before a subscribe and run after it, resumes from every kind of
//! position, small histories, queues that fill. Every subscriber's frames
//! are read back and must be exactly what its start promised.

use std::io::IoSlice;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::relay::{Loaded, Placed};
use super::*;
use crate::connection::config::SlowConsumer;
use crate::connection::conn::Conn;
use crate::connection::outbox::{ConnShared, Outbound};
use crate::connection::wake::{ConnWake, Job, SlotWake, WokenList};
use crate::proto::{CloseCode, Message, OpCode, OwnedMessage, Role};

mod budgets;
mod read;

/// A server loop whose posted jobs wait until the test runs them.
#[derive(Default)]
struct Loop {
    jobs: Mutex<Vec<Job>>,
}

impl WokenList for Loop {
    fn push_woken(&self, _: u32) {}

    fn post(&self, job: Job, _: usize) -> bool {
        self.jobs.lock().unwrap().push(job);
        true
    }
}

impl Loop {
    /// Runs the first `n` jobs waiting (all, if fewer).
    fn run(&self, n: usize) {
        let jobs: Vec<Job> = {
            let mut jobs = self.jobs.lock().unwrap();
            let n = n.min(jobs.len());
            jobs.drain(..n).collect()
        };
        jobs.into_iter().for_each(|job| job());
    }
}

/// `o<offset>` for a publication, `r<true|false>` for a recovery signal.
struct Marks;

impl Envelope for Marks {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        OwnedMessage::Text(format!("o{}", publication.position().offset))
    }

    fn recovery(&self, _: &str, recovered: bool) -> Option<OwnedMessage> {
        Some(OwnedMessage::Text(format!("r{recovered}")))
    }
}

fn conn(list: &Arc<Loop>, slot: u32, max_outbound: usize) -> Conn {
    let list: Arc<dyn WokenList> = list.clone();
    let outbound = Outbound {
        pool: Arc::default(),
        max_bytes: max_outbound,
        meters: crate::connection::meters::Meters::new("test"),
        on_full: SlowConsumer::Pause,
    };
    let wake = ConnWake::Shared(Arc::new(SlotWake::new(list, slot)));
    let shared = ConnShared::new(
        u64::from(slot),
        "127.0.0.1:1".parse().unwrap(),
        Arc::new(outbound),
        wake,
        Role::Server,
    );
    Conn::from_shared(shared)
}

/// The payloads of the text frames queued for `conn` (and taken).
fn frames(conn: &Conn) -> Vec<String> {
    let mut outbox = conn.shared().lock();
    let queue = outbox.queue();
    let mut wire = Vec::new();
    loop {
        let mut slices = [IoSlice::new(&[]); 64];
        let n = queue.io_slices(&mut slices);
        let bytes: usize = slices[..n].iter().map(|s| s.len()).sum();
        if bytes == 0 {
            break;
        }
        slices[..n].iter().for_each(|s| wire.extend_from_slice(s));
        queue.advance(bytes);
    }
    let mut texts = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        assert_eq!(wire[at], 0x81, "a final text frame");
        let (len, header) = match wire[at + 1] {
            126 => (
                usize::from(u16::from_be_bytes([wire[at + 2], wire[at + 3]])),
                4,
            ),
            len => (usize::from(len), 2),
        };
        let payload = &wire[at + header..at + header + len];
        texts.push(String::from_utf8(payload.to_vec()).unwrap());
        at += header + len;
    }
    texts
}

/// What a subscriber must have been sent, given how it started, what
/// its subscribe reported, and the topic's last offset.
fn expected(start: Start, subscribed: &Subscribed, last: u64) -> Vec<String> {
    let joined = subscribed.position.offset;
    let mut want = Vec::new();
    match start {
        Start::Now => {}
        Start::Latest => {
            // The latest is always kept (history holds at least one).
            if joined >= 1 {
                want.push(format!("o{joined}"));
            }
        }
        Start::After(seen) => {
            let whole = subscribed.recovered.unwrap();
            if whole {
                want.extend((seen.offset + 1..=joined).map(|o| format!("o{o}")));
            }
            want.push(format!("r{whole}"));
        }
    }
    want.extend((joined + 1..=last).map(|o| format!("o{o}")));
    want
}

#[derive(Clone, Debug)]
enum Op {
    Publish,
    /// A new subscriber: 0 now, 1 latest, 2 after `back` offsets before
    /// the last, 3 after a position of another epoch.
    Subscribe {
        how: u8,
        back: u64,
    },
    /// Runs some of the jobs waiting.
    Run(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Publish),
        2 => (0u8..4, 0u64..12).prop_map(|(how, back)| Op::Subscribe { how, back }),
        2 => (0usize..6).prop_map(Op::Run),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every subscriber gets exactly its replay, its signal, then every
    /// later publication once, in offset order: whatever the interleaving
    /// of publishes, subscribes, and the loop running posted deliveries.
    #[test]
    fn the_seam_loses_and_doubles_nothing(ops in proptest::collection::vec(op(), 1..60), kept in 1usize..8) {
        let list = Arc::new(Loop::default());
        let pubsub = PubSub::builder()
            .history(History::new(kept, Duration::from_secs(3600)))
            .build();
        let marks: Arc<dyn Envelope> = Arc::new(Marks);
        let how = |start| Subscribe::new().start(start).envelope(marks.clone());
        // A subscriber from the start, to compare against.
        let first = conn(&list, 0, 1 << 20);
        let joined = pubsub.subscribe_with(&first, "t", &how(Start::Now)).unwrap();
        let epoch = joined.position.epoch;
        let mut subscribers = vec![(first, Start::Now, joined)];
        let mut last = 0u64;
        for op in ops {
            match op {
                Op::Publish => {
                    let published = pubsub.publish("t", Message::Text("x"));
                    last += 1;
                    prop_assert_eq!(published.position, Some(Position { epoch, offset: last }));
                }
                Op::Subscribe { how: kind, back } => {
                    let start = match kind {
                        0 => Start::Now,
                        1 => Start::Latest,
                        2 => Start::After(Position { epoch, offset: last.saturating_sub(back) }),
                        _ => Start::After(Position { epoch: Epoch::from_u64(epoch.as_u64() ^ 1), offset: last }),
                    };
                    let conn = conn(&list, subscribers.len() as u32, 1 << 20);
                    let subscribed = pubsub.subscribe_with(&conn, "t", &how(start)).unwrap();
                    prop_assert_eq!(subscribed.position, Position { epoch, offset: last });
                    if let Start::After(seen) = start {
                        let whole = seen.epoch == epoch && seen.offset + kept as u64 >= last;
                        prop_assert_eq!(subscribed.recovered, Some(whole));
                    }
                    subscribers.push((conn, start, subscribed));
                }
                Op::Run(n) => list.run(n),
            }
        }
        list.run(usize::MAX);
        for (conn, start, subscribed) in &subscribers {
            prop_assert_eq!(frames(conn), expected(*start, subscribed, last), "{:?}", start);
        }
        let stats = pubsub.stats();
        prop_assert_eq!(stats.dropped + stats.closed + stats.gone, 0);
    }
}

#[test]
fn publishers_and_resumes_racing_on_threads_lose_and_double_nothing() {
    const PUBLISHERS: usize = 3;
    const EACH: usize = 3000;
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .history(History::new(PUBLISHERS * EACH, Duration::from_secs(3600)))
        .build();
    let marks: Arc<dyn Envelope> = Arc::new(Marks);
    let how = |start| Subscribe::new().start(start).envelope(marks.clone());
    let first = conn(&list, 0, 1 << 30);
    let epoch = pubsub
        .subscribe_with(&first, "t", &how(Start::Now))
        .unwrap()
        .position
        .epoch;
    let done = std::sync::atomic::AtomicBool::new(false);
    let resumed = std::thread::scope(|scope| {
        for _ in 0..PUBLISHERS {
            scope.spawn(|| {
                for _ in 0..EACH {
                    pubsub.publish("t", Message::Text("x"));
                }
            });
        }
        // The loop, running its jobs as they come.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                list.run(usize::MAX);
                std::thread::yield_now();
            }
        });
        let resumer = scope.spawn(|| {
            let mut resumed = Vec::new();
            for slot in 1..200u32 {
                let offset = pubsub.position("t").unwrap().offset;
                let start = Start::After(Position {
                    epoch,
                    offset: offset.saturating_sub(u64::from(slot % 7)),
                });
                let conn = conn(&list, slot, 1 << 30);
                let subscribed = pubsub.subscribe_with(&conn, "t", &how(start)).unwrap();
                assert_eq!(subscribed.recovered, Some(true));
                resumed.push((conn, start, subscribed));
            }
            resumed
        });
        let resumed = resumer.join().unwrap();
        // Publishers are done when the scope's other threads are; the
        // loop stops after them.
        while pubsub.position("t").unwrap().offset < (PUBLISHERS * EACH) as u64 {
            std::thread::yield_now();
        }
        done.store(true, Ordering::Relaxed);
        resumed
    });
    list.run(usize::MAX);
    let last = (PUBLISHERS * EACH) as u64;
    let all: Vec<String> = (1..=last).map(|o| format!("o{o}")).collect();
    assert_eq!(frames(&first), all);
    for (conn, start, subscribed) in &resumed {
        assert_eq!(frames(conn), expected(*start, subscribed, last));
    }
}

#[test]
fn a_full_queue_is_told_of_its_gap_once_and_resumes_after_it() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::new();
    let marks: Arc<dyn Envelope> = Arc::new(Marks);
    // Room for two frames: the third and fourth are dropped.
    let slow = conn(&list, 1, 8);
    let how = Subscribe::new().envelope(marks);
    pubsub.subscribe_with(&slow, "t", &how).unwrap();
    for _ in 0..4 {
        pubsub.publish("t", Message::Text("x"));
    }
    list.run(usize::MAX);
    assert_eq!(frames(&slow), ["o1", "o2", "rfalse"]);
    pubsub.publish("t", Message::Text("x"));
    pubsub.publish("t", Message::Text("x"));
    list.run(usize::MAX);
    assert_eq!(frames(&slow), ["o5", "o6"]);
    let stats = pubsub.stats();
    assert_eq!((stats.delivered, stats.dropped), (4, 2));
}

#[test]
fn a_topic_without_history_or_subscribers_is_forgotten_with_its_epoch() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::new();
    assert_eq!(pubsub.publish("t", Message::Text("x")).position, None);
    let a = conn(&list, 1, 1 << 20);
    let first = pubsub.subscribe_with(&a, "t", &Subscribe::new()).unwrap();
    assert_eq!(first.position.offset, 0);
    let published = pubsub.publish("t", Message::Text("x"));
    assert_eq!(published.position.unwrap().offset, 1);
    // Nothing kept: resuming from the latest position misses nothing.
    let b = conn(&list, 2, 1 << 20);
    let at_latest = Subscribe::new().start(Start::After(published.position.unwrap()));
    assert_eq!(
        pubsub
            .subscribe_with(&b, "t", &at_latest)
            .unwrap()
            .recovered,
        Some(true)
    );
    let c = conn(&list, 3, 1 << 20);
    let behind = Subscribe::new().start(Start::After(first.position));
    assert_eq!(
        pubsub.subscribe_with(&c, "t", &behind).unwrap().recovered,
        Some(false)
    );
    for conn in [&a, &b, &c] {
        assert!(pubsub.unsubscribe(conn, "t"));
    }
    assert_eq!(pubsub.position("t"), None);
    let d = conn(&list, 4, 1 << 20);
    let again = pubsub.subscribe_with(&d, "t", &Subscribe::new()).unwrap();
    assert_ne!(again.position.epoch, first.position.epoch);
    assert_eq!(again.position.offset, 0);
}

#[test]
fn a_topic_forgotten_before_its_first_publication_comes_back_in_its_epoch() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .build();
    // Told (epoch, 0), then away: the topic, with nothing kept and nobody
    // subscribed, is forgotten.
    let a = conn(&list, 1, 1 << 20);
    let told = pubsub
        .subscribe_with(&a, "t", &Subscribe::new())
        .unwrap()
        .position;
    assert_eq!(told.offset, 0);
    assert!(pubsub.unsubscribe(&a, "t"));
    assert_eq!(pubsub.position("t"), None);
    // Published while away: made again, in the epoch it was told.
    for _ in 0..3 {
        pubsub.publish("t", Message::Text("x"));
    }
    assert_eq!(
        pubsub.position("t"),
        Some(Position {
            epoch: told.epoch,
            offset: 3
        })
    );
    let back = conn(&list, 2, 1 << 20);
    let resume = Subscribe::new()
        .start(Start::After(told))
        .envelope(Arc::new(Marks));
    let joined = pubsub.subscribe_with(&back, "t", &resume).unwrap();
    assert_eq!(joined.recovered, Some(true));
    list.run(usize::MAX);
    assert_eq!(frames(&back), ["o1", "o2", "o3", "rtrue"]);
}

#[test]
fn a_topic_forgotten_after_publishing_never_reuses_an_epoch() {
    let list = Arc::new(Loop::default());
    let age = Duration::from_millis(50);
    let pubsub = PubSub::builder().history(History::new(10, age)).build();
    let a = conn(&list, 1, 1 << 20);
    let told = pubsub
        .subscribe_with(&a, "t", &Subscribe::new())
        .unwrap()
        .position;
    assert!(pubsub.unsubscribe(&a, "t"));
    // Published while away, then kept too long: forgotten again, with
    // what it numbered.
    pubsub.publish("t", Message::Text("lost"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while pubsub.position("t").is_some() {
        assert!(Instant::now() < deadline, "still kept");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Made again: a new epoch, so the position told before is not taken
    // for one in it, and the publication lost is told as a gap.
    pubsub.publish("t", Message::Text("x"));
    let now = pubsub.position("t").unwrap();
    assert_ne!(now.epoch, told.epoch);
    assert_eq!(now.offset, 1);
    let back = conn(&list, 2, 1 << 20);
    let resume = Subscribe::new().start(Start::After(told));
    let joined = pubsub.subscribe_with(&back, "t", &resume).unwrap();
    assert_eq!(joined.recovered, Some(false));
}

/// Told `(epoch, 0)` on `topic`, away while the topic was forgotten and a
/// publication went unnumbered (`missed`): the resume is not taken for
/// whole.
fn away_while_a_publication_went_unnumbered(
    pubsub: &PubSub,
    topic: &str,
    missed: impl FnOnce(&PubSub),
) {
    let list = Arc::new(Loop::default());
    let a = conn(&list, 1, 1 << 20);
    let told = pubsub
        .subscribe_with(&a, topic, &Subscribe::new())
        .unwrap()
        .position;
    assert!(pubsub.unsubscribe(&a, topic));
    missed(pubsub);
    let back = conn(&list, 2, 1 << 20);
    let resume = Subscribe::new().start(Start::After(told));
    let joined = pubsub.subscribe_with(&back, topic, &resume).unwrap();
    assert_eq!(joined.recovered, Some(false));
}

#[test]
fn without_history_a_publication_to_nobody_is_a_gap_for_a_resume() {
    let pubsub = PubSub::new();
    away_while_a_publication_went_unnumbered(&pubsub, "t", |pubsub| {
        assert_eq!(pubsub.publish("t", Message::Text("x")).position, None);
    });
}

#[test]
fn a_publication_refused_for_the_topics_budget_is_a_gap_for_a_resume() {
    let pubsub = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .history_for("fill.", History::new(1, Duration::from_millis(50)))
        .limits(Limits::new().topic_bytes(16 * 1024))
        .build();
    // Longer than any filler: refused once they are.
    let topic = "t".repeat(1000);
    away_while_a_publication_went_unnumbered(&pubsub, &topic, |pubsub| {
        let long = format!("fill.{}", "n".repeat(900));
        let mut n = 0;
        while pubsub
            .publish(&format!("{long}{n}"), Message::Text("x"))
            .position
            .is_some()
        {
            n += 1;
            assert!(n < 1000, "the budget never filled");
        }
        assert_eq!(pubsub.publish(&topic, Message::Text("x")).position, None);
        // The fillers are kept too long and swept: room again.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pubsub.usage().topics > 0 {
            assert!(Instant::now() < deadline, "{:?}", pubsub.usage());
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

#[test]
fn after_a_failed_handoff_no_topic_comes_back_in_an_epoch_handed_out() {
    let pubsub = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .build();
    away_while_a_publication_went_unnumbered(&pubsub, "t", |pubsub| {
        // The successor numbered in the epoch told; taken back here.
        pubsub.renumber();
        pubsub.publish("t", Message::Text("x"));
    });
}

#[test]
fn history_is_kept_without_subscribers_and_swept_on_time_when_old() {
    let age = Duration::from_millis(300);
    let pubsub = PubSub::builder()
        .history(History::new(2, age))
        .history_for("keep.", History::new(3, Duration::from_secs(3600)))
        .history_for("none.", History::OFF)
        .build();
    assert_eq!(pubsub.history("keep.x").max_messages(), 3);
    assert!(!pubsub.history("none.x").is_on());
    assert_eq!(pubsub.history("other").max_messages(), 2);
    let published = Instant::now();
    for topic in ["keep.x", "other", "none.x"] {
        pubsub.publish(topic, Message::Text("x"));
    }
    assert_eq!(pubsub.position("keep.x").unwrap().offset, 1);
    let kept = pubsub.position("other").is_some();
    assert!(kept || published.elapsed() > age, "kept until its age");
    assert_eq!(pubsub.position("none.x"), None, "nothing numbers it");
    // Nothing is published again: the sweeper lets "other" go on time
    // (past its age, with no subscriber), topic and all.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pubsub.position("other").is_some() {
        assert!(
            Instant::now() < deadline,
            "still kept: {:?}",
            pubsub.usage()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(published.elapsed() >= age);
    assert_eq!(pubsub.position("keep.x").unwrap().offset, 1);
    let usage = pubsub.usage();
    assert_eq!(
        (usage.topics, usage.history_publications),
        (1, 1),
        "{usage:?}"
    );
}

#[test]
fn occupancy_is_told_for_the_first_and_the_last_subscriber_in_order() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let pubsub = PubSub::builder()
        .on_occupancy(move |topic, occupied| {
            seen.lock().unwrap().push((topic.to_owned(), occupied))
        })
        .build();
    let list = Arc::new(Loop::default());
    let other = Arc::new(Loop::default());
    let (a, b, c) = (
        conn(&list, 1, 1 << 20),
        conn(&other, 2, 1 << 20),
        conn(&list, 3, 1 << 20),
    );
    pubsub.subscribe(&a, "t").unwrap();
    pubsub.subscribe(&b, "t").unwrap();
    pubsub.subscribe(&c, "u").unwrap();
    assert_eq!(pubsub.topic_count(), 2);
    assert!(pubsub.unsubscribe(&a, "t"));
    // The connection's end lets go of its topics.
    b.leave_all();
    c.leave_all();
    pubsub.subscribe(&a, "t").unwrap();
    let want = [
        ("t", true),
        ("u", true),
        ("t", false),
        ("u", false),
        ("t", true),
    ];
    let got = events.lock().unwrap().clone();
    assert_eq!(
        got,
        want.map(|(topic, occupied)| (topic.to_owned(), occupied))
    );
    assert_eq!(pubsub.topic_count(), 1);
}

/// What a driver does once it has written a connection's queue out: wake
/// whoever waits for room.
fn written_out(conn: &Conn) {
    let waiting = conn.shared().lock().take_waiting_if_room(0);
    crate::connection::outbox::wake_all(waiting);
}

/// `o<offset>` and a long tail of dots: frames large enough that what a
/// waiting publication costs besides its frame is the smaller part.
struct Padded;

/// The dots after each `Padded` mark.
const PAD: usize = 2000;

impl Envelope for Padded {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let mark = format!("o{}", publication.position().offset);
        OwnedMessage::Text(format!("{mark}{}", ".".repeat(PAD)))
    }

    fn recovery(&self, _: &str, recovered: bool) -> Option<OwnedMessage> {
        Some(OwnedMessage::Text(format!("r{recovered}")))
    }
}

/// [`frames`] without `Padded`'s dots.
fn marks(conn: &Conn) -> Vec<String> {
    frames(conn)
        .into_iter()
        .map(|frame| frame.trim_end_matches('.').to_owned())
        .collect()
}

/// What one publication of `Padded` with a one-byte key counts while it
/// waits, and its frame's length.
fn padded_costs() -> (usize, usize) {
    let envelope: Arc<dyn Envelope> = Arc::new(Padded);
    let publication = Publication::new(
        Arc::from("t"),
        Position {
            epoch: Epoch::from_u64(1),
            offset: 1,
        },
        Some("a"),
        OpCode::Text,
        b"x",
        Instant::now(),
    );
    let frame = publication.frame(Some(&envelope)).frame().len();
    (pending::counted(&publication), frame)
}

#[test]
fn conflation_keeps_the_latest_per_key_in_offset_order_and_tells_the_gap() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .build();
    let padded: Arc<dyn Envelope> = Arc::new(Padded);
    // The queue takes three frames; two publications wait, counted with
    // everything they hold (their frames, their keys, the entries).
    let (cost, frame) = padded_costs();
    let bound = 2 * cost + 10;
    assert!(2 * frame < bound && bound <= 3 * frame, "{cost} {frame}");
    let slow = conn(&list, 1, bound);
    pubsub
        .subscribe_with(&slow, "t", &Subscribe::new().envelope(padded))
        .unwrap();
    let keyed = |key| PublishOptions::new().key(key);
    for key in ["a", "b", "a", "b", "a", "b", "a"] {
        pubsub.publish_with("t", Message::Text("x"), keyed(key));
    }
    // A keyless one past the waiting bound: dropped, a gap too.
    pubsub.publish("t", Message::Text("x"));
    list.run(usize::MAX);
    assert_eq!(marks(&slow), ["o1", "o2", "o3"]);
    assert!(pubsub.usage().waiting_bytes >= 2 * frame);
    written_out(&slow);
    list.run(usize::MAX);
    // o4 and o5 were replaced by o6 and o7 (keys b and a), o8 dropped:
    // told first, then the latest of each key, in offset order.
    assert_eq!(marks(&slow), ["rfalse", "o6", "o7"]);
    assert_eq!(pubsub.usage().waiting_bytes, 0, "given back once sent");
    let stats = pubsub.stats();
    assert_eq!(
        (stats.delivered, stats.conflated, stats.dropped),
        (5, 2, 1),
        "{stats:?}"
    );
    // Room again: nothing waits, deliveries go straight out.
    written_out(&slow);
    pubsub.publish_with("t", Message::Text("x"), keyed("a"));
    list.run(usize::MAX);
    assert_eq!(marks(&slow), ["o9"]);
}

#[test]
fn conflation_closes_for_a_keyless_publication_when_asked_to() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate {
            close: Some(CloseCode::POLICY_VIOLATION),
        })
        .build();
    // Room for one frame ("x" is 3 bytes).
    let slow = conn(&list, 1, 3);
    pubsub.subscribe(&slow, "t").unwrap();
    pubsub.publish("t", Message::Text("x"));
    pubsub.publish_with("t", Message::Text("y"), PublishOptions::new().key("k"));
    pubsub.publish("t", Message::Text("z"));
    list.run(usize::MAX);
    assert!(!slow.shared().lock().is_open(), "closed");
    let stats = pubsub.stats();
    assert_eq!((stats.delivered, stats.closed), (1, 1), "{stats:?}");
}

#[test]
fn what_waits_for_a_subscription_that_ends_is_counted_gone() {
    let list = Arc::new(Loop::default());
    let pubsub = PubSub::builder()
        .overflow(Overflow::Conflate { close: None })
        .build();
    let padded: Arc<dyn Envelope> = Arc::new(Padded);
    // Room for two frames, and one waiting: "d" is dropped.
    let (cost, frame) = padded_costs();
    let bound = cost + 10;
    assert!(frame < bound && bound <= 2 * frame && bound < 2 * cost);
    let slow = conn(&list, 1, bound);
    pubsub
        .subscribe_with(&slow, "t", &Subscribe::new().envelope(padded))
        .unwrap();
    for key in ["a", "b", "c", "d"] {
        pubsub.publish_with("t", Message::Text("x"), PublishOptions::new().key(key));
    }
    list.run(usize::MAX);
    assert!(pubsub.usage().waiting_bytes > 0);
    assert!(pubsub.unsubscribe(&slow, "t"));
    assert_eq!(pubsub.usage().waiting_bytes, 0, "given back when it ends");
    written_out(&slow);
    list.run(usize::MAX);
    let stats = pubsub.stats();
    assert_eq!(
        (stats.delivered, stats.dropped, stats.gone),
        (2, 1, 1),
        "{stats:?}"
    );
}

fn text(payload: &str) -> (Option<&str>, OpCode, &[u8]) {
    (None, OpCode::Text, payload.as_bytes())
}

/// A `PubSub` keeping 10 publications per topic, and a connection on a
/// stand-in loop subscribed to `t` with [`Marks`].
fn subscribed_with_marks() -> (PubSub, Arc<Loop>, Conn, Arc<dyn Envelope>) {
    let pubsub = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .build();
    let list = Arc::new(Loop::default());
    let a = conn(&list, 1, 1 << 20);
    let marks: Arc<dyn Envelope> = Arc::new(Marks);
    pubsub
        .subscribe_with(&a, "t", &Subscribe::new().envelope(marks.clone()))
        .unwrap();
    (pubsub, list, a, marks)
}

#[test]
fn publications_numbered_elsewhere_arrive_in_order_once_and_a_gap_is_told() {
    let (pubsub, list, a, marks) = subscribed_with_marks();
    let epoch = Epoch::from_u64(0xe);
    let at = |offset| Position { epoch, offset };
    // The first from elsewhere sets the numbering, silently.
    assert!(matches!(
        pubsub.publish_at("t", at(41), text("x"), None, false),
        Placed::Delivered(_)
    ));
    assert!(matches!(
        pubsub.publish_at("t", at(41), text("x"), None, false),
        Placed::Duplicate
    ));
    assert!(matches!(
        pubsub.publish_at("t", at(44), text("x"), None, false),
        Placed::Missing { after: 41 }
    ));
    pubsub.publish_at("t", at(42), text("x"), None, false);
    pubsub.publish_at("t", at(44), text("x"), None, true);
    list.run(usize::MAX);
    assert_eq!(frames(&a), ["o41", "o42", "rfalse", "o44"]);
    assert_eq!(pubsub.position("t"), Some(at(44)));
    // A resume within what is kept since the gap is whole.
    let b = conn(&list, 2, 1 << 20);
    let how = Subscribe::new().envelope(marks.clone());
    pubsub
        .subscribe_with(&b, "t", &how.clone().start(Start::After(at(43))))
        .unwrap();
    assert_eq!(frames(&b), ["o44", "rtrue"]);
    // A new epoch from elsewhere: told, numbered anew.
    let next = Position {
        epoch: Epoch::from_u64(0xf),
        offset: 1,
    };
    pubsub.publish_at("t", next, text("y"), None, false);
    list.run(usize::MAX);
    assert_eq!(frames(&a), ["rfalse", "o1"]);
    assert_eq!(frames(&b), ["rfalse", "o1"]);
}

#[test]
fn a_publication_that_could_not_be_recorded_breaks_the_numbering_until_redis_is_back() {
    let (pubsub, list, a, _) = subscribed_with_marks();
    let epoch = Epoch::from_u64(0xe);
    pubsub.publish_at("t", Position { epoch, offset: 7 }, text("x"), None, false);
    // Redis gone: numbered here, in an epoch of this node's own.
    let here = pubsub.publish_frame("t", PublishOptions::new(), OpCode::Text, b"y", true);
    let here = here.position.unwrap();
    assert_ne!(here.epoch, epoch);
    assert_eq!(here.offset, 8);
    assert_eq!(pubsub.missing("t", Start::After(here)), Some((8, None)));
    // Redis back, with its own numbering: the subscriber is told.
    pubsub.publish_at("t", Position { epoch, offset: 9 }, text("z"), None, false);
    list.run(usize::MAX);
    assert_eq!(frames(&a), ["o7", "o8", "rfalse", "o9"]);
}

#[test]
fn history_loaded_from_elsewhere_is_replayed_and_joins_the_live_ones() {
    let pubsub = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .build();
    let list = Arc::new(Loop::default());
    let epoch = Epoch::from_u64(0xab);
    let seen = Position { epoch, offset: 3 };
    assert_eq!(pubsub.missing("t", Start::After(seen)), Some((3, None)));
    let loaded = |offsets: std::ops::RangeInclusive<u64>| {
        offsets
            .map(|offset| Loaded {
                offset,
                key: None,
                opcode: OpCode::Text,
                payload: format!("p{offset}").into_bytes(),
                at: Instant::now(),
            })
            .collect()
    };
    // Redis holds 6..=9 (its latest is 9); this node had nothing.
    pubsub.load("t", epoch, 9, loaded(6..=9));
    assert_eq!(pubsub.position("t"), Some(Position { epoch, offset: 9 }));
    assert_eq!(
        pubsub.missing("t", Start::After(seen)),
        Some((3, Some(6))),
        "4 and 5 are not held"
    );
    // Older ones load in front; then the resume is whole.
    pubsub.load("t", epoch, 9, loaded(4..=5));
    assert_eq!(pubsub.missing("t", Start::After(seen)), None);
    let a = conn(&list, 1, 1 << 20);
    let how = Subscribe::new()
        .envelope(Arc::new(Marks))
        .start(Start::After(seen));
    let subscribed = pubsub.subscribe_with(&a, "t", &how).unwrap();
    assert_eq!(subscribed.recovered, Some(true));
    pubsub.publish_at("t", Position { epoch, offset: 9 }, text("dup"), None, false);
    pubsub.publish_at(
        "t",
        Position { epoch, offset: 10 },
        text("live"),
        None,
        false,
    );
    list.run(usize::MAX);
    assert_eq!(
        frames(&a),
        ["o4", "o5", "o6", "o7", "o8", "o9", "rtrue", "o10"]
    );
    // Loads that do not fit change nothing.
    pubsub.load("t", epoch, 10, loaded(1..=2));
    assert_eq!(
        pubsub.missing("t", Start::After(Position { epoch, offset: 1 })),
        Some((1, Some(4)))
    );
}

#[test]
fn topics_handed_over_number_on_and_a_moved_subscriber_resumes_quietly_once() {
    // The predecessor: two topics; a subscriber of `t` has been sent up
    // to offset 3.
    let (old, list, a, marks) = subscribed_with_marks();
    for n in 1..=3 {
        old.publish("t", Message::Text(&format!("p{n}")));
    }
    old.publish("u", Message::Text("not kept"));
    list.run(usize::MAX);
    assert_eq!(frames(&a), ["o1", "o2", "o3"]);
    let moved_at = old.position("t").unwrap();
    let bytes = old.hand_off();

    // The successor takes the topics, publishes two more, then the
    // subscriber arrives and resumes from where it was.
    let new = PubSub::builder()
        .history(History::new(10, Duration::from_secs(60)))
        .build();
    assert_eq!(new.take_over(&bytes), Ok(2), "`t` and `u`, both kept");
    assert_eq!(new.position("t"), Some(moved_at), "numbering goes on");
    assert_eq!(
        new.publish("t", Message::Text("p4"))
            .position
            .unwrap()
            .offset,
        4
    );
    assert_eq!(
        new.publish("t", Message::Text("p5"))
            .position
            .unwrap()
            .offset,
        5
    );
    let list = Arc::new(Loop::default());
    let b = conn(&list, 2, 1 << 20);
    let how = Subscribe::new()
        .envelope(marks.clone())
        .after_handoff(moved_at);
    let subscribed = new.subscribe_with(&b, "t", &how).unwrap();
    assert_eq!(subscribed.recovered, Some(true));
    new.publish("t", Message::Text("p6"));
    list.run(usize::MAX);
    // Nothing twice, nothing missing, and no "recovered" signal.
    assert_eq!(frames(&b), ["o4", "o5", "o6"]);
    // One that missed more than history holds is told.
    let c = conn(&list, 3, 1 << 20);
    let older = Position {
        epoch: moved_at.epoch,
        offset: 0,
    };
    let mut cut = bytes.clone();
    // (A history of 10 holds 1..=5 here: resume from 0 is whole too.)
    let how = Subscribe::new().envelope(marks).after_handoff(older);
    new.subscribe_with(&c, "t", &how).unwrap();
    assert_eq!(frames(&c), ["o1", "o2", "o3", "o4", "o5", "o6"]);

    // A handoff that failed after this: the successor's numbering is
    // disowned. A subscriber given back at the old epoch's end missed
    // nothing; an older position is told it was not kept whole.
    let ended = new.position("t").unwrap();
    new.renumber();
    let renumbered = new.position("t").unwrap();
    assert_ne!(renumbered.epoch, ended.epoch);
    assert_eq!(renumbered.offset, 0);
    let d = conn(&list, 4, 1 << 20);
    let how = Subscribe::new()
        .envelope(Arc::new(Marks))
        .after_handoff(ended);
    assert_eq!(
        new.subscribe_with(&d, "t", &how).unwrap().recovered,
        Some(true)
    );
    let e = conn(&list, 5, 1 << 20);
    let how = Subscribe::new()
        .envelope(Arc::new(Marks))
        .after_handoff(moved_at);
    assert_eq!(
        new.subscribe_with(&e, "t", &how).unwrap().recovered,
        Some(false)
    );
    new.publish("t", Message::Text("p1 again"));
    list.run(usize::MAX);
    assert_eq!(frames(&d), ["o1"]);
    assert_eq!(frames(&e), ["rfalse", "o1"]);

    // Altered or cut bytes are refused, never a panic.
    for end in 0..cut.len() {
        assert!(
            PubSub::new().take_over(&cut[..end]).is_err(),
            "cut at {end}"
        );
    }
    cut[0] = 9;
    assert!(PubSub::new().take_over(&cut).is_err());
}
