//! Deploys that keep every connection: the echo
//! example started with `--handoff-socket PATH` hands its listening socket
//! and every connection to a new process started with `--take-over PATH`,
//! and exits 0. The clients (tokio-tungstenite, and raw sockets where a
//! frame or a request must be cut at a chosen byte) see no close, no lost
//! or repeated byte, only a pause.
#![cfg(target_os = "linux")]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

/// The two tests with 10,000 connections take turns: together they would
/// pass this process's descriptor limit.
static TEN_THOUSAND: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A path for a handoff socket, unique to the test.
fn socket_path(name: &str) -> PathBuf {
    common::successor::socket_path("handoff", name)
}

/// The echo example on `backend` (`tokio` or `uring`), listening for a
/// successor at `socket`.
async fn start_old(socket: &Path, backend: &str) -> (Child, SocketAddr) {
    let socket = socket.to_str().unwrap();
    start_example("echo", &["--handoff-socket", socket, "--backend", backend]).await
}

/// A new echo process on `backend` taking over from the one listening at
/// `socket`, and listening there for its own successor.
fn start_successor(addr: SocketAddr, socket: &Path, backend: &str) -> Child {
    let socket = socket.to_str().unwrap();
    Child(
        std::process::Command::new(example("echo"))
            .args(["--addr", &addr.to_string(), "--backend", backend])
            .args(["--take-over", socket, "--handoff-socket", socket])
            .spawn()
            .unwrap(),
    )
}

/// What one talking client saw.
struct Talked {
    /// Messages echoed, in order and intact.
    echoed: u64,
    /// The longest wait for an echo sent before the successor started, and
    /// since.
    worst: [Duration; 2],
    /// Echoes of messages sent since the successor started.
    after: u64,
}

/// Talks to the echo server until `stop`: sends a numbered text, waits
/// for exactly it to come back, again and again; then closes with 1000 and
/// expects the server's close reply. Anything else (a close from the
/// server, a message out of order, an error) fails.
async fn talk(url: String, id: usize, stop: Arc<AtomicBool>, handing: Arc<AtomicBool>) -> Talked {
    let (mut client, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("upgraded");
    let mut talked = Talked {
        echoed: 0,
        worst: [Duration::ZERO; 2],
        after: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let text = format!("{id}:{}", talked.echoed);
        let sent = Instant::now();
        let phase = usize::from(handing.load(Ordering::Relaxed));
        client.send(Message::text(text.clone())).await.unwrap();
        let echo = tokio::time::timeout(Duration::from_secs(20), client.next())
            .await
            .unwrap_or_else(|_| panic!("client {id}: no echo of {text} within 20 s"))
            .unwrap_or_else(|| panic!("client {id}: the connection ended"))
            .unwrap_or_else(|error| panic!("client {id}: {error}"));
        assert_eq!(echo, Message::text(text), "client {id}");
        talked.worst[phase] = talked.worst[phase].max(sent.elapsed());
        talked.echoed += 1;
        talked.after += phase as u64;
    }
    close_politely(&mut client).await;
    talked
}

/// Closes with 1000 and expects the server to answer with 1000.
async fn close_politely<S>(client: &mut tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client
        .close(Some(CloseFrame {
            code: 1000.into(),
            reason: "done".into(),
        }))
        .await
        .unwrap();
    match client.next().await {
        Some(Ok(Message::Close(frame))) => {
            assert_eq!(frame.map(|f| u16::from(f.code)), Some(1000));
        }
        Some(Ok(other)) => panic!("after our close: {other:?}"),
        Some(Err(error)) => panic!("closing: {error}"),
        None => panic!("ended without a close reply"),
    }
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// 1,000 clients talk without a pause and 9,000 more sit idle while the
/// echo server hands everything to a successor: no connection sees a
/// close, every echo comes back in order, the old process exits 0, and
/// the idle connections answer through the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_keeps_ten_thousand_connections_and_every_message() {
    deploy("deploy", &["tokio", "tokio"]).await;
}

/// The same from tokio to io_uring, io_uring to io_uring, and back to
/// tokio: three deploys, the same 10,000 connections through all of them.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_between_tokio_and_io_uring_keep_every_connection() {
    deploy("across", &["tokio", "uring", "uring", "tokio"]).await;
}

/// 10,000 connections (1,000 talking) through deploys from one backend to
/// the next in `chain`.
async fn deploy(name: &str, chain: &[&str]) {
    let _turn = TEN_THOUSAND.lock().await;
    set_soft_limit(None);
    let socket = socket_path(name);
    let (mut old, addr) = start_old(&socket, chain[0]).await;
    let url = format!("ws://{addr}/");
    let (stop, handing) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let talking: Vec<_> = (0..1000)
        .map(|id| tokio::spawn(talk(url.clone(), id, stop.clone(), handing.clone())))
        .collect();
    let limit = Arc::new(tokio::sync::Semaphore::new(256));
    let mut idle = Vec::new();
    for _ in 0..9000 {
        let (url, limit) = (url.clone(), limit.clone());
        idle.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            tokio_tungstenite::connect_async(url.as_str())
                .await
                .expect("upgraded")
                .0
        }));
    }
    let mut idle_clients = Vec::new();
    for opened in idle {
        idle_clients.push(opened.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old_rss = resident_of(&old);
    let mut handed = Vec::new();
    let mut new_rss = 0;
    for (from, to) in chain.iter().zip(&chain[1..]) {
        let began = Instant::now();
        handing.store(true, Ordering::Relaxed);
        let new = start_successor(addr, &socket, to);
        assert!(
            exits_zero(&mut old, Duration::from_secs(30)).await,
            "the old process ({from}) did not exit 0 after the handoff to {to}"
        );
        handed.push(began.elapsed());
        // The new process accepts on every listening socket it took (an
        // io_uring server has one per reactor, each with its own queue,
        // which the kernel picks by the connection's addresses: eight
        // connections miss one of two with a chance under 1%).
        for n in 0..8 {
            let fresh = tokio_tungstenite::connect_async(url.as_str());
            let (mut fresh, _) = tokio::time::timeout(Duration::from_secs(10), fresh)
                .await
                .unwrap_or_else(|_| panic!("new connection {n} to {to} not answered in 10 s"))
                .unwrap_or_else(|error| panic!("new connection {n} to {to}: {error}"));
            fresh.send(Message::text("fresh")).await.unwrap();
            assert_eq!(fresh.next().await.unwrap().unwrap(), Message::text("fresh"));
            close_politely(&mut fresh).await;
        }
        // The talk goes on through the new process for a while.
        tokio::time::sleep(Duration::from_secs(1)).await;
        new_rss = resident_of(&new);
        old = new;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut before, mut worst) = (Vec::new(), Vec::new());
    for task in talking {
        let talked = task.await.unwrap();
        // It talked through the new process after the old one exited.
        assert!(talked.after > 0, "a client got no echo after the handoff");
        before.push(talked.worst[0]);
        worst.push(talked.worst[1]);
    }
    before.sort();
    worst.sort();
    // Every idle connection still answers, now from the new process.
    let mut idle_checks = Vec::new();
    for (i, mut client) in idle_clients.into_iter().enumerate() {
        idle_checks.push(tokio::spawn(async move {
            let text = format!("idle {i}");
            client.send(Message::text(text.clone())).await.unwrap();
            let echo = client.next().await.unwrap().unwrap();
            assert_eq!(echo, Message::text(text));
            close_politely(&mut client).await;
        }));
    }
    for check in idle_checks {
        check.await.unwrap();
    }
    eprintln!(
        "handoffs of 10,000 connections ({}): each old process exited {handed:?} after its \
         successor started; longest echo wait per talking client through the handoff p50 {:?}, \
         p99 {:?}, max {:?} (before it: p50 {:?}, p99 {:?}, max {:?}); \
         RSS old {} MiB before, new {} MiB after",
        chain.join(" -> "),
        percentile(&worst, 50.0),
        percentile(&worst, 99.0),
        worst.last().unwrap(),
        percentile(&before, 50.0),
        percentile(&before, 99.0),
        before.last().unwrap(),
        old_rss >> 20,
        new_rss >> 20,
    );
    drop(old.0.kill());
}

/// Reads from `stream` until `bytes` more have come (or 20 s pass).
async fn read_exactly(stream: &mut TcpStream, bytes: usize) -> Vec<u8> {
    let mut got = vec![0u8; bytes];
    tokio::time::timeout(Duration::from_secs(20), stream.read_exact(&mut got))
        .await
        .expect("the bytes within 20 s")
        .unwrap();
    got
}

/// A raw upgraded connection whose receive buffer is small (16 KiB), so
/// that what the server sends it waits in the server's queue rather than
/// in the kernel's buffers.
async fn raw_upgraded_small(addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 << 10).unwrap();
    upgrade_raw(socket.connect(addr).await.unwrap(), "").await.0
}

/// The length of a server frame's header, from its first bytes.
fn header_len(second: u8) -> usize {
    match second & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    }
}

/// Hands the echo server over while a large message is half received
/// (its second fragment cut mid-payload) and while the echo of another is
/// half written (the client stopped reading mid-frame): both finish
/// through the new process, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_in_the_middle_of_large_fragmented_messages_both_ways() {
    fragments("fragments", "tokio", "tokio").await;
}

/// The same from io_uring (whose send of the echo is in flight, and is
/// cut short for the handoff) to tokio.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_hands_over_half_sent_and_half_received_messages_to_tokio() {
    fragments("fragments-uring", "uring", "tokio").await;
}

/// And from tokio to io_uring, which writes the rest of the frame begun
/// on the wire and reads the rest of the message.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_hands_over_half_sent_and_half_received_messages_to_io_uring() {
    fragments("fragments-to-uring", "tokio", "uring").await;
}

async fn fragments(name: &str, backend: &str, next: &str) {
    let socket = socket_path(name);
    let (mut old, addr) = start_old(&socket, backend).await;

    // Inbound: a text message in three fragments; the handoff comes after
    // the first and half of the second.
    let mut inbound = raw_upgraded(addr).await;
    let parts: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            (0..300_000)
                .map(|j| b'a' + ((i * 7 + j) % 26) as u8)
                .collect()
        })
        .collect();
    let second = client_frame(false, 0, &parts[1]);
    let (second_now, second_later) = second.split_at(second.len() / 2);
    inbound
        .write_all(&client_frame(false, 1, &parts[0]))
        .await
        .unwrap();
    inbound.write_all(second_now).await.unwrap();

    // Outbound: a 12 MiB binary message whose echo the client reads only
    // 100 KiB of before the handoff, so the rest waits in the old
    // process's queue (the client's receive buffer is small, so the
    // kernel holds little of it).
    let mut outbound = raw_upgraded_small(addr).await;
    let big: Vec<u8> = (0..12 << 20).map(|i: u32| (i % 251) as u8).collect();
    outbound
        .write_all(&client_frame(true, 2, &big))
        .await
        .unwrap();
    let head = read_exactly(&mut outbound, 2).await;
    let mut echoed = head.clone();
    echoed.extend(read_exactly(&mut outbound, header_len(head[1]) - 2 + (100 << 10)).await);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut new = start_successor(addr, &socket, next);
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);

    // A ping to the new process: its pong must not cut the frame it goes
    // on writing.
    outbound
        .write_all(&client_frame(true, 9, b"mid-frame"))
        .await
        .unwrap();

    // The rest of the inbound message, to the new process.
    inbound.write_all(second_later).await.unwrap();
    inbound
        .write_all(&client_frame(true, 0, &parts[2]))
        .await
        .unwrap();
    let whole: Vec<u8> = parts.concat();
    let head = read_exactly(&mut inbound, 2).await;
    let header = read_exactly(&mut inbound, header_len(head[1]) - 2).await;
    let mut frame = head;
    frame.extend(header);
    frame.extend(read_exactly(&mut inbound, whole.len()).await);
    assert_eq!(
        server_frames(&frame),
        vec![(1, whole)],
        "the fragmented message's echo"
    );

    // The rest of the outbound echo, from the new process's queue, then
    // the pong.
    let header = header_len(echoed[1]);
    echoed.extend(read_exactly(&mut outbound, header + big.len() - echoed.len() + 11).await);
    assert_eq!(
        server_frames(&echoed),
        vec![(2, big), (10, b"mid-frame".to_vec())],
        "the big echo, then the pong"
    );

    // Both connections go on: a ping each, answered.
    for stream in [&mut inbound, &mut outbound] {
        stream
            .write_all(&client_frame(true, 9, b"still here"))
            .await
            .unwrap();
        let pong = read_exactly(stream, 12).await;
        assert_eq!(server_frames(&pong), vec![(10, b"still here".to_vec())]);
    }
    drop(new.0.kill());
}

/// Half an upgrade request before the handoff, the rest after: the new
/// process answers it with 101 and echoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_while_a_request_is_half_sent() {
    half_request("handshake", "tokio", "tokio").await;
}

/// The same from io_uring to io_uring.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_hands_over_a_half_sent_request_to_io_uring() {
    half_request("handshake-uring", "uring", "uring").await;
}

async fn half_request(name: &str, backend: &str, next: &str) {
    let socket = socket_path(name);
    let (mut old, addr) = start_old(&socket, backend).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = upgrade_request("/", "");
    let (now, later) = request.as_bytes().split_at(request.len() / 2);
    stream.write_all(now).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut new = start_successor(addr, &socket, next);
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
    stream.write_all(later).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    stream
        .write_all(&client_frame(true, 1, b"after"))
        .await
        .unwrap();
    let echo = read_exactly(&mut stream, 7).await;
    assert_eq!(server_frames(&echo), vec![(1, b"after".to_vec())]);
    drop(new.0.kill());
}

/// A successor that takes the greeting and the first batch, then dies
/// without acknowledging it: the old process takes everything back and
/// serves on (no client notices but a pause), and a real successor can
/// then take over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_dies_half_way_leaves_everything_to_the_old_process() {
    dying_successor("dies", "tokio", "tokio").await;
}

/// The same with an io_uring server, and then a tokio successor.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_uring_server_takes_back_what_a_dying_successor_took() {
    dying_successor("dies-uring", "uring", "tokio").await;
}

async fn dying_successor(name: &str, backend: &str, next: &str) {
    let socket = socket_path(name);
    let (mut old, addr) = start_old(&socket, backend).await;
    let url = format!("ws://{addr}/");
    let (stop, handing) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let talking: Vec<_> = (0..300)
        .map(|id| tokio::spawn(talk(url.clone(), id, stop.clone(), handing.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The dying successor speaks the handoff's protocol (tests/handoff.rs
    // has its own reading of it, from src/handoff/) until the first
    // batch of connections, and leaves without a word.
    let dying = socket.clone();
    tokio::task::spawn_blocking(move || die_after_the_state(&dying))
        .await
        .unwrap();

    // The old process serves on: the clients keep talking, and it has not
    // exited.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        old.0.try_wait().unwrap().is_none(),
        "the old process exited"
    );
    let mut check = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("a new connection to the old process")
        .0;
    check.send(Message::text("new")).await.unwrap();
    assert_eq!(check.next().await.unwrap().unwrap(), Message::text("new"));

    // Now a real one.
    let mut new = start_successor(addr, &socket, next);
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in talking {
        assert!(task.await.unwrap().echoed > 0);
    }
    close_politely(&mut check).await;
    drop(new.0.kill());
}

/// Runs tests/interop/handoff_client.py against `addr` while `during`
/// runs; its report, one entry per connection.
async fn python_talks(
    addr: SocketAddr,
    connections: usize,
    seconds: f64,
    during: impl std::future::Future<Output = ()>,
) -> Vec<serde_json::Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/handoff_client.py"
    );
    let child = std::process::Command::new(python())
        .arg(script)
        .arg(format!("ws://{addr}/"))
        .arg(connections.to_string())
        .arg(seconds.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    during.await;
    let out = out.await.unwrap();
    assert!(
        out.status.success(),
        "handoff_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// permessage-deflate without context takeover (the library's default)
/// moves: Python `websockets` clients with compression talk through the
/// handoff and close with 1000 at the end, to the new process. With the
/// server's context takeover (zlib's window stays in the old process) the
/// connections stay, and the old process closes them with 1012.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_connections_move_unless_the_server_keeps_its_context() {
    compressed("", "tokio", "tokio").await;
}

/// The same from io_uring to io_uring.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_moves_compressed_connections_unless_it_keeps_their_context() {
    compressed("-uring", "uring", "uring").await;
}

async fn compressed(name: &str, backend: &str, next: &str) {
    for (extra, moves) in [
        (&["--deflate"][..], true),
        (&["--deflate", "--deflate-context-takeover"][..], false),
    ] {
        let socket = socket_path(&format!(
            "{}{name}",
            if moves { "deflate" } else { "takeover" }
        ));
        let mut args = vec!["--handoff-socket", socket.to_str().unwrap()];
        args.extend(extra);
        args.extend(["--backend", backend]);
        let (mut old, addr) = start_example("echo", &args).await;
        let successor = {
            let socket = socket.clone();
            let next = next.to_owned();
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let socket = socket.to_str().unwrap();
                let new = Child(
                    std::process::Command::new(example("echo"))
                        .args(["--addr", &addr.to_string(), "--take-over", socket])
                        .args(["--handoff-socket", socket, "--backend", &next])
                        .args(&extra)
                        .spawn()
                        .unwrap(),
                );
                assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
                new
            }
        };
        let (reports, new) = {
            let new = std::sync::Mutex::new(None);
            let reports = python_talks(addr, 20, 3.0, async {
                *new.lock().unwrap() = Some(successor.await);
            })
            .await;
            (reports, new.into_inner().unwrap())
        };
        assert_eq!(reports.len(), 20);
        for report in &reports {
            let agreed = report["extensions"].as_str().unwrap_or("");
            assert!(agreed.starts_with("permessage-deflate"), "{report}");
            assert!(report["echoed"].as_u64().unwrap() > 0, "{report}");
            let ended = (report["closed_by"].as_str(), report["code"].as_u64());
            if moves {
                assert_eq!(ended, (Some("client"), Some(1000)), "{report}");
            } else {
                assert_eq!(ended, (Some("server"), Some(1012)), "{report}");
            }
        }
        drop(new);
    }
}

/// A keep-alive HTTP connection to the bus that publishes, one request
/// after the other, and reads each answer: the offset it was given.
struct Publisher {
    stream: TcpStream,
    read: Vec<u8>,
}

impl Publisher {
    async fn connect(addr: SocketAddr) -> Publisher {
        Publisher {
            stream: TcpStream::connect(addr).await.unwrap(),
            read: Vec::new(),
        }
    }

    /// Publishes `body` to `topic`; the offset the bus gave it.
    async fn publish(&mut self, topic: &str, body: &str) -> u64 {
        let request = format!(
            "POST /publish/{topic} HTTP/1.1\r\nHost: bus\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(request.as_bytes()).await.unwrap();
        loop {
            if let Some(end) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.read[..end]).to_string();
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("content-length: ")
                            .or(l.strip_prefix("Content-Length: "))
                    })
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                if self.read.len() >= end + 4 + length {
                    let body: Vec<u8> = self.read.drain(..end + 4 + length).skip(end + 4).collect();
                    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    if head.to_ascii_lowercase().contains("connection: close") {
                        // Its 1,000th request: the next goes on a new one.
                        let addr = self.stream.peer_addr().unwrap();
                        *self = Publisher::connect(addr).await;
                    }
                    return answer["offset"].as_u64().unwrap();
                }
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(20), self.stream.read(&mut buf))
                .await
                .expect("an answer within 20 s")
                .unwrap();
            assert!(n > 0, "the bus closed the publisher's connection");
            self.read.extend_from_slice(&buf[..n]);
        }
    }
}

/// Microseconds since `start`.
fn micros_since(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

/// What one subscriber of the bus saw: the offsets of its topic, in the
/// order they came, and the longest delivery delay through the handoff.
struct Heard {
    topic: usize,
    offsets: Vec<u64>,
    worst: Duration,
}

/// 10,000 subscribers of `notify_bus` (1,000 topics, 10 each, with
/// positions) and a publisher at 1,000 messages per second over
/// keep-alive HTTP connections, through a handoff: no subscriber sees a
/// close or a gap, every publication arrives exactly once and in order
/// (offsets 1..=N of its topic, each with the payload published at that
/// offset), the publisher's connection moves too, and the old process
/// exits 0. Ten of the topics get nothing before the handoff (a topic
/// taken over empty must keep its numbering for the subscribers on their
/// way) and five publications each after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_deploy_delivers_every_publication_exactly_once() {
    bus_deploy("bus", &["tokio", "tokio"]).await;
}

/// The same through three deploys: io_uring to io_uring, to tokio, and
/// back to io_uring.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_deploys_on_and_between_io_uring_and_tokio_deliver_every_publication_once() {
    bus_deploy("bus-uring", &["uring", "uring", "tokio", "uring"]).await;
}

/// The bus test through deploys from one backend to the next in `chain`.
async fn bus_deploy(name: &str, chain: &[&str]) {
    let _turn = TEN_THOUSAND.lock().await;
    set_soft_limit(None);
    const TOPICS: usize = 1000;
    // Published to from the start; the rest only after the handoff.
    const BUSY: usize = 990;
    let socket = socket_path(name);
    let path = socket.to_str().unwrap();
    let args = [
        "--history",
        "100000",
        "--handoff-socket",
        path,
        "--backend",
        chain[0],
    ];
    let (mut old, addr) = start_example("notify_bus", &args).await;
    let start = Instant::now();
    let (stop, handing) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    // Set once the last publication had time to arrive.
    let heard_all = Arc::new(AtomicBool::new(false));
    let limit = Arc::new(tokio::sync::Semaphore::new(256));
    let mut opening = Vec::new();
    for i in 0..10_000 {
        let topic = i % TOPICS;
        let url = format!("ws://{addr}/ws?topics=t{topic}&positions=1");
        let limit = limit.clone();
        opening.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            (
                topic,
                tokio_tungstenite::connect_async(url)
                    .await
                    .expect("upgraded")
                    .0,
            )
        }));
    }
    let mut listening = Vec::new();
    for opened in opening {
        let (topic, mut client) = opened.await.unwrap();
        let (stop, handing) = (heard_all.clone(), handing.clone());
        listening.push(tokio::spawn(async move {
            let mut heard = Heard {
                topic,
                offsets: Vec::new(),
                worst: Duration::ZERO,
            };
            loop {
                let next = tokio::time::timeout(Duration::from_millis(200), client.next()).await;
                let message = match next {
                    Err(_) if stop.load(Ordering::Relaxed) => return heard,
                    Err(_) => continue,
                    Ok(message) => message,
                };
                let text = match message {
                    Some(Ok(Message::Text(text))) => text,
                    other => panic!("subscriber of t{topic}: {other:?}"),
                };
                let delivery: serde_json::Value = serde_json::from_str(&text).unwrap();
                let data = delivery["data"]
                    .as_str()
                    .unwrap_or_else(|| panic!("not a delivery: {text}"));
                // `<offset>:<microseconds>`, as published.
                let (offset, sent) = data.split_once(':').unwrap();
                let sent: u64 = sent.parse().unwrap();
                let offset: u64 = offset.parse().unwrap();
                assert_eq!(Some(offset), delivery["offset"].as_u64(), "{text}");
                if handing.load(Ordering::Relaxed) {
                    let delay = Duration::from_micros(micros_since(start).saturating_sub(sent));
                    heard.worst = heard.worst.max(delay);
                }
                heard.offsets.push(delivery["offset"].as_u64().unwrap());
            }
        }));
    }
    // The publisher: 1,000 a second, round the topics.
    let publishing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut publisher = Publisher::connect(addr).await;
            let mut published = vec![0u64; TOPICS];
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..10 {
                    let topic = n % BUSY;
                    let data = format!("{}:{}", published[topic] + 1, micros_since(start));
                    let offset = publisher.publish(&format!("t{topic}"), &data).await;
                    assert_eq!(offset, published[topic] + 1, "t{topic}'s numbering");
                    published[topic] = offset;
                    n += 1;
                }
            }
            published
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let old_rss = resident_of(&old);
    handing.store(true, Ordering::Relaxed);
    let socket_arg = socket.to_str().unwrap();
    let mut handed = Vec::new();
    for (from, to) in chain.iter().zip(&chain[1..]) {
        let began = Instant::now();
        let new = Child(
            std::process::Command::new(example("notify_bus"))
                .args(["--addr", &addr.to_string(), "--history", "100000"])
                .args(["--take-over", socket_arg, "--handoff-socket", socket_arg])
                .args(["--backend", to])
                .spawn()
                .unwrap(),
        );
        assert!(
            exits_zero(&mut old, Duration::from_secs(30)).await,
            "the old bus ({from}) did not exit 0 after the handoff to {to}"
        );
        handed.push(began.elapsed());
        old = new;
        // Publications go on through the new process for a while.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The quiet topics, through the new process.
    let mut quiet = Publisher::connect(addr).await;
    for topic in BUSY..TOPICS {
        for offset in 1..=5 {
            let data = format!("{offset}:{}", micros_since(start));
            assert_eq!(quiet.publish(&format!("t{topic}"), &data).await, offset);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let new_rss = resident_of(&old);
    stop.store(true, Ordering::Relaxed);
    let mut published = publishing.await.unwrap();
    published[BUSY..].fill(5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    heard_all.store(true, Ordering::Relaxed);
    let total: u64 = published.iter().sum();
    let mut worst = Vec::new();
    for listener in listening {
        let heard = listener.await.unwrap();
        let expected: Vec<u64> = (1..=published[heard.topic]).collect();
        assert_eq!(
            heard.offsets, expected,
            "a subscriber of t{}: every publication once, in order",
            heard.topic
        );
        worst.push(heard.worst);
    }
    worst.sort();
    eprintln!(
        "bus handoffs ({}): {total} publications at 1,000/s to 10,000 subscribers, all \
         delivered exactly once and in order; each old process exited {handed:?} after its \
         successor started; longest delivery delay per subscriber from then on p50 {:?}, \
         p99 {:?}, max {:?}; RSS first {} MiB before, last {} MiB after",
        chain.join(" -> "),
        percentile(&worst, 50.0),
        percentile(&worst, 99.0),
        worst.last().unwrap(),
        old_rss >> 20,
        new_rss >> 20
    );
    drop(old.0.kill());
}

/// Plays a successor that takes the greeting and the server's state,
/// acknowledges it, then takes the start of the first batch and dies
/// without acknowledging it (common/successor.rs reads the protocol).
fn die_after_the_state(socket: &Path) {
    let mut successor = common::successor::RawSuccessor::connect(socket);
    successor.take_state();
    assert!(successor.ack());
    let batch = successor.next().expect("a batch");
    assert_eq!(batch[0], b'B', "a batch");
    // No listening socket came: they go last.
    assert_eq!(successor.listening, 0);
}

/// Plays a successor that acknowledges the state and the first batch (its
/// connections are dropped here: they were served, and end), then dies
/// before the next.
fn die_after_the_first_batch(socket: &Path) -> usize {
    let mut successor = common::successor::RawSuccessor::connect(socket);
    successor.take_state();
    assert!(successor.ack());
    let batch = successor.next().expect("a batch");
    assert_eq!(batch[0], b'B', "a batch");
    assert!(successor.ack());
    assert_eq!(successor.listening, 0);
    successor.descriptors
}

/// A bus whose successor dies after taking the topics, before it took a
/// connection: the old process serves on (no subscriber is closed) and
/// numbers on in the same epoch, so every position its subscribers saved
/// still works (the successor never served anyone, so nothing it numbered
/// reached a client); a real successor then takes over and numbering goes
/// on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_whose_successor_dies_after_the_topics_serves_on_in_the_same_epoch() {
    let socket = socket_path("bus-dies");
    let path = socket.to_str().unwrap();
    let args = ["--history", "1000", "--handoff-socket", path];
    let (mut old, addr) = start_example("notify_bus", &args).await;
    let mut subscribers = Vec::new();
    for _ in 0..20 {
        let url = format!("ws://{addr}/ws?topics=a&positions=1");
        subscribers.push(tokio_tungstenite::connect_async(url).await.unwrap().0);
    }
    let mut publisher = Publisher::connect(addr).await;
    for n in 1..=5 {
        assert_eq!(publisher.publish("a", &format!("before {n}")).await, n);
    }
    let mut epoch = String::new();
    for subscriber in &mut subscribers {
        let got = deliveries(subscriber, 5).await;
        epoch = got[0].0.clone();
        let offsets: Vec<u64> = got.iter().map(|d| d.1).collect();
        assert_eq!(offsets, [1, 2, 3, 4, 5]);
    }
    let dying = socket.clone();
    tokio::task::spawn_blocking(move || die_after_the_state(&dying))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(old.0.try_wait().unwrap().is_none(), "the old bus exited");
    // The publisher's connection stayed too; the topic numbers on.
    for n in 6..=10 {
        assert_eq!(publisher.publish("a", &format!("after {n}")).await, n);
    }
    for subscriber in &mut subscribers {
        let got = deliveries(subscriber, 5).await;
        let positions: Vec<(&str, u64)> = got.iter().map(|d| (d.0.as_str(), d.1)).collect();
        let e = epoch.as_str();
        assert_eq!(positions, [(e, 6), (e, 7), (e, 8), (e, 9), (e, 10)]);
    }
    // A real successor now.
    let mut new = Child(
        std::process::Command::new(example("notify_bus"))
            .args(["--addr", &addr.to_string(), "--history", "1000"])
            .args(["--take-over", path, "--handoff-socket", path])
            .spawn()
            .unwrap(),
    );
    assert!(exits_zero(&mut old, Duration::from_secs(30)).await);
    for n in 11..=13 {
        assert_eq!(publisher.publish("a", &format!("after {n}")).await, n);
    }
    for subscriber in &mut subscribers {
        let got = deliveries(subscriber, 3).await;
        let positions: Vec<(&str, u64)> = got.iter().map(|d| (d.0.as_str(), d.1)).collect();
        let e = epoch.as_str();
        assert_eq!(positions, [(e, 11), (e, 12), (e, 13)]);
    }
    drop(new.0.kill());
}

/// A bus whose successor took the topics and a batch of connections (so
/// it served with them), then died: the old process serves on in a new
/// epoch, so nothing the dead successor numbered is taken for its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_whose_successor_served_then_died_serves_on_in_a_new_epoch() {
    let socket = socket_path("bus-served-dies");
    let path = socket.to_str().unwrap();
    let args = ["--history", "1000", "--handoff-socket", path];
    let (old, addr) = start_example("notify_bus", &args).await;
    let url = format!("ws://{addr}/ws?topics=a&positions=1");
    let mut subscriber = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap()
        .0;
    let mut publisher = Publisher::connect(addr).await;
    for n in 1..=3 {
        assert_eq!(publisher.publish("a", &format!("before {n}")).await, n);
    }
    let first = deliveries(&mut subscriber, 3).await[0].0.clone();
    let dying = socket.clone();
    let taken = tokio::task::spawn_blocking(move || die_after_the_first_batch(&dying))
        .await
        .unwrap();
    // (Each loop gives up its own batch: the first may hold one of the two.)
    assert!(taken >= 1, "a connection moved");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut old = old;
    assert!(old.0.try_wait().unwrap().is_none(), "the old bus exited");
    let mut subscriber = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap()
        .0;
    let mut publisher = Publisher::connect(addr).await;
    assert_eq!(publisher.publish("a", "after").await, 1);
    let got = deliveries(&mut subscriber, 1).await;
    assert_ne!(got[0].0, first, "a new epoch after a successor served");
    assert_eq!((got[0].1, got[0].2.as_str()), (1, "after"));
}

/// A handler that keeps its connections (the push example's does not
/// implement `hand_off`): after the handoff the old process closes them
/// with 1012 spread over `--spread-secs`, as SIGTERM would, not all in the
/// same instant, and exits 0; the new one serves new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_stay_are_drained_over_the_window_after_a_handoff() {
    stayers_drained("stay", "tokio").await;
}

/// The same on io_uring.
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_drains_the_connections_that_stay_over_the_window() {
    stayers_drained("stay-uring", "uring").await;
}

async fn stayers_drained(name: &str, backend: &str) {
    let socket = socket_path(name);
    let path = socket.to_str().unwrap();
    let pace = ["--push-size", "16", "--push-every-us", "100000"];
    let mut args = vec!["--handoff-socket", path, "--spread-secs", "2"];
    args.extend(["--backend", backend]);
    args.extend(pace);
    let (mut old, addr) = start_example("stream", &args).await;
    let url = format!("ws://{addr}/");
    let mut clients = Vec::new();
    for _ in 0..200 {
        let (client, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("upgraded");
        clients.push(client);
    }
    let began = Instant::now();
    // Each client reads pushes until its close: when, and with what code.
    let closes: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                loop {
                    let next = tokio::time::timeout(Duration::from_secs(20), client.next());
                    match next.await.expect("a close within 20 s") {
                        Some(Ok(Message::Close(frame))) => {
                            return (began.elapsed(), frame.map(|f| u16::from(f.code)));
                        }
                        Some(Ok(_)) => {}
                        other => panic!("ended without a close: {other:?}"),
                    }
                }
            })
        })
        .collect();
    let mut new = Child(
        std::process::Command::new(example("stream"))
            .args(["--addr", &addr.to_string(), "--take-over", path])
            .args(["--backend", backend])
            .args(pace)
            .spawn()
            .unwrap(),
    );
    let mut at = Vec::new();
    for close in closes {
        let (when, code) = close.await.unwrap();
        assert_eq!(code, Some(1012));
        at.push(when);
    }
    assert!(exits_zero(&mut old, Duration::from_secs(15)).await);
    at.sort();
    let (first, last) = (at[0], at[at.len() - 1]);
    let early = at
        .iter()
        .filter(|t| **t < first + Duration::from_secs(1))
        .count();
    eprintln!(
        "{backend}: 200 connections that stay closed from {first:?} to {last:?} after the \
         successor started, {early} in the first second"
    );
    assert!(
        last - first >= Duration::from_millis(1500),
        "spread over the window: {first:?}..{last:?}"
    );
    assert!(
        (40..=160).contains(&early),
        "about half in each second: {early}"
    );
    // The new process has the listener.
    let (mut fresh, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .expect("the new process accepts");
    assert!(matches!(fresh.next().await, Some(Ok(Message::Binary(_)))));
    drop(new.0.kill());
}

/// TLS sessions do not move (their state is rustls's, not data we
/// carry): after the handoff the old process closes its wss connections
/// with 1012, while the plain ones beside them (tokio's `--also-plain`)
/// move and talk on; the new process serves wss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_connections_stay_and_get_1012_while_plain_ones_move() {
    wss_stays("wss", "tokio", &["--also-plain"]).await;
}

/// The same on io_uring (wss only: it serves either ws or wss).
#[cfg(feature = "uring")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_wss_connections_stay_and_get_1012() {
    wss_stays("wss-uring", "uring", &[]).await;
}

async fn wss_stays(name: &str, backend: &str, extra: &[&str]) {
    let identity = tls::identity();
    let (cert, key) = (identity.cert_pem.to_str(), identity.key_pem.to_str());
    let socket = socket_path(name);
    let path = socket.to_str().unwrap();
    let mut args = vec!["--backend", backend, "--tls-cert", cert.unwrap()];
    args.extend(["--tls-key", key.unwrap()]);
    args.extend(extra);
    let (mut old, addr) =
        start_example("echo", &[&args[..], &["--handoff-socket", path]].concat()).await;
    let url = format!("wss://localhost:{}/", addr.port());
    let mut secure = Vec::new();
    for i in 0..5 {
        let stream = tls::connect(addr).await.expect("a TLS handshake");
        let (mut client, _) = tokio_tungstenite::client_async(url.as_str(), stream)
            .await
            .unwrap();
        client
            .send(Message::text(format!("wss {i}")))
            .await
            .unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::text(format!("wss {i}"))
        );
        secure.push(client);
    }
    let mut plain = Vec::new();
    if !extra.is_empty() {
        for i in 0..5 {
            let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
                .await
                .unwrap();
            client.send(Message::text(format!("ws {i}"))).await.unwrap();
            assert_eq!(
                client.next().await.unwrap().unwrap(),
                Message::text(format!("ws {i}"))
            );
            plain.push(client);
        }
    }
    let mut new = Child(
        std::process::Command::new(example("echo"))
            .args(["--addr", &addr.to_string(), "--take-over", path])
            .args(&args)
            .spawn()
            .unwrap(),
    );
    for mut client in secure {
        let next = tokio::time::timeout(Duration::from_secs(20), client.next()).await;
        match next.expect("a close within 20 s") {
            Some(Ok(Message::Close(frame))) => {
                assert_eq!(frame.map(|f| u16::from(f.code)), Some(1012));
            }
            other => panic!("a wss connection after the handoff: {other:?}"),
        }
    }
    assert!(exits_zero(&mut old, Duration::from_secs(20)).await);
    for (i, mut client) in plain.into_iter().enumerate() {
        client
            .send(Message::text(format!("moved {i}")))
            .await
            .unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::text(format!("moved {i}"))
        );
        close_politely(&mut client).await;
    }
    // The new process serves wss.
    let stream = tls::connect(addr)
        .await
        .expect("a TLS handshake with the new process");
    let (mut client, _) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .unwrap();
    client.send(Message::text("new")).await.unwrap();
    assert_eq!(client.next().await.unwrap().unwrap(), Message::text("new"));
    drop(new.0.kill());
}
