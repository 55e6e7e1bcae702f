//! The PROXY protocol on the socket servers (`Config::proxy_protocol`):
//! the address in the header becomes `Conn::peer_addr`, behind a real
//! HAProxy (`send-proxy`, `send-proxy-v2`) and from Python's `websockets`
//! on a socket that sent the header first, and on the wss servers before
//! the TLS handshake (HAProxy passing TLS through); a connection without a
//! valid header, or from a source not listed, is closed without a byte,
//! while everyone else is served.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    Backend, Child, WhoAmI, debian_binary, free_port, python, read_to_close, upgrade_request,
};
use futures_util::SinkExt;
use rapidws::{Config, Network, ProxyProtocol};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;

async fn server(backend: Backend, protocol: ProxyProtocol) -> common::TestServer {
    let config = Config::default()
        .proxy_protocol(protocol)
        .handshake_timeout(Duration::from_secs(1));
    common::serve(backend, WhoAmI, config, Default::default()).await
}

/// A WebSocket over `stream` (the header already sent): the server's
/// first message, then an echo checked.
async fn whoami(stream: TcpStream, addr: SocketAddr) -> String {
    whoami_at(stream, format!("ws://{addr}/")).await
}

/// [`whoami`] over any stream, at `url`.
async fn whoami_at<S>(stream: S, url: String) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ws, _) = tokio_tungstenite::client_async(url, stream)
        .await
        .expect("upgrade after the header");
    let first = common::next(&mut ws).await;
    ws.send(tungstenite::Message::text("echo")).await.unwrap();
    assert_eq!(
        common::next(&mut ws).await,
        tungstenite::Message::text("echo")
    );
    let _ = ws.close(None).await;
    first.into_text().unwrap().to_string()
}

/// Sends `header` (in pieces of `piece` bytes), then upgrades.
async fn behind(addr: SocketAddr, header: &[u8], piece: usize) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    for chunk in header.chunks(piece.max(1)) {
        stream.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    whoami(stream, addr).await
}

fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut header = rapidws::rapidws_core::sniff::proxy::V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x20 | command, family]);
    header.extend_from_slice(&(body.len() as u16).to_be_bytes());
    header.extend_from_slice(body);
    header
}

fn v2_tcp6(source: &str, port: u16) -> Vec<u8> {
    let source: std::net::Ipv6Addr = source.parse().unwrap();
    let mut body = source.octets().to_vec();
    body.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    body.extend_from_slice(&port.to_be_bytes());
    body.extend_from_slice(&80u16.to_be_bytes());
    // A TLV (the authority), skipped.
    body.extend_from_slice(&[0x02, 0, 9]);
    body.extend_from_slice(b"a.example");
    v2(1, 0x21, &body)
}

#[tokio::test]
async fn the_header_names_the_client() {
    for backend in Backend::sockets() {
        let server = server(backend, ProxyProtocol::required()).await;
        let addr = server.addr;
        let v1 = b"PROXY TCP4 192.0.2.7 127.0.0.1 56324 80\r\n";
        for piece in [v1.len(), 1, 7] {
            assert_eq!(
                behind(addr, v1, piece).await,
                "192.0.2.7:56324",
                "{backend:?}, pieces of {piece}"
            );
        }
        let tcp6 = v2_tcp6("2001:db8::7", 443);
        for piece in [tcp6.len(), 1, 5] {
            assert_eq!(
                behind(addr, &tcp6, piece).await,
                "[2001:db8::7]:443",
                "{backend:?}"
            );
        }
        // The header and the request in one write.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut both = v1.to_vec();
        both.extend_from_slice(upgrade_request("/", "").as_bytes());
        stream.write_all(&both).await.unwrap();
        let head = common::read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{backend:?}: {head}");

        // A proxy's own connection (LOCAL) and an unknown family keep
        // the connection's address.
        for header in [v2(0, 0x00, b""), b"PROXY UNKNOWN\r\n".to_vec()] {
            let stream = TcpStream::connect(addr).await.unwrap();
            let own = stream.local_addr().unwrap();
            let mut stream = stream;
            stream.write_all(&header).await.unwrap();
            assert_eq!(whoami(stream, addr).await, own.to_string(), "{backend:?}");
        }
    }
}

/// What a connection that breaks the rules is answered: nothing, and the
/// connection is closed; the next good one is served.
async fn closed_without_a_word(addr: SocketAddr, send: &[u8]) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(send).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_to_close(&mut stream))
        .await
        .expect("closed within the handshake timeout");
    assert!(
        answer.is_empty(),
        "answered {:?} to {:?}",
        String::from_utf8_lossy(&answer),
        String::from_utf8_lossy(send)
    );
}

#[tokio::test]
async fn connections_without_a_valid_header_are_closed_and_others_served() {
    for backend in Backend::sockets() {
        let server = server(backend, ProxyProtocol::required()).await;
        let addr = server.addr;
        let request = upgrade_request("/", "");
        let mut oversized = v2(1, 0x11, &[0; 12]);
        oversized[14..16].copy_from_slice(&8000u16.to_be_bytes());
        let mut cut_tlv = v2(
            1,
            0x11,
            &[
                [127, 0, 0, 1, 127, 0, 0, 1, 1, 1, 0, 80].as_slice(),
                &[1, 0, 9, b'h'],
            ]
            .concat(),
        );
        cut_tlv.extend_from_slice(request.as_bytes());
        for _ in 0..5 {
            for send in [
                request.as_bytes(),                                     // no header
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",                    // a field short
                b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",                 // a leading zero
                &[b"PROXY UNKNOWN ".as_slice(), &[b'x'; 120]].concat(), // no CRLF in 107
                &oversized,
                &cut_tlv,
                b"PROXY TCP4 1.2.3.4", // then silence
                b"",                   // nothing at all
            ] {
                closed_without_a_word(addr, send).await;
            }
            assert_eq!(
                behind(addr, b"PROXY TCP4 192.0.2.9 127.0.0.1 1 80\r\n", 64).await,
                "192.0.2.9:1"
            );
        }
    }
}

#[tokio::test]
async fn only_listed_sources_are_taken() {
    for backend in Backend::sockets() {
        let elsewhere: Network = "10.0.0.0/8".parse().unwrap();
        let server = server(backend, ProxyProtocol::required().from_sources([elsewhere])).await;
        closed_without_a_word(server.addr, b"PROXY TCP4 192.0.2.7 127.0.0.1 1 80\r\n").await;
        let here: Network = "127.0.0.0/8".parse().unwrap();
        let server = common::serve(
            backend,
            WhoAmI,
            Config::default()
                .proxy_protocol(ProxyProtocol::required().from_sources([elsewhere, here])),
            Default::default(),
        )
        .await;
        assert_eq!(
            behind(server.addr, b"PROXY TCP4 192.0.2.7 127.0.0.1 1 80\r\n", 64).await,
            "192.0.2.7:1"
        );
    }
}

/// The wss servers with the PROXY protocol: tokio (with and without
/// `also_plain`) and io_uring, each listening on its own port; the
/// header comes before the TLS handshake.
#[cfg(feature = "rustls")]
struct TlsServers {
    addrs: Vec<(&'static str, SocketAddr)>,
    handles: Vec<rapidws::ServerHandle>,
}

#[cfg(feature = "rustls")]
impl Drop for TlsServers {
    fn drop(&mut self) {
        for handle in &self.handles {
            handle.shutdown();
        }
    }
}

#[cfg(feature = "rustls")]
async fn tls_servers(protocol: ProxyProtocol) -> TlsServers {
    let config = Config::default()
        .proxy_protocol(protocol)
        .handshake_timeout(Duration::from_secs(1));
    let (mut addrs, mut handles) = (Vec::new(), Vec::new());
    for also_plain in [false, true] {
        let server = rapidws::tokio::Server::bind("127.0.0.1:0", WhoAmI, config.clone())
            .await
            .unwrap()
            .tls(common::tls::server_config());
        let server = if also_plain {
            server.also_plain()
        } else {
            server
        };
        let name = if also_plain { "tokio+plain" } else { "tokio" };
        addrs.push((name, server.local_addr().unwrap()));
        handles.push(server.handle());
        tokio::spawn(server.serve());
    }
    #[cfg(all(target_os = "linux", feature = "uring"))]
    {
        let server = rapidws::uring::Server::bind("127.0.0.1:0", WhoAmI, config)
            .unwrap()
            .threads(2)
            .tls(common::tls::server_config());
        addrs.push(("uring", server.local_addr().unwrap()));
        handles.push(server.handle());
        std::thread::spawn(move || server.serve());
    }
    TlsServers { addrs, handles }
}

/// TLS, then a WebSocket, over `stream` (a header already sent): what
/// [`whoami`] gets.
#[cfg(feature = "rustls")]
async fn whoami_tls(stream: TcpStream, addr: SocketAddr) -> String {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connector = tokio_rustls::TlsConnector::from(common::tls::client_config());
    let tls = connector
        .connect(name, stream)
        .await
        .expect("TLS after the header");
    whoami_at(tls, format!("wss://localhost:{}/", addr.port())).await
}

/// The header before TLS, in pieces and whole, both versions; then the
/// rules: no header, a broken one, silence: closed without a byte.
#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_servers_read_the_header_before_tls() {
    let servers = tls_servers(ProxyProtocol::required()).await;
    for &(name, addr) in &servers.addrs {
        common::wait_listening(name, addr).await;
        let v1 = b"PROXY TCP4 192.0.2.7 127.0.0.1 56324 443\r\n";
        let tcp6 = v2_tcp6("2001:db8::7", 443);
        for (header, told) in [(&v1[..], "192.0.2.7:56324"), (&tcp6, "[2001:db8::7]:443")] {
            for piece in [header.len(), 1, 5] {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                for chunk in header.chunks(piece) {
                    stream.write_all(chunk).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                assert_eq!(
                    whoami_tls(stream, addr).await,
                    told,
                    "{name}, pieces of {piece}"
                );
            }
        }
        for _ in 0..2 {
            // TLS straight away, a header a field short, a header cut
            // off, and nothing: closed, not answered.
            let hello = [0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00];
            for send in [
                &hello[..],
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
                b"PROXY TCP4 1.2.3.4",
                b"",
            ] {
                closed_without_a_word(addr, send).await;
            }
            let stream = TcpStream::connect(addr).await.unwrap();
            let mut stream = stream;
            stream.write_all(v1).await.unwrap();
            assert_eq!(whoami_tls(stream, addr).await, "192.0.2.7:56324", "{name}");
        }
    }
    // `also_plain`: after the header, plain ws is served too.
    let (_, plain) = servers.addrs[1];
    assert_eq!(
        behind(plain, b"PROXY TCP4 192.0.2.8 127.0.0.1 1 80\r\n", 64).await,
        "192.0.2.8:1"
    );
}

/// A wss server's source not listed: a real ClientHello (OpenSSL's)
/// gets nothing back, no TLS handshake; a listed one is served.
#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_servers_take_only_listed_sources() {
    let hello = include_bytes!("../core/src/sniff/hello/openssl.bin");
    let elsewhere: Network = "10.0.0.0/8".parse().unwrap();
    let servers = tls_servers(ProxyProtocol::required().from_sources([elsewhere])).await;
    for &(name, addr) in &servers.addrs {
        common::wait_listening(name, addr).await;
        closed_without_a_word(addr, hello).await;
        let mut header = b"PROXY TCP4 192.0.2.7 127.0.0.1 1 443\r\n".to_vec();
        header.extend_from_slice(hello);
        closed_without_a_word(addr, &header).await;
    }
    let here: Network = "127.0.0.0/8".parse().unwrap();
    let servers = tls_servers(ProxyProtocol::required().from_sources([here])).await;
    for &(name, addr) in &servers.addrs {
        common::wait_listening(name, addr).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"PROXY TCP4 192.0.2.7 127.0.0.1 1 443\r\n")
            .await
            .unwrap();
        assert_eq!(whoami_tls(stream, addr).await, "192.0.2.7:1", "{name}");
    }
}

/// HAProxy in TCP mode passing TLS through with `send-proxy-v2`: the wss
/// servers see HAProxy's client.
#[cfg(feature = "rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_passed_through_haproxy() {
    let haproxy = debian_binary("/usr/sbin/haproxy", "haproxy");
    let servers = tls_servers(ProxyProtocol::required()).await;
    for &(name, addr) in &servers.addrs {
        let (_process, front) = haproxy_front(&haproxy, addr, "send-proxy-v2");
        common::wait_listening("haproxy", front).await;
        for _ in 0..10 {
            let stream = TcpStream::connect(front).await.unwrap();
            let client = stream.local_addr().unwrap();
            assert_eq!(
                whoami_tls(stream, front).await,
                client.to_string(),
                "{name}"
            );
        }
    }
}

/// Python's `websockets`, on a socket that sent a version 1 header first.
#[tokio::test]
async fn python_websockets_behind_a_header() {
    let script = r#"
import asyncio, socket, sys
from websockets.asyncio.client import connect
async def main():
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    sock.sendall(b"PROXY TCP6 2001:db8::1 ::1 40000 80\r\n")
    async with connect("ws://127.0.0.1:%s/" % sys.argv[1], sock=sock) as ws:
        print(await ws.recv())
        await ws.send("from python")
        print(await ws.recv())
asyncio.run(main())
"#;
    for backend in Backend::sockets() {
        let server = server(backend, ProxyProtocol::required()).await;
        let port = server.addr.port().to_string();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(python())
                .args(["-c", script, &port])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{backend:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout, "[2001:db8::1]:40000\nfrom python\n", "{backend:?}");
    }
}

/// A real HAProxy in TCP mode in front, with `send-proxy` (version 1) and
/// `send-proxy-v2`: the server sees the address HAProxy's client came
/// from, not HAProxy's own.
#[tokio::test]
async fn behind_haproxy_in_tcp_mode() {
    let haproxy = debian_binary("/usr/sbin/haproxy", "haproxy");
    for backend in Backend::sockets() {
        let server = server(backend, ProxyProtocol::required()).await;
        for send in ["send-proxy", "send-proxy-v2"] {
            let (_process, front) = haproxy_front(&haproxy, server.addr, send);
            common::wait_listening("haproxy", front).await;
            for _ in 0..10 {
                let stream = TcpStream::connect(front).await.unwrap();
                let client = stream.local_addr().unwrap();
                assert_eq!(
                    whoami(stream, front).await,
                    client.to_string(),
                    "{backend:?} {send}"
                );
            }
            // Straight to the server, past HAProxy: no header, no answer.
            closed_without_a_word(server.addr, upgrade_request("/", "").as_bytes()).await;
        }
    }
}

/// HAProxy in TCP mode on a free port, in front of `upstream` with `send`
/// (`send-proxy` or `send-proxy-v2`): the process and its address.
fn haproxy_front(
    haproxy: &std::path::Path,
    upstream: SocketAddr,
    send: &str,
) -> (Child, SocketAddr) {
    let front = free_port();
    let dir = tempfile_dir(&format!("haproxy-{front}"));
    let cfg = format!(
        "global\n    maxconn 256\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
         frontend ws\n    bind 127.0.0.1:{front}\n    default_backend rapidws\n\n\
         backend rapidws\n    server one {upstream} {send}\n"
    );
    std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
    let stderr = dir.join("stderr");
    let process = Child(
        Command::new(haproxy)
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("haproxy starts"),
    );
    (process, format!("127.0.0.1:{front}").parse().unwrap())
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rapidws-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
