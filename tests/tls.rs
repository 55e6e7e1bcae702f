//! wss on the tokio server (the stream driver over rustls) and on io_uring
//! (rustls inside the reactor), with clients that speak TLS themselves:
//! tokio-tungstenite over tokio-rustls here, Python `websockets` with an
//! ssl context in `tests/interop.rs`. Every other integration test also runs
//! against both, through a TLS bridge (`backend_tests!`, `tls_backend` and
//! `uring_tls_backend`). This file adds what only a TLS port has: peers that
//! do not speak TLS, or stall in its handshake.
#![cfg(feature = "rustls")]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as Ws;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

fn log() -> &'static Log {
    static LOG: OnceLock<Log> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .init();
        log
    })
}

fn logged(peer_port: u16, what: &str) -> bool {
    let text = String::from_utf8_lossy(&log().0.lock().unwrap()).into_owned();
    text.lines()
        .any(|line| line.contains(what) && line.contains(&format!(":{peer_port}")))
}

/// The tests below, on each wss server.
macro_rules! on_wss_servers {
    ($($name:ident),* $(,)?) => {
        mod tokio_wss {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Tls).await
                }
            )*
        }
        #[cfg(all(target_os = "linux", feature = "uring"))]
        mod uring_wss {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::UringTls).await
                }
            )*
        }
    };
}

on_wss_servers!(
    tungstenite_over_rustls_echoes_and_closes,
    plain_http_and_garbage_on_the_tls_port_are_closed_and_logged,
    a_stalled_client_hello_gets_the_handshake_timeout,
    the_handshake_timeout_counts_from_the_connect,
);

async fn wss_server(backend: Backend, config: Config) -> (TestServer, std::net::SocketAddr) {
    log();
    let server = start(backend, config).await;
    let addr = server.tls_addr.expect("a TLS server");
    (server, addr)
}

async fn tungstenite_over_rustls_echoes_and_closes(backend: Backend) {
    let (server, addr) = wss_server(backend, Config::default()).await;
    let tls = tls::connect(addr).await.expect("TLS handshake");
    let url = format!("wss://localhost:{}/", addr.port());
    let (mut client, response) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("upgrade over TLS");
    assert_eq!(response.status(), 101);
    for message in [
        Ws::text("over TLS"),
        Ws::binary(vec![7u8; 300_000]),
        Ws::text(""),
    ] {
        client.send(message.clone()).await.unwrap();
        assert_eq!(client.next().await.unwrap().unwrap(), message);
    }
    let frame = CloseFrame {
        code: 4001.into(),
        reason: "done".into(),
    };
    client.send(Ws::Close(Some(frame))).await.unwrap();
    match client.next().await.unwrap().unwrap() {
        Ws::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 4001),
        other => panic!("expected the close echoed, got {other:?}"),
    }
    assert!(client.next().await.is_none(), "the server ends the stream");
    assert_eq!(
        server.recorder.wait_closes(1).await,
        [(4001, "done".into())]
    );
}

/// Plain HTTP, or bytes that are not TLS at all, sent to the TLS port: the
/// connection is closed (no HTTP answer in clear), a line is logged, and
/// the server goes on serving.
async fn plain_http_and_garbage_on_the_tls_port_are_closed_and_logged(backend: Backend) {
    let (server, addr) = wss_server(backend, Config::default()).await;
    for bytes in [
        upgrade_request("/", "").into_bytes(),
        b"\x00\x01garbage garbage garbage\r\n\r\n".to_vec(),
    ] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let port = stream.local_addr().unwrap().port();
        stream.write_all(&bytes).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
        // A TLS alert at most, then the end (or a reset).
        let _ = read.await.expect("closed, not left hanging");
        assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");
        assert!(
            eventually(Duration::from_secs(2), || logged(
                port,
                "TLS handshake failed"
            ))
            .await,
            "a log line for {port}"
        );
    }
    assert!(eventually(Duration::from_secs(2), || server.handle.alive() == 0).await);
    let tls = tls::connect(addr).await.expect("still serving TLS");
    let url = format!("wss://localhost:{}/", addr.port());
    let (mut client, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    client.send(Ws::text("still here")).await.unwrap();
    assert_eq!(
        client.next().await.unwrap().unwrap(),
        Ws::text("still here")
    );
}

/// A peer that connects and sends nothing, or half a ClientHello, holds its
/// connection until the handshake timeout and not longer.
async fn a_stalled_client_hello_gets_the_handshake_timeout(backend: Backend) {
    let timeout = Duration::from_millis(600);
    let (server, addr) = wss_server(backend, Config::default().handshake_timeout(timeout)).await;
    // The first bytes of a real ClientHello: a handshake record header.
    let half_hello: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];
    for sent in [&[][..], half_hello] {
        let started = Instant::now();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let port = stream.local_addr().unwrap().port();
        stream.write_all(sent).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
            .await
            .expect("closed at the handshake timeout");
        let took = started.elapsed();
        assert!(took >= timeout, "closed after {took:?}");
        assert!(took < timeout * 4, "closed only after {took:?}");
        assert!(
            eventually(Duration::from_secs(2), || logged(
                port,
                "TLS handshake timed out"
            ))
            .await,
            "a log line for {port}"
        );
    }
    assert!(eventually(Duration::from_secs(2), || server.handle.alive() == 0).await);
}

/// The handshake timeout covers the TLS handshake and the upgrade request
/// together: a client that finishes TLS and then dribbles its request gets
/// 408 at the timeout counted from the connect.
async fn the_handshake_timeout_counts_from_the_connect(backend: Backend) {
    let timeout = Duration::from_millis(800);
    let (_server, addr) = wss_server(backend, Config::default().handshake_timeout(timeout)).await;
    let started = Instant::now();
    let mut tls = tls::connect(addr).await.unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    let took = started.elapsed();
    assert!(
        answer.starts_with(b"HTTP/1.1 408 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(took >= timeout && took < timeout * 3, "408 after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_example_serves_wss_and_ws_with_a_pem_certificate_and_key() {
    let identity = tls::identity();
    let (cert, key) = (identity.cert_pem.to_str(), identity.key_pem.to_str());
    let args = ["--backend", "tokio", "--tls-cert", cert.unwrap()];
    let args = [&args[..], &["--tls-key", key.unwrap(), "--also-plain"]].concat();
    let (_echo, addr) = start_example("echo", &args).await;
    let port = addr.port();
    let tls = tls::connect(addr).await.expect("a TLS handshake");
    let url = format!("wss://localhost:{port}/");
    let (mut client, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    assert_eq!(
        echo(&mut client, "echo over wss".into()).await,
        "echo over wss"
    );
    // `--also-plain`: plain ws on the same port.
    let (mut plain, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .unwrap();
    assert_eq!(
        echo(&mut plain, "echo over ws".into()).await,
        "echo over ws"
    );
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_example_serves_wss_on_io_uring() {
    let identity = tls::identity();
    let (cert, key) = (identity.cert_pem.to_str(), identity.key_pem.to_str());
    let args = ["--backend", "uring", "--tls-cert", cert.unwrap()];
    let args = [&args[..], &["--tls-key", key.unwrap()]].concat();
    let (_echo, addr) = start_example("echo", &args).await;
    let tls = tls::connect(addr).await.expect("a TLS handshake");
    let url = format!("wss://localhost:{}/", addr.port());
    let (mut client, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    assert_eq!(
        echo(&mut client, "echo over wss on io_uring".into()).await,
        "echo over wss on io_uring"
    );
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[test]
fn the_echo_example_refuses_also_plain_on_io_uring_with_exit_code_2() {
    let identity = tls::identity();
    let output = std::process::Command::new(echo_example())
        .args(["--addr", "127.0.0.1:0", "--backend", "uring", "--tls-cert"])
        .arg(&identity.cert_pem)
        .arg("--tls-key")
        .arg(&identity.key_pem)
        .arg("--also-plain")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--backend tokio"), "{stderr}");
}

/// `Server::also_plain`: one port serves wss (tokio-tungstenite over
/// rustls) and plain ws (tokio-tungstenite over TCP) side by side, and a
/// peer that sends nothing is closed at the handshake timeout rather than
/// holding its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_serves_ws_and_wss_when_asked() {
    log();
    let timeout = Duration::from_millis(600);
    let handler = TestHandler {
        recorder: Default::default(),
        runtime: tokio::runtime::Handle::current(),
    };
    let config = Config::default().handshake_timeout(timeout);
    let server = rapidws::tokio::Server::bind("127.0.0.1:0", handler, config)
        .await
        .unwrap()
        .tls(tls::server_config())
        .also_plain();
    let addr = server.local_addr().unwrap();
    let handle = server.handle();
    let served = tokio::spawn(server.serve());
    let tls = tls::connect(addr).await.expect("TLS handshake");
    let (mut wss, _) =
        tokio_tungstenite::client_async(format!("wss://localhost:{}/", addr.port()), tls)
            .await
            .expect("wss upgrade");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .expect("plain upgrade on the TLS port");
    for round in 0..3 {
        assert_eq!(
            echo(&mut wss, format!("wss {round}")).await,
            format!("wss {round}")
        );
        assert_eq!(
            echo(&mut ws, format!("ws {round}")).await,
            format!("ws {round}")
        );
    }
    // Sends nothing: closed once the handshake timeout is up.
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut answer))
        .await
        .expect("closed at the handshake timeout")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout * 4,
        "closed after {took:?}"
    );
    assert!(
        answer.is_empty(),
        "nothing is answered to a peer that said nothing"
    );
    // The other two are still served.
    assert_eq!(echo(&mut wss, "still".into()).await, "still");
    handle.shutdown();
    assert_eq!(expect_close(&mut ws).await.0, 1001);
    match wss.next().await.unwrap().unwrap() {
        Ws::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected a close, got {other:?}"),
    }
    // Their replies come with the end of TCP: the server need not wait.
    drop((ws, wss));
    served.await.unwrap().unwrap();
}

/// Sends `text` and returns the text that comes back, on any stream.
async fn echo<S>(client: &mut tokio_tungstenite::WebSocketStream<S>, text: String) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client.send(Ws::text(text)).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), client.next()).await;
    match reply.expect("an echo within 10 s").unwrap().unwrap() {
        Ws::Text(text) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}
