//! WebTransport under a stream flood: a raw quinn peer (HTTP/3's bytes
//! written by hand, no HTTP/3 library on its side) opens sessions on
//! `examples/h3_echo`, a separate process whose memory the test reads, and
//! on each opens 16 unidirectional streams of nearly 1 MiB that it never
//! finishes. `h3_echo` reads each such stream whole before it echoes it,
//! through `Session::read_to_end`, so what it holds is counted against the
//! stream budget: per connection and across the endpoint.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use rapidws::h3::quinn;
use rapidws::rapidws_core::h3::frame::{self, kind};
use rapidws::rapidws_core::h3::{put_headers, varint};

/// Streams each flooding session opens, and the bytes written on each
/// (just under `h3_echo`'s 1 MiB, so it waits for the end of every one).
const STREAMS: usize = 16;
const STREAM_BYTES: usize = 1024 * 1024 - 4096;

/// H3_EXCESSIVE_LOAD: what a stream (or a connection) past its budget is
/// stopped (or closed) with.
const EXCESSIVE_LOAD: u64 = 0x107;

/// `h3_echo` on a free port with `extra` arguments.
async fn start_h3_echo(extra: &[&str]) -> (common::Child, SocketAddr) {
    let identity = common::tls::identity();
    let addr: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let child = Command::new(common::example("h3_echo"))
        .args(["--addr", &addr.to_string()])
        .args(["--tls-cert", identity.cert_pem.to_str().unwrap()])
        .args(["--tls-key", identity.key_pem.to_str().unwrap()])
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_listening("h3_echo", addr).await;
    (common::Child(child), addr)
}

/// The client endpoint a test's connections go out of: kept for as long
/// as the test runs (on its runtime: one per test).
fn client() -> quinn::Endpoint {
    common::tls::h3_client_endpoint("127.0.0.1:0".parse().unwrap())
}

/// A QUIC connection from `client` speaking `h3`, with our control
/// stream (empty SETTINGS) open.
async fn dial(
    client: &quinn::Endpoint,
    addr: SocketAddr,
) -> (quinn::Connection, quinn::SendStream) {
    let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
    let mut control = conn.open_uni().await.unwrap();
    let mut opening = vec![0x00];
    frame::put_head(&mut opening, kind::SETTINGS, 0);
    control.write_all(&opening).await.unwrap();
    (conn, control)
}

/// Opens a WebTransport session at `/wt` (its `200` read): its CONNECT
/// stream, kept open, and its id.
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
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 512];
    let head = loop {
        let n = tokio::time::timeout(Duration::from_secs(10), recv.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap()
            .expect("an answer before the stream's end");
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(head) = frame::FrameHead::decode(&bytes)
            && bytes.len() >= head.len + head.length as usize
        {
            break head;
        }
    };
    let section = &bytes[head.len..head.len + head.length as usize];
    let fields = rapidws::rapidws_core::h3::qpack::decode(section, 16 * 1024).unwrap();
    let (name, status) = fields.iter().next().unwrap();
    assert_eq!((name, status), (&b":status"[..], &b"200"[..]));
    let id = u64::from(send.id());
    (send, recv, id)
}

/// How one flooding stream ended, as its writer saw it.
#[derive(Debug, PartialEq)]
enum Fate {
    /// Every byte was taken (the server holds them, waiting for the end).
    Taken,
    /// The server stopped the stream with this code.
    Stopped(u64),
    /// The connection was closed (with this code, if by the application).
    Closed(Option<u64>),
    /// Still writing after the deadline: flow control holds it back.
    Waiting,
}

/// Writes `bytes` on `send` (for 20 s at most), and says how that went.
/// Written in pieces, each looked at again every 100 ms: quinn does not
/// wake a writer waiting for the connection's credit when its stream is
/// stopped, so a write left waiting would not learn it.
async fn write_all(send: &mut quinn::SendStream, bytes: &[u8]) -> Fate {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut at = 0;
    while at < bytes.len() {
        if tokio::time::Instant::now() > deadline {
            return Fate::Waiting;
        }
        let wrote = tokio::time::timeout(Duration::from_millis(100), send.write(&bytes[at..]));
        match wrote.await {
            Ok(Ok(n)) => at += n,
            Ok(Err(quinn::WriteError::Stopped(code))) => return Fate::Stopped(code.into_inner()),
            Ok(Err(quinn::WriteError::ConnectionLost(
                quinn::ConnectionError::ApplicationClosed(close),
            ))) => return Fate::Closed(Some(close.error_code.into_inner())),
            Ok(Err(_)) => return Fate::Closed(None),
            Err(_) => {}
        }
    }
    Fate::Taken
}

/// Opens [`STREAMS`] unidirectional streams of session `id` and writes
/// [`STREAM_BYTES`] on each without finishing any; returns the streams
/// (kept open) and how each write ended.
async fn flood(conn: &quinn::Connection, id: u64) -> (Vec<quinn::SendStream>, Vec<Fate>) {
    let mut writes = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let Ok(mut send) = conn.open_uni().await else {
            break;
        };
        writes.spawn(async move {
            let mut bytes = Vec::with_capacity(STREAM_BYTES + 16);
            varint::encode(0x54, &mut bytes);
            varint::encode(id, &mut bytes);
            bytes.resize(bytes.len() + STREAM_BYTES, 0x5a);
            let fate = write_all(&mut send, &bytes).await;
            (send, fate)
        });
    }
    let mut streams = Vec::new();
    let mut fates = Vec::new();
    for (send, fate) in writes.join_all().await {
        streams.push(send);
        fates.push(fate);
    }
    (streams, fates)
}

/// What one flooding connection keeps alive, and how its streams fared.
struct Flooder {
    conn: quinn::Connection,
    _kept: (quinn::SendStream, quinn::SendStream, quinn::RecvStream),
    _streams: Vec<quinn::SendStream>,
    fates: Vec<Fate>,
}

/// `connections` flooding connections from `client`, one after the other.
async fn flooders(client: &quinn::Endpoint, addr: SocketAddr, connections: usize) -> Vec<Flooder> {
    let mut all = Vec::new();
    for _ in 0..connections {
        let (conn, control) = dial(client, addr).await;
        let (send, recv, id) = open_session(&conn).await;
        let (streams, fates) = flood(&conn, id).await;
        all.push(Flooder {
            conn,
            _kept: (control, send, recv),
            _streams: streams,
            fates,
        });
    }
    all
}

/// A well-behaved session on a new connection: a unidirectional stream
/// of `size` bytes, finished, comes back whole on a stream the server
/// opens (within 20 s).
async fn echoes_a_stream(client: &quinn::Endpoint, addr: SocketAddr, size: usize) {
    let (conn, _control) = dial(client, addr).await;
    let (_send, _recv, id) = open_session(&conn).await;
    let mut stream = conn.open_uni().await.unwrap();
    let mut bytes = Vec::new();
    varint::encode(0x54, &mut bytes);
    varint::encode(id, &mut bytes);
    let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    bytes.extend_from_slice(&payload);
    stream.write_all(&bytes).await.unwrap();
    stream.finish().unwrap();
    // The server's unidirectional streams: its control stream (kept, not
    // stopped), then the echo.
    let mut kept = Vec::new();
    let echo = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut recv = conn.accept_uni().await.unwrap();
            let mut kind = [0u8; 1];
            recv.read_exact(&mut kind).await.unwrap();
            if kind[0] == 0x00 {
                kept.push(recv);
                continue;
            }
            // 0x54 as a varint: 0x40 0x54.
            let mut second = [0u8; 1];
            recv.read_exact(&mut second).await.unwrap();
            assert_eq!([kind[0], second[0]], [0x40, 0x54]);
            return recv.read_to_end(2 << 20).await.unwrap();
        }
    })
    .await
    .expect("the echo within 20 s");
    let (session, prefix) = varint::decode(&echo).expect("the session id");
    assert_eq!(session, id);
    assert!(echo[prefix..] == payload[..], "the echo differs");
}

/// The server's memory now, less `before`, in MiB.
fn grown_mib(server: &common::Child, before: u64) -> u64 {
    common::resident_of(server).saturating_sub(before) >> 20
}

/// Ten connections, each with a session flooding 16 streams of nearly
/// 1 MiB it never finishes, against the default budgets: each
/// connection's streams past 4 MiB are stopped with H3_EXCESSIVE_LOAD, so
/// the server holds about 4 MiB per connection and not 16; a
/// well-behaved session still echoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_finished_streams_are_bounded_per_connection() {
    let (server, addr) = start_h3_echo(&[]).await;
    let client = client();
    echoes_a_stream(&client, addr, 1000).await;
    let before = common::resident_of(&server);
    let flooders = flooders(&client, addr, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = grown_mib(&server, before);
    for (i, flooder) in flooders.iter().enumerate() {
        eprintln!("connection {i}: {:?}", flooder.fates);
    }
    eprintln!("h3_echo grew {grown} MiB under 10 connections x 16 streams x 1 MiB");
    for flooder in &flooders {
        let taken = flooder.fates.iter().filter(|&f| *f == Fate::Taken).count();
        assert!(taken * STREAM_BYTES <= 4 << 20, "{:?}", flooder.fates);
        let stopped = flooder
            .fates
            .iter()
            .filter(|&f| *f == Fate::Stopped(EXCESSIVE_LOAD));
        assert!(stopped.count() >= STREAMS - 4, "{:?}", flooder.fates);
        assert!(flooder.conn.close_reason().is_none());
    }
    assert!(grown < 80, "grew {grown} MiB");
    echoes_a_stream(&client, addr, 300_000).await;
}

/// Whether the server closed `conn`: with an application's code (the
/// code), or so that only its stateless reset came through (`None`: the
/// close was lost while the flood filled the client's socket, and the
/// server, done draining, answered the next packets with a reset).
fn closed_by_server(conn: &quinn::Connection) -> Option<Option<u64>> {
    match conn.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(close) => {
            Some(Some(close.error_code.into_inner()))
        }
        quinn::ConnectionError::Reset => Some(None),
        _ => None,
    }
}

/// `GET /metrics` from `h3_echo`'s TCP side (TLS).
async fn metrics(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = tokio_rustls::TlsConnector::from(common::tls::client_config());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut page = Vec::new();
    let _ = tls.read_to_end(&mut page).await;
    String::from_utf8_lossy(&page).into_owned()
}

/// A value of `/metrics` (0 if the series is not there).
fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// With a budget of 16 MiB for every connection (and 4 MiB each), ten
/// flooding connections want 40: past 16 the connection holding the most
/// is closed with H3_EXCESSIVE_LOAD, again and again, so the server holds
/// about the budget; the sheds are counted; a new well-behaved session
/// still echoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_endpoint_budget_the_connections_holding_the_most_are_closed() {
    let budget = 16 << 20;
    let (server, addr) = start_h3_echo(&["--wt-budget", &budget.to_string(), "--metrics"]).await;
    let client = client();
    echoes_a_stream(&client, addr, 1000).await;
    let before = common::resident_of(&server);
    let flooders = flooders(&client, addr, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = grown_mib(&server, before);
    let shed: Vec<usize> = (0..flooders.len())
        .filter(|&i| closed_by_server(&flooders[i].conn).is_some())
        .collect();
    for &i in &shed {
        let code = closed_by_server(&flooders[i].conn).flatten();
        assert!(
            code.is_none_or(|code| code == EXCESSIVE_LOAD),
            "closed with {code:?}"
        );
    }
    eprintln!("h3_echo grew {grown} MiB with a 16 MiB budget; connections closed: {shed:?}");

    for flooder in &flooders {
        let closed = flooder.fates.iter().all(|fate| {
            matches!(
                fate,
                Fate::Stopped(EXCESSIVE_LOAD) | Fate::Taken | Fate::Closed(_)
            )
        });
        assert!(closed, "{:?}", flooder.fates);
    }
    assert!(grown < 60, "grew {grown} MiB");
    // The metrics are set once a second.
    let mut page = metrics(addr).await;
    let series = "rapidws_budget_shed_total{budget=\"webtransport\"}";
    for _ in 0..30 {
        if metric(&page, series) >= shed.len() as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        page = metrics(addr).await;
    }
    let counted = metric(&page, series);
    assert!(
        counted >= shed.len() as f64,
        "{counted} counted, {} closed",
        shed.len()
    );
    // What the rest hold is within the budget.
    let held = metric(&page, "rapidws_budget_bytes{budget=\"webtransport\"}");
    // 40 MiB wanted, 16 allowed: some connections holding the most went.
    assert!(shed.len() >= 2, "closed: {shed:?}");
    assert!(held <= budget as f64, "{held} bytes held");
    assert_eq!(
        metric(&page, "rapidws_budget_limit_bytes{budget=\"webtransport\"}"),
        budget as f64
    );
    echoes_a_stream(&client, addr, 300_000).await;
}
