//! Upgrades inside a hyper 1.x server (`rapidws::hyper::upgrade`): one port
//! answers plain HTTP routes and upgrades `/ws`; tokio-tungstenite and raw
//! HTTP requests as clients. Bad upgrade requests get the standalone
//! server's statuses, and the server's other connections keep being served.
#![cfg(feature = "hyper")]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use common::{
    a_frame_sent_with_the_request_is_answered, assert_healthy, connections_cost_no_task,
    expect_close, http_exchange, next, upgrade_head,
};
use futures_util::SinkExt;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rapidws::socket::{SocketHandler, WebSocket};
use rapidws::{Accept, Config, Conn, DeflateConfig, Handler, Message, Reject, ServerHandler};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Echoes; picks the `chat` subprotocol when offered; refuses `/ws?deny`.
struct Echo;

impl Handler for Echo {
    type State = ();

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

impl ServerHandler for Echo {
    fn on_upgrade(
        &self,
        request: &rapidws::Request<'_>,
        accept: &mut Accept,
    ) -> Result<(), Reject> {
        if request.query() == Some("deny") {
            return Err(Reject::forbidden("denied by the hook"));
        }
        if request.protocols().any(|p| p == "chat") {
            accept.protocol("chat");
        }
        Ok(())
    }
}

/// A hyper server on a free port: `/ws` upgrades through `ws`, `/healthz`
/// answers `ok`, anything else 404.
async fn hyper_server<H: ServerHandler>(ws: rapidws::stream::Server<H>) -> SocketAddr {
    let ws = Arc::new(ws);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let ws = ws.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let ws = ws.clone();
                async move { Ok::<_, Infallible>(route(&ws, request, peer)) }
            });
            tokio::spawn(
                http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades(),
            );
        }
    });
    addr
}

fn route<H: ServerHandler>(
    ws: &rapidws::stream::Server<H>,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/ws" => rapidws::hyper::upgrade(ws, request, peer),
        "/healthz" => Response::new(Full::new(Bytes::from_static(b"ok\n"))),
        _ => {
            let mut response = Response::new(Full::default());
            *response.status_mut() = hyper::StatusCode::NOT_FOUND;
            response
        }
    }
}

#[tokio::test]
async fn http_routes_and_websockets_share_a_port() {
    let addr = hyper_server(rapidws::stream::Server::new(Echo, Config::default())).await;
    assert_healthy(addr).await;
    let (mut client, response) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("upgraded through hyper");
    assert_eq!(response.status(), 101);
    for text in ["hello", "héllo wörld 🦀"] {
        client.send(WsMessage::text(text)).await.unwrap();
        assert_eq!(next(&mut client).await, WsMessage::text(text));
    }
    let data = vec![7u8; 1 << 20];
    client.send(WsMessage::binary(data.clone())).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::binary(data));
    client.close(None).await.unwrap();
}

#[tokio::test]
async fn the_101_carries_the_accept_key_the_protocol_and_deflate() {
    let config = Config::default().permessage_deflate(DeflateConfig::default());
    let addr = hyper_server(rapidws::stream::Server::new(Echo, config)).await;
    let extra = "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: other, chat\r\n\
                 Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
    let response = http_exchange(addr, &upgrade_head("GET", "/ws", "HTTP/1.1", extra)).await;
    let head = response.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{response}");
    // RFC 6455's example key and its answer.
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{response}"
    );
    assert!(
        head.contains("sec-websocket-protocol: chat\r\n"),
        "{response}"
    );
    assert!(
        head.contains("sec-websocket-extensions: permessage-deflate"),
        "{response}"
    );
    assert!(head.contains("upgrade: websocket"), "{response}");
}

#[tokio::test]
async fn bad_upgrades_get_the_standalone_servers_statuses() {
    let addr = hyper_server(rapidws::stream::Server::new(Echo, Config::default())).await;
    let version = "Sec-WebSocket-Version: 13\r\n";
    let cases = [
        // A plain request to the WebSocket route.
        (
            "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(),
            "400",
            None,
        ),
        (
            upgrade_head("POST", "/ws", "HTTP/1.1", version),
            "405",
            Some("allow: get"),
        ),
        (
            upgrade_head("GET", "/ws", "HTTP/1.1", "Sec-WebSocket-Version: 8\r\n"),
            "426",
            Some("sec-websocket-version: 13"),
        ),
        (upgrade_head("GET", "/ws", "HTTP/1.0", version), "400", None),
        (
            upgrade_head("GET", "/ws", "HTTP/1.1", version).replace("/ws ", "/ws?deny "),
            "403",
            None,
        ),
    ];
    for (head, status, header) in cases {
        let response = http_exchange(addr, &head).await;
        let lower = response.to_ascii_lowercase();
        // hyper answers an HTTP/1.0 request in HTTP/1.0.
        let status_line = lower.lines().next().unwrap_or("");
        assert!(
            status_line.starts_with("http/1."),
            "{head:?} got {response}"
        );
        assert_eq!(&status_line[9..12], status, "{head:?} got {response}");
        if let Some(header) = header {
            assert!(lower.contains(header), "{head:?} got {response}");
        }
        assert!(lower.contains("content-type: text/plain"), "{response}");
    }
    // A huge header: hyper's own limit answers (431), before any upgrade.
    let huge = format!(
        "GET /ws HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let response = http_exchange(addr, &huge).await;
    assert!(
        response.starts_with("HTTP/1.1 431"),
        "{}",
        &response[..response.len().min(200)]
    );
    // Everyone else is still served.
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    client.send(WsMessage::text("still here")).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::text("still here"));
}

#[tokio::test]
async fn the_async_socket_works_through_hyper_and_shutdown_closes_it() {
    let ws = rapidws::stream::Server::new(
        SocketHandler::new(|mut socket: WebSocket| async move {
            while let Some(Ok(message)) = socket.recv().await {
                if socket.send(message).await.is_err() {
                    break;
                }
            }
        }),
        Config::default(),
    );
    let handle = ws.handle();
    let addr = hyper_server(ws).await;
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    client.send(WsMessage::binary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(next(&mut client).await, WsMessage::binary(vec![1, 2, 3]));
    handle.shutdown();
    assert_eq!(expect_close(&mut client).await.0, 1001);
}

/// Over plain TCP the upgraded socket is taken back from hyper and served
/// in a connection group: a frame sent in the same write as the request
/// (which hyper read with it) is answered, and a connection leaves no
/// task behind once hyper has handed it over.
#[tokio::test]
async fn plain_tcp_upgrades_join_a_group_with_what_hyper_read() {
    let addr = hyper_server(rapidws::stream::Server::new(Echo, Config::default())).await;
    a_frame_sent_with_the_request_is_answered(addr, "/ws").await;
    // The groups run now; more connections add no task each (hyper's
    // connection tasks end once they hand their sockets over).
    connections_cost_no_task(&format!("ws://{addr}/ws"), false).await;
}

/// One server upgrading on two runtimes: each connection is served in a
/// group of its own runtime, so the first runtime's end leaves the
/// second's connection serving (in the first's group, it would end too).
#[test]
fn each_runtime_serves_its_own_upgrades() {
    let server = rapidws::stream::Server::new(Echo, Config::default());
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let connect = |addr: SocketAddr| async move {
        let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
            .await
            .unwrap();
        client.send(WsMessage::text("first")).await.unwrap();
        assert_eq!(next(&mut client).await, WsMessage::text("first"));
        client
    };
    let first = runtime();
    let first_client = first.block_on(async { connect(hyper_server(server.clone()).await).await });
    let second = runtime();
    let mut second_client =
        second.block_on(async { connect(hyper_server(server.clone()).await).await });
    drop(first);
    second.block_on(async {
        second_client.send(WsMessage::text("still")).await.unwrap();
        assert_eq!(next(&mut second_client).await, WsMessage::text("still"));
    });
    drop(first_client);
}
