//! Connections a router accepted, served by the socket servers through
//! their `Entrance` (tokio's groups, io_uring's reactors): tokio-tungstenite
//! and Python's `websockets` as the peers, a request cut where the router
//! stopped reading, the PROXY protocol read by the router, connections
//! that wait for `serve`, refusals after it, and shutdowns with routed
//! connections open, in a loop.

#![cfg(all(target_os = "linux", feature = "uring", feature = "route"))]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rapidws::route::{Matcher, Routed, Router};
use rapidws::tokio::Entrance;
use rapidws::{Config, ProxyProtocol, ServerHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use common::WhoAmI;

#[derive(Clone, Copy, Debug)]
enum Backend {
    Tokio,
    Uring,
}

const BACKENDS: [Backend; 2] = [Backend::Tokio, Backend::Uring];

/// A server without a listener of its own, and a router in front of it
/// handing HTTP/1 connections to its entrance: the router's address, the
/// server's handle, and `serve`'s end.
struct Front {
    addr: SocketAddr,
    handle: ServerHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    router: tokio::task::JoinHandle<()>,
}

impl Drop for Front {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.router.abort();
    }
}

/// The server, not serving yet, and its entrance.
fn server(backend: Backend) -> (Entrance, ServerHandle, Box<dyn FnOnce() -> Served + Send>) {
    type ServeFn = Box<dyn FnOnce() -> Served + Send>;
    match backend {
        Backend::Tokio => {
            let server = rapidws::tokio::Server::without_listener(WhoAmI, Config::default());
            assert!(server.local_addr().is_err(), "no listener, no address");
            let (entrance, handle) = (server.entrance(), server.handle());
            let serve: ServeFn = Box::new(move || tokio::spawn(server.serve()));
            (entrance, handle, serve)
        }
        Backend::Uring => {
            let server =
                rapidws::uring::Server::without_listener(WhoAmI, Config::default()).threads(2);
            let (entrance, handle) = (server.entrance(), server.handle());
            let serve: ServeFn = Box::new(move || {
                let (done, served) = tokio::sync::oneshot::channel();
                std::thread::spawn(move || done.send(server.serve()));
                tokio::spawn(async move {
                    served
                        .await
                        .unwrap_or_else(|_| Err(std::io::Error::other("serve thread died")))
                })
            });
            (entrance, handle, serve)
        }
    }
}

type Served = tokio::task::JoinHandle<std::io::Result<()>>;

/// The router's route: into the entrance, with what it sniffed.
fn into(entrance: Entrance) -> Router {
    Router::new().route_to(Matcher::http1(), move |routed: Routed<TcpStream>| {
        let (read, tcp) = routed.stream.into_parts();
        let admitted = entrance.admit(tcp, routed.peer, read);
        async move { admitted.expect("admitted while serving") }
    })
}

async fn start(backend: Backend, router: impl FnOnce(Router) -> Router) -> Front {
    let (entrance, handle, serve) = server(backend);
    let served = serve();
    // `serve` opens the entrance once its loops run.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = router(into(entrance));
    let router = tokio::spawn(async move {
        let _ = router.serve(listener).await;
    });
    Front {
        addr,
        handle,
        served,
        router,
    }
}

/// Waits until the entrance is open (a `serve` on another thread starts
/// in its own time): a connection that is answered.
async fn until_serving(addr: SocketAddr) {
    for _ in 0..100 {
        let url = format!("ws://{addr}/");
        if tokio_tungstenite::connect_async(&url).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the routed server never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_connections_echo_and_know_their_peer() {
    for backend in BACKENDS {
        let server = start(backend, |router| router).await;
        until_serving(server.addr).await;
        for i in 0..20 {
            let url = format!("ws://{}/", server.addr);
            let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            let local = match ws.get_ref() {
                tokio_tungstenite::MaybeTlsStream::Plain(tcp) => tcp.local_addr().unwrap(),
                _ => unreachable!(),
            };
            let first = ws.next().await.unwrap().unwrap();
            assert_eq!(first, Message::text(local.to_string()), "{backend:?}");
            ws.send(Message::text(format!("text {i}"))).await.unwrap();
            assert_eq!(
                ws.next().await.unwrap().unwrap(),
                Message::text(format!("text {i}"))
            );
            let binary = vec![i as u8; 70_000];
            ws.send(Message::binary(binary.clone())).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(binary));
            ws.close(None).await.unwrap();
            // The server's close answer ends the stream.
            while let Some(Ok(_)) = ws.next().await {}
        }
        assert_eq!(
            server.handle.connections(),
            0,
            "{backend:?}: every routed connection ended"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_websockets_through_the_router() {
    for backend in BACKENDS {
        let server = start(backend, |router| router).await;
        until_serving(server.addr).await;
        let script = r#"
import asyncio, sys, websockets
async def main():
    async with websockets.connect(sys.argv[1]) as ws:
        peer = await ws.recv()
        assert peer == "%s:%d" % ws.local_address[:2], (peer, ws.local_address)
        for i in range(50):
            await ws.send("m%d" % i); assert await ws.recv() == "m%d" % i
            await ws.send(bytes([i]) * 3000); assert await ws.recv() == bytes([i]) * 3000
    print("ok")
asyncio.run(main())
"#;
        let out = tokio::process::Command::new(common::python())
            .args(["-c", script, &format!("ws://{}/", server.addr)])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success() && out.stdout.starts_with(b"ok"),
            "{backend:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The router decides on the request line; the rest of the request comes
/// after it handed the connection over, and the server reads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_where_the_router_stopped() {
    for backend in BACKENDS {
        let server = start(backend, |router| router).await;
        until_serving(server.addr).await;
        let request = common::upgrade_request("/", "");
        let (line, rest) = request.split_at(request.find("\r\n").unwrap() + 2);
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(line.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        for piece in rest.as_bytes().chunks(7) {
            tcp.write_all(piece).await.unwrap();
        }
        let head = common::read_head(&mut tcp).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{backend:?}: {head}");
    }
}

/// The PROXY header is the router's: the server sees the client it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_reads_the_proxy_header() {
    for backend in BACKENDS {
        let server = start(backend, |router| {
            router.proxy_protocol(ProxyProtocol::required())
        })
        .await;
        let mut answered = None;
        for _ in 0..100 {
            let mut tcp = TcpStream::connect(server.addr).await.unwrap();
            tcp.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 80\r\n")
                .await
                .unwrap();
            tcp.write_all(common::upgrade_request("/", "").as_bytes())
                .await
                .unwrap();
            let mut got = vec![0; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut got))
                .await
                .unwrap()
                .unwrap_or(0);
            if n > 0 {
                answered = Some((tcp, got[..n].to_vec()));
                break;
            }
            // Not serving yet (the io_uring server starts on its thread).
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (mut tcp, mut got) = answered.expect("answered");
        while !got.ends_with(b"203.0.113.7:40000") {
            let mut more = vec![0; 4096];
            let n = tcp.read(&mut more).await.unwrap();
            assert!(n > 0, "{backend:?}: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&more[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 101"), "{backend:?}");
    }
}

/// A connection accepted and admitted by hand: the client's side and
/// what `admit` said.
async fn admitted(listener: &TcpListener, entrance: &Entrance) -> (TcpStream, std::io::Result<()>) {
    let client = tokio::spawn(TcpStream::connect(listener.local_addr().unwrap()));
    let (tcp, peer) = listener.accept().await.unwrap();
    let client = client.await.unwrap().unwrap();
    (client, entrance.admit(tcp, peer, Default::default()))
}

/// The upgrade over `client`, and the peer address the server names.
async fn upgrades(client: TcpStream) -> String {
    let (mut ws, _) = tokio_tungstenite::client_async("ws://localhost/", client)
        .await
        .expect("served");
    ws.next()
        .await
        .unwrap()
        .unwrap()
        .into_text()
        .unwrap()
        .to_string()
}

/// Before `serve` runs, admitted connections wait for it and are served
/// once it does; after the shutdown they are refused, and so are those of
/// a server dropped without serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_serve_and_refused_after_it() {
    for backend in BACKENDS {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut byte = [0; 1];

        // Dropped unserved: what waited is closed.
        let (entrance, _, serve) = server(backend);
        let (mut client, admitted_early) = admitted(&listener, &entrance).await;
        admitted_early.unwrap();
        drop(serve);
        assert_eq!(client.read(&mut byte).await.unwrap(), 0, "{backend:?}");
        let refused = admitted(&listener, &entrance).await.1.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::NotConnected);

        let (entrance, handle, serve) = server(backend);
        let (early, admitted_early) = admitted(&listener, &entrance).await;
        admitted_early.unwrap();
        let own = early.local_addr().unwrap();
        let served = serve();
        assert_eq!(upgrades(early).await, own.to_string(), "{backend:?}");
        let (late, admitted_late) = admitted(&listener, &entrance).await;
        admitted_late.unwrap();
        let own = late.local_addr().unwrap();
        assert_eq!(upgrades(late).await, own.to_string(), "{backend:?}");

        handle.shutdown();
        served.await.unwrap().unwrap();
        let (mut client, refused) = admitted(&listener, &entrance).await;
        assert_eq!(
            refused.unwrap_err().kind(),
            std::io::ErrorKind::NotConnected
        );
        // The refused stream is closed: its peer reads the end.
        assert_eq!(client.read(&mut byte).await.unwrap(), 0, "{backend:?}");
    }
}

/// A shutdown with routed connections open: each gets 1001 and `serve`
/// returns, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdowns_close_routed_connections() {
    for backend in BACKENDS {
        for round in 0..10 {
            let server = start(backend, |router| router).await;
            until_serving(server.addr).await;
            let mut clients = Vec::new();
            for _ in 0..8 {
                let url = format!("ws://{}/", server.addr);
                let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
                ws.next().await.unwrap().unwrap();
                clients.push(ws);
            }
            server.handle.shutdown();
            for ws in &mut clients {
                let code = loop {
                    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
                        Ok(Some(Ok(Message::Close(frame)))) => {
                            break frame.map(|f| u16::from(f.code));
                        }
                        Ok(Some(Ok(_))) => continue,
                        other => panic!("{backend:?} round {round}: {other:?}"),
                    }
                };
                assert_eq!(code, Some(1001), "{backend:?} round {round}");
                // tungstenite's answering close goes out with this flush.
                let _ = ws.flush().await;
            }
            let mut server = server;
            let served = tokio::time::timeout(Duration::from_secs(10), &mut server.served);
            served.await.unwrap().unwrap().unwrap();
        }
    }
}
