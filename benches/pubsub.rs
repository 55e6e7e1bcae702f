//! The topic registry at a million subscriptions. 5,000 WebSocket
//! connections (tokio-tungstenite clients, each draining what it gets) to a
//! rapidws server on the tokio backend, in this process over loopback; each
//! is subscribed to 200 of 100,000 topics, 10 subscribers a topic.
//!
//! Prints what the million subscriptions cost: the RSS they added (bytes
//! per subscription, the connections' own memory aside) and the time
//! subscribing them took on one thread. Then criterion times, with the
//! million in place and, for comparison, in a `PubSub` holding only what is
//! measured:
//! - `subscribe_unsubscribe`: one more topic on one connection, and back;
//! - `publish_10`: a 64-byte text to a topic with 10 subscribers, in
//!   bursts of 1,000: the publish itself (the frame built, the hand-off to
//!   each loop), not the delivery, which runs on the loops between bursts.
//!
//! `cargo bench --bench pubsub` (Linux: RSS from `/proc/self/status`;
//! about 10,100 open files, see `ulimit -n`).

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::StreamExt;
use rapidws::pubsub::PubSub;
use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request, ServerHandler};

const CONNECTIONS: usize = 5_000;
const TOPICS_EACH: usize = 200;
const TOPICS: usize = 100_000;
/// Connections outside the million, for the comparison `PubSub`.
const SPARE: usize = 10;
/// Publishes timed back to back before the loops catch up.
const BURST: u64 = 1_000;

/// Keeps every connection's handle.
struct Keep(Arc<Mutex<Vec<Conn>>>);

impl Handler for Keep {
    type State = ();

    fn on_open(&self, conn: &Conn, _: &mut ()) {
        self.0.lock().unwrap().push(conn.clone());
    }

    fn on_message(&self, _: &Conn, _: &mut (), _: Message<'_>) {}
}

impl ServerHandler for Keep {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }
}

fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| {
            kb.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// The server and its connections, with the clients draining on `runtime`.
fn connections(runtime: &tokio::runtime::Runtime) -> Vec<Conn> {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let total = CONNECTIONS + SPARE;
    runtime.block_on(async {
        let server =
            rapidws::tokio::Server::bind("127.0.0.1:0", Keep(kept.clone()), Config::default())
                .await
                .expect("bind");
        let url = format!("ws://{}/", server.local_addr().unwrap());
        tokio::spawn(server.serve());
        for _ in 0..total {
            let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str())
                .await
                .expect("connect");
            tokio::spawn(async move { while let Some(Ok(_)) = socket.next().await {} });
        }
        while kept.lock().unwrap().len() < total {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    std::mem::take(&mut *kept.lock().unwrap())
}

fn registry(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let conns = connections(&runtime);
    let (subscribed, spare) = conns.split_at(CONNECTIONS);
    let topic = |n: usize| format!("t{}", n % TOPICS);
    let names: Vec<String> = (0..TOPICS).map(topic).collect();

    let big = PubSub::new();
    let before = rss();
    let started = Instant::now();
    for (i, conn) in subscribed.iter().enumerate() {
        for j in 0..TOPICS_EACH {
            big.subscribe(conn, &names[(i * TOPICS_EACH + j) % TOPICS])
                .unwrap();
        }
    }
    let took = started.elapsed();
    let added = rss().saturating_sub(before);
    let n = CONNECTIONS * TOPICS_EACH;
    assert_eq!(big.subscribers("t42"), n / TOPICS);
    println!(
        "pubsub: {n} subscriptions ({} topics, {} each): {} bytes each \
         ({:.1} MiB of RSS), subscribed in {:.2} s ({:.0} ns each)",
        big.topic_count(),
        n / TOPICS,
        added / n,
        added as f64 / (1 << 20) as f64,
        took.as_secs_f64(),
        took.as_nanos() as f64 / n as f64,
    );

    // The same shapes with nothing else in the registry.
    let small = PubSub::new();
    for conn in spare {
        small.subscribe(conn, "t42").unwrap();
    }
    let payload = "x".repeat(64);
    let mut group = c.benchmark_group("pubsub");
    for (name, pubsub, conn) in [("1M", &big, &subscribed[0]), ("alone", &small, &spare[0])] {
        group.bench_function(format!("subscribe_unsubscribe/{name}"), |b| {
            b.iter(|| {
                pubsub.subscribe(conn, black_box("extra")).unwrap();
                pubsub.unsubscribe(conn, black_box("extra"))
            })
        });
        // Publishes in bursts the loops can take (see "Bounded" in
        // `rapidws::pubsub`), timed; between bursts, untimed, the loops
        // deliver them. Nothing is dropped, so every publish is measured
        // doing its whole job.
        group.bench_function(format!("publish_10/{name}"), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let burst = left.min(BURST);
                    let stats = pubsub.stats();
                    let due = stats.delivered + stats.dropped + burst * 10;
                    let started = Instant::now();
                    for _ in 0..burst {
                        black_box(pubsub.publish(black_box("t42"), Message::Text(&payload)));
                    }
                    timed += started.elapsed();
                    left -= burst;
                    // Dropped would mean a loop fell 16 MiB behind: counted
                    // here so the wait ends, and failed on below.
                    while {
                        let stats = pubsub.stats();
                        stats.delivered + stats.dropped < due
                    } {
                        std::thread::yield_now();
                    }
                }
                timed
            })
        });
        assert_eq!(pubsub.stats().dropped, 0, "{name}: publishes dropped");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = registry
}
criterion_main!(benches);
