//! Stream multiplexers compared, each with its own client and server over
//! one TCP connection: rapidws's smux (versions 1 and 2), xtaci/smux (Go,
//! both versions), the `async_smux` crate (version 1) and the `yamux` crate.
//! The server is pinned to CPU 0, the client to CPU 1, a fresh server for
//! every measurement, the order rotated each round; the table gives the
//! median over the rounds and the range.
//!
//! Measured (see `rapidws-load mux --help` and `go/cmd/smuxbench`):
//! - throughput with 1, 10 and 100 streams echoing 16 KiB writes;
//! - streams opened per second (10 at a time, one byte each way, closed);
//! - the server's memory per idle stream: its RSS with 10,000 streams held
//!   minus its RSS with 1,000, over 9,000.
//!
//! And, as the ceiling, the same echo with no multiplexer: every stream a
//! TCP connection of its own (`tcp (no mux)`, throughput only).
//!
//! `benches/harness/run.sh` builds the binaries; then, from `benches/harness`,
//! `target/release/mux-bench` writes `results/mux.json` and `results/mux.md`.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(
    about = "Compares stream multiplexers: throughput, streams opened, memory per idle stream"
)]
struct Args {
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds before each measured window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Seconds measured per throughput and open run.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Stream counts for the throughput runs.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    streams: Vec<usize>,
    /// Only these contenders (names as in the table), default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The harness folder (default: found from this crate's location).
    #[arg(long)]
    harness: Option<PathBuf>,
}

/// One implementation at one protocol version.
struct Contender {
    name: &'static str,
    /// The program and the arguments before the subcommand's flags.
    program: PathBuf,
    /// `rust` takes `mux <sub> --lib L --version V`, `go` takes `<sub> -version V`.
    go: bool,
    lib: &'static str,
    version: u8,
    /// Throughput only (the TCP baseline: a connection's memory is mostly
    /// the kernel's, which RSS does not show).
    throughput_only: bool,
}

impl Contender {
    fn command(&self, sub: &str, addr_flag: (&str, SocketAddr), extra: &[String]) -> Command {
        let mut command = Command::new("taskset");
        command
            .arg("-c")
            .arg(if sub == "serve" { "0" } else { "1" });
        command.arg(&self.program);
        if self.go {
            command
                .arg(sub)
                .arg("-version")
                .arg(self.version.to_string());
        } else {
            command.args(["mux", sub, "--lib", self.lib]);
            command.arg("--version").arg(self.version.to_string());
        }
        let (flag, addr) = addr_flag;
        let dash = if self.go { "-" } else { "--" };
        command.arg(format!("{dash}{flag}")).arg(addr.to_string());
        for arg in extra {
            // Flags are written `--name`; Go's flag package takes either.
            command.arg(arg);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    }
}

fn contenders(harness: &Path) -> Vec<Contender> {
    let load = harness.join("target/release/rapidws-load");
    let go = harness.join("target/go/smuxbench");
    let rust = |name, lib, version| Contender {
        name,
        program: load.clone(),
        go: false,
        lib,
        version,
        throughput_only: lib == "tcp",
    };
    let golang = |name, version| Contender {
        name,
        program: go.clone(),
        go: true,
        lib: "xtaci/smux",
        version,
        throughput_only: false,
    };
    vec![
        rust("rapidws v1", "rapidws", 1),
        rust("rapidws v2", "rapidws", 2),
        golang("xtaci/smux v1", 1),
        golang("xtaci/smux v2", 2),
        rust("async_smux", "async-smux", 1),
        rust("yamux", "yamux", 1),
        rust("tcp (no mux)", "tcp", 1),
    ]
}

/// A server process, killed when dropped; its stdout lines arrive on `lines`.
struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(contender: &Contender, hold: bool) -> io::Result<(Server, SocketAddr)> {
        let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let extra = if hold {
            vec!["--hold".to_string()]
        } else {
            vec![]
        };
        let mut child = contender
            .command("serve", ("listen", addr), &extra)
            .spawn()?;
        let lines = read_lines(child.stdout.take().expect("piped"));
        let server = Server { child, lines };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if Instant::now() > deadline {
                return Err(io::Error::other("the server did not listen within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok((server, addr))
    }

    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Waits for `{"held":N}` (or more).
    fn wait_held(&self, n: u64) -> io::Result<()> {
        wait_for(&self.lines, "held", n, Duration::from_secs(60)).map(|_| ())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_lines(out: impl io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// Waits for a JSON line whose `key` is at least `n` (any line if `key` is
/// empty) and returns it.
fn wait_for(
    lines: &mpsc::Receiver<String>,
    key: &str,
    n: u64,
    limit: Duration,
) -> io::Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).map_err(|_| {
            io::Error::other(format!("no {{\"{key}\":{n}}} within {} s", limit.as_secs()))
        })?;
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if key.is_empty() || value[key].as_u64().is_some_and(|v| v >= n) {
            return Ok(value);
        }
    }
}

/// Runs one client subcommand against a fresh server and returns its result line.
fn measure(contender: &Contender, sub: &str, extra: &[String], args: &Args) -> io::Result<Value> {
    let (_server, addr) = Server::start(contender, false)?;
    let mut extra = extra.to_vec();
    extra.extend([
        "--warmup".into(),
        args.warmup.to_string(),
        "--duration".into(),
        args.duration.to_string(),
    ]);
    let mut child = contender.command(sub, ("addr", addr), &extra).spawn()?;
    let lines = read_lines(child.stdout.take().expect("piped"));
    let limit = Duration::from_secs_f64(args.warmup + args.duration + 30.0);
    let result = wait_for(&lines, "", 0, limit);
    let _ = child.kill();
    let status = child.wait()?;
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(io::Error::other(format!("{error} (client: {status})"))),
    }
}

/// The server's bytes per idle stream: RSS at 10,000 held minus at 1,000.
fn idle_bytes(contender: &Contender) -> io::Result<f64> {
    const STEPS: [u64; 2] = [1000, 10_000];
    let (server, addr) = Server::start(contender, true)?;
    let steps = vec!["--steps".to_string(), format!("{},{}", STEPS[0], STEPS[1])];
    let mut command = contender.command("idle", ("addr", addr), &steps);
    let mut child = command.stdin(Stdio::piped()).spawn()?;
    let mut stdin: ChildStdin = child.stdin.take().expect("piped");
    let lines = read_lines(child.stdout.take().expect("piped"));
    let mut rss = Vec::new();
    let result = (|| {
        for step in STEPS {
            wait_for(&lines, "opened", step, Duration::from_secs(60))?;
            server.wait_held(step)?;
            std::thread::sleep(Duration::from_millis(500));
            rss.push(server.rss());
            writeln!(stdin, "next")?;
        }
        Ok::<_, io::Error>(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result?;
    Ok((rss[1] as f64 - rss[0] as f64) / (STEPS[1] - STEPS[0]) as f64)
}

/// One table row's worth of results per round.
#[derive(Default, Clone)]
struct Row {
    values: Vec<Vec<f64>>,
    errors: Vec<String>,
}

fn median_range(values: &[f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some((median, sorted[0], sorted[n - 1]))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let harness = args
        .harness
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let all: Vec<Contender> = contenders(&harness)
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|o| o == c.name))
        .collect();
    for contender in &all {
        if !contender.program.exists() {
            eprintln!(
                "error: {} is missing; run benches/harness/run.sh (or build the harness and go/cmd/smuxbench) first",
                contender.program.display()
            );
            return ExitCode::FAILURE;
        }
    }
    // Columns: throughput per stream count, then open, then idle.
    let mut columns: Vec<String> = args
        .streams
        .iter()
        .map(|n| format!("MB/s, {n} stream{}", if *n == 1 { "" } else { "s" }))
        .collect();
    columns.push("streams opened/s".into());
    columns.push("bytes per idle stream".into());
    let mut rows = vec![
        Row {
            values: vec![Vec::new(); columns.len()],
            errors: Vec::new(),
        };
        all.len()
    ];
    let mut raw = Vec::new();
    for round in 0..args.rounds {
        for k in 0..all.len() {
            let i = (k + round) % all.len();
            let contender = &all[i];
            let mut note = |column: usize, result: io::Result<f64>| {
                record(
                    &mut rows[i],
                    &mut raw,
                    contender,
                    round,
                    column,
                    &columns,
                    result,
                )
            };
            for (column, &streams) in args.streams.iter().enumerate() {
                let extra = ["--streams".to_string(), streams.to_string()];
                let result = measure(contender, "throughput", &extra, &args);
                note(
                    column,
                    result.map(|v| v["bytes_per_sec"].as_f64().unwrap_or(f64::NAN) / 1e6),
                );
            }
            if contender.throughput_only {
                continue;
            }
            let column = args.streams.len();
            let open = measure(
                contender,
                "open",
                &["--concurrency".into(), "10".into()],
                &args,
            );
            note(
                column,
                open.map(|v| v["streams_per_sec"].as_f64().unwrap_or(f64::NAN)),
            );
            note(column + 1, idle_bytes(contender));
        }
    }
    let table = markdown(&all, &rows, &columns, &args);
    println!("{table}");
    let written = std::fs::write(harness.join("results/mux.md"), &table).and_then(|()| {
        std::fs::write(
            harness.join("results/mux.json"),
            serde_json::to_string_pretty(&json!({
                "rounds": args.rounds,
                "warmup": args.warmup,
                "duration": args.duration,
                "measurements": raw,
            }))
            .expect("serializable"),
        )
    });
    if let Err(error) = written {
        eprintln!("error: cannot write results: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote results/mux.md and results/mux.json");
    ExitCode::SUCCESS
}

fn record(
    row: &mut Row,
    raw: &mut Vec<Value>,
    contender: &Contender,
    round: usize,
    column: usize,
    columns: &[String],
    result: io::Result<f64>,
) {
    let name = &columns[column];
    match result {
        Ok(value) => {
            eprintln!(
                "round {} {:<14} {:<24} {value:.1}",
                round + 1,
                contender.name,
                name
            );
            row.values[column].push(value);
            raw.push(json!({ "round": round, "contender": contender.name, "measure": name, "value": value }));
        }
        Err(error) => {
            eprintln!(
                "round {} {:<14} {:<24} FAILED: {error}",
                round + 1,
                contender.name,
                name
            );
            row.errors.push(format!("{name}: {error}"));
            raw.push(json!({ "round": round, "contender": contender.name, "measure": name, "error": error.to_string() }));
        }
    }
}

fn markdown(all: &[Contender], rows: &[Row], columns: &[String], args: &Args) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Each library's own client and server over one TCP connection on loopback, server on CPU 0, client on CPU 1; \
         writes of 16 KiB echoed; opened streams carry one byte each way, 10 at a time; idle memory is the server's RSS \
         slope from 1,000 to 10,000 held streams. Each library's defaults otherwise: a version 2 stream's window is 256 KiB \
         in rapidws and 64 KiB in xtaci/smux (`MaxStreamBuffer`); yamux's is 256 KiB and grows with use (its connection \
         window is raised to 256 KiB per stream allowed, as it requires for 20,000 streams); version 1 and async_smux have \
         none. Median of {} rounds (min-max), {} s measured after {} s of warm-up.\n\n",
        args.rounds, args.duration, args.warmup
    ));
    out.push_str("| |");
    for column in columns {
        out.push_str(&format!(" {column} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(columns.len()));
    out.push('\n');
    for (contender, row) in all.iter().zip(rows) {
        out.push_str(&format!("| {} |", contender.name));
        for values in &row.values {
            match median_range(values) {
                Some((median, low, high)) if median >= 100.0 => {
                    out.push_str(&format!(" {median:.0} ({low:.0}-{high:.0}) |"))
                }
                Some((median, low, high)) => {
                    out.push_str(&format!(" {median:.1} ({low:.1}-{high:.1}) |"))
                }
                None if contender.throughput_only => out.push_str(" - |"),
                None => out.push_str(" failed |"),
            }
        }
        out.push('\n');
    }
    for (contender, row) in all.iter().zip(rows) {
        for error in &row.errors {
            out.push_str(&format!("\n- {} failed: {error}", contender.name));
        }
    }
    out.push('\n');
    out
}
