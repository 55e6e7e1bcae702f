//! Forwarding headers from trusted proxies (`Config::trust_proxies`),
//! behind a real nginx: the client's address becomes `Conn::peer_addr`,
//! what a client forges itself is not believed, the `Origin` check
//! compares with the host the browser sent, and nothing is read from a
//! peer that is not trusted.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::{Backend, Child, WhoAmI, free_port};
use futures_util::SinkExt;
use rapidws::{Config, Network};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite;

/// The client's own address: 127.0.0.2, so that it differs from the
/// proxy's (127.0.0.1), the only one trusted.
const CLIENT: &str = "127.0.0.2";

async fn connect_from_client(to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{CLIENT}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// An upgrade to `to` with `extra` header lines: the status line, and
/// the server's first message if upgraded.
async fn upgrade(to: SocketAddr, host: &str, extra: &[(&str, &str)]) -> (u16, Option<String>) {
    let stream = connect_from_client(to).await;
    let mut request =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{host}/"))
            .unwrap();
    for (name, value) in extra {
        let name = tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((mut ws, response)) => {
            let first = common::next(&mut ws).await.into_text().unwrap().to_string();
            ws.send(tungstenite::Message::text("echo")).await.unwrap();
            assert_eq!(
                common::next(&mut ws).await,
                tungstenite::Message::text("echo")
            );
            let _ = ws.close(None).await;
            (response.status().as_u16(), Some(first))
        }
        Err(tungstenite::Error::Http(response)) => (response.status().as_u16(), None),
        Err(other) => panic!("upgrade through {to}: {other}"),
    }
}

/// nginx on 127.0.0.1:`front`, passing WebSockets to `upstream` with the
/// forwarding headers of docs/deploying.md, and `Host` rewritten to the
/// upstream's (so that only `X-Forwarded-Host` says what the browser
/// sent).
fn nginx(front: u16, upstream: SocketAddr) -> (Child, std::path::PathBuf) {
    let dir =
        std::env::temp_dir().join(format!("rapidws-forwarded-{front}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let site = format!(
        "server {{\n    listen 127.0.0.1:{front};\n    location / {{\n\
                 proxy_pass http://{upstream};\n\
                 proxy_http_version 1.1;\n\
                 proxy_set_header Upgrade $http_upgrade;\n\
                 proxy_set_header Connection \"upgrade\";\n\
                 proxy_set_header Host {upstream};\n\
                 proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
                 proxy_set_header X-Forwarded-Host $http_host;\n\
                 proxy_set_header X-Forwarded-Proto $scheme;\n\
             }}\n}}\n"
    );
    let child = Child(
        common::nginx_command(&dir, &site)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts"),
    );
    (child, dir)
}

#[tokio::test]
async fn behind_nginx_the_client_and_its_host_are_told() {
    let proxy: Network = "127.0.0.1".parse().unwrap();
    for backend in Backend::plain() {
        let trusting = Config::default().trust_proxies([proxy]);
        let server = common::serve(backend, WhoAmI, trusting, Default::default()).await;
        let front = free_port();
        let (_nginx, _dir) = nginx(front, server.addr);
        let front_addr: SocketAddr = format!("127.0.0.1:{front}").parse().unwrap();
        common::wait_listening("nginx", front_addr).await;
        let host = format!("127.0.0.1:{front}");
        let origin = format!("http://{host}");
        for _ in 0..5 {
            // The client's address, not nginx's; port 0: the header has none.
            let told = upgrade(front_addr, &host, &[]).await;
            assert_eq!(told, (101, Some(format!("{CLIENT}:0"))), "{backend:?}");
            // A forged X-Forwarded-For is to the left of what nginx saw.
            let forged = upgrade(front_addr, &host, &[("x-forwarded-for", "6.6.6.6")]).await;
            assert_eq!(forged, (101, Some(format!("{CLIENT}:0"))), "{backend:?}");
            // A page of the host the browser sent is let in, though
            // nginx rewrote `Host`.
            let page = upgrade(front_addr, &host, &[("origin", &origin)]).await;
            assert_eq!(page.0, 101, "{backend:?}");
            let other = upgrade(front_addr, &host, &[("origin", "http://evil.example")]).await;
            assert_eq!(other, (403, None), "{backend:?}");
        }

        // Without trust, the same nginx: its own address, and a page of the
        // browser's host refused (the Host nginx sent is the upstream's).
        let plain = common::serve(backend, WhoAmI, Config::default(), Default::default()).await;
        let front = free_port();
        let (_nginx, _dir) = nginx(front, plain.addr);
        let front_addr: SocketAddr = format!("127.0.0.1:{front}").parse().unwrap();
        common::wait_listening("nginx", front_addr).await;
        let host = format!("127.0.0.1:{front}");
        let (status, told) = upgrade(front_addr, &host, &[]).await;
        assert_eq!(status, 101);
        assert!(told.unwrap().starts_with("127.0.0.1:"), "{backend:?}");
        let page = upgrade(front_addr, &host, &[("origin", &format!("http://{host}"))]).await;
        assert_eq!(page, (403, None), "{backend:?}");
    }
}

#[tokio::test]
async fn headers_from_an_untrusted_peer_are_not_read_and_broken_ones_refused() {
    for backend in Backend::plain() {
        // Only 127.0.0.1 is trusted; the client connects from 127.0.0.2.
        let proxy: Network = "127.0.0.1".parse().unwrap();
        let server = common::serve(
            backend,
            WhoAmI,
            Config::default().trust_proxies([proxy]),
            Default::default(),
        )
        .await;
        let addr = server.addr;
        let host = addr.to_string();
        let (status, told) = upgrade(
            addr,
            &host,
            &[("x-forwarded-for", "6.6.6.6"), ("forwarded", "for=6.6.6.6")],
        )
        .await;
        assert_eq!(status, 101);
        let told: SocketAddr = told.unwrap().parse().unwrap();
        assert_eq!(told.ip().to_string(), CLIENT, "{backend:?}");
        assert_ne!(told.port(), 0);

        // From a trusted peer (127.0.0.1 itself): Forwarded is read, with
        // its port, and one that does not read is answered 400.
        let trusting = Config::default().trust_proxies(["127.0.0.0/8".parse().unwrap()]);
        let server = common::serve(backend, WhoAmI, trusting, Default::default()).await;
        let addr = server.addr;
        let host = addr.to_string();
        let header = "for=\"[2001:db8::9]:4711\";proto=https, for=127.0.0.5";
        let told = upgrade(addr, &host, &[("forwarded", header)]).await;
        assert_eq!(
            told,
            (101, Some("[2001:db8::9]:4711".to_owned())),
            "{backend:?}"
        );
        for broken in ["for=", "for=\"unterminated", "for=1.2.3.4;for=5.6.7.8"] {
            let mut stream = connect_from_client(addr).await;
            let request = common::upgrade_request("/", &format!("Forwarded: {broken}\r\n"));
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
                .await;
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.starts_with("HTTP/1.1 400 "),
                "{backend:?} {broken:?}: {answer}"
            );
            assert!(answer.contains("forwarding header"), "{answer}");
        }
        // And the next client is served.
        assert_eq!(upgrade(addr, &host, &[]).await.0, 101);
    }
}
