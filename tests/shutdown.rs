//! Graceful shutdown with the closes spread over a window, as operators
//! meet it: the examples get
//! SIGTERM, close their connections with 1012 spread over `--spread-secs`
//! (not in one burst) and exit 0; an axum app's WebSocket connections
//! (which axum's own shutdown never reaches) are closed the same way; and
//! the library's `shutdown_spread` and `shutdown_gracefully` on every
//! server. The clients are tokio-tungstenite.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite;

/// Opens `count` WebSocket connections to `url` (at most 256 handshakes
/// in flight); each waits for the server's close frame and reports when it
/// came and its code (0 if the connection ended without one).
async fn open_and_watch(url: String, count: usize) -> Vec<tokio::task::JoinHandle<(Instant, u16)>> {
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut opening = Vec::with_capacity(count);
    for _ in 0..count {
        let (url, limit) = (url.clone(), limit.clone());
        opening.push(tokio::spawn(async move {
            let permit = limit.acquire_owned().await.unwrap();
            let (client, _) = tokio::time::timeout(
                Duration::from_secs(30),
                tokio_tungstenite::connect_async(url.as_str()),
            )
            .await
            .expect("connected within 30 s")
            .expect("upgraded");
            drop(permit);
            client
        }));
    }
    let mut watching = Vec::with_capacity(count);
    for opened in opening {
        let mut client = opened.await.unwrap();
        watching.push(tokio::spawn(async move {
            while let Some(message) = client.next().await {
                if let Ok(tungstenite::Message::Close(frame)) = message {
                    let code = frame.map_or(1005, |frame| u16::from(frame.code));
                    return (Instant::now(), code);
                }
            }
            (Instant::now(), 0)
        }));
    }
    watching
}

/// Sends SIGTERM to `child`.
fn terminate(child: &Child) {
    // SAFETY: kill only sends a signal to the process id we started.
    let sent = unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
}

/// Collects when each connection saw its close (after `start`) and with
/// which code.
async fn closes(
    watching: Vec<tokio::task::JoinHandle<(Instant, u16)>>,
    start: Instant,
) -> (Vec<Duration>, Vec<u16>) {
    let mut offsets = Vec::with_capacity(watching.len());
    let mut codes = Vec::with_capacity(watching.len());
    for watched in watching {
        let (at, code) = tokio::time::timeout(Duration::from_secs(30), watched)
            .await
            .expect("every connection closed within 30 s")
            .unwrap();
        offsets.push(at.saturating_duration_since(start));
        codes.push(code);
    }
    (offsets, codes)
}

/// The closes are spread over `window`: every code is 1012, none comes
/// after the window (plus slack for the close to travel), each fifth of the
/// window holds between 10% and 30% of them (20% if even), and no 100 ms
/// holds more than 5% (2% if even): not one burst.
fn assert_spread(offsets: &[Duration], codes: &[u16], window: Duration) {
    let n = offsets.len();
    let wrong: Vec<_> = codes.iter().filter(|&&code| code != 1012).collect();
    assert!(
        wrong.is_empty(),
        "{} of {n} closes were not 1012: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    let last = offsets.iter().max().unwrap();
    assert!(
        *last <= window + Duration::from_millis(1500),
        "the last close came {last:?} after SIGTERM, window {window:?}"
    );
    let fifth = window / 5;
    let mut fifths = [0usize; 5];
    for offset in offsets {
        let index = (offset.as_nanos() / fifth.as_nanos()).min(4) as usize;
        fifths[index] += 1;
    }
    for (index, count) in fifths.iter().enumerate() {
        assert!(
            (n / 10..=n * 3 / 10).contains(count),
            "fifth {index} of the window held {count} of {n} closes: {fifths:?}"
        );
    }
    let mut tenths = std::collections::HashMap::<u128, usize>::new();
    for offset in offsets {
        *tenths.entry(offset.as_millis() / 100).or_default() += 1;
    }
    let busiest = tenths.values().max().unwrap();
    eprintln!(
        "{n} closes over {window:?}: per fifth {fifths:?}, busiest 100 ms {busiest}, last {last:?}"
    );
    assert!(
        *busiest <= n / 20,
        "{busiest} of {n} closes came in one 100 ms: a burst"
    );
}

/// Drains 10,000 connections of the echo example over 5 s.
async fn spread_example(backend: &str) {
    let window = Duration::from_secs(5);
    let (mut child, addr) =
        start_example("echo", &["--backend", backend, "--spread-secs", "5"]).await;
    let watching = open_and_watch(format!("ws://{addr}/"), 10_000).await;
    let start = Instant::now();
    terminate(&child);
    // The listening socket closes at once: a load balancer moves on.
    assert!(
        eventually(Duration::from_secs(2), || std::net::TcpStream::connect(
            addr
        )
        .is_err())
        .await,
        "{backend}: still accepting after SIGTERM"
    );
    let (offsets, codes) = closes(watching, start).await;
    assert_spread(&offsets, &codes, window);
    assert!(
        exits_zero(&mut child, Duration::from_secs(15)).await,
        "{backend}: the example did not exit 0 after its spread"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_spreads_ten_thousand_connections_over_the_window_on_both_backends() {
    // 10,000 connections of ours in this process (the server's are in its).
    set_soft_limit(None);
    spread_example("tokio").await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    spread_example("uring").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_apps_websockets_are_spread_on_sigterm() {
    // The flag's older name, still accepted.
    let (mut child, addr) = start_example("axum_echo", &["--drain-secs", "1"]).await;
    // Both of the example's APIs: the callback (/ws) and the async socket
    // (/stream).
    let mut watching = open_and_watch(format!("ws://{addr}/ws"), 100).await;
    watching.extend(open_and_watch(format!("ws://{addr}/stream"), 100).await);
    let start = Instant::now();
    terminate(&child);
    let (offsets, codes) = closes(watching, start).await;
    assert!(
        codes.iter().all(|&code| code == 1012),
        "axum's WebSocket connections closed with {codes:?}"
    );
    // Spread, not at once: some early in the second, some late.
    assert!(
        offsets
            .iter()
            .any(|offset| *offset < Duration::from_millis(400))
    );
    assert!(
        offsets
            .iter()
            .any(|offset| *offset > Duration::from_millis(600))
    );
    assert!(exits_zero(&mut child, Duration::from_secs(15)).await);
}

/// `shutdown_gracefully` on the library's own servers: a custom code, and
/// the call returns once every connection has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gracefully_closes_with_the_chosen_code_and_returns_when_all_are_gone() {
    #[allow(unused_mut)]
    let mut backends = vec![Backend::Tokio, Backend::Stream];
    #[cfg(all(target_os = "linux", feature = "uring"))]
    backends.push(Backend::Uring);
    for backend in backends {
        let server = start(backend, rapidws::Config::default()).await;
        let addr: SocketAddr = server.addr;
        let watching = open_and_watch(format!("ws://{addr}/"), 50).await;
        let handle = server.handle.clone();
        assert!(
            eventually(Duration::from_secs(5), || handle.connections() == 50).await,
            "{backend:?}: {} connections",
            handle.connections()
        );
        let began = Instant::now();
        handle.shutdown_spread(
            rapidws::Spread::over(Duration::from_millis(500))
                .code(rapidws::CloseCode::TRY_AGAIN_LATER, "come back later"),
        );
        // A second request changes nothing.
        handle.shutdown();
        tokio::time::timeout(Duration::from_secs(15), handle.ended())
            .await
            .expect("ended within the window and the timeout");
        assert_eq!(handle.alive(), 0, "{backend:?}");
        let (offsets, codes) = closes(watching, began).await;
        assert!(
            codes.iter().all(|&code| code == 1013),
            "{backend:?}: {codes:?}"
        );
        let last = offsets.iter().max().unwrap();
        assert!(*last < Duration::from_secs(3), "{backend:?}: {last:?}");
        assert!(
            offsets
                .iter()
                .any(|offset| *offset > Duration::from_millis(250)),
            "{backend:?}: all closed at once: {offsets:?}"
        );
    }
}

/// The client's connections too: `Client::shutdown_gracefully` closes each
/// with 1012, spread over the window; the servers are tokio-tungstenite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_connections_close_with_1012_spread_over_the_window() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, mut closes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut server = tokio_tungstenite::accept_async(tcp).await.unwrap();
                // Read on after the close, so that the reply goes out.
                while let Some(Ok(message)) = server.next().await {
                    if let tungstenite::Message::Close(frame) = message {
                        let code = frame.map_or(1005, |frame| u16::from(frame.code));
                        let _ = seen.send((Instant::now(), code));
                    }
                }
            });
        }
    });
    let client = rapidws::client::Client::new(rapidws::Config::default());
    let mut sockets = Vec::new();
    for _ in 0..40 {
        let (socket, _) = client.connect(format!("ws://{addr}/")).await.unwrap();
        sockets.push(socket);
    }
    let began = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(15),
        client.shutdown_gracefully(Duration::from_millis(800)),
    )
    .await
    .expect("the shutdown ends within the window and the timeout");
    let mut offsets = Vec::new();
    for _ in 0..40 {
        let (at, code) = tokio::time::timeout(Duration::from_secs(5), closes.recv())
            .await
            .expect("every server saw a close")
            .unwrap();
        assert_eq!(code, 1012);
        offsets.push(at - began);
    }
    assert!(
        offsets.iter().any(|o| *o < Duration::from_millis(300)),
        "{offsets:?}"
    );
    assert!(
        offsets.iter().any(|o| *o > Duration::from_millis(500)),
        "{offsets:?}"
    );
    assert!(
        offsets.iter().all(|o| *o < Duration::from_secs(3)),
        "{offsets:?}"
    );
    drop(sockets);
}
