//! A hostile HTTP/3 peer: a raw quinn client writing HTTP/3 bytes by hand
//! (no HTTP/3 library on its side) against `rapidws::h3::serve`. Each
//! violation gets the error code RFC 9114 or RFC 9204 gives it, on the
//! connection or the stream, and nothing else is held up.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use rapidws::h3::quinn;
use rapidws::rapidws_core::h3::frame::{self, kind};
use rapidws::rapidws_core::h3::{put_headers, varint};
use rapidws::{Config, stream::Server};

/// An echo server over HTTP/3 on a free loopback port (dropped with the
/// runtime).
fn start_server() -> SocketAddr {
    let server = Server::new(common::Echo { page: None }, Config::default());
    let (endpoint, addr) = common::tls::h3_endpoint();
    tokio::spawn(async move { rapidws::h3::serve(endpoint, &server).await });
    addr
}

/// A QUIC connection speaking `h3`, and nothing of HTTP/3 yet.
async fn dial(addr: SocketAddr) -> quinn::Connection {
    let endpoint = common::tls::h3_client_endpoint("127.0.0.1:0".parse().unwrap());
    endpoint.connect(addr, "localhost").unwrap().await.unwrap()
}

/// The code the server closed the connection with (within 10 s).
async fn closed_with(conn: &quinn::Connection) -> u64 {
    let error = tokio::time::timeout(Duration::from_secs(10), conn.closed())
        .await
        .expect("the server closes the connection within 10 s");
    match error {
        quinn::ConnectionError::ApplicationClosed(close) => close.error_code.into_inner(),
        other => panic!("closed otherwise: {other}"),
    }
}

fn frame_bytes(kind: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_head(&mut out, kind, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

fn extended_connect() -> Vec<u8> {
    let mut out = Vec::new();
    let fields: [(&[u8], &[u8]); 6] = [
        (b":method", b"CONNECT"),
        (b":protocol", b"websocket"),
        (b":scheme", b"https"),
        (b":path", b"/"),
        (b":authority", b"localhost"),
        (b"sec-websocket-version", b"13"),
    ];
    put_headers(fields, &mut out);
    out
}

/// Our control stream with empty SETTINGS.
async fn open_control(conn: &quinn::Connection) -> quinn::SendStream {
    let mut control = conn.open_uni().await.unwrap();
    let mut opening = vec![0x00];
    opening.extend(frame_bytes(kind::SETTINGS, &[]));
    control.write_all(&opening).await.unwrap();
    control
}

/// The status of the response on `recv` (its first HEADERS frame).
async fn status_of(recv: &mut quinn::RecvStream) -> String {
    response_of(recv).await.0
}

/// The status of the response on `recv`, and the bytes read after its
/// HEADERS frame.
async fn response_of(recv: &mut quinn::RecvStream) -> (String, Vec<u8>) {
    let mut bytes = Vec::new();
    loop {
        let mut chunk = [0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(10), recv.read(&mut chunk))
            .await
            .expect("a response within 10 s");
        match read.unwrap() {
            Some(n) => bytes.extend_from_slice(&chunk[..n]),
            None => break,
        }
        if let Some(head) = frame::FrameHead::decode(&bytes)
            && bytes.len() >= head.len + head.length as usize
        {
            break;
        }
    }
    let head = frame::FrameHead::decode(&bytes).expect("a frame");
    assert_eq!(head.kind, kind::HEADERS);
    let end = head.len + head.length as usize;
    let section =
        rapidws::rapidws_core::h3::qpack::decode(&bytes[head.len..end], 16 * 1024).unwrap();
    let (name, value) = section.iter().next().unwrap();
    assert_eq!(name, b":status");
    let status = String::from_utf8(value.to_vec()).unwrap();
    (status, bytes[end..].to_vec())
}

#[tokio::test]
async fn data_before_the_request_head_closes_the_connection_with_frame_unexpected() {
    let addr = start_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(&frame_bytes(kind::DATA, b"hello"))
        .await
        .unwrap();
    assert_eq!(closed_with(&conn).await, 0x105);
}

#[tokio::test]
async fn a_dynamic_table_reference_closes_the_connection_with_qpack_decompression_failed() {
    let addr = start_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    // Required Insert Count 1: a dynamic table we said we do not have.
    send.write_all(&frame_bytes(kind::HEADERS, &[0x01, 0x00, 0x80]))
        .await
        .unwrap();
    assert_eq!(closed_with(&conn).await, 0x200);
}

#[tokio::test]
async fn a_silent_unidirectional_stream_holds_up_nothing() {
    let addr = start_server();
    let conn = dial(addr).await;
    // A stream that never finishes saying its type (the first byte of a
    // two-byte varint), then the control stream with two SETTINGS: the
    // second is seen, so the control stream was read meanwhile.
    let mut silent = conn.open_uni().await.unwrap();
    silent.write_all(&[0x40]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut control = open_control(&conn).await;
    control
        .write_all(&frame_bytes(kind::SETTINGS, &[]))
        .await
        .unwrap();
    assert_eq!(closed_with(&conn).await, 0x105);
}

#[tokio::test]
async fn unknown_frames_before_the_head_are_skipped_and_the_websocket_opens() {
    let addr = start_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // A reserved (grease) frame type, 0x1f * 2 + 0x21, with a payload.
    let mut request = frame_bytes(0x1f * 2 + 0x21, &[7; 300]);
    request.extend(extended_connect());
    send.write_all(&request).await.unwrap();
    assert_eq!(status_of(&mut recv).await, "200");
}

#[tokio::test]
async fn a_head_past_the_limit_gets_431_and_the_connection_goes_on() {
    let addr = start_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // A HEADERS frame declaring 1 MiB: refused from its head, not read.
    let mut head = Vec::new();
    frame::put_head(&mut head, kind::HEADERS, 1 << 20);
    send.write_all(&head).await.unwrap();
    assert_eq!(status_of(&mut recv).await, "431");
    // Another request on the same connection is served.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&extended_connect()).await.unwrap();
    assert_eq!(status_of(&mut recv).await, "200");
}

#[tokio::test]
async fn a_second_control_stream_and_a_client_push_close_the_connection() {
    for second in [0x00u64, 0x01] {
        let addr = start_server();
        let conn = dial(addr).await;
        let _control = open_control(&conn).await;
        let mut another = conn.open_uni().await.unwrap();
        let mut bytes = Vec::new();
        varint::encode(second, &mut bytes);
        bytes.extend(frame_bytes(kind::SETTINGS, &[]));
        another.write_all(&bytes).await.unwrap();
        // H3_STREAM_CREATION_ERROR.
        assert_eq!(closed_with(&conn).await, 0x103, "stream type {second}");
    }
}

#[tokio::test]
async fn settings_the_server_sends_enable_extended_connect() {
    let addr = start_server();
    let conn = dial(addr).await;
    let mut recv = conn.accept_uni().await.unwrap();
    let mut bytes = vec![0u8; 1];
    recv.read_exact(&mut bytes).await.unwrap();
    assert_eq!(bytes, [0x00], "the control stream's type");
    let mut head = [0u8; 2];
    recv.read_exact(&mut head).await.unwrap();
    let frame = frame::FrameHead::decode(&head).unwrap();
    assert_eq!(frame.kind, kind::SETTINGS);
    let mut payload = vec![0u8; frame.length as usize];
    recv.read_exact(&mut payload).await.unwrap();
    let settings = rapidws::rapidws_core::h3::Settings::decode(&payload).unwrap();
    assert!(settings.enable_connect_protocol);
    assert_eq!(settings.qpack_max_table_capacity, 0);
    assert_eq!(settings.max_field_section_size, Some(8 * 1024));
}

#[tokio::test]
async fn a_frame_after_the_trailers_closes_the_connection() {
    let addr = start_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&extended_connect()).await.unwrap();
    assert_eq!(status_of(&mut recv).await, "200");
    // Trailers (an empty field section), then DATA after them.
    let mut bytes = frame_bytes(kind::HEADERS, &[0, 0]);
    bytes.extend(frame_bytes(kind::DATA, b"late"));
    send.write_all(&bytes).await.unwrap();
    assert_eq!(closed_with(&conn).await, 0x105);
}

/// A WebTransport handler scripted by the session's path: `/close7` closes
/// with 7 and returns at once, `/panic` panics, `/panic-hook` panics in
/// `on_request`; any other path holds the session, taking no stream, until
/// it ends.
struct Scripted;

impl rapidws::h3::WebTransport for Scripted {
    fn on_request(&self, request: &rapidws::h3::RequestHead) -> Result<(), rapidws::Reject> {
        assert_ne!(request.path(), Some("/panic-hook"), "a hook that panics");
        Ok(())
    }

    async fn serve(&self, session: rapidws::h3::WebTransportSession) {
        match session.path() {
            "/close7" => session.close(7, "seven"),
            "/panic" => panic!("a handler that panics"),
            _ => {
                session.closed().await;
            }
        }
    }
}

/// [`start_server`] with WebTransport sessions served by [`Scripted`]
/// (a session's credit: the default, 100 streams each way), and room for
/// 20 requests at once before a session.
fn start_webtransport_server() -> SocketAddr {
    let server = Server::new(common::Echo { page: None }, Config::default());
    let quic = rapidws::h3::QuicConfig {
        max_streams: 20,
        ..rapidws::h3::QuicConfig::default()
    };
    let (endpoint, addr) = common::tls::h3_endpoint_with(&quic);
    tokio::spawn(async move { rapidws::h3::serve_with(endpoint, &server, Scripted).await });
    addr
}

/// Asks for a session at `path`: its stream, id, the response's status,
/// and the bytes that came after the response's head.
async fn ask_session(
    conn: &quinn::Connection,
    path: &str,
) -> (quinn::SendStream, quinn::RecvStream, u64, String, Vec<u8>) {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut request = Vec::new();
    let fields: [(&[u8], &[u8]); 5] = [
        (b":method", b"CONNECT"),
        (b":protocol", b"webtransport"),
        (b":scheme", b"https"),
        (b":path", path.as_bytes()),
        (b":authority", b"localhost"),
    ];
    put_headers(fields, &mut request);
    send.write_all(&request).await.unwrap();
    let (status, rest) = response_of(&mut recv).await;
    let id = u64::from(send.id());
    (send, recv, id, status, rest)
}

/// Opens a session at `/wt` (its 200 read; retried while the one before is
/// still closing: 429); returns its stream and id.
async fn open_session(conn: &quinn::Connection) -> (quinn::SendStream, quinn::RecvStream, u64) {
    let started = std::time::Instant::now();
    loop {
        let (send, recv, id, status, _) = ask_session(conn, "/wt").await;
        if status == "200" {
            return (send, recv, id);
        }
        assert_eq!(status, "429");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still 429 after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How a stream's reading side ended (within 10 s): `None` for its end,
/// `Some(code)` for a reset; with the bytes read before.
async fn ending(recv: &mut quinn::RecvStream) -> (Option<u64>, Vec<u8>) {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), recv.read(&mut chunk))
            .await
            .expect("the stream ends within 10 s");
        match read {
            Ok(Some(n)) => bytes.extend_from_slice(&chunk[..n]),
            Ok(None) => return (None, bytes),
            Err(quinn::ReadError::Reset(code)) => return (Some(code.into_inner()), bytes),
            Err(other) => panic!("{other}"),
        }
    }
}

async fn reset_code(recv: &mut quinn::RecvStream) -> Option<u64> {
    ending(recv).await.0
}

/// A session queues as many streams as its peer may open at once (its
/// credit, `WebTransport::max_streams`: 100 here, past QuicConfig's 20), so
/// streams the handler never takes are all kept, none refused; the next
/// waits for credit, which comes only as streams end: QUIC bounds them.
#[tokio::test]
async fn webtransport_streams_the_handler_does_not_take_wait_within_the_credit() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (_send, _recv, id) = open_session(&conn).await;
    let mut reads = tokio::task::JoinSet::new();
    let mut sends = Vec::new();
    // The session's own stream is one of the 100.
    for _ in 0..99 {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let mut prefix = Vec::new();
        varint::encode(0x41, &mut prefix);
        varint::encode(id, &mut prefix);
        prefix.push(b'x');
        send.write_all(&prefix).await.unwrap();
        sends.push(send);
        reads.spawn(async move {
            match tokio::time::timeout(Duration::from_secs(2), recv.read(&mut [0u8; 8])).await {
                Ok(Err(quinn::ReadError::Reset(code))) => Some(code.into_inner()),
                _ => None,
            }
        });
    }
    let codes = reads.join_all().await;
    let resets: Vec<u64> = codes.into_iter().flatten().collect();
    assert_eq!(resets, Vec::<u64>::new(), "none refused");
    let next = tokio::time::timeout(Duration::from_millis(500), conn.open_bi()).await;
    assert!(next.is_err(), "a stream past the credit waits for it");
    // A unidirectional stream for a session that is not there (the id of
    // a stream the server saw, not a session's): stopped (WT_SESSION_GONE).
    let mut stray = conn.open_uni().await.unwrap();
    let mut prefix = Vec::new();
    varint::encode(0x54, &mut prefix);
    varint::encode(id + 4, &mut prefix);
    stray.write_all(&prefix).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), stray.stopped())
        .await
        .expect("stopped within 10 s")
        .unwrap();
    let gone = rapidws::rapidws_core::h3::webtransport::code::SESSION_GONE;
    assert_eq!(stopped.map(quinn::VarInt::into_inner), Some(gone));
}

#[tokio::test]
async fn a_malformed_close_capsule_resets_the_session_stream_and_the_next_one_opens() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, mut recv, _) = open_session(&conn).await;
    // WT_CLOSE_SESSION with 2 bytes: shorter than its code.
    let mut capsule = Vec::new();
    varint::encode(0x2843, &mut capsule);
    varint::encode(2, &mut capsule);
    capsule.extend_from_slice(&[0, 1]);
    send.write_all(&frame_bytes(kind::DATA, &capsule))
        .await
        .unwrap();
    // H3_MESSAGE_ERROR on the session's stream.
    assert_eq!(reset_code(&mut recv).await, Some(0x10e));
    // The session is gone from the connection: another one may open.
    let (next, _next_recv, _) = open_session(&conn).await;
    drop(next);
    // Datagrams for no session, and with a cut prefix, are dropped; the
    // connection goes on.
    for datagram in [&[0x80u8, 0, 0, 0x10, 1][..], &[0x40][..]] {
        conn.send_datagram(datagram.to_vec().into()).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
    let (_send, _recv, _) = open_session(&conn).await;
}

#[tokio::test]
async fn unknown_capsules_are_skipped_whatever_their_length() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (mut send, mut recv, _) = open_session(&conn).await;
    let mut capsule = Vec::new();
    varint::encode(0x1234, &mut capsule);
    varint::encode(70_000, &mut capsule);
    capsule.resize(capsule.len() + 70_000, 7);
    send.write_all(&frame_bytes(kind::DATA, &capsule))
        .await
        .unwrap();
    // The session goes on...
    let still = tokio::time::timeout(Duration::from_millis(300), recv.read(&mut [0u8; 8])).await;
    assert!(still.is_err(), "{still:?}");
    // ...until the peer closes it: then the server's side ends, with no
    // capsule of its own.
    let mut close = Vec::new();
    varint::encode(0x2843, &mut close);
    varint::encode(5, &mut close);
    close.extend_from_slice(&[0, 0, 0, 9, b'x']);
    send.write_all(&frame_bytes(kind::DATA, &close))
        .await
        .unwrap();
    assert_eq!(ending(&mut recv).await, (None, Vec::new()));
}

#[tokio::test]
async fn a_close_asked_for_just_before_the_handler_returns_is_the_one_sent() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (_send, mut recv, _, status, mut bytes) = ask_session(&conn, "/close7").await;
    assert_eq!(status, "200");
    let (end, rest) = ending(&mut recv).await;
    assert_eq!(end, None);
    bytes.extend(rest);
    // One DATA frame: WT_CLOSE_SESSION, code 7, "seven".
    let head = frame::FrameHead::decode(&bytes).expect("a frame");
    assert_eq!(head.kind, kind::DATA);
    let capsule = &bytes[head.len..];
    let (kind, length, len) =
        rapidws::rapidws_core::h3::webtransport::capsule_head(capsule).unwrap();
    assert_eq!(kind, 0x2843);
    let close =
        rapidws::rapidws_core::h3::webtransport::decode_close(&capsule[len..len + length as usize]);
    assert_eq!(close, Ok((7, "seven")));
}

#[tokio::test]
async fn a_handler_that_panics_frees_its_session_and_a_hook_that_panics_answers_500() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (_send, _recv, _, status, _) = ask_session(&conn, "/panic-hook").await;
    assert_eq!(status, "500");
    let (_send, mut recv, _, status, _) = ask_session(&conn, "/panic").await;
    assert_eq!(status, "200");
    let _ = ending(&mut recv).await;
    // Not 429: the session left the connection's table as its task ended.
    let (_send, _recv, _) = open_session(&conn).await;
    assert!(conn.close_reason().is_none());
}

/// `QuicConfig::max_ack_delay` travels in QUIC's transport parameters in
/// milliseconds under 2^14: a longer one is refused when the endpoint is
/// made, saying why; the longest QUIC carries and `None` (each peer keeps
/// its own) make endpoints that serve.
#[tokio::test]
async fn a_max_ack_delay_quic_cannot_carry_is_refused() {
    let make = |delay| {
        let quic = rapidws::h3::QuicConfig {
            max_ack_delay: delay,
            ..Default::default()
        };
        let mut tls = (*common::tls::server_config()).clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        rapidws::h3::endpoint("127.0.0.1:0".parse().unwrap(), tls, &quic)
    };
    let error = make(Some(Duration::from_millis(16_384))).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("16,383 ms"), "{error}");
    for delay in [Some(Duration::from_millis(16_383)), None] {
        let endpoint = make(delay).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let server = Server::new(common::Echo { page: None }, Config::default());
        tokio::spawn(async move { rapidws::h3::serve(endpoint, &server).await });
        let conn = dial(addr).await;
        let mut control = open_control(&conn).await;
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&extended_connect()).await.unwrap();
        assert_eq!(status_of(&mut recv).await, "200", "max_ack_delay {delay:?}");
        control.finish().ok();
    }
}

/// `QuicConfig::udp_buffer`: a size the kernel caps (far past any
/// `net.core.rmem_max`) still makes an endpoint, with a warning naming the
/// sysctl to raise; a size it grants gives none.
#[tokio::test]
async fn a_udp_buffer_the_kernel_caps_is_warned_of() {
    let log = common::Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // This thread's: the endpoint is made here, synchronously.
    let _logging = tracing::subscriber::set_default(subscriber);
    let make = |bytes| {
        let quic = rapidws::h3::QuicConfig {
            udp_buffer: bytes,
            ..Default::default()
        };
        let mut tls = (*common::tls::server_config()).clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        rapidws::h3::endpoint("127.0.0.1:0".parse().unwrap(), tls, &quic)
    };
    make(64 * 1024).unwrap();
    assert_eq!(String::from_utf8_lossy(&log.0.lock().unwrap()), "");
    make(512 * 1024 * 1024).unwrap();
    let said = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(said.contains("capped the UDP receive buffer"), "{said}");
    assert!(said.contains("net.core.rmem_max"), "{said}");
    // Linux reports twice what it keeps: half again the cap reads back as
    // more than was asked, and is a cap all the same.
    if let Ok(max) = std::fs::read_to_string("/proc/sys/net/core/rmem_max") {
        let max: usize = max.trim().parse().unwrap();
        log.0.lock().unwrap().clear();
        make(max + max / 2).unwrap();
        let said = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
        assert!(said.contains("capped the UDP receive buffer"), "{said}");
    }
}
