//! The one_port example: one listening port for downloads, `/whoami`, a
//! WebSocket echo, gRPC's health service and an smux echo, plain and over
//! TLS, each connection routed by its first bytes; and the same behind a
//! real HAProxy in TCP mode with `send-proxy-v2`. Every client is another
//! implementation: curl, Python's `websockets`, grpc-go, xtaci/smux.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{Child, debian_binary, free_port, python, start_example, wait_listening};

/// The folder the example serves, with one file in it.
fn files() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rapidws-one-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.txt"), "hello from one port\n").unwrap();
    dir
}

async fn one_port(extra: &[&str]) -> (Child, SocketAddr) {
    let tls = common::tls::identity();
    let files = files();
    let mut args = vec![
        "--tls-cert",
        tls.cert_pem.to_str().unwrap(),
        "--tls-key",
        tls.key_pem.to_str().unwrap(),
        "--files",
        files.to_str().unwrap(),
    ];
    args.extend(extra);
    start_example("one_port", &args).await
}

/// curl's answer body, or `None` if curl failed; from local port `from`.
async fn curl(url: &str, from: Option<u16>) -> Option<String> {
    let mut command = tokio::process::Command::new("curl");
    command.args(["-sS", "-k", "--max-time", "20", url]);
    if let Some(port) = from {
        command.args(["--local-port", &port.to_string()]);
    }
    let out = command.output().await.expect("curl runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Downloads and `/whoami` over plain HTTP and HTTPS, through `via`;
/// `/whoami` must name curl's own address.
async fn http_routes(via: SocketAddr) {
    for scheme in ["http", "https"] {
        let file = curl(&format!("{scheme}://{via}/files/hello.txt"), None).await;
        assert_eq!(file.as_deref(), Some("hello from one port\n"), "{scheme}");
        let missing = curl(&format!("{scheme}://{via}/files/..%2fhello.txt"), None).await;
        assert_eq!(missing.as_deref(), Some("no such file\n"), "{scheme}");
        let port = free_port();
        let whoami = curl(&format!("{scheme}://{via}/whoami"), Some(port)).await;
        assert_eq!(whoami, Some(format!("127.0.0.1:{port}")), "{scheme}");
    }
}

/// Python's `websockets` over ws and wss: text and binary echoed.
async fn websockets(via: SocketAddr) {
    let script = r#"
import asyncio, ssl, sys
from websockets.asyncio.client import connect
async def main():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for url, kw in [("ws://%s/ws" % sys.argv[1], {}), ("wss://%s/ws" % sys.argv[1], {"ssl": ctx})]:
        async with connect(url, **kw) as ws:
            await ws.send("text one")
            assert await ws.recv() == "text one"
            await ws.send(bytes(range(256)) * 40)
            assert await ws.recv() == bytes(range(256)) * 40
        print("ok", url.split(":")[0])
asyncio.run(main())
"#;
    let via = via.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args(["-c", script, &via])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok ws\nok wss\n");
}

/// grpc-go's health client over TLS (ALPN h2): SERVING for "", NOT_FOUND
/// for another service.
async fn grpc(via: SocketAddr) {
    let peer = common::go_build("tests/one_port/go", ".", "grpchealth", &[]);
    for (service, want) in [("", "SERVING"), ("chat", "error NotFound")] {
        let out = tokio::process::Command::new(&peer)
            .args(["-addr", &via.to_string(), "-service", service])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            want,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// xtaci/smux, versions 1 and 2, over plain TCP and over TLS (ALPN smux):
/// 50 streams each, every byte of the echo checked.
async fn smux(via: SocketAddr) {
    let peer = common::go_program("smuxpeer");
    for version in ["1", "2"] {
        for tls in [false, true] {
            let mut command = tokio::process::Command::new(&peer);
            command.args(["-tcp", &via.to_string(), "-version", version]);
            command.args(["-streams", "50", "-timeout", "60s"]);
            if tls {
                command.arg("-tls");
            }
            let out = command.output().await.unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.starts_with("ok"),
                "smux v{version} tls={tls}: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_on_one_port() {
    let (_server, addr) = one_port(&[]).await;
    http_routes(addr).await;
    websockets(addr).await;
    grpc(addr).await;
    smux(addr).await;
    // What no route takes is closed without an answer; the port serves on.
    let closed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(b"\x00\x00garbage\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    })
    .await
    .unwrap();
    assert!(closed.is_empty(), "{closed:?}");
    http_routes(addr).await;
}

/// HAProxy in TCP mode, `send-proxy-v2`, in front of `--proxy-protocol`:
/// `/whoami` names curl's own address, over HTTP and HTTPS (TLS passed
/// through), and every other route works through it; straight to the
/// server without a header, nothing is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_haproxy_with_the_proxy_protocol() {
    let (_server, addr) = one_port(&["--proxy-protocol"]).await;
    let haproxy = debian_binary("/usr/sbin/haproxy", "haproxy");
    let front: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = std::env::temp_dir().join(format!("rapidws-one-port-haproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = format!(
        "global\n    maxconn 256\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 60s\n    timeout server 60s\n\n\
         frontend one\n    bind {front}\n    default_backend port\n\n\
         backend port\n    server one {addr} send-proxy-v2\n"
    );
    std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
    let _haproxy = Child(
        Command::new(haproxy)
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts"),
    );
    wait_listening("haproxy", front).await;
    http_routes(front).await;
    websockets(front).await;
    grpc(front).await;
    smux(front).await;
    // Past HAProxy, without a header: curl gets nothing.
    assert_eq!(curl(&format!("http://{addr}/whoami"), None).await, None);
    assert_eq!(curl(&format!("https://{addr}/whoami"), None).await, None);
}

/// The sniff is bounded in time (5 s, the router's default): a peer that
/// sends nothing, or dribbles a request line that never decides, is
/// closed unanswered at about 5 s, and meanwhile others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_dribbling_peers_are_closed_at_the_sniff_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_server, addr) = one_port(&[]).await;
    let peer = |dribble: bool| async move {
        let started = std::time::Instant::now();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut reader, mut writer) = stream.split();
        let mut answer = Vec::new();
        let reading = reader.read_to_end(&mut answer);
        let writing = async {
            // One byte a second of a line no matcher can decide on yet.
            for byte in b"GET /whoami-but-slowly"
                .iter()
                .take(if dribble { 20 } else { 0 })
            {
                if writer.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            std::future::pending::<()>().await
        };
        let read = tokio::select! {
            read = reading => read,
            () = writing => unreachable!(),
        };
        let took = started.elapsed();
        assert!(
            read.is_ok() && answer.is_empty(),
            "dribble {dribble}: {answer:?}"
        );
        (dribble, took)
    };
    // Others are served while both wait.
    let (silent, dribbling, ()) = tokio::join!(peer(false), peer(true), async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        http_routes(addr).await;
    });
    for (dribble, took) in [silent, dribbling] {
        assert!(
            took >= std::time::Duration::from_millis(4_500)
                && took < std::time::Duration::from_secs(9),
            "dribble {dribble}: closed after {took:?}"
        );
    }
}
