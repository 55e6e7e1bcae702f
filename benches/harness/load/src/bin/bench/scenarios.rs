//! The eleven scenarios of BENCHMARKS.md: what each runs and which figures it keeps.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{Load, LoadProcess, Timed};
use crate::servers::{API_KEY, Role, Running, Server};

/// One figure set from one server in one round.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub scenario: u8,
    pub variant: String,
    pub server: String,
    pub round: usize,
    pub metrics: BTreeMap<String, f64>,
    pub error: Option<String>,
}

impl Measurement {
    pub fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario, "variant": self.variant, "server": self.server,
            "round": self.round, "metrics": self.metrics, "error": self.error,
        })
    }

    pub fn from_json(value: &Value) -> Option<Measurement> {
        Some(Measurement {
            scenario: value["scenario"].as_u64()? as u8,
            variant: value["variant"].as_str()?.to_string(),
            server: value["server"].as_str()?.to_string(),
            round: value["round"].as_u64()? as usize,
            metrics: value["metrics"]
                .as_object()?
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect(),
            error: value["error"].as_str().map(str::to_string),
        })
    }

    /// The figure the runner prints as it goes: the rate, or for idle memory
    /// the slope up to the last connection count.
    pub fn headline(&self) -> Option<f64> {
        let steps = if self.scenario == 7 {
            DEFLATE_IDLE_STEPS
        } else {
            IDLE_STEPS
        };
        let slope = slope_metric(steps[steps.len() - 1]);
        self.metrics
            .get("per_sec")
            .or(self.metrics.get(&slope))
            .copied()
    }
}

/// Settings shared by every scenario of a run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub load: Load,
    pub warmup: f64,
    pub duration: f64,
}

impl Settings {
    fn window(&self) -> Vec<String> {
        vec![
            "--warmup".into(),
            self.warmup.to_string(),
            "--duration".into(),
            self.duration.to_string(),
        ]
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.warmup + self.duration + 60.0)
    }
}

pub struct Scenario {
    pub number: u8,
    pub title: &'static str,
    /// Whether the raw TCP echo server takes part.
    pub raw_too: bool,
    pub needs_push: bool,
    /// Whether the server must accept permessage-deflate (it runs with it on).
    pub needs_deflate: bool,
}

pub const SCENARIOS: [Scenario; 11] = [
    Scenario {
        number: 1,
        title: "Echo, 100 connections x 1 KiB binary, depth 8",
        raw_too: true,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 2,
        title: "Echo, 100 connections x 1 KiB binary, depth 1",
        raw_too: true,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 3,
        title: "Echo, 500 connections x 16 KiB binary, depth 1",
        raw_too: true,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 4,
        title: "Idle memory, 1k and 10k upgraded connections",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 5,
        title: "Upgrades per second (connect, upgrade, close)",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 6,
        title: "Stream: request RTT while the server pushes",
        raw_too: false,
        needs_push: true,
        needs_deflate: false,
    },
    Scenario {
        number: 7,
        title: "Deflate: echo 100 connections x 1 KiB text, depth 8, and idle memory",
        raw_too: false,
        needs_push: false,
        needs_deflate: true,
    },
    Scenario {
        number: 8,
        title: "Clients: one client core's echo through each client library, 100 connections x 1 KiB binary, against rapidws-tokio",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 9,
        title: "Fan-out: publishes at a fixed rate to 10,000 subscribers, on one topic and on 1,000 topics",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 10,
        title: "Reconnect storm: 10,000 subscribers of one topic (20 publishes/s) dropped at once, all resuming where they were",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
    Scenario {
        number: 11,
        title: "The bus and Centrifugo's protocol against Centrifugo: HTTP publishes fanned out to WebSocket subscribers",
        raw_too: false,
        needs_push: false,
        needs_deflate: false,
    },
];

impl Scenario {
    pub fn applies_to(&self, server: &Server) -> bool {
        (self.raw_too || !server.raw)
            // An smux session, not an echo: the stream scenario only.
            && (!server.mux || self.number == 6)
            && (!self.needs_push || server.supports_stream())
            && (self.number != 6 || STREAM_SERVERS.contains(&server.name.trim_end_matches("@before")))
            && (self.number != 8 || server.name == CLIENT_SERVER)
            && (self.number != 9 || server.supports_fanout())
            // Resuming needs history: the fan-out servers that keep it.
            && (self.number != 10 || (server.supports_fanout() && server.name.contains("-history")))
            && (!self.needs_deflate || server.supports_deflate())
            // wss and HTTP/3: the echo (1) and idle memory (4) scenarios only.
            && (!server.tls || matches!(self.number, 1 | 4))
            // The bus and Centrifugo: scenario 11, and only they.
            && ((self.number == 11) == server.bus.is_some())
    }

    /// Runs this scenario once against `server`.
    pub fn run(&self, server: &Server, round: usize, settings: &Settings) -> Vec<Measurement> {
        let measure = |variant: &str, result: io::Result<BTreeMap<String, f64>>| {
            let (metrics, error) = match result {
                Ok(metrics) => (metrics, None),
                Err(error) => (BTreeMap::new(), Some(error.to_string())),
            };
            Measurement {
                scenario: self.number,
                variant: variant.to_string(),
                server: server.name.to_string(),
                round,
                metrics,
                error,
            }
        };
        match self.number {
            1 => vec![measure("", echo(server, settings, 100, 1024, 8))],
            2 => vec![measure("", echo(server, settings, 100, 1024, 1))],
            3 => vec![measure("", echo(server, settings, 500, 16 * 1024, 1))],
            4 => vec![measure("", idle(server, settings, &IDLE_STEPS, false))],
            5 => vec![measure("", handshake(server, settings))],
            6 => {
                let mut all: Vec<_> = STREAM_VARIANTS
                    .iter()
                    .map(|&(variant, push)| measure(variant, stream(server, settings, push)))
                    .collect();
                // The Go client speaks WebSocket messages, not smux.
                if !server.mux {
                    all.push(measure(STREAM_UNPINNED, stream_unpinned(server, settings)));
                }
                all
            }
            8 => {
                // Every library at each depth, the order turned each round.
                let mut variants: Vec<_> = CLIENT_DEPTHS
                    .iter()
                    .flat_map(|&depth| CLIENT_LIBS.iter().map(move |&lib| (lib, depth)))
                    .collect();
                let turn = round % variants.len();
                variants.rotate_left(turn);
                let mut measured: Vec<_> = variants
                    .into_iter()
                    .map(|(lib, depth)| {
                        let variant = client_variant(lib, depth);
                        measure(&variant, client_echo(server, settings, lib, depth))
                    })
                    .collect();
                for lib in CLIENT_LIBS {
                    let variant = client_idle_variant(lib);
                    measured.push(measure(&variant, client_idle(server, settings, lib)));
                }
                measured
            }
            9 => FANOUT_VARIANTS
                .iter()
                .map(|v| measure(v.name, fanout(server, settings, v)))
                .collect(),
            10 => vec![measure("", storm(server, settings))],
            11 => BUS_VARIANTS
                .iter()
                .map(|v| measure(v.shape.name, bus(server, settings, &v.shape)))
                .collect(),
            _ => {
                // `applies_to` lets through only servers with deflate settings.
                let Some(server) = server.with_deflate() else {
                    return Vec::new();
                };
                // Scenario 1's shape, with 1 KiB of compressible text.
                let rate = closed_loop(&server, settings, "deflate", 100, 1024, 8);
                let memory = idle(&server, settings, &DEFLATE_IDLE_STEPS, true);
                vec![measure(DEFLATE_ECHO, rate), measure(DEFLATE_IDLE, memory)]
            }
        }
    }
}

/// Connection counts of scenario 4: RSS is read at each, and the slope
/// between them is the memory of one idle connection.
pub const IDLE_STEPS: [usize; 2] = [1000, 10_000];

/// Scenario 7's two measurements, each a variant of its own so that one can
/// fail without losing the other.
pub const DEFLATE_ECHO: &str = "echo";
pub const DEFLATE_IDLE: &str = "idle";

/// Connection counts of scenario 7's idle memory: fewer than scenario 4's to
/// keep the scenario short; the slope between 1k and 5k still leaves the
/// fixed costs out.
pub const DEFLATE_IDLE_STEPS: [usize; 2] = [1000, 5000];

/// The name of the metric holding the bytes per connection between the
/// previous connection count and `step`.
pub fn slope_metric(step: usize) -> String {
    format!("bytes_per_conn_to_{}", count_label(step))
}

/// `1000` as `1k`, `10000` as `10k`; other counts as they are.
pub fn count_label(count: usize) -> String {
    if count.is_multiple_of(1000) {
        format!("{}k", count / 1000)
    } else {
        count.to_string()
    }
}

/// Scenario 8's server: the one all client libraries talk to.
pub const CLIENT_SERVER: &str = "rapidws-tokio";

/// Scenario 8's client libraries (`rapidws-load client --lib`), ours first.
pub const CLIENT_LIBS: [&str; 3] = ["rapidws", "tungstenite", "fastwebsockets"];

/// Scenario 8's depths.
pub const CLIENT_DEPTHS: [usize; 2] = [8, 1];

/// Scenario 8's variant name for `lib` at `depth`: `rapidws, depth 8`.
pub fn client_variant(lib: &str, depth: usize) -> String {
    let lib = if lib == "tungstenite" {
        "tokio-tungstenite"
    } else {
        lib
    };
    format!("{lib}, depth {depth}")
}

/// Scenario 8's idle-memory variant name for `lib`: `rapidws, idle`.
pub fn client_idle_variant(lib: &str) -> String {
    client_variant(lib, 0).replace("depth 0", "idle")
}

/// Scenario 8's idle connections: the client's RSS slope between these.
pub const CLIENT_IDLE_STEPS: [usize; 2] = [1000, 6000];

/// One shape of scenario 9.
pub struct FanoutVariant {
    pub name: &'static str,
    pub subscribers: usize,
    pub topics: usize,
    /// Publishes per second, over all topics.
    pub rate: u64,
}

/// Scenario 9's shapes: 10,000 subscribers either way; the offered
/// deliveries are 10M/s on one topic and 1M/s over 1,000 topics, more than
/// a single core delivers in either.
pub const FANOUT_VARIANTS: [FanoutVariant; 2] = [
    FanoutVariant {
        name: "10k subscribers, 1 topic, 1k publishes/s",
        subscribers: 10_000,
        topics: 1,
        rate: 1000,
    },
    FanoutVariant {
        name: "1k topics x 10 subscribers, 100k publishes/s",
        subscribers: 10_000,
        topics: 1000,
        rate: 100_000,
    },
];

/// Payload bytes of scenario 9's messages (the timestamp and filler).
pub const FANOUT_SIZE: usize = 64;

/// One shape of scenario 11, and what it stands for (the report's words).
pub struct BusVariant {
    pub shape: FanoutVariant,
    pub about: &'static str,
}

/// Scenario 11's shapes: one topic with many subscribers, and many topics
/// with few; the publishes come over HTTP ([`BUS_PUBLISHERS`] kept-alive
/// connections, each waiting for its answers), 64-byte payloads.
pub const BUS_VARIANTS: [BusVariant; 2] = [
    BusVariant {
        shape: FanoutVariant {
            name: "1 topic x 2,000 subscribers, 1k publishes/s",
            subscribers: 2000,
            topics: 1,
            rate: 1000,
        },
        about: "One channel that every subscriber follows (a broadcast): each publication is pushed to all 2,000, 2M deliveries/s offered, so what a delivery costs decides.",
    },
    BusVariant {
        shape: FanoutVariant {
            name: "100 topics x 20 subscribers, 10k publishes/s",
            subscribers: 2000,
            topics: 100,
            rate: 10_000,
        },
        about: "Many small channels (rooms, documents): each publication goes to 20 subscribers, 200k deliveries/s offered, ten times the publishes for a tenth of the deliveries, so what each publish costs (its HTTP request, and writes to subscribers that carry fewer publications each) counts for more.",
    },
];

/// Scenario 11's HTTP publishers.
pub const BUS_PUBLISHERS: usize = 16;

/// Scenario 11's load-generator arguments for `variant`, besides the
/// server's address, path and protocol, and the window.
pub fn bus_args(variant: &FanoutVariant) -> Vec<String> {
    strings(&[
        "--publish",
        "http",
        "--publishers",
        &BUS_PUBLISHERS.to_string(),
        "--api-key",
        API_KEY,
        "--subscribers",
        &variant.subscribers.to_string(),
        "--topics",
        &variant.topics.to_string(),
        "--rate",
        &variant.rate.to_string(),
        "--size",
        &FANOUT_SIZE.to_string(),
    ])
}

/// Requests per run of scenario 6.
pub const STREAM_REQUESTS: u64 = 1000;

/// The servers scenario 6 compares: rapidws on both backends, Go
/// servers with a push goroutine beside their read loop (gorilla, gws), and
/// tokio-tungstenite (a push task beside its read loop); and rapidws's
/// `mux_echo` on both backends, pushes and requests as two smux streams of
/// one session over the WebSocket.
pub const STREAM_SERVERS: [&str; 7] = [
    "rapidws-tokio",
    "rapidws-uring",
    "rapidws-tokio-mux",
    "rapidws-uring-mux",
    "gorilla",
    "gws",
    "tokio-tungstenite",
];

/// Push size per variant of scenario 6 (0: no push), every 500 us.
pub const STREAM_VARIANTS: [(&str, usize); 3] = [
    ("no push", 0),
    ("10 KiB / 500 us", 10 * 1024),
    ("1 MiB / 500 us", 1024 * 1024),
];

/// Scenario 6's unpinned variant: 1 MiB every 500 µs as above,
/// but the server free to run on any CPU and the client the Go Stream
/// Benchmark client (`go/cmd/streamclient -whole`, gorilla, default
/// GOMAXPROCS, not pinned either, each push read into a new buffer as that
/// benchmark's own client reads it), as that benchmark runs.
pub const STREAM_UNPINNED: &str = "1 MiB / 500 us, unpinned, Go client";

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A timed run of one load-generator mode against a fresh server: the result's
/// rate, latencies and errors, the server's CPU share, and the result and server
/// for mode-specific figures.
fn timed_run(
    server: &Server,
    settings: &Settings,
    role: Role,
    mode: &str,
    mut args: Vec<String>,
) -> io::Result<(BTreeMap<String, f64>, Timed, Running)> {
    let running = Running::start(server, role)?;
    // The server's memory once listening, before any load: what it grows by.
    let rss_start = running.memory().0;
    args.extend(settings.window());
    let timed = settings
        .load
        .spawn(&running, server.raw, mode, &args)?
        .timed(&running, settings.timeout())?;
    let metrics = run_metrics(&timed, &running, rss_start)?;
    Ok((metrics, timed, running))
}

/// What every timed run reports: rate, latencies, errors, the server's CPU
/// share and memory growth (from `rss_start`, its RSS before the load).
fn run_metrics(
    timed: &Timed,
    running: &Running,
    rss_start: u64,
) -> io::Result<BTreeMap<String, f64>> {
    check_errors(&timed.result)?;
    let mut metrics = BTreeMap::new();
    for key in ["per_sec", "avg_us", "p50_us", "p99_us", "p999_us", "errors"] {
        metrics.insert(key.into(), timed.result[key].as_f64().unwrap_or(f64::NAN));
    }
    metrics.insert(
        "server_cpu_pct".into(),
        100.0 * timed.server_cpu_secs / timed.wall_secs,
    );
    let growth = running.memory().1.saturating_sub(rss_start);
    metrics.insert("rss_growth_mib".into(), growth as f64 / (1024.0 * 1024.0));
    Ok(metrics)
}

fn peak_rss_mib(running: &Running) -> f64 {
    running.memory().1 as f64 / (1024.0 * 1024.0)
}

fn check_errors(result: &Value) -> io::Result<()> {
    match result["first_error"].as_str() {
        Some(error) if result["completed"].as_u64() == Some(0) => {
            Err(io::Error::other(error.to_string()))
        }
        _ => Ok(()),
    }
}

fn echo(
    server: &Server,
    settings: &Settings,
    conns: usize,
    size: usize,
    depth: usize,
) -> io::Result<BTreeMap<String, f64>> {
    closed_loop(server, settings, "echo", conns, size, depth)
}

/// A closed-loop run: `mode` is `echo`, or `deflate` for the echo with
/// permessage-deflate (which also reports the compressed size the client
/// sends).
fn closed_loop(
    server: &Server,
    settings: &Settings,
    mode: &str,
    conns: usize,
    size: usize,
    depth: usize,
) -> io::Result<BTreeMap<String, f64>> {
    let mut args = strings(&["--conns", &conns.to_string(), "--size", &size.to_string()]);
    args.extend(strings(&["--depth", &depth.to_string(), "--sources", "4"]));
    let (mut metrics, timed, running) = timed_run(server, settings, Role::Echo, mode, args)?;
    let completed = timed.result["completed"].as_f64().unwrap_or(0.0);
    metrics.insert(
        "cpu_us_per_msg".into(),
        timed.server_cpu_secs * 1e6 / completed.max(1.0),
    );
    metrics.insert("peak_rss_mib".into(), peak_rss_mib(&running));
    if let Some(size) = timed.result["compressed_size"].as_f64() {
        metrics.insert("compressed_size".into(), size);
    }
    Ok(metrics)
}

/// Opens the connections in steps (e.g. 1000, then up to 10000), each step in
/// processes of at most `PER_PROCESS` connections, reading the server's RSS
/// after each step; then proves every connection alive with a ping. With
/// `offer_deflate` every connection negotiates permessage-deflate (or the
/// run fails).
fn idle(
    server: &Server,
    settings: &Settings,
    steps: &[usize],
    offer_deflate: bool,
) -> io::Result<BTreeMap<String, f64>> {
    const PER_PROCESS: usize = 15_000;
    let settle = Duration::from_secs(2);
    let running = Running::start(server, Role::Echo)?;
    std::thread::sleep(settle);
    let mut metrics = BTreeMap::new();
    let (mut previous_rss, mut previous_conns) = (running.memory().0, 0usize);
    metrics.insert("rss_0_mib".into(), previous_rss as f64 / 1048576.0);
    let mut holders: Vec<LoadProcess> = Vec::new();
    let mut connected = 0usize;
    for &step in steps {
        let mut remaining = step.saturating_sub(previous_conns);
        while remaining > 0 {
            let conns = remaining.min(PER_PROCESS);
            remaining -= conns;
            let offset = (holders.len() * 8).to_string();
            let mut args = strings(&[
                "--conns",
                &conns.to_string(),
                "--sources",
                "8",
                "--source-offset",
                &offset,
            ]);
            if offer_deflate {
                args.push("--deflate".into());
            }
            let mut holder = settings.load.spawn(&running, server.raw, "idle", &args)?;
            let done = holder.expect("connected", settings.timeout())?;
            connected += done["connected"].as_u64().unwrap_or(0) as usize;
            if let Some(error) = done["first_error"].as_str() {
                return Err(io::Error::other(format!("idle connect: {error}")));
            }
            holders.push(holder);
        }
        std::thread::sleep(settle);
        let rss = running.memory().0;
        let label = count_label(step);
        metrics.insert(format!("rss_{label}_mib"), rss as f64 / 1048576.0);
        let added = (step - previous_conns) as f64;
        metrics.insert(
            slope_metric(step),
            (rss as f64 - previous_rss as f64) / added,
        );
        (previous_rss, previous_conns) = (rss, step);
    }
    let mut alive = 0;
    for holder in &mut holders {
        holder.command("ping")?;
    }
    for holder in &mut holders {
        alive += holder.expect("alive", settings.timeout())?["alive"]
            .as_u64()
            .unwrap_or(0);
    }
    metrics.insert("connected".into(), connected as f64);
    metrics.insert("alive".into(), alive as f64);
    for holder in &mut holders {
        let _ = holder.command("exit");
    }
    Ok(metrics)
}

/// Scenario 8: the closed-loop echo through a client library.
fn client_echo(
    server: &Server,
    settings: &Settings,
    lib: &str,
    depth: usize,
) -> io::Result<BTreeMap<String, f64>> {
    let mut args = strings(&["--lib", lib, "--conns", "100", "--size", "1024"]);
    args.extend(strings(&["--depth", &depth.to_string()]));
    let (mut metrics, timed, _) = timed_run(server, settings, Role::Echo, "client", args)?;
    // The client's own CPU in the window: whether its core was the limit,
    // and what a message cost it.
    let client_cpu = timed.result["client_cpu_secs"].as_f64().unwrap_or(f64::NAN);
    let window = timed.result["secs"].as_f64().unwrap_or(f64::NAN);
    let completed = timed.result["completed"].as_f64().unwrap_or(f64::NAN);
    metrics.insert("client_cpu_pct".into(), 100.0 * client_cpu / window);
    metrics.insert("client_cpu_us_per_msg".into(), 1e6 * client_cpu / completed);
    Ok(metrics)
}

/// Scenario 9: subscribers and a publisher at a fixed rate against the
/// server's fan-out binary. Keeps the delivery rate and latency, what was
/// offered, the server's CPU, and its memory per subscriber (connection
/// and subscription: RSS growth over the run, divided by the subscribers).
fn fanout(
    server: &Server,
    settings: &Settings,
    variant: &FanoutVariant,
) -> io::Result<BTreeMap<String, f64>> {
    let args = strings(&[
        "--subscribers",
        &variant.subscribers.to_string(),
        "--topics",
        &variant.topics.to_string(),
        "--rate",
        &variant.rate.to_string(),
        "--size",
        &FANOUT_SIZE.to_string(),
    ]);
    let (mut metrics, timed, running) = timed_run(server, settings, Role::Fanout, "fanout", args)?;
    let field = |name: &str| timed.result[name].as_f64().unwrap_or(f64::NAN);
    metrics.insert("expected_per_sec".into(), field("expected_per_sec"));
    metrics.insert(
        "client_cpu_pct".into(),
        100.0 * field("client_cpu_secs") / field("secs"),
    );
    metrics.insert(
        "server_cpu_us_per_delivery".into(),
        1e6 * timed.server_cpu_secs / field("completed"),
    );
    let peak = running.memory().1 as f64;
    metrics.insert("peak_rss_mib".into(), peak / (1024.0 * 1024.0));
    metrics.insert(
        "bytes_per_subscriber".into(),
        metrics["rss_growth_mib"] * 1024.0 * 1024.0 / variant.subscribers as f64,
    );
    Ok(metrics)
}

/// Scenario 11: HTTP publishers and WebSocket subscribers against the bus,
/// `centrifugo_compat` or Centrifugo, each subscriber speaking the server's
/// protocol. Keeps what scenario 9 keeps, and the publishes the server
/// answered per second.
fn bus(
    server: &Server,
    settings: &Settings,
    variant: &FanoutVariant,
) -> io::Result<BTreeMap<String, f64>> {
    let protocol = server
        .bus
        .as_ref()
        .ok_or_else(|| io::Error::other("not a bus"))?
        .protocol;
    let mut args = strings(&["--protocol", protocol]);
    args.extend(bus_args(variant));
    let (mut metrics, timed, running) = timed_run(server, settings, Role::Bus, "fanout", args)?;
    let field = |name: &str| timed.result[name].as_f64().unwrap_or(f64::NAN);
    metrics.insert("published_per_sec".into(), field("published_per_sec"));
    metrics.insert("expected_per_sec".into(), field("expected_per_sec"));
    metrics.insert(
        "client_cpu_pct".into(),
        100.0 * field("client_cpu_secs") / field("secs"),
    );
    metrics.insert(
        "server_cpu_us_per_delivery".into(),
        1e6 * timed.server_cpu_secs / field("completed"),
    );
    metrics.insert("peak_rss_mib".into(), peak_rss_mib(&running));
    Ok(metrics)
}

/// Scenario 10's shape.
pub const STORM_SUBSCRIBERS: usize = 10_000;
pub const STORM_RATE: u64 = 20;

/// Scenario 10: the reconnect storm (`rapidws-load storm`): the warm-up
/// before the drop, then at most the measured window for every resume.
fn storm(server: &Server, settings: &Settings) -> io::Result<BTreeMap<String, f64>> {
    let args = strings(&[
        "--subscribers",
        &STORM_SUBSCRIBERS.to_string(),
        "--rate",
        &STORM_RATE.to_string(),
    ]);
    let (mut metrics, timed, running) = timed_run(server, settings, Role::Fanout, "storm", args)?;
    for name in [
        "recovered",
        "not_recovered",
        "unanswered",
        "missing",
        "doubled",
        "recover_all_secs",
        "recover_p50_secs",
    ] {
        metrics.insert(name.into(), timed.result[name].as_f64().unwrap_or(f64::NAN));
    }
    metrics.insert("peak_rss_mib".into(), peak_rss_mib(&running));
    Ok(metrics)
}

/// Scenario 8: the memory of an idle client connection, measured by the
/// client process itself.
fn client_idle(
    server: &Server,
    settings: &Settings,
    lib: &str,
) -> io::Result<BTreeMap<String, f64>> {
    let running = Running::start(server, Role::Echo)?;
    let [from, to] = CLIENT_IDLE_STEPS;
    let args = strings(&[
        "--lib",
        lib,
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ]);
    let mut holder = settings
        .load
        .spawn(&running, server.raw, "client-idle", &args)?;
    let done = holder.expect("idle", settings.timeout())?;
    let mut metrics = BTreeMap::new();
    let slope = done["bytes_per_conn"].as_f64().unwrap_or(f64::NAN);
    metrics.insert("client_bytes_per_conn".into(), slope);
    Ok(metrics)
}

fn handshake(server: &Server, settings: &Settings) -> io::Result<BTreeMap<String, f64>> {
    let args = strings(&["--concurrency", "32", "--sources", "16"]);
    Ok(timed_run(server, settings, Role::Echo, "handshake", args)?.0)
}

fn stream(server: &Server, settings: &Settings, push: usize) -> io::Result<BTreeMap<String, f64>> {
    let role = if push == 0 {
        Role::Echo
    } else {
        Role::Push {
            size: push,
            every_us: 500,
            pinned: true,
        }
    };
    // The "WebSocket Stream Benchmark"'s own settings: a 36-byte text
    // request every 10 ms on one connection, 1,000 of them, each reply
    // matched by content; one missing 5 s after the last request is lost.
    let mut args = strings(&["--conns", "1", "--interval-us", "10000", "--size", "36"]);
    args.extend(strings(&["--requests", &STREAM_REQUESTS.to_string()]));
    if server.mux {
        // Two streams of one session; the pushes are counted in bytes.
        args.extend(strings(&["--mux", "--push-size", &push.max(1).to_string()]));
    }
    let (mut metrics, timed, running) = timed_run(server, settings, role, "stream", args)?;
    stream_metrics(&mut metrics, &timed, &running);
    Ok(metrics)
}

fn stream_metrics(metrics: &mut BTreeMap<String, f64>, timed: &Timed, running: &Running) {
    for key in ["pushes_per_sec", "push_mb_per_sec", "missing"] {
        metrics.insert(key.into(), timed.result[key].as_f64().unwrap_or(f64::NAN));
    }
    metrics.insert("peak_rss_mib".into(), peak_rss_mib(running));
}

/// [`STREAM_UNPINNED`]: the server and the Go client on any CPU.
fn stream_unpinned(server: &Server, settings: &Settings) -> io::Result<BTreeMap<String, f64>> {
    let role = Role::Push {
        size: 1024 * 1024,
        every_us: 500,
        pinned: false,
    };
    let running = Running::start(server, role)?;
    let rss_start = running.memory().0;
    let args = strings(&[
        "-whole",
        "-interval",
        "10ms",
        "-size",
        "36",
        "-requests",
        &STREAM_REQUESTS.to_string(),
        "-warmup",
        &format!("{}s", settings.warmup),
    ]);
    let timed = settings
        .load
        .spawn_go_stream(&running, &args)?
        .timed(&running, settings.timeout())?;
    let mut metrics = run_metrics(&timed, &running, rss_start)?;
    stream_metrics(&mut metrics, &timed, &running);
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(scenario: u8, metrics: &[(&str, f64)]) -> Measurement {
        Measurement {
            scenario,
            variant: String::new(),
            server: "s".into(),
            round: 0,
            metrics: metrics.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
            error: None,
        }
    }

    #[test]
    fn the_bus_servers_run_scenario_11_and_only_they() {
        let none = std::path::Path::new("");
        let all = crate::servers::all(none, none, none);
        let bus: Vec<_> = all.iter().filter(|s| s.bus.is_some()).collect();
        let names: Vec<_> = bus.iter().map(|s| s.name).collect();
        assert_eq!(names, ["notify_bus", "centrifugo_compat", "centrifugo"]);
        for scenario in &SCENARIOS {
            for server in &all {
                if scenario.applies_to(server) {
                    assert_eq!(
                        scenario.number == 11,
                        server.bus.is_some(),
                        "{} in scenario {}",
                        server.name,
                        scenario.number
                    );
                }
            }
        }
        assert!(bus.iter().all(|s| SCENARIOS[10].applies_to(s)));
    }

    #[test]
    fn idle_headline_is_the_slope_to_the_scenarios_last_count() {
        assert_eq!(slope_metric(5000), "bytes_per_conn_to_5k");
        assert_eq!(slope_metric(1500), "bytes_per_conn_to_1500");
        let idle = [("bytes_per_conn_to_1k", 9.0), ("bytes_per_conn_to_5k", 5.0)];
        assert_eq!(measured(7, &idle).headline(), Some(5.0));
        let idle = [
            ("bytes_per_conn_to_1k", 9.0),
            ("bytes_per_conn_to_10k", 4.0),
        ];
        assert_eq!(measured(4, &idle).headline(), Some(4.0));
        assert_eq!(measured(7, &[("per_sec", 3.0)]).headline(), Some(3.0));
        assert_eq!(measured(5, &[]).headline(), None);
    }
}
