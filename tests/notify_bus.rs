//! The notify_bus example as its issue's command line starts it, on both
//! backends: WebSockets and HTTP on one port, subscriptions from the query
//! and from messages, publishing by POST with the count delivered, every
//! bad input answered with a 4xx and a reason while subscribers go on
//! receiving; and permessage-deflate subscribers with and without context
//! takeover reading every publication with Python `websockets`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    Client, delivered, next, raw_exchange, resident_of, send_text, start_example, upgrade_request,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Sends one HTTP request and returns the status line and the body.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (String, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // The server may answer (413) before taking the whole body.
    let _ = stream.write_all(body).await;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole response");
    let head = String::from_utf8(response[..split].to_vec()).unwrap();
    let status = head.lines().next().unwrap().to_owned();
    (status, response[split + 4..].to_vec())
}

async fn publish(addr: SocketAddr, topic: &str, body: &[u8]) -> (String, String) {
    let (status, body) = http(addr, "POST", &format!("/publish/{topic}"), body).await;
    (status, String::from_utf8(body).unwrap())
}

async fn subscribe(addr: SocketAddr, query: &str) -> Client {
    let url = format!("ws://{addr}/ws{query}");
    tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade")
        .0
}

async fn text(client: &mut Client) -> String {
    match next(client).await {
        WsMessage::Text(text) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// Sends `command` and waits until the bus has done it: commands on one
/// connection are done in order, and an unknown one is answered, so its
/// answer comes after the command's effect.
async fn command(client: &mut Client, command: &str) {
    send_text(client, command).await;
    send_text(client, "sync").await;
    assert!(text(client).await.starts_with("error: unknown command"));
}

async fn one_port_for_everything(backend: &str) {
    let (_bus, addr) = start_example(
        "notify_bus",
        &["--backend", backend, "--max-message-size", "100000"],
    )
    .await;
    // The page, and the counters.
    let (status, page) = http(addr, "GET", "/", b"").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(String::from_utf8(page).unwrap().contains("/publish/"));

    let mut both = subscribe(addr, "?topics=a,b%20c").await;
    let mut only_a = subscribe(addr, "?topics=a").await;
    let (status, answer) = publish(addr, "a", b"to a").await;
    assert_eq!(status.as_str(), "HTTP/1.1 200 OK");
    assert_eq!(delivered(&answer), 2);
    assert_eq!(text(&mut both).await, "to a");
    assert_eq!(text(&mut only_a).await, "to a");
    // A percent-encoded topic, and a body that is not UTF-8: binary.
    let (_, answer) = publish(addr, "b%20c", &[0xff, 0x00, 0xfe]).await;
    assert_eq!(delivered(&answer), 1);
    assert_eq!(
        next(&mut both).await,
        WsMessage::Binary(vec![0xff, 0x00, 0xfe].into())
    );
    let (_, answer) = publish(addr, "nobody", b"x").await;
    assert_eq!(delivered(&answer), 0);

    // Subscriptions change by message.
    command(&mut only_a, "subscribe:late").await;
    let (_, answer) = publish(addr, "late", b"late news").await;
    assert_eq!(delivered(&answer), 1);
    assert_eq!(text(&mut only_a).await, "late news");
    command(&mut only_a, "unsubscribe:a").await;
    let (_, answer) = publish(addr, "a", b"a again").await;
    assert_eq!(delivered(&answer), 1);
    assert_eq!(text(&mut both).await, "a again");
    // Commands that cannot be done are answered on the socket.
    send_text(&mut only_a, "unsubscribe:a").await;
    assert_eq!(text(&mut only_a).await, "error: not subscribed to a");
    send_text(&mut only_a, "subscribe:").await;
    assert_eq!(text(&mut only_a).await, "error: empty topic name");
    send_text(&mut only_a, "dance").await;
    assert!(
        text(&mut only_a)
            .await
            .starts_with("error: unknown command")
    );

    // Bad input over HTTP: a 4xx with a reason each.
    let long = "t".repeat(1025);
    for (method, path, body, want_status, want_reason) in [
        ("POST", "/publish/", &b"x"[..], 400, "empty topic name"),
        (
            "POST",
            &*format!("/publish/{long}"),
            b"x",
            400,
            "longer than 1024",
        ),
        ("POST", "/publish/%zz", b"x", 400, "percent-encoded"),
        // Not a newline: a sign is no hex digit.
        ("POST", "/publish/%+A", b"x", 400, "percent-encoded"),
        ("POST", "/publish/big", &[b'x'; 100_001], 413, "too large"),
        ("GET", "/publish/a", b"", 405, "POST"),
        ("GET", "/nope", b"", 404, "not found"),
        ("GET", "/ws?topics=a", b"", 400, "Upgrade"),
    ] {
        let (status, reason) = http(addr, method, path, body).await;
        let reason = String::from_utf8(reason).unwrap();
        assert!(
            status.starts_with(&format!("HTTP/1.1 {want_status} ")),
            "{method} {path}: {status}"
        );
        assert!(reason.contains(want_reason), "{method} {path}: {reason}");
    }
    // Refused upgrades, each with its reason: an empty name in the list
    // (an empty list is no topic), a broken one.
    for query in ["topics=a,,b", "topics=a,", "latest=,a"] {
        let request = upgrade_request(&format!("/ws?{query}"), "");
        let response = raw_exchange(addr, request.as_bytes()).await;
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 400 "), "{query}: {response}");
        assert!(response.contains("empty topic name"), "{query}: {response}");
    }
    let mut no_topic = subscribe(addr, "?topics=").await;
    no_topic.close(None).await.unwrap();
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/ws?topics=ok,%E2"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("400"), "{refused}");
    let wrong_path = tokio_tungstenite::connect_async(format!("ws://{addr}/elsewhere"))
        .await
        .unwrap_err();
    assert!(wrong_path.to_string().contains("404"), "{wrong_path}");

    // Nothing above disturbed the subscribers.
    let (_, answer) = publish(addr, "a", b"still here").await;
    assert_eq!(delivered(&answer), 1);
    assert_eq!(text(&mut both).await, "still here");
    // The largest body the limit allows goes through.
    let largest = "y".repeat(100_000);
    let (_, answer) = publish(addr, "late", largest.as_bytes()).await;
    assert_eq!(delivered(&answer), 1);
    assert_eq!(text(&mut only_a).await, largest);

    let (_, stats) = http(addr, "GET", "/stats", b"").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(stats["dropped"], 0);
    assert!(stats["delivered"].as_u64().unwrap() >= 7, "{stats}");
    both.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_for_everything_on_tokio() {
    one_port_for_everything("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_for_everything_on_uring() {
    one_port_for_everything("uring").await;
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `positions=1` and resuming, as the issue's wire format says: deliveries
/// as JSON with their topic and position, `since=` replaying what was
/// missed and then `recovered`, a position older than `--history` not
/// recovered, POST and `/topics/` answering with positions, refusals as
/// JSON, a bad `since` refused with 400.
async fn positions_and_resume(backend: &str) {
    let (_bus, addr) = start_example("notify_bus", &["--backend", backend, "--history", "5"]).await;
    let mut reader = subscribe(addr, "?topics=a&positions=1").await;
    let (_, answer) = publish(addr, "a", b"one").await;
    let answer = json(&answer);
    assert_eq!(answer["delivered"], 1);
    assert_eq!(answer["offset"], 1);
    let epoch = answer["epoch"].as_str().unwrap().to_owned();
    assert!(!epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_alphanumeric()));
    let first = json(&text(&mut reader).await);
    assert_eq!(
        first,
        serde_json::json!({"topic": "a", "epoch": epoch, "offset": 1, "data": "one"})
    );
    publish(addr, "a", &[0xff, 0x00]).await;
    let binary = json(&text(&mut reader).await);
    assert_eq!(binary["data_b64"], "/wA=");
    assert_eq!(binary["offset"], 2);
    for i in 3..=9 {
        publish(addr, "a", format!("m{i}").as_bytes()).await;
        assert_eq!(json(&text(&mut reader).await)["offset"], i);
    }
    let (_, topic) = http(addr, "GET", "/topics/a", b"").await;
    assert_eq!(
        json(std::str::from_utf8(&topic).unwrap()),
        serde_json::json!({"subscribers": 1, "epoch": epoch, "offset": 9})
    );
    // Kept: 5 to 9. After 6: 7, 8, 9, then recovered, then live.
    let mut resumed = subscribe(addr, &format!("?positions=1&since=a:{epoch}:6")).await;
    for offset in 7..=9 {
        let delivery = json(&text(&mut resumed).await);
        assert_eq!(
            (delivery["topic"].as_str(), delivery["offset"].as_u64()),
            (Some("a"), Some(offset))
        );
        assert_eq!(delivery["data"], format!("m{offset}"));
    }
    assert_eq!(
        json(&text(&mut resumed).await),
        serde_json::json!({"topic": "a", "recovered": true})
    );
    // After 3: 4 is gone. Another epoch: gone too. Both are told.
    let mut too_old = subscribe(addr, &format!("?positions=1&since=a:{epoch}:3")).await;
    let mut other = subscribe(addr, "?positions=1&since=a:00ff:9").await;
    for client in [&mut too_old, &mut other] {
        assert_eq!(
            json(&text(client).await),
            serde_json::json!({"topic": "a", "recovered": false})
        );
    }
    let (_, answer) = publish(addr, "a", b"live").await;
    assert_eq!(json(&answer)["delivered"], 4);
    for client in [&mut reader, &mut resumed, &mut too_old, &mut other] {
        let delivery = json(&text(client).await);
        assert_eq!(
            (delivery["offset"].as_u64(), delivery["data"].as_str()),
            (Some(10), Some("live"))
        );
    }
    // Commands are acknowledged and refused in JSON.
    send_text(&mut reader, "subscribe:b").await;
    assert_eq!(
        json(&text(&mut reader).await),
        serde_json::json!({"subscribed": "b"})
    );
    send_text(&mut reader, "subscribe:").await;
    assert_eq!(
        json(&text(&mut reader).await),
        serde_json::json!({"error": "empty topic name"})
    );
    // A topic nobody watches, with history: numbered and kept.
    let (_, answer) = publish(addr, "quiet", b"x").await;
    let answer = json(&answer);
    assert_eq!(
        (answer["delivered"].as_u64(), answer["offset"].as_u64()),
        (Some(0), Some(1))
    );
    // Last value on subscribe: the latest kept first, then live.
    let mut cached = subscribe(addr, "?positions=1&latest=quiet,a").await;
    let mut firsts = [
        json(&text(&mut cached).await),
        json(&text(&mut cached).await),
    ];
    firsts.sort_by_key(|d| d["topic"].as_str().map(str::to_owned));
    assert_eq!(
        (firsts[0]["topic"].as_str(), firsts[0]["offset"].as_u64()),
        (Some("a"), Some(10))
    );
    assert_eq!(
        (firsts[1]["topic"].as_str(), firsts[1]["data"].as_str()),
        (Some("quiet"), Some("x"))
    );
    publish(addr, "quiet", b"y").await;
    assert_eq!(json(&text(&mut cached).await)["data"], "y");
    // Bad since: refused before the upgrade, with the reason.
    for bad in ["a", "a:zz:1", "a:ab:-1", ":ab:1"] {
        let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/ws?since={bad}")).await;
        let Err(tokio_tungstenite::tungstenite::Error::Http(response)) = refused else {
            panic!("{bad}: not refused with an HTTP answer");
        };
        assert_eq!(response.status(), 400, "{bad}");
        let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
        assert!(
            body.contains("since") || body.contains("topic"),
            "{bad}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_and_resume_on_tokio() {
    positions_and_resume("tokio").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_and_resume_on_uring() {
    positions_and_resume("uring").await;
}

/// What the test publishes to the deflate subscribers: text that
/// compresses, the same again, binary, an empty message, short text (below
/// the compression minimum), and 100 kB.
fn publications() -> Vec<Vec<u8>> {
    let quote = "Habe nun, ach! Philosophie, Juristerei und Medizin, und leider auch Theologie! ";
    vec![
        quote.repeat(3).into_bytes(),
        quote.repeat(3).into_bytes(),
        (0..6000u32).map(|i| (i % 251) as u8 | 0x80).collect(),
        Vec::new(),
        b"short".to_vec(),
        "κόσμε ".repeat(300).into_bytes(),
        "x".repeat(100_000).into_bytes(),
    ]
}

fn fnv1a(data: &[u8]) -> u64 {
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in data {
        hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
    }
    u64::from(hash)
}

/// Starts `subscriber.py` for `topic` with `offer`; returns it once it is
/// subscribed (it printed `ready`), with its stdout.
async fn python_subscriber(
    addr: SocketAddr,
    topic: &str,
    offer: &str,
    count: usize,
) -> (
    tokio::process::Child,
    tokio::io::BufReader<tokio::process::ChildStdout>,
) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/subscriber.py");
    let mut child = tokio::process::Command::new(common::python())
        .arg(script)
        .arg(format!("ws://{addr}/ws?topics={topic}"))
        .args(["--count", &count.to_string(), "--offer", offer])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(20), out.read_line(&mut line))
        .await
        .expect("ready within 20 s")
        .unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

async fn deflate_subscribers(backend: &str) {
    let (_bus, addr) = start_example(
        "notify_bus",
        &[
            "--backend",
            backend,
            "--deflate",
            "--deflate-context-takeover",
        ],
    )
    .await;
    let published = publications();
    // One subscriber whose server side starts every message afresh (it
    // shares the frames compressed once), one that lets the server keep
    // its context (it gets the publications uncompressed), one without
    // deflate.
    let offers = ["server_no_context_takeover", "", "none"];
    let mut subscribers = Vec::new();
    for offer in offers {
        subscribers.push(python_subscriber(addr, "d", offer, published.len()).await);
    }
    for body in &published {
        let (status, answer) = publish(addr, "d", body).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(delivered(&answer), 3);
    }
    for ((mut child, mut out), offer) in subscribers.into_iter().zip(offers) {
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), out.read_line(&mut line))
            .await
            .expect("a report within 30 s")
            .unwrap();
        assert!(child.wait().await.unwrap().success(), "{offer}: {line}");
        let report: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
        let messages = report["messages"].as_array().unwrap();
        assert_eq!(messages.len(), published.len(), "{offer}");
        for (got, sent) in messages.iter().zip(&published) {
            let text = std::str::from_utf8(sent).is_ok();
            assert_eq!(got["text"], text, "{offer}");
            assert_eq!(got["len"], sent.len(), "{offer}");
            assert_eq!(got["hash"], fnv1a(sent), "{offer}");
        }
        let compressed: Vec<bool> = report["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["data"] == true)
            .map(|f| f["rsv1"] == true)
            .collect();
        match offer {
            "server_no_context_takeover" => {
                assert_eq!(report["negotiated"]["server_no_context_takeover"], true);
                // Everything from 64 bytes on is compressed; the empty and
                // the short message are not.
                assert_eq!(
                    compressed,
                    [true, true, true, false, false, true, true],
                    "{report}"
                );
            }
            "" => {
                assert_eq!(report["negotiated"]["server_no_context_takeover"], false);
                assert!(compressed.iter().all(|&c| !c), "{report}");
                assert_eq!(compressed.len(), published.len());
            }
            _ => assert!(report["frames"].as_array().unwrap().is_empty(), "{report}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deflate_subscribers_with_and_without_context_takeover_on_tokio() {
    deflate_subscribers("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deflate_subscribers_with_and_without_context_takeover_on_uring() {
    deflate_subscribers("uring").await;
}

/// A raw subscriber: upgraded with `query`, nothing read beyond the `101`.
async fn raw_subscriber(addr: SocketAddr, query: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = common::upgrade_request(&format!("/ws{query}"), "");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "));
    stream
}

/// 10,000 subscribers keep receiving every message while one subscriber
/// reads nothing and 256 MiB are published to it: under `--close-slow` it
/// is closed, otherwise its messages are dropped; either way the bus's
/// memory grows by far less than what was published.
async fn one_stuck_subscriber_among_ten_thousand_on(backend: &str, close_slow: bool) {
    const SUBSCRIBERS: usize = 10_000;
    const MESSAGES: usize = 20;
    const FLOOD: usize = 256; // messages of 1 MiB
    let mut args = vec!["--backend", backend, "--max-message-size", "2000000"];
    if close_slow {
        args.push("--close-slow");
    }
    let (bus, addr) = start_example("notify_bus", &args).await;
    // Everyone on "all"; the stuck one also on "flood", with one reader.
    let mut stuck = raw_subscriber(addr, "?topics=all,flood").await;
    let mut flood_reader = subscribe(addr, "?topics=flood").await;
    let mut readers = Vec::with_capacity(SUBSCRIBERS);
    for _ in 0..SUBSCRIBERS {
        readers.push(raw_subscriber(addr, "?topics=all").await);
    }
    let (_, stats) = http(addr, "GET", "/stats", b"").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(stats["topics"], 2, "{stats}");
    let before = resident_of(&bus);

    // Each reader counts bytes until it has every message: a 1 KiB text
    // frame is 4 bytes of header and 1024 of payload.
    let want = MESSAGES * (4 + 1024);
    let counting: Vec<_> = readers
        .into_iter()
        .map(|mut reader| {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut got = 0;
                while got < want {
                    let n = reader.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed after {got} of {want} bytes");
                    got += n;
                }
                got
            })
        })
        .collect();
    let flood = "f".repeat(1 << 20);
    let message = "m".repeat(1024);
    let (mut peak, mut sent) = (before, 0);
    for i in 0..FLOOD {
        let (status, _) = publish(addr, "flood", flood.as_bytes()).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        // The flood reader keeps up; the stuck one does not read at all.
        assert_eq!(next(&mut flood_reader).await.len(), 1 << 20);
        if i % (FLOOD / MESSAGES) == 0 && sent < MESSAGES {
            sent += 1;
            let (_, answer) = publish(addr, "all", message.as_bytes()).await;
            let reached = delivered(&answer) as usize;
            // The stuck one too, until it is closed.
            assert!(reached >= SUBSCRIBERS, "{answer}");
        }
        peak = peak.max(resident_of(&bus));
    }
    assert_eq!(sent, MESSAGES);
    for counted in counting {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), counted)
                .await
                .expect("every reader gets every message within 60 s")
                .unwrap(),
            want
        );
    }
    let growth = peak.saturating_sub(before);
    // 256 MiB published to the stuck subscriber; what it holds is bounded
    // by its queue (4 MiB) and the sockets' buffers.
    assert!(growth < 64 << 20, "the bus grew by {} MiB", growth >> 20);
    let (_, stats) = http(addr, "GET", "/stats", b"").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    if close_slow {
        assert_eq!(stats["closed"], 1, "{stats}");
        // Its close frame could not reach it; the close timeout ended it.
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(20), stuck.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the stuck subscriber was disconnected");
    } else {
        assert!(stats["dropped"].as_u64().unwrap() > 0, "{stats}");
        assert_eq!(stats["closed"], 0, "{stats}");
    }
    eprintln!(
        "{backend}, close_slow {close_slow}: RSS {} MiB with {SUBSCRIBERS} subscribers, grew {} MiB over a {FLOOD} MiB flood; {stats}",
        before >> 20,
        growth >> 20
    );
}

/// One test, the backends one after the other: 10,000 connections each,
/// and a process may hold 20,000 descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stuck_subscriber_among_ten_thousand() {
    one_stuck_subscriber_among_ten_thousand_on("tokio", false).await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    one_stuck_subscriber_among_ten_thousand_on("uring", true).await;
}

/// `--overflow conflate`: a subscriber that reads nothing while 256 MiB
/// of keyed publications go to its topic keeps its connection and costs
/// the bus a bounded amount of memory (its queue and what waits beside
/// it, each at most its queue bound); the publications it could not take
/// are replaced per key (counted), and the reader that keeps up gets all.
async fn a_stuck_subscriber_under_conflation_on(backend: &str) {
    const FLOOD: usize = 256; // messages of 1 MiB
    let args = [
        "--backend",
        backend,
        "--max-message-size",
        "2000000",
        "--overflow",
        "conflate",
    ];
    let (bus, addr) = start_example("notify_bus", &args).await;
    let mut stuck = raw_subscriber(addr, "?topics=flood").await;
    let mut reader = subscribe(addr, "?topics=flood").await;
    let before = resident_of(&bus);
    let flood = "f".repeat(1 << 20);
    let mut peak = before;
    for i in 0..FLOOD {
        let path = format!("flood?key=k{}", i % 4);
        let (status, _) = publish(addr, &path, flood.as_bytes()).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(next(&mut reader).await.len(), 1 << 20);
        peak = peak.max(resident_of(&bus));
    }
    let growth = peak.saturating_sub(before);
    let (_, stats) = http(addr, "GET", "/stats", b"").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    eprintln!(
        "{backend}, conflate: grew {} MiB over a {FLOOD} MiB flood; {stats}",
        growth >> 20
    );
    assert!(growth < 64 << 20, "the bus grew by {} MiB", growth >> 20);
    assert!(stats["conflated"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["closed"], 0, "{stats}");
    // Still connected: it reads what was kept for it.
    let mut buf = vec![0u8; 1 << 16];
    let n = tokio::time::timeout(Duration::from_secs(10), stuck.read(&mut buf))
        .await
        .expect("bytes for the stuck subscriber")
        .unwrap();
    assert!(n > 0, "not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_subscriber_under_conflation() {
    a_stuck_subscriber_under_conflation_on("tokio").await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    a_stuck_subscriber_under_conflation_on("uring").await;
}

/// A publisher that keeps its connection: many `POST /publish/...` on one
/// HTTP/1.1 connection, then a batch as NDJSON with one answer per line
/// (a bad line answered with its error, the others published), then an
/// explicit close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_keeps_its_connection_and_publishes_in_batches() {
    let (_bus, addr) = start_example("notify_bus", &["--history", "10"]).await;
    let mut reader = subscribe(addr, "?topics=a,b&positions=1").await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stream = tokio::io::BufReader::new(stream);
    // A request on the kept connection, and its answer.
    let mut post = async |path: &str, more: &str, body: &str| {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: bus\r\n{more}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let writer = stream.get_mut();
        writer.write_all(request.as_bytes()).await.unwrap();
        common::read_response(&mut stream, false)
            .await
            .expect("answered")
    };
    for i in 1..=3 {
        let (head, body) = post("/publish/a", "", &format!("m{i}")).await;
        assert!(head.contains("Connection: keep-alive"), "{head}");
        assert_eq!(json(&body)["offset"], i);
        assert_eq!(json(&text(&mut reader).await)["data"], format!("m{i}"));
    }
    let lines = concat!(
        r#"{"topic":"a","data":"first"}"#,
        "\n",
        r#"{"topic":"","data":"x"}"#,
        "\n",
        r#"{"topic":"b","data_b64":"AAE=","key":"k"}"#,
        "\n",
        "not json\n",
    );
    let (head, body) = post("/publish", "Connection: close\r\n", lines).await;
    assert!(head.contains("Connection: close"), "{head}");
    let answers: Vec<serde_json::Value> = body.lines().map(json).collect();
    assert_eq!(answers.len(), 4, "{body}");
    assert_eq!(
        (
            answers[0]["delivered"].as_u64(),
            answers[0]["offset"].as_u64()
        ),
        (Some(1), Some(4))
    );
    assert_eq!(answers[1]["error"], "empty topic name");
    assert_eq!(
        (
            answers[2]["delivered"].as_u64(),
            answers[2]["offset"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert!(
        answers[3]["error"]
            .as_str()
            .unwrap()
            .starts_with("not JSON"),
        "{body}"
    );
    assert_eq!(json(&text(&mut reader).await)["data"], "first");
    assert_eq!(json(&text(&mut reader).await)["data_b64"], "AAE=");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "closed after the answer");
    // Every publication accounted for: the answers' `delivered` add up to
    // what /stats counts (delivered, dropped, closed, gone, conflated).
    let (_, stats) = http(addr, "GET", "/stats", b"").await;
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    let counted: u64 = ["delivered", "dropped", "closed", "gone", "conflated"]
        .iter()
        .map(|name| stats[name].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 3 + 1 + 1, "{stats}");
    assert_eq!(stats["delivered"], 5, "{stats}");
}
