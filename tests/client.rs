//! The client over real sockets: against our own server on every backend,
//! against independent servers (Python `websockets`, plain and TLS, with
//! each permessage-deflate parameter; tokio-tungstenite), and against fake
//! servers that break the protocol in every way the handshake and the
//! frames can be broken, each a named error or the right close code.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::client::{self, Client, ConnectError, ConnectRequest, Stage};
use rapidws::{CloseCode, Config, Conn, DeflateConfig, Handler, Message, OwnedMessage};
use rapidws_core::handshake::ClientHandshakeError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

backend_tests!(
    socket_echoes_against_our_server,
    handler_echoes_against_our_server,
    subprotocol_and_deflate_against_our_server,
    server_close_code_reaches_the_client,
);

fn socket_client() -> Client {
    Client::new(Config::default())
}

async fn socket_echoes_against_our_server(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let (mut socket, response) = socket_client().connect(server.url("/")).await.unwrap();
    assert_eq!(response.protocol(), None);
    assert!(response.deflate().is_none());
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let messages = [
        OwnedMessage::Text("hello".into()),
        OwnedMessage::Text("κόσμε ✓".into()),
        OwnedMessage::Binary(big.into()),
        OwnedMessage::Text(String::new()),
        OwnedMessage::Binary(rapidws::Bytes::new()),
    ];
    for message in &messages {
        socket.send(message.clone()).await.unwrap();
    }
    for message in &messages {
        assert_eq!(&socket.recv().await.unwrap().unwrap(), message);
    }
    socket.close(CloseCode::NORMAL, "done").unwrap();
    assert!(
        socket.recv().await.is_none(),
        "the stream ends after the close"
    );
    assert_eq!(socket.close_code(), Some(CloseCode::NORMAL));
    let closes = server.recorder.wait_closes(1).await;
    assert_eq!(closes, vec![(1000, "done".to_owned())]);
}

/// Records what a client handler sees.
#[derive(Clone, Default)]
struct Recording {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Handler for Recording {
    type State = u32;

    fn on_open(&self, conn: &Conn, _: &mut u32) {
        conn.send_text("first").unwrap();
    }

    fn on_message(&self, conn: &Conn, count: &mut u32, message: Message<'_>) {
        *count += 1;
        let text = message.as_text().unwrap_or("<binary>").to_owned();
        self.seen.lock().unwrap().push(text);
        if *count == 3 {
            conn.close(CloseCode(4000), "enough").unwrap();
        } else {
            conn.send_text(&format!("next {count}")).unwrap();
        }
    }

    fn on_close(&self, _: &Conn, count: &mut u32, code: CloseCode, reason: &str) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("closed {} {reason} after {count}", code.0));
    }
}

async fn handler_echoes_against_our_server(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let recording = Recording::default();
    let client = Client::with_handler(recording.clone(), Config::default());
    let (conn, _) = client.connect_with(server.url("/"), 0).await.unwrap();
    assert!(conn.is_open() || !recording.seen.lock().unwrap().is_empty());
    let done = eventually(Duration::from_secs(10), || {
        recording.seen.lock().unwrap().len() == 4
    })
    .await;
    assert!(done, "{:?}", recording.seen.lock().unwrap());
    assert_eq!(
        *recording.seen.lock().unwrap(),
        // The reason is the server's, from its close frame: it answers
        // with the code and no reason.
        ["first", "next 1", "next 2", "closed 4000  after 3"]
    );
    assert_eq!(
        server.recorder.wait_closes(1).await,
        vec![(4000, "enough".to_owned())]
    );
    assert!(
        eventually(Duration::from_secs(5), || client.handle().connections()
            == 0)
        .await
    );
}

async fn subprotocol_and_deflate_against_our_server(backend: Backend) {
    let deflate = DeflateConfig::default().compress_min_size(0);
    let server = start(backend, Config::default().permessage_deflate(deflate)).await;
    let client = Client::new(Config::default().permessage_deflate(deflate));
    let request = ConnectRequest::new(server.url("/"))
        .protocol("superchat")
        .protocol("chat")
        .header("X-Test", "yes");
    let (mut socket, response) = client.connect(request).await.unwrap();
    assert_eq!(response.protocol(), Some("chat"));
    let params = response.deflate().expect("deflate agreed");
    assert!(params.server_no_context_takeover && params.client_no_context_takeover);
    assert!(response.header("sec-websocket-extensions").is_some());
    let text = "compress me ".repeat(1000);
    for _ in 0..3 {
        socket.send(text.clone()).await.unwrap();
        assert_eq!(
            socket.recv().await.unwrap().unwrap(),
            OwnedMessage::Text(text.clone())
        );
    }
}

async fn server_close_code_reaches_the_client(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let (mut socket, _) = socket_client().connect(server.url("/")).await.unwrap();
    socket.send("close 4321 bye now").await.unwrap();
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode(4321)));
    // The test server closes with the message's third word as the reason.
    assert_eq!(socket.close_reason().as_deref(), Some("bye"));
    // The client answered with the same code.
    assert_eq!(
        server.recorder.wait_closes(1).await,
        vec![(4321, String::new())]
    );
}

/// Over wss, straight to the TLS server (no bridge): the certificate is
/// checked against `localhost`.
#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_to_our_tls_server() {
    let server = start(Backend::Tls, Config::default()).await;
    let port = server.tls_addr.unwrap().port();
    let client = Client::new(Config::default()).tls(tls::client_config());
    let (mut socket, _) = client
        .connect(format!("wss://localhost:{port}/"))
        .await
        .unwrap();
    socket.send("over tls").await.unwrap();
    assert_eq!(
        socket.recv().await.unwrap().unwrap(),
        OwnedMessage::Text("over tls".into())
    );

    // A name the certificate does not carry (over a stream of our own, so
    // that the name needs no resolving).
    let tcp = TcpStream::connect(server.tls_addr.unwrap()).await.unwrap();
    let request = ConnectRequest::new("wss://other.example/").over(tcp);
    let error = client.connect(request).await.unwrap_err();
    let ConnectError::Tls(io) = &error else {
        panic!("expected a TLS error, got {error:?}");
    };
    let inner = io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    assert!(
        matches!(inner, Some(rustls::Error::InvalidCertificate(_))),
        "{io:?}"
    );
}

/// The TLS mistakes a newcomer makes first each get an error that names
/// the cause and the fix: wss:// to a plain port, ws:// to a TLS port, a
/// certificate nobody trusts, a CA certificate served as the server's own.
#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_get_errors_that_name_the_fix() {
    let server = start(Backend::Tls, Config::default()).await;
    let tls_port = server.tls_addr.unwrap().port();
    let trusting = Client::new(Config::default()).tls(tls::client_config());

    // wss:// to a plain port.
    let plain_server = start(Backend::Tokio, Config::default()).await;
    let error = trusting
        .connect(format!("wss://localhost:{}/", plain_server.addr.port()))
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectError::Tls(_)), "{error:?}");
    assert!(error.to_string().contains("use a ws:// URL"), "{error}");

    // ws:// to the TLS port.
    let error = client::connect(format!("ws://localhost:{tls_port}/"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ConnectError::Handshake(ClientHandshakeError::TlsAnswer)
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("use a wss:// URL"), "{error}");

    // A certificate the client does not trust (empty roots).
    let error = Client::new(Config::default())
        .tls(tls::trusting(rustls::RootCertStore::empty()))
        .connect(format!("wss://localhost:{tls_port}/"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("--cafile"), "{error}");
    assert!(error.to_string().contains("Client::tls"), "{error}");

    // A self-signed certificate marked CA:TRUE (as `openssl req -x509`
    // makes them), trusted as a root: webpki refuses it as the server's.
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let server_tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_tls));
    tokio::spawn(async move {
        if let Ok((tcp, _)) = listener.accept().await {
            let _ = acceptor.accept(tcp).await;
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let error = Client::new(Config::default())
        .tls(tls::trusting(roots))
        .connect(format!("wss://localhost:{port}/"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("CA:FALSE"), "{error}");
}

/// Through a stream the caller made (here a TCP stream, so the `Conn` has
/// no peer address of ours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_callers_stream() {
    let server = start(Backend::Tokio, Config::default()).await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let request = ConnectRequest::new("ws://somewhere.example/path").over(tcp);
    let (mut socket, _) = socket_client().connect(request).await.unwrap();
    assert_eq!(socket.conn().peer_addr(), "0.0.0.0:0".parse().unwrap());
    socket.send("hi").await.unwrap();
    assert_eq!(
        socket.recv().await.unwrap().unwrap(),
        OwnedMessage::Text("hi".into())
    );
}

/// tokio-tungstenite as the server: an independent implementation reads
/// our masked frames, and the close handshake completes cleanly both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_tokio_tungstenite() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let mut seen = Vec::new();
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() {
                seen.push(format!("{message:?}"));
                break;
            }
            seen.push(format!("{}", message.len()));
            ws.send(message).await.unwrap();
        }
        // tungstenite answers the close; wait for our side to go.
        while ws.next().await.is_some() {}
        seen
    });
    let (mut socket, _) = socket_client()
        .connect(format!("ws://{addr}/chat"))
        .await
        .unwrap();
    let sizes = [0usize, 1, 125, 126, 65535, 65536, 300_000];
    for size in sizes {
        socket.send(vec![b'z'; size]).await.unwrap();
        let echo = socket.recv().await.unwrap().unwrap();
        assert_eq!(echo, OwnedMessage::Binary(vec![b'z'; size].into()));
    }
    socket.close(CloseCode(4001), "bye").unwrap();
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode(4001)));
    let seen = tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the server saw the connection end")
        .unwrap();
    assert_eq!(seen.len(), sizes.len() + 1);
    assert!(seen.last().unwrap().contains("4001"), "{seen:?}");
}

// ---- Python `websockets` as the server ----

/// A Python echo server and the lines it prints (one JSON per connection).
struct PythonServer {
    _child: common::Child,
    port: u16,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
}

fn python_server(args: &[&str]) -> PythonServer {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/echo_server.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let port = first.trim().parse().expect("the server prints its port");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).unwrap());
        }
    });
    PythonServer {
        _child: common::Child(child),
        port,
        lines,
    }
}

/// Sends messages that compress well and badly, checks every echo, closes,
/// and returns what the Python server saw.
async fn exchange(
    server: &PythonServer,
    client: &Client,
    request: impl Into<ConnectRequest>,
) -> serde_json::Value {
    let (mut socket, _) = client.connect(request).await.unwrap();
    // Short enough that even a 9-bit window reaches back over all of it
    // (zlib matches at most window - 262 bytes back): the second copy shows
    // whether the client kept its context.
    let verse = "Habe nun, ach! Philosophie, Juristerei und Medizin, \
                 und leider auch Theologie durchaus studiert";
    let messages = [
        OwnedMessage::Text(verse.into()),
        OwnedMessage::Text(verse.into()),
        OwnedMessage::Binary((0..=255u8).cycle().take(4096).collect::<Vec<_>>().into()),
        OwnedMessage::Text("κόσμε ".repeat(300)),
        OwnedMessage::Text("x".repeat(1 << 20)),
        OwnedMessage::Text("short".into()),
    ];
    for message in &messages {
        socket.send(message.clone()).await.unwrap();
        assert_eq!(&socket.recv().await.unwrap().unwrap(), message);
    }
    socket.close(CloseCode::NORMAL, "").unwrap();
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode::NORMAL));
    server
        .lines
        .recv_timeout(Duration::from_secs(10))
        .expect("the server reports the connection")
}

/// The data frames the Python server received.
fn data_frames(seen: &serde_json::Value) -> Vec<serde_json::Value> {
    let frames = seen["frames"].as_array().unwrap().iter();
    frames.filter(|f| f["data"] == true).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_server_with_each_deflate_parameter() {
    // (server settings, client config, what must be agreed:
    //  server_no_context_takeover, client_no_context_takeover,
    //  server_max_window_bits, client_max_window_bits)
    type Agreed = (bool, bool, u64, u64);
    let cases: [(&str, DeflateConfig, Agreed); 6] = [
        ("", DeflateConfig::default(), (true, true, 15, 15)),
        (
            "",
            DeflateConfig::default()
                .server_context_takeover(true)
                .client_context_takeover(true),
            (false, false, 15, 15),
        ),
        (
            "",
            DeflateConfig::default().server_max_window_bits(10),
            (true, true, 10, 15),
        ),
        (
            "client_max_window_bits=9",
            DeflateConfig::default().client_context_takeover(true),
            (true, false, 15, 9),
        ),
        (
            "server_no_context_takeover",
            DeflateConfig::default().server_context_takeover(true),
            (true, true, 15, 15),
        ),
        (
            "client_no_context_takeover,server_max_window_bits=11",
            DeflateConfig::default()
                .server_context_takeover(true)
                .client_context_takeover(true),
            (false, true, 11, 15),
        ),
    ];
    for (settings, config, agreed) in cases {
        let server = python_server(&["--deflate", settings]);
        let client = Client::new(Config::default().permessage_deflate(config.compress_min_size(0)));
        let url = format!("ws://127.0.0.1:{}/", server.port);
        let seen = exchange(&server, &client, url).await;
        let n = &seen["negotiated"];
        let got = (
            n["server_no_context_takeover"].as_bool().unwrap(),
            n["client_no_context_takeover"].as_bool().unwrap(),
            n["server_max_window_bits"].as_u64().unwrap_or(15),
            n["client_max_window_bits"].as_u64().unwrap_or(15),
        );
        assert_eq!(
            got, agreed,
            "server {settings:?}, client {config:?}: {seen}"
        );
        let frames = data_frames(&seen);
        assert_eq!(frames.len(), 6, "{seen}");
        assert!(
            frames.iter().all(|f| f["rsv1"] == true),
            "every message is compressed: {seen}"
        );
        let first = frames[0]["wire_len"].as_u64().unwrap();
        let second = frames[1]["wire_len"].as_u64().unwrap();
        if agreed.1 {
            assert_eq!(first, second, "no client context: {seen}");
        } else {
            assert!(second < first / 2, "the client kept its context: {seen}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_server_without_deflate_and_with_a_subprotocol() {
    let server = python_server(&["--protocol", "chat"]);
    let client = Client::new(Config::default().permessage_deflate(DeflateConfig::default()));
    let url = format!("ws://127.0.0.1:{}/", server.port);
    let request = ConnectRequest::new(url.as_str())
        .protocol("other")
        .protocol("chat");
    let (socket, response) = client.connect(request).await.unwrap();
    assert_eq!(response.protocol(), Some("chat"));
    assert!(
        response.deflate().is_none(),
        "the server declined compression"
    );
    drop(socket);
    let seen = server.lines.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(seen["protocol"], "chat");
    assert!(
        seen["offer"]
            .as_str()
            .unwrap()
            .starts_with("permessage-deflate")
    );
    let seen = exchange(&server, &client, ConnectRequest::new(url).protocol("chat")).await;
    assert!(data_frames(&seen).is_empty(), "nothing compressed: {seen}");
}

#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_wss_server() {
    let identity = tls::identity();
    let cert = identity.cert_pem.to_str().unwrap();
    let key = identity.key_pem.to_str().unwrap();
    let server = python_server(&["--tls", cert, key, "--deflate", ""]);
    let config =
        Config::default().permessage_deflate(DeflateConfig::default().compress_min_size(0));
    let client = Client::new(config).tls(tls::client_config());
    let url = format!("wss://localhost:{}/secure", server.port);
    let seen = exchange(&server, &client, url).await;
    let frames = data_frames(&seen);
    assert!(
        frames.len() == 6 && frames.iter().all(|f| f["rsv1"] == true),
        "{seen}"
    );
}

// ---- Fake servers ----

/// A server that reads the upgrade request, then answers with `answer(key)`
/// (the request's `Sec-WebSocket-Key` given) and then `then` bytes; returns
/// what the client sent after that, until it closed.
async fn fake_server(
    answer: impl Fn(&str) -> Vec<u8> + Send + 'static,
) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
    fake_server_in_parts(move |key| vec![answer(key)]).await
}

/// [`fake_server`] whose answer goes out in parts, 50 ms apart.
async fn fake_server_in_parts(
    answer: impl Fn(&str) -> Vec<Vec<u8>> + Send + 'static,
) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        while !request.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if tcp.read(&mut byte).await.unwrap() == 0 {
                return request;
            }
            request.push(byte[0]);
        }
        let text = String::from_utf8(request).unwrap();
        let key = text
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .unwrap()
            .trim()
            .to_owned();
        for (i, part) in answer(&key).into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tcp.write_all(&part).await.unwrap();
        }
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
        rest
    });
    (addr, task)
}

fn switching(key: &str, extra: &str) -> String {
    let accept = rapidws_core::handshake::accept_key(key.as_bytes());
    let accept = std::str::from_utf8(&accept).unwrap();
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n{extra}\r\n"
    )
}

async fn connect_to(addr: SocketAddr, client: &Client) -> Result<client::Response, ConnectError> {
    client
        .connect(format!("ws://{addr}/"))
        .await
        .map(|(_, response)| response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_status_headers_and_body() {
    let (addr, _) = fake_server(|_| {
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Why: not a websocket\r\n\r\nhello".to_vec()
    })
    .await;
    let error = connect_to(addr, &socket_client()).await.unwrap_err();
    let ConnectError::Status(refusal) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(refusal.status, 200);
    assert_eq!(refusal.header("x-why"), Some(&b"not a websocket"[..]));
    assert_eq!(&refusal.body[..], b"hello");
    assert_eq!(error.status(), Some(200));
    // The server's reason is in the message, after the status.
    assert_eq!(
        error.to_string(),
        "the server answered 200 instead of 101: hello"
    );

    // A body longer than what is kept, and one that never comes.
    let (addr, _) = fake_server(|_| {
        let mut answer = b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic\r\nContent-Length: 100000\r\n\r\n".to_vec();
        answer.extend(std::iter::repeat_n(b'b', 100_000));
        answer
    })
    .await;
    let error = connect_to(addr, &socket_client()).await.unwrap_err();
    let ConnectError::Status(refusal) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(refusal.status, 401);
    assert_eq!(refusal.body.len(), client::MAX_REFUSAL_BODY);
    // A line too long to be a reason is left out of the message.
    assert_eq!(error.to_string(), "the server answered 401 instead of 101");
    let (addr, _) = fake_server(|_| {
        b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 10\r\n\r\nabc".to_vec()
    })
    .await;
    let quick = Client::new(Config::default().handshake_timeout(Duration::from_millis(500)));
    let error = connect_to(addr, &quick).await.unwrap_err();
    let ConnectError::Status(refusal) = &error else {
        panic!("{error:?}");
    };
    assert_eq!((refusal.status, &refusal.body[..]), (302, &b"abc"[..]));
    assert_eq!(refusal.header("location"), Some(&b"/elsewhere"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_101s_are_named_errors() {
    type Answer = Box<dyn Fn(&str) -> Vec<u8> + Send>;
    let cases: Vec<(Answer, ClientHandshakeError)> = vec![
        (
            Box::new(|_| switching("not-the-key", "").into_bytes()),
            ClientHandshakeError::BadAccept,
        ),
        (
            Box::new(|key| switching(key, "Sec-WebSocket-Protocol: chat\r\n").into_bytes()),
            ClientHandshakeError::UnofferedProtocol,
        ),
        (
            Box::new(|key| {
                switching(key, "Sec-WebSocket-Extensions: permessage-deflate\r\n").into_bytes()
            }),
            ClientHandshakeError::UnofferedExtension,
        ),
        (
            Box::new(|key| switching(key, "Sec-WebSocket-Extensions: x-custom\r\n").into_bytes()),
            ClientHandshakeError::UnofferedExtension,
        ),
        (
            Box::new(|_| {
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec()
            }),
            ClientHandshakeError::MissingConnectionUpgrade,
        ),
        (
            Box::new(|_| b"SSH-2.0-OpenSSH\r\n\r\n".to_vec()),
            ClientHandshakeError::Malformed,
        ),
        (
            Box::new(|_| {
                let mut head = b"HTTP/1.1 101 Switching Protocols\r\n".to_vec();
                head.extend(
                    std::iter::repeat_n(b"X-Pad: 0123456789\r\n".as_slice(), 1000).flatten(),
                );
                head
            }),
            ClientHandshakeError::TooManyHeaders,
        ),
        (
            Box::new(|_| {
                let mut head = b"HTTP/1.1 101 Switching Protocols\r\nX-Pad: ".to_vec();
                head.extend(std::iter::repeat_n(b'p', 10_000));
                head
            }),
            ClientHandshakeError::HeadTooLarge,
        ),
    ];
    for (answer, expected) in cases {
        let (addr, _) = fake_server(answer).await;
        match connect_to(addr, &socket_client()).await {
            Err(ConnectError::Handshake(e)) => assert_eq!(e, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }
}

/// What a client sends when the server's frames break the protocol: its
/// close frame (masked) with the right code, then nothing.
async fn close_code_for(frames: &[u8], config: Config) -> (u16, Option<CloseCode>) {
    let frames = frames.to_vec();
    let (addr, sent) = fake_server(move |key| {
        let mut answer = switching(key, "").into_bytes();
        answer.extend_from_slice(&frames);
        answer
    })
    .await;
    let (mut socket, _) = Client::new(config)
        .connect(format!("ws://{addr}/"))
        .await
        .unwrap();
    while let Some(Ok(_)) = socket.recv().await {}
    let sent = tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .unwrap()
        .unwrap();
    // One masked close frame: 0x88, 0x80 | len, key, payload.
    assert_eq!(sent[0], 0x88, "{sent:?}");
    assert!(sent[1] & 0x80 != 0, "client frames are masked");
    let len = usize::from(sent[1] & 0x7f);
    let key = &sent[2..6];
    let payload: Vec<u8> = sent[6..6 + len]
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ key[i % 4])
        .collect();
    assert_eq!(sent.len(), 6 + len, "nothing after the close frame");
    (
        u16::from_be_bytes([payload[0], payload[1]]),
        socket.close_code(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_frames_that_break_the_protocol() {
    // A masked frame from the server.
    let masked = [0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2];
    assert_eq!(close_code_for(&masked, Config::default()).await.0, 1002);
    // Garbage after the 101 (a reserved opcode).
    let garbage = [0xff, 0xff, 0xff, 0xff];
    assert_eq!(close_code_for(&garbage, Config::default()).await.0, 1002);
    // A frame over the client's limit.
    let mut big = vec![0x82, 126, 0x08, 0x00];
    big.extend(vec![0u8; 2048]);
    let small = Config::default().max_frame_size(1024);
    assert_eq!(close_code_for(&big, small).await.0, 1009);
    // Invalid UTF-8 in a text message.
    let bad_text = [0x81, 2, 0xc3, 0x28];
    assert_eq!(close_code_for(&bad_text, Config::default()).await.0, 1007);
    // Compressed without permessage-deflate agreed.
    let rsv1 = [0xc1, 1, b'x'];
    assert_eq!(close_code_for(&rsv1, Config::default()).await.0, 1002);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_frames_in_the_same_read_as_the_101() {
    let (addr, _) = fake_server(|key| {
        let mut answer = switching(key, "").into_bytes();
        answer.extend_from_slice(&[0x81, 5]);
        answer.extend_from_slice(b"early");
        answer.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
        answer
    })
    .await;
    let (mut socket, _) = socket_client()
        .connect(format!("ws://{addr}/"))
        .await
        .unwrap();
    assert_eq!(
        socket.recv().await.unwrap().unwrap(),
        OwnedMessage::Text("early".into())
    );
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode::NORMAL));
}

/// `100 Continue` and `103 Early Hints` before the `101` are skipped,
/// whether they come with it or apart from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informational_responses_before_the_101_are_skipped() {
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n\
        HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        .to_vec();
    let opened = |key: &str| {
        let mut answer = switching(key, "").into_bytes();
        answer.extend_from_slice(&[0x81, 2]);
        answer.extend_from_slice(b"hi");
        answer
    };
    for apart in [false, true] {
        let interim = interim.clone();
        let (addr, _) = fake_server_in_parts(move |key| {
            if apart {
                vec![interim.clone(), opened(key)]
            } else {
                vec![[interim.clone(), opened(key)].concat()]
            }
        })
        .await;
        let (mut socket, response) = socket_client()
            .connect(format!("ws://{addr}/"))
            .await
            .unwrap_or_else(|e| panic!("apart: {apart}: {e:?}"));
        assert_eq!(response.protocol(), None);
        assert_eq!(
            socket.recv().await.unwrap().unwrap(),
            OwnedMessage::Text("hi".into()),
            "apart: {apart}"
        );
    }
    // A final status other than 101 after them is still a refusal.
    let (addr, _) = fake_server(|_| {
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"
            .to_vec()
    })
    .await;
    let error = connect_to(addr, &socket_client()).await.unwrap_err();
    let ConnectError::Status(refusal) = &error else {
        panic!("expected a status error, got {error:?}");
    };
    assert_eq!((refusal.status, &refusal.body[..]), (403, &b"no"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_are_named() {
    // Nothing listens.
    let unused = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = unused.local_addr().unwrap();
    drop(unused);
    let error = connect_to(addr, &socket_client()).await.unwrap_err();
    assert!(
        matches!(&error, ConnectError::Connect { addr: a, .. } if *a == addr),
        "{error:?}"
    );

    // A name that does not resolve.
    let error = socket_client()
        .connect("ws://nonexistent.invalid/")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ConnectError::Dns { host, .. } if host == "nonexistent.invalid"),
        "{error:?}"
    );

    // Bad URLs and requests.
    for url in [
        "http://example.com/",
        "ws://exa mple/",
        "ws://x/#frag",
        "example.com",
    ] {
        let error = socket_client().connect(url).await.unwrap_err();
        assert!(matches!(error, ConnectError::Url(_)), "{url}: {error:?}");
    }
    let request = ConnectRequest::new(format!("ws://{addr}/")).header("Sec-WebSocket-Key", "x");
    let error = socket_client().connect(request).await.unwrap_err();
    assert!(matches!(error, ConnectError::Request(_)), "{error:?}");

    // A server that accepts and never answers: the handshake timeout.
    let (silent, _) = fake_server(|_| {
        std::thread::sleep(Duration::from_secs(3));
        Vec::new()
    })
    .await;
    let quick = Client::new(Config::default().handshake_timeout(Duration::from_millis(300)));
    let started = Instant::now();
    let error = connect_to(silent, &quick).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::Timeout(Stage::Handshake)),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // The server closes during the handshake.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = tcp.read(&mut buf).await;
        tcp.write_all(b"HTTP/1.1 101 Swi").await.unwrap();
    });
    let error = connect_to(closing, &socket_client()).await.unwrap_err();
    let ConnectError::Io(io) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(io.kind(), std::io::ErrorKind::UnexpectedEof);
}

/// `client::connect` without a TLS config: without roots in this build,
/// wss says why instead of failing in rustls.
#[cfg(all(
    feature = "rustls",
    not(feature = "webpki-roots"),
    not(feature = "native-roots")
))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_without_roots_says_why() {
    let error = client::connect("wss://127.0.0.1:1/").await.unwrap_err();
    assert!(
        matches!(error, ConnectError::TlsUnavailable(_)),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_client_connections_with_1001() {
    let server = start(Backend::Tokio, Config::default()).await;
    let client = socket_client();
    let (mut a, _) = client.connect(server.url("/")).await.unwrap();
    let (mut b, _) = client.connect(server.url("/")).await.unwrap();
    assert_eq!(client.handle().connections(), 2);
    client.shutdown().await;
    assert!(a.recv().await.is_none() && b.recv().await.is_none());
    assert_eq!(a.close_code(), Some(CloseCode::GOING_AWAY));
    let closes = server.recorder.wait_closes(2).await;
    assert!(closes.iter().all(|(code, _)| *code == 1001), "{closes:?}");
    let error = client.connect(server.url("/")).await.unwrap_err();
    assert!(matches!(error, ConnectError::Closed), "{error:?}");
}

/// gws (Go) as the server, built from the load harness's baseline
/// (`benches/harness/go/cmd/gws`, `-deflate`: no context takeover, every
/// message compressed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_gws_with_compression() {
    let binary = go_program("gws");
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _server = common::Child(
        Command::new(&binary)
            .args(["-addr", &addr.to_string(), "-deflate"])
            .stderr(Stdio::null())
            .spawn()
            .expect("gws starts"),
    );
    let mut ready = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "gws listens");

    let config =
        Config::default().permessage_deflate(DeflateConfig::default().compress_min_size(0));
    let (mut socket, response) = Client::new(config)
        .connect(format!("ws://{addr}/"))
        .await
        .unwrap();
    let params = response.deflate().expect("gws accepted permessage-deflate");
    assert!(params.server_no_context_takeover && params.client_no_context_takeover);
    let messages = [
        OwnedMessage::Text("gws, ".repeat(500)),
        OwnedMessage::Binary((0..=255u8).cycle().take(70_000).collect::<Vec<_>>().into()),
        OwnedMessage::Text("κόσμε".into()),
        OwnedMessage::Binary(vec![7u8; 1 << 20].into()),
    ];
    for message in &messages {
        socket.send(message.clone()).await.unwrap();
        assert_eq!(&socket.recv().await.unwrap().unwrap(), message);
    }
    socket.close(CloseCode(4002), "done").unwrap();
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode(4002)));
    let _ = std::fs::remove_file(&binary);
}

/// `ws://user:password@host/`: the credentials go as `Authorization: Basic`,
/// unless the request brings its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_become_basic_authorization() {
    for (own, expected) in [
        (None, "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
        (Some("Bearer token"), "Authorization: Bearer token"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = tcp.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            tcp.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        let mut request = ConnectRequest::new(format!("ws://Aladdin:open%20sesame@{addr}/"));
        if let Some(own) = own {
            request = request.header("Authorization", own);
        }
        let error = socket_client().connect(request).await.unwrap_err();
        assert_eq!(error.status(), Some(403));
        let request = seen.await.unwrap();
        let authorizations: Vec<_> = request
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .collect();
        assert_eq!(authorizations, [expected], "{request}");
        assert!(
            request.contains(&format!("Host: {addr}\r\n")),
            "no credentials in Host"
        );
    }
}

/// The client's keepalive: pings while the server is quiet, and the idle
/// close (1001) when it answers nothing, bounded by the close timeout, as
/// on a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_pings_and_the_idle_timeout() {
    // A server that reads (and records) everything but never answers.
    let (addr, sent) = fake_server(|key| switching(key, "").into_bytes()).await;
    let config = Config::default()
        .ping_interval(Duration::from_millis(100))
        .idle_timeout(Duration::from_millis(400))
        .close_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let (mut socket, _) = Client::new(config)
        .connect(format!("ws://{addr}/"))
        .await
        .unwrap();
    // The server answers not even the close: after the close timeout the
    // connection fails (1006), which the socket reports once.
    let error = socket.recv().await.unwrap().unwrap_err();
    assert!(error.to_string().contains("1006"), "{error}");
    assert!(socket.recv().await.is_none());
    assert_eq!(socket.close_code(), Some(CloseCode::ABNORMAL));
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "{elapsed:?}");
    // Masked pings (0x89), then the masked close frame (0x88) with 1001.
    let sent = tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .unwrap()
        .unwrap();
    let mut frames = Vec::new();
    let mut rest = &sent[..];
    while rest.len() >= 6 {
        let len = usize::from(rest[1] & 0x7f);
        let key = [rest[2], rest[3], rest[4], rest[5]];
        let payload: Vec<u8> = rest[6..6 + len]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect();
        frames.push((rest[0], payload));
        rest = &rest[6 + len..];
    }
    let pings = frames.iter().filter(|(b0, _)| *b0 == 0x89).count();
    assert!(pings >= 2, "{frames:?}");
    let (last, payload) = frames.last().unwrap();
    assert_eq!(*last, 0x88);
    assert_eq!(payload[..2], 1001u16.to_be_bytes());
}

/// One client used from one runtime and then another (two
/// `#[tokio::test]`s sharing `client::connect`'s client do this): its
/// connection groups ended with the first runtime, and the second
/// runtime's connect starts new ones instead of waiting forever.
#[test]
fn a_client_connects_again_after_its_first_runtime_ended() {
    let serving = tokio::runtime::Runtime::new().unwrap();
    let server = serving.block_on(start(Backend::Tokio, Config::default()));
    let client = socket_client();
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let connect = client.connect(server.url("/"));
            let (mut socket, _) = tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .expect("a connect within 10 s")
                .unwrap();
            let message = OwnedMessage::Text(format!("round {round}"));
            socket.send(message.clone()).await.unwrap();
            assert_eq!(socket.recv().await.unwrap().unwrap(), message);
        });
        drop(runtime);
    }
}
