//! A notification bus on one port: browsers subscribe to topics over
//! WebSockets, anyone publishes over HTTP, and each message is framed once
//! for all its subscribers (`rapidws::pubsub`).
//!
//! ```text
//! cargo run --release --example notify_bus -- --addr 127.0.0.1:9004 [--backend tokio|uring] [--deflate] [--redis redis://127.0.0.1:6379]
//! ```
//!
//! - `GET /ws?topics=a,b` upgrades and subscribes to the listed topics
//!   (percent-encoded, comma-separated; none is fine). Text messages
//!   `subscribe:<topic>` and `unsubscribe:<topic>` change them later; a
//!   command that cannot be done is answered with a text message
//!   `error: <why>`, and nothing else is ever sent but the publications.
//! - `POST /publish/<topic>` with a body publishes it (a text message if it
//!   is UTF-8, else binary) and answers `200` with `{"delivered": N}`, N the
//!   subscribers on this node it was handed to.
//! - `GET /` is a live demo page; `GET /stats` the bus's counters as JSON.
//! - Bad input gets a 4xx with a one-line reason and disturbs nothing else:
//!   an empty or over-long topic name (400), a body over the message size
//!   limit (413, `--max-message-size`), a body without a `Content-Length`
//!   (411), another method on `/publish/` (405), any other path (404).
//!
//! With `--redis`, nodes started with the same Redis share their topics: a
//! publish on one reaches the subscribers of all (Redis pub/sub: at most
//! once; a node that cannot reach Redis goes on serving its own
//! subscribers and counts the relays it lost, in `/stats`).
//!
//! A subscriber that reads too slowly misses messages (they are dropped for
//! it and counted in `/stats`) unless `--close-slow` asks to close it with
//! 1008 instead.

use clap::Parser;
use rapidws::pubsub::redis::Bridge;
use rapidws::pubsub::{Overflow, PubSub, check_topic};
use rapidws::{
    Accept, CloseCode, Conn, Handler, HttpResponse, Message, MessageKind, Reject, Request,
    ServerHandler,
};

mod support;

#[derive(Parser, Debug)]
#[command(about = "A notification bus: topics over WebSockets, publishing over HTTP, one port")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// The largest message, and so the largest body `POST /publish/` takes.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES", value_parser = message_size)]
    max_message_size: usize,
    /// Close a subscriber whose queue is full (1008) instead of dropping
    /// messages for it.
    #[arg(long)]
    close_slow: bool,
    /// Share topics with other nodes through this Redis server.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
}

/// `--max-message-size`: a bus that takes no message is no bus.
fn message_size(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1 byte (the default is 1048576, 1 MiB)".into()),
        Ok(bytes) => Ok(bytes),
        Err(error) => Err(format!("{error}: a size in bytes, at least 1")),
    }
}

/// Topics one connection may hold: enough for any page, and a bound on
/// what one client can make the registry keep.
const MAX_TOPICS_PER_CONNECTION: usize = 256;

const PAGE: &str = include_str!("assets/notify_bus.html");

struct Bus {
    pubsub: PubSub,
    /// Kept for as long as the bus runs: dropping it stops the relaying.
    bridge: Option<Bridge>,
}

impl Handler for Bus {
    /// The topics from the upgrade's query, subscribed when it opens.
    type State = Vec<String>;

    fn on_open(&self, conn: &Conn, topics: &mut Vec<String>) {
        for topic in topics.drain(..) {
            // Checked at the upgrade; only a closing connection is refused.
            let _ = self.pubsub.subscribe(conn, &topic);
        }
        topics.shrink_to_fit();
    }

    fn on_message(&self, conn: &Conn, _: &mut Vec<String>, message: Message<'_>) {
        let Message::Text(text) = message else {
            let _ = conn
                .send_text("error: commands are text: subscribe:<topic> or unsubscribe:<topic>");
            return;
        };
        let outcome = match text.split_once(':') {
            Some(("subscribe", topic)) => self.subscribe(conn, topic),
            Some(("unsubscribe", topic)) => {
                if self.pubsub.unsubscribe(conn, topic) {
                    Ok(())
                } else {
                    Err(format!("not subscribed to {}", shorten(topic)))
                }
            }
            _ => Err("unknown command: use subscribe:<topic> or unsubscribe:<topic>".into()),
        };
        if let Err(why) = outcome {
            let _ = conn.send_text(&format!("error: {why}"));
        }
    }
}

impl ServerHandler for Bus {
    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Vec<String>, Reject> {
        if request.path() != "/ws" {
            return Err(Reject::new(
                404,
                "not found: WebSockets are at /ws?topics=a,b",
            ));
        }
        let listed = query_value(request.query().unwrap_or(""), "topics").unwrap_or("");
        let mut topics = Vec::new();
        for raw in listed.split(',').filter(|t| !t.is_empty()) {
            let topic = percent_decode(raw)
                .ok_or_else(|| Reject::new(400, "a topic is not valid percent-encoded UTF-8"))?;
            check_topic(&topic).map_err(|why| Reject::new(400, why.to_string()))?;
            if !topics.contains(&topic) {
                topics.push(topic);
            }
        }
        if topics.len() > MAX_TOPICS_PER_CONNECTION {
            return Err(Reject::new(400, "more than 256 topics"));
        }
        Ok(topics)
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        let path = request.path();
        Some(match (request.method(), path) {
            ("GET" | "HEAD", "/") => HttpResponse::html(PAGE),
            ("GET" | "HEAD", "/stats") => self.stats(),
            ("POST", _) if path.starts_with("/publish/") => self.publish(request),
            (_, _) if path.starts_with("/publish/") => {
                HttpResponse::text(405, "use POST to publish\n")
            }
            (_, "/ws") => return None, // the usual refusal of a bad upgrade
            _ => HttpResponse::text(
                404,
                "not found: try /, /ws?topics=a,b or POST /publish/<topic>\n",
            ),
        })
    }
}

impl Bus {
    fn subscribe(&self, conn: &Conn, topic: &str) -> Result<(), String> {
        check_topic(topic).map_err(|why| why.to_string())?;
        if self.pubsub.topics(conn).len() >= MAX_TOPICS_PER_CONNECTION {
            return Err("more than 256 topics".into());
        }
        match self.pubsub.subscribe(conn, topic) {
            Ok(_) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    }

    fn publish(&self, request: &Request<'_>) -> HttpResponse {
        let raw = &request.path()["/publish/".len()..];
        let Some(topic) = percent_decode(raw) else {
            return HttpResponse::text(400, "the topic is not valid percent-encoded UTF-8\n");
        };
        if let Err(why) = check_topic(&topic) {
            return HttpResponse::text(400, format!("{why}\n"));
        }
        let body = request.body();
        let kind = if std::str::from_utf8(body).is_ok() {
            MessageKind::Text
        } else {
            MessageKind::Binary
        };
        match self.pubsub.publish_bytes(&topic, kind, body) {
            Ok(delivered) => HttpResponse::new(
                200,
                "application/json",
                format!("{{\"delivered\": {delivered}}}\n"),
            ),
            // Text was checked above: unreachable, but answered.
            Err(error) => HttpResponse::text(400, format!("{error}\n")),
        }
    }

    fn stats(&self) -> HttpResponse {
        let stats = self.pubsub.stats();
        let bridge = match &self.bridge {
            None => String::new(),
            Some(bridge) => {
                let b = bridge.stats();
                format!(
                    ", \"bridge\": {{\"connected\": {}, \"relayed\": {}, \"received\": {}, \"lost\": {}, \"reconnects\": {}}}",
                    b.connected, b.relayed, b.received, b.lost, b.reconnects
                )
            }
        };
        let json = format!(
            "{{\"topics\": {}, \"published\": {}, \"delivered\": {}, \"dropped\": {}, \"closed\": {}{bridge}}}\n",
            self.pubsub.topic_count(),
            stats.published,
            stats.delivered,
            stats.dropped,
            stats.closed
        );
        HttpResponse::new(200, "application/json", json)
    }
}

/// A topic for an error message: long ones cut.
fn shorten(topic: &str) -> String {
    match topic.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &topic[..at]),
        None => topic.to_owned(),
    }
}

/// The value of `name` in a query string (`a=1&topics=x,y`), undecoded.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// `%XX` escapes decoded (`+` is kept as it is); `None` for a broken escape
/// or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn main() -> std::process::ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9004");
    let config = args
        .serve
        .config()
        .max_message_size(args.max_message_size)
        .max_frame_size(args.max_message_size)
        .max_http_body_size(args.max_message_size);
    let overflow = if args.close_slow {
        Overflow::Close(CloseCode::POLICY_VIOLATION)
    } else {
        Overflow::Drop
    };
    let pubsub = PubSub::with_overflow(overflow);
    let redis = args.redis.clone();
    support::serve_with("notify_bus", &args.serve, config, move |runtime| {
        // The bridge's task runs on the example's tokio runtime (on the
        // io_uring backend, the one beside the reactors).
        let bridge = redis.map(|url| {
            let _entered = runtime.enter();
            Bridge::start(&pubsub, &url).unwrap_or_else(|error| {
                eprintln!("error: --redis {url}: {error}");
                std::process::exit(2);
            })
        });
        Bus { pubsub, bridge }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_escapes() {
        assert_eq!(query_value("topics=a,b", "topics"), Some("a,b"));
        assert_eq!(query_value("x=1&topics=&y", "topics"), Some(""));
        assert_eq!(query_value("x=1", "topics"), None);
        assert_eq!(percent_decode("a%2Cb%20c+d").as_deref(), Some("a,b c+d"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }
}
