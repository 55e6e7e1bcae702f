//! Requests answered while the server pushes, on every backend: producers
//! that wait for the reader, replies that jump the queue, and a connection
//! that keeps reading while its writes are blocked without growing memory.
//!
//! The server is the test handler (`push`, `req`, `bye` commands, see
//! `common`); clients are tokio-tungstenite or raw sockets.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

backend_tests!(
    a_slow_reader_gets_every_reply_in_order_while_the_server_pushes,
    a_ping_flood_from_a_client_that_never_reads_grows_no_memory,
    a_producer_waits_for_the_reader_and_ends_when_the_connection_closes,
    a_reply_never_overtakes_the_close,
);

/// 400 pushes of 64 KiB fill a 256 KiB queue (and every buffer on the
/// way: the client reads nothing until the producer waits for room); then
/// 40 requests go out while the client reads slowly (a pause after every
/// push). Every reply arrives, in order, the first ones ahead of queued
/// pushes, and every push arrives, in order.
async fn a_slow_reader_gets_every_reply_in_order_while_the_server_pushes(backend: Backend) {
    let server = start(backend, Config::default().max_outbound_bytes(256 * 1024)).await;
    let (mut write, mut read) = server.client().await.split();
    write.send(WsMessage::text("push 400 65536")).await.unwrap();
    // Waiting for the producer to stop, rather than for a fixed time: on a
    // loaded machine the pushes may not have filled the queue by then.
    assert!(
        settled_pushes(&server).await < 400,
        "the buffers took every push"
    );
    let requests = tokio::spawn(async move {
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            write
                .send(WsMessage::text(format!("req {i}")))
                .await
                .unwrap();
        }
        write
    });
    let (mut pushes, mut replies, mut overtook) = (0u32, 0u32, 0);
    let reading = async {
        while pushes < 400 || replies < 40 {
            match read.next().await.expect("open").expect("a message") {
                WsMessage::Binary(payload) => {
                    let n = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    assert_eq!((n, payload.len()), (pushes, 65536), "pushes in order");
                    pushes += 1;
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
                WsMessage::Text(text) => {
                    let (request, after) = text.split_once(" after ").expect("a reply");
                    assert_eq!(request, format!("req {replies}"), "replies in order");
                    // Pushes queued before the reply that arrive after it:
                    // the reply jumped the queue.
                    if after.parse::<u32>().unwrap() > pushes {
                        overtook += 1;
                    }
                    replies += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), reading)
        .await
        .expect("every push and reply within 30 s");
    assert!(overtook > 0, "no reply went ahead of a queued push");
    let mut write = requests.await.unwrap();
    write.send(WsMessage::Close(None)).await.unwrap();
    assert!(!server.recorder.saw(|seen| matches!(
        seen,
        Seen::Message(_, m) if m.starts_with("reply failed")
    )));
}

/// A client pings as fast as it can and reads nothing. The server keeps
/// reading (the client's writes never stall), and its unsent pongs are
/// replaced by the newest once they reach 4 KiB (`PONG_BUDGET`): its queue
/// stays tiny.
async fn a_ping_flood_from_a_client_that_never_reads_grows_no_memory(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut stream = raw_upgraded(server.addr).await;
    let mut pings = Vec::new();
    for i in 0..100_000u32 {
        pings.extend(client_frame(true, 0x9, &i.to_be_bytes()));
    }
    // 10 MB of pings, then 20 MB more: far more pongs (18 MB) than the
    // kernel's buffers hold.
    let mut flood = async |rounds| {
        for _ in 0..rounds {
            stream.write_all(&pings).await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), flood(10))
        .await
        .expect("the server kept reading");
    let conn = server.recorder.conns.lock().unwrap()[0].clone();
    // The server takes in the last pings.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = conn.queued_bytes();
    tokio::time::timeout(Duration::from_secs(30), flood(20))
        .await
        .expect("the server kept reading");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let then = conn.queued_bytes();
    // What is left is what was owed when the writes blocked (at most a
    // send's worth in flight, and 4 KiB of pongs): it does not grow with
    // the flood, of which 18 MB of pongs were owed.
    assert!(
        then < first + 128 * 1024,
        "{first} bytes queued after 10 MB of pings, {then} after 30 MB"
    );
    assert!(then < 1 << 20, "{then} bytes queued");
    assert!(conn.is_open());
}

/// A producer waits while a peer does not read (the queue and the kernel's
/// buffers full), goes on once it reads, and ends when the connection
/// closes.
async fn a_producer_waits_for_the_reader_and_ends_when_the_connection_closes(backend: Backend) {
    let server = start(backend, Config::default().max_outbound_bytes(128 * 1024)).await;
    let mut stream = raw_upgraded(server.addr).await;
    stream
        .write_all(&client_frame(true, 0x1, b"push 100000 16384"))
        .await
        .unwrap();
    let pushed = || server.recorder.pushed.load(Ordering::SeqCst);
    // The socket buffers fill, then the queue: the producer stops.
    let last = settled_pushes(&server).await;
    assert!(last < 100_000);
    // Read 16 MiB: the producer is woken and goes on.
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..16 {
        stream.read_exact(&mut buf).await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), || pushed() > last + 100).await,
        "the producer did not resume: {} pushes",
        pushed()
    );
    drop(stream);
    let ended = eventually(Duration::from_secs(10), || {
        server
            .recorder
            .saw(|seen| matches!(seen, Seen::Message(_, m) if m.starts_with("push ended after")))
    })
    .await;
    assert!(ended, "the producer outlived its connection");
}

/// `bye` is answered with a reply, then a close: the reply goes ahead of
/// the queued pushes but the close after all of them, and nothing follows
/// the close.
async fn a_reply_never_overtakes_the_close(backend: Backend) {
    let server = start(backend, Config::default().max_outbound_bytes(256 * 1024)).await;
    let mut client = server.client().await;
    send_text(&mut client, "push 400 65536").await;
    // Not reading: pushes queue up behind the kernel's full buffers.
    settled_pushes(&server).await;
    send_text(&mut client, "bye").await;
    let mut seen = Vec::new();
    let reading = async {
        loop {
            match client.next().await {
                Some(Ok(WsMessage::Binary(_))) => seen.push('p'),
                Some(Ok(WsMessage::Text(text))) => {
                    assert_eq!(text.as_str(), "last");
                    seen.push('r');
                }
                Some(Ok(WsMessage::Close(frame))) => {
                    assert_eq!(u16::from(frame.unwrap().code), 1000);
                    seen.push('c');
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("closed within 10 s");
    let seen: String = seen.into_iter().collect();
    assert!(seen.ends_with('c'), "{seen}: the close comes last");
    assert_eq!(seen.matches('r').count(), 1, "{seen}");
    assert!(
        seen.find('r') < seen.rfind('p'),
        "{seen}: the reply went ahead of queued pushes"
    );
}

/// Waits until the `push` task stops (no new push for 300 ms, after at least
/// one), and returns how many it queued.
async fn settled_pushes(server: &TestServer) -> usize {
    let mut last = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = server.recorder.pushed.load(Ordering::SeqCst);
        if now == last && now > 0 {
            return now;
        }
        last = now;
    }
    panic!("the producer never stopped: {last} pushes");
}

/// Tokio polls its I/O driver only when a worker runs out of tasks or every
/// `event_interval` task polls. A producer that keeps the runtime busy must
/// not keep a connection's requests unread: the group looks at its epoll
/// whenever the producer's sends wake it. With `event_interval(u32::MAX)`
/// and a producer that never lets the runtime idle, the driver never runs
/// once the pushes start, so only that look can see the request.
#[test]
fn a_producer_that_keeps_the_runtime_busy_does_not_keep_requests_unread() {
    use std::future::poll_fn;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::task::Poll;

    use rapidws::{Accept, Conn, Handler, Message, Reject, Request, ServerHandler};

    struct Busy(Arc<AtomicBool>);
    impl Handler for Busy {
        type State = ();

        fn on_open(&self, conn: &Conn, _: &mut ()) {
            let (conn, stop) = (conn.clone(), self.0.clone());
            // Never idle: wakes itself on every poll, and every 64th poll
            // pushes 16 bytes if there is room (which wakes the group).
            let mut polls = 0u64;
            tokio::spawn(poll_fn(move |cx| {
                if stop.load(Ordering::SeqCst) || !conn.is_open() {
                    return Poll::Ready(());
                }
                polls += 1;
                if polls.is_multiple_of(64) && conn.poll_ready(cx).is_ready() {
                    let _ = conn.send_binary(&[7; 16]);
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }));
        }
        fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
            conn.reply(message).expect("room for a reply");
        }
    }

    impl ServerHandler for Busy {
        fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
            Ok(())
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .event_interval(u32::MAX)
        .enable_all()
        .build()
        .unwrap();
    let server = server_runtime
        .block_on(rapidws::tokio::Server::bind(
            "127.0.0.1:0",
            Busy(stop.clone()),
            Config::default(),
        ))
        .unwrap();
    let addr = server.local_addr().unwrap();
    server_runtime.spawn(server.serve());
    let client_runtime = tokio::runtime::Runtime::new().unwrap();
    let answered = client_runtime.block_on(async {
        let url = format!("ws://{addr}/");
        let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        // The pushes are flowing: the producer is spinning.
        match client.next().await.unwrap().unwrap() {
            WsMessage::Binary(push) => assert_eq!(push.len(), 16),
            other => panic!("unexpected {other:?}"),
        }
        client.send(WsMessage::text("req 1")).await.unwrap();
        let reply = async {
            loop {
                match client.next().await.unwrap().unwrap() {
                    WsMessage::Binary(_) => continue,
                    other => return other,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), reply).await
    });
    stop.store(true, Ordering::SeqCst);
    server_runtime.shutdown_background();
    let reply = answered.expect("the request was answered while the producer spun");
    assert_eq!(reply, WsMessage::text("req 1"));
}
