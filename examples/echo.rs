//! Echo server: sends every text and binary message back with the same opcode.
//!
//! ```text
//! cargo run --release --example echo -- --addr 127.0.0.1:9001 --backend tokio
//! ```
//! `--backend uring` serves with the io_uring backend (Linux; build with
//! `--features uring`). Logging follows
//! `RUST_LOG` (default `info`). Ctrl-C shuts down gracefully.

use std::process::ExitCode;

use clap::Parser;
use rapidws::{Accept, Conn, Handler, Message, Reject, Request};

mod support;

#[derive(Parser, Debug)]
#[command(about = "rapidws echo server")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
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
    support::serve("echo", &args.serve, |_| Echo)
}
