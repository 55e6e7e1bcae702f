//! The axum extractor (`rapidws::axum::WebSocketUpgrade`) in a real axum
//! app served by `axum::serve`: both endpoints (a `Handler`, an async
//! closure) beside plain routes on one port, the builder's subprotocols,
//! permessage-deflate and limits, `Option<WebSocketUpgrade>`, `Sockets` in
//! the extensions, bad upgrades answered like the standalone server's; and
//! the `axum_echo` example over http and https; WebSockets over HTTP/2
//! (RFC 8441) with hyper's own h2 client, bad extended CONNECTs included.
//! Clients: tokio-tungstenite (over TCP, or over hyper's h2 stream) and raw
//! HTTP.
#![cfg(feature = "axum")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use common::*;
use futures_util::SinkExt;
use rapidws::axum::{Sockets, WebSocketUpgrade};
use rapidws::{
    Accept, CloseCode, Config, Conn, DeflateConfig, Handler, Message, Reject, Request,
    ServerHandler,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Echoes, and reports the peer address it was given in a first message.
struct Echo;

impl Handler for Echo {
    type State = ();

    fn on_open(&self, conn: &Conn, _: &mut ()) {
        let _ = conn.send_text(&format!("peer {}", conn.peer_addr()));
    }

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for Echo {
    fn on_upgrade(&self, request: &Request<'_>, accept: &mut Accept) -> Result<(), Reject> {
        match request.query() {
            Some("deny") => return Err(Reject::forbidden("denied by the hook")),
            // This connection's own limit, set by the hook.
            Some("small") => {
                accept.max_message_size(100);
            }
            _ => {}
        }
        Ok(())
    }
}

#[derive(Clone)]
struct App {
    echo: Arc<rapidws::stream::Server<Echo>>,
    opened: Arc<AtomicUsize>,
}

async fn ws(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.serve(&app.echo)
}

/// The async socket: echoes, after telling the subprotocol chosen.
async fn stream(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    let upgrade = upgrade.protocols(["v2.chat", "v1.chat"]);
    let chosen = upgrade.selected_protocol().unwrap_or("none").to_owned();
    upgrade.on_upgrade(move |mut socket| async move {
        app.opened.fetch_add(1, Ordering::SeqCst);
        if socket.send(format!("protocol {chosen}")).await.is_err() {
            return;
        }
        while let Some(Ok(message)) = socket.recv().await {
            if socket.send(message).await.is_err() {
                break;
            }
        }
    })
}

/// The async socket, answering each message a millisecond after taking it
/// (time for a close sent right behind it to arrive).
async fn late(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if socket.send(message).await.is_err() {
                break;
            }
        }
    })
}

/// The builder's own settings: deflate offered, messages up to 1 KiB.
async fn small(upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .permessage_deflate(DeflateConfig::default())
        .max_message_size(1024)
        .on_upgrade(|mut socket| async move {
            while let Some(Ok(message)) = socket.recv().await {
                if socket.send(message).await.is_err() {
                    break;
                }
            }
        })
}

/// A server made for each upgrade and dropped when the handler returns:
/// the connection outlives it.
async fn once(upgrade: WebSocketUpgrade) -> Response {
    upgrade.serve(&rapidws::stream::Server::new(Echo, Config::default()))
}

/// One route for both: a page, or an upgrade.
async fn either(upgrade: Option<WebSocketUpgrade>) -> Response {
    match upgrade {
        Some(upgrade) => upgrade.on_upgrade(|socket| async move {
            let _ = socket.close(CloseCode::from(4000), "bye");
        }),
        None => "a page\n".into_response(),
    }
}

struct Served {
    addr: SocketAddr,
    opened: Arc<AtomicUsize>,
    sockets: Sockets,
}

/// An axum app on a free port, served by `axum::serve` with the peer's
/// address as `ConnectInfo`.
async fn serve_app(config: Config) -> Served {
    let echo = Arc::new(rapidws::stream::Server::new(Echo, config.clone()));
    let opened = Arc::new(AtomicUsize::new(0));
    let sockets = Sockets::new(config);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        // CONNECT too: WebSockets over HTTP/2 are extended CONNECTs.
        .route("/ws", get(ws).connect(ws))
        .route("/stream", get(stream).connect(stream))
        .route("/small", get(small).connect(small))
        .route("/late", get(late).connect(late))
        .route("/either", get(either))
        .route("/once", get(once))
        .layer(Extension(sockets.clone()))
        .with_state(App {
            echo,
            opened: opened.clone(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    Served {
        addr,
        opened,
        sockets,
    }
}

async fn echoes<S>(client: &mut tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for text in ["hello", "héllo wörld 🦀"] {
        client.send(WsMessage::text(text)).await.unwrap();
        assert_eq!(next(client).await, WsMessage::text(text));
    }
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    client.send(WsMessage::binary(data.clone())).await.unwrap();
    assert_eq!(next(client).await, WsMessage::binary(data));
}

#[tokio::test]
async fn both_apis_beside_plain_routes_on_one_port() {
    let served = serve_app(Config::default()).await;
    let addr = served.addr;
    assert_healthy(addr).await;

    let (mut client, response) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("/ws upgraded");
    assert_eq!(response.status(), 101);
    let WsMessage::Text(peer) = next(&mut client).await else {
        panic!("the peer address first");
    };
    let tokio_tungstenite::MaybeTlsStream::Plain(local) = client.get_ref() else {
        panic!("plain TCP");
    };
    // The handler saw the client's address (axum's ConnectInfo).
    assert_eq!(
        peer.as_str(),
        format!("peer {}", local.local_addr().unwrap())
    );
    echoes(&mut client).await;
    client.close(None).await.unwrap();

    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/stream"))
        .await
        .expect("/stream upgraded");
    assert_eq!(next(&mut client).await, WsMessage::text("protocol none"));
    echoes(&mut client).await;
    client.close(None).await.unwrap();
    assert_eq!(served.opened.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_builder_chooses_the_protocol_in_its_own_order() {
    let served = serve_app(Config::default()).await;
    let mut request = format!("ws://{}/stream", served.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "v1.chat, v2.chat, other".parse().unwrap(),
    );
    let (mut client, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "v2.chat",
        "the endpoint's first choice, not the client's"
    );
    assert_eq!(next(&mut client).await, WsMessage::text("protocol v2.chat"));
    // Offered nothing it speaks: upgraded without a protocol (the client
    // decides whether to go on; tungstenite would not).
    let extra = "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: other\r\n";
    let head = upgrade_head("GET", "/stream", "HTTP/1.1", extra);
    let response = http_exchange(served.addr, &head).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 101"), "{response}");
    assert!(!response.contains("sec-websocket-protocol"), "{response}");
}

#[tokio::test]
async fn the_builder_sets_deflate_and_limits_per_upgrade() {
    let served = serve_app(Config::default()).await;
    let offer = "Sec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
    // The server's config has no deflate; /small turns it on.
    let plain = http_exchange(served.addr, &upgrade_head("GET", "/ws", "HTTP/1.1", offer)).await;
    assert!(plain.starts_with("HTTP/1.1 101"), "{plain}");
    assert!(
        !plain
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{plain}"
    );
    let small = http_exchange(
        served.addr,
        &upgrade_head("GET", "/small", "HTTP/1.1", offer),
    )
    .await;
    let lower = small.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 101"), "{small}");
    assert!(
        lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{small}"
    );
    assert!(
        lower.contains("sec-websocket-extensions: permessage-deflate"),
        "{small}"
    );
    // Messages up to 1 KiB: one byte more closes with 1009.
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{}/small", served.addr))
        .await
        .unwrap();
    client.send(WsMessage::binary(vec![1; 1024])).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::binary(vec![1; 1024]));
    client.send(WsMessage::binary(vec![1; 1025])).await.unwrap();
    assert_eq!(expect_close(&mut client).await.0, 1009);
    // The upgrade hook's own limit for one connection, through the extractor.
    let url = format!("ws://{}/ws?small", served.addr);
    let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    next(&mut client).await;
    client.send(WsMessage::binary(vec![3; 100])).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::binary(vec![3; 100]));
    client.send(WsMessage::binary(vec![3; 101])).await.unwrap();
    assert_eq!(expect_close(&mut client).await.0, 1009);
    // The server's own limit (64 MiB by default) still holds on /stream.
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{}/stream", served.addr))
        .await
        .unwrap();
    next(&mut client).await;
    client.send(WsMessage::binary(vec![2; 4096])).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::binary(vec![2; 4096]));
}

#[tokio::test]
async fn an_optional_upgrade_serves_a_page_and_a_socket_on_one_route() {
    let served = serve_app(Config::default()).await;
    let page = http_exchange(
        served.addr,
        "GET /either HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.ends_with("a page\n"), "{page}");
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{}/either", served.addr))
        .await
        .unwrap();
    assert_eq!(expect_close(&mut client).await, (4000, "bye".to_owned()));
    // An upgrade that is there but bad is refused, not served the page.
    let bad = http_exchange(
        served.addr,
        &upgrade_head("GET", "/either", "HTTP/1.1", "Sec-WebSocket-Version: 7\r\n"),
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 426"), "{bad}");
}

#[tokio::test]
async fn bad_upgrades_get_the_standalone_servers_statuses() {
    let served = serve_app(Config::default()).await;
    let version = "Sec-WebSocket-Version: 13\r\n";
    for path in ["/ws", "/stream"] {
        let cases = [
            // A plain request to a WebSocket route.
            (
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                "400",
                "missing or invalid upgrade: websocket",
            ),
            (
                upgrade_head("GET", path, "HTTP/1.1", "Sec-WebSocket-Version: 8\r\n"),
                "426",
                "sec-websocket-version: 13",
            ),
            (
                upgrade_head("GET", path, "HTTP/1.1", version).replace(
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Key: x",
                ),
                "400",
                "sec-websocket-key must be one header of 16 random bytes",
            ),
            (
                upgrade_head("GET", path, "HTTP/1.0", version),
                "400",
                "requires http/1.1",
            ),
        ];
        for (head, status, expected) in cases {
            let response = http_exchange(served.addr, &head).await;
            let lower = response.to_ascii_lowercase();
            assert_eq!(&lower[9..12], status, "{head:?} got {response}");
            assert!(lower.contains(expected), "{head:?} got {response}");
            assert!(lower.contains("content-type: text/plain"), "{response}");
        }
    }
    // A page of another origin, on either API.
    for path in ["/ws", "/stream"] {
        let extra = format!("{version}Origin: https://evil.example\r\n");
        let refused =
            http_exchange(served.addr, &upgrade_head("GET", path, "HTTP/1.1", &extra)).await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(refused.contains("Config::allow_origins"), "{refused}");
    }
    // The handler's hook refuses, as on the standalone server.
    let denied = http_exchange(
        served.addr,
        &upgrade_head("GET", "/ws?deny", "HTTP/1.1", version),
    )
    .await;
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert!(denied.ends_with("denied by the hook\n"), "{denied}");
    // 64 KiB of headers: within hyper's limit, over the server's
    // handshake limit (8 KiB): 431, as the standalone servers answer.
    for path in ["/ws", "/stream"] {
        let big = "X-Filler: ".to_owned() + &"a".repeat(1000) + "\r\n";
        let head = upgrade_head(
            "GET",
            path,
            "HTTP/1.1",
            &(version.to_owned() + &big.repeat(64)),
        );
        let response = http_exchange(served.addr, &head).await;
        assert!(response.starts_with("HTTP/1.1 431"), "{:.200}", response);
        assert!(
            response.to_ascii_lowercase().contains("header"),
            "{response}"
        );
    }
    // A huge header: hyper's own limit answers, before any upgrade.
    let huge = format!(
        "GET /ws HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let response = http_exchange(served.addr, &huge).await;
    assert!(response.starts_with("HTTP/1.1 431"), "{:.200}", response);
    // Nothing was opened, and everyone else is still served.
    assert_eq!(served.opened.load(Ordering::SeqCst), 0);
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{}/stream", served.addr))
        .await
        .unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text("protocol none"));
    client.send(WsMessage::text("still here")).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text("still here"));
}

#[tokio::test]
async fn the_sockets_in_the_extensions_count_and_shut_down() {
    let served = serve_app(Config::default().max_connections(1)).await;
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{}/stream", served.addr))
        .await
        .unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text("protocol none"));
    assert_eq!(served.sockets.handle().connections(), 1);
    // Its config's limit: one connection.
    let full = http_exchange(
        served.addr,
        &upgrade_head(
            "GET",
            "/stream",
            "HTTP/1.1",
            "Sec-WebSocket-Version: 13\r\n",
        ),
    )
    .await;
    assert!(full.starts_with("HTTP/1.1 503"), "{full}");
    served.sockets.handle().shutdown();
    assert_eq!(expect_close(&mut client).await.0, 1001);
}

#[tokio::test]
async fn the_axum_echo_example_serves_its_page_and_both_endpoints() {
    let (_example, addr) = start_example("axum_echo", &["--deflate"]).await;
    let page = http_exchange(
        addr,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("text/html"), "{page}");
    assert!(page.contains("new WebSocket(url)"), "{page}");
    assert_healthy(addr).await;
    let offer = "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n";
    for path in ["/ws", "/stream"] {
        let response = http_exchange(addr, &upgrade_head("GET", path, "HTTP/1.1", offer)).await;
        assert!(
            response
                .to_ascii_lowercase()
                .contains("sec-websocket-extensions: permessage-deflate"),
            "--deflate on {path}: {response}"
        );
        let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
            .await
            .unwrap();
        echoes(&mut client).await;
        client.close(None).await.unwrap();
    }
}

/// The example people copy into production refuses what the standalone
/// servers refuse: a head over the handshake limit (431, from the
/// extractor), a head over hyper's buffer (431, from hyper), and a head sent
/// a byte at a time (cut off after 10 s; `axum::serve` kept it open).
#[tokio::test]
async fn the_axum_echo_example_bounds_request_heads_in_size_and_time() {
    let (_example, addr) = start_example("axum_echo", &[]).await;
    let filler = |kib: usize| ("X-Filler: ".to_owned() + &"a".repeat(1000) + "\r\n").repeat(kib);
    let version = "Sec-WebSocket-Version: 13\r\n".to_owned();
    for (path, kib) in [("/ws", 32), ("/stream", 32), ("/ws", 200)] {
        let head = upgrade_head("GET", path, "HTTP/1.1", &(version.clone() + &filler(kib)));
        let response = http_exchange(addr, &head).await;
        assert!(
            response.starts_with("HTTP/1.1 431"),
            "{path}, {kib} KiB: {:.200}",
            response
        );
    }
    // A slowloris client: a head begun, never finished.
    let started = std::time::Instant::now();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "still open after 20 s");
    let after = started.elapsed();
    assert!(
        after >= Duration::from_secs(9) && after < Duration::from_secs(15),
        "cut off after {after:?}"
    );
    assert_healthy(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_axum_echo_example_serves_https_and_wss() {
    let identity = tls::identity();
    let (cert, key) = (identity.cert_pem.to_str(), identity.key_pem.to_str());
    let args = ["--tls-cert", cert.unwrap(), "--tls-key", key.unwrap()];
    let (_example, addr) = start_example("axum_echo", &args).await;
    let mut health = tls::connect(addr).await.expect("a TLS handshake");
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = health.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok\n"), "{response}");
    for path in ["/ws", "/stream"] {
        let tls = tls::connect(addr).await.unwrap();
        let url = format!("wss://localhost:{}{path}", addr.port());
        let (mut client, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
        echoes(&mut client).await;
    }
}

/// An HTTP/2 extended CONNECT (RFC 8441) from hyper's own h2 client, over a
/// connection of its own (h2c, prior knowledge: `axum::serve` speaks both):
/// the response, and for a `200` the h2 stream as a tungstenite client.
#[cfg(feature = "http2")]
async fn h2_connect(
    addr: std::net::SocketAddr,
    path: &str,
    protocol: Option<&'static str>,
    headers: &[(&str, &str)],
) -> (
    hyper::StatusCode,
    hyper::HeaderMap,
    Option<tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("an h2 connection");
    tokio::spawn(connection);
    let mut attempts = 0;
    let mut response = loop {
        let mut request = hyper::Request::builder()
            .method(hyper::Method::CONNECT)
            .uri(format!("http://{addr}{path}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .unwrap();
        if let Some(protocol) = protocol {
            request
                .extensions_mut()
                .insert(hyper::ext::Protocol::from_static(protocol));
        }
        match sender.send_request(request).await {
            Ok(response) => break response,
            // The server's SETTINGS (which enable the extended CONNECT) may
            // not have arrived yet.
            Err(error) if attempts < 50 => {
                attempts += 1;
                let _ = error;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("the extended CONNECT: {error}"),
        }
    };
    let (status, headers) = (response.status(), response.headers().clone());
    if status != hyper::StatusCode::OK {
        return (status, headers, None);
    }
    let upgraded = hyper::upgrade::on(&mut response)
        .await
        .expect("the h2 stream");
    let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    (status, headers, Some(socket))
}

#[cfg(feature = "http2")]
#[tokio::test]
async fn websockets_over_http2_are_served_by_both_apis() {
    let served = serve_app(Config::default()).await;
    let version = [("sec-websocket-version", "13")];
    let (status, _, socket) = h2_connect(served.addr, "/ws", Some("websocket"), &version).await;
    assert_eq!(status, 200);
    let mut socket = socket.unwrap();
    let WsMessage::Text(peer) = next(&mut socket).await else {
        panic!("the peer address first");
    };
    assert!(peer.starts_with("peer 127.0.0.1:"), "{peer}");
    echoes(&mut socket).await;
    socket.close(None).await.unwrap();

    let offer = [
        ("sec-websocket-version", "13"),
        ("sec-websocket-protocol", "v1.chat, v2.chat"),
    ];
    let (status, headers, socket) =
        h2_connect(served.addr, "/stream", Some("websocket"), &offer).await;
    assert_eq!(status, 200);
    assert_eq!(headers["sec-websocket-protocol"], "v2.chat");
    assert!(
        !headers.contains_key("sec-websocket-accept"),
        "no key over h2"
    );
    let mut socket = socket.unwrap();
    assert_eq!(next(&mut socket).await, WsMessage::text("protocol v2.chat"));
    echoes(&mut socket).await;
    socket
        .close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: 4000.into(),
            reason: "bye".into(),
        }))
        .await
        .unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), async {
        use futures_util::StreamExt;
        socket.next().await
    })
    .await
    .unwrap();
    assert!(
        matches!(&echoed, Some(Ok(WsMessage::Close(Some(frame)))) if u16::from(frame.code) == 4000),
        "{echoed:?}"
    );

    // permessage-deflate is negotiated over h2 as over HTTP/1.1.
    let deflate = [
        ("sec-websocket-version", "13"),
        (
            "sec-websocket-extensions",
            "permessage-deflate; client_max_window_bits",
        ),
    ];
    let (status, headers, _) = h2_connect(served.addr, "/small", Some("websocket"), &deflate).await;
    assert_eq!(status, 200);
    let extensions = headers["sec-websocket-extensions"].to_str().unwrap();
    assert!(extensions.starts_with("permessage-deflate"), "{extensions}");
}

/// A client that sends its last message and its close at once gets the
/// answer, then the reply to its close, over HTTP/1.1 and HTTP/2 (hyper's
/// h2 client): the socket's close waits for `recv` to return the end.
/// Twenty runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reply_arrives_before_the_answer_to_the_close() {
    let served = serve_app(Config::default()).await;
    for run in 0..20 {
        let url = format!("ws://{}/late", served.addr);
        let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let text = format!("last word {run}");
        let (texts, code) = say_and_leave(&mut client, &text).await;
        assert_eq!(
            (texts, code),
            (vec![text], Some(1000)),
            "HTTP/1.1, run {run}"
        );
    }
    #[cfg(feature = "http2")]
    for run in 0..20 {
        let version = [("sec-websocket-version", "13")];
        let (status, _, socket) =
            h2_connect(served.addr, "/late", Some("websocket"), &version).await;
        assert_eq!(status, 200);
        let text = format!("last word {run}");
        let (texts, code) = say_and_leave(&mut socket.unwrap(), &text).await;
        assert_eq!((texts, code), (vec![text], Some(1000)), "HTTP/2, run {run}");
    }
}

#[cfg(feature = "http2")]
#[tokio::test]
async fn bad_http2_upgrades_get_a_status_and_a_reason() {
    let served = serve_app(Config::default()).await;
    let version = [("sec-websocket-version", "13")];
    // A CONNECT without :protocol is a plain tunnel request: it has no
    // :path (RFC 9113 §8.5), so it never reaches a WebSocket route.
    let (status, _, socket) = h2_connect(served.addr, "/ws", None, &version).await;
    assert_eq!(status, 404);
    assert!(socket.is_none());
    // An extended CONNECT for another protocol reaches the extractor.
    let (status, _, socket) = h2_connect(served.addr, "/ws", Some("h2c-tunnel"), &version).await;
    assert_eq!(status, 400);
    assert!(socket.is_none());
    // The wrong version.
    let old = [("sec-websocket-version", "8")];
    let (status, headers, _) = h2_connect(served.addr, "/stream", Some("websocket"), &old).await;
    assert_eq!(status, 426);
    assert_eq!(headers["sec-websocket-version"], "13");
    // A page of another origin: 403; of the server's own (`:authority`
    // stands for Host): let in.
    let evil = [
        ("sec-websocket-version", "13"),
        ("origin", "https://evil.example"),
    ];
    let (status, _, socket) = h2_connect(served.addr, "/ws", Some("websocket"), &evil).await;
    assert_eq!(status, 403);
    assert!(socket.is_none());
    // Nothing was opened, and everyone else is still served, over either
    // protocol.
    assert_eq!(served.opened.load(Ordering::SeqCst), 0);
    let own = format!("http://{}", served.addr);
    let own = [("sec-websocket-version", "13"), ("origin", own.as_str())];
    let (status, _, socket) = h2_connect(served.addr, "/stream", Some("websocket"), &own).await;
    assert_eq!(status, 200);
    drop(socket);
    let (status, _, socket) = h2_connect(served.addr, "/stream", Some("websocket"), &version).await;
    assert_eq!(status, 200);
    let mut socket = socket.unwrap();
    assert_eq!(next(&mut socket).await, WsMessage::text("protocol none"));
    assert_healthy(served.addr).await;
}

/// Pub/sub through the extractor's async socket: subscribed with the
/// socket's `Conn`, published to from the test, from another connection's
/// task (except itself), and gone from the topic when the client leaves.
#[cfg(feature = "pubsub")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_through_the_extractors_socket() {
    use rapidws::pubsub::PubSub;
    let pubsub = PubSub::new();
    let bus = pubsub.clone();
    let chat = move |upgrade: WebSocketUpgrade| {
        let bus = bus.clone();
        async move {
            upgrade.on_upgrade(move |mut socket| async move {
                bus.subscribe(socket.conn(), "room").unwrap();
                while let Some(Ok(message)) = socket.recv().await {
                    if let rapidws::OwnedMessage::Text(text) = message {
                        bus.publish_except("room", Message::Text(&text), socket.conn());
                    }
                }
            })
        }
    };
    let app = Router::new().route("/chat", get(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("ws://{addr}/chat");
    let mut a = tokio_tungstenite::connect_async(&url).await.unwrap().0;
    let mut b = tokio_tungstenite::connect_async(&url).await.unwrap().0;
    assert!(eventually(Duration::from_secs(5), || pubsub.subscribers("room") == 2).await);
    assert_eq!(
        pubsub
            .publish("room", Message::Text("from the test"))
            .subscribers,
        2
    );
    assert_eq!(next(&mut a).await, WsMessage::text("from the test"));
    assert_eq!(next(&mut b).await, WsMessage::text("from the test"));
    a.send(WsMessage::text("from a")).await.unwrap();
    assert_eq!(next(&mut b).await, WsMessage::text("from a"));
    b.send(WsMessage::text("from b")).await.unwrap();
    // a's next message is b's: its own was not sent back to it.
    assert_eq!(next(&mut a).await, WsMessage::text("from b"));
    a.close(None).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || pubsub.subscribers("room") == 1).await);
}

/// Under `axum::serve` (hyper-util's `auto` builder) a plain TCP upgrade is
/// taken back from hyper and served in a connection group: once its HTTP
/// connection's task hands it over, a connection costs no task.
#[tokio::test]
async fn plain_tcp_upgrades_cost_no_task_each() {
    let served = serve_app(Config::default()).await;
    let url = format!("ws://{}/ws", served.addr);
    let (mut first, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    assert!(matches!(next(&mut first).await, WsMessage::Text(peer) if peer.starts_with("peer ")));
    connections_cost_no_task(&url, true).await;
    echoes(&mut first).await;
    // Frames sent with the request: hyper read them, the group gets them.
    a_frame_sent_with_the_request_is_answered(served.addr, "/ws").await;
}

/// A server made for one upgrade and dropped at once: its connection is
/// served to its end all the same (the groups it started stay while an
/// upgrade is on its way to them, and end with their last connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_made_per_upgrade_serves_its_connection() {
    let served = serve_app(Config::default()).await;
    for _ in 0..20 {
        let url = format!("ws://{}/once", served.addr);
        let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        assert!(
            matches!(next(&mut client).await, WsMessage::Text(peer) if peer.starts_with("peer "))
        );
        echoes(&mut client).await;
    }
}
