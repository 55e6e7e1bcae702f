//! WebSockets over HTTP/3 (RFC 9220): `examples/h3_echo` against an
//! independent client, aioquic (QUIC, HTTP/3 and QPACK are its own; the
//! WebSocket frames are written by tests/interop/h3_client.py), over real
//! UDP sockets and real TLS. And the same example's TCP side: the page
//! offering HTTP/3 with `Alt-Svc`, and a WebSocket over it.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// `h3_echo` on a free port (UDP and TCP), with this binary's certificate.
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
    // The TCP listener is bound after the QUIC endpoint.
    common::wait_listening("h3_echo", addr).await;
    (common::Child(child), addr)
}

/// tests/interop/h3_client.py's JSON for `scenario` against `addr`.
async fn aioquic(addr: SocketAddr, scenario: &str) -> serde_json::Value {
    let output = tokio::process::Command::new(common::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/h3_client.py"
        ))
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .arg(&common::tls::identity().cert_pem)
        .arg(scenario)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("the aioquic client ends within 60 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "h3_client.py {scenario} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test]
async fn aioquic_opens_a_websocket_over_http3_and_every_message_echoes_with_and_without_deflate() {
    for deflate in [false, true] {
        let extra: &[&str] = if deflate { &["--deflate"] } else { &[] };
        let (_server, addr) = start_h3_echo(extra).await;
        let result = aioquic(addr, if deflate { "deflate" } else { "echo" }).await;
        let extensions = result["extensions"].as_str().unwrap_or_default();
        assert_eq!(
            extensions.starts_with("permessage-deflate"),
            deflate,
            "{result}"
        );
        assert_eq!(result["status"], "200", "{result}");
        // Sizes 0, 1, 125, 126, 64 KiB - 1, 64 KiB, 200,000 and 1 MiB.
        assert_eq!(result["echoed"], 8, "{result}");
        assert_eq!(result["bytes"], 1_379_899, "{result}");
        assert_eq!(result["close"], serde_json::json!([1000]), "{result}");
        assert_eq!(result["ended"], true, "{result}");
    }
}

#[tokio::test]
async fn a_bad_extended_connect_gets_the_answers_http2_gets() {
    let (_server, addr) = start_h3_echo(&[]).await;
    let answers = aioquic(addr, "refusals").await;
    let status = |case: &str| answers[case]["status"].as_str().unwrap_or("").to_owned();
    let body = |case: &str| answers[case]["body"].as_str().unwrap_or("").to_owned();
    assert_eq!(status("version 8"), "426", "{answers}");
    assert_eq!(
        answers["version 8"]["fields"]["sec-websocket-version"],
        "13"
    );
    assert_eq!(status("webtransport"), "400", "{answers}");
    assert!(
        body("webtransport").contains(":protocol websocket"),
        "{answers}"
    );
    assert_eq!(status("get"), "400", "{answers}");
    // The upgrade hook's own answer.
    assert_eq!(status("other path"), "404", "{answers}");
    assert!(
        body("other path").contains("the echo is at /ws"),
        "{answers}"
    );
    // Malformed (RFC 9114, 4.2): a field name with uppercase.
    assert_eq!(status("uppercase"), "400", "{answers}");
    assert!(body("uppercase").contains("lowercase"), "{answers}");
    // The Origin check compares with :authority, as Host over HTTP/1.1.
    assert_eq!(status("origin elsewhere"), "403", "{answers}");
    for case in [
        "version 8",
        "webtransport",
        "get",
        "other path",
        "uppercase",
    ] {
        assert_eq!(
            answers[case]["fields"]["content-type"], "text/plain; charset=utf-8",
            "{case}: {answers}"
        );
    }
}

/// The client's next JSON line (within 20 s).
async fn next<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a line within 20 s")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test]
async fn ctrl_c_closes_an_http3_websocket_with_1001_and_the_server_exits_0() {
    let (mut server, addr) = start_h3_echo(&[]).await;
    let mut client = tokio::process::Command::new(common::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/h3_client.py"
        ))
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .arg(&common::tls::identity().cert_pem)
        .arg("hold")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines).await["open"], true);
    let pid = server.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let closed = next(&mut lines).await;
    assert_eq!(closed["close"], serde_json::json!([1001]), "{closed}");
    assert_eq!(closed["ended"], true, "{closed}");
    let status = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Some(status) = server.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })
    .await
    .unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}

#[tokio::test]
async fn the_tcp_side_offers_http3_and_serves_the_same_echo() {
    let (_server, addr) = start_h3_echo(&[]).await;
    // The page, over TLS (HTTP/1.1), with Alt-Svc naming the same port.
    let connector = tokio_rustls::TlsConnector::from(common::tls::client_config());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut page = Vec::new();
    tls.read_to_end(&mut page).await.unwrap();
    let page = String::from_utf8_lossy(&page).to_lowercase();
    assert!(page.starts_with("http/1.1 200"), "{page}");
    let alt_svc = format!("alt-svc: h3=\":{}\"; ma=86400", addr.port());
    assert!(page.contains(&alt_svc), "{page}");

    // A WebSocket over TCP and TLS to the same handler.
    let url = format!("wss://localhost:{}/ws", addr.port());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    assert!(response.headers().contains_key("alt-svc"));
    ws.send(tokio_tungstenite::tungstenite::Message::text("over tcp"))
        .await
        .unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), "over tcp");
}
