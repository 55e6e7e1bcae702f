//! The client through real proxies from Debian's packages (installed with
//! apt-get on first use, started here on free loopback ports, stopped when
//! the test ends): tinyproxy for HTTP CONNECT with Basic credentials,
//! microsocks for SOCKS5 with a username and password. Refusals (407, a
//! SOCKS5 failure, a wrong password), a proxy that never answers, and the
//! proxy taken from the environment by the client example.
#![cfg(feature = "client")]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rapidws::client::{Client, ConnectError, Proxy, ProxyError, Stage};
use rapidws::{Config, OwnedMessage};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Waits until something listens on `addr`.
async fn listening(addr: SocketAddr) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing listens on {addr}");
}

/// tinyproxy on a free port, with Basic credentials `alice:s3cret`.
async fn tinyproxy() -> (Child, SocketAddr) {
    let binary = debian_binary("/usr/bin/tinyproxy", "tinyproxy");
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("rapidws-tinyproxy-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("tinyproxy.conf");
    // No ConnectPort line: CONNECT to any port.
    let text = format!(
        "Port {port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 64\nAllow 127.0.0.1\n\
         BasicAuth alice s3cret\nLogLevel Warning\n"
    );
    std::fs::write(&conf, text).unwrap();
    let child = Command::new(binary)
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .spawn()
        .expect("tinyproxy starts");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let child = Child(child);
    listening(addr).await;
    (child, addr)
}

/// microsocks on a free port, with the username `bob` and password `pw`.
async fn microsocks() -> (Child, SocketAddr) {
    let binary = debian_binary("/usr/bin/microsocks", "microsocks");
    let port = free_port();
    let child = Command::new(binary)
        .args([
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-u",
            "bob",
            "-P",
            "pw",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("microsocks starts");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let child = Child(child);
    listening(addr).await;
    (child, addr)
}

async fn echo_through(client: &Client, url: &str) -> SocketAddr {
    let (mut socket, _) = client.connect(url).await.unwrap();
    for text in ["through the proxy", "and again"] {
        socket.send(text).await.unwrap();
        assert_eq!(
            socket.recv().await.unwrap().unwrap(),
            OwnedMessage::Text(text.into())
        );
    }
    socket.conn().peer_addr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connect_with_basic_credentials() {
    let (_proxy, proxy_addr) = tinyproxy().await;
    let server = start(Backend::Tokio, Config::default()).await;
    let proxy = Proxy::new(&format!("http://alice:s3cret@{proxy_addr}")).unwrap();
    let client = Client::new(Config::default()).proxy(proxy);
    let peer = echo_through(&client, &server.url("/")).await;
    assert_eq!(peer, proxy_addr, "the TCP connection went to the proxy");

    // wss through the tunnel: TLS runs end to end, the proxy sees only
    // bytes (and resolves `localhost` itself).
    #[cfg(feature = "rustls")]
    {
        let tls_server = start(Backend::Tls, Config::default()).await;
        let port = tls_server.tls_addr.unwrap().port();
        let tls_client = client.clone().tls(tls::client_config());
        echo_through(&tls_client, &format!("wss://localhost:{port}/")).await;
    }

    // No credentials: 407; wrong ones: tinyproxy answers 401.
    for (url, status) in [
        (format!("http://{proxy_addr}"), 407),
        (format!("http://alice:wrong@{proxy_addr}"), 401),
    ] {
        let client = Client::new(Config::default()).proxy(Proxy::new(&url).unwrap());
        let error = client.connect(server.url("/")).await.unwrap_err();
        assert!(
            matches!(error, ConnectError::Proxy(ProxyError::Refused { status: s }) if s == status),
            "{url}: {error:?}"
        );
        assert_eq!(error.status(), Some(status));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_with_a_username_and_password() {
    let (_proxy, proxy_addr) = microsocks().await;
    let server = start(Backend::Tokio, Config::default()).await;
    let port = server.addr.port();
    for scheme in ["socks5", "socks5h"] {
        let proxy = Proxy::new(&format!("{scheme}://bob:pw@{proxy_addr}")).unwrap();
        let client = Client::new(Config::default()).proxy(proxy);
        // By address, and by name (resolved here for socks5, by the proxy
        // for socks5h).
        let peer = echo_through(&client, &server.url("/")).await;
        assert_eq!(peer, proxy_addr);
        echo_through(&client, &format!("ws://localhost:{port}/")).await;
    }

    let refused = |url: String| async move {
        let client = Client::new(Config::default()).proxy(Proxy::new(&url).unwrap());
        client.connect(server_url(port)).await.unwrap_err()
    };
    let error = refused(format!("socks5://bob:nope@{proxy_addr}")).await;
    assert!(
        matches!(error, ConnectError::Proxy(ProxyError::AuthenticationFailed)),
        "{error:?}"
    );
    let error = refused(format!("socks5://{proxy_addr}")).await;
    assert!(
        matches!(error, ConnectError::Proxy(ProxyError::NoAcceptableMethod)),
        "{error:?}"
    );

    // The proxy cannot reach the target: its reply code says why.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let client = Client::new(Config::default())
        .proxy(Proxy::new(&format!("socks5://bob:pw@{proxy_addr}")).unwrap());
    let error = client.connect(server_url(closed_port)).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::Proxy(ProxyError::Socks { reply: 5 })),
        "{error:?}"
    );
}

fn server_url(port: u16) -> String {
    format!("ws://127.0.0.1:{port}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_answers_times_out() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (tcp, _) = silent.accept().await.unwrap();
            held.push(tcp);
        }
    });
    for scheme in ["http", "socks5"] {
        let client = Client::new(Config::default())
            .proxy(Proxy::new(&format!("{scheme}://{addr}")).unwrap())
            .connect_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let error = client.connect("ws://127.0.0.1:9/").await.unwrap_err();
        assert!(
            matches!(error, ConnectError::Timeout(Stage::Proxy)),
            "{scheme}: {error:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    held.abort();
}

/// The client example takes its proxy from the environment (`http_proxy`
/// for ws), and `no_proxy` bypasses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_example_takes_the_proxy_from_the_environment() {
    let (_proxy, proxy_addr) = tinyproxy().await;
    let server = start(Backend::Tokio, Config::default()).await;
    // Sends two lines, each after the echo of the one before, then ends
    // the input; returns the exit status, what was printed and the log.
    let run = |env: Vec<(&'static str, String)>| {
        let url = server.url("/");
        async move {
            let mut child = tokio::process::Command::new(example("client"))
                .arg(url)
                .env_remove("http_proxy")
                .env_remove("all_proxy")
                .env_remove("ALL_PROXY")
                .env_remove("no_proxy")
                .env_remove("NO_PROXY")
                .envs(env)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("the client example runs");
            let mut stdin = child.stdin.take().unwrap();
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let mut printed = Vec::new();
            for line in ["hello", "world"] {
                if stdin
                    .write_all(format!("{line}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                let next = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
                match next.expect("an echo or the end") {
                    Ok(Some(echo)) => printed.push(echo),
                    _ => break,
                }
            }
            drop(stdin);
            let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
                .await
                .expect("the client exits")
                .unwrap();
            (
                out.status,
                printed,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let through = format!("http://alice:s3cret@{proxy_addr}");
    let (status, printed, log) = run(vec![("http_proxy", through)]).await;
    assert!(status.success(), "{log}");
    assert_eq!(printed, ["hello", "world"]);
    let seen = server.recorder.wait_closes(1).await;
    assert_eq!(seen[0].0, 1000);

    // A proxy that refuses (no credentials), bypassed by no_proxy.
    let refusing = format!("http://{proxy_addr}");
    let (status, printed, log) = run(vec![("http_proxy", refusing.clone())]).await;
    assert!(!status.success() && printed.is_empty());
    assert!(log.contains("407"), "{log}");
    let bypass = vec![
        ("http_proxy", refusing),
        ("no_proxy", "localhost,127.0.0.1".into()),
    ];
    let (status, printed, log) = run(bypass).await;
    assert!(status.success(), "{log}");
    assert_eq!(printed, ["hello", "world"]);
}

/// A proxy that is not there is named as the failure, not the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_proxy_is_reported_as_the_proxy() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let proxy = Proxy::new(&format!("http://127.0.0.1:{port}")).unwrap();
    let client = Client::new(Config::default()).proxy(proxy);
    let error = client
        .connect("ws://target.invalid/")
        .await
        .map(|_| ())
        .unwrap_err();
    let ConnectError::ProxyUnreachable {
        proxy,
        error: inner,
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(proxy, &format!("127.0.0.1:{port}"));
    assert!(matches!(**inner, ConnectError::Connect { .. }), "{inner:?}");
    let message = error.to_string();
    assert!(message.contains("could not reach the proxy"), "{message}");
    assert!(message.contains("the target was not tried"), "{message}");
}
