//! Many streams on one connection (`rapidws::mux`): the async API over
//! real sockets, the `mux_echo` example over TCP and WebSockets on both
//! backends, and xtaci/smux (Go) as the independent peer both ways.
#![cfg(feature = "mux")]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use rapidws::mux::{Config, Mux, Side, Stream, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{free_port, start_example, wait_listening};

fn config(version: Version) -> Config {
    Config {
        version: Some(version),
        ..Config::default()
    }
}

/// Writes `data` (in random pieces), half-closes, and reads the echo to
/// the end at the same time; the echo must be `data`.
async fn check_echo(stream: Stream, data: Vec<u8>, seed: u64) {
    let id = stream.id();
    check_echo_on(stream, id, data, seed).await
}

/// [`check_echo`] on any library's stream (`id` names it in failures).
async fn check_echo_on<S>(stream: S, id: u32, data: Vec<u8>, seed: u64)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let len = data.len();
    let write = async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut at = 0;
        while at < data.len() {
            let end = (at + rng.random_range(1..100_000)).min(data.len());
            writer.write_all(&data[at..end]).await.unwrap();
            at = end;
        }
        writer.shutdown().await.unwrap();
        data
    };
    let read = async move {
        let mut echo = Vec::with_capacity(len);
        reader.read_to_end(&mut echo).await.unwrap();
        echo
    };
    let (data, echo) = tokio::join!(write, read);
    assert_eq!(echo.len(), data.len(), "stream {id}");
    assert!(echo == data, "stream {id}: the echo differs");
}

fn random_data(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let mut data = vec![0; rng.random_range(0..=max)];
    rng.fill(&mut data[..]);
    data
}

/// Opens `count` streams on `mux` and checks each one's echo, all at once.
async fn echo_streams(mux: &Mux, count: usize, max: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tasks = Vec::new();
    for i in 0..count {
        let stream = mux.open_stream().await.unwrap();
        let size = match i {
            0 => 0,
            1 => 1,
            2 => max,
            _ => max,
        };
        let data = random_data(&mut rng, size);
        tasks.push(tokio::spawn(check_echo(stream, data, seed + i as u64)));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// `future`, or a panic that shows the session's state after 30 s.
async fn bounded<T>(mux: &Mux, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), future).await {
        Ok(value) => value,
        Err(_) => panic!("stuck: {mux:?}"),
    }
}

async fn tcp_mux(addr: SocketAddr, version: Version) -> Mux {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    Mux::new(tcp, Side::Dialer, config(version))
}

/// A client of this test's own, on its runtime.
fn client() -> rapidws::client::Client {
    rapidws::client::Client::new(rapidws::Config::default())
}

async fn ws_mux(addr: SocketAddr, version: Version) -> Mux {
    let (socket, _) = client().connect(format!("ws://{addr}/mux")).await.unwrap();
    Mux::over_websocket(socket, Side::Dialer, config(version))
}

async fn start_mux_echo(args: &[&str]) -> (common::Child, SocketAddr, SocketAddr) {
    let tcp = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut all = vec!["--tcp-addr".to_string(), tcp.to_string()];
    all.extend(args.iter().map(|arg| arg.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let (child, ws) = start_example("mux_echo", &all).await;
    (child, ws, tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_through_mux_echo_over_tcp_and_websockets() {
    let (_server, ws, tcp) = start_mux_echo(&[]).await;
    for version in [Version::V1, Version::V2] {
        let mux = tcp_mux(tcp, version).await;
        bounded(&mux, echo_streams(&mux, 20, 300_000, 1)).await;
        assert_eq!(mux.version(), Some(version));
        bounded(&mux, mux.close()).await.unwrap();
        let mux = ws_mux(ws, version).await;
        bounded(&mux, echo_streams(&mux, 20, 300_000, 2)).await;
        bounded(&mux, mux.close()).await.unwrap();
    }
}

/// Two ends over a real TCP connection, both ours.
async fn pair(version: Version) -> (Mux, Mux) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (dialled, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (
        Mux::new(dialled.unwrap(), Side::Dialer, config(version)),
        Mux::new(accepted.unwrap().0, Side::Acceptor, config(version)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn either_side_opens_and_a_half_closed_stream_still_reads() {
    for version in [Version::V1, Version::V2] {
        let (dialer, acceptor) = pair(version).await;
        // The side that accepted the TCP connection opens (a reverse
        // connection); ids are even from it.
        let mut opened = acceptor.open_stream().await.unwrap();
        assert_eq!(opened.id(), 2);
        opened.write_all(b"question").await.unwrap();
        opened.shutdown().await.unwrap();
        let mut taken = dialer.accept_stream().await.unwrap();
        assert_eq!(taken.id(), 2);
        let mut question = Vec::new();
        taken.read_to_end(&mut question).await.unwrap();
        assert_eq!(question, b"question");
        // Half-closed by the opener: the answer still arrives.
        taken.write_all(b"answer").await.unwrap();
        drop(taken);
        let mut answer = Vec::new();
        opened.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
        // A write after our FIN is refused.
        assert!(opened.write_all(b"more").await.is_err());
        drop(opened);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!((dialer.streams(), acceptor.streams()), (0, 0));
    }
}

/// `read_bytes` and `write_bytes`: a megabyte given as one buffer arrives
/// whole and in order, taken in pieces of at most what was asked and one
/// block; the peer's FIN ends the reads, and after the mux ends a write
/// fails as `write_all` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_written_and_read_without_copies_arrive_whole() {
    for version in [Version::V1, Version::V2] {
        let (dialer, acceptor) = pair(version).await;
        let mut rng = StdRng::seed_from_u64(version as u64);
        let mut sent = vec![0u8; 1 << 20];
        rng.fill(&mut sent[..]);
        let sent = rapidws::Bytes::from(sent);
        let mut stream = dialer.open_stream().await.unwrap();
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                stream.write_bytes(sent).await.unwrap();
                stream.shutdown().await.unwrap();
                stream
            })
        };
        let mut taken = acceptor.accept_stream().await.unwrap();
        let mut got = Vec::new();
        let mut pieces = 0;
        loop {
            let max = rng.random_range(1..100_000);
            let Some(piece) = taken.read_bytes(max).await.unwrap() else {
                break;
            };
            assert!(!piece.is_empty() && piece.len() <= max.min(32 * 1024));
            got.extend_from_slice(&piece);
            pieces += 1;
        }
        assert!(
            got == sent,
            "{version:?}: {} of {} bytes",
            got.len(),
            sent.len()
        );
        assert!(pieces >= sent.len() / (32 * 1024), "{pieces} pieces");
        let mut stream = writer.await.unwrap();
        drop(taken);
        acceptor.close().await.unwrap();
        drop(acceptor);
        assert!(dialer.closed().await.is_ok());
        let error = stream
            .write_bytes(rapidws::Bytes::from_static(b"more"))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_session_dies_streams_read_what_came_then_fail() {
    let (dialer, acceptor) = pair(Version::V2).await;
    let mut stream = dialer.open_stream().await.unwrap();
    stream.write_all(b"x").await.unwrap();
    let mut taken = acceptor.accept_stream().await.unwrap();
    taken.write_all(b"last").await.unwrap();
    let mut first = [0; 4];
    stream.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"last");
    // The acceptor ends: the transport closes under the dialer.
    acceptor.close().await.unwrap();
    drop(taken);
    drop(acceptor);
    let error = stream.read(&mut [0; 8]).await;
    // The acceptor's close sent our stream a FIN first: a clean end.
    assert_eq!(error.unwrap(), 0);
    assert!(dialer.accept_stream().await.is_none());
    assert!(dialer.closed().await.is_ok());
    assert!(dialer.open_stream().await.is_err());
    let error = stream.write_all(b"y").await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mux_echo_opens_streams_to_its_peers() {
    let (_server, ws, tcp) = start_mux_echo(&["--open", "5"]).await;
    for mux in [
        tcp_mux(tcp, Version::V2).await,
        ws_mux(ws, Version::V1).await,
    ] {
        // The server waits for our first frame (the version) to open.
        let hello = mux.open_stream().await.unwrap();
        check_echo(hello, b"hello".to_vec(), 0).await;
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..5 {
            let stream = tokio::time::timeout(Duration::from_secs(10), mux.accept_stream())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(stream.id() % 2, 0);
            check_echo(stream, random_data(&mut rng, 100_000), 3).await;
        }
    }
}

/// A text message on `/mux` (a wrong client, a test page) is not smux:
/// the session ends and the peer, an independent client here, is told why
/// with 1003 and a reason, not a bare 1000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_message_on_mux_is_refused_with_1003_and_why() {
    let (_server, ws, _tcp) = start_mux_echo(&[]).await;
    let (mut client, _) = tokio_tungstenite::connect_async(format!("ws://{ws}/mux"))
        .await
        .unwrap();
    common::send_text(&mut client, "hello").await;
    let (code, reason) = common::expect_close(&mut client).await;
    assert_eq!(code, 1003, "{reason}");
    assert!(reason.contains("binary messages only"), "{reason:?}");
}

/// `mux_echo --push-size`: the server opens a push stream to each peer and
/// writes the payload on it every interval, while the peer's own streams
/// are echoed (the load harness's `stream --mux`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mux_echo_pushes_on_a_stream_of_its_own_beside_the_echo() {
    let mut placements = vec![vec!["--backend", "tokio"]];
    if cfg!(all(target_os = "linux", feature = "uring")) {
        // The push task's timer and the echo on the reactor's thread.
        placements.push(vec!["--backend", "uring", "--on-server-loop"]);
    }
    for placement in placements {
        let mut args = vec!["--push-size", "65536", "--push-every-us", "2000"];
        args.extend(placement);
        let (_server, ws, _tcp) = start_mux_echo(&args).await;
        pushes_and_echoes(ws).await;
    }
}

/// Takes twenty pushes on the stream `mux_echo` opens while a stream of
/// ours is echoed.
async fn pushes_and_echoes(ws: SocketAddr) {
    let mux = ws_mux(ws, Version::V2).await;
    let requests = mux.open_stream().await.unwrap();
    let mut push = tokio::time::timeout(Duration::from_secs(10), mux.accept_stream())
        .await
        .expect("a push stream")
        .unwrap();
    assert_eq!(push.id() % 2, 0);
    let pushes = async {
        // Twenty pushes' worth, every byte the payload's.
        let mut got = vec![0; 20 * 65536];
        push.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == 0x5a));
    };
    let echo = check_echo(
        requests,
        random_data(&mut StdRng::seed_from_u64(9), 200_000),
        9,
    );
    bounded(&mux, async { tokio::join!(pushes, echo) }).await;
}

/// xtaci/smux v1.5.58 (Go), as the load harness's `smuxpeer` program
/// (`benches/harness/go/cmd/smuxpeer`).
fn smuxpeer() -> std::path::PathBuf {
    common::go_program("smuxpeer")
}

/// Runs smuxpeer with `args` to its end (bounded by its own `-timeout`);
/// it must print `ok`.
async fn run_smuxpeer(args: &[&str]) -> String {
    let output = tokio::process::Command::new(smuxpeer())
        .args(args)
        .args(["-timeout", "60s"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && stdout.starts_with("ok"),
        "smuxpeer {args:?}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Go dials `mux_echo`: 100 streams at once over TCP and over a
/// coder/websocket `NetConn`, sizes up to 1 MiB (some empty, one byte and
/// exactly 1 MiB), written in random pieces and half-closed, every byte of
/// the echo checked; and it accepts 20 streams the server opens and checks
/// their echo. Both versions and transports on tokio; on io_uring (the
/// same session code behind another driver) one of each, and both versions
/// over WebSockets with the mux on the reactor (`--on-server-loop`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xtaci_smux_dials_mux_echo() {
    let mut backends = vec![(
        vec!["--backend", "tokio"],
        vec![("1", false), ("1", true), ("2", false), ("2", true)],
    )];
    if cfg!(all(target_os = "linux", feature = "uring")) {
        backends.push((vec!["--backend", "uring"], vec![("1", false), ("2", true)]));
        // The mux and its streams on the reactor's thread.
        backends.push((
            vec!["--backend", "uring", "--on-server-loop"],
            vec![("1", true), ("2", true)],
        ));
    }
    for (backend, runs) in backends {
        let mut args = vec!["--open", "20"];
        args.extend(&backend);
        let (_server, ws, tcp) = start_mux_echo(&args).await;
        let (tcp, url) = (tcp.to_string(), format!("ws://{ws}/mux"));
        for (version, over_ws) in runs {
            let transport = match over_ws {
                false => ["-tcp", tcp.as_str()],
                true => ["-url", url.as_str()],
            };
            let mut args = vec!["-version", version, "-streams", "100"];
            args.extend(transport);
            let report = run_smuxpeer(&args).await;
            eprintln!("{backend:?} {transport:?} v{version}: {report}");
            args.extend(["-mode", "accept-check", "-streams", "20"]);
            run_smuxpeer(&args).await;
        }
    }
}

/// Starts smuxpeer listening (`-listen`, plain TCP or `-ws`) with `args`;
/// returns it and its address once it says it listens.
async fn listening_smuxpeer(args: &[&str]) -> (tokio::process::Child, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(smuxpeer())
        .args(["-listen", "127.0.0.1:0", "-timeout", "60s"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("smuxpeer listens within 30 s")
        .unwrap()
        .unwrap();
    let addr = line
        .strip_prefix("listening ")
        .expect(&line)
        .parse()
        .unwrap();
    // The rest of its output: its `ok` line.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// We dial a Go smux server (over TCP, and over a WebSocket it accepts
/// with coder/websocket) that accepts and echoes 50 streams we open (sizes
/// up to 1 MiB, half-closed, checked) and opens 20 of its own, which we
/// accept and echo while it checks every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_dial_xtaci_smux_and_serve_the_streams_it_opens() {
    for version in [Version::V1, Version::V2] {
        let v = if version == Version::V1 { "1" } else { "2" };
        for ws in [false, true] {
            let mut args = vec!["-mode", "echo-serve", "-open", "20", "-version", v];
            if ws {
                args.push("-ws");
            }
            let (mut go, addr) = listening_smuxpeer(&args).await;
            let mux = if ws {
                let (socket, _) = client().connect(format!("ws://{addr}/any")).await.unwrap();
                Mux::over_websocket(socket, Side::Dialer, config(version))
            } else {
                tcp_mux(addr, version).await
            };
            // Echo the 20 streams Go opens, while our own are checked.
            let server = mux.clone();
            let echoing = tokio::spawn(async move {
                let mut echoes = Vec::new();
                for _ in 0..20 {
                    let stream = server.accept_stream().await.expect("20 streams from Go");
                    echoes.push(tokio::spawn(async move {
                        let (mut reader, mut writer) = tokio::io::split(stream);
                        tokio::io::copy(&mut reader, &mut writer).await.unwrap();
                        writer.shutdown().await.unwrap();
                    }));
                }
                for echo in echoes {
                    echo.await.unwrap();
                }
            });
            echo_streams(&mux, 50, 1 << 20, 5).await;
            echoing.await.unwrap();
            // Our FINs are out once the echoes ended; then the session.
            mux.close().await.unwrap();
            let status = tokio::time::timeout(Duration::from_secs(10), go.wait())
                .await
                .unwrap()
                .unwrap();
            assert!(status.success(), "smuxpeer v{v} ws={ws}: {status}");
        }
    }
}

/// Spawns an example with `args` (stderr kept to a file the test reads).
fn spawn_example(name: &str, args: &[String], log: &std::path::Path) -> common::Child {
    common::Child(
        std::process::Command::new(common::example(name))
            .args(args)
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// `curl` through the tunnel: `Some(body)` if it got a 200.
/// The page at `url`, or curl's exit status and message (so a failure
/// says whether it was a refusal, an empty reply or a timeout).
async fn curl(url: &str) -> Result<String, String> {
    let output = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10", url])
        .output()
        .await
        .unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "curl {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The reverse tunnel: `curl` on the server's public port reaches an HTTP
/// server (Python's `http.server`) that only the agent connects to, over
/// ws and wss; with the HTTP server not yet there, the stream ends and
/// the session stays, and the next request goes through on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_a_private_http_server_through_mux_tunnel() {
    let dir = std::env::temp_dir().join(format!("rapidws-tunnel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    std::fs::write(dir.join("page.txt"), &body).unwrap();
    let private = SocketAddr::from(([127, 0, 0, 1], free_port()));
    for wss in [false, true] {
        let (ws, public) = (free_port(), free_port());
        let mut server_args: Vec<String> = ["server", "--ws-addr", &format!("127.0.0.1:{ws}")]
            .iter()
            .map(|s| s.to_string())
            .collect();
        server_args.extend(["--listen".into(), format!("127.0.0.1:{public}")]);
        let mut agent_args = vec!["agent".to_string(), "--to".into(), private.to_string()];
        if wss {
            let identity = common::tls::identity();
            let (cert, key) = (identity.cert_pem.display(), identity.key_pem.display());
            server_args.extend(["--tls-cert".into(), cert.to_string()]);
            server_args.extend(["--tls-key".into(), key.to_string()]);
            agent_args.extend(["--url".into(), format!("wss://localhost:{ws}/agent")]);
            agent_args.extend(["--cafile".into(), cert.to_string()]);
        } else {
            agent_args.extend(["--url".into(), format!("ws://127.0.0.1:{ws}/agent")]);
        }
        let logs = dir.join(format!("agent-{wss}.log"));
        let _server = spawn_example("mux_tunnel", &server_args, &dir.join("server.log"));
        wait_listening("mux_tunnel server", SocketAddr::from(([127, 0, 0, 1], ws))).await;
        let _agent = spawn_example("mux_tunnel", &agent_args, &logs);
        wait_listening(
            "mux_tunnel server",
            SocketAddr::from(([127, 0, 0, 1], public)),
        )
        .await;
        let url = format!("http://127.0.0.1:{public}/page.txt");
        // Until the agent is in, and while nothing listens at --to, curl
        // gets no answer; the agent logs the failed connect.
        let mut seen = false;
        for _ in 0..100 {
            let page = curl(&url).await;
            assert!(page.is_err(), "a page before the server is up: {page:?}");
            if std::fs::read_to_string(&logs)
                .unwrap()
                .contains("cannot connect --to")
            {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "the agent never tried --to");
        // The private HTTP server comes up: the same session carries it.
        let _http = common::Child(
            std::process::Command::new("python3")
                .args(["-m", "http.server", "--bind", "127.0.0.1"])
                .arg(private.port().to_string())
                .current_dir(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_listening("http.server", private).await;
        let pages = futures_util::future::join_all((0..8).map(|_| curl(&url))).await;
        for page in pages {
            match page {
                Ok(page) => assert!(page == body, "wss={wss}: a different page"),
                Err(why) => panic!(
                    "wss={wss}: no page: {why}\nagent:\n{}\nserver:\n{}",
                    std::fs::read_to_string(&logs).unwrap_or_default(),
                    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
                ),
            }
        }
        let log = std::fs::read_to_string(&logs).unwrap();
        assert_eq!(log.matches("agent connected").count(), 1, "{log}");
        assert!(!log.contains("session ended"), "{log}");
    }
}

/// An smux frame, raw.
fn raw_frame(version: u8, command: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![version, command];
    frame.extend((payload.len() as u16).to_le_bytes());
    frame.extend(stream.to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Reads whole frames from a raw peer's socket until `want` says stop
/// (bounded in time); returns them as (command, stream, payload length).
async fn read_frames(
    tcp: &mut (impl tokio::io::AsyncRead + Unpin),
    mut want: impl FnMut(&[(u8, u32, usize)]) -> bool,
) -> Vec<(u8, u32, usize)> {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0; 65536];
    while want(&got) {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut chunk))
            .await
            .expect("frames within 10 s")
            .unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 8 {
            let length = usize::from(u16::from_le_bytes([buf[2], buf[3]]));
            if buf.len() < 8 + length {
                break;
            }
            let stream = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
            got.push((buf[1], stream, length));
            buf.drain(..8 + length);
        }
    }
    got
}

/// Hostile peers against `mux_echo` over raw TCP: a SYN flood past
/// `--max-streams` (refused with FINs, the session and its streams go on),
/// data for streams that do not exist (dropped), a peer that sends and
/// never reads (it stops being read), a frame of another version (the
/// session ends, the server serves on); the server's memory stays bounded
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_are_answered_and_bounded() {
    let (server, ws, tcp_addr) = start_mux_echo(&["--max-streams", "16"]).await;
    let before = common::resident_of(&server);

    // A SYN flood, with one real stream among it.
    let tcp = TcpStream::connect(tcp_addr).await.unwrap();
    let mut flood = raw_frame(1, 0, 1, b"");
    for i in 1..5000u32 {
        flood.extend(raw_frame(1, 0, 1 + 2 * i, b""));
    }
    // And data for streams nobody opened: dropped.
    for i in 0..200u32 {
        flood.extend(raw_frame(1, 2, 1_000_001 + 2 * i, &[7; 60_000]));
    }
    flood.extend(raw_frame(1, 2, 1, b"still here"));
    let (mut reader, mut writer) = tcp.into_split();
    let sending = tokio::spawn(async move {
        writer.write_all(&flood).await.unwrap();
        writer
    });
    // 4984 refusals (16 taken in), then the echo of "still here".
    let answers = read_frames(&mut reader, |got| {
        !got.iter()
            .any(|&(command, stream, _)| command == 2 && stream == 1)
    })
    .await;
    assert!(
        answers.iter().any(|&(c, s, _)| c == 2 && s == 1),
        "{:?}",
        answers.last()
    );
    let refusals = answers.iter().filter(|&&(c, _, _)| c == 1).count();
    assert_eq!(refusals, 5000 - 16, "one FIN per SYN past the limit");
    drop(sending.await.unwrap());
    drop(reader);

    // A version 1 peer that sends on a stream and never reads the echo
    // (in version 2 sending past the window ends the session, below).
    let mut stuck = TcpStream::connect(tcp_addr).await.unwrap();
    stuck.write_all(&raw_frame(1, 0, 3, b"")).await.unwrap();
    let mut sent = 0usize;
    let block = raw_frame(1, 2, 3, &[1; 32768]);
    loop {
        match tokio::time::timeout(Duration::from_millis(500), stuck.write_all(&block)).await {
            Ok(result) => {
                result.unwrap();
                sent += 32768;
            }
            Err(_) => break,
        }
        assert!(
            sent < 64 << 20,
            "64 MiB went in without the server pushing back"
        );
    }
    eprintln!(
        "a peer that never reads got {} KiB in before the server stopped reading",
        sent >> 10
    );

    // A frame of another version ends its session (a version 2 peer past
    // its window too: the core's unit tests show it, since here the echo
    // reads as fast as the peer sends).
    let mut tcp = TcpStream::connect(tcp_addr).await.unwrap();
    let bytes = [raw_frame(1, 0, 3, b""), raw_frame(2, 3, 0, b"")].concat();
    tcp.write_all(&bytes).await.unwrap();
    let frames = read_frames(&mut tcp, |_| true).await;
    assert!(frames.is_empty(), "{frames:?}");

    // Everyone else is still served, and memory stayed bounded.
    let mux = ws_mux(ws, Version::V2).await;
    echo_streams(&mux, 4, 10_000, 9).await;
    let grown = common::resident_of(&server).saturating_sub(before);
    eprintln!("mux_echo grew {} MiB", grown >> 20);
    assert!(grown < 64 << 20, "grew {} MiB", grown >> 20);
    drop(stuck);
}

/// Echoes a stream of any library until its peer's FIN, then half-closes.
async fn echo_back<S>(mut stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let n = stream.read(&mut buffer).await.unwrap();
        if n == 0 {
            break;
        }
        stream.write_all(&buffer[..n]).await.unwrap();
    }
    stream.shutdown().await.unwrap();
}

/// The `async_smux` crate (0.4, smux version 1) against us, both ways: it
/// dials `mux_echo` over TCP, opens 50 streams (random sizes up to 1 MiB,
/// half-closed, every byte checked) and accepts and checks the five that
/// `mux_echo --open 5` opens; then we dial an `async_smux` server, which
/// echoes our 50 streams and opens ten to us that we echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_smux_interoperates_both_ways() {
    let limit = Duration::from_secs(60);
    let (_server, _ws, tcp) = start_mux_echo(&["--open", "5"]).await;
    let connection = TcpStream::connect(tcp).await.unwrap();
    let (connector, mut acceptor, worker) = async_smux::MuxBuilder::client()
        .with_connection(connection)
        .build();
    tokio::spawn(worker);
    let theirs = async {
        let mut rng = StdRng::seed_from_u64(31);
        let mut tasks = Vec::new();
        for i in 0..50u64 {
            let stream = connector.connect().unwrap();
            let id = stream.get_stream_id();
            assert_eq!(id % 2, 1, "a dialler's ids are odd");
            let data = random_data(&mut rng, if i < 2 { i as usize } else { 1 << 20 });
            tasks.push(tokio::spawn(check_echo_on(stream, id, data, 100 + i)));
        }
        for _ in 0..5 {
            let stream = acceptor
                .accept()
                .await
                .expect("mux_echo opens five streams");
            let id = stream.get_stream_id();
            assert_eq!(id % 2, 0, "an acceptor's ids are even");
            let data = random_data(&mut rng, 200_000);
            tasks.push(tokio::spawn(check_echo_on(
                stream,
                id,
                data,
                200 + u64::from(id),
            )));
        }
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(limit, theirs)
        .await
        .expect("async_smux against mux_echo stuck");

    // An async_smux server: echoes what we open, opens ten streams to us.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (connection, _) = listener.accept().await.unwrap();
        let (connector, mut acceptor, worker) = async_smux::MuxBuilder::server()
            .with_connection(connection)
            .build();
        tokio::spawn(worker);
        let echoes = tokio::spawn(async move {
            let mut echoes = Vec::new();
            for _ in 0..50 {
                let stream = acceptor.accept().await.expect("50 streams from us");
                echoes.push(tokio::spawn(echo_back(stream)));
            }
            for echo in echoes {
                echo.await.unwrap();
            }
        });
        let mut rng = StdRng::seed_from_u64(41);
        let mut checks = Vec::new();
        for i in 0..10u64 {
            let stream = connector.connect().unwrap();
            let id = stream.get_stream_id();
            let data = random_data(&mut rng, 500_000);
            checks.push(tokio::spawn(check_echo_on(stream, id, data, 300 + i)));
        }
        for check in checks {
            check.await.unwrap();
        }
        echoes.await.unwrap();
    });
    let mux = tcp_mux(addr, Version::V1).await;
    let ours = async {
        let accepting = async {
            let mut echoes = Vec::new();
            for _ in 0..10 {
                let stream = mux
                    .accept_stream()
                    .await
                    .expect("ten streams from async_smux");
                assert_eq!(stream.id() % 2, 0);
                echoes.push(tokio::spawn(echo_back(stream)));
            }
            for echo in echoes {
                echo.await.unwrap();
            }
        };
        tokio::join!(echo_streams(&mux, 50, 1 << 20, 51), accepting);
    };
    bounded(&mux, ours).await;
    tokio::time::timeout(limit, server)
        .await
        .expect("the async_smux server stuck")
        .unwrap();
    bounded(&mux, mux.close()).await.unwrap();
}
