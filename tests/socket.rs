//! The async socket API (`rapidws::socket`) on every backend, against
//! tokio-tungstenite clients and raw sockets: echo through `recv`/`send`
//! and through the `Stream`/`Sink` halves, cancel-safety of `recv`, the
//! inbox's bound pausing the peer, how the socket ends, and the reply to a
//! message that came just before the peer's close.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::socket::{Error, SocketHandler, WebSocket};
use rapidws::{CloseCode, Config, OwnedMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

/// Every test on every backend, and on io_uring once more with the
/// functions on the reactor's thread (`SocketHandler::on_server_loop`).
macro_rules! socket_tests {
    ($($name:ident),* $(,)?) => {
        backend_tests!($($name),*);

        #[cfg(all(target_os = "linux", feature = "uring"))]
        mod uring_on_server_loop {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::ON_SERVER_LOOP
                        .scope(true, super::$name($crate::common::Backend::Uring))
                        .await
                }
            )*
        }
    };
}

socket_tests!(
    echoes_through_recv_and_send,
    echoes_through_the_stream_and_sink_halves,
    recv_is_cancel_safe,
    a_full_inbox_stops_reading_until_the_socket_catches_up,
    dropping_the_socket_closes_the_connection,
    a_failed_connection_yields_its_error_then_ends,
    replies_to_messages_before_a_bad_frame_go_out_before_its_close,
    a_failure_waits_for_the_socket_at_most_the_close_timeout,
    a_close_completes_while_the_inbox_is_full,
    the_last_reply_goes_out_before_the_answer_to_the_peers_close,
    a_close_waits_for_the_socket_at_most_the_close_timeout,
);

tokio::task_local! {
    /// Set for the tests that run the functions on the server loop.
    static ON_SERVER_LOOP: bool;
}

/// `handler`, on the server loop if the test asks for it.
fn placed<T: Send + 'static>(handler: SocketHandler<T>) -> SocketHandler<T> {
    if ON_SERVER_LOOP.try_with(|on| *on).unwrap_or(false) {
        handler.on_server_loop()
    } else {
        handler
    }
}

/// Starts `backend` serving `serve` through a `SocketHandler`.
async fn start_sockets<F, Fut>(backend: Backend, config: Config, serve: F) -> TestServer
where
    F: Fn(WebSocket) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let handler = placed(SocketHandler::new(serve));
    common::serve(backend, handler, config, Arc::default()).await
}

/// What a server function reports to its test.
type Report = mpsc::UnboundedSender<String>;

async fn echo_and_report(mut socket: WebSocket, report: Report) {
    while let Some(message) = socket.recv().await {
        match message {
            Ok(message) => socket.send(message).await.expect("room to echo"),
            Err(Error::Failed { code, reason }) => {
                let _ = report.send(format!("failed {} ({reason})", code.0));
            }
            Err(error) => panic!("a receive never fails with {error}"),
        }
    }
    let code = socket.close_code().map(|code| code.0);
    let _ = report.send(format!("ended {code:?}"));
}

/// Text with multi-byte UTF-8 and binary up to 1 MiB come back as sent; the
/// client's close (4000) ends the socket's stream, and `close_code` says so.
async fn echoes_through_recv_and_send(backend: Backend) {
    let (report, mut reports) = mpsc::unbounded_channel();
    let server = start_sockets(backend, Config::default(), move |socket| {
        echo_and_report(socket, report.clone())
    })
    .await;
    let mut client = server.client().await;
    let text = "héllo wörld, 你好, 🦀".repeat(100);
    client.send(WsMessage::text(text.clone())).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text(text));
    for len in [0, 1, 125, 126, 65536, 1 << 20] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        client.send(WsMessage::binary(data.clone())).await.unwrap();
        assert_eq!(next(&mut client).await, WsMessage::binary(data));
    }
    client
        .close(Some(CloseFrame {
            code: 4000.into(),
            reason: "done".into(),
        }))
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), reports.recv()).await;
    assert_eq!(ended.unwrap().as_deref(), Some("ended Some(4000)"));
}

/// A reader task forwards what the read half yields to a writer task that
/// sends it through the write half's `Sink`: 1,000 messages in order.
async fn echoes_through_the_stream_and_sink_halves(backend: Backend) {
    let server = start_sockets(backend, Config::default(), |socket| async move {
        let (mut read, mut write) = socket.split();
        let (forward, mut forwarded) = mpsc::channel::<OwnedMessage>(16);
        let writer = tokio::spawn(async move {
            while let Some(message) = forwarded.recv().await {
                write.send(message).await.expect("sink open");
            }
            SinkExt::close(&mut write).await.unwrap();
        });
        while let Some(Ok(message)) = read.next().await {
            if forward.send(message).await.is_err() {
                break;
            }
        }
        drop(forward);
        let _ = writer.await;
    })
    .await;
    let (mut write, mut read) = server.client().await.split();
    let sending = tokio::spawn(async move {
        for i in 0..1000u32 {
            write
                .send(WsMessage::text(format!("message {i}")))
                .await
                .unwrap();
        }
        write
    });
    for i in 0..1000u32 {
        let echoed = tokio::time::timeout(Duration::from_secs(10), read.next())
            .await
            .expect("an echo within 10 s");
        assert_eq!(
            echoed.unwrap().unwrap(),
            WsMessage::text(format!("message {i}"))
        );
    }
    drop(sending.await.unwrap());
}

/// The server drops `recv` futures at random points (a race against a
/// timer of 0-63 µs, or a yield); every one of 5,000 messages still arrives
/// once, in order (the way tokio-websockets tests its cancel-safety).
async fn recv_is_cancel_safe(backend: Backend) {
    let server = start_sockets(backend, Config::default(), |mut socket| async move {
        let (mut expected, mut cancelled, mut seed) = (0u32, 0u32, 0x9e37_79b9u32);
        while expected < 5000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let wait = async {
                if seed % 4 == 0 {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(Duration::from_micros(u64::from(seed % 64))).await;
                }
            };
            tokio::select! {
                message = socket.recv() => {
                    let Some(Ok(OwnedMessage::Text(text))) = message else {
                        panic!("the stream ended early");
                    };
                    assert_eq!(text, expected.to_string(), "in order, none lost");
                    expected += 1;
                }
                () = wait => cancelled += 1,
            }
        }
        let _ = socket
            .send(format!("all {expected}, {cancelled} cancelled"))
            .await;
    })
    .await;
    let mut client = server.client().await;
    for i in 0..5000u32 {
        client.feed(WsMessage::text(i.to_string())).await.unwrap();
        if i % 100 == 99 {
            client.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    client.flush().await.unwrap();
    let WsMessage::Text(verdict) = next(&mut client).await else {
        panic!("a text verdict");
    };
    let cancelled: u32 = verdict
        .strip_prefix("all 5000, ")
        .and_then(|rest| rest.strip_suffix(" cancelled"))
        .unwrap_or_else(|| panic!("{verdict}"))
        .parse()
        .unwrap();
    assert!(cancelled > 0, "no recv was ever dropped: {verdict}");
}

/// A socket that does not read, with a 64 KiB inbox: the client's sends
/// stall (the server stopped reading, and TCP's window closed) long before
/// its 64 MiB are out: its count of messages sent stops moving. Once the
/// socket reads, every message arrives, in order.
async fn a_full_inbox_stops_reading_until_the_socket_catches_up(backend: Backend) {
    let (go, gate) = tokio::sync::watch::channel(false);
    let handler = SocketHandler::new(move |mut socket: WebSocket| {
        let mut gate = gate.clone();
        async move {
            gate.wait_for(|&open| open).await.unwrap();
            let mut n = 0u32;
            while n < 1024 {
                let Some(Ok(OwnedMessage::Binary(data))) = socket.recv().await else {
                    panic!("1,024 messages");
                };
                assert_eq!(data.len(), 65536);
                assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), n);
                n += 1;
            }
            socket.send(format!("got {n}")).await.unwrap();
        }
    })
    .inbox_limit(64 * 1024);
    let server = common::serve(backend, placed(handler), Config::default(), Arc::default()).await;
    let (mut write, mut read) = server.client().await.split();
    let sent = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = sent.clone();
    let sending = tokio::spawn(async move {
        for n in 0..1024u32 {
            let mut data = vec![0u8; 65536];
            data[..4].copy_from_slice(&n.to_be_bytes());
            write.send(WsMessage::binary(data)).await.unwrap();
            counted.store(n + 1, std::sync::atomic::Ordering::SeqCst);
        }
        write
    });
    let count = || sent.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stalled_at = count();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(), stalled_at, "the client's sends went on");
    assert!(
        stalled_at < 1024,
        "64 MiB went out to a socket that reads nothing"
    );
    go.send(true).unwrap();
    let verdict = tokio::time::timeout(Duration::from_secs(30), read.next()).await;
    assert_eq!(
        verdict.unwrap().unwrap().unwrap(),
        WsMessage::text("got 1024")
    );
    drop(sending.await.unwrap());
}

/// A function that returns drops its socket: the client gets a close with
/// 1000; one that panics: 1011.
async fn dropping_the_socket_closes_the_connection(backend: Backend) {
    let server = start_sockets(backend, Config::default(), |mut socket| async move {
        match socket.recv().await {
            Some(Ok(OwnedMessage::Text(text))) if text == "panic" => panic!("asked to"),
            _ => {}
        }
    })
    .await;
    for (ask, code) in [("return", 1000), ("panic", 1011)] {
        let mut client = server.client().await;
        client.send(WsMessage::text(ask)).await.unwrap();
        assert_eq!(expect_close(&mut client).await.0, code, "after {ask}");
    }
}

/// Invalid UTF-8 from the client fails the connection with 1007: the
/// socket's stream yields that error once, then ends.
async fn a_failed_connection_yields_its_error_then_ends(backend: Backend) {
    let (report, mut reports) = mpsc::unbounded_channel();
    let server = start_sockets(backend, Config::default(), move |socket| {
        echo_and_report(socket, report.clone())
    })
    .await;
    let mut stream = raw_upgraded(server.addr).await;
    stream
        .write_all(&client_frame(true, 0x1, &[0xff, 0xfe]))
        .await
        .unwrap();
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], 0x88, "a close frame");
    assert_eq!(u16::from_be_bytes([reply[2], reply[3]]), 1007);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let report = tokio::time::timeout(Duration::from_secs(10), reports.recv()).await;
        seen.push(report.unwrap().unwrap());
    }
    let failed = format!("failed {} (", CloseCode::INVALID_PAYLOAD.0);
    assert!(seen[0].starts_with(&failed), "{seen:?}");
    assert_eq!(seen[1], "ended Some(1007)");
}

/// Messages and a bad frame in one write (Autobahn's 3.2, 5.15): the
/// socket's task echoes the messages before the failure's close frame goes
/// out, as a pipelining peer expects, and nothing after the bad frame is
/// read.
async fn replies_to_messages_before_a_bad_frame_go_out_before_its_close(backend: Backend) {
    let (report, mut reports) = mpsc::unbounded_channel();
    let server = start_sockets(backend, Config::default(), move |socket| {
        echo_and_report(socket, report.clone())
    })
    .await;
    let mut stream = raw_upgraded(server.addr).await;
    let mut burst = Vec::new();
    for i in 0..3u8 {
        burst.extend(client_frame(true, 0x1, format!("request {i}").as_bytes()));
    }
    // A reserved opcode (1002), then a message that must not be delivered.
    burst.extend(client_frame(true, 0x5, b""));
    burst.extend(client_frame(true, 0x1, b"after the failure"));
    stream.write_all(&burst).await.unwrap();
    let received = tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut stream))
        .await
        .expect("the server closes within 10 s");
    let frames = server_frames(&received);
    let texts: Vec<(u8, Vec<u8>)> = (0..3u8)
        .map(|i| (0x1, format!("request {i}").into_bytes()))
        .collect();
    assert_eq!(&frames[..3], &texts[..], "the echoes first: {frames:?}");
    assert_eq!(frames.len(), 4, "then only the close: {frames:?}");
    assert_eq!(frames[3].0, 0x8);
    assert_eq!(close_code_of(&received), 1002);
    let failed = tokio::time::timeout(Duration::from_secs(10), reports.recv()).await;
    assert!(failed.unwrap().unwrap().starts_with("failed 1002"));
}

/// A socket that never takes its messages does not hold a failed
/// connection open: the close frame goes out at the close timeout.
async fn a_failure_waits_for_the_socket_at_most_the_close_timeout(backend: Backend) {
    let server = start_sockets(
        backend,
        Config::default().close_timeout(Duration::from_millis(400)),
        |socket: WebSocket| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(socket);
        },
    )
    .await;
    let mut stream = raw_upgraded(server.addr).await;
    let mut burst = client_frame(true, 0x1, b"never read");
    burst.extend(client_frame(true, 0x5, b""));
    let started = std::time::Instant::now();
    stream.write_all(&burst).await.unwrap();
    let received = tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut stream))
        .await
        .expect("the server closes within 10 s");
    let waited = started.elapsed();
    assert_eq!(server_frames(&received).len(), 1, "only the close");
    assert_eq!(close_code_of(&received), 1002);
    assert!(
        waited >= Duration::from_millis(300),
        "closed after {waited:?}"
    );
}

/// The socket's inbox (64 KiB) is full and its task never reads again; the
/// task starts the close. The server still reads what the client sent (and
/// drops it: nothing is delivered after a close) up to the client's close
/// reply, so TCP ends at once, not after the 30 s close timeout.
async fn a_close_completes_while_the_inbox_is_full(backend: Backend) {
    let (go, gate) = tokio::sync::watch::channel(false);
    let handler = SocketHandler::new(move |socket: WebSocket| {
        let mut gate = gate.clone();
        async move {
            gate.wait_for(|&open| open).await.unwrap();
            socket.close(CloseCode::NORMAL, "").unwrap();
            // Held, not read and not dropped (dropping would lift the pause).
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(socket);
        }
    })
    .inbox_limit(64 * 1024);
    let config = Config::default().close_timeout(Duration::from_secs(30));
    let server = common::serve(backend, placed(handler), config, Arc::default()).await;
    let (mut read, mut write) = raw_upgraded(server.addr).await.into_split();
    let (closed, close_seen) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        // 4 MiB: more than the inbox, the read buffer and (on a paused
        // connection) the kernel's buffers take, so this may block until
        // the server reads again.
        let frame = client_frame(true, 0x2, &[5u8; 16 * 1024]);
        for _ in 0..256 {
            write.write_all(&frame).await.unwrap();
        }
        close_seen.await.unwrap();
        write
            .write_all(&client_frame(true, 0x8, &1000u16.to_be_bytes()))
            .await
            .unwrap();
        write
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    go.send(true).unwrap();
    let mut received = Vec::new();
    let mut closed = Some(closed);
    let ended = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = read.read(&mut chunk).await.unwrap();
            if n == 0 {
                return;
            }
            received.extend_from_slice(&chunk[..n]);
            if received.first() == Some(&0x88)
                && let Some(closed) = closed.take()
            {
                closed.send(()).unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("TCP ended soon after the close handshake, not after the close timeout");
    assert_eq!(
        &received[..4],
        &[0x88, 2, 0x03, 0xe8],
        "the server's close, 1000"
    );
    drop(writer.await.unwrap());
}

/// A client sends a message and its close at once (tokio-tungstenite, one
/// flush): the socket's task takes the message, and the close arrives while
/// it works on the answer (a millisecond here). The answer still goes out,
/// then the reply to the close, which waited for `recv` to return the end.
/// Many runs: without the wait this lost the answer often, not always.
async fn the_last_reply_goes_out_before_the_answer_to_the_peers_close(backend: Backend) {
    let server = start_sockets(backend, Config::default(), |mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if socket.send(message).await.is_err() {
                break;
            }
        }
    })
    .await;
    for run in 0..25 {
        let mut client = server.client().await;
        let text = format!("last word {run}");
        let (texts, code) = say_and_leave(&mut client, &text).await;
        assert_eq!((texts, code), (vec![text], Some(1000)), "run {run}");
    }
}

/// A socket that holds on and never reads again does not hold the peer's
/// close unanswered for long: the reply goes at the close timeout.
async fn a_close_waits_for_the_socket_at_most_the_close_timeout(backend: Backend) {
    let server = start_sockets(
        backend,
        Config::default().close_timeout(Duration::from_millis(400)),
        |mut socket: WebSocket| async move {
            let _ = socket.recv().await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(socket);
        },
    )
    .await;
    let mut client = server.client().await;
    let started = std::time::Instant::now();
    let (texts, code) = say_and_leave(&mut client, "never answered").await;
    let waited = started.elapsed();
    assert_eq!((texts, code), (vec![], Some(1000)));
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}"
    );
}

/// Where each function runs, and the task it spawns with
/// `rapidws::socket::spawn`: on io_uring with `on_server_loop`, both on a
/// reactor's thread (and a tokio timer works there); without it, or on the
/// tokio groups, on the runtime's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_server_loop_runs_the_function_and_its_tasks_on_the_reactor() {
    let mut cases = vec![
        (Backend::Tokio, true, false),
        (Backend::Tokio, false, false),
    ];
    #[cfg(all(target_os = "linux", feature = "uring"))]
    cases.extend([(Backend::Uring, true, true), (Backend::Uring, false, false)]);
    for (backend, on_loop, expect_reactor) in cases {
        let handler = SocketHandler::new(|mut socket: WebSocket| async move {
            let here = std::thread::current().name().unwrap_or("").to_owned();
            let (tell, told) = tokio::sync::oneshot::channel();
            rapidws::socket::spawn(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let there = std::thread::current().name().unwrap_or("").to_owned();
                let _ = tell.send(there);
            });
            let there = told.await.unwrap_or_default();
            let _ = socket.send(format!("{here} {there}")).await;
            while let Some(Ok(_)) = socket.recv().await {}
        });
        let handler = if on_loop {
            handler.on_server_loop()
        } else {
            handler
        };
        let server = common::serve(backend, handler, Config::default(), Arc::default()).await;
        let mut client = server.client().await;
        let WsMessage::Text(threads) = next(&mut client).await else {
            panic!("a text message");
        };
        let on_reactor = threads
            .split(' ')
            .map(|name| name.starts_with("rapidws-uring-"))
            .collect::<Vec<_>>();
        assert_eq!(
            on_reactor,
            [expect_reactor, expect_reactor],
            "{backend:?}, on_server_loop {on_loop}: the function and its task ran on {threads}"
        );
        let _ = client.close(None).await;
    }
}
