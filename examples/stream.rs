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
//! One payload is allocated at start and shared by every push (`Conn::send_shared`
//! queues a reference, not a copy). When a connection's outbound queue is full the
//! push is skipped for that tick: a feed that cannot keep up gets fresher data
//! later rather than an ever-growing backlog. tokio's timer has 1 ms resolution,
//! so intervals under 1 ms are delivered as bursts that keep the average rate.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rapidws::{
    Accept, Bytes, Config, Conn, Handler, Message, MessageKind, Reject, Request, SendError,
};

#[derive(Parser, Debug)]
#[command(about = "rapidws push (stream) server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    addr: SocketAddr,
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
        tokio::spawn(async move {
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let feed = Feed {
        payload: Bytes::from(vec![0x5a; args.push_size]),
        every: Duration::from_micros(args.push_every_us.max(1)),
    };
    runtime.block_on(async {
        let server = match rapidws::tokio::Server::bind(args.addr, feed, Config::default()).await {
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
        match server.serve().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
