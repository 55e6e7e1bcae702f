//! The server over real sockets, driven by an independent client
//! (tokio-tungstenite) and, for what such a client will not send, by raw bytes.

mod common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::{CloseCode, Config, SlowConsumer};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::{
    self, Message as Ws,
    protocol::{
        CloseFrame,
        frame::{
            Frame,
            coding::{Data, OpCode},
        },
    },
};

backend_tests!(
    echoes_text_binary_and_empty_messages,
    echoes_an_8_mib_message,
    echoes_a_fragmented_message,
    answers_pings_and_sends_its_own,
    peer_close_codes_are_echoed_and_reported,
    handler_close_sends_the_code_and_waits_for_the_peer,
    messages_the_peer_sent_before_our_close_reached_it_are_delivered,
    pages_of_other_origins_are_refused_unless_allowed,
    rejects_bad_handshakes_with_the_right_status,
    upgrade_hook_can_reject_and_pick_a_subprotocol,
    frames_sent_with_the_request_are_not_lost,
    invalid_utf8_gets_1007,
    protocol_errors_get_1002,
    oversized_messages_get_1009_before_the_payload,
    the_upgrade_hook_sets_a_connections_own_limits,
    handler_panic_closes_only_that_connection_with_1011,
    sends_from_another_task_arrive_in_order,
    many_connections_at_once,
    a_callback_reaches_every_idle_connection,
    a_full_outbound_queue_refuses_sends_then_drains,
    abrupt_disconnect_is_reported_as_1006,
    closing_a_peer_that_does_not_read_is_bounded,
    graceful_shutdown_sends_1001_to_everyone,
    shutdown_drops_peers_that_do_not_answer_after_its_timeout,
    a_panic_dropping_state_costs_only_that_connection,
    refusals_work_with_an_unlimited_close_timeout,
    random_traffic_from_clients_that_come_and_go,
    echoes_a_16_mib_message,
    hostile_compressed_input_is_closed_and_others_are_served,
    slowloris_handshakes_get_408_at_the_timeout,
    quiet_peers_are_pinged_and_dead_ones_closed,
    a_connection_limit_answers_503_above_it,
    the_close_policy_closes_a_slow_consumer_with_its_code,
);

async fn echoes_text_binary_and_empty_messages(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    for message in [
        Ws::text("hello"),
        Ws::text("κόσμε 🎵"),
        Ws::binary(vec![0u8, 1, 2, 255]),
        Ws::text(""),
        Ws::binary(Vec::new()),
        Ws::binary(vec![7u8; 70_000]),
    ] {
        client.send(message.clone()).await.unwrap();
        assert_eq!(next(&mut client).await, message);
    }
}

async fn echoes_an_8_mib_message(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    client.send(Ws::binary(big.clone())).await.unwrap();
    assert_eq!(next(&mut client).await, Ws::binary(big));
    let text = "0123456789abcdef".repeat((8 << 20) / 16);
    client.send(Ws::text(text.clone())).await.unwrap();
    assert_eq!(next(&mut client).await, Ws::text(text));
}

async fn echoes_a_fragmented_message(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    let parts: [&[u8]; 4] = [b"frag", "m€".as_bytes(), b"", b"nted"];
    for (i, part) in parts.iter().enumerate() {
        let opcode = if i == 0 {
            OpCode::Data(Data::Text)
        } else {
            OpCode::Data(Data::Continue)
        };
        let last = i == parts.len() - 1;
        client
            .send(Ws::Frame(Frame::message(part.to_vec(), opcode, last)))
            .await
            .unwrap();
        if i == 1 {
            // A ping between fragments is answered at once.
            client.send(Ws::Ping(b"mid".to_vec().into())).await.unwrap();
        }
    }
    assert_eq!(next(&mut client).await, Ws::text("fragm€nted"));
}

async fn answers_pings_and_sends_its_own(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    client
        .send(Ws::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let pong = tokio::time::timeout(Duration::from_secs(5), client.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(pong, Ws::Pong(b"are you there".to_vec().into()));
    // Unsolicited pongs are accepted silently.
    client
        .send(Ws::Pong(b"unasked".to_vec().into()))
        .await
        .unwrap();
    send_text(&mut client, "ping").await;
    let ping = tokio::time::timeout(Duration::from_secs(5), client.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ping, Ws::Ping(b"server ping".to_vec().into()));
    send_text(&mut client, "still echoing").await;
    assert_eq!(next(&mut client).await, Ws::text("still echoing"));
}

async fn peer_close_codes_are_echoed_and_reported(backend: Backend) {
    let server = start(backend, Config::default()).await;
    for (code, reason) in [(1000u16, "done"), (1001, ""), (3000, "app"), (4999, "x")] {
        let mut client = server.client().await;
        client
            .send(Ws::Close(Some(CloseFrame {
                code: code.into(),
                reason: reason.into(),
            })))
            .await
            .unwrap();
        let (echoed, _) = expect_close(&mut client).await;
        assert_eq!(echoed, code);
        // The server then ends TCP.
        let end = tokio::time::timeout(Duration::from_secs(5), client.next())
            .await
            .unwrap();
        assert!(end.is_none() || matches!(end, Some(Err(_))));
    }
    let closes = server.recorder.wait_closes(4).await;
    assert_eq!(
        closes,
        [
            (1000, "done".into()),
            (1001, String::new()),
            (3000, "app".into()),
            (4999, "x".into())
        ]
    );
}

async fn handler_close_sends_the_code_and_waits_for_the_peer(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    send_text(&mut client, "before").await;
    send_text(&mut client, "close 4001 going").await;
    assert_eq!(next(&mut client).await, Ws::text("before"));
    assert_eq!(expect_close(&mut client).await, (4001, "going".into()));
    // tungstenite sends its reply when polled again; then the server ends TCP.
    let end = tokio::time::timeout(Duration::from_secs(2), client.next())
        .await
        .unwrap();
    assert!(end.is_none() || matches!(end, Some(Err(_))), "{end:?}");
    // on_close reports the peer's reply (tungstenite echoes code and reason).
    let closes = server.recorder.wait_closes(1).await;
    assert_eq!(closes[0].0, 4001, "{closes:?}");
}

/// The messages a peer sent before our close frame reached it were
/// acknowledged by its TCP stack, so it counts them as delivered: they reach
/// `on_message` while the server waits for the peer's close.
async fn messages_the_peer_sent_before_our_close_reached_it_are_delivered(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    // Sent together, before the client reads anything: the two notes arrive
    // after the server has asked to close.
    for text in ["close 1012 draining", "note one", "note two"] {
        client.feed(Ws::text(text)).await.unwrap();
    }
    client.flush().await.unwrap();
    assert_eq!(expect_close(&mut client).await, (1012, "draining".into()));
    // tungstenite sends its close reply when polled again.
    let _ = tokio::time::timeout(Duration::from_secs(2), client.next()).await;
    let closes = server.recorder.wait_closes(1).await;
    assert_eq!(closes[0].0, 1012, "{closes:?}");
    let seen: Vec<String> = server
        .recorder
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|seen| match seen {
            Seen::Message(_, text) => Some(text.clone()),
            Seen::Close(..) => Some("(closed)".into()),
            _ => None,
        })
        .collect();
    assert_eq!(
        seen,
        ["close 1012 draining", "note one", "note two", "(closed)"],
        "every message before the peer's close, then on_close"
    );
}

/// Cross-site WebSocket hijacking: a browser page of another host gets 403
/// unless its origin is allowed; clients without `Origin` are let in.
async fn pages_of_other_origins_are_refused_unless_allowed(backend: Backend) {
    let status = |response: Vec<u8>| {
        let text = String::from_utf8_lossy(&response).into_owned();
        (text.get(9..12).unwrap_or("").to_owned(), text)
    };
    let origin = |value: &str| format!("Origin: {value}\r\n");
    let default = start(backend, Config::default()).await;
    let listed = start(
        backend,
        Config::default().allow_origins(["https://app.example", "http://localhost:3000"]),
    )
    .await;
    let any = start(backend, Config::default().allow_any_origin()).await;
    // (server, Origin, status); the requests say `Host: localhost`.
    let cases = [
        (&default, None, "101"),
        (&default, Some("http://localhost"), "101"),
        (&default, Some("https://LOCALHOST"), "101"),
        (&default, Some("https://evil.example"), "403"),
        (&default, Some("http://localhost:3000"), "403"),
        (&default, Some("null"), "403"),
        (&listed, Some("https://app.example"), "101"),
        (&listed, Some("http://localhost:3000"), "101"),
        (&listed, Some("http://localhost"), "101"),
        (&listed, Some("https://evil.example"), "403"),
        (&any, Some("https://evil.example"), "101"),
        (&any, Some("null"), "101"),
    ];
    for (server, value, want) in cases {
        let extra = value.map(origin).unwrap_or_default();
        if want == "101" {
            raw_upgraded_with(server.addr, &extra).await;
            continue;
        }
        let request = upgrade_request("/", &extra);
        let (got, text) = status(raw_exchange(server.addr, request.as_bytes()).await);
        assert_eq!(got, want, "{value:?}: {text}");
        assert!(text.contains("Config::allow_origins"), "{text}");
    }
    // tungstenite sends no Origin: let in.
    let mut client = default.client().await;
    send_text(&mut client, "still served").await;
    assert_eq!(next(&mut client).await, Ws::text("still served"));
}

async fn rejects_bad_handshakes_with_the_right_status(backend: Backend) {
    let server = start(backend, Config::default().max_handshake_size(1024)).await;
    let status_of = |response: &[u8]| {
        let text = String::from_utf8_lossy(response).into_owned();
        let status = text.split(' ').nth(1).unwrap_or("").to_owned();
        (status, text)
    };
    let valid = upgrade_request("/", "");
    let cases: Vec<(String, &str, &str)> = vec![
        (valid.replacen("GET", "POST", 1), "405", "Allow: GET"),
        (valid.replacen("HTTP/1.1", "HTTP/1.0", 1), "400", "HTTP/1.1"),
        (
            valid.replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8"),
            "426",
            "Sec-WebSocket-Version: 13",
        ),
        (
            valid.replace("Upgrade: websocket\r\n", ""),
            "400",
            "Upgrade",
        ),
        (
            valid.replace("Connection: Upgrade", "Connection: keep-alive"),
            "400",
            "Connection",
        ),
        (
            valid.replace("dGhlIHNhbXBsZSBub25jZQ==", "short"),
            "400",
            "Sec-WebSocket-Key",
        ),
        (valid.replace("Host: localhost\r\n", ""), "400", "Host"),
        (
            valid.replacen(
                "\r\n\r\n",
                &format!("\r\nX-Big: {}\r\n\r\n", "a".repeat(2000)),
                1,
            ),
            "431",
            "too large",
        ),
        ("garbage\r\n\r\n".to_owned(), "400", "malformed"),
    ];
    for (request, status, mention) in cases {
        let response = raw_exchange(server.addr, request.as_bytes()).await;
        let (got, text) = status_of(&response);
        assert_eq!(got, status, "{request:?} -> {text}");
        assert!(text.contains(mention), "{text} should mention {mention}");
        assert!(text.contains("Connection: close"));
    }
    // A request cut short by the client gets 400 too.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&valid.as_bytes()[..40]).await.unwrap();
    stream.shutdown().await.unwrap();
    let (got, _) = status_of(&read_to_close(&mut stream).await);
    assert_eq!(got, "400");
    // None of that reached the handler.
    assert!(server.recorder.seen.lock().unwrap().is_empty());
}

async fn upgrade_hook_can_reject_and_pick_a_subprotocol(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let response = raw_exchange(server.addr, upgrade_request("/reject", "").as_bytes()).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nnot here\n"), "{text}");

    let response = raw_exchange(server.addr, upgrade_request("/panic", "").as_bytes()).await;
    assert!(String::from_utf8_lossy(&response).starts_with("HTTP/1.1 500 "));
    let response = raw_exchange(
        server.addr,
        upgrade_request("/bad-protocol", "Sec-WebSocket-Protocol: chat\r\n").as_bytes(),
    )
    .await;
    assert!(String::from_utf8_lossy(&response).starts_with("HTTP/1.1 500 "));

    use tungstenite::client::IntoClientRequest;
    let mut request = server.url("/").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "superchat, chat".parse().unwrap());
    let (mut client, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.headers()["Sec-WebSocket-Protocol"], "chat");
    send_text(&mut client, "with protocol").await;
    assert_eq!(next(&mut client).await, Ws::text("with protocol"));
}

async fn frames_sent_with_the_request_are_not_lost(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut bytes = upgrade_request("/", "").into_bytes();
    bytes.extend(client_frame(true, 0x1, b"early"));
    bytes.extend(client_frame(true, 0x8, &1000u16.to_be_bytes()));
    let response = raw_exchange(server.addr, &bytes).await;
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(response.starts_with(b"HTTP/1.1 101 "));
    let frames = server_frames(&response[head_end..]);
    assert_eq!(frames[0], (0x1, b"early".to_vec()));
    assert_eq!(frames[1], (0x8, 1000u16.to_be_bytes().to_vec()));
}

async fn invalid_utf8_gets_1007(backend: Backend) {
    let server = start(backend, Config::default()).await;
    // In one frame, split across fragments, and in a close reason.
    let cases: Vec<Vec<u8>> = vec![
        client_frame(true, 0x1, b"bad \xF4\x90\x80\x80 text"),
        [
            client_frame(false, 0x1, b"ok\xE2"),
            client_frame(true, 0x0, b"\x28\xA1"),
        ]
        .concat(),
        client_frame(true, 0x8, b"\x03\xE8\xCE\xBA\xE1\xBD"),
    ];
    for frames in cases {
        let mut stream = raw_upgraded(server.addr).await;
        stream.write_all(&frames).await.unwrap();
        assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1007);
    }
    let closes = server.recorder.wait_closes(3).await;
    assert!(closes.iter().all(|(code, _)| *code == 1007), "{closes:?}");
}

async fn protocol_errors_get_1002(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let unmasked = vec![0x81, 0x02, b'h', b'i'];
    let cases: Vec<Vec<u8>> = vec![
        unmasked,
        client_frame(true, 0x3, b""),         // reserved opcode
        client_frame(true, 0x0, b"x"),        // continuation without start
        client_frame(false, 0x9, b""),        // fragmented ping
        client_frame(true, 0x9, &[0u8; 126]), // ping too long
        client_frame(true, 0x8, &[0x03]),     // one-byte close
        client_frame(true, 0x8, &1005u16.to_be_bytes()), // close code never sent
        [
            client_frame(false, 0x2, b"a"),
            client_frame(true, 0x2, b"b"),
        ]
        .concat(),
        {
            let mut f = client_frame(true, 0x2, b"rsv");
            f[0] |= 0x40; // RSV1 without an extension
            f
        },
    ];
    for frames in cases {
        let mut stream = raw_upgraded(server.addr).await;
        stream.write_all(&frames).await.unwrap();
        assert_eq!(
            close_code_of(&read_to_close(&mut stream).await),
            1002,
            "{frames:x?}"
        );
    }
}

async fn oversized_messages_get_1009_before_the_payload(backend: Backend) {
    let config = Config::default()
        .max_frame_size(1000)
        .max_message_size(1500);
    let server = start(backend, config).await;
    // Only the header of a 1 GiB frame is sent: the answer cannot wait for it.
    let mut stream = raw_upgraded(server.addr).await;
    let mut header = vec![0x82, 0x80 | 127];
    header.extend_from_slice(&(1u64 << 30).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    stream.write_all(&header).await.unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1009);
    // Fragments that add up past the message limit.
    let mut stream = raw_upgraded(server.addr).await;
    let frames = [
        client_frame(false, 0x2, &[0u8; 900]),
        client_frame(true, 0x0, &[0u8; 700]),
    ]
    .concat();
    stream.write_all(&frames).await.unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1009);
    // With tungstenite, too.
    let mut client = server.client().await;
    client.send(Ws::binary(vec![0u8; 1001])).await.unwrap();
    assert_eq!(expect_close(&mut client).await.0, 1009);
}

async fn the_upgrade_hook_sets_a_connections_own_limits(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let url = server.url("/small-messages");
    let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    client.send(Ws::binary(vec![5u8; 100])).await.unwrap();
    assert_eq!(next(&mut client).await, Ws::binary(vec![5u8; 100]));
    client.send(Ws::binary(vec![5u8; 101])).await.unwrap();
    assert_eq!(expect_close(&mut client).await.0, 1009);
    // Other connections keep the server's limits.
    let mut client = server.client().await;
    client.send(Ws::binary(vec![6u8; 4096])).await.unwrap();
    assert_eq!(next(&mut client).await, Ws::binary(vec![6u8; 4096]));
}

async fn handler_panic_closes_only_that_connection_with_1011(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut bystander = server.client().await;
    let mut victim = server.client().await;
    send_text(&mut victim, "panic").await;
    assert_eq!(expect_close(&mut victim).await.0, 1011);
    send_text(&mut bystander, "unaffected").await;
    assert_eq!(next(&mut bystander).await, Ws::text("unaffected"));
    let mut late = server.client().await;
    send_text(&mut late, "new connections too").await;
    assert_eq!(next(&mut late).await, Ws::text("new connections too"));
    assert_eq!(server.recorder.wait_closes(1).await[0].0, 1011);
}

async fn sends_from_another_task_arrive_in_order(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    send_text(&mut client, "spawn 500").await;
    for i in 0..500 {
        assert_eq!(next(&mut client).await, Ws::text(format!("from task {i}")));
    }
}

async fn many_connections_at_once(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut tasks = Vec::new();
    for c in 0..1000 {
        let url = server.url("/");
        tasks.push(tokio::spawn(async move {
            let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            for m in 0..5 {
                let text = format!("client {c} message {m}");
                client.send(Ws::text(text.clone())).await.unwrap();
                assert_eq!(next(&mut client).await, Ws::text(text));
            }
            client
        }));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.unwrap());
    }
    assert_eq!(server.handle.connections(), 1000);
    for mut client in clients {
        client.close(None).await.unwrap();
    }
    server.recorder.wait_closes(1000).await;
}

/// Sends from one connection's callback wake idle connections, whichever
/// task or group serves them.
async fn a_callback_reaches_every_idle_connection(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut clients = Vec::new();
    for _ in 0..50 {
        clients.push(server.client().await);
    }
    send_text(&mut clients[17], "broadcast hello").await;
    for client in &mut clients {
        assert_eq!(next(client).await, Ws::text("hello"));
    }
    for (i, client) in clients.iter_mut().enumerate() {
        send_text(client, &format!("still here {i}")).await;
        assert_eq!(next(client).await, Ws::text(format!("still here {i}")));
    }
}

async fn a_full_outbound_queue_refuses_sends_then_drains(backend: Backend) {
    let server = start(backend, Config::default().max_outbound_bytes(64 * 1024)).await;
    let mut client = server.client().await;
    // 100 messages of 4 KiB from one callback: the queue fills before any write.
    send_text(&mut client, "flood 100 4096").await;
    let mut received = 0;
    while received < 16 {
        match next(&mut client).await {
            Ws::Binary(b) => {
                assert_eq!(b.len(), 4096);
                received += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let seen = server.recorder.seen.lock().unwrap().clone();
    // Frames of 4100 bytes: the 16th takes the queue past 64 KiB, so 84 are refused.
    assert!(
        seen.iter()
            .any(|s| matches!(s, Seen::Message(_, t) if t == "refused 84")),
        "{seen:?}"
    );
    let drained = || server.recorder.saw(|s| matches!(s, Seen::Drain(_)));
    assert!(
        eventually(Duration::from_secs(2), drained).await,
        "on_drain was not called"
    );
}

async fn abrupt_disconnect_is_reported_as_1006(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let stream = raw_upgraded(server.addr).await;
    drop(stream);
    assert_eq!(server.recorder.wait_closes(1).await[0].0, 1006);
}

async fn closing_a_peer_that_does_not_read_is_bounded(backend: Backend) {
    let config = Config::default()
        .max_outbound_bytes(64 << 20)
        .close_timeout(Duration::from_millis(300));
    let server = start(backend, config).await;
    let mut stream = raw_upgraded(server.addr).await;
    // 32 MiB of echoes and then a close, to a client that never reads: the
    // writes block, and the close must still end the connection in time.
    stream
        .write_all(&client_frame(true, 0x1, b"flood-and-close 512 65536"))
        .await
        .unwrap();
    let closes = server.recorder.wait_closes(1).await;
    assert_eq!(closes[0].0, 1006, "{closes:?}");
    drop(stream);
}

async fn graceful_shutdown_sends_1001_to_everyone(backend: Backend) {
    let mut server = start(
        backend,
        Config::default().shutdown_timeout(Duration::from_secs(5)),
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(server.client().await);
    }
    // One more is still in the middle of its handshake.
    let mut halfway = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    halfway
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.handle.shutdown();
    let response = read_to_close(&mut halfway).await;
    assert!(
        response.starts_with(b"HTTP/1.1 503 "),
        "{}",
        String::from_utf8_lossy(&response)
    );
    drop(halfway);
    for client in &mut clients {
        assert_eq!(expect_close(client).await.0, 1001);
    }
    // The clients answer the close (tungstenite does so automatically on read).
    for mut client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(2), client.next()).await;
    }
    let served = tokio::time::timeout(Duration::from_secs(10), &mut server.served).await;
    served.expect("serve returns").unwrap().unwrap();
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "no longer listening"
    );
    assert_eq!(server.handle.alive(), 0);
}

/// A peer that never answers the 1001 is dropped once the shutdown timeout
/// has passed (the close timeout is longer, so only the abort can end it).
async fn shutdown_drops_peers_that_do_not_answer_after_its_timeout(backend: Backend) {
    let config = Config::default()
        .shutdown_timeout(Duration::from_millis(300))
        .close_timeout(Duration::from_secs(60));
    let mut server = start(backend, config).await;
    // Raw sockets that upgrade and then never read or answer anything.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(raw_upgraded(server.addr).await);
    }
    assert_eq!(server.handle.connections(), 3);
    // Another task waits for the end through a handle of its own, as on
    // every server; it waits for the shutdown to be asked for first.
    let waiter = {
        let handle = server.handle.clone();
        tokio::spawn(async move {
            handle.ended().await;
            handle.alive()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "ended before any shutdown");
    let started = std::time::Instant::now();
    server.handle.shutdown();
    let served = tokio::time::timeout(Duration::from_secs(10), &mut server.served).await;
    served.expect("serve returns").unwrap().unwrap();
    let left = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    assert_eq!(left.expect("ended resolves").unwrap(), 0);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "returned after {took:?}"
    );
    assert_eq!(server.handle.alive(), 0);
    assert_eq!(server.handle.connections(), 0);
    let closes = server.recorder.closes();
    assert_eq!(closes.len(), 3, "{closes:?}");
    for (code, reason) in closes {
        assert_eq!(code, 1006);
        assert!(reason.contains("aborted"), "{reason}");
    }
    drop(silent);
}

#[tokio::test(flavor = "current_thread")]
async fn runs_on_a_current_thread_runtime() {
    let server = start(Backend::Tokio, Config::default()).await;
    let mut client = server.client().await;
    send_text(&mut client, "single threaded").await;
    assert_eq!(next(&mut client).await, Ws::text("single threaded"));
}

/// The handler's `State` is dropped outside any callback; a panic there must
/// not take down the connections served beside it.
async fn a_panic_dropping_state_costs_only_that_connection(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut bystander = server.client().await;
    for _ in 0..4 {
        let url = server.url("/panic-on-drop");
        let (mut doomed, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        send_text(&mut doomed, "before").await;
        assert_eq!(next(&mut doomed).await, Ws::text("before"));
        doomed.close(None).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), doomed.next()).await;
    }
    send_text(&mut bystander, "still served").await;
    assert_eq!(next(&mut bystander).await, Ws::text("still served"));
    for i in 0..4 {
        let connect = tokio::time::timeout(Duration::from_secs(10), server.client());
        let mut client = connect.await.expect("new connections are answered");
        send_text(&mut client, &format!("new {i}")).await;
        assert_eq!(next(&mut client).await, Ws::text(format!("new {i}")));
    }
}

/// `Duration::MAX` means "never time out"; a refused handshake must still be
/// answered (its close deadline is computed from it).
async fn refusals_work_with_an_unlimited_close_timeout(backend: Backend) {
    let config = Config::default().close_timeout(Duration::MAX);
    let server = start(backend, config).await;
    let response = raw_exchange(server.addr, b"garbage\r\n\r\n").await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    let mut client = server.client().await;
    send_text(&mut client, "served").await;
    assert_eq!(next(&mut client).await, Ws::text("served"));
}

/// Many clients at once, each opening a few connections in turn, sending
/// messages of random sizes (empty to 1 MiB, several in flight) and checking
/// every echo byte for byte, then leaving politely or abruptly (sometimes with
/// a large message still in flight). A buffer handed back or reused too early
/// shows up as a corrupted echo, here or on another connection.
async fn random_traffic_from_clients_that_come_and_go(backend: Backend) {
    use rand::{RngExt, SeedableRng};

    let server = start(backend, Config::default()).await;
    let url = server.url("/");
    let mut clients = tokio::task::JoinSet::new();
    for seed in 0..48u64 {
        let url = url.clone();
        clients.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            for _ in 0..3 {
                let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
                let mut sent = std::collections::VecDeque::new();
                for _ in 0..rng.random_range(1..12) {
                    let size = match rng.random_range(0..10) {
                        0..5 => rng.random_range(0..200),
                        5..9 => rng.random_range(200..40_000),
                        _ => rng.random_range(40_000..(1 << 20)),
                    };
                    let mut payload = vec![0u8; size];
                    rng.fill(&mut payload[..]);
                    let message = Ws::binary(payload);
                    client.send(message.clone()).await.unwrap();
                    sent.push_back(message);
                    // Up to four in flight before reading.
                    while sent.len() > rng.random_range(0..4) {
                        let echo = next(&mut client).await;
                        assert!(
                            echo == sent.pop_front().unwrap(),
                            "echo corrupted (seed {seed})"
                        );
                    }
                }
                while let Some(expected) = sent.pop_front() {
                    assert!(
                        next(&mut client).await == expected,
                        "echo corrupted (seed {seed})"
                    );
                }
                match rng.random_range(0..3) {
                    0 => {
                        client.close(None).await.unwrap();
                        while let Some(Ok(_)) = client.next().await {}
                    }
                    1 => drop(client),
                    _ => {
                        let last = Ws::binary(vec![seed as u8; 300_000]);
                        client.send(last).await.unwrap();
                        drop(client);
                    }
                }
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.expect("a client failed");
    }
    // Every connection ends, and the server serves on.
    eventually(Duration::from_secs(5), || server.handle.connections() == 0).await;
    assert_eq!(server.handle.connections(), 0);
    let mut client = server.client().await;
    send_text(&mut client, "still here").await;
    assert_eq!(next(&mut client).await, Ws::text("still here"));
}

/// The largest message the default limit allows, in one frame and in many
/// fragments.
async fn echoes_a_16_mib_message(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let mut client = server.client().await;
    let payload: Vec<u8> = (0..16usize << 20).map(|i| (i * 31 % 251) as u8).collect();
    client.send(Ws::binary(payload.clone())).await.unwrap();
    assert!(next(&mut client).await == Ws::binary(payload.clone()));
    let pieces: Vec<&[u8]> = payload.chunks(1 << 20).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let (first, last) = (i == 0, i == pieces.len() - 1);
        let opcode = if first {
            OpCode::Data(Data::Binary)
        } else {
            OpCode::Data(Data::Continue)
        };
        let frame = Frame::message(piece.to_vec(), opcode, last);
        client.send(Ws::Frame(frame)).await.unwrap();
    }
    assert!(next(&mut client).await == Ws::binary(payload));
}

/// `data` as a client sends it with permessage-deflate: raw deflate, sync
/// flush, the `00 00 ff ff` tail cut off.
fn deflate_raw(data: &[u8]) -> Vec<u8> {
    let mut stream = zlib_rs::Deflate::new(6, false, 15);
    let mut out = vec![0u8; data.len() / 2 + 1024];
    stream
        .compress(data, &mut out, zlib_rs::DeflateFlush::SyncFlush)
        .unwrap();
    assert_eq!(stream.total_in() as usize, data.len());
    out.truncate(stream.total_out() as usize);
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

async fn hostile_compressed_input_is_closed_and_others_are_served(backend: Backend) {
    let config = Config::default()
        .max_message_size(64 * 1024)
        .permessage_deflate(rapidws::DeflateConfig::default());
    let server = start(backend, config).await;
    let mut bystander = server.client().await;
    let offer = "Sec-WebSocket-Extensions: permessage-deflate\r\n";
    const RSV1: u8 = 0x40;

    // A compressed message is inflated and echoed compressed.
    let (mut stream, head) = raw_upgraded_with(server.addr, offer).await;
    assert!(
        head.contains("\r\nSec-WebSocket-Extensions: permessage-deflate"),
        "{head}"
    );
    let text = "squeeze ".repeat(100);
    stream
        .write_all(&client_frame(
            true,
            RSV1 | 0x1,
            &deflate_raw(text.as_bytes()),
        ))
        .await
        .unwrap();
    let mut first = [0u8; 2];
    tokio::io::AsyncReadExt::read_exact(&mut stream, &mut first)
        .await
        .unwrap();
    assert_eq!(first[0], 0x80 | RSV1 | 0x1, "FIN, RSV1, text");

    // A megabyte of zeros in about a kilobyte: stopped at the 64 KiB limit.
    let bomb = deflate_raw(&vec![0u8; 1 << 20]);
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let (mut stream, _) = raw_upgraded_with(server.addr, offer).await;
    stream
        .write_all(&client_frame(true, RSV1 | 0x2, &bomb))
        .await
        .unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1009);

    // Not deflate data.
    let (mut stream, _) = raw_upgraded_with(server.addr, offer).await;
    stream
        .write_all(&client_frame(true, RSV1 | 0x2, &[0xff, 0xff, 0xff]))
        .await
        .unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1007);

    // RSV1 on a ping, and RSV1 where deflate was not negotiated.
    let (mut stream, _) = raw_upgraded_with(server.addr, offer).await;
    stream
        .write_all(&client_frame(true, RSV1 | 0x9, b""))
        .await
        .unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1002);
    let mut stream = raw_upgraded(server.addr).await;
    stream
        .write_all(&client_frame(true, RSV1 | 0x1, &deflate_raw(b"hello")))
        .await
        .unwrap();
    assert_eq!(close_code_of(&read_to_close(&mut stream).await), 1002);

    send_text(&mut bystander, "still here").await;
    assert_eq!(next(&mut bystander).await, Ws::text("still here"));
}

async fn slowloris_handshakes_get_408_at_the_timeout(backend: Backend) {
    let timeout = Duration::from_millis(800);
    let server = start(backend, Config::default().handshake_timeout(timeout)).await;
    // Three clients dribble a valid request, one byte every 50 ms: it would
    // take them about 8 s to finish.
    let request = upgrade_request("/", "");
    let mut dribblers = Vec::new();
    for _ in 0..3 {
        let addr = server.addr;
        let request = request.clone().into_bytes();
        dribblers.push(tokio::spawn(async move {
            // Before the connect: the server's clock starts after it.
            let started = std::time::Instant::now();
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut read, mut write) = stream.into_split();
            let dribble = async move {
                for byte in request {
                    if write.write_all(&[byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            let mut response = Vec::new();
            tokio::select! {
                _ = dribble => panic!("the whole request went through"),
                _ = tokio::io::AsyncReadExt::read_to_end(&mut read, &mut response) => {}
            }
            (
                started.elapsed(),
                String::from_utf8_lossy(&response).into_owned(),
            )
        }));
    }
    // Meanwhile, others are served.
    let mut client = server.client().await;
    send_text(&mut client, "served").await;
    assert_eq!(next(&mut client).await, Ws::text("served"));
    for dribbler in dribblers {
        let (took, response) = dribbler.await.unwrap();
        assert!(response.starts_with("HTTP/1.1 408 "), "{response}");
        assert!(
            took >= timeout && took < timeout * 4,
            "cut off after {took:?}"
        );
    }
    send_text(&mut client, "still served").await;
    assert_eq!(next(&mut client).await, Ws::text("still served"));
}

async fn quiet_peers_are_pinged_and_dead_ones_closed(backend: Backend) {
    let idle = Duration::from_millis(1200);
    let close_timeout = Duration::from_millis(300);
    let config = Config::default()
        .ping_interval(Duration::from_millis(300))
        .idle_timeout(idle)
        .close_timeout(close_timeout);
    let server = start(backend, config).await;
    // A live client sends nothing, but its library answers every ping: it
    // outlives the idle timeout several times over.
    let mut live = server.client().await;
    // A dead one: upgraded, then never reads or answers anything.
    let dead_since = std::time::Instant::now();
    let mut dead = raw_upgraded(server.addr).await;
    let started = std::time::Instant::now();
    let mut pings = 0;
    while started.elapsed() < idle * 3 {
        match tokio::time::timeout(Duration::from_millis(100), live.next()).await {
            Ok(Some(Ok(Ws::Ping(payload)))) => {
                assert!(payload.is_empty());
                pings += 1;
            }
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => {}
        }
    }
    assert!(pings >= 6, "{pings} pings in {:?}", idle * 3);
    send_text(&mut live, "still here").await;
    assert_eq!(next(&mut live).await, Ws::text("still here"));
    // The dead one got pings, then a close frame, and then TCP ended (its
    // close was never answered).
    let frames = server_frames(&read_to_close(&mut dead).await);
    // Never early: the close came after the whole idle timeout, and TCP
    // ended after the close timeout on top.
    assert!(dead_since.elapsed() >= idle + close_timeout);
    let (last, pings_before) = frames.split_last().unwrap();
    assert_eq!(last.0, 0x8);
    assert_eq!(u16::from_be_bytes([last.1[0], last.1[1]]), 1001);
    assert_eq!(&last.1[2..], b"idle timeout");
    assert!(!pings_before.is_empty() && pings_before.iter().all(|f| f.0 == 0x9));
    let closes = server.recorder.wait_closes(1).await;
    assert_eq!(closes[0].0, 1006, "{closes:?}");
}

async fn a_connection_limit_answers_503_above_it(backend: Backend) {
    let server = start(backend, Config::default().max_connections(3)).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(server.client().await);
    }
    // Half-open sockets and handshakes in progress do not count.
    let idle = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let response = raw_exchange(server.addr, upgrade_request("/", "").as_bytes()).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
    assert!(text.contains("connection limit"), "{text}");
    // The connections inside are served meanwhile.
    send_text(&mut clients[0], "inside").await;
    assert_eq!(next(&mut clients[0]).await, Ws::text("inside"));
    // A place freed is a place taken (once the server has let it go: the
    // count drops when the connection ends, a little after on_close).
    let mut leaving = clients.pop().unwrap();
    leaving.close(None).await.unwrap();
    while leaving.next().await.is_some() {}
    eventually(Duration::from_secs(5), || server.handle.connections() < 3).await;
    assert_eq!(server.handle.connections(), 2);
    let mut newcomer = server.client().await;
    send_text(&mut newcomer, "in").await;
    assert_eq!(next(&mut newcomer).await, Ws::text("in"));
    drop(idle);
}

async fn the_close_policy_closes_a_slow_consumer_with_its_code(backend: Backend) {
    let config = Config::default()
        .max_outbound_bytes(256 * 1024)
        .slow_consumer(SlowConsumer::Close(CloseCode::TRY_AGAIN_LATER));
    let server = start(backend, config).await;
    let mut bystander = server.client().await;
    let mut client = server.client().await;
    // 100 messages of 64 KiB from one callback: the fifth finds the queue full.
    send_text(&mut client, "flood 100 65536").await;
    let mut received = 0;
    let code = loop {
        match next(&mut client).await {
            Ws::Binary(b) => {
                assert_eq!(b.len(), 65536);
                received += 1;
            }
            Ws::Close(Some(frame)) => break u16::from(frame.code),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!((received, code), (4, 1013));
    // tungstenite sends its reply as the stream is driven to its end.
    while client.next().await.is_some() {}
    assert_eq!(server.recorder.wait_closes(1).await[0].0, 1013);
    send_text(&mut bystander, "unaffected").await;
    assert_eq!(next(&mut bystander).await, Ws::text("unaffected"));
}

/// A stream that keeps what is written until it is flushed, and answers the
/// first flush of each batch with `Pending` (waking itself), as an h2
/// stream does while its connection's task has not sent the bytes yet.
struct SlowFlush {
    inner: tokio::io::DuplexStream,
    unflushed: Vec<u8>,
    deferred: bool,
}

impl tokio::io::AsyncRead for SlowFlush {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SlowFlush {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.unflushed.extend_from_slice(bytes);
        self.deferred = false;
        std::task::Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        if !self.unflushed.is_empty() && !self.deferred {
            self.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        while !self.unflushed.is_empty() {
            let this = &mut *self;
            match std::pin::Pin::new(&mut this.inner).poll_write(cx, &this.unflushed) {
                Poll::Ready(Ok(n)) => {
                    this.unflushed.drain(..n);
                }
                other => return other.map(|r| r.map(|_| ())),
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The stream driver ends a connection only once its last bytes (here the
/// close frame answering the peer's) have left the stream, or a bounded
/// while has passed: a stream whose flush takes more than one poll (an h2
/// stream) must not lose the close frame.
#[tokio::test]
async fn the_stream_driver_flushes_the_close_frame_before_dropping_the_stream() {
    use tokio::io::AsyncReadExt;
    let server = rapidws::stream::Server::new(Echo { page: None }, Config::default());
    let (ours, mut theirs) = tokio::io::duplex(1 << 16);
    let stream = SlowFlush {
        inner: ours,
        unflushed: Vec::new(),
        deferred: false,
    };
    let peer = "127.0.0.1:1".parse().unwrap();
    let served = tokio::spawn(server.serve(stream, peer, &[]));
    let mut request = upgrade_request("/", "").into_bytes();
    request.extend(client_frame(true, 0x1, b"hi"));
    request.extend(client_frame(true, 0x8, &1000u16.to_be_bytes()));
    theirs.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), theirs.read_to_end(&mut response))
        .await
        .expect("the stream ends")
        .unwrap();
    served.await.unwrap();
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(response.starts_with(b"HTTP/1.1 101 "));
    let frames = server_frames(&response[head_end..]);
    assert_eq!(frames[0], (0x1, b"hi".to_vec()), "the echo");
    assert_eq!(
        frames.get(1),
        Some(&(0x8, 1000u16.to_be_bytes().to_vec())),
        "the close frame went out before the stream was dropped"
    );
}
