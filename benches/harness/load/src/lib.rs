//! The load generator's modes and the pieces they share. See `bin/rapidws-load.rs`.

pub mod client;
pub mod deflate;
pub mod echo;
pub mod fanout;
pub mod fanout_http;
pub mod h3wire;
pub mod handshake;
pub mod idle;
pub mod mux;
pub mod ports;
pub mod resume_storm;
pub mod stats;
pub mod storm;
pub mod stream;
pub mod stream_mux;
pub mod stream_requests;
pub mod wire;

use std::cell::Cell;
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use clap::{Args, Parser};

#[derive(Parser, Debug)]
#[command(name = "rapidws-load", about = "WebSocket load generator")]
pub enum Mode {
    /// N connections echoing messages, D in flight each (closed loop).
    Echo(echo::EchoArgs),
    /// Open N upgraded connections and hold them; `ping` on stdin proves them alive.
    Idle(idle::IdleArgs),
    /// Upgrades per second: connect, upgrade, close, repeat.
    Handshake(handshake::HandshakeArgs),
    /// Small requests every interval while the server pushes large messages.
    Stream(stream_requests::StreamArgs),
    /// Echo with permessage-deflate negotiated (fails if the server declines).
    Deflate(deflate::DeflateArgs),
    /// Closed-loop echo through a client library (rapidws, tokio-tungstenite, fastwebsockets).
    Client(client::ClientArgs),
    /// The memory of an idle client connection, per library (this process's RSS slope).
    ClientIdle(client::ClientIdleArgs),
    /// Pub/sub: subscribers on topics, a publisher at a fixed rate; deliveries/s and latency.
    Fanout(fanout::FanoutArgs),
    /// A reconnect storm: subscribers dropped at once resume where they were.
    Storm(storm::StormArgs),
    /// A reconnect storm of `rapidws::client::Subscriber`s cut at once
    /// through a proxy: backoff with jitter, resume, recovery times.
    ResumeStorm(resume_storm::ResumeStormArgs),
    /// Stream multiplexers over TCP (rapidws, async_smux, yamux): serve, throughput, open, idle.
    #[command(subcommand)]
    Mux(mux::MuxMode),
}

impl Mode {
    pub async fn run(self) -> std::io::Result<()> {
        match self {
            Mode::Echo(args) => echo::run(args).await,
            Mode::Idle(args) => idle::run(args).await,
            Mode::Handshake(args) => handshake::run(args).await,
            Mode::Stream(args) => stream::run(args).await,
            Mode::Deflate(args) => deflate::run(args).await,
            Mode::Client(args) => client::run(args).await,
            Mode::ClientIdle(args) => client::idle(args).await,
            Mode::Fanout(args) => fanout::run(args).await,
            Mode::Storm(args) => storm::run(args).await,
            Mode::ResumeStorm(args) => resume_storm::run(args).await,
            Mode::Mux(mode) => mux::run(mode).await,
        }
    }
}

/// Where to connect, shared by every mode.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// Server address.
    #[arg(long, default_value = "127.0.0.1:9001")]
    pub addr: SocketAddr,
    /// Request path.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// No HTTP upgrade: the peer is a raw TCP echo server.
    #[arg(long)]
    pub raw: bool,
    /// Connect from this many source addresses 127.0.0.(offset+1)...
    #[arg(long, default_value_t = 1)]
    pub sources: u8,
    /// ... starting after this offset.
    #[arg(long, default_value_t = 0)]
    pub source_offset: u8,
    /// wss: connect with TLS, trusting this certificate (PEM) for `localhost`.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Over HTTP/3 (with --tls-ca): each WebSocket on a QUIC connection of
    /// its own to --addr (UDP), opened in this dialect: `rfc9220`
    /// (`:protocol` websocket) or `sockudo` (sockudo-ws 3.1's: `:protocol`
    /// webtransport). --sources is not used.
    #[arg(long, value_enum, requires = "tls_ca", conflicts_with = "raw")]
    pub h3: Option<h3wire::Dialect>,
}

impl TargetArgs {
    /// The target (in a tokio runtime: `--h3` makes a QUIC endpoint).
    pub fn target(&self) -> wire::Target {
        let tls = self.tls_ca.as_deref().map(|ca| {
            wire::tls_client(ca).unwrap_or_else(|error| {
                eprintln!("error: --tls-ca {}: {error}", ca.display());
                std::process::exit(2);
            })
        });
        let h3 = self.h3.map(|dialect| {
            let tls = tls.as_deref().expect("clap requires --tls-ca with --h3");
            h3wire::H3Target::new(tls, dialect).unwrap_or_else(|error| {
                eprintln!("error: --h3: cannot open a QUIC endpoint: {error}");
                std::process::exit(2);
            })
        });
        wire::Target {
            addr: self.addr,
            path: self.path.clone(),
            raw: self.raw,
            tls,
            h3,
        }
    }

    pub fn sources(&self) -> wire::Sources {
        wire::Sources {
            count: self.sources,
            offset: self.source_offset,
        }
    }
}

/// The timed part of a run: warm-up, then the measured window.
#[derive(Args, Debug, Clone, Copy)]
pub struct Window {
    /// Seconds before measuring starts.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
}

/// What the connections should do now; read by every task on each turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Warmup,
    Measure,
    Stop,
}

pub type SharedPhase = Rc<Cell<Phase>>;

impl Window {
    /// Runs warm-up then the window, announcing the window's start on stdout.
    /// Returns the measured seconds and this process's CPU time in them.
    pub async fn run(&self, phase: &SharedPhase) -> Measured {
        tokio::time::sleep(Duration::from_secs_f64(self.warmup)).await;
        phase.set(Phase::Measure);
        emit(&serde_json::json!({ "event": "measure" }));
        let (start, cpu) = (std::time::Instant::now(), process_cpu_secs());
        tokio::time::sleep(Duration::from_secs_f64(self.duration)).await;
        phase.set(Phase::Stop);
        Measured {
            secs: start.elapsed().as_secs_f64(),
            cpu_secs: process_cpu_secs() - cpu,
        }
    }
}

/// A measured window: its wall time, and the CPU time (user and system, all
/// threads) the load generator itself spent in it.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub secs: f64,
    pub cpu_secs: f64,
}

/// This process's CPU time so far, user plus system, every thread.
pub fn process_cpu_secs() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer we pass, which
    // points at a zeroed struct of that type we own.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return f64::NAN;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Records a connection task's failure, unless it ended because the run stopped.
pub fn note_failure(result: std::io::Result<()>, phase: &SharedPhase, stats: &stats::SharedStats) {
    if let Err(error) = result
        && phase.get() != Phase::Stop
    {
        stats.borrow_mut().error(error);
    }
}

/// Writes one JSON line to stdout and flushes, so a runner sees it at once.
pub fn emit(value: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

/// Raises the soft open-file limit to the hard one (20000 on this machine).
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
