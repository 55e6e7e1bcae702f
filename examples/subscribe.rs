//! A bus subscriber that keeps its subscriptions (`rapidws::client::Subscriber`):
//! prints one line per delivery, `TOPIC EPOCH:OFFSET DATA` (DATA the text
//! as sent; a binary payload as `base64:<...>`), and `# not recovered
//! TOPIC` where something was missed; reconnects with backoff and resumes
//! every topic after its last delivery, until interrupted (Ctrl-C closes
//! with 1000 and exits 0).
//!
//! ```text
//! cargo run --release --example subscribe -- ws://127.0.0.1:9004/ws --topics a,b [--cafile cert.pem] [--http3]
//! ```
//!
//! URL is the bus's WebSocket endpoint (`notify_bus`'s `/ws`); the
//! subscriber adds the query. Connections, cuts and refusals are logged on
//! stderr.

use std::io::Write as _;
use std::process::ExitCode;

use base64::Engine as _;
use clap::Parser;
use rapidws::Config;
use rapidws::bus::Data;
use rapidws::client::subscriber::Event;
use rapidws::client::{Client, Subscriber};

#[path = "support/mod.rs"]
mod support;

#[derive(Parser, Debug)]
#[command(about = "Subscribe to a bus's topics; reconnect and resume until interrupted")]
struct Args {
    /// The bus's WebSocket endpoint, ws:// or wss:// (e.g.
    /// ws://127.0.0.1:9004/ws).
    url: String,
    /// The topics, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    topics: Vec<String>,
    /// For wss: trust this certificate (PEM) instead of the web PKI roots.
    #[arg(long, value_name = "PEM")]
    cafile: Option<std::path::PathBuf>,
    /// wss:// over HTTP/3 (RFC 9220) instead of TCP.
    #[arg(long)]
    http3: bool,
}

fn main() -> ExitCode {
    support::main(run)
}

async fn run(args: Args) -> Result<(), String> {
    let mut client = Client::new(Config::default())
        .tls(support::client_tls(args.cafile.as_deref(), "--cafile")?);
    if args.http3 {
        client = client.http3();
    }
    let mut subscriber = Subscriber::builder(args.url.as_str())
        .topics(args.topics.iter().map(String::as_str))
        .client(client)
        .start();
    let mut out = std::io::stdout().lock();
    loop {
        let event = tokio::select! {
            event = subscriber.next() => event,
            _ = tokio::signal::ctrl_c() => break,
        };
        let Some(event) = event else { break };
        let line = match event {
            Event::Delivery {
                topic,
                position,
                data,
            } => match data {
                Data::Text(text) => format!("{topic} {position} {text}"),
                Data::Binary(bytes) => {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
                    format!("{topic} {position} base64:{encoded}")
                }
            },
            Event::Discontinuity { topic } => format!("# not recovered {topic}"),
            Event::Connected => {
                tracing::info!(url = %args.url, "connected");
                continue;
            }
            Event::Disconnected { why, retry_in } => {
                tracing::warn!(%why, ?retry_in, "disconnected; reconnecting");
                continue;
            }
            Event::Refused { why } => {
                tracing::warn!(%why, "refused by the bus");
                continue;
            }
            other => {
                tracing::debug!(?other, "event");
                continue;
            }
        };
        // Each line goes out whole and at once: another program reads them.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    subscriber.stop().await;
    Ok(())
}
