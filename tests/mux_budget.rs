//! `mux_echo` (a separate process whose memory the test reads) against
//! peers that never read: xtaci/smux (Go, the harness's `smuxpeer -mode
//! hold`) opens streams, writes on them, never reads any of them, and sends
//! a NOP every 5 s. One budget for every session bounds what the server
//! holds, the sessions holding the most shed first; the keepalive ends a
//! session whose peer takes nothing, NOPs or not; a peer opening streams
//! with the server's own ids is refused; and a well-behaved session is
//! served throughout. Both backends, over TCP and over WebSockets (`/mux`).
#![cfg(feature = "mux")]

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rapidws::mux::{Config, Mux, Side, Version};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `mux_echo` with `--metrics`, its WebSocket and TCP addresses.
async fn start_mux_echo(args: &[&str]) -> (common::Child, SocketAddr, SocketAddr) {
    let (ws, tcp) = (common::free_port(), common::free_port());
    let ws = SocketAddr::from(([127, 0, 0, 1], ws));
    let tcp = SocketAddr::from(([127, 0, 0, 1], tcp));
    let child = std::process::Command::new(common::example("mux_echo"))
        .args(["--addr", &ws.to_string(), "--tcp-addr", &tcp.to_string()])
        .arg("--metrics")
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = common::Child(child);
    common::wait_listening("mux_echo", ws).await;
    common::wait_listening("mux_echo", tcp).await;
    (child, ws, tcp)
}

/// A value of `/metrics` (0 if the series is not there yet).
async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let page = common::http_exchange(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to `within`) until `series` reaches `at_least`; its value.
async fn metric_reaches(addr: SocketAddr, series: &str, at_least: f64, within: Duration) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        let value = metric(addr, series).await;
        if value >= at_least || Instant::now() > deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A Go peer in `-mode hold`: `streams` streams of 1 MiB each, written and
/// never read, a NOP every `nop_every`; over TCP, or a WebSocket with `url`. Its
/// lines (`holding ...`, `closed after=...`) come on the channel.
fn hold_peer(
    target: &str,
    streams: usize,
    nop_every: &str,
) -> (
    tokio::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let transport = if target.starts_with("ws://") {
        "-url"
    } else {
        "-tcp"
    };
    let mut child = tokio::process::Command::new(common::go_program("smuxpeer"))
        .args([transport, target, "-version", "2", "-mode", "hold"])
        .args(["-streams", &streams.to_string(), "-max-size", "1048576"])
        .args([
            "-keepalive-interval",
            nop_every,
            "-keepalive-timeout",
            "10m",
        ])
        .args(["-timeout", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut errors = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (send, receive) = tokio::sync::mpsc::unbounded_channel();
    let said = send.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = send.send(line);
        }
    });
    // What it says on stderr comes as `stderr: ...` lines, for a failure's
    // message (the test's own waits skip them).
    tokio::spawn(async move {
        while let Ok(Some(line)) = errors.next_line().await {
            let _ = said.send(format!("stderr: {line}"));
        }
    });
    (child, receive)
}

/// The next line a hold peer says on stdout, within `within` (its stderr
/// lines meanwhile go to `errors`).
async fn next_line_or_errors(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
    errors: &mut Vec<String>,
) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let line = tokio::time::timeout_at(deadline, lines.recv())
            .await
            .ok()
            .flatten()?;
        match line.strip_prefix("stderr: ") {
            Some(error) => errors.push(error.to_owned()),
            None => return Some(line),
        }
    }
}

/// The next line a hold peer says on stdout, within `within`.
async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> Option<String> {
    next_line_or_errors(lines, within, &mut Vec::new()).await
}

/// Samples the server's resident memory every 100 ms until dropped; the
/// largest seen.
struct Peak {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Peak {
    fn of(server: &common::Child) -> Peak {
        let pid = server.0.id();
        let peak = Arc::new(AtomicU64::new(0));
        let seen = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    let kib: u64 = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                        .unwrap_or(0);
                    seen.fetch_max(kib * 1024, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Peak { peak, task }
    }

    fn get(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A well-behaved version 2 session (ours) over TCP, its keepalive a NOP
/// every 2 s (within any server's timeout here).
async fn polite(tcp: SocketAddr) -> Mux {
    let stream = TcpStream::connect(tcp).await.unwrap();
    let config = Config {
        version: Some(Version::V2),
        keepalive_interval: Some(Duration::from_secs(2)),
        ..Config::default()
    };
    Mux::new(stream, Side::Dialer, config)
}

/// `mux` echoes a stream of `size` bytes (within 30 s).
async fn echoes(mux: &Mux, size: usize) {
    let check = async {
        let stream = mux.open_stream().await.unwrap();
        let (mut reader, mut writer) = tokio::io::split(stream);
        let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        let expected = data.clone();
        let write = async move {
            writer.write_all(&data).await.unwrap();
            writer.shutdown().await.unwrap();
        };
        let read = async move {
            let mut echo = Vec::new();
            reader.read_to_end(&mut echo).await.unwrap();
            echo
        };
        let ((), echo) = tokio::join!(write, read);
        assert!(echo == expected, "the echo differs");
    };
    tokio::time::timeout(Duration::from_secs(30), check)
        .await
        .unwrap_or_else(|_| panic!("no echo within 30 s: {mux:?}"));
}

/// Six sessions whose peers never read, each opening 512 streams and
/// writing 1 MiB on each (a session alone can hold 192 MiB: its windows
/// and send buffers), one after the other, against a budget of `budget`
/// bytes (`None`: the default, 256 MiB): the server's memory grows by
/// about the budget at most (it grew by 1.13 GB before there was one),
/// sessions are shed and counted, and a well-behaved session echoes
/// throughout.
async fn floods_of_sessions_that_never_read_stay_within_the_budget(
    backend: &str,
    over_ws: bool,
    budget: Option<usize>,
) {
    let limit = budget.unwrap_or(rapidws::mux::DEFAULT_BUDGET);
    let budget = budget.map(|bytes| bytes.to_string());
    let mut args = vec!["--backend", backend];
    if let Some(budget) = &budget {
        args.extend(["--budget", budget.as_str()]);
    }
    let (server, ws, tcp) = start_mux_echo(&args).await;
    let polite = polite(tcp).await;
    echoes(&polite, 100_000).await;
    let before = common::resident_of(&server);
    let peak = Peak::of(&server);
    let target = if over_ws {
        format!("ws://{ws}/mux")
    } else {
        tcp.to_string()
    };
    let mut peers = Vec::new();
    for i in 0..6 {
        let (child, mut lines) = hold_peer(&target, 512, "5s");
        // All 512 open, or fewer if it was shed first. (smux gives up on
        // a stream's opening after 30 s: past that the peer says how many
        // it holds.)
        let mut errors = Vec::new();
        let first = next_line_or_errors(&mut lines, Duration::from_secs(45), &mut errors).await;
        if !first
            .as_deref()
            .is_some_and(|l| l.starts_with("holding streams="))
        {
            let budget = metric(ws, "rapidws_budget_bytes{budget=\"mux\"}").await;
            let shed = metric(ws, "rapidws_budget_shed_total{budget=\"mux\"}").await;
            panic!(
                "peer {i}: {first:?}; its stderr: {errors:?}; the server holds {budget} bytes, shed {shed} sessions"
            );
        }
        // Its windows fill (or it is shed meanwhile).
        tokio::time::sleep(Duration::from_secs(2)).await;
        echoes(&polite, 100_000).await;
        peers.push((child, lines));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = peak.get().saturating_sub(before);
    let shed = metric_reaches(
        ws,
        "rapidws_budget_shed_total{budget=\"mux\"}",
        1.0,
        Duration::from_secs(3),
    )
    .await;
    let held = metric_reaches(
        ws,
        "rapidws_budget_bytes{budget=\"mux\"}",
        1.0,
        Duration::from_secs(3),
    )
    .await;
    let limit_seen = metric(ws, "rapidws_budget_limit_bytes{budget=\"mux\"}").await;
    eprintln!(
        "{backend} ws={over_ws} budget {} MiB: mux_echo grew {} MiB at most under 6 x 512 streams; {shed} sessions shed, {} MiB held now",
        limit >> 20,
        grown >> 20,
        held as u64 >> 20
    );
    // The budget, and what is not in it: the echo tasks (one per stream,
    // each holding what it read, up to 64 KiB, while its write waits), the
    // drivers' buffers, the allocator's slack. Without a budget it was 1.13 GB.
    let slack = (limit / 2).max(96 << 20);
    assert!(grown < (limit + slack) as u64, "grew {} MiB", grown >> 20);
    assert!(shed >= 1.0, "no session was shed");
    assert!(held <= limit as f64, "{held} bytes held");
    assert_eq!(limit_seen, limit as f64);
    let ended = metric(ws, "rapidws_mux_sessions_ended_total{reason=\"budget\"}").await;
    assert!(ended >= 1.0, "no session ended for the budget");
    // The peers shed saw their session end.
    let mut closed = 0;
    for (_, lines) in &mut peers {
        while let Ok(line) = lines.try_recv() {
            closed += usize::from(line.starts_with("closed"));
        }
    }
    assert!(closed >= 1, "no hold peer saw its session end");
    // The well-behaved session was never touched.
    echoes(&polite, 300_000).await;
    assert!(!polite.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reading_sessions_stay_within_the_default_budget_over_tcp_on_tokio() {
    floods_of_sessions_that_never_read_stay_within_the_budget("tokio", false, None).await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reading_sessions_stay_within_a_budget_over_websockets_on_io_uring() {
    floods_of_sessions_that_never_read_stay_within_the_budget("uring", true, Some(64 << 20)).await;
}

/// A peer that sends a NOP every 2 s (smux's keepalive) and never reads
/// what its 16 streams are echoed: before, it held its session forever
/// (the NOPs kept the keepalive happy); now the session ends once it took
/// none of our data for the keepalive timeout (here 6 s, `--keepalive-secs`:
/// the rule is the same at the default 30 s, only slower to show), counted as
/// `no_progress`. A well-behaved session on the same server, idle
/// meanwhile but for its own NOPs, is kept. Both backends, TCP and `/mux`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_nops_but_never_reads_is_ended() {
    let mut runs = vec![("tokio", false)];
    if cfg!(all(target_os = "linux", feature = "uring")) {
        runs.push(("uring", true));
    }
    let checks = runs.into_iter().map(|(backend, over_ws)| async move {
        let args = ["--backend", backend, "--keepalive-secs", "6"];
        let (_server, ws, tcp) = start_mux_echo(&args).await;
        let polite = polite(tcp).await;
        echoes(&polite, 10_000).await;
        let target = if over_ws {
            format!("ws://{ws}/mux")
        } else {
            tcp.to_string()
        };
        let started = Instant::now();
        let (_child, mut lines) = hold_peer(&target, 16, "2s");
        assert_eq!(
            next_line(&mut lines, Duration::from_secs(30))
                .await
                .as_deref(),
            Some("holding streams=16")
        );
        let closed = next_line(&mut lines, Duration::from_secs(90)).await;
        let after = started.elapsed();
        assert!(
            closed.as_deref().is_some_and(|l| l.starts_with("closed")),
            "{backend}: the session outlived 90 s: {closed:?}"
        );
        eprintln!("{backend} ws={over_ws}: the NOP-sending peer's session ended after {after:?}");
        assert!(after >= Duration::from_secs(5), "ended after {after:?}");
        let series = "rapidws_mux_sessions_ended_total{reason=\"no_progress\"}";
        assert_eq!(
            metric_reaches(ws, series, 1.0, Duration::from_secs(3)).await,
            1.0
        );
        // The polite session, idle for as long, is alive and served.
        assert!(!polite.is_closed());
        echoes(&polite, 10_000).await;
    });
    futures_util::future::join_all(checks).await;
}

/// xtaci/smux on the wrong side: a Go peer that dials `mux_echo` as smux's
/// server opens streams with even ids, the acceptor's own. Each SYN is
/// answered with a FIN (the stream reads its end at once), the session
/// goes on, and a raw peer's SYN with the right parity on the same
/// session is echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_with_the_servers_own_ids_are_refused() {
    let (_server, _ws, tcp) = start_mux_echo(&[]).await;
    let output = tokio::process::Command::new(common::go_program("smuxpeer"))
        .args(["-tcp", &tcp.to_string(), "-role", "server", "-streams", "3"])
        .args(["-max-size", "1000", "-timeout", "20s"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("EOF after 0 of"), "{stderr}");
    // By hand: an even id refused, an odd one served, on one session.
    let mut raw = TcpStream::connect(tcp).await.unwrap();
    let frame = |command: u8, stream: u32, payload: &[u8]| {
        let mut bytes = vec![1, command];
        bytes.extend((payload.len() as u16).to_le_bytes());
        bytes.extend(stream.to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes
    };
    let mut out = frame(0, 2, b"");
    out.extend(frame(0, 3, b""));
    out.extend(frame(2, 2, b"dropped"));
    out.extend(frame(2, 3, b"echoed"));
    raw.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    let want = [frame(1, 2, b""), frame(2, 3, b"echoed")].concat();
    while got.len() < want.len() {
        let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut chunk))
            .await
            .expect("answers within 10 s")
            .unwrap();
        assert_ne!(n, 0, "the session ended: {got:?}");
        got.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(got, want);
}
