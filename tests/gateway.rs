//! The gateway example (both roles in one process) between
//! tokio-tungstenite clients and our test server: messages and close codes
//! both ways, a bad gateway, memory bounded when the client does not read
//! what the upstream pushes, and nothing lost when either side closes while
//! the other still sends.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::{Config, MessageKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, Message as Ws, protocol::CloseFrame};

async fn gateway_for(upstream: &str) -> (Child, std::net::SocketAddr) {
    start_example("gateway", &["--upstream", upstream, "--upstream-deflate"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_close_codes_cross_both_ways() {
    let server = start(Backend::Tokio, Config::default()).await;
    let (_gateway, addr) = gateway_for(&server.url("/")).await;
    let url = format!("ws://{addr}/");

    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let messages = [
        Ws::text("hello through the gateway"),
        Ws::binary(vec![1u8, 2, 3]),
        Ws::text("κόσμε".repeat(1000)),
        Ws::binary(vec![9u8; 1 << 20]),
    ];
    for message in &messages {
        ws.send(message.clone()).await.unwrap();
        assert_eq!(&next(&mut ws).await, message, "same payload, same opcode");
    }
    // The upstream closes with 4321: the client hears 4321.
    ws.send(Ws::text("close 4321 bye")).await.unwrap();
    match next(&mut ws).await {
        Ws::Close(Some(frame)) => {
            assert_eq!(
                (u16::from(frame.code), frame.reason.as_str()),
                (4321, "bye")
            );
        }
        other => panic!("expected a close, got {other:?}"),
    }
    // Reading on sends tungstenite's reply; the gateway answers the
    // upstream's close once it has it.
    let _: Option<Result<Ws, tungstenite::Error>> = ws.next().await;
    server.recorder.wait_closes(1).await;

    // The client closes with 4001: the upstream hears 4001.
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    ws.send(Ws::text("one")).await.unwrap();
    assert_eq!(next(&mut ws).await, Ws::text("one"));
    ws.close(Some(CloseFrame {
        code: 4001.into(),
        reason: "leaving".into(),
    }))
    .await
    .unwrap();
    let closes = server.recorder.wait_closes(2).await;
    assert_eq!(closes[0], (4321, String::new()));
    assert_eq!(closes[1], (4001, "leaving".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_closes_with_1014() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = unused.local_addr().unwrap().port();
    drop(unused);
    let (_gateway, addr) = gateway_for(&format!("ws://127.0.0.1:{port}/")).await;
    // Our client: tungstenite takes 1014 (registered after RFC 6455) for a
    // reserved code and fails the connection with 1002.
    let (mut socket, _) = rapidws::client::connect(format!("ws://{addr}/"))
        .await
        .unwrap();
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(rapidws::CloseCode::BAD_GATEWAY));
}

/// The upstream pushes 64 MiB to a client that does not read: the pushes
/// stall (the gateway stopped reading upstream, TCP did the rest) and the
/// gateway's memory stays bounded; once the client reads, every push
/// arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_stalls_the_upstream() {
    const PUSHES: usize = 64;
    const SIZE: usize = 1 << 20;
    let server = start(Backend::Tokio, Config::default()).await;
    let (gateway, addr) = gateway_for(&server.url("/")).await;
    let before = resident_of(&gateway);
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .unwrap();
    ws.send(Ws::text(format!("push {PUSHES} {SIZE}")))
        .await
        .unwrap();
    let pushed = || server.recorder.pushed.load(Ordering::SeqCst);
    // Let the pushes run until they stall.
    let mut last = usize::MAX;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if pushed() == last {
            break;
        }
        last = pushed();
    }
    let stalled = pushed();
    let grown = resident_of(&gateway).saturating_sub(before);
    eprintln!("stalled after {stalled} of {PUSHES} pushes; the gateway grew {grown} bytes");
    assert!(
        stalled < PUSHES * 3 / 4,
        "the upstream was held back: {stalled}"
    );
    assert!(
        grown < 24 << 20,
        "the gateway holds at most its queues: {grown}"
    );

    for i in 0..PUSHES {
        match next(&mut ws).await {
            Ws::Binary(data) => {
                assert_eq!(data, push_payload(MessageKind::Binary, i, SIZE), "push {i}")
            }
            other => panic!("push {i}: {other:?}"),
        }
    }
    assert_eq!(pushed(), PUSHES);
    ws.close(None).await.unwrap();
    let _: Option<Result<Ws, tungstenite::Error>> = ws.next().await;
}

/// A client that sends its last message and its close at once (one flush)
/// gets the upstream's answer, then the reply to its close: the gateway
/// passes the close upstream and relays what comes back until the
/// upstream's own close. Thirty runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_says_its_last_word_and_leaves_gets_the_answer() {
    let server = start(Backend::Tokio, Config::default()).await;
    let (_gateway, addr) = gateway_for(&server.url("/")).await;
    for run in 0..30 {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
            .await
            .unwrap();
        let text = format!("last word {run}");
        let (texts, code) = say_and_leave(&mut ws, &text).await;
        assert_eq!((texts, code), (vec![text], Some(1000)), "run {run}");
    }
    let closes = server.recorder.wait_closes(30).await;
    assert!(closes.iter().all(|close| close.0 == 1000), "{closes:?}");
}

/// The upstream closes first (4321); the client, having seen that close,
/// sends one more message and only then its reply. The message reaches the
/// upstream: the gateway answered the upstream's close only once the
/// client's reply was in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_client_sends_after_the_upstreams_close_still_reaches_it() {
    let server = start(Backend::Tokio, Config::default()).await;
    let (_gateway, addr) = start_example("gateway", &["--upstream", &server.url("/")]).await;
    for run in 0..10 {
        let mut stream = raw_upgraded(addr).await;
        stream
            .write_all(&client_frame(true, 0x1, b"close 4321 bye"))
            .await
            .unwrap();
        let mut head = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut head))
            .await
            .expect("the upstream's close within 10 s")
            .unwrap();
        assert_eq!(head[0], 0x88, "a close frame");
        let mut rest = vec![0u8; usize::from(head[1]) - 2];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(u16::from_be_bytes([head[2], head[3]]), 4321);
        let note = format!("note after the close {run}");
        let mut burst = client_frame(true, 0x1, note.as_bytes());
        burst.extend(client_frame(true, 0x8, &4321u16.to_be_bytes()));
        stream.write_all(&burst).await.unwrap();
        let rest = tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut stream))
            .await
            .expect("the gateway closes within 10 s");
        assert!(server_frames(&rest).is_empty(), "nothing more: {rest:?}");
        let reached = eventually(Duration::from_secs(5), || {
            server
                .recorder
                .saw(|seen| matches!(seen, Seen::Message(_, text) if *text == note))
        })
        .await;
        assert!(reached, "run {run}: the note reached the upstream");
    }
}
