//! rapidws's pub/sub (`rapidws::pubsub::PubSub`) in the harness's fan-out
//! protocol: `/?topics=a,b` subscribes at open, and a text message
//! `<topic>\n<payload>` publishes `<payload>` to `<topic>`. On tokio
//! (connection groups) or io_uring (`--backend uring`), with defaults;
//! `--history N` keeps each topic's last N publications.

use clap::{Parser, ValueEnum};
use std::time::Duration;

use rapidws::pubsub::{History, PubSub};
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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Tokio,
    Uring,
}

struct Fanout {
    pubsub: PubSub,
}

impl Handler for Fanout {
    /// The topics from the query, subscribed when the connection opens.
    type State = Vec<String>;

    fn on_open(&self, conn: &Conn, topics: &mut Vec<String>) {
        for topic in topics.drain(..) {
            let _ = self.pubsub.subscribe(conn, &topic);
        }
        topics.shrink_to_fit();
    }

    fn on_message(&self, _: &Conn, _: &mut Vec<String>, message: Message<'_>) {
        if let Message::Text(text) = message
            && let Some((topic, payload)) = text.split_once('\n')
        {
            self.pubsub.publish(topic, Message::Text(payload));
        }
    }
}

impl ServerHandler for Fanout {
    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Vec<String>, Reject> {
        let topics = request
            .query()
            .and_then(|q| q.strip_prefix("topics="))
            .unwrap_or("");
        Ok(topics
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect())
    }
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let history = History::new(args.history, Duration::from_secs(300));
    let handler = Fanout {
        pubsub: PubSub::builder().history(history).build(),
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
