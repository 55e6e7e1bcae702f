//! Echo server: sends every text and binary message back with the same opcode.
//!
//! ```text
//! cargo run --release --example echo -- --addr 127.0.0.1:9001 --backend tokio
//! ```
//! Logging follows `RUST_LOG` (default `info`). Ctrl-C shuts down gracefully.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request};

#[derive(Parser, Debug)]
#[command(about = "rapidws echo server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    addr: SocketAddr,
    /// Which backend serves the connections.
    #[arg(long, value_enum, default_value_t = Backend::Tokio)]
    backend: Backend,
    /// Worker threads for the tokio runtime, or reactor threads for io_uring
    /// (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// Connection groups on a multi-threaded tokio runtime.
    Tokio,
    /// One io_uring reactor per thread (Linux 6.0 or later).
    Uring,
}

struct Echo;

impl Handler for Echo {
    type State = ();

    fn on_upgrade(&self, _request: &Request<'_>, _accept: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }

    fn on_message(&self, conn: &Conn, _state: &mut (), message: Message<'_>) {
        if let Err(error) = conn.send(message) {
            tracing::debug!(id = conn.id(), %error, "echo not sent");
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    match args.backend {
        Backend::Tokio => run_tokio(&args),
        Backend::Uring => run_uring(&args),
    }
}

#[cfg(target_os = "linux")]
fn run_uring(args: &Args) -> ExitCode {
    let mut server = match rapidws::uring::Server::bind(args.addr, Echo, Config::default()) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("error: cannot listen on {}: {error}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    if let Some(threads) = args.threads {
        server = server.threads(threads);
    }
    let handle = server.handle();
    // Ctrl-C: a small runtime only to wait for the signal.
    let signals = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|runtime| {
            std::thread::spawn(move || {
                runtime.block_on(async {
                    if tokio::signal::ctrl_c().await.is_ok() {
                        handle.shutdown();
                    }
                })
            })
        });
    if let Err(error) = signals {
        eprintln!("warning: Ctrl-C will not shut down gracefully: {error}");
    }
    tracing::info!(addr = %args.addr, backend = "uring", "echo server listening");
    match server.serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn run_uring(_: &Args) -> ExitCode {
    eprintln!("error: the io_uring backend needs Linux; use --backend tokio");
    ExitCode::from(2)
}

fn run_tokio(args: &Args) -> ExitCode {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let server = match rapidws::tokio::Server::bind(args.addr, Echo, Config::default()).await {
            Ok(server) => server,
            Err(error) => {
                eprintln!("error: cannot listen on {}: {error}", args.addr);
                return ExitCode::FAILURE;
            }
        };
        let handle = server.handle();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                handle.shutdown();
            }
        });
        tracing::info!(addr = %args.addr, backend = "tokio", "echo server listening");
        match server.serve().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
