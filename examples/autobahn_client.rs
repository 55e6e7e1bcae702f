//! The Autobahn TestSuite's client protocol, against its fuzzing server
//! (`kosoku -m fuzzingserver`): asks for the number of cases, runs each one
//! (`/runCase?case=N&agent=A`) echoing every message it is sent, then asks
//! for the reports (`/updateReports?agent=A`).
//!
//! ```text
//! cargo run --release --example autobahn_client -- --url ws://127.0.0.1:9001 --agent rapidws [--deflate]
//! ```
//!
//! The cases are echoed through a `Handler` (the callback API) on a
//! `rapidws::client::Client`; the case count is read with the async socket.
//! `--deflate` offers permessage-deflate with the library's defaults and
//! compresses every echo (Autobahn's compression cases expect it), unless
//! `--deflate-min-size` says otherwise.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rapidws::client::{Client, ConnectRequest};
use rapidws::{CloseCode, Config, Conn, DeflateConfig, Handler, Message, OwnedMessage};
use tokio::sync::oneshot;

// Only its logging is used here.
#[allow(dead_code)]
mod support;

#[derive(Parser, Debug)]
#[command(about = "rapidws Autobahn client")]
struct Args {
    /// The fuzzing server's URL.
    #[arg(long, default_value = "ws://127.0.0.1:9001")]
    url: String,
    /// The name the reports give this client.
    #[arg(long, default_value = "rapidws")]
    agent: String,
    /// Offer permessage-deflate (RFC 7692) with the library's defaults.
    #[arg(long)]
    deflate: bool,
    /// With --deflate: send messages shorter than this uncompressed
    /// (default 0: every echo compressed).
    #[arg(long, requires = "deflate", value_name = "BYTES", default_value_t = 0)]
    deflate_min_size: usize,
    /// Give up on a case that has not ended after this many seconds.
    #[arg(long, default_value_t = 120)]
    case_timeout: u64,
    /// Cases run at the same time (the fuzzing server keeps each case's
    /// connection apart).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    parallel: u32,
}

/// Echoes every message; tells the runner when the case's connection ends.
struct Echo;

impl Handler for Echo {
    type State = Option<oneshot::Sender<(CloseCode, String)>>;

    fn on_message(&self, conn: &Conn, _: &mut Self::State, message: Message<'_>) {
        if let Err(error) = conn.send(message) {
            tracing::debug!(%error, "echo not sent");
        }
    }

    fn on_close(&self, _: &Conn, ended: &mut Self::State, code: CloseCode, reason: &str) {
        if let Some(ended) = ended.take() {
            let _ = ended.send((code, reason.to_owned()));
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    support::log_to_stderr();
    let args = Args::parse();
    let mut config = Config::default()
        // Autobahn's largest messages are 16 MiB, compressed ones more.
        .max_message_size(64 << 20)
        .max_frame_size(64 << 20);
    if args.deflate {
        config = config
            .permessage_deflate(DeflateConfig::default().compress_min_size(args.deflate_min_size));
    }
    let base = args.url.trim_end_matches('/');

    // An ordinary WebSocket server answers `/getCaseCount` with nothing (or
    // with an echo of nothing): say what this needs instead of waiting.
    let asked = tokio::time::timeout(COUNT_WAIT, case_count(base, config.clone())).await;
    let count = match asked {
        Ok(Ok(count)) => count,
        Ok(Err(error)) => {
            eprintln!(
                "autobahn_client: could not get the case count from {base}: {error}\n{NEEDS_FUZZER}"
            );
            return ExitCode::FAILURE;
        }
        Err(_) => {
            eprintln!(
                "autobahn_client: no case count from {base}/getCaseCount within {COUNT_WAIT:?}\n{NEEDS_FUZZER}"
            );
            return ExitCode::FAILURE;
        }
    };
    eprintln!("autobahn_client: {count} cases");

    let client = Client::with_handler(Echo, config);
    let wait = Duration::from_secs(args.case_timeout);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(args.parallel as usize));
    let mut cases = tokio::task::JoinSet::new();
    for case in 1..=count {
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let url = format!("{base}/runCase?case={case}&agent={}", args.agent);
        let client = client.clone();
        cases.spawn(async move {
            let _slot = slot;
            run_case(&client, case, url, wait).await
        });
    }
    let mut failed = 0;
    while let Some(ran) = cases.join_next().await {
        if !ran.unwrap_or(false) {
            failed += 1;
        }
    }

    let url = format!("{base}/updateReports?agent={}", args.agent);
    let (ended, end) = oneshot::channel();
    match client
        .connect_with(ConnectRequest::new(url), Some(ended))
        .await
    {
        Ok(_) => {
            let _ = tokio::time::timeout(Duration::from_secs(60), end).await;
        }
        Err(error) => {
            eprintln!("autobahn_client: could not ask for the reports: {error}");
            return ExitCode::FAILURE;
        }
    }
    client.shutdown().await;
    if failed > 0 {
        eprintln!("autobahn_client: {failed} cases timed out");
        return ExitCode::FAILURE;
    }
    eprintln!("autobahn_client: ran {count} cases");
    ExitCode::SUCCESS
}

/// Runs one case: true unless it did not end in time.
async fn run_case(client: &Client<Echo>, case: u32, url: String, wait: Duration) -> bool {
    let (ended, end) = oneshot::channel();
    match client
        .connect_with(ConnectRequest::new(url), Some(ended))
        .await
    {
        Ok(_) => match tokio::time::timeout(wait, end).await {
            Ok(Ok((code, reason))) => {
                tracing::debug!(case, code = code.0, reason, "case over");
                true
            }
            Ok(Err(_)) => {
                tracing::warn!(case, "case ended without on_close");
                true
            }
            Err(_) => {
                eprintln!("autobahn_client: case {case} did not end in {wait:?}");
                false
            }
        },
        // A case may refuse the handshake on purpose; the report says.
        Err(error) => {
            tracing::info!(case, %error, "case not opened");
            true
        }
    }
}

/// How long the fuzzing server may take to say how many cases it has.
const COUNT_WAIT: Duration = Duration::from_secs(10);

/// What to run this against, for a URL that did not answer as the fuzzing
/// server does.
const NEEDS_FUZZER: &str = "autobahn_client runs Autobahn|Testsuite's cases and needs its \
fuzzing server at --url (`wstest -m fuzzingserver`; `autobahn/run.sh client` starts one), \
not an ordinary WebSocket server";

/// `/getCaseCount` answers with one text message, then closes.
async fn case_count(base: &str, config: Config) -> Result<u32, String> {
    let client = Client::new(config);
    let (mut socket, _) = client
        .connect(format!("{base}/getCaseCount"))
        .await
        .map_err(|e| e.to_string())?;
    let count = match socket.recv().await {
        Some(Ok(OwnedMessage::Text(text))) => text
            .trim()
            .parse()
            .map_err(|_| format!("not a count: {text:?}"))?,
        other => return Err(format!("unexpected answer: {other:?}")),
    };
    // Read on until the server closes.
    while let Some(Ok(_)) = socket.recv().await {}
    Ok(count)
}
