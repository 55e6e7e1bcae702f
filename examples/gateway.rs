//! A WebSocket gateway: both roles in one process. Every client that
//! connects gets an upstream connection of its own; messages go both ways
//! with their opcodes, close codes are passed on, and memory stays bounded.
//!
//! ```text
//! cargo run --release --example gateway -- --addr 127.0.0.1:9003 --upstream ws://127.0.0.1:9001/
//! ```
//!
//! `--deflate` and `--deflate-min-size` set permessage-deflate on the side
//! facing clients (as the echo example's), `--upstream-deflate` offers it
//! upstream. The request's path and query are appended to the upstream URL's
//! path.
//!
//! How it stays bounded: a message is forwarded with a plain send into the
//! other side's bounded queue. When that queue holds half its limit, the
//! side the message came from stops reading (`Conn::pause_reading`) until
//! the queue has drained (`Conn::ready`), so a slow reader on one side slows
//! the writer on the other through TCP, and no queue grows without bound.
//! Until its upstream connection is open, a client's connection does not
//! read at all.
//!
//! Close codes go across as they are (1005, "no code", as 1000; 1006, "gone
//! without a close", as 1001). An upstream that cannot be reached closes the
//! client with 1014 (bad gateway). A close from one side is passed to the
//! other at once, and what the other side still sends is relayed until its
//! own close frame arrives: only then does the first side get the answer
//! to its close (`Handler::has_unhandled_messages`), so a client that sends
//! and closes at once still gets its replies. Each side's close timeout
//! bounds the wait.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clap::Parser;
use rapidws::client::{Client, ConnectRequest as UpstreamRequest};
use rapidws::{
    Accept, CloseCode, Config, Conn, DeflateConfig, Handler, HttpResponse, Message, Reject,
    Request, ServerHandler,
};
use tokio::runtime::Handle;

mod support;

#[derive(Parser, Debug)]
#[command(about = "rapidws gateway: clients in, one upstream connection each")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// The upstream server's URL (ws:// or wss://).
    #[arg(long, value_name = "URL", value_parser = upstream_url)]
    upstream: String,
    /// Offer permessage-deflate upstream, with the library's defaults.
    #[arg(long)]
    upstream_deflate: bool,
    /// For a wss upstream: trust the certificates in this PEM file (a
    /// private CA, or the upstream's own self-signed certificate) instead of
    /// the web PKI roots.
    #[arg(long, value_name = "PEM")]
    upstream_cafile: Option<std::path::PathBuf>,
}

/// `--upstream`, checked at start: a WebSocket URL the client can dial
/// (rather than every client closed with 1014 and only the log saying why).
fn upstream_url(value: &str) -> Result<String, String> {
    let url = rapidws::client::url::Url::parse(value).map_err(|error| error.to_string())?;
    match url.scheme.as_str() {
        "ws" | "wss" => Ok(value.trim().to_owned()),
        scheme => Err(format!(
            "{scheme}:// is not a WebSocket URL: give the upstream as ws:// or wss:// \
             (e.g. --upstream ws://127.0.0.1:9001/)"
        )),
    }
}

/// One client and its upstream connection.
struct Pair {
    client: Conn,
    upstream: OnceLock<Conn>,
    /// The client's connection ended with this code and reason, before its
    /// upstream connection was open.
    ending: Mutex<Option<(CloseCode, String)>>,
}

impl Pair {
    /// Closes the upstream connection with the client's code, once. Before
    /// the upstream connection is open this does nothing: the task that
    /// opens it sees the ending and calls this again.
    fn close_upstream(&self) {
        let Some(upstream) = self.upstream.get() else {
            return;
        };
        let Some((code, reason)) = self.ending.lock().unwrap().take() else {
            return;
        };
        let _ = upstream.close(passed_on(code), reason_for_close(&reason));
    }
}

/// The code one side's close is passed to the other with.
fn passed_on(code: CloseCode) -> CloseCode {
    match code {
        CloseCode::NO_STATUS => CloseCode::NORMAL,
        code if code.is_sendable() => code,
        _ => CloseCode::GOING_AWAY,
    }
}

/// Sends `message` from `from` to `to`, true if it was queued; once `to`'s
/// queue holds half its limit, `from` stops reading until it has drained.
/// A side that drains nothing for `STALL_LIMIT` is closed with 1008: its
/// peer is not reading, and the pause would otherwise hold both
/// connections for good.
fn forward(message: Message<'_>, from: &Conn, to: &Conn, runtime: &Handle) -> bool {
    if let Err(error) = to.send(message) {
        tracing::debug!(from = from.id(), to = to.id(), %error, "not forwarded");
        return false;
    }
    if to.queued_bytes() >= MAX_OUTBOUND / 2 {
        from.pause_reading();
        let (from, to) = (from.clone(), to.clone());
        runtime.spawn(async move {
            // Resolves when the queue has room again, or fails once `to`
            // closes: either way `from` may read on.
            if tokio::time::timeout(STALL_LIMIT, to.ready()).await.is_err() {
                let _ = to.close(CloseCode::POLICY_VIOLATION, "not reading");
            }
            from.resume_reading();
        });
    }
    true
}

/// Each connection's outbound bound (the library's default, set on both
/// sides so that half of it is where reading pauses).
const MAX_OUTBOUND: usize = 4 << 20;

/// How long a side may drain nothing while the other waits for it.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A close reason as it may be sent (at most 123 bytes, cut at a character).
fn reason_for_close(reason: &str) -> &str {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// The side facing clients.
struct Clients {
    upstream: Client<Upstream>,
    url: String,
    runtime: Handle,
}

/// A client's connection: the upstream URL until it opens, then its pair.
enum Side {
    Opening(String),
    Open(Arc<Pair>),
    Closed,
}

impl Side {
    fn pair(&self) -> Option<&Arc<Pair>> {
        match self {
            Side::Open(pair) => Some(pair),
            _ => None,
        }
    }
}

impl Handler for Clients {
    type State = Side;

    fn on_open(&self, conn: &Conn, side: &mut Side) {
        let Side::Opening(url) = std::mem::replace(side, Side::Closed) else {
            return;
        };
        // Nothing is read from the client until its upstream is open.
        conn.pause_reading();
        let pair = Arc::new(Pair {
            client: conn.clone(),
            upstream: OnceLock::new(),
            ending: Mutex::new(None),
        });
        *side = Side::Open(pair.clone());
        let upstream = self.upstream.clone();
        self.runtime.spawn(async move {
            let request = UpstreamRequest::new(url.as_str());
            match upstream.connect_with(request, pair.clone()).await {
                Ok((conn, _)) => {
                    let _ = pair.upstream.set(conn);
                    pair.client.resume_reading();
                    if pair.ending.lock().unwrap().is_some() {
                        // The client left while we connected.
                        pair.close_upstream();
                    }
                }
                Err(error) => {
                    tracing::warn!(%url, %error, "upstream unavailable");
                    let _ = pair
                        .client
                        .close(CloseCode::BAD_GATEWAY, "upstream unavailable");
                }
            }
        });
    }

    fn on_message(&self, conn: &Conn, side: &mut Side, message: Message<'_>) {
        let Some(pair) = side.pair() else { return };
        if let Some(upstream) = pair.upstream.get() {
            forward(message, conn, upstream, &self.runtime);
        }
    }

    /// While the upstream connection is open, replies to what the client
    /// sent may still come: the client's close is answered once the
    /// upstream's own close frame is in (`Upstream::on_close`).
    fn has_unhandled_messages(&self, side: &Side) -> bool {
        side.pair()
            .is_some_and(|pair| pair.upstream.get().is_some_and(Conn::is_open))
    }

    fn on_close(&self, _: &Conn, side: &mut Side, code: CloseCode, reason: &str) {
        let Side::Open(pair) = std::mem::replace(side, Side::Closed) else {
            return;
        };
        *pair.ending.lock().unwrap() = Some((code, reason.to_owned()));
        pair.close_upstream();
    }
}

impl ServerHandler for Clients {
    /// `GET /metrics` with `--metrics`.
    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        support::metrics_page(request.method(), request.path())
    }

    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Side, Reject> {
        // The client's path and query, after the upstream URL's path.
        let path = request.path().trim_start_matches('/');
        let base = self.url.trim_end_matches('/');
        Ok(Side::Opening(match request.query() {
            Some(query) => format!("{base}/{path}?{query}"),
            None => format!("{base}/{path}"),
        }))
    }
}

/// The upstream side: each connection's state is its pair.
struct Upstream {
    runtime: Handle,
}

impl Handler for Upstream {
    type State = Arc<Pair>;

    fn on_message(&self, conn: &Conn, pair: &mut Arc<Pair>, message: Message<'_>) {
        forward(message, conn, &pair.client, &self.runtime);
    }

    /// The mirror of `Clients::has_unhandled_messages`: the upstream's close
    /// is answered once the client's close frame is in.
    fn has_unhandled_messages(&self, pair: &Arc<Pair>) -> bool {
        pair.client.is_open()
    }

    /// Passes the upstream's close to the client; if the client closed
    /// first, this answers its close, after everything relayed.
    fn on_close(&self, _: &Conn, pair: &mut Arc<Pair>, code: CloseCode, reason: &str) {
        let _ = pair.client.close(passed_on(code), reason_for_close(reason));
    }
}

fn main() -> std::process::ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9003");
    let mut upstream_config = Config::default().max_outbound_bytes(MAX_OUTBOUND);
    if args.upstream_deflate {
        upstream_config = upstream_config.permessage_deflate(DeflateConfig::default());
    }
    // wss upstreams: ring as rustls's provider, the web PKI roots or
    // --upstream-cafile's certificates.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let upstream_tls =
        match support::client_tls(args.upstream_cafile.as_deref(), "--upstream-cafile") {
            Ok(tls) => tls,
            Err(error) => {
                eprintln!("error: {error}");
                return std::process::ExitCode::from(2);
            }
        };
    let url = args.upstream.clone();
    support::serve("gateway", &args.serve, move |runtime| {
        let upstream = Client::with_handler(
            Upstream {
                runtime: runtime.clone(),
            },
            upstream_config,
        )
        .tls(upstream_tls);
        Clients {
            upstream,
            url,
            runtime,
        }
    })
}
