//! Shared pieces of the integration tests: a recording handler, server startup
//! per backend, and raw-socket helpers for what a polite client will not send.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rapidws::{
    Accept, CloseCode, Config, Conn, Handler, Message, MessageKind, Reject, Request, ServerHandle,
    ServerHandler,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, protocol::CloseFrame};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub mod centrifugo;
pub mod cut_proxy;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(target_os = "linux")]
pub mod successor;
#[cfg(feature = "rustls")]
pub mod tls;

/// Collects log lines written to it (a `tracing_subscriber` writer).
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Kills a child process when the test ends, however it ends.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The echo example, as `cargo test` builds it (with the run's features)
/// beside the test binaries.
pub fn echo_example() -> std::path::PathBuf {
    example("echo")
}

/// An example, as `cargo test` builds it beside the test binaries.
pub fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples (or run `cargo build --example {name}`)",
        path.display()
    );
    path
}

/// Starts an example with `args` and `--addr` on a free loopback port, and
/// waits until it listens (at most 10 s).
pub async fn start_example(name: &str, args: &[&str]) -> (Child, SocketAddr) {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = Child(
        std::process::Command::new(example(name))
            .args(["--addr", &addr.to_string()])
            .args(args)
            .spawn()
            .unwrap(),
    );
    wait_listening(name, addr).await;
    (child, addr)
}

/// Waits until something listens on `addr` (at most 10 s), or panics
/// naming `what` should listen there.
pub async fn wait_listening(what: &str, addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} does not listen on {addr}");
}

/// A Go program of the load harness (`benches/harness/go/cmd/NAME`),
/// built once per test binary (the Go module proxy provides its modules).
pub fn go_program(name: &str) -> std::path::PathBuf {
    go_build("benches/harness/go", &format!("./cmd/{name}"), name, &[])
}

/// The Go main package `package` of the module in `module` (a folder of
/// the repository), built with `flags` as `name` once per test binary.
pub fn go_build(module: &str, package: &str, name: &str, flags: &[&str]) -> std::path::PathBuf {
    // One build at a time (tests run in parallel).
    static BUILDING: Mutex<()> = Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("rapidws-go-{}", std::process::id()));
    let binary = dir.join(name);
    if !binary.exists() {
        let status = std::process::Command::new("go")
            .args(["build", "-trimpath"])
            .args(flags)
            .arg("-o")
            .arg(&binary)
            .arg(package)
            .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(module))
            .status()
            .expect("go runs");
        assert!(status.success(), "go build of {name} failed");
    }
    binary
}

/// The backends the tests run against.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Tokio,
    #[cfg(all(target_os = "linux", feature = "uring"))]
    Uring,
    /// The stream driver over plain `TcpStream`s the test accepts.
    Stream,
    /// The tokio server with TLS (the stream driver over rustls); the tests'
    /// plain connections reach it through a TLS bridge (`tls::bridge`).
    #[cfg(feature = "rustls")]
    Tls,
    /// The io_uring server with TLS (rustls inside the reactor), reached
    /// through a TLS bridge like `Tls`.
    #[cfg(all(target_os = "linux", feature = "uring", feature = "rustls"))]
    UringTls,
}

impl Backend {
    /// The socket servers: tokio's and (on Linux, with `uring`) io_uring's.
    pub fn sockets() -> Vec<Backend> {
        vec![
            Backend::Tokio,
            #[cfg(all(target_os = "linux", feature = "uring"))]
            Backend::Uring,
        ]
    }

    /// The socket servers and the stream driver, all over plain TCP.
    pub fn plain() -> Vec<Backend> {
        let mut backends = Backend::sockets();
        backends.push(Backend::Stream);
        backends
    }
}

/// Generates one `#[tokio::test]` per backend for each listed test function
/// (`async fn name(backend: Backend)`), so every test runs on every backend.
/// (The io_uring server runs on threads of its own; the test's runtime only
/// drives the clients.)
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod tokio_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Tokio).await
                }
            )*
        }

        #[cfg(all(target_os = "linux", feature = "uring"))]
        mod uring_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Uring).await
                }
            )*
        }
        mod stream_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Stream).await
                }
            )*
        }

        #[cfg(feature = "rustls")]
        mod tls_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Tls).await
                }
            )*
        }

        #[cfg(all(target_os = "linux", feature = "uring", feature = "rustls"))]
        mod uring_tls_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::UringTls).await
                }
            )*
        }
    };
}

/// What the handler saw, in order, per connection id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Open(u64),
    Message(u64, String),
    Drain(u64),
    Close(u64, u16, String),
}

#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<Seen>>,
    /// Every connection opened, for `broadcast`.
    pub conns: Mutex<Vec<Conn>>,
    /// Messages the `push` and `push-text` tasks have queued so far.
    pub pushed: std::sync::atomic::AtomicUsize,
}

impl Recorder {
    pub fn push(&self, seen: Seen) {
        self.seen.lock().unwrap().push(seen);
    }

    pub fn closes(&self) -> Vec<(u16, String)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|s| match s {
                Seen::Close(_, code, reason) => Some((*code, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Waits (up to 5 s) until `n` closes were recorded.
    pub async fn wait_closes(&self, n: usize) -> Vec<(u16, String)> {
        if eventually(Duration::from_secs(5), || self.closes().len() >= n).await {
            return self.closes();
        }
        panic!("expected {n} closes, saw {:?}", self.seen.lock().unwrap());
    }

    /// Whether something recorded so far matches.
    pub fn saw(&self, matches: impl Fn(&Seen) -> bool) -> bool {
        self.seen.lock().unwrap().iter().any(matches)
    }
}

/// The test handler's per-connection state: messages seen, and (for the path
/// `/panic-on-drop`) a `Drop` that panics, as a buggy application's might.
#[derive(Default)]
pub struct State {
    pub count: u32,
    panic_on_drop: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        if self.panic_on_drop && !std::thread::panicking() {
            panic!("connection state panicked on drop, on purpose");
        }
    }
}

/// Echoes messages, and obeys a few text commands:
/// `close CODE REASON`, `panic`, `spawn N` (N messages sent from another task),
/// `ping`, `flood N SIZE` (N binary messages of SIZE bytes, counting refusals),
/// `broadcast WORD` (WORD sent to every open connection), `push N SIZE` and
/// `push-text N SIZE` (a task sends N messages of SIZE bytes as the reader
/// makes room, each starting with its number: see `push_payload`),
/// `req ...` (answered with `Conn::reply`: the same text, then ` after K`,
/// K the pushes queued by then), `bye` (the reply `last`, then a close),
/// `note ...` (recorded, not answered).
pub struct TestHandler {
    pub recorder: Arc<Recorder>,
    /// Where `spawn` starts its task: callbacks on the io_uring backend run
    /// outside any runtime.
    pub runtime: tokio::runtime::Handle,
}

impl Handler for TestHandler {
    type State = State;

    fn on_open(&self, conn: &Conn, _: &mut State) {
        self.recorder.push(Seen::Open(conn.id()));
        self.recorder.conns.lock().unwrap().push(conn.clone());
    }

    fn on_message(&self, conn: &Conn, state: &mut State, message: Message<'_>) {
        state.count += 1;
        let count = state.count;
        let text = message.as_text().unwrap_or("");
        let mut words = text.split(' ');
        match (words.next(), words.next(), words.next()) {
            (Some("close"), Some(code), reason) => {
                self.recorder
                    .push(Seen::Message(conn.id(), text.to_owned()));
                let code: u16 = code.parse().unwrap();
                conn.close(CloseCode(code), reason.unwrap_or("")).unwrap();
            }
            (Some("panic"), None, None) => panic!("on_message panicked on purpose"),
            (Some("spawn"), Some(n), None) => {
                let n: usize = n.parse().unwrap();
                let conn = conn.clone();
                self.runtime.spawn(async move {
                    for i in 0..n {
                        conn.send_text(&format!("from task {i}")).unwrap();
                        if i % 7 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                });
            }
            (Some("broadcast"), Some(word), None) => {
                for other in self.recorder.conns.lock().unwrap().iter() {
                    let _ = other.send_text(word);
                }
            }
            (Some("ping"), None, None) => conn.ping(b"server ping").unwrap(),
            (Some(kind @ ("push" | "push-text")), Some(n), Some(size)) => {
                let (n, size): (usize, usize) = (n.parse().unwrap(), size.parse().unwrap());
                let kind = if kind == "push" {
                    MessageKind::Binary
                } else {
                    MessageKind::Text
                };
                let (conn, recorder) = (conn.clone(), self.recorder.clone());
                self.runtime.spawn(async move {
                    for i in 0..n {
                        let payload = push_payload(kind, i, size);
                        if let Err(error) = conn.send_when_ready(kind, payload).await {
                            let ended = format!("push ended after {i}: {error}");
                            recorder.push(Seen::Message(conn.id(), ended));
                            return;
                        }
                        recorder
                            .pushed
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    recorder.push(Seen::Message(conn.id(), format!("pushed {n}")));
                });
            }
            (Some("req"), _, _) => {
                let pushed = self
                    .recorder
                    .pushed
                    .load(std::sync::atomic::Ordering::SeqCst);
                let reply = format!("{text} after {pushed}");
                if let Err(error) = conn.reply(Message::Text(&reply)) {
                    self.recorder
                        .push(Seen::Message(conn.id(), format!("reply failed: {error}")));
                }
            }
            (Some("bye"), None, None) => {
                conn.reply(Message::Text("last")).unwrap();
                conn.close(CloseCode::NORMAL, "bye").unwrap();
            }
            (Some("count"), None, None) => conn.send_text(&count.to_string()).unwrap(),
            (Some("note"), _, _) => self
                .recorder
                .push(Seen::Message(conn.id(), text.to_owned())),
            (Some("flood-and-close"), Some(n), Some(size)) => {
                let (n, size): (usize, usize) = (n.parse().unwrap(), size.parse().unwrap());
                let payload = vec![0xCD; size];
                for _ in 0..n {
                    let _ = conn.send_binary(&payload);
                }
                conn.close(CloseCode::POLICY_VIOLATION, "slow consumer")
                    .unwrap();
            }
            (Some("flood"), Some(n), Some(size)) => {
                let (n, size): (usize, usize) = (n.parse().unwrap(), size.parse().unwrap());
                let payload = vec![0xAB; size];
                let refused = (0..n)
                    .filter(|_| conn.send_binary(&payload).is_err())
                    .count();
                self.recorder
                    .push(Seen::Message(conn.id(), format!("refused {refused}")));
            }
            _ => {
                if let Err(error) = conn.send(message) {
                    self.recorder
                        .push(Seen::Message(conn.id(), format!("echo failed: {error}")));
                }
            }
        }
    }

    fn on_close(&self, conn: &Conn, _: &mut State, code: CloseCode, reason: &str) {
        self.recorder
            .push(Seen::Close(conn.id(), code.0, reason.to_owned()));
    }

    fn on_drain(&self, conn: &Conn, _: &mut State) {
        self.recorder.push(Seen::Drain(conn.id()));
    }
}

impl ServerHandler for TestHandler {
    fn on_upgrade(&self, request: &Request<'_>, accept: &mut Accept) -> Result<State, Reject> {
        match request.path() {
            "/reject" => return Err(Reject::forbidden("not here")),
            "/panic" => panic!("upgrade hook panicked on purpose"),
            "/panic-on-drop" => {
                return Ok(State {
                    count: 0,
                    panic_on_drop: true,
                });
            }
            "/bad-protocol" => {
                accept.protocol("not-offered");
            }
            "/no-deflate" => {
                accept.permessage_deflate(false);
            }
            "/small-messages" => {
                accept.max_message_size(100).max_frame_size(100);
            }
            _ => {
                if request.protocols().any(|p| p == "chat") {
                    accept.protocol("chat");
                }
            }
        }
        Ok(State::default())
    }
}

/// Echoes every message and takes every upgrade; with a page, answers
/// `GET /` with it (HTML).
pub struct Echo {
    pub page: Option<&'static str>,
}

impl Handler for Echo {
    type State = ();

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for Echo {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }

    fn on_http(&self, request: &Request<'_>) -> Option<rapidws::HttpResponse> {
        let page = self.page.filter(|_| request.path() == "/")?;
        Some(rapidws::HttpResponse::new(
            200,
            "text/html; charset=utf-8",
            page,
        ))
    }
}

/// The `i`th message of a `push` (binary: `i` as 4 big-endian bytes, then
/// zeros) or `push-text` (`push i `, then letters from a generator seeded
/// with `i`, as tests/interop/push_client.py makes them), `size` bytes (or
/// the prefix, if longer).
pub fn push_payload(kind: MessageKind, i: usize, size: usize) -> rapidws::Bytes {
    match kind {
        MessageKind::Binary => {
            let mut payload = vec![0u8; size.max(4)];
            payload[..4].copy_from_slice(&(i as u32).to_be_bytes());
            payload.into()
        }
        MessageKind::Text => {
            // Pseudo-random letters: they compress (to about 60%), but not
            // to nothing, so pushes fill the queue even when compressed.
            let mut text = format!("push {i} ");
            let mut x = i as u32;
            while text.len() < size {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345) & 0x7fff_ffff;
                text.push(char::from(b'a' + ((x >> 16) % 26) as u8));
            }
            text.into()
        }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    pub recorder: Arc<Recorder>,
    pub served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// With TLS: the wss server's own address (`addr` is the bridge's).
    pub tls_addr: Option<SocketAddr>,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    pub async fn client(&self) -> Client {
        tokio_tungstenite::connect_async(self.url("/"))
            .await
            .expect("handshake")
            .0
    }
}

pub async fn start(backend: Backend, config: Config) -> TestServer {
    let recorder = Arc::new(Recorder::default());
    let handler = TestHandler {
        recorder: recorder.clone(),
        runtime: tokio::runtime::Handle::current(),
    };
    serve(backend, handler, config, recorder).await
}

/// Starts a server on `backend` with any handler; `recorder` is the one
/// the handler records into, if it does (else a fresh one).
pub async fn serve<H: ServerHandler>(
    backend: Backend,
    handler: H,
    config: Config,
    recorder: Arc<Recorder>,
) -> TestServer {
    match backend {
        Backend::Tokio => {
            let server = rapidws::tokio::Server::bind("127.0.0.1:0", handler, config)
                .await
                .expect("bind");
            TestServer {
                addr: server.local_addr().unwrap(),
                handle: server.handle(),
                recorder,
                served: tokio::spawn(server.serve()),
                tls_addr: None,
            }
        }

        #[cfg(all(target_os = "linux", feature = "uring"))]
        Backend::Uring => serve_uring(handler, config, |server| server.threads(2), recorder),
        Backend::Stream => {
            let server = rapidws::stream::Server::new(handler, config);
            // The servers' own backlog (4096): with a short one, a flood of
            // connects fills it faster than any accept loop drains it, and
            // each SYN dropped meanwhile waits a second for its retry.
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let listener = socket.listen(4096).unwrap();
            let addr = listener.local_addr().unwrap();
            let handle = server.handle();
            let served = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        biased;
                        () = server.shutdown_requested() => break,
                        accepted = listener.accept() => {
                            let Ok((stream, peer)) = accepted else { continue };
                            let _ = stream.set_nodelay(true);
                            tokio::spawn(server.serve(stream, peer, &[]));
                        }
                    }
                }
                drop(listener);
                server.shutdown().await;
                Ok(())
            });
            TestServer {
                addr,
                handle,
                recorder,
                served,
                tls_addr: None,
            }
        }

        #[cfg(feature = "rustls")]
        Backend::Tls => {
            let server = rapidws::tokio::Server::bind("127.0.0.1:0", handler, config)
                .await
                .expect("bind")
                .tls(tls::server_config());
            let tls_addr = server.local_addr().unwrap();
            let (addr, bridge) = tls::bridge(tls_addr).await;
            let handle = server.handle();
            let served = tokio::spawn(async move {
                let served = server.serve().await;
                // Not listening any more, on either port.
                bridge.abort();
                let _ = bridge.await;
                served
            });
            TestServer {
                addr,
                handle,
                recorder,
                served,
                tls_addr: Some(tls_addr),
            }
        }

        #[cfg(all(target_os = "linux", feature = "uring", feature = "rustls"))]
        Backend::UringTls => {
            let tweak =
                |server: rapidws::uring::Server<H>| server.threads(2).tls(tls::server_config());
            let mut server = serve_uring(handler, config, tweak, recorder);
            let tls_addr = server.addr;
            let (addr, bridge) = tls::bridge(tls_addr).await;
            let served = std::mem::replace(&mut server.served, tokio::spawn(async { Ok(()) }));
            server.served = tokio::spawn(async move {
                let served = served
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                bridge.abort();
                let _ = bridge.await;
                served
            });
            server.addr = addr;
            server.tls_addr = Some(tls_addr);
            server
        }
    }
}

/// Starts an io_uring server, set up by `tweak`, on threads of its own.
#[cfg(all(target_os = "linux", feature = "uring"))]
pub async fn start_uring(
    config: Config,
    tweak: impl FnOnce(rapidws::uring::Server<TestHandler>) -> rapidws::uring::Server<TestHandler>,
) -> TestServer {
    let recorder = Arc::new(Recorder::default());
    let handler = TestHandler {
        recorder: recorder.clone(),
        runtime: tokio::runtime::Handle::current(),
    };
    serve_uring(handler, config, tweak, recorder)
}

/// [`start_uring`] with any handler.
#[cfg(all(target_os = "linux", feature = "uring"))]
pub fn serve_uring<H: ServerHandler>(
    handler: H,
    config: Config,
    tweak: impl FnOnce(rapidws::uring::Server<H>) -> rapidws::uring::Server<H>,
    recorder: Arc<Recorder>,
) -> TestServer {
    let server = rapidws::uring::Server::bind("127.0.0.1:0", handler, config).expect("bind");
    let server = tweak(server);
    let (done, served) = tokio::sync::oneshot::channel();
    let addr = server.local_addr().unwrap();
    let handle = server.handle();
    std::thread::spawn(move || done.send(server.serve()));
    TestServer {
        addr,
        handle,
        recorder,
        served: tokio::spawn(async move {
            served
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("serve thread died")))
        }),
        tls_addr: None,
    }
}

impl Drop for TestServer {
    /// Ends the server with the test (the io_uring server's threads would
    /// outlive the test's runtime otherwise).
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// Reads the next message that is not a ping or pong, with a timeout.
pub async fn next<S>(client: &mut WebSocketStream<S>) -> tungstenite::Message
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("a message within 10 s")
            .expect("stream not ended")
            .expect("no protocol error");
        if !matches!(
            message,
            tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_)
        ) {
            return message;
        }
    }
}

/// Reads until the server's close frame and returns its code and reason.
pub async fn expect_close(client: &mut Client) -> (u16, String) {
    match next(client).await {
        tungstenite::Message::Close(Some(CloseFrame { code, reason })) => {
            (u16::from(code), reason.as_str().to_owned())
        }
        other => panic!("expected a close frame, got {other:?}"),
    }
}

/// Sends `text` and, at once, a close (1000), as a client that says its
/// last word and leaves does; then reads to the end. Returns the texts that
/// came back before the server's close, and that close's code (`None` if
/// the connection ended without one).
pub async fn say_and_leave<S>(
    client: &mut WebSocketStream<S>,
    text: &str,
) -> (Vec<String>, Option<u16>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client.feed(tungstenite::Message::text(text)).await.unwrap();
    client
        .send(tungstenite::Message::Close(Some(CloseFrame {
            code: 1000.into(),
            reason: "".into(),
        })))
        .await
        .unwrap();
    let mut texts = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("the server answers within 10 s");
        match message {
            Some(Ok(tungstenite::Message::Text(text))) => texts.push(text.as_str().to_owned()),
            Some(Ok(tungstenite::Message::Close(frame))) => {
                return (texts, frame.map(|frame| u16::from(frame.code)));
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return (texts, None),
        }
    }
}

pub async fn send_text(client: &mut Client, text: &str) {
    client
        .send(tungstenite::Message::text(text))
        .await
        .expect("send");
}

/// A typical upgrade request for `path`, with an optional extra header line.
pub fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

/// Sends `request` on a raw socket and returns everything the server sent
/// before it closed the connection.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_to_close(&mut stream).await
}

pub async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response));
    match read.await {
        Ok(Ok(_)) => {}
        // A reset after the response still leaves the response readable here.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(Err(e)) => panic!("read failed: {e}"),
        Err(_) => panic!(
            "server did not close within 10 s; got {:?}",
            String::from_utf8_lossy(&response)
        ),
    }
    response
}

/// Sends `head` and reads the response: to the end of the connection, or
/// to the end of the head for a `101`.
pub async fn http_exchange(addr: SocketAddr, head: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let reading = async {
        let mut chunk = [0u8; 4096];
        loop {
            let Ok(n) = stream.read(&mut chunk).await else {
                return;
            };
            response.extend_from_slice(&chunk[..n]);
            let upgraded = response.starts_with(b"HTTP/1.1 101")
                && response.windows(4).any(|w| w == b"\r\n\r\n");
            if n == 0 || upgraded {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the response within 10 s");
    String::from_utf8_lossy(&response).into_owned()
}

/// An upgrade request head for `path` (RFC 6455's sample key), with
/// `extra` header lines; it asks the server to close after answering.
pub fn upgrade_head(method: &str, path: &str, version: &str, extra: &str) -> String {
    format!(
        "{method} {path} {version}\r\nHost: localhost\r\nUpgrade: websocket\r\n\
         Connection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
    )
}

/// Sends an upgrade request for `path` and, in the same write, a masked
/// text frame (which an HTTP server reads with the request), and expects
/// the `101`, then the frame echoed.
pub async fn a_frame_sent_with_the_request_is_answered(addr: SocketAddr, path: &str) {
    let text = b"sent with the request";
    let mut request = upgrade_head("GET", path, "HTTP/1.1", "Sec-WebSocket-Version: 13\r\n")
        .replace("Upgrade, close", "Upgrade")
        .into_bytes();
    request.extend(client_frame(true, 0x1, text));
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(&request).await.unwrap();
    let echo = [&[0x81, text.len() as u8][..], text].concat();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 1024];
        while !got.windows(echo.len()).any(|w| w == echo) {
            let n = raw.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("the echo within 10 s");
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

/// Opens 20 more connections to `url` (servers that greet first when
/// `greeted`), echoes a text on each, and checks that the current runtime
/// holds no more tasks than before once the ending ones (an HTTP server's,
/// for one) went: connections served in groups cost no task each. Then
/// every connection echoes again.
pub async fn connections_cost_no_task(url: &str, greeted: bool) {
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = alive();
    let mut clients = Vec::new();
    for i in 0..20 {
        let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        if greeted {
            next(&mut client).await;
        }
        client
            .send(tungstenite::Message::text(format!("{i}")))
            .await
            .unwrap();
        assert_eq!(
            next(&mut client).await,
            tungstenite::Message::text(format!("{i}"))
        );
        clients.push(client);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive() > before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        alive() <= before,
        "{} tasks alive with 20 more connections, {before} before",
        alive()
    );
    for client in &mut clients {
        client
            .send(tungstenite::Message::text("still"))
            .await
            .unwrap();
        assert_eq!(next(client).await, tungstenite::Message::text("still"));
    }
}

/// `GET /healthz` answers 200 `ok`.
pub async fn assert_healthy(addr: SocketAddr) {
    let health = http_exchange(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
}

/// Opens a raw, upgraded connection (the 101 is read and checked).
pub async fn raw_upgraded(addr: SocketAddr) -> TcpStream {
    raw_upgraded_with(addr, "").await.0
}

/// Opens a raw, upgraded connection whose request carries the header lines
/// `extra`; returns it with the `101` response head.
pub async fn raw_upgraded_with(addr: SocketAddr, extra: &str) -> (TcpStream, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    upgrade_raw(stream, extra).await
}

/// Sends an upgrade request with the header lines `extra` on `stream` and
/// reads the `101`; returns the stream, upgraded, with the response head.
pub async fn upgrade_raw(mut stream: TcpStream, extra: &str) -> (TcpStream, String) {
    stream
        .write_all(upgrade_request("/", extra).as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    (stream, head)
}

/// Reads an HTTP response head, byte by byte (nothing after it is taken).
pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).expect("an ASCII head")
}

/// Waits (at most `within`) for `child` to exit; true if it exited 0.
pub async fn exits_zero(child: &mut Child, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status.success();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("still running {within:?} after it was told to end");
}

/// A masked client frame.
pub fn client_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let key = [0xA1, 0xB2, 0xC3, 0xD4];
    let mut out = vec![(u8::from(fin) << 7) | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&key);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    out
}

/// Parses the server frames in `bytes` (unmasked) as (opcode, payload).
pub fn server_frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let opcode = bytes[at] & 0x0F;
        assert_eq!(bytes[at + 1] & 0x80, 0, "server frames are not masked");
        let (len, header) = match bytes[at + 1] & 0x7F {
            126 => (
                u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize,
                4,
            ),
            127 => {
                let mut be = [0u8; 8];
                be.copy_from_slice(&bytes[at + 2..at + 10]);
                (u64::from_be_bytes(be) as usize, 10)
            }
            n => (n as usize, 2),
        };
        let start = at + header;
        frames.push((opcode, bytes[start..start + len].to_vec()));
        at = start + len;
    }
    frames
}

/// The close code of the last frame in `bytes`, which must be a close frame.
pub fn close_code_of(bytes: &[u8]) -> u16 {
    let frames = server_frames(bytes);
    let (opcode, payload) = frames.last().expect("at least one frame");
    assert_eq!(*opcode, 0x8, "last frame is a close frame");
    u16::from_be_bytes([payload[0], payload[1]])
}

/// Checks `done` every 10 ms until it holds (true) or `within` has passed
/// (false): for what the server does in its own time.
pub async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// File descriptors this process has open.
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// Sets this process's soft limit on open files (`None`: up to the hard
/// limit); returns the old soft limit.
pub fn set_soft_limit(soft: Option<u64>) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let old = limit.rlim_cur;
        limit.rlim_cur = soft.unwrap_or(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        old
    }
}

/// This process's resident set size, in bytes.
pub fn resident_bytes() -> u64 {
    resident_in("/proc/self/status")
}

/// `VmRSS` of the `/proc/<pid>/status` file at `status`, in bytes.
fn resident_in(status: &str) -> u64 {
    let text = std::fs::read_to_string(status).unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("VmRSS in {status}"));
    kib * 1024
}

/// A program from Debian's packages: `path` once `package` is installed
/// (with apt-get, the first time; one install at a time, since tests run in
/// parallel).
pub fn debian_binary(path: &str, package: &str) -> std::path::PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let path = std::path::PathBuf::from(path);
    let _one_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !path.exists() {
        eprintln!("installing {package} with apt-get");
        let run = |args: &[&str]| {
            let status = std::process::Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .expect("apt-get runs");
            assert!(status.success(), "apt-get {args:?} failed: {status}");
        };
        run(&["update", "-qq"]);
        run(&["install", "-y", "-qq", package]);
    }
    assert!(
        path.exists(),
        "{} after installing {package}",
        path.display()
    );
    path
}

/// The resident memory of a child process (an example under test).
pub fn resident_of(child: &Child) -> u64 {
    resident_in(&format!("/proc/{}/status", child.0.id()))
}

/// A free loopback port below 32768 (free for TCP and UDP when asked: bind
/// it soon), for a server a test starts in another process.
///
/// Not port 0's choice: the kernel hands those out from the ephemeral range
/// (32768 and up here), where any connection the tests open meanwhile may
/// take the port as its own before the child binds it. Below that range
/// only a listener takes a port. Each test process walks its own stretch
/// (seeded by its PID), so two binaries running at once rarely try the
/// same one, and a port is checked before it is given.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
        let _ = NEXT.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FIRST} and {}", FIRST + SPAN);
}

/// nginx with `site` (its `server` blocks) and nothing else of its own:
/// one process (killed by its PID), its files and logs in `dir`.
pub fn nginx_command(dir: &std::path::Path, site: &str) -> std::process::Command {
    let binary = debian_binary("/usr/sbin/nginx", "nginx");
    let d = dir.display();
    let conf = format!(
        "master_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    \
         proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
         uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\n{site}}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let mut command = std::process::Command::new(binary);
    command
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .args(["-g", "daemon off;"]);
    command
}

/// A handler that says the peer's address (`Conn::peer_addr`) as the
/// connection's first message, then echoes: what the tests behind proxies
/// ask.
pub struct WhoAmI;

impl Handler for WhoAmI {
    type State = ();

    fn on_open(&self, conn: &Conn, _: &mut ()) {
        let _ = conn.send_text(&conn.peer_addr().to_string());
    }

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for WhoAmI {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }
}

/// A free port whose neighbour `offset` above is free too, both below the
/// ephemeral range: a Redis Cluster node's (its cluster bus listens on
/// the port + 10000).
pub fn free_port_with(offset: u16) -> u16 {
    loop {
        let port = free_port();
        let Some(other) = port.checked_add(offset).filter(|p| *p < 32_768) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", other)).is_ok() {
            return port;
        }
    }
}

/// The Python of tests/interop/.venv, with `websockets` installed by
/// tests/interop/setup.sh on first use.
pub fn python() -> &'static std::path::PathBuf {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/setup.sh");
        let out = std::process::Command::new("bash")
            .arg(setup)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "tests/interop/setup.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The `delivered` count of notify_bus's answer to `POST /publish/...`
/// (`{"delivered":N,"epoch":"...","offset":O}`).
pub fn delivered(answer: &str) -> u64 {
    let value: serde_json::Value =
        serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    value["delivered"]
        .as_u64()
        .unwrap_or_else(|| panic!("no delivered count: {answer}"))
}

/// Reads one HTTP response from a connection that may carry more: its
/// head, then `Content-Length` bytes of body (none for `head_only`, the
/// answer to a `HEAD`). `None` if the server closed before a response.
pub async fn read_response<R>(reader: &mut R, head_only: bool) -> Option<(String, String)>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut head))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        if read == 0 {
            return None;
        }
    }
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .parse()
        .unwrap();
    let mut body = vec![0; if head_only { 0 } else { length }];
    reader.read_exact(&mut body).await.unwrap();
    Some((head, String::from_utf8(body).unwrap()))
}

/// The next `n` deliveries (epoch, offset, data) a notify_bus subscriber
/// with `positions=1` gets; anything else fails, and so does 20 s of
/// nothing.
pub async fn deliveries<S>(client: &mut WebSocketStream<S>, n: usize) -> Vec<(String, u64, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut got = Vec::new();
    while got.len() < n {
        let message = tokio::time::timeout(Duration::from_secs(20), client.next())
            .await
            .expect("a delivery within 20 s");
        let Some(Ok(tungstenite::Message::Text(text))) = message else {
            panic!("not a delivery: {message:?}");
        };
        let delivery: serde_json::Value = serde_json::from_str(&text).unwrap();
        got.push((
            delivery["epoch"].as_str().expect(&text).to_owned(),
            delivery["offset"].as_u64().expect(&text),
            delivery["data"].as_str().expect(&text).to_owned(),
        ));
    }
    got
}
