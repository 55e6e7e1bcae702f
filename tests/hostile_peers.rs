//! Peers that try to exhaust the server rather than break the protocol: a
//! flood of half-open connections, and consumers that never read what they
//! are sent. Both measure the process (its descriptors, its resident
//! memory), so they live in a test binary of their own and run one after the
//! other. Run with `--nocapture` to see the figures.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::SinkExt;
use rapidws::Config;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message as Ws;

/// Silent TCP connections opened at once, if the descriptor limit allows:
/// with the server's own descriptor for each, this stays below the 20,000 a
/// process may have here.
const HALF_OPEN: usize = 8000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_do_not_stop_the_server() {
    set_soft_limit(None);
    // Raised to the hard limit by the first call; the second reads it.
    let limit = set_soft_limit(None);
    // Both ends of each connection are in this process.
    let half_open = HALF_OPEN.min((limit.saturating_sub(1000) / 2) as usize);
    assert!(
        half_open >= 1000,
        "a descriptor limit of {limit} is too low for this test"
    );
    // Plain TCP only: through the tests' TLS bridge a flood would take
    // three descriptors per connection in this one process.
    for backend in Backend::plain() {
        half_open_flood(backend, half_open).await;
        slow_consumers(backend).await;
    }
}

/// Thousands of connections that never send a byte: new clients are still
/// served, and the flood is cut off by the handshake timeout.
async fn half_open_flood(backend: Backend, count: usize) {
    let timeout = Duration::from_secs(5);
    let config = Config::default()
        .handshake_timeout(timeout)
        .close_timeout(Duration::from_millis(500));
    let server = start(backend, config).await;
    let addr = server.addr;
    let started = Instant::now();
    let flood = tokio::task::spawn_blocking(move || {
        (0..count)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // The server accepted them all (each waits for its request).
    eventually(Duration::from_secs(3), || server.handle.alive() >= count).await;
    assert!(
        server.handle.alive() >= HALF_OPEN,
        "{}",
        server.handle.alive()
    );
    let opened = started.elapsed();
    // A newcomer is served at once.
    let mut client = tokio::time::timeout(Duration::from_secs(2), server.client())
        .await
        .expect("a handshake during the flood");
    send_text(&mut client, "served").await;
    assert_eq!(next(&mut client).await, Ws::text("served"));
    // The handshake timeout ends the flood without any help from it.
    eventually(Duration::from_secs(15), || server.handle.alive() <= 1).await;
    assert_eq!(server.handle.alive(), 1, "only the newcomer is left");
    eprintln!(
        "{backend:?}: {count} half-open connections (opened in {opened:?}) \
         did not stop a newcomer, and were cut off after the {timeout:?} handshake timeout"
    );
    drop(flood);
    send_text(&mut client, "still served").await;
    assert_eq!(next(&mut client).await, Ws::text("still served"));
}

/// 256 MiB aimed at peers that never read: one sends that much to be echoed,
/// and the handler tries to send another that much to a second one. The
/// server stops reading from the first and refuses the sends to the second
/// (default policy, 4 MiB queue), so its memory grows by far less, and a
/// third client is served all along.
async fn slow_consumers(backend: Backend) {
    const TOTAL: usize = 256 << 20;
    const MESSAGE: usize = 64 << 10;
    let server = start(backend, Config::default()).await;
    let mut bystander = server.client().await;
    // Warm the server's buffers the way real traffic would.
    for _ in 0..4 {
        bystander
            .send(Ws::binary(vec![1u8; MESSAGE]))
            .await
            .unwrap();
        assert_eq!(next(&mut bystander).await.len(), MESSAGE);
    }
    let before = resident_bytes();

    let mut sender = raw_upgraded(server.addr).await;
    let frame = client_frame(true, 0x2, &vec![7u8; MESSAGE]);
    let mut pushed = 0;
    while pushed < TOTAL {
        // Blocked for a second: the server has stopped reading from us.
        match tokio::time::timeout(Duration::from_secs(1), sender.write_all(&frame)).await {
            Ok(result) => result.unwrap(),
            Err(_) => break,
        }
        pushed += frame.len();
    }
    let mut receiver = raw_upgraded(server.addr).await;
    let flood = format!("flood {} {MESSAGE}", TOTAL / MESSAGE);
    receiver
        .write_all(&client_frame(true, 0x1, flood.as_bytes()))
        .await
        .unwrap();
    // The handler's flood has run once it reports how many sends it lost.
    let flooded = || {
        server
            .recorder
            .saw(|s| matches!(s, Seen::Message(_, t) if t.starts_with("refused")))
    };
    eventually(Duration::from_secs(2), flooded).await;

    send_text(&mut bystander, "served").await;
    assert_eq!(next(&mut bystander).await, Ws::text("served"));
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "{backend:?}: {} MiB pushed for echo before the server stopped reading, \
         {} MiB of sends aimed at a non-reader; server RSS grew {:.1} MiB",
        pushed >> 20,
        TOTAL >> 20,
        grown as f64 / f64::from(1 << 20),
    );
    assert!(
        pushed < TOTAL,
        "the server kept reading from a peer that does not read"
    );
    assert!(grown < 32 << 20, "RSS grew by {} MiB", grown >> 20);
    let refused = server
        .recorder
        .seen
        .lock()
        .unwrap()
        .iter()
        .find_map(|s| match s {
            Seen::Message(_, t) => t
                .strip_prefix("refused ")
                .map(|n| n.parse::<usize>().unwrap()),
            _ => None,
        });
    assert!(
        refused.is_some_and(|n| n > TOTAL / MESSAGE / 2),
        "{refused:?}"
    );
    drop((sender, receiver));
}
