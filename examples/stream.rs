//! Push server: pushes a binary message of `--push-size` bytes to every
//! connection every `--push-every-us` microseconds, and answers every message
//! a client sends with the same message, ahead of the queued pushes.
//!
//! This is the model for a push service whose clients also send requests on
//! the same connection (market data, notifications, games), and the server
//! side of the load harness's `stream` scenario (the "WebSocket Stream
//! Benchmark").
//!
//! ```text
//! cargo run --release --example stream -- --push-size 10240 --push-every-us 500
//! ```
//!
//! It listens on 127.0.0.1:9005 unless `--addr` says otherwise.
//!
//! - **Pushes go at the reader's pace.** Each connection's push task sends
//!   with `Conn::send_when_ready`: while the connection's outbound queue is
//!   full it waits (woken by the backend once the peer has read half of it),
//!   instead of dropping pushes or spinning on `QueueFull`. A payload is
//!   allocated once at start and shared by every push (a reference is
//!   queued, not a copy).
//! - **Replies jump the queue.** `on_message` answers with `Conn::reply`,
//!   which puts the answer ahead of every push that has not started on the
//!   wire; the server keeps reading requests while its writes are blocked.
//! - **Little waits in the kernel.** At most 512 KiB of a connection's
//!   output is left unsent in its socket (`Config::max_unsent_bytes`,
//!   `--max-unsent-bytes`; 0 leaves the kernel's bound, its whole send
//!   buffer): a reply cannot overtake what the kernel holds.
//! - **Nothing is dropped silently.** A send that fails is logged at debug
//!   level with its reason (`RUST_LOG=debug`).
//!
//! `--h3` (with `--tls-cert` and `--tls-key`) also serves the same pushes
//! and replies over HTTP/3 (RFC 9220) on UDP at `--addr`, beside wss on TCP,
//! so a client can compare the two on one path (the load harness's
//! `stream --h3 rfc9220`). Ctrl-C and SIGTERM close the HTTP/3 WebSockets
//! with 1001 at once (`--spread-secs` spreads the TCP ones only), and the
//! process exits once both sides are done.
//!
//! `--backend uring` serves with the io_uring backend (Linux 6.0 or later);
//! the push tasks then run on a tokio runtime thread beside the
//! reactors, through each connection's `Conn`. tokio's timer has 1 ms
//! resolution, so intervals under 1 ms are delivered as bursts that keep the
//! average rate.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rapidws::{
    Accept, Bytes, Conn, Handler, HttpResponse, Message, MessageKind, Reject, Request,
    ServerHandler,
};
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
    /// Also serve over HTTP/3 (RFC 9220) on UDP at --addr (needs --tls-cert;
    /// not with a handoff: UDP's socket does not move).
    #[arg(long, requires = "tls_cert", conflicts_with_all = ["take_over", "handoff_socket"])]
    h3: bool,
}

#[derive(Clone)]
struct Feed {
    payload: Bytes,
    every: Duration,
    /// Where each connection's push task runs.
    runtime: runtime::Handle,
}

impl Handler for Feed {
    type State = ();

    fn on_open(&self, conn: &Conn, _state: &mut ()) {
        if self.payload.is_empty() {
            return;
        }
        let (conn, payload, every) = (conn.clone(), self.payload.clone(), self.every);
        self.runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                // Waits while the queue is full; fails once the connection
                // closes, which ends the task.
                let push = payload.clone();
                if let Err(error) = conn.send_when_ready(MessageKind::Binary, push).await {
                    tracing::debug!(id = conn.id(), %error, "pushes stopped");
                    break;
                }
            }
        });
    }

    fn on_message(&self, conn: &Conn, _state: &mut (), message: Message<'_>) {
        if let Err(error) = conn.reply(message) {
            tracing::debug!(id = conn.id(), %error, "reply not sent");
        }
    }
}

impl ServerHandler for Feed {
    fn on_upgrade(&self, _request: &Request<'_>, _accept: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }

    /// `GET /metrics` with `--metrics`.
    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        support::metrics_page(request.method(), request.path())
    }
}

fn main() -> ExitCode {
    support::log_to_stderr();
    let mut args: Args = support::parse_with_addr("127.0.0.1:9005");
    // A reply waits behind what the kernel holds unsent: keep it short.
    args.serve.max_unsent_bytes.get_or_insert(512 * 1024);
    let payload = Bytes::from(vec![0x5a; args.push_size]);
    let every = Duration::from_micros(args.push_every_us.max(1));
    let feed = |runtime: runtime::Handle| Feed {
        payload,
        every,
        runtime,
    };
    if !args.h3 {
        return support::serve("stream", &args.serve, feed);
    }
    support::serve_beside("stream", &args.serve, args.serve.config(), |runtime| {
        let feed = feed(runtime.clone());
        match serve_h3(&runtime, &args.serve, feed.clone()) {
            Ok(task) => (feed, Some(task)),
            Err(error) => {
                eprintln!("error: --h3: {error}");
                std::process::exit(1);
            }
        }
    })
}

/// Serves `feed` over HTTP/3 on UDP `args.addr` from a task on `runtime`,
/// until Ctrl-C or SIGTERM (then every WebSocket is closed with 1001 and
/// the task ends).
fn serve_h3(
    runtime: &runtime::Handle,
    args: &support::ServeArgs,
    feed: Feed,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Err("needs --tls-cert and --tls-key".into());
    };
    let mut tls = (*support::tls_server_config(cert, key)?).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = rapidws::h3::QuicConfig::default();
    let endpoint = {
        // quinn's socket registers with the runtime it is made in.
        let _entered = runtime.enter();
        rapidws::h3::endpoint(args.addr, tls, &quic)
            .map_err(|error| format!("cannot listen on UDP {}: {error}", args.addr))?
    };
    let server = rapidws::stream::Server::new(feed, args.config());
    let stopping = server.clone();
    runtime.spawn(async move {
        support::stop_signal().await;
        stopping.shutdown().await;
    });
    tracing::info!(addr = %args.addr, "stream over HTTP/3 (UDP) too");
    Ok(runtime.spawn(async move { rapidws::h3::serve(endpoint, &server).await }))
}
