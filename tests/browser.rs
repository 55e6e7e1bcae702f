//! A real browser: headless Chromium (Debian's `chromium`, installed here
//! with apt-get if it is missing) opens the demo page over https from a
//! self-signed certificate (`--ignore-certificate-errors`) in its self-test
//! mode: on each path it exchanges text (multi-byte UTF-8, empty, 72 KB) and
//! binary messages up to 1 MiB, checks every echo, requires
//! permessage-deflate in `ws.extensions`, and closes with 4000. The test
//! reads the page's verdict over the DevTools protocol (a WebSocket too),
//! polling `#verdict` with `Runtime.evaluate`: a DOM dump with a virtual
//! time budget would let the page's timers run ahead of its sockets.
//!
//! Against `axum_echo --deflate` (`/ws` and `/stream`) and the echo
//! example's `--http-fallback`; and the notify_bus demo page's self-test:
//! a refused subscription is shown as an error (not as a delivery, not in
//! the subscribed list), and a delivery is shown with its topic and offset;
//! the same page loaded through a proxy that cuts its connections while
//! the test publishes shows every offset once, in order (it resumes with
//! `clients/js/rapidws-bus.mjs`); and a page of another origin refused
//! (403) unless its origin is allowed. Centrifugo's JavaScript SDK (its
//! browser bundle) on a page of another origin, through the same kind of
//! proxy against centrifugo_compat: every publication once and in order,
//! recovered after every cut.
#![cfg(all(feature = "axum", feature = "rustls"))]

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Chromium's path, installed from Debian's packages on first use.
fn chromium() -> PathBuf {
    debian_binary("/usr/bin/chromium", "chromium")
}

/// A page open in headless Chromium, read over the DevTools protocol.
struct Page {
    cdp: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    id: u64,
    profile: PathBuf,
    _browser: Child,
}

impl Page {
    /// Opens `url` in a headless Chromium of its own.
    async fn open(url: &str) -> Page {
        let port = free_port();
        let profile =
            std::env::temp_dir().join(format!("rapidws-chromium-{}-{port}", std::process::id()));
        let browser = Child(
            std::process::Command::new(chromium())
                .args([
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--ignore-certificate-errors",
                    "--remote-debugging-address=127.0.0.1",
                ])
                .arg(format!("--remote-debugging-port={port}"))
                .arg(format!("--user-data-dir={}", profile.display()))
                .arg(url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("chromium starts"),
        );
        let devtools: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let target = page_target(devtools, url).await;
        let (cdp, _) = tokio_tungstenite::connect_async(&target)
            .await
            .expect("the DevTools socket");
        Page {
            cdp,
            id: 0,
            profile,
            _browser: browser,
        }
    }

    /// The value of a JavaScript expression in the page, as a string (empty
    /// if it is not one).
    async fn eval(&mut self, expression: &str) -> String {
        self.id += 1;
        let call = serde_json::json!({
            "id": self.id,
            "method": "Runtime.evaluate",
            "params": { "expression": expression, "returnByValue": true },
        });
        self.cdp
            .send(WsMessage::text(call.to_string()))
            .await
            .unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(30), self.cdp.next())
                .await
                .expect("DevTools answers")
                .expect("DevTools socket open")
                .unwrap();
            let WsMessage::Text(text) = message else {
                continue;
            };
            let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == self.id {
                return reply["result"]["result"]["value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
            }
        }
    }

    /// Polls `expression` until it is not empty (within `within`).
    async fn wait_for(&mut self, expression: &str, within: Duration) -> String {
        let started = Instant::now();
        loop {
            let value = self.eval(expression).await;
            if !value.is_empty() {
                return value;
            }
            assert!(
                started.elapsed() < within,
                "no value of {expression} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The page's own log (`#log`, or the bus page's `#deliveries`).
    async fn log(&mut self) -> String {
        let expression = "(document.getElementById('log') || document.getElementById('deliveries') || {}).textContent || ''";
        // The page may be gone; a failure message needs no log then.
        tokio::time::timeout(Duration::from_secs(10), self.eval(expression))
            .await
            .unwrap_or_default()
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Opens `url` in headless Chromium and returns the text the page puts in
/// `#verdict` (within 90 s).
async fn verdict_of(url: &str) -> String {
    let mut page = Page::open(url).await;
    let verdict = page
        .wait_for(
            "(document.getElementById('verdict') || {}).textContent || ''",
            Duration::from_secs(90),
        )
        .await;
    let log = page.log().await;
    format!("{verdict}\n--- page log ---\n{log}")
}

/// The DevTools WebSocket of the page showing `url`, once Chromium lists it.
async fn page_target(devtools: SocketAddr, url: &str) -> String {
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Chromium's DevTools did not list the page within 30 s"
        );
        if tokio::net::TcpStream::connect(devtools).await.is_ok()
            && let Some(body) = devtools_get(devtools, "/json/list").await
        {
            let targets: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_default();
            let page = targets.as_array().into_iter().flatten().find(|target| {
                target["type"] == "page"
                    && target["url"]
                        .as_str()
                        .is_some_and(|at| at.starts_with(url.split('?').next().unwrap()))
            });
            if let Some(socket) = page.and_then(|page| page["webSocketDebuggerUrl"].as_str()) {
                return socket.to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The body of a GET to Chromium's DevTools HTTP endpoint, which keeps the
/// connection open: read up to its `Content-Length`.
async fn devtools_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    // Chromium builds the socket URLs it lists from this Host.
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let reading = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            response.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&response);
            let (head, body) = text.split_once("\r\n\r\n")?;
            let length = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })?;
            if body.len() >= length {
                return Some(body[..length].to_owned());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .ok()?
}

fn tls_args() -> Vec<String> {
    let identity = tls::identity();
    vec![
        "--tls-cert".into(),
        identity.cert_pem.display().to_string(),
        "--tls-key".into(),
        identity.key_pem.display().to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_passes_the_self_test_on_axum_echo_over_wss() {
    let mut args = vec!["--deflate".to_owned()];
    args.extend(tls_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_server, addr) = start_example("axum_echo", &args).await;
    let url = format!(
        "https://localhost:{}/?test&paths=/ws,/stream&deflate=1",
        addr.port()
    );
    let verdict = verdict_of(&url).await;
    eprintln!("{verdict}");
    assert!(verdict.starts_with("PASS "), "{verdict}");
    assert!(verdict.contains("/ws [permessage-deflate"), "{verdict}");
    assert!(verdict.contains("/stream [permessage-deflate"), "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_passes_the_self_test_on_the_standalone_http_fallback() {
    let mut args = vec![
        "--http-fallback".to_owned(),
        "--deflate".to_owned(),
        "--backend".to_owned(),
        "tokio".to_owned(),
    ];
    args.extend(tls_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_server, addr) = start_example("echo", &args).await;
    let url = format!(
        "https://localhost:{}/?test&paths=/ws&deflate=1",
        addr.port()
    );
    let verdict = verdict_of(&url).await;
    eprintln!("{verdict}");
    assert!(verdict.starts_with("PASS "), "{verdict}");
    assert!(verdict.contains("/ws [permessage-deflate"), "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_the_bus_pages_errors_as_errors_and_deliveries_with_their_topic() {
    let (_server, addr) = start_example("notify_bus", &["--history", "10"]).await;
    let url = format!("http://127.0.0.1:{}/?test", addr.port());
    let verdict = verdict_of(&url).await;
    eprintln!("{verdict}");
    assert!(verdict.starts_with("PASS "), "{verdict}");
    assert!(
        verdict.contains("server refused: empty topic name"),
        "{verdict}"
    );
    assert!(verdict.contains("[selftest #1] héllo ✓"), "{verdict}");
    assert!(
        verdict.contains(r#"topics: "news", "selftest";"#),
        "{verdict}"
    );
}

/// Publishes `body` to `topic` on the bus at `bus`; its offset.
async fn publish(bus: SocketAddr, topic: &str, body: &str) -> u64 {
    let head = format!(
        "POST /publish/{topic} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = http_exchange(bus, &head).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let answer: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    answer["offset"].as_u64().unwrap()
}

/// The bus page resumes with the JavaScript subscriber
/// (`clients/js/rapidws-bus.mjs`, which notify_bus serves): the page is
/// loaded through a proxy that cuts every connection through it, its
/// WebSocket's with them, eight times while the test publishes (before,
/// during and after each reconnect; most reconnects brought forward by an
/// `online` event, the others after the backoff), and the page shows every
/// offset exactly once, in order, and never "missed messages".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_the_bus_page_resumes_across_cuts_showing_every_offset_once() {
    let (_server, bus) = start_example("notify_bus", &["--history", "1000"]).await;
    let proxy = cut_proxy::CutProxy::start(bus).await;
    let mut page = Page::open(&format!("http://{}/?topics=cuts", proxy.addr)).await;
    let connection = |n: u32| {
        format!(
            "document.getElementById('status').textContent === 'open, connection {n}' ? 'y' : ''"
        )
    };
    let shown = |offset: u64| {
        format!(
            "document.getElementById('deliveries').textContent.includes('[cuts #{offset}] m{offset}\\n') ? 'y' : ''"
        )
    };
    // Closed, or open again already (the backoff may be a few ms).
    let closed_or = |n: u32| {
        format!(
            "(s => s.startsWith('closed') || s === 'open, connection {n}')(document.getElementById('status').textContent) ? 'y' : ''"
        )
    };
    page.wait_for(&connection(1), Duration::from_secs(30)).await;
    // The first delivery gives the topic a position to resume from.
    let mut last = publish(bus, "cuts", "m1").await;
    assert_eq!(last, 1);
    page.wait_for(&shown(1), Duration::from_secs(10)).await;
    for k in 1..=8 {
        for _ in 0..20 {
            last = publish(bus, "cuts", &format!("m{}", last + 1)).await;
        }
        // The page's WebSocket, and any idle HTTP connection of its.
        assert!(proxy.cut() >= 1, "cut {k}: nothing to cut");
        for _ in 0..20 {
            last = publish(bus, "cuts", &format!("m{}", last + 1)).await;
        }
        if k % 3 != 0 {
            // Back online: the page reconnects at once instead of waiting
            // for its backoff (most cuts, so the backoff stays short).
            page.wait_for(&closed_or(k + 1), Duration::from_secs(30))
                .await;
            page.eval("window.dispatchEvent(new Event('online')), ''")
                .await;
        }
        page.wait_for(&connection(k + 1), Duration::from_secs(30))
            .await;
    }
    for _ in 0..10 {
        last = publish(bus, "cuts", &format!("m{}", last + 1)).await;
    }
    page.wait_for(&shown(last), Duration::from_secs(30)).await;
    let log = page.log().await;
    let offsets: Vec<u64> = log
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("[cuts #")?;
            let (offset, data) = rest.split_once("] ")?;
            assert_eq!(data, format!("m{offset}"), "{line}");
            offset.parse().ok()
        })
        .collect();
    assert_eq!(offsets, (1..=last).collect::<Vec<_>>(), "{log}");
    assert!(!log.contains("missed messages"), "{log}");
    assert_eq!(log.matches("resumed, nothing missed").count(), 8, "{log}");
}

/// WebTransport in a real browser: the demo page served by `h3_echo` over
/// TCP opens a WebSocket at `/ws` (its usual self-test) and a WebTransport
/// session at `/wt` over HTTP/3 (QUIC on the same port number): streams
/// both ways echoed whole, 40 opened at once (past the 16 a connection
/// starts with), one aborted with code 5 reset back with 5, a
/// unidirectional stream echoed on the server's, datagrams echoed, and a
/// close with code 4000 that the server sees (its log says the code and
/// the reason).
#[cfg(feature = "http3")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_passes_the_webtransport_self_test_on_h3_echo() {
    let identity = tls::short_lived_identity("webtransport");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = std::env::temp_dir().join(format!("rapidws-h3-echo-{}.log", std::process::id()));
    let mut server = std::process::Command::new(example("h3_echo"));
    server
        .args(["--addr", &addr.to_string()])
        .args(["--tls-cert", identity.cert_pem.to_str().unwrap()])
        .args(["--tls-key", identity.key_pem.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap());
    let _server = Child(server.spawn().unwrap());
    wait_listening("h3_echo", addr).await;
    let url = format!("https://127.0.0.1:{}/?test&paths=/ws&wt=/wt", addr.port());
    let verdict = verdict_of(&url).await;
    eprintln!("{verdict}");
    assert!(verdict.starts_with("PASS "), "{verdict}");
    assert!(
        verdict.contains("/wt [WebTransport") && verdict.contains("closed 4000 bye"),
        "{verdict}"
    );
    // Past the 16 streams a connection starts with, and the application's
    // reset code passed back.
    assert!(
        verdict.contains("40 streams at once") && verdict.contains("code 5 reset back as 5"),
        "{verdict}"
    );
    // The server saw the browser's close: its code and its reason.
    let started = Instant::now();
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("WebTransport session closed") && said.contains("code=4000") {
            assert!(said.contains("reason=bye"), "{said}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "h3_echo did not log the session's close 4000: {said}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_file(&log);
}

/// A page that opens a WebSocket to the URL in its `target` query
/// parameter and says in `#verdict` what happened.
const CROSS_ORIGIN_PAGE: &str = r#"<!doctype html><meta charset="utf-8"><p id="verdict"></p>
<script>
const target = new URLSearchParams(location.search).get("target");
const say = (text) => { document.getElementById("verdict").textContent = text; };
const ws = new WebSocket(target);
let opened = false;
ws.onopen = () => { opened = true; ws.send("from " + location.origin); };
ws.onmessage = (event) => { say("open, echoed: " + event.data); ws.close(1000); };
ws.onclose = (event) => { if (!opened) say("refused (" + event.code + ")"); };
</script>"#;

async fn cross_origin_server(config: rapidws::Config) -> SocketAddr {
    let echo = Echo {
        page: Some(CROSS_ORIGIN_PAGE),
    };
    let server = rapidws::tokio::Server::bind("127.0.0.1:0", echo, config)
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.serve());
    addr
}

/// Cross-site WebSocket hijacking, in a real browser: a page of one origin
/// (server A) opens a WebSocket to another (server B, default config):
/// Chromium sends its `Origin`, B refuses with 403, and the page sees the
/// socket fail. Server C lets A's origin in: the page's socket opens and
/// echoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_pages_of_another_origin_are_refused_unless_allowed() {
    let a = cross_origin_server(rapidws::Config::default()).await;
    let b = cross_origin_server(rapidws::Config::default()).await;
    let allowed = format!("http://{a}");
    let c = cross_origin_server(rapidws::Config::default().allow_origins([allowed.clone()])).await;

    let refused = verdict_of(&format!("http://{a}/?target=ws://{b}/")).await;
    assert!(refused.starts_with("refused (1006)"), "{refused}");
    let open = verdict_of(&format!("http://{a}/?target=ws://{c}/")).await;
    assert!(
        open.starts_with(&format!("open, echoed: from {allowed}")),
        "{open}"
    );
    // And a page of B's own origin is let in by B.
    let own = verdict_of(&format!("http://{b}/?target=ws://{b}/")).await;
    assert!(
        own.starts_with(&format!("open, echoed: from http://{b}")),
        "{own}"
    );
}

/// Serves tests/centrifuge/sdk_page.html at `/` and the SDK's browser
/// bundle at `/centrifuge.js`; no WebSocket.
struct SdkPage {
    page: rapidws::Bytes,
    bundle: rapidws::Bytes,
}

impl rapidws::Handler for SdkPage {
    type State = ();

    fn on_message(&self, _: &rapidws::Conn, _: &mut (), _: rapidws::Message<'_>) {}
}

impl rapidws::ServerHandler for SdkPage {
    fn on_upgrade(
        &self,
        _: &rapidws::Request<'_>,
        _: &mut rapidws::Accept,
    ) -> Result<(), rapidws::Reject> {
        Err(rapidws::Reject::not_found("pages only"))
    }

    fn on_http(&self, request: &rapidws::Request<'_>) -> Option<rapidws::HttpResponse> {
        let (content_type, body) = match request.path() {
            "/" => ("text/html; charset=utf-8", &self.page),
            "/centrifuge.js" => ("text/javascript; charset=utf-8", &self.bundle),
            _ => return None,
        };
        Some(rapidws::HttpResponse::new(200, content_type, body.clone()))
    }
}

/// Centrifugo's JavaScript SDK in a real browser: its browser bundle (npm
/// `centrifuge`, dist/centrifuge.js) on a page served from one origin
/// connects through a proxy, another origin (which centrifugo_compat lets
/// in with `--allow-origin`), to centrifugo_compat with history, and
/// subscribes. The test publishes through the server HTTP API, one every
/// 0–10 ms, and cuts the page's connection 10 times, each a random 0–40 ms
/// after the SDK subscribed again: the page shows every publication once,
/// in order, and each subscribe after a cut says it recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_runs_centrifugos_sdk_recovering_across_cuts() {
    use rand::{RngExt, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};
    const CUTS: usize = 10;
    const AT_LEAST: u64 = 300;
    let sdk = centrifugo::sdk_dir();
    let read = |path: &str| rapidws::Bytes::from(std::fs::read(sdk.join(path)).unwrap());
    let files = SdkPage {
        page: read("sdk_page.html"),
        bundle: read("node_modules/centrifuge/dist/centrifuge.js"),
    };
    let pages = rapidws::tokio::Server::bind(
        format!("127.0.0.1:{}", free_port()),
        files,
        rapidws::Config::default(),
    )
    .await
    .unwrap();
    let origin = format!("http://{}", pages.local_addr().unwrap());
    tokio::spawn(pages.serve());
    let args = [
        "--history",
        "1000",
        "--api-key",
        "sekret",
        "--allow-origin",
        &origin,
    ];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let proxy = cut_proxy::CutProxy::start(addr).await;
    let url = format!(
        "{origin}/?channel=cuts&ws=ws://{}/connection/websocket",
        proxy.addr
    );
    let mut page = Page::open(&url).await;
    let at_least = |list: &str, n: usize| {
        format!("window.seen && window.seen.{list}.length >= {n} ? 'y' : ''")
    };
    page.wait_for(&at_least("subscribed", 1), Duration::from_secs(30))
        .await;

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut publisher_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 1);
    let mut api = centrifugo::ApiPublisher::connect(addr, "sekret").await;
    let cutting = std::sync::Arc::new(AtomicBool::new(true));
    let still_cutting = cutting.clone();
    let publishing = tokio::spawn(async move {
        let mut n = 0;
        while n < AT_LEAST || still_cutting.load(Ordering::Relaxed) {
            n += 1;
            assert_eq!(api.publish("cuts", &serde_json::json!({"n": n})).await, n);
            let pause = publisher_rng.random_range(0..=10);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        n
    });
    // Once the channel holds a publication (one with none is forgotten
    // with its epoch when its last subscriber leaves).
    page.wait_for(&at_least("pubs", 1), Duration::from_secs(10))
        .await;
    for k in 1..=CUTS {
        page.wait_for(&at_least("subscribed", k), Duration::from_secs(30))
            .await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=40))).await;
        assert_eq!(proxy.cut(), 1, "cut {k}: the page's one connection");
    }
    cutting.store(false, Ordering::Relaxed);
    let total = publishing.await.unwrap();
    page.wait_for(&at_least("pubs", total as usize), Duration::from_secs(30))
        .await;
    // A late duplicate would show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen: serde_json::Value =
        serde_json::from_str(&page.eval("JSON.stringify(window.seen)").await).unwrap();
    let log = page.log().await;
    let expected: Vec<serde_json::Value> = (1..=total).map(|n| serde_json::json!([n, n])).collect();
    assert_eq!(seen["pubs"], serde_json::json!(expected), "{log}");
    let subscribed = seen["subscribed"].as_array().unwrap();
    assert_eq!(subscribed.len(), CUTS + 1, "{log}");
    assert_eq!(subscribed[0]["wasRecovering"], false, "{log}");
    for again in &subscribed[1..] {
        assert_eq!(again["wasRecovering"], true, "{again}\n{log}");
        assert_eq!(again["recovered"], true, "{again}\n{log}");
        assert_eq!(again["epoch"], subscribed[0]["epoch"], "{log}");
    }
    // Each reconnect for its transport closing (code 1), never for a close
    // from the server; no errors, no disconnect.
    let states = seen["states"].as_array().unwrap();
    let reconnects = states.iter().skip(1).filter(|s| s[0] == "connecting");
    assert!(reconnects.clone().all(|s| s[1] == 1), "{log}");
    assert_eq!(reconnects.count(), CUTS, "{log}");
    assert!(!states.iter().any(|s| s[0] == "disconnected"), "{log}");
    assert_eq!(seen["errors"], serde_json::json!([]), "{log}");
    eprintln!(
        "Chromium: {total} publications shown once and in order across {CUTS} cuts, \
         {} subscribes recovered; seed {seed}",
        subscribed.len() - 1
    );
}
