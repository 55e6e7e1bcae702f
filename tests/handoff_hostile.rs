//! Processes of the server's own user that connect to its handoff socket
//! and are no successor, or a broken one: they close at once, speak
//! garbage, say nothing, refuse the state or a batch. The running
//! process (the echo example and notify_bus, on tokio and io_uring) must
//! lose nothing: every client keeps talking without a close, new clients
//! are answered by it (20 of 20), its topics keep their epoch and
//! numbering, no listening socket leaves it, and what each costs is
//! bounded (nothing at all before the greeting; 2 s at most after).
//! Then a real successor still takes over.
#![cfg(target_os = "linux")]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::successor::RawSuccessor;
use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// A path for a handoff socket, unique to the test.
fn socket_path(name: &str) -> PathBuf {
    common::successor::socket_path("hostile", name)
}

/// What a hostile process at the handoff socket does.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// Connects and closes at once.
    CloseAtOnce,
    /// Takes the greeting and closes.
    CloseAfterGreeting,
    /// Answers the greeting with bytes that are no message.
    Garbage,
    /// Takes the greeting and says nothing.
    Silent,
    /// Greets back, takes the state, answers with a message of no kind.
    GarbageForTheState,
    /// Greets back, takes the state and refuses it.
    RefusesTheState,
    /// Greets back, takes the state and says nothing.
    SilentAfterTheState,
    /// Acknowledges the state, takes the first batch and refuses it.
    RefusesTheFirstBatch,
}

const EVERY_WAY: [Hostile; 8] = [
    Hostile::CloseAtOnce,
    Hostile::CloseAfterGreeting,
    Hostile::Garbage,
    Hostile::Silent,
    Hostile::GarbageForTheState,
    Hostile::RefusesTheState,
    Hostile::SilentAfterTheState,
    Hostile::RefusesTheFirstBatch,
];

impl Hostile {
    /// Whether the running process stopped anything for it (it greeted
    /// back, and the state left).
    fn got_the_state(self) -> bool {
        matches!(
            self,
            Hostile::GarbageForTheState
                | Hostile::RefusesTheState
                | Hostile::SilentAfterTheState
                | Hostile::RefusesTheFirstBatch
        )
    }

    /// Whether it answers nothing, and is waited for.
    fn silent(self) -> bool {
        matches!(self, Hostile::Silent | Hostile::SilentAfterTheState)
    }
}

/// What one hostile process saw.
struct Played {
    /// From its connect until the running process ended the channel.
    ended_after: Duration,
    descriptors: usize,
    listening: usize,
}

/// Plays `hostile` at `socket`, blocking.
fn play(socket: &Path, hostile: Hostile) -> Played {
    let start = Instant::now();
    let mut raw = RawSuccessor::connect(socket);
    match hostile {
        Hostile::CloseAtOnce => {}
        Hostile::CloseAfterGreeting => {
            assert!(raw.next().is_some(), "the greeting");
        }
        Hostile::Garbage => {
            assert!(raw.next().is_some(), "the greeting");
            use std::io::Write;
            let _ = raw
                .stream
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\x00\x13\x37");
        }
        Hostile::Silent => {
            assert!(raw.next().is_some(), "the greeting");
        }
        Hostile::GarbageForTheState => {
            raw.take_state();
            raw.send(b"Zhello");
        }
        Hostile::RefusesTheState => {
            raw.take_state();
            raw.refuse("no thanks");
        }
        Hostile::SilentAfterTheState => {
            raw.take_state();
        }
        Hostile::RefusesTheFirstBatch => {
            raw.take_state();
            assert!(raw.ack());
            let batch = raw.next().expect("a batch");
            assert_eq!(batch[0], b'B', "a batch of connections, not the end");
            assert!(raw.descriptors > 0, "the batch's connections");
            raw.refuse("not these");
        }
    }
    if !matches!(hostile, Hostile::CloseAtOnce | Hostile::CloseAfterGreeting) {
        assert!(
            raw.closed_within(Duration::from_secs(5)),
            "{hostile:?}: the running process did not end the channel within 5 s"
        );
    }
    Played {
        ended_after: start.elapsed(),
        descriptors: raw.descriptors,
        listening: raw.listening,
    }
}

/// Plays `hostile` on a blocking thread, and checks what it saw: no
/// listening socket ever, no descriptor before a batch, and the running
/// process ended a silent one within 2 s and a bit.
async fn play_and_check(socket: &Path, hostile: Hostile) {
    let socket = socket.to_owned();
    let played = tokio::task::spawn_blocking(move || play(&socket, hostile))
        .await
        .unwrap();
    assert_eq!(
        played.listening, 0,
        "{hostile:?} was given a listening socket"
    );
    if !matches!(hostile, Hostile::RefusesTheFirstBatch) {
        assert_eq!(played.descriptors, 0, "{hostile:?} was given descriptors");
    }
    if hostile.silent() {
        assert!(
            played.ended_after < Duration::from_millis(3500),
            "{hostile:?} was waited for {:?}",
            played.ended_after
        );
    }
}

/// The longest a client waits for an answer while `hostile` plays: not
/// at all (what the machine's load adds) unless the state left; then 2 s
/// for a silent one, and little for one that answers at once.
fn bound(hostile: Hostile) -> Duration {
    match (hostile.got_the_state(), hostile.silent()) {
        (true, true) => Duration::from_millis(3500),
        // (Before the handoff's timeouts were bounded, a silent process
        // froze publishing for 10 s.)
        _ => Duration::from_millis(1500),
    }
}

// ---------------------------------------------------------------- echo

/// What a talking client saw.
struct Talked {
    echoed: u64,
    worst: Duration,
}

/// Sends numbered texts and waits for each echo until `stop`; any close,
/// error or wrong echo fails.
async fn talk(url: String, id: usize, stop: Arc<AtomicBool>) -> Talked {
    let (mut client, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("upgraded");
    let mut talked = Talked {
        echoed: 0,
        worst: Duration::ZERO,
    };
    while !stop.load(Ordering::Relaxed) {
        let text = format!("{id}:{}", talked.echoed);
        let sent = Instant::now();
        client.send(Message::text(text.clone())).await.unwrap();
        let echo = tokio::time::timeout(Duration::from_secs(20), client.next())
            .await
            .unwrap_or_else(|_| panic!("client {id}: no echo of {text} within 20 s"))
            .unwrap_or_else(|| panic!("client {id}: the connection ended"))
            .unwrap_or_else(|error| panic!("client {id}: {error}"));
        assert_eq!(echo, Message::text(text), "client {id}");
        talked.worst = talked.worst.max(sent.elapsed());
        talked.echoed += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = client.close(None).await;
    talked
}

/// A new client gets its echo within 10 s.
async fn new_client_echoes(url: &str, n: usize) {
    let connect = tokio_tungstenite::connect_async(url);
    let (mut client, _) = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .unwrap_or_else(|_| panic!("new client {n} not answered within 10 s"))
        .unwrap_or_else(|error| panic!("new client {n}: {error}"));
    client
        .send(Message::text(format!("new {n}")))
        .await
        .unwrap();
    let echo = tokio::time::timeout(Duration::from_secs(10), client.next())
        .await
        .unwrap_or_else(|_| panic!("new client {n}: no echo within 10 s"));
    assert_eq!(echo.unwrap().unwrap(), Message::text(format!("new {n}")));
    let _ = client.close(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_successors_cost_echo_clients_nothing() {
    echo_against_hostiles("echo-tokio", "tokio").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_successors_cost_io_uring_echo_clients_nothing() {
    echo_against_hostiles("echo-uring", "uring").await;
}

async fn echo_against_hostiles(name: &str, backend: &str) {
    let socket = socket_path(name);
    let path = socket.to_str().unwrap();
    let args = ["--handoff-socket", path, "--backend", backend];
    let (mut old, addr) = start_example("echo", &args).await;
    let url = format!("ws://{addr}/");
    for hostile in EVERY_WAY {
        let stop = Arc::new(AtomicBool::new(false));
        let talking: Vec<_> = (0..20)
            .map(|id| tokio::spawn(talk(url.clone(), id, stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        play_and_check(&socket, hostile).await;
        // New clients are answered, by the running process.
        for n in 0..20 {
            new_client_echoes(&url, n).await;
        }
        stop.store(true, Ordering::Relaxed);
        for task in talking {
            let talked = task.await.unwrap();
            assert!(talked.echoed > 0);
            assert!(
                talked.worst < bound(hostile),
                "{hostile:?} ({backend}): a client waited {:?} for an echo",
                talked.worst
            );
        }
        assert!(
            old.0.try_wait().unwrap().is_none(),
            "{hostile:?}: it exited"
        );
    }
    // A real successor still takes over, and answers.
    let mut new = Child(
        std::process::Command::new(example("echo"))
            .args(["--addr", &addr.to_string(), "--backend", backend])
            .args(["--take-over", path])
            .spawn()
            .unwrap(),
    );
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
    new_client_echoes(&url, 20).await;
    drop(new.0.kill());
}

// ----------------------------------------------------------------- bus

/// Publishes `body` to `topic` on a connection of its own: the position
/// given (epoch, offset).
async fn publish(addr: SocketAddr, topic: &str, body: &str) -> (String, u64) {
    let request = format!(
        "POST /publish/{topic} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    json_position(&http_exchange(addr, &request).await)
}

/// `GET /topics/<topic>`: its epoch and latest offset.
async fn topic(addr: SocketAddr, topic: &str) -> (String, u64) {
    let request = format!("GET /topics/{topic} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\r\n");
    json_position(&http_exchange(addr, &request).await)
}

/// The epoch and offset of an answer's JSON body.
fn json_position(response: &str) -> (String, u64) {
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    let value: serde_json::Value = serde_json::from_str(body).unwrap();
    (
        value["epoch"].as_str().unwrap().to_owned(),
        value["offset"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_successors_cost_the_bus_nothing() {
    bus_against_hostiles("bus-tokio", "tokio").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_successors_cost_the_io_uring_bus_nothing() {
    bus_against_hostiles("bus-uring", "uring").await;
}

/// Subscribers with positions on one topic, and a publisher every 50 ms
/// while each hostile process plays: every publication is numbered on in
/// the same epoch (none is renumbered: no successor took anything), each
/// answered within the bound, and every subscriber gets them all, once,
/// in order, without a close.
async fn bus_against_hostiles(name: &str, backend: &str) {
    let socket = socket_path(name);
    let path = socket.to_str().unwrap();
    let args = [
        "--history",
        "1000",
        "--handoff-socket",
        path,
        "--backend",
        backend,
    ];
    let (mut old, addr) = start_example("notify_bus", &args).await;
    let mut subscribers = Vec::new();
    for _ in 0..5 {
        let url = format!("ws://{addr}/ws?topics=a&positions=1");
        subscribers.push(tokio_tungstenite::connect_async(url).await.unwrap().0);
    }
    let (epoch, first) = publish(addr, "a", "1").await;
    assert_eq!(first, 1);
    for subscriber in &mut subscribers {
        assert_eq!(deliveries(subscriber, 1).await[0].1, 1);
    }
    let mut published = 1u64;
    for hostile in EVERY_WAY {
        let stop = Arc::new(AtomicBool::new(false));
        let publishing = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut positions = Vec::new();
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let next = published + positions.len() as u64 + 1;
                    positions.push(publish(addr, "a", &next.to_string()).await);
                    worst = worst.max(sent.elapsed());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (positions, worst)
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        play_and_check(&socket, hostile).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, Ordering::Relaxed);
        let (positions, worst) = publishing.await.unwrap();
        assert!(
            worst < bound(hostile),
            "{hostile:?} ({backend}): a publication waited {worst:?}"
        );
        let expected: Vec<(String, u64)> = (published + 1..=published + positions.len() as u64)
            .map(|offset| (epoch.clone(), offset))
            .collect();
        assert_eq!(positions, expected, "{hostile:?} ({backend}): renumbered");
        let from = published;
        published += positions.len() as u64;
        for subscriber in &mut subscribers {
            let got = deliveries(subscriber, (published - from) as usize).await;
            for (offset, (e, o, data)) in (from + 1..).zip(got) {
                assert_eq!((e.as_str(), o), (epoch.as_str(), offset), "{hostile:?}");
                assert_eq!(data, offset.to_string());
            }
        }
        assert_eq!(topic(addr, "a").await, (epoch.clone(), published));
        assert!(
            old.0.try_wait().unwrap().is_none(),
            "{hostile:?}: it exited"
        );
    }
    // A real successor still takes over, and numbers on.
    let mut new = Child(
        std::process::Command::new(example("notify_bus"))
            .args(["--addr", &addr.to_string(), "--history", "1000"])
            .args(["--backend", backend, "--take-over", path])
            .spawn()
            .unwrap(),
    );
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
    assert_eq!(
        publish(addr, "a", "after").await,
        (epoch.clone(), published + 1)
    );
    for subscriber in &mut subscribers {
        let got = deliveries(subscriber, 1).await;
        assert_eq!(
            (got[0].0.as_str(), got[0].1),
            (epoch.as_str(), published + 1)
        );
    }
    drop(new.0.kill());
}
