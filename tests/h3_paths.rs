//! HTTP/3 on paths that are not clean: loss and delay (in network
//! namespaces this test makes and removes), and a client that moves to
//! another address (QUIC's connection migration, `QuicConfig::migration`).
//!
//! This machine's kernel has no netem (`CONFIG_NET_SCH_NETEM` is not set:
//! `tc qdisc add ... netem` answers "Specified qdisc kind is unknown"), so
//! the path is made of what it has: loss is nftables' random drop
//! (`numgen random`) on each namespace's outgoing UDP, and delay is a
//! `tbf` bottleneck on each side of the veth pair (queueing delay, up to
//! its latency bound, rather than a fixed one).

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use rapidws::h3::QuicConfig;
use tokio::io::AsyncBufReadExt;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Two network namespaces joined by a veth pair, each side's outgoing
/// UDP losing some packets and going through a bottleneck; removed on drop.
struct Path {
    ip: std::path::PathBuf,
    server: String,
    client: String,
}

impl Path {
    /// Server side `10.77.X.1`, client side `10.77.X.2`; each drops
    /// `loss_percent` of the UDP packets it sends and sends at most `rate`
    /// (tbf, e.g. `50mbit`, 100 ms of queue at most).
    fn new(loss_percent: u32, rate: &str) -> (Path, String) {
        let ip = common::debian_binary("/usr/sbin/ip", "iproute2");
        let tc = common::debian_binary("/usr/sbin/tc", "iproute2");
        let nft = common::debian_binary("/usr/sbin/nft", "nftables");
        let id = std::process::id() % 100_000;
        let path = Path {
            ip: ip.clone(),
            server: format!("rws{id}s"),
            client: format!("rws{id}c"),
        };
        let subnet = format!("10.77.{}", id % 250);
        let run = |program: &std::path::Path, args: &[&str]| {
            let status = Command::new(program).args(args).status().unwrap();
            assert!(status.success(), "{} {args:?}: {status}", program.display());
        };
        let (server, client) = (&path.server, &path.client);
        run(&ip, &["netns", "add", server]);
        run(&ip, &["netns", "add", client]);
        run(
            &ip,
            &[
                "link", "add", server, "netns", server, "type", "veth", "peer", "name", client,
                "netns", client,
            ],
        );
        let rules = std::env::temp_dir().join(format!("rapidws-{id}-lossy.nft"));
        std::fs::write(
            &rules,
            format!(
                "table inet lossy {{\n chain out {{\n  type filter hook output priority 0; \
                 policy accept;\n  meta l4proto udp numgen random mod 100 < {loss_percent} counter drop\n \
                 }}\n}}\n"
            ),
        )
        .unwrap();
        for (ns, end) in [(server, "1"), (client, "2")] {
            let address = format!("{subnet}.{end}/24");
            run(&ip, &["-n", ns, "addr", "add", &address, "dev", ns]);
            run(&ip, &["-n", ns, "link", "set", ns, "up"]);
            run(&ip, &["-n", ns, "link", "set", "lo", "up"]);
            let shape = [
                "-n", ns, "qdisc", "add", "dev", ns, "root", "tbf", "rate", rate, "burst", "64kb",
                "latency", "100ms",
            ];
            run(&tc, &shape);
            let file = rules.to_str().unwrap();
            run(
                &ip,
                &["netns", "exec", ns, nft.to_str().unwrap(), "-f", file],
            );
        }
        let _ = std::fs::remove_file(&rules);
        (path, format!("{subnet}.1"))
    }

    /// The UDP packets each side's rule dropped so far (server, client).
    fn dropped(&self) -> [u64; 2] {
        let nft = common::debian_binary("/usr/sbin/nft", "nftables");
        [&self.server, &self.client].map(|ns| {
            let listed = Command::new(&self.ip)
                .args(["netns", "exec", ns])
                .arg(&nft)
                .args(["list", "ruleset"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&listed.stdout);
            text.split("packets ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
    }

    /// `program` with `args`, run in `ns`.
    fn command(&self, ns: &str, program: &std::path::Path) -> Command {
        let mut command = Command::new(&self.ip);
        command.args(["netns", "exec", ns]).arg(program);
        command
    }
}

impl Drop for Path {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            let _ = Command::new(&self.ip).args(["netns", "del", ns]).status();
        }
    }
}

/// With 3% of the UDP packets lost each way and a 20 Mbit/s bottleneck,
/// aioquic's WebSocket over HTTP/3 to `h3_echo` gets every message back
/// whole and in order (sizes 0 to 1 MiB, 1,379,899 bytes), then the close:
/// QUIC retransmits what a lost packet carried, and only its own stream
/// waits.
#[tokio::test]
async fn loss_and_delay_keep_every_message_whole_and_in_order() {
    let (path, server_ip) = Path::new(3, "20mbit");
    let identity = common::tls::identity();
    let port = 9443;
    let addr = format!("{server_ip}:{port}");
    let mut server = path.command(&path.server, &common::example("h3_echo"));
    server
        .args(["--addr", &addr])
        .args(["--tls-cert", identity.cert_pem.to_str().unwrap()])
        .args(["--tls-key", identity.key_pem.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped());
    let mut child = server.spawn().unwrap();
    // Its first log line says it listens (its TCP side is bound after QUIC's).
    let stderr = tokio::process::ChildStderr::from_std(child.stderr.take().unwrap()).unwrap();
    let _server = common::Child(child);
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let listening = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("h3_echo starts within 20 s")
        .unwrap()
        .unwrap_or_default();
    assert!(listening.contains("h3_echo on"), "{listening}");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let started = Instant::now();
    let python = common::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/h3_client.py");
    let mut client = path.command(&path.client, python);
    client
        .args([script, &server_ip, &port.to_string()])
        .arg(&identity.cert_pem)
        .arg("echo");
    let output = tokio::task::spawn_blocking(move || client.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let dropped = path.dropped();
    eprintln!(
        "through 3% loss and 20 Mbit/s each way: {result} in {:?}; packets dropped {dropped:?}",
        started.elapsed()
    );
    assert_eq!(result["status"], "200", "{result}");
    assert_eq!(result["echoed"], 8, "{result}");
    assert_eq!(result["bytes"], 1_379_899, "{result}");
    assert_eq!(result["close"], serde_json::json!([1000]), "{result}");
    assert_eq!(result["ended"], true, "{result}");
    // The path did lose packets, both ways.
    assert!(dropped.iter().all(|&n| n > 0), "{dropped:?}");
}

/// A WebSocket over HTTP/3 on a QUIC connection whose client then moves to
/// another local address (127.0.0.2, a new UDP socket): with migration on
/// (the default) the echo goes on; with it off, the server drops what
/// comes from the new address and the echo never comes. The frames are
/// tokio-tungstenite's, over `h3::Client`'s stream.
#[tokio::test]
async fn a_client_that_moves_keeps_its_websocket_when_migration_is_on() {
    for migration in [true, false] {
        let quic = QuicConfig {
            migration,
            ..QuicConfig::default()
        };
        let server =
            rapidws::stream::Server::new(common::Echo { page: None }, rapidws::Config::default());
        let (endpoint, addr) = common::tls::h3_endpoint_with(&quic);
        let serving = tokio::spawn(async move { rapidws::h3::serve(endpoint, &server).await });
        let echoed = moved_echo(addr).await;
        assert_eq!(echoed, migration, "migration {migration}");
        serving.abort();
    }
}

/// Opens a WebSocket, echoes once, moves the client's socket to
/// 127.0.0.2, and says whether the next echo came (within 3 s).
async fn moved_echo(addr: SocketAddr) -> bool {
    let endpoint = common::tls::h3_client_endpoint("127.0.0.1:0".parse().unwrap());
    let conn = endpoint.connect(addr, "localhost").unwrap().await.unwrap();
    let client = rapidws::h3::Client::new(conn.clone()).await.unwrap();
    let (response, stream) = client.open_websocket("localhost", "/", &[]).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut ws = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
    ws.send(WsMessage::text("before")).await.unwrap();
    let before = ws.next().await.unwrap().unwrap();
    assert_eq!(before.into_text().unwrap().as_str(), "before");

    let moved = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    endpoint.rebind(moved).unwrap();
    assert_eq!(
        endpoint.local_addr().unwrap().ip(),
        "127.0.0.2".parse::<std::net::IpAddr>().unwrap()
    );
    ws.send(WsMessage::text("after")).await.unwrap();
    let after = tokio::time::timeout(Duration::from_secs(3), ws.next()).await;
    match after {
        Ok(Some(Ok(message))) => {
            assert_eq!(message.into_text().unwrap().as_str(), "after");
            true
        }
        _ => false,
    }
}
