//! The notify_bus example under the floods its byte budgets are for, on
//! both backends: 1 MiB publications over many topics with history on,
//! thousands of topics with long names, history nobody publishes after,
//! one conflating subscriber that never reads while batches of distinct
//! keys arrive, and bodies made to be answered with errors. Each time
//! the bound holds (seen in `/stats` and in the process's memory), the
//! oldest or the offender goes first, a subscriber that misses something
//! is told, and the bus keeps answering everyone else.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{next, resident_of, send_text, start_example};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A publisher on one kept-alive HTTP/1.1 connection.
struct Publisher {
    stream: BufReader<TcpStream>,
}

impl Publisher {
    async fn new(addr: SocketAddr) -> Publisher {
        let stream = TcpStream::connect(addr).await.unwrap();
        Publisher {
            stream: BufReader::new(stream),
        }
    }

    /// Sends a request and reads its answer: the status line and the body.
    async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> (String, String) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // One write: a head and a body written apart wait for a delayed
        // acknowledgement (Nagle), 40 ms a request.
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await.unwrap();
        let (head, body) = common::read_response(&mut self.stream, false)
            .await
            .expect("an answer");
        (head.lines().next().unwrap().to_owned(), body)
    }

    async fn stats(&mut self) -> serde_json::Value {
        let (status, body) = self.request("GET", "/stats", b"").await;
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        serde_json::from_str(&body).unwrap()
    }
}

async fn subscribe(addr: SocketAddr, query: &str) -> common::Client {
    let url = format!("ws://{addr}/ws{query}");
    tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade")
        .0
}

async fn json(client: &mut common::Client) -> serde_json::Value {
    match next(client).await {
        WsMessage::Text(text) => serde_json::from_str(&text).unwrap(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// `--history 100` with a 32 MiB budget: 1 MiB publications over 200
/// topics (200 MiB offered, where count and age alone would keep it all)
/// keep at most 32 MiB, the oldest let go first; a subscriber resuming
/// from before what was let go is told so, one resuming on a recent topic
/// gets all it missed. Then 1 KB topic names published to by the
/// thousand, with a 2 MiB budget for topics: the rest are refused, and so
/// is a subscribe to yet another.
async fn history_and_topics_stay_within_their_budgets(backend: &str) {
    let args = [
        "--backend",
        backend,
        "--history",
        "100",
        "--max-message-size",
        "2000000",
        "--max-history-bytes",
        "33554432",
        "--max-topic-bytes",
        "2097152",
    ];
    let (bus, addr) = start_example("notify_bus", &args).await;
    let mut publisher = Publisher::new(addr).await;
    let before = resident_of(&bus);
    let body = "h".repeat(1 << 20);
    let mut positions = Vec::new();
    for round in 0..200 {
        let path = format!("/publish/t{round}");
        let (status, answer) = publisher.request("POST", &path, body.as_bytes()).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        positions.push(answer["epoch"].as_str().unwrap().to_owned());
    }
    let grown = resident_of(&bus).saturating_sub(before);
    let stats = publisher.stats().await;
    let usage = &stats["usage"];
    eprintln!(
        "{backend}: 200 MiB published over 200 topics; RSS grew {} MiB; {usage}",
        grown >> 20
    );
    assert!(
        usage["history_bytes"].as_u64().unwrap() <= 32 << 20,
        "{usage}"
    );
    assert!(usage["history_shed"].as_u64().unwrap() >= 160, "{usage}");
    assert!(grown < 96 << 20, "RSS grew {} MiB", grown >> 20);

    // The newest topic kept its publication; the oldest did not.
    let query = format!("?positions=1&since=t199:{}:0", positions[199]);
    let mut recent = subscribe(addr, &query).await;
    let delivery = json(&mut recent).await;
    assert_eq!(
        (&delivery["topic"], &delivery["offset"]),
        (&"t199".into(), &1.into())
    );
    let told = json(&mut recent).await;
    assert_eq!(
        told,
        serde_json::json!({"topic": "t199", "recovered": true})
    );
    let query = format!("?positions=1&since=t0:{}:0", positions[0]);
    let mut oldest = subscribe(addr, &query).await;
    let told = json(&mut oldest).await;
    assert_eq!(told, serde_json::json!({"topic": "t0", "recovered": false}));

    // Topics with 1 KB names, 1,000 a request: the budget keeps some
    // 1,300 of 20,000, and refuses the rest.
    let long = "n".repeat(1000);
    for batch in 0..20 {
        let lines: String = (0..1000)
            .map(|i| format!("{{\"topic\":\"{long}{batch}-{i}\",\"data\":\"x\"}}\n"))
            .collect();
        let (status, answer) = publisher
            .request("POST", "/publish", lines.as_bytes())
            .await;
        assert_eq!(
            status,
            "HTTP/1.1 200 OK",
            "{}",
            &answer[..200.min(answer.len())]
        );
    }
    let stats = publisher.stats().await;
    let usage = &stats["usage"];
    eprintln!("{backend}: 20,000 topics of 1 KB names offered; {usage}");
    assert!(usage["topic_bytes"].as_u64().unwrap() <= 2 << 20, "{usage}");
    assert!(
        usage["topics_refused"].as_u64().unwrap() > 15_000,
        "{usage}"
    );
    let kept = usage["topics"].as_u64().unwrap();
    assert!((500..3000).contains(&kept), "{usage}");
    // A subscriber asking for one more is told why.
    let mut late = subscribe(addr, "").await;
    send_text(&mut late, &format!("subscribe:{long}late")).await;
    match next(&mut late).await {
        WsMessage::Text(text) => assert!(text.contains("too many topics"), "{text}"),
        other => panic!("expected the refusal, got {other:?}"),
    }
    drop(bus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_topics_stay_within_their_budgets_on_tokio() {
    history_and_topics_stay_within_their_budgets("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_topics_stay_within_their_budgets_on_uring() {
    history_and_topics_stay_within_their_budgets("uring").await;
}

/// `--history-secs 1`: what 50 topics kept is let go, topics and all,
/// within a few seconds of its age, though nothing is published after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_history_is_let_go_on_time_without_publishes() {
    let args = ["--history", "10", "--history-secs", "1"];
    let (_bus, addr) = start_example("notify_bus", &args).await;
    let mut publisher = Publisher::new(addr).await;
    for topic in 0..50 {
        let path = format!("/publish/t{topic}");
        let (status, _) = publisher.request("POST", &path, b"x").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
    }
    let published = Instant::now();
    let usage = publisher.stats().await["usage"].clone();
    assert_eq!(usage["topics"], 50, "{usage}");
    loop {
        let usage = publisher.stats().await["usage"].clone();
        if usage["topics"] == 0 && usage["history_bytes"] == 0 {
            break;
        }
        assert!(
            published.elapsed() < Duration::from_secs(10),
            "still kept: {usage}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "50 topics let go {:?} after their publishes",
        published.elapsed()
    );
}

/// A raw subscriber that never reads a byte.
async fn stuck_subscriber(addr: SocketAddr, query: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = common::upgrade_request(&format!("/ws{query}"), "");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = common::read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    stream
}

/// `--overflow conflate` and one subscriber that never reads: 60 NDJSON
/// batches of 2,000 publications with distinct keys (some 80,000 that
/// would wait) while another client asks for `/stats` throughout. Every batch
/// and every `/stats` is answered, what waits stays within the
/// subscriber's queue bound (4 MiB, counted as it costs), and the rest is
/// dropped for it.
async fn conflation_cannot_stall_the_bus(backend: &str) {
    let args = ["--backend", backend, "--overflow", "conflate"];
    let (bus, addr) = start_example("notify_bus", &args).await;
    let _stuck = stuck_subscriber(addr, "?topics=c").await;
    let watcher = tokio::spawn(async move {
        let mut watcher = Publisher::new(addr).await;
        let mut slowest = Duration::ZERO;
        let mut asked = 0;
        loop {
            let start = Instant::now();
            let stats = watcher.stats().await;
            slowest = slowest.max(start.elapsed());
            asked += 1;
            if stats["published"].as_u64().unwrap() >= 120_000 {
                return (slowest, asked, stats);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut publisher = Publisher::new(addr).await;
    let mut times = Vec::new();
    // 100 bytes each: the stuck subscriber's queue (4 MiB) fills with the
    // first 40,000 or so, and the rest would wait.
    let value = "v".repeat(100);
    for batch in 0..60 {
        let lines: String = (0..2000)
            .map(|i| format!("{{\"topic\":\"c\",\"data\":\"{value}\",\"key\":\"k{batch}-{i}\"}}\n"))
            .collect();
        let start = Instant::now();
        let (status, _) = publisher
            .request("POST", "/publish", lines.as_bytes())
            .await;
        times.push(start.elapsed());
        assert_eq!(status, "HTTP/1.1 200 OK");
    }
    let (slowest, asked, stats) = tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .expect("/stats kept answering")
        .unwrap();
    times.sort();
    eprintln!(
        "{backend}: batches of 2,000 keys: median {:?}, slowest {:?}; {asked} /stats, slowest {slowest:?}; RSS {} MiB; {stats}",
        times[times.len() / 2],
        times[times.len() - 1],
        resident_of(&bus) >> 20
    );
    let waiting = stats["usage"]["waiting_bytes"].as_u64().unwrap();
    assert!(waiting <= 4 << 20, "{stats}");
    assert!(stats["dropped"].as_u64().unwrap() > 10_000, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflation_cannot_stall_the_bus_on_tokio() {
    conflation_cannot_stall_the_bus("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflation_cannot_stall_the_bus_on_uring() {
    conflation_cannot_stall_the_bus("uring").await;
}

/// Bodies made to be answered with errors: a 1 MiB body of `x` lines is
/// refused whole with a one-line reason (not answered line by line), a
/// batch past 10,000 lines is refused, and a batch with a few bad lines is
/// answered line by line as before; sixty publishers that send such
/// bodies and never read cost the bus little.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_stay_small() {
    let (bus, addr) = start_example("notify_bus", &[]).await;
    let mut publisher = Publisher::new(addr).await;
    let junk = "x\n".repeat(1 << 19);
    let (status, answer) = publisher.request("POST", "/publish", junk.as_bytes()).await;
    // 524,288 lines: past the batch's bound, before any is read.
    assert!(status.starts_with("HTTP/1.1 413 "), "{status}");
    assert!(answer.len() < 200, "{answer}");
    let junk = "x\n".repeat(5000);
    let (status, answer) = publisher.request("POST", "/publish", junk.as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 400 "), "{status}");
    assert!(answer.starts_with("5000 of 5000 lines"), "{answer}");
    assert!(answer.len() < 300, "{answer}");
    // A few bad lines: answered line by line, the good ones published.
    let mixed: String = (0..100)
        .map(|i| match i % 10 {
            0 => "nope\n".to_owned(),
            // JSON, but not an object.
            5 => "1\n".to_owned(),
            _ => format!("{{\"topic\":\"m\",\"data\":\"{i}\"}}\n"),
        })
        .collect();
    let (status, answer) = publisher
        .request("POST", "/publish", mixed.as_bytes())
        .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 100);
    assert_eq!(lines.iter().filter(|l| l.contains("error")).count(), 20);
    assert!(
        lines.contains(&r#"{"error":"not a JSON object"}"#),
        "{answer}"
    );

    // Sixty publishers send 1 MiB of junk each and never read.
    let before = resident_of(&bus);
    let junk = "x\n".repeat(1 << 19);
    let mut silent = Vec::new();
    for _ in 0..60 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /publish HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n",
            junk.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(junk.as_bytes()).await.unwrap();
        silent.push(stream);
    }
    // Everyone else is still served, and the bus holds little for them.
    let stats = publisher.stats().await;
    let grown = resident_of(&bus).saturating_sub(before);
    eprintln!(
        "60 silent publishers of 1 MiB junk: RSS grew {} MiB",
        grown >> 20
    );
    assert!(grown < 128 << 20, "grew {} MiB; {stats}", grown >> 20);
    for mut stream in silent {
        let mut answer = [0u8; 13];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut answer))
            .await
            .expect("answered")
            .unwrap();
        assert_eq!(&answer, b"HTTP/1.1 413 ");
    }
}
