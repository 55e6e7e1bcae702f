//! docs/deploying.md, run: its configuration blocks are read out of the
//! guide itself (fenced blocks marked `title=NAME`), given this test's ports
//! and paths, and run. A real nginx and a real HAProxy (Debian's packages,
//! installed with apt-get on first use) start with the guide's
//! configurations in front of the `echo` and `notify_bus` examples, on free
//! loopback ports below the ephemeral range, and are stopped by PID when the
//! test ends. Through each: WebSocket echoes over ws and over wss (TLS ends
//! at the proxy, with the guide's openssl certificate), one after the
//! connection sat idle; the Origin check (a page of the public host let in,
//! one of another host refused with 403); the headers rapidws gets (`Host`
//! as the client sent it, `Upgrade`, `Connection`, `X-Forwarded-For`,
//! `X-Forwarded-Proto`); the client's address read from them by a server
//! that trusts the proxy, a forged `X-Forwarded-For` of the client's
//! ignored; subscribers over ws and wss receiving publications
//! POSTed through the proxy; and the guide's systemd start script handing
//! the bus to a successor while the subscribers, behind the proxy, stay
//! connected and go on receiving. The unit itself is checked with
//! `systemd-analyze verify` where that is installed (no systemd runs here),
//! and the WebTransport certificate command is run and its certificate
//! checked.
#![cfg(target_os = "linux")]

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{Child, debian_binary, delivered, example, exits_zero, next};
use futures_util::SinkExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message as WsMessage, client::IntoClientRequest};

/// The guide.
const GUIDE: &str = include_str!("../docs/deploying.md");

/// The guide's fenced block whose info string ends in ` title=NAME` (there
/// must be exactly one), without its fences.
fn block(title: &str) -> String {
    let marker = format!(" title={title}");
    let mut found = None;
    let mut lines = GUIDE.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("```") && line.ends_with(&marker) {
            assert!(found.is_none(), "docs/deploying.md: two blocks {marker}");
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            found = Some(body.join("\n") + "\n");
        }
    }
    found.unwrap_or_else(|| panic!("docs/deploying.md has no block{marker}"))
}

/// `text` with each `from` replaced by its `to`; each `from` must be there,
/// so that a change to the guide cannot leave this test testing something
/// else.
fn substitute(text: &str, pairs: &[(&str, String)]) -> String {
    let mut text = text.to_owned();
    for (from, to) in pairs {
        assert!(
            text.contains(from),
            "a block of docs/deploying.md no longer holds {from:?}: bring tests/deploying.rs \
             up to date with it\n{text}"
        );
        text = text.replace(from, to);
    }
    text
}

/// A fresh directory of this test process's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rapidws-deploying-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .recursive(true)
        .create(&dir)
        .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A free loopback port below the ephemeral range (32768 and up here),
/// where no outgoing connection (the proxies' to their upstreams among
/// them) can take it between this check and the bind of whoever gets it.
fn low_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(2_654_435_761) % 12_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 12_000, "no free port between 20000 and 32000");
        let port = 20_000 + ((start + n * 97) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Waits until `addr` accepts, while `child` runs (at most 10 s); panics
/// with what `log` holds otherwise.
async fn wait_for(what: &str, addr: SocketAddr, child: &mut Child, log: &Path) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} exited ({status}) before listening on {addr}:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    panic!("{what} does not listen on {addr}:\n{log}");
}

/// An example on a low port, quiet but for warnings.
async fn start_example(name: &str, args: &[&str]) -> (Child, SocketAddr) {
    let addr = SocketAddr::from(([127, 0, 0, 1], low_port()));
    let mut child = Child(
        Command::new(example(name))
            .arg("--addr")
            .arg(addr.to_string())
            .args(args)
            .env("RUST_LOG", "error")
            .spawn()
            .unwrap(),
    );
    wait_for(name, addr, &mut child, Path::new("/dev/null")).await;
    (child, addr)
}

/// Runs `script` with `sh -eu` in `dir`; its standard output.
fn sh(script: &str, dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-euc")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "{script}\nfailed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The guide's certificate commands, run with a directory of their own in
/// place of /etc/ssl/rapidws; returns that directory.
fn certificates(name: &str) -> PathBuf {
    debian_binary("/usr/bin/openssl", "openssl");
    let dir = scratch(name);
    let script = substitute(
        &block("certificate"),
        &[("/etc/ssl/rapidws", dir.display().to_string())],
    );
    sh(&script, &dir);
    dir
}

/// A TLS client that trusts the certificate in `cert_pem` (rustls: it
/// would refuse a CA:TRUE one as the server's own).
fn tls_client(cert_pem: &Path) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(cert_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

#[derive(Clone, Copy, Debug)]
enum Proxy {
    Nginx,
    Haproxy,
}

/// A proxy running the guide's configuration: its plain and TLS ports.
struct Front {
    _process: Child,
    ws: SocketAddr,
    wss: SocketAddr,
}

impl Proxy {
    /// Starts the proxy with the guide's configuration, in front of
    /// `upstream`, with the certificates in `certs`.
    async fn front(self, upstream: SocketAddr, certs: &Path, name: &str) -> Front {
        let dir = scratch(&format!("{self:?}-{name}"));
        let ws = SocketAddr::from(([127, 0, 0, 1], low_port()));
        let wss = SocketAddr::from(([127, 0, 0, 1], low_port()));
        let certs = format!("{}/", certs.display());
        let stderr = dir.join("stderr");
        let mut command = match self {
            Proxy::Nginx => {
                let site = substitute(
                    &block("nginx"),
                    &[
                        ("listen 80;", format!("listen {ws};")),
                        ("listen 443 ssl;", format!("listen {wss} ssl;")),
                        ("127.0.0.1:9004", upstream.to_string()),
                        ("/etc/ssl/rapidws/", certs),
                    ],
                );
                // What the guide leaves to the packaged nginx.conf.
                common::nginx_command(&dir, &site)
            }
            Proxy::Haproxy => {
                let binary = debian_binary("/usr/sbin/haproxy", "haproxy");
                let cfg = substitute(
                    &block("haproxy"),
                    &[
                        ("bind :80\n", format!("bind {ws}\n")),
                        ("bind :443 ", format!("bind {wss} ")),
                        ("127.0.0.1:9004", upstream.to_string()),
                        ("/etc/ssl/rapidws/", certs),
                    ],
                );
                let conf = format!("global\n    maxconn 256\n\n{cfg}");
                std::fs::write(dir.join("haproxy.cfg"), conf).unwrap();
                let mut command = Command::new(binary);
                command.arg("-f").arg(dir.join("haproxy.cfg")).arg("-db");
                command
            }
        };
        let mut process = Child(
            command
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("{self:?} starts: {e}")),
        );
        let what = format!("{self:?} in front of {name}");
        wait_for(&what, ws, &mut process, &stderr).await;
        wait_for(&what, wss, &mut process, &stderr).await;
        Front {
            _process: process,
            ws,
            wss,
        }
    }
}

/// The WebSocket handshake at `url` over `stream`, with `Origin: origin`
/// if given: the socket, or the status the proxy passed on.
async fn handshake<S>(stream: S, url: &str, origin: Option<&str>) -> Result<WebSocketStream<S>, u16>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut request = url.into_client_request().unwrap();
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert(tungstenite::http::header::ORIGIN, origin.parse().unwrap());
    }
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::client_async(request, stream),
    )
    .await
    .unwrap_or_else(|_| panic!("{url}: no answer within 10 s"));
    match answer {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(error) => panic!("{url}: {error}"),
    }
}

/// A WebSocket through the proxy's plain port, sent to `localhost`.
async fn ws(
    front: &Front,
    path: &str,
    origin: Option<&str>,
) -> Result<WebSocketStream<TcpStream>, u16> {
    let tcp = TcpStream::connect(front.ws).await.unwrap();
    let url = format!("ws://localhost:{}{path}", front.ws.port());
    handshake(tcp, &url, origin).await
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// TLS to the proxy's TLS port, as `localhost`.
async fn tls(front: &Front, connector: &TlsConnector) -> Tls {
    let tcp = TcpStream::connect(front.wss).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    connector
        .connect(name, tcp)
        .await
        .expect("the TLS handshake")
}

/// A WebSocket through the proxy's TLS port, sent to `localhost`.
async fn wss(
    front: &Front,
    connector: &TlsConnector,
    path: &str,
    origin: Option<&str>,
) -> Result<WebSocketStream<Tls>, u16> {
    let stream = tls(front, connector).await;
    let url = format!("wss://localhost:{}{path}", front.wss.port());
    handshake(stream, &url, origin).await
}

/// Sends `text` and a binary message; both come back.
async fn echoes<S>(socket: &mut WebSocketStream<S>, text: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    socket.send(WsMessage::text(text)).await.unwrap();
    assert_eq!(next(socket).await, WsMessage::text(text));
    let bytes = text.as_bytes().repeat(100);
    socket.send(WsMessage::binary(bytes.clone())).await.unwrap();
    assert_eq!(next(socket).await, WsMessage::binary(bytes));
}

/// Sends one HTTP request on `stream` (to `localhost:port`, asking to
/// close after it) and returns the status and the body.
async fn request<S>(mut stream: S, port: u16, method: &str, path: &str, body: &str) -> (u16, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    request_with(&mut stream, port, method, path, "", body).await
}

/// [`request`] with `extra` header lines.
async fn request_with<S>(
    mut stream: S,
    port: u16,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> (u16, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: text/plain\r\n\
         {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // (A TLS peer that closes without close_notify ends this with an
    // error; what it sent before is kept.)
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("an answer within 10 s");
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("a whole response: {response:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    (status, body.to_owned())
}

/// Publishes `text` to `topic` through the proxy's plain port, or its TLS
/// port with `tls`; returns the bus's count of subscribers reached.
async fn publish(front: &Front, connector: Option<&TlsConnector>, topic: &str, text: &str) -> u64 {
    let path = format!("/publish/{topic}");
    let bearer = format!("Authorization: Bearer {PUBLISH_TOKEN}\r\n");
    let (status, body) = match connector {
        None => {
            let tcp = TcpStream::connect(front.ws).await.unwrap();
            request_with(tcp, front.ws.port(), "POST", &path, &bearer, text).await
        }
        Some(connector) => {
            let stream = tls(front, connector).await;
            request_with(stream, front.wss.port(), "POST", &path, &bearer, text).await
        }
    };
    assert_eq!(status, 200, "{body}");
    delivered(&body)
}

/// Waits until the bus has done what `socket` asked before: its commands
/// are done in order, and an unknown one is answered.
async fn synced<S>(socket: &mut WebSocketStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    socket.send(WsMessage::text("sync")).await.unwrap();
    match next(socket).await {
        WsMessage::Text(text) if text.starts_with("error: unknown command") => {}
        other => panic!("not the answer to an unknown command: {other:?}"),
    }
}

async fn receives<S>(socket: &mut WebSocketStream<S>, text: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    assert_eq!(next(socket).await, WsMessage::text(text));
}

/// The guide's systemd unit, run without systemd: its start script (with
/// this test's paths) and the arguments of its `ExecStart`, each instance
/// with the `RUNTIME_DIRECTORY` systemd would give it.
struct Unit {
    script: PathBuf,
    args: Vec<String>,
    run: PathBuf,
}

impl Unit {
    fn new(name: &str, addr: SocketAddr) -> Unit {
        let dir = scratch(name);
        let run = dir.join("run");
        let unit = block("notify-bus@.service");
        assert!(
            unit.contains("\nRuntimeDirectory=notify-bus/%i\n"),
            "the start script looks for the instances' sockets under /run/notify-bus/"
        );
        let exec = unit
            .lines()
            .find_map(|line| line.strip_prefix("ExecStart="))
            .expect("the unit's ExecStart");
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some("/usr/local/bin/notify-bus-start"));
        assert!(exec.contains(" --addr 127.0.0.1:9004 "), "{exec}");
        let args: Vec<String> = words
            .map(|word| word.replace("127.0.0.1:9004", &addr.to_string()))
            .collect();
        assert!(
            !args.iter().any(|a| a.contains(['%', '$', '"', '\''])),
            "ExecStart has what this test does not expand: {exec}"
        );
        let script = substitute(
            &block("notify-bus-start"),
            &[
                (
                    "/usr/local/bin/notify_bus",
                    example("notify_bus").display().to_string(),
                ),
                ("/run/notify-bus/", format!("{}/", run.display())),
            ],
        );
        let path = dir.join("notify-bus-start");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Unit {
            script: path,
            args,
            run,
        }
    }

    /// Starts instance `instance` as systemd would (its runtime directory
    /// made, mode 0755).
    fn start(&self, instance: &str) -> Child {
        let runtime = self.run.join(instance);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(&runtime)
            .unwrap();
        for dir in [&self.run, &runtime] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Child(
            Command::new(&self.script)
                .args(&self.args)
                .env("RUNTIME_DIRECTORY", &runtime)
                // What the unit's EnvironmentFile gives it.
                .env("NOTIFY_BUS_PUBLISH_TOKEN", PUBLISH_TOKEN)
                .env("RUST_LOG", "error")
                .spawn()
                .unwrap(),
        )
    }
}

/// The publish token the bus takes from its environment, as the guide's
/// `secrets.env` gives it.
const PUBLISH_TOKEN: &str = "a-token-of-thirty-two-characters";

/// A stand-in upstream that records each request head it gets (in lower
/// case: HAProxy sends header names so) and answers 503.
async fn recorder() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    // Bound here, not after `low_port`'s check: between the two another
    // socket may take the port (seen once in the gate as AddrInUse).
    let listener = loop {
        match TcpListener::bind(("127.0.0.1", low_port())).await {
            Ok(listener) => break listener,
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(error) => panic!("binding the recorder: {error}"),
        }
    };
    let addr = listener.local_addr().unwrap();
    let (heads, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = heads.send(String::from_utf8_lossy(&head).to_ascii_lowercase());
                let answer = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\
                              Connection: close\r\n\r\n";
                let _ = tcp.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, received)
}

/// The upgrade request a browser page of the public host sends, through
/// the proxy: what reaches rapidws.
async fn headers_passed(proxy: Proxy, certs: &Path, connector: &TlsConnector) {
    let (upstream, mut heads) = recorder().await;
    let front = proxy.front(upstream, certs, "recorder").await;
    for (scheme, port) in [("http", front.ws.port()), ("https", front.wss.port())] {
        let head = format!(
            "GET /ws?topics=news HTTP/1.1\r\nHost: localhost:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\nOrigin: {scheme}://localhost:{port}\r\n\r\n"
        );
        let (status, _) = if scheme == "http" {
            raw(TcpStream::connect(front.ws).await.unwrap(), &head).await
        } else {
            raw(tls(&front, connector).await, &head).await
        };
        assert_eq!(status, 503, "{proxy:?}, {scheme}: the recorder's answer");
        let mut seen = String::new();
        while !seen.starts_with("get /ws") {
            seen = tokio::time::timeout(Duration::from_secs(10), heads.recv())
                .await
                .expect("the upgrade reached the upstream")
                .unwrap();
        }
        for line in [
            "get /ws?topics=news http/1.1\r\n".to_owned(),
            format!("\r\nhost: localhost:{port}\r\n"),
            "\r\nupgrade: websocket\r\n".to_owned(),
            "\r\nconnection: upgrade\r\n".to_owned(),
            "\r\nx-forwarded-for: 127.0.0.1\r\n".to_owned(),
            format!("\r\nx-forwarded-proto: {scheme}\r\n"),
            format!("\r\norigin: {scheme}://localhost:{port}\r\n"),
        ] {
            assert!(
                seen.contains(&line),
                "{proxy:?}, {scheme}: no {line:?} in what rapidws would get:\n{seen}"
            );
        }
    }
}

/// Sends a raw request head and reads the status of the answer (its head
/// only: nginx keeps the connection open after it).
async fn raw<S>(mut stream: S, head: &str) -> (u16, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let reading = async {
        let mut chunk = [0u8; 1024];
        while !response.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("an answer within 10 s");
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {response:?}"));
    (status, response)
}

/// echo through the proxy, over ws and wss: a page of the public host is
/// let in, one of another host refused with 403, and a connection idle
/// for 3 s still echoes.
async fn echo_through(proxy: Proxy, certs: &Path, connector: &TlsConnector) {
    let (_echo, echo) = start_example("echo", &[]).await;
    let front = proxy.front(echo, certs, "echo").await;
    let same = format!("http://localhost:{}", front.ws.port());
    let same_tls = format!("https://localhost:{}", front.wss.port());
    let mut plain = ws(&front, "/", Some(same.as_str()))
        .await
        .expect("ws, same host");
    let mut secure = wss(&front, connector, "/", Some(same_tls.as_str()))
        .await
        .expect("wss, same host");
    echoes(&mut plain, "over ws").await;
    echoes(&mut secure, "over wss").await;
    // Not from a browser: no Origin, let in.
    let mut tool = ws(&front, "/", None).await.expect("no Origin");
    echoes(&mut tool, "no origin").await;
    for origin in ["http://evil.example", "https://localhost"] {
        assert_eq!(
            ws(&front, "/", Some(origin)).await.err(),
            Some(403),
            "{proxy:?}: {origin} over ws"
        );
        assert_eq!(
            wss(&front, connector, "/", Some(origin)).await.err(),
            Some(403),
            "{proxy:?}: {origin} over wss"
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    echoes(&mut plain, "after 3 s idle").await;
    echoes(&mut secure, "after 3 s idle").await;
}

/// notify_bus behind the proxy, started by the guide's unit (`blue`):
/// subscribers over ws and wss get what is POSTed through the proxy over
/// http and https; then `green` takes over with the start script, `blue`
/// exits 0, and the same subscribers get the next publication.
async fn bus_through(proxy: Proxy, certs: &Path, connector: &TlsConnector) {
    let addr = SocketAddr::from(([127, 0, 0, 1], low_port()));
    let unit = Unit::new(&format!("{proxy:?}-unit"), addr);
    let mut blue = unit.start("blue");
    wait_for("notify_bus (blue)", addr, &mut blue, Path::new("/dev/null")).await;
    let front = proxy.front(addr, certs, "notify_bus").await;

    let origin = format!("http://localhost:{}", front.ws.port());
    let mut plain = ws(&front, "/ws?topics=news", Some(origin.as_str()))
        .await
        .expect("subscribed over ws");
    let origin = format!("https://localhost:{}", front.wss.port());
    let mut secure = wss(&front, connector, "/ws?topics=news", Some(origin.as_str()))
        .await
        .expect("subscribed over wss");
    synced(&mut plain).await;
    synced(&mut secure).await;
    assert_eq!(
        wss(
            &front,
            connector,
            "/ws?topics=news",
            Some("https://evil.example")
        )
        .await
        .err(),
        Some(403)
    );

    // The token came from the environment: a publish without it is refused.
    let tcp = TcpStream::connect(front.ws).await.unwrap();
    let (status, _) = request(tcp, front.ws.port(), "POST", "/publish/news", "no token").await;
    assert_eq!(status, 401);
    assert_eq!(publish(&front, None, "news", "over http").await, 2);
    assert_eq!(
        publish(&front, Some(connector), "news", "over https").await,
        2
    );
    for text in ["over http", "over https"] {
        receives(&mut plain, text).await;
        receives(&mut secure, text).await;
    }

    // A deploy: the other instance takes everything over.
    let started = Instant::now();
    let _green = unit.start("green");
    assert!(
        exits_zero(&mut blue, Duration::from_secs(30)).await,
        "blue exits 0 once green has taken over"
    );
    eprintln!("{proxy:?}: handoff in {:?}", started.elapsed());
    assert_eq!(publish(&front, None, "news", "after the deploy").await, 2);
    receives(&mut plain, "after the deploy").await;
    receives(&mut secure, "after the deploy").await;
}

/// The guide's proxy in front of a server that trusts it
/// (`Config::trust_proxies`, as "The client's address" shows): the server
/// names the client the proxy saw (127.0.0.2 here, port 0: the headers
/// carry none), not the proxy, even when the client sends a forged
/// `X-Forwarded-For` of its own. Without the trust it names the proxy.
async fn clients_address_through(proxy: Proxy, certs: &Path) {
    for trusted in [true, false] {
        let mut config = rapidws::Config::default();
        if trusted {
            config = config.trust_proxies(["127.0.0.1".parse().unwrap()]);
        }
        let server = rapidws::tokio::Server::bind("127.0.0.1:0", common::WhoAmI, config)
            .await
            .unwrap();
        let (upstream, handle) = (server.local_addr().unwrap(), server.handle());
        tokio::spawn(server.serve());
        let front = proxy
            .front(upstream, certs, &format!("whoami-{trusted}"))
            .await;
        for forged in [None, Some("203.0.113.9")] {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let tcp = socket.connect(front.ws).await.unwrap();
            let url = format!("ws://localhost:{}/", front.ws.port());
            let mut request = url.into_client_request().unwrap();
            if let Some(forged) = forged {
                let forged = forged.parse().unwrap();
                request.headers_mut().insert("x-forwarded-for", forged);
            }
            let (mut socket, _) = tokio_tungstenite::client_async(request, tcp)
                .await
                .unwrap_or_else(|e| panic!("{proxy:?}: {e}"));
            let said = next(&mut socket).await.into_text().unwrap();
            let what = format!("{proxy:?}, trusted {trusted}, forged {forged:?}");
            match trusted {
                true => assert_eq!(said.as_str(), "127.0.0.2:0", "{what}"),
                false => assert!(said.starts_with("127.0.0.1:"), "{what}: {said}"),
            }
        }
        handle.shutdown();
    }
}

async fn through(proxy: Proxy) {
    let started = Instant::now();
    let certs = certificates(&format!("{proxy:?}-certs"));
    let connector = tls_client(&certs.join("cert.pem"));
    tokio::join!(
        echo_through(proxy, &certs, &connector),
        bus_through(proxy, &certs, &connector),
        headers_passed(proxy, &certs, &connector),
        clients_address_through(proxy, &certs),
    );
    eprintln!("{proxy:?}: done in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx() {
    through(Proxy::Nginx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy() {
    through(Proxy::Haproxy).await;
}

/// The guide's unit passes `systemd-analyze verify` (its syntax, its
/// settings, its command's path; no systemd runs here to start it), where
/// that is installed.
#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let analyze = Path::new("/usr/bin/systemd-analyze");
    if !analyze.exists() {
        eprintln!("skipped: no {} here", analyze.display());
        return;
    }
    let dir = scratch("unit-verify");
    let script = dir.join("notify-bus-start");
    std::fs::write(&script, block("notify-bus-start")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let unit = substitute(
        &block("notify-bus@.service"),
        &[
            (
                "/usr/local/bin/notify-bus-start",
                script.display().to_string(),
            ),
            (
                "/etc/notify-bus/secrets.env",
                dir.join("secrets.env").display().to_string(),
            ),
        ],
    );
    std::fs::write(dir.join("notify-bus@.service"), unit).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(dir.join("notify-bus@blue.service"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {said}", out.status);
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
}

/// The guide's WebTransport certificate: ECDSA P-256, CA:FALSE, valid now
/// and for less than 14 days; its hash printed.
#[test]
fn the_webtransport_certificate_command() {
    let openssl = debian_binary("/usr/bin/openssl", "openssl");
    let dir = scratch("webtransport");
    let printed = sh(&block("webtransport-certificate"), &dir);
    let hash = printed.trim().rsplit(' ').next().unwrap();
    assert_eq!(hash.len(), 64, "a SHA-256 in hex: {printed}");
    let text = Command::new(&openssl)
        .args(["x509", "-noout", "-text", "-in", "wt-cert.pem"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    for expected in ["id-ecPublicKey", "prime256v1", "CA:FALSE", "DNS:localhost"] {
        assert!(text.contains(expected), "no {expected} in\n{text}");
    }
    let valid_for = |secs: u64| {
        Command::new(&openssl)
            .args(["x509", "-noout", "-in", "wt-cert.pem", "-checkend"])
            .arg(secs.to_string())
            .current_dir(&dir)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(valid_for(60), "not expiring within a minute");
    assert!(!valid_for(14 * 86_400), "expires within 14 days");
}
