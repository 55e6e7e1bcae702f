//! A hostile HTTP/3 peer: a raw quinn client writing HTTP/3 bytes by hand
//! (no HTTP/3 library on its side) against `rapidws::h3::serve`. Each
//! violation gets the error code RFC 9114 or RFC 9204 gives it, on the
//! connection or the stream, and nothing else is held up.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
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
    let mut roots = rustls::RootCertStore::empty();
    roots.add(common::tls::identity().cert.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
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
    let section = rapidws::rapidws_core::h3::qpack::decode(
        &bytes[head.len..head.len + head.length as usize],
        16 * 1024,
    )
    .unwrap();
    let (name, value) = section.iter().next().unwrap();
    assert_eq!(name, b":status");
    String::from_utf8(value.to_vec()).unwrap()
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

/// A WebTransport handler that takes no stream: it holds its session until
/// the session ends.
struct Idle;

impl rapidws::h3::WebTransport for Idle {
    async fn serve(&self, session: rapidws::h3::Session) {
        session.closed().await;
    }
}

/// [`start_server`] with WebTransport sessions served by [`Idle`].
fn start_webtransport_server() -> SocketAddr {
    let server = Server::new(common::Echo { page: None }, Config::default());
    let (endpoint, addr) = common::tls::h3_endpoint();
    tokio::spawn(async move { rapidws::h3::serve_with(endpoint, &server, Idle).await });
    addr
}

/// Opens a session (its 200 read); returns its stream and id.
async fn open_session(conn: &quinn::Connection) -> (quinn::SendStream, quinn::RecvStream, u64) {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut request = Vec::new();
    let fields: [(&[u8], &[u8]); 5] = [
        (b":method", b"CONNECT"),
        (b":protocol", b"webtransport"),
        (b":scheme", b"https"),
        (b":path", b"/wt"),
        (b":authority", b"localhost"),
    ];
    put_headers(fields, &mut request);
    send.write_all(&request).await.unwrap();
    assert_eq!(status_of(&mut recv).await, "200");
    let id = u64::from(send.id());
    (send, recv, id)
}

/// The error code a stream's reading side ends with (within 10 s).
async fn reset_code(recv: &mut quinn::RecvStream) -> Option<u64> {
    let mut chunk = [0u8; 64];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), recv.read(&mut chunk))
            .await
            .expect("the stream ends within 10 s");
        match read {
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(quinn::ReadError::Reset(code)) => return Some(code.into_inner()),
            Err(other) => panic!("{other}"),
        }
    }
}

#[tokio::test]
async fn webtransport_streams_past_what_a_session_queues_are_rejected() {
    let addr = start_webtransport_server();
    let conn = dial(addr).await;
    let _control = open_control(&conn).await;
    let (_send, _recv, id) = open_session(&conn).await;
    // 80 streams the handler never takes: 64 are queued for it, the rest
    // reset (WEBTRANSPORT_BUFFERED_STREAM_REJECTED).
    let mut streams = Vec::new();
    for _ in 0..80 {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let mut prefix = Vec::new();
        varint::encode(0x41, &mut prefix);
        varint::encode(id, &mut prefix);
        prefix.push(b'x');
        send.write_all(&prefix).await.unwrap();
        streams.push((send, recv));
    }
    let rejected = rapidws::rapidws_core::h3::webtransport::code::BUFFERED_STREAM_REJECTED;
    let mut codes = Vec::new();
    for (_, recv) in &mut streams[64..] {
        codes.push(reset_code(recv).await);
    }
    assert!(
        codes.iter().all(|&code| code == Some(rejected)),
        "{codes:?}"
    );
    // A unidirectional stream for a session that is not there: stopped
    // (WT_SESSION_GONE).
    let mut stray = conn.open_uni().await.unwrap();
    let mut prefix = Vec::new();
    varint::encode(0x54, &mut prefix);
    varint::encode(id + 400, &mut prefix);
    stray.write_all(&prefix).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), stray.stopped())
        .await
        .expect("stopped within 10 s")
        .unwrap();
    let gone = rapidws::rapidws_core::h3::webtransport::code::SESSION_GONE;
    assert_eq!(stopped.map(quinn::VarInt::into_inner), Some(gone));
}

#[tokio::test]
async fn a_malformed_close_capsule_ends_the_session_and_the_next_one_opens() {
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
    // The server ends its side (its stream's FIN, after the response).
    assert_eq!(reset_code(&mut recv).await, None);
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
async fn unknown_capsules_past_64_kib_end_the_session() {
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
    assert_eq!(reset_code(&mut recv).await, None);
}
