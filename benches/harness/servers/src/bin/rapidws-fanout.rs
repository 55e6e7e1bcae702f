//! rapidws's pub/sub (`rapidws::pubsub::PubSub`) in the harness's fan-out
//! protocol: `/?topics=a,b` subscribes at open, and a text message
//! `<topic>\n<payload>` publishes `<payload>` to `<topic>`. On tokio
//! (connection groups) or io_uring (`--backend uring`), with defaults;
//! `--history N` keeps each topic's last N publications; `--metrics`
//! records rapidws's metrics (into a Prometheus recorder nobody reads).
//!
//! For the reconnect storm: `&positions=1` shows each delivery as
//! `<epoch>:<offset>\n<payload>` and a resume's outcome as
//! `recovered:true|false`; `&since=<topic>:<epoch>:<offset>` resumes after
//! that position (and subscribes).

use clap::{Parser, ValueEnum};
use std::time::Duration;

use std::sync::Arc;

use rapidws::OwnedMessage;
use rapidws::pubsub::{Envelope, History, Position, PubSub, Publication, Start, Subscribe};
use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request, ServerHandler};

#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    addr: std::net::SocketAddr,
    #[arg(long, value_enum, default_value_t = Backend::Tokio)]
    backend: Backend,
    /// Publications each topic keeps (for 300 s); 0, the default: none.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Install a Prometheus recorder, so that rapidws's metrics are
    /// recorded (what they cost; nothing serves them).
    #[arg(long)]
    metrics: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Tokio,
    Uring,
}

struct Fanout {
    pubsub: PubSub,
    positions: Arc<dyn Envelope>,
}

/// `<epoch>:<offset>\n<payload>`, and `recovered:<bool>`.
struct Positions;

impl Envelope for Positions {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let payload = String::from_utf8_lossy(publication.payload());
        OwnedMessage::Text(format!("{}\n{payload}", publication.position()))
    }

    fn recovery(&self, _: &str, recovered: bool) -> Option<OwnedMessage> {
        Some(OwnedMessage::Text(format!("recovered:{recovered}")))
    }
}

/// What a connection asked for: its topics, where each starts, and
/// whether it wants positions.
#[derive(Default)]
struct Opening {
    topics: Vec<(String, Start)>,
    positions: bool,
}

impl Handler for Fanout {
    type State = Opening;

    fn on_open(&self, conn: &Conn, opening: &mut Opening) {
        for (topic, start) in opening.topics.drain(..) {
            let mut how = Subscribe::new().start(start);
            if opening.positions {
                how = how.envelope(self.positions.clone());
            }
            let _ = self.pubsub.subscribe_with(conn, &topic, &how);
        }
        opening.topics.shrink_to_fit();
    }

    fn on_message(&self, _: &Conn, _: &mut Opening, message: Message<'_>) {
        if let Message::Text(text) = message
            && let Some((topic, payload)) = text.split_once('\n')
        {
            self.pubsub.publish(topic, Message::Text(payload));
        }
    }
}

impl ServerHandler for Fanout {
    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Opening, Reject> {
        let mut opening = Opening::default();
        for pair in request.query().unwrap_or("").split('&') {
            match pair.split_once('=') {
                Some(("topics", topics)) => opening.topics.extend(
                    topics
                        .split(',')
                        .filter(|t| !t.is_empty())
                        .map(|t| (t.to_owned(), Start::Now)),
                ),
                Some(("positions", "1")) => opening.positions = true,
                Some(("since", since)) => {
                    let (topic, position) = since
                        .split_once(':')
                        .and_then(|(t, p)| Some((t, p.parse::<Position>().ok()?)))
                        .ok_or_else(|| Reject::new(400, "since=<topic>:<epoch>:<offset>"))?;
                    opening
                        .topics
                        .push((topic.to_owned(), Start::After(position)));
                }
                _ => {}
            }
        }
        Ok(opening)
    }
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    if args.metrics {
        // Before the PubSub and the server: they take their handles when made.
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(std::io::Error::other)?;
    }
    let history = History::new(args.history, Duration::from_secs(300));
    let handler = Fanout {
        pubsub: PubSub::builder().history(history).build(),
        positions: Arc::new(Positions),
    };
    match args.backend {
        Backend::Tokio => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(async {
                rapidws::tokio::Server::bind(args.addr, handler, Config::default())
                    .await?
                    .serve()
                    .await
            })
        }
        Backend::Uring => {
            rapidws::uring::Server::bind(args.addr, handler, Config::default())?.serve()
        }
    }
}
