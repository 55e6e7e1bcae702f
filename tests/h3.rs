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
    run_client("h3_client.py", addr, scenario).await
}

/// tests/interop/wt_client.py's JSON (WebTransport) for `scenario`.
async fn aioquic_webtransport(addr: SocketAddr, scenario: &str) -> serde_json::Value {
    run_client("wt_client.py", addr, scenario).await
}

/// The aioquic client `script`, started as the hold scenarios are.
fn holding_client(script: &str, addr: SocketAddr) -> tokio::process::Child {
    tokio::process::Command::new(common::python())
        .arg(format!(
            "{}/tests/interop/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .arg(&common::tls::identity().cert_pem)
        .arg("hold")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn run_client(script: &str, addr: SocketAddr, scenario: &str) -> serde_json::Value {
    let output = tokio::process::Command::new(common::python())
        .arg(format!(
            "{}/tests/interop/{script}",
            env!("CARGO_MANIFEST_DIR")
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
        "{script} {scenario} failed: {stdout}{}",
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

/// The async socket over HTTP/3: aioquic sends a message and its close in
/// one write, twenty times; the socket's task answers after a millisecond,
/// once the close is in. Every answer comes back before the close's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http3_the_last_reply_goes_out_before_the_answer_to_the_close() {
    let handler = rapidws::socket::SocketHandler::new(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if socket.send(message).await.is_err() {
                break;
            }
        }
    });
    let server = rapidws::stream::Server::new(handler, rapidws::Config::default());
    let (endpoint, addr) = common::tls::h3_endpoint();
    tokio::spawn(async move { rapidws::h3::serve(endpoint, &server).await });
    let result = aioquic(addr, "last").await;
    assert_eq!(result["answered"], 20, "{result}");
    assert_eq!(
        result["closes"],
        serde_json::json!(vec![1000; 20]),
        "{result}"
    );
}

/// `h3_bridge --ca` trusts what `--cafile` trusts in the other examples: a
/// self-signed certificate made CA:TRUE (as a plain `openssl req -x509`
/// makes it) is pinned as the server's own, not refused as a CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_trusts_a_self_signed_ca_true_certificate_it_is_given() {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir = std::env::temp_dir().join(format!("rapidws-ca-true-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_pem, key_pem) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_pem, cert.pem()).unwrap();
    std::fs::write(&key_pem, key.serialize_pem()).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let _server = common::Child(
        Command::new(common::example("h3_echo"))
            .args(["--addr", &addr.to_string()])
            .args(["--tls-cert", cert_pem.to_str().unwrap()])
            .args(["--tls-key", key_pem.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::wait_listening("h3_echo", addr).await;
    let listen: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let _bridge = common::Child(
        Command::new(common::example("h3_bridge"))
            .args(["--listen", &listen.to_string()])
            .args(["--server", &addr.to_string()])
            .args(["--ca", cert_pem.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::wait_listening("h3_bridge", listen).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{listen}/ws"))
        .await
        .expect("the bridge opens the WebSocket over HTTP/3");
    let text = tokio_tungstenite::tungstenite::Message::text("through a CA:TRUE pin");
    ws.send(text.clone()).await.unwrap();
    assert_eq!(common::next(&mut ws).await, text);
    let _ = std::fs::remove_dir_all(&dir);
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
    // A WebTransport session asked for at /ws: the WebTransport handler's
    // answer (h3_echo serves sessions at /wt).
    assert_eq!(status("webtransport"), "404", "{answers}");
    assert!(
        body("webtransport").contains("the echo is at /wt"),
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
async fn ctrl_c_closes_an_http3_websocket_with_1001_and_a_webtransport_session_and_the_server_exits_0()
 {
    let (mut server, addr) = start_h3_echo(&[]).await;
    let mut client = holding_client("h3_client.py", addr);
    let mut lines = tokio::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines).await["open"], true);
    let mut session = holding_client("wt_client.py", addr);
    let mut session_lines = tokio::io::BufReader::new(session.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut session_lines).await["open"], true);
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
    // The session: WT_CLOSE_SESSION (0, the reason), then its stream's end.
    let closed = next(&mut session_lines).await;
    assert_eq!(
        closed["close"],
        serde_json::json!([[0, "server shutting down"]]),
        "{closed}"
    );
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

/// WebTransport at `/wt` (aioquic's sessions, streams and datagrams):
/// bidirectional streams of 0 to 300,000 bytes at once, each echoed whole
/// on itself; unidirectional streams echoed on streams the server opens
/// (with the session's id); datagrams echoed as sent; the client's close
/// (4000) answered with the stream's end.
#[tokio::test]
async fn aioquic_opens_a_webtransport_session_and_every_stream_and_datagram_echoes() {
    let (_server, addr) = start_h3_echo(&[]).await;
    let result = aioquic_webtransport(addr, "echo").await;
    assert_eq!(result["status"], "200", "{result}");
    assert_eq!(result["draft"], "draft02", "{result}");
    assert_eq!(
        result["bidi"],
        serde_json::json!([0, 1, 65_536, 300_000]),
        "{result}"
    );
    assert_eq!(result["uni"], serde_json::json!([7, 100_000]), "{result}");
    assert_eq!(result["sessions"], serde_json::json!([0]), "{result}");
    // Loopback loses none in practice; one lost would not be a failure of
    // the server, a datagram echoed that was not sent would.
    assert!(result["datagrams_echoed"].as_u64() >= Some(15), "{result}");
    assert_eq!(result["datagrams_other"], 0, "{result}");
    assert_eq!(result["ended"], true, "{result}");
    // The client closed it: the server ends its side without a capsule.
    assert_eq!(result["server_capsules"], serde_json::json!([]), "{result}");
}

/// A session's peer gets 100 streams of credit each way once the session
/// is open (the connection had 16, sized for WebSockets), and 100
/// bidirectional and 60 unidirectional streams opened at once all echo;
/// `--wt-streams` sets the credit.
#[tokio::test]
async fn a_webtransport_session_gets_the_stream_credit_browsers_expect() {
    let (_server, addr) = start_h3_echo(&[]).await;
    let result = aioquic_webtransport(addr, "credit").await;
    assert_eq!(result["status"], "200", "{result}");
    assert!(result["max_bidi"].as_u64() >= Some(100), "{result}");
    assert!(result["max_uni"].as_u64() >= Some(103), "{result}");
    assert_eq!(result["bidi_echoed"], 100, "{result}");
    assert_eq!(result["uni_echoed"], 60, "{result}");

    let (_server, addr) = start_h3_echo(&["--wt-streams", "40"]).await;
    let result = aioquic_webtransport(addr, "credit").await;
    assert_eq!(result["max_bidi"], 40, "{result}");
    assert_eq!(result["max_uni"], 43, "{result}");
    // Past the credit, aioquic waits for more, and gets it as streams end.
    assert_eq!(result["bidi_echoed"], 100, "{result}");
}

/// The application's codes come back as they were sent: a bidirectional
/// stream the peer resets with 5 is reset with 5, one whose echo it stops
/// with 6 is reset and stopped with 6; a unidirectional stream it resets is
/// not answered with a stop of the server's own.
#[tokio::test]
async fn webtransport_streams_reset_or_stopped_get_the_peers_code_back() {
    let (_server, addr) = start_h3_echo(&[]).await;
    let result = aioquic_webtransport(addr, "codes").await;
    assert_eq!(result["status"], "200", "{result}");
    assert_eq!(result["bidi reset"]["reset"], 5, "{result}");
    assert_eq!(result["bidi stopped"]["reset"], 6, "{result}");
    assert_eq!(result["bidi stopped"]["stop"], 6, "{result}");
    assert_eq!(
        result["uni reset"]["stop"],
        serde_json::Value::Null,
        "{result}"
    );
}

/// Sessions refused as WebSockets are (the handler's 404, 400, the origin's
/// 403), a second session on one connection (429), and a stream for a
/// session that is not there (reset and stopped: WT_SESSION_GONE).
#[tokio::test]
async fn webtransport_refusals() {
    let (_server, addr) = start_h3_echo(&[]).await;
    let answers = aioquic_webtransport(addr, "refusals").await;
    let status = |case: &str| answers[case]["status"].as_str().unwrap_or("").to_owned();
    let body = |case: &str| answers[case]["body"].as_str().unwrap_or("").to_owned();
    assert_eq!(status("other path"), "404", "{answers}");
    assert!(
        body("other path").contains("the echo is at /wt"),
        "{answers}"
    );
    assert_eq!(status("http"), "400", "{answers}");
    assert!(body("http").contains(":scheme https"), "{answers}");
    assert_eq!(status("origin elsewhere"), "403", "{answers}");
    assert_eq!(status("first"), "200", "{answers}");
    assert_eq!(status("second"), "429", "{answers}");
    assert!(body("second").contains("another connection"), "{answers}");
    let gone = rapidws_core::h3::webtransport::code::SESSION_GONE;
    assert_eq!(answers["stray stream"]["reset"], gone, "{answers}");
    assert_eq!(answers["stray stream"]["stop"], gone, "{answers}");
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

/// A WebTransport handler that subscribes each session to the topic its
/// path's query names (`/wt?topic=NAME`) and holds it until it ends.
struct Subscriber {
    pubsub: rapidws::pubsub::PubSub,
}

impl rapidws::h3::WebTransport for Subscriber {
    async fn serve(&self, session: rapidws::h3::WebTransportSession) {
        let topic = session
            .path()
            .split_once("?topic=")
            .map(|(_, topic)| topic.to_owned())
            .unwrap_or_default();
        if self.pubsub.subscribe_session(&session, &topic).is_err() {
            session.close(1, "no such topic");
            return;
        }
        session.closed().await;
    }
}

/// Pub/sub to WebTransport sessions: aioquic's session subscribed to a
/// topic gets the publications made on a stream in order and whole (sizes
/// to 50,000 bytes), those made as datagrams as datagrams (each named
/// with its topic), and its subscription ends with the session. (Sizes
/// that keep under the 1 MiB a subscription may have waiting: past it,
/// publications are dropped for that session and counted.)
#[tokio::test]
async fn pubsub_delivers_to_a_webtransport_session_on_a_stream_and_as_datagrams() {
    let server =
        rapidws::stream::Server::new(common::Echo { page: None }, rapidws::Config::default());
    let (endpoint, addr) = common::tls::h3_endpoint();
    let pubsub = rapidws::pubsub::PubSub::new();
    let handler = Subscriber {
        pubsub: pubsub.clone(),
    };
    tokio::spawn(async move { rapidws::h3::serve_with(endpoint, &server, handler).await });

    let mut client = tokio::process::Command::new(common::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/wt_client.py"
        ))
        .args([&addr.ip().to_string(), &addr.port().to_string()])
        .arg(&common::tls::identity().cert_pem)
        .arg("subscribe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines).await["open"], true);
    let started = std::time::Instant::now();
    while pubsub.subscribers("news") < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let payload = |index: usize, size: usize| {
        let mut payload = format!("{index}:").into_bytes();
        payload.resize(payload.len() + size, (index % 256) as u8);
        payload
    };
    // Datagrams: small enough for any path, and sent first, while nothing
    // is in flight (behind half a megabyte of stream data on a loaded
    // machine, quinn dropped three or four of ten from its queue).
    let options = rapidws::pubsub::PublishOptions::new().datagram();
    for index in 100..110 {
        pubsub.publish_with(
            "news",
            rapidws::Message::Binary(&payload(index, 200)),
            options,
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // At most 10 x 50 KB and the rest small: under the 1 MiB a
    // subscription may have waiting even if the reader were stalled.
    let sizes = [0, 1, 100, 1_000, 16_384, 50_000];
    for index in 0..60 {
        let published = pubsub.publish(
            "news",
            rapidws::Message::Binary(&payload(index, sizes[index % sizes.len()])),
        );
        assert_eq!(published.subscribers, 1);
    }
    let mut stdin = client.stdin.take().unwrap();
    stdin.write_all(b"60 10\n").await.unwrap();
    let result = next(&mut lines).await;
    assert_eq!(result["streams"], 1, "{result}");
    assert_eq!(result["topic"], "news", "{result}");
    let in_order: Vec<serde_json::Value> = (0..60).map(|i| serde_json::json!([i, true])).collect();
    assert_eq!(result["messages"], serde_json::json!(in_order), "{result}");
    // Loopback loses none in practice; each that came is one sent, whole.
    let datagrams = result["datagrams"].as_array().unwrap();
    eprintln!("datagrams echoed: {} of 10", datagrams.len());
    assert!(datagrams.len() >= 8, "{result}");
    for datagram in datagrams {
        let index = datagram[0].as_u64().unwrap();
        assert!((100..110).contains(&index), "{result}");
        assert_eq!(datagram[1], true, "{result}");
    }
    assert_eq!(
        result["datagram_topics"],
        serde_json::json!(["news"]),
        "{result}"
    );
    assert_eq!(
        result["datagram_sessions"],
        serde_json::json!([result["session"]]),
        "{result}"
    );
    // The session is over: so is its subscription, and the topic.
    let started = std::time::Instant::now();
    while pubsub.subscribers("news") > 0 || pubsub.topic_count() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = pubsub.stats();
    assert_eq!(stats.delivered + stats.dropped, 70, "{stats:?}");
    assert_eq!(stats.dropped, 0, "{stats:?}");
}

/// rapidws's own client over HTTP/3 (`Client::http3`): `wss://` to
/// `h3_echo` with permessage-deflate agreed in the `200`, messages to
/// 1 MiB echoed, the client's close; a refusal as `ConnectError::Status`
/// with its body; and nothing answering on UDP as a timeout, not a silent
/// fall back to TCP.
#[tokio::test]
async fn the_client_opens_wss_over_http3() {
    use rapidws::client::{Client, ConnectError, Stage};
    let (_server, addr) = start_h3_echo(&["--deflate"]).await;
    let config = rapidws::Config::default().permessage_deflate(rapidws::DeflateConfig::default());
    let client = Client::new(config)
        .tls(common::tls::client_config())
        .http3();
    let url = format!("wss://localhost:{}/ws", addr.port());
    let (mut socket, response) = client.connect(url.as_str()).await.unwrap();
    assert!(response.deflate().is_some(), "{response:?}");
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    use rapidws::OwnedMessage;
    socket.send("over quic ✓".to_owned()).await.unwrap();
    socket
        .send(OwnedMessage::Binary(big.clone().into()))
        .await
        .unwrap();
    let first = socket.recv().await.unwrap().unwrap();
    assert_eq!(first, OwnedMessage::Text("over quic ✓".to_owned()));
    let second = socket.recv().await.unwrap().unwrap();
    assert_eq!(second, OwnedMessage::Binary(big.into()));
    socket.close(rapidws::CloseCode::NORMAL, "done").unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), socket.recv()).await;
    assert!(matches!(ended, Ok(None)), "{ended:?}");

    let other = format!("wss://localhost:{}/other", addr.port());
    match client.connect(other.as_str()).await {
        Err(ConnectError::Status(refusal)) => {
            assert_eq!(refusal.status, 404);
            let body = String::from_utf8_lossy(&refusal.body);
            assert!(body.contains("the echo is at /ws"), "{body}");
        }
        other => panic!("{other:?}"),
    }

    // Nothing on UDP there (a TCP listener only): the connect times out.
    let tcp_only = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp_only.local_addr().unwrap().port();
    let quick = Client::new(rapidws::Config::default())
        .tls(common::tls::client_config())
        .connect_timeout(Duration::from_millis(500))
        .http3();
    let started = std::time::Instant::now();
    let failed = quick
        .connect(format!("wss://localhost:{port}/ws").as_str())
        .await
        .unwrap_err();
    assert!(
        matches!(
            failed,
            ConnectError::Timeout(Stage::Connect) | ConnectError::Connect { .. }
        ),
        "{failed:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}
