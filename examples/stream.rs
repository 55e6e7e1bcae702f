//! Push server: echoes every message like `echo`, and pushes a binary message of
//! `--push-size` bytes to every connection every `--push-every-us` microseconds.
//!
//! This is the server side of the load harness's `stream` scenario (a market-data
//! style feed with small requests on the same connection), and an example of
//! sending from outside the handler callbacks with a [`Conn`] handle.
//!
//! ```text
//! cargo run --release --example stream -- --push-size 10240 --push-every-us 500
//! ```
//! `--backend uring` serves with the io_uring backend (Linux); the pushes then
//! come from a tokio runtime thread beside the reactors, through each
//! connection's `Conn`.
//! One payload is allocated at start and shared by every push (`Conn::send_shared`
//! queues a reference, not a copy). When a connection's outbound queue is full the
//! push is skipped for that tick: a feed that cannot keep up gets fresher data
//! later rather than an ever-growing backlog. tokio's timer has 1 ms resolution,
//! so intervals under 1 ms are delivered as bursts that keep the average rate.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rapidws::{Accept, Bytes, Conn, Handler, Message, MessageKind, Reject, Request, SendError};
use tokio::runtime;

mod support;

#[derive(Parser, Debug)]
#[command(about = "rapidws push (stream) server")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// Size of each pushed binary message in bytes; 0 turns pushing off.
    #[arg(long, default_value_t = 10240)]
    push_size: usize,
    /// Interval between pushes, in microseconds.
    #[arg(long, default_value_t = 500)]
    push_every_us: u64,
}

struct Feed {
    payload: Bytes,
    every: Duration,
    /// Where each connection's push task runs.
    runtime: runtime::Handle,
}

impl Handler for Feed {
    type State = ();

    fn on_upgrade(&self, _request: &Request<'_>, _accept: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }

    fn on_open(&self, conn: &Conn, _state: &mut ()) {
        if self.payload.is_empty() {
            return;
        }
        let (conn, payload, every) = (conn.clone(), self.payload.clone(), self.every);
        self.runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                match conn.send_shared(MessageKind::Binary, payload.clone()) {
                    Ok(()) | Err(SendError::QueueFull) => {}
                    Err(_) => break,
                }
            }
        });
    }

    fn on_message(&self, conn: &Conn, _state: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let payload = Bytes::from(vec![0x5a; args.push_size]);
    let every = Duration::from_micros(args.push_every_us.max(1));
    support::serve("stream", &args.serve, |runtime| Feed {
        payload,
        every,
        runtime,
    })
}
