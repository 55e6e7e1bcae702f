//! A notification bus on one port: browsers subscribe to topics over
//! WebSockets, anyone publishes over HTTP, and each message is framed once
//! for all its subscribers (`rapidws::pubsub`).
//!
//! ```text
//! cargo run --release --example notify_bus -- --addr 127.0.0.1:9004 [--backend tokio|uring] [--deflate] [--redis redis://127.0.0.1:6379] [--history 1000] [--history-secs 300] [--overflow drop|close|conflate]
//! cargo run --release --example notify_bus -- --redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001 [...]
//! NOTIFY_BUS_PUBLISH_TOKEN=$(openssl rand -hex 16) NOTIFY_BUS_JWT_SECRET=$(openssl rand -hex 16) \
//!     cargo run --release --example notify_bus -- [--metrics] [--spread-secs 30]
//! cargo run --release --example notify_bus -- --history 10000 --handoff-socket /tmp/bus.sock
//! cargo run --release --example notify_bus -- --history 10000 --take-over /tmp/bus.sock --handoff-socket /tmp/bus.sock
//! ```
//!
//! - `GET /ws?topics=a,b` upgrades and subscribes to the listed topics
//!   (percent-encoded, comma-separated; none is fine, an empty name in the
//!   list is a 400). Each delivery is the published payload itself. Text
//!   messages `subscribe:<topic>` and `unsubscribe:<topic>` change the
//!   topics later; a command that cannot be done is answered with a text
//!   message `error: <why>`.
//! - `GET /ws?topics=a,b&positions=1`: each delivery is one text message,
//!   a JSON object `{"topic":"a","epoch":"<hex>","offset":<n>,"data":"<text>"}`
//!   (`"data_b64"` instead of `"data"` for a binary payload). Commands are
//!   answered with `{"subscribed":"a"}` or `{"unsubscribed":"a"}`, and
//!   refused with `{"error":"<why>"}`.
//! - Resume: `GET /ws?positions=1&since=a:<epoch>:<offset>&since=b:...`
//!   subscribes to each topic named (and to `topics=`) and sends what was
//!   published after that position, from history, then live ones, exactly
//!   once and in order. When a resumed topic's replay is done the client
//!   gets `{"topic":"a","recovered":true}`; `false` if history no longer
//!   held all it missed (or the epoch is not the topic's), then live
//!   messages. A subscriber that misses a delivery because it reads too
//!   slowly gets `{"topic":"a","recovered":false}` where the gap is.
//! - Last value ("cache" mode): `GET /ws?latest=a,b` subscribes to each
//!   and sends its latest kept publication first (with `--history` of at
//!   least 1; with Redis, the latest Redis keeps).
//! - `POST /publish/<topic>[?key=K]` with a body publishes it (a text
//!   message if it is UTF-8, else binary; `K` is what `--overflow
//!   conflate` replaces by) and answers `200` with
//!   `{"delivered":N,"epoch":"<hex>","offset":O}`: N the subscribers on this
//!   node it was addressed to (each is then counted once in `/stats`, as
//!   `delivered`, `dropped`, `closed` or `gone`), and the publication's
//!   position (`"epoch":""` and offset 0 when the topic has neither
//!   subscribers nor history here: nothing numbers it).
//! - `POST /publish` with an NDJSON body, one publication per line
//!   (`{"topic":"a","data":"<text>"}`, `"data_b64"` for binary, and an
//!   optional `"key"`), answers one line per publication, in order: the
//!   same object as above, or `{"error":"<why>"}` for a bad line. At most
//!   10,000 lines a request (413 past that), and at most 100 bad ones: a
//!   body with more is refused whole with 400, the first bad line and
//!   their count, and nothing is published (an answer is never much larger
//!   than what was asked). HTTP/1.1 connections stay open for the next
//!   request (up to 1,000, each within the handshake timeout), so a
//!   publisher need not connect per publish.
//! - `GET /topics/<topic>` answers `{"subscribers":N,"epoch":"<hex>","offset":O}`
//!   (this node's; with `--redis` or `--redis-cluster`, N counts every
//!   node's subscribers, each node's count at most 5 s old, and the
//!   position is Redis's).
//! - `GET /` is a live demo page; `GET /stats` the bus's counters as JSON,
//!   with what its byte budgets hold (`"usage"`: topics kept, with
//!   subscribers or history only, and their bytes; history's publications
//!   and bytes; conflation waits' bytes; topics refused and publications
//!   let go for the budgets). With `--publish-token` or `--jwt-secret`,
//!   `/stats`, `/topics/<t>` and `/metrics` need the publish token too
//!   (`Authorization: Bearer`), unless `--open-stats`.
//! - Bad input gets a 4xx with a one-line reason and disturbs nothing else:
//!   an empty or over-long topic name (400), a bad `since` (400), a body
//!   over the message size limit (413, `--max-message-size`), a body
//!   without a `Content-Length` (411), another method on `/publish/` (405),
//!   any other path (404).
//!
//! `--history N` keeps each topic's last N publications (for at most
//! `--history-secs`) to replay to resuming subscribers; the default, 0,
//! keeps none, and a resume then recovers only a subscriber that missed
//! nothing.
//!
//! Byte budgets for everything clients and publishers can make the bus
//! keep, across all topics and connections (`rapidws::pubsub::Limits`):
//! `--max-history-bytes` (1 GiB: past it the oldest kept publications of
//! any topic go first, and a subscriber resuming from before them is told
//! `recovered: false`), `--max-topic-bytes` (512 MiB: past it a new topic
//! is refused, `error: too many topics...`) and `--max-waiting-bytes`
//! (256 MiB of `--overflow conflate` waits: past it a subscriber misses
//! the publication and is told of the gap). Expired history is let go on
//! time, within a second of its age, publishes or not.
//!
//! With `--redis`, nodes started with the same Redis share their topics: a
//! publish on one reaches the subscribers of all (Redis pub/sub: at most
//! once; a node that cannot reach Redis goes on serving its own
//! subscribers and counts the relays it lost, in `/stats`). With
//! `--history` too, history lives in Redis (a stream per topic): positions
//! are Redis's, the same on every node, so a subscriber resumes on any
//! node, also after its own died; a publish is answered once Redis has
//! numbered it and this node delivered it. A node that cannot reach Redis
//! still delivers its own publishes, in an epoch of its own, and a
//! subscriber that resumes over what Redis missed is told it was not
//! recovered. What comes from Redis gets the node's own limits; with
//! `--redis-secret S` (the same on every node) only messages signed with S
//! are delivered, each once and while fresh, so a party that can write to
//! Redis cannot inject, misattribute or replay one, live or from a
//! stream; it can still withhold or renumber, which subscribers are told
//! of (see `rapidws::pubsub::redis`, "Redis is not trusted", for exactly
//! what is and is not caught; the nodes' clocks must agree within 10 s).
//!
//! A deploy that keeps every connection (Linux, either backend):
//! started with `--handoff-socket PATH`, the bus hands everything to a new
//! process started with the same arguments and `--take-over PATH`, and
//! exits 0: publishing stops there, the topics (numbering and history)
//! go first, then every connection (a publisher's keep-alive connection
//! with it) and each subscriber with its topics, format, token and the
//! position it had been sent up to. The new process replays from
//! history what was published while a subscriber was on its way, so it
//! gets every publication exactly once, in order, and never sees a close;
//! with history too short for that, a `positions=1` subscriber is told
//! `{"topic":"a","recovered":false}` where the gap is.
//!
//! A subscriber that reads too slowly misses messages (they are dropped for
//! it and counted in `/stats`) unless `--overflow close` (or `--close-slow`)
//! asks to close it with 1008 instead, or `--overflow conflate` keeps the
//! latest publication per key waiting for it (`conflated` in `/stats`).
//!
//! Who may come in (see `auth.rs`): with `--publish-token T`, publishing
//! needs `Authorization: Bearer T` (401 with a `WWW-Authenticate: Bearer`
//! challenge otherwise); with `--jwt-secret S`, subscribing needs a JWT
//! signed with S (HS256) whose `topics` claim names the topics (`"news"`,
//! `"news.*"`, `"*"`) and whose `exp` says until when: in the upgrade's
//! `token` query parameter (a bad one: 401 with why; a topic it does not
//! name: 403) or as a text message `token:<jwt>` (first, or later to
//! refresh it; a bad one closes with 1008 and why). Joining a topic the
//! token does not name is answered `error: not allowed`; when the token
//! expires, the connection is closed with 1008, `token expired`.
//!
//! Each secret (`--publish-token`, `--jwt-secret`, `--redis-secret`) must
//! be at least 16 characters (`openssl rand -hex 16`), and may come from
//! the environment instead (`NOTIFY_BUS_PUBLISH_TOKEN`,
//! `NOTIFY_BUS_JWT_SECRET`, `NOTIFY_BUS_REDIS_SECRET`), where `ps` does not
//! show it; see `secrets.rs`.
//!
//! `--metrics` serves `GET /metrics` (Prometheus text); SIGTERM closes the
//! connections with 1012 spread over `--spread-secs` and exits 0.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use clap::Parser;
use rapidws::pubsub::redis::{Bridge, Receipt};
use rapidws::pubsub::{
    Envelope, History, Limits, Overflow, Position, PubSub, PubSubError, Publication,
    PublishOptions, Start, Subscribe, check_topic,
};
use rapidws::{
    Accept, CloseCode, Conn, Handler, HttpResponse, Message, MessageKind, OwnedMessage, Reject,
    Request, ServerHandler,
};
use serde_json::json;

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod secrets;

#[derive(Parser, Debug)]
#[command(about = "A notification bus: topics over WebSockets, publishing over HTTP, one port")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// The largest message, and so the largest body `POST /publish/` takes.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES", value_parser = message_size)]
    max_message_size: usize,
    /// What a subscriber whose queue is full gets: `drop` misses the
    /// message (and, with positions=1, is told of the gap), `close` is
    /// closed with 1008, `conflate` keeps the latest publication per key
    /// (`?key=`) waiting for it and drops keyless ones (told as a gap).
    #[arg(long, value_enum, default_value_t = OverflowArg::Drop)]
    overflow: OverflowArg,
    /// The same as `--overflow close`.
    #[arg(long, conflicts_with = "overflow")]
    close_slow: bool,
    /// Publications each topic keeps to replay to resuming subscribers (0:
    /// none).
    #[arg(long, default_value_t = 0, value_name = "N")]
    history: usize,
    /// The longest a kept publication is kept, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    history_secs: u64,
    /// Share topics with other nodes through this Redis server.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Share topics with other nodes through this Redis Cluster (any of its
    /// nodes, comma-separated): sharded pub/sub, history on each topic's
    /// shard.
    #[arg(
        long,
        value_name = "URL,URL",
        conflicts_with = "redis",
        value_delimiter = ','
    )]
    redis_cluster: Vec<String>,
    /// With --redis or --redis-cluster: a secret every node shares;
    /// messages are signed with it, and only signed ones from Redis are
    /// delivered (see `rapidws::pubsub::redis`). At least 16 characters.
    #[arg(
        long,
        value_name = "SECRET",
        env = "NOTIFY_BUS_REDIS_SECRET",
        hide_env_values = true
    )]
    redis_secret: Option<String>,
    /// `POST /publish...` needs `Authorization: Bearer <T>` (401 without);
    /// so do `/stats`, `/topics/<t>` and `/metrics`, unless `--open-stats`.
    /// At least 16 characters (`openssl rand -hex 16`).
    #[arg(
        long,
        value_name = "T",
        env = "NOTIFY_BUS_PUBLISH_TOKEN",
        hide_env_values = true
    )]
    publish_token: Option<String>,
    /// `/stats`, `/topics/<t>` and `/metrics` answer anyone, even with
    /// tokens on (they show topic names' counts, positions and traffic).
    #[arg(long)]
    open_stats: bool,
    /// What every topic's history may hold in all, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_history_bytes())]
    max_history_bytes: usize,
    /// What the topics themselves may hold in all (names and state), in
    /// bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_topic_bytes())]
    max_topic_bytes: usize,
    /// What may wait for conflating subscribers in all, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::new().max_waiting_bytes())]
    max_waiting_bytes: usize,
    /// Subscribers need a JWT signed with this secret (HS256), in the
    /// `token` query parameter or a first message `token:<jwt>`, naming the
    /// topics they may join (claim `topics`) and when it expires (`exp`).
    /// At least 16 characters.
    #[arg(
        long,
        value_name = "S",
        env = "NOTIFY_BUS_JWT_SECRET",
        hide_env_values = true
    )]
    jwt_secret: Option<String>,
}

impl Args {
    /// The secrets as given, for `secrets::check`.
    fn secrets(&self) -> [secrets::Secret<'_>; 3] {
        use secrets::Secret;
        [
            Secret {
                flag: "--redis-secret",
                env: "NOTIFY_BUS_REDIS_SECRET",
                value: self.redis_secret.as_deref(),
            },
            Secret {
                flag: "--publish-token",
                env: "NOTIFY_BUS_PUBLISH_TOKEN",
                value: self.publish_token.as_deref(),
            },
            Secret {
                flag: "--jwt-secret",
                env: "NOTIFY_BUS_JWT_SECRET",
                value: self.jwt_secret.as_deref(),
            },
        ]
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OverflowArg {
    Drop,
    Close,
    Conflate,
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

/// The longest `?key=` a publish takes.
const MAX_KEY_LEN: usize = 256;

/// The most publications one `POST /publish` takes.
const MAX_BATCH: usize = 10_000;

/// The most bad lines a batch may have and still be published (each is
/// answered with its error): more, and the whole body is refused.
const MAX_BAD_LINES: usize = 100;

const PAGE: &str = include_str!("../assets/notify_bus.html");
/// The JavaScript subscriber the page uses (`clients/js`).
const CLIENT: &str = include_str!("../../clients/js/rapidws-bus.mjs");

struct Bus {
    pubsub: PubSub,
    /// What `positions=1` subscribers get (one for all: each publication
    /// is wrapped once).
    json: Arc<dyn Envelope>,
    /// Kept for as long as the bus runs: dropping it stops the relaying.
    bridge: Option<Bridge>,
    /// `--publish-token`.
    publish_token: Option<auth::PublishToken>,
    /// `--jwt-secret`.
    tokens: Option<auth::Tokens>,
    /// `/stats`, `/topics/` and `/metrics` need the publish token (tokens
    /// are on, and not `--open-stats`).
    closed_stats: bool,
}

/// `positions=1`'s wire format (see the module docs).
struct Json;

impl Envelope for Json {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let position = publication.position();
        let mut object = json!({
            "topic": publication.topic(),
            "epoch": position.epoch.to_string(),
            "offset": position.offset,
        });
        match publication.kind() {
            MessageKind::Text => {
                let text = std::str::from_utf8(publication.payload()).unwrap_or_default();
                object["data"] = text.into();
            }
            MessageKind::Binary => {
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(publication.payload());
                object["data_b64"] = encoded.into();
            }
        }
        OwnedMessage::Text(object.to_string())
    }

    fn recovery(&self, topic: &str, recovered: bool) -> Option<OwnedMessage> {
        let object = json!({"topic": topic, "recovered": recovered});
        Some(OwnedMessage::Text(object.to_string()))
    }
}

/// A connection's choices: how it is answered, and (until it opens) what
/// to subscribe it to.
struct Client {
    positions: bool,
    opening: Vec<(String, Start)>,
    /// With `--jwt-secret`: what the connection's token allows, once it
    /// presented one.
    grant: Option<auth::Grant>,
}

impl Handler for Bus {
    type State = Client;

    fn on_open(&self, conn: &Conn, session: &mut Client) {
        if let (Some(tokens), Some(grant)) = (&self.tokens, &session.grant) {
            tokens.watch(conn, grant, None);
        }
        for (topic, start) in session.opening.drain(..) {
            let how = self.how(session.positions, start);
            // Checked at the upgrade; a closing connection needs no answer,
            // the bus's budget for topics being full does.
            match self.subscribe_how(conn, &topic, &how) {
                Ok(()) | Err(PubSubError::Closed) => {}
                Err(why) => {
                    let why = format!("not subscribed to {}: {why}", shorten(&topic));
                    let _ = conn.send_text(&refusal(session.positions, &why));
                }
            }
        }
        session.opening.shrink_to_fit();
    }

    fn on_message(&self, conn: &Conn, session: &mut Client, message: Message<'_>) {
        let positions = session.positions;
        let Message::Text(text) = message else {
            let why = "commands are text: subscribe:<topic> or unsubscribe:<topic>";
            let _ = conn.send_text(&refusal(positions, why));
            return;
        };
        let outcome = match text.split_once(':') {
            Some(("token", token)) => match self.authorize(conn, session, token) {
                Ok(()) => Ok(json!({ "authorized": true })),
                // Closed with 1008 and the reason.
                Err(()) => return,
            },
            Some(("subscribe", topic)) if !self.may_join(session, topic) => {
                Err("not allowed".into())
            }
            Some(("subscribe", topic)) => self
                .subscribe(conn, topic, positions)
                .map(|()| json!({ "subscribed": topic })),
            Some(("unsubscribe", topic)) => {
                if self.pubsub.unsubscribe(conn, topic) {
                    Ok(json!({ "unsubscribed": topic }))
                } else {
                    Err(format!("not subscribed to {}", shorten(topic)))
                }
            }
            _ => Err("unknown command: use subscribe:<topic> or unsubscribe:<topic>".into()),
        };
        match outcome {
            // Plain clients get no acknowledgement (as before positions).
            Ok(ack) if positions => {
                let _ = conn.send_text(&ack.to_string());
            }
            Ok(_) => {}
            Err(why) => {
                let _ = conn.send_text(&refusal(positions, &why));
            }
        }
    }

    fn on_close(&self, conn: &Conn, session: &mut Client, _: CloseCode, _: &str) {
        if let (Some(tokens), Some(grant)) = (&self.tokens, &session.grant) {
            tokens.forget(conn, grant);
        }
    }

    /// `--handoff-socket`: a subscriber moves with its topics, each with
    /// the position it has been sent up to (nothing is published here once
    /// the publishers moved, so that is the topic's latest), its format
    /// and its token's grant.
    fn hand_off(&self, conn: &Conn, session: &mut Client) -> Option<Vec<u8>> {
        let topics: Vec<_> = self
            .pubsub
            .topics(conn)
            .iter()
            .map(|topic| {
                let position = self.pubsub.sent_up_to(conn, topic).map(|p| p.to_string());
                json!([&**topic, position])
            })
            .collect();
        let grant = session.grant.as_ref().map(auth::Grant::to_json);
        // (Its token's expiry watch stays: this process ends soon, and
        // should the connection stay after all, it is still enforced.)
        let state = json!({ "positions": session.positions, "topics": topics, "grant": grant });
        Some(state.to_string().into_bytes())
    }

    /// `--take-over`: the subscriber's topics again, each resumed after
    /// the position it had been sent up to (what was published since, in
    /// this process, is replayed from history first: exactly once).
    fn take_over(&self, conn: &Conn, state: &[u8]) -> Option<Client> {
        let state: serde_json::Value = serde_json::from_slice(state).ok()?;
        let positions = state["positions"].as_bool()?;
        let grant = match &state["grant"] {
            serde_json::Value::Null => None,
            grant => Some(auth::Grant::from_json(grant)?),
        };
        // Everything is read before anything is done: a state that does not
        // read refuses the connection (closed with 1012) with nothing left
        // behind.
        let mut topics = Vec::new();
        for topic in state["topics"].as_array()? {
            let name = topic[0].as_str()?;
            let position = match &topic[1] {
                serde_json::Value::Null => None,
                position => Some(position.as_str()?.parse::<Position>().ok()?),
            };
            topics.push((name, position));
        }
        if let (Some(tokens), Some(grant)) = (&self.tokens, &grant) {
            tokens.watch(conn, grant, None);
        }
        for (name, position) in topics {
            let how = match position {
                Some(position) => self.how(positions, Start::Now).after_handoff(position),
                None => self.how(positions, Start::Now),
            };
            let _ = self.subscribe_how(conn, name, &how);
        }
        Some(Client {
            positions,
            opening: Vec::new(),
            grant,
        })
    }
}

/// A refused command, as the connection's format shows it.
fn refusal(positions: bool, why: &str) -> String {
    if positions {
        json!({ "error": why }).to_string()
    } else {
        format!("error: {why}")
    }
}

impl ServerHandler for Bus {
    /// `--handoff-socket`: the topics (numbering and history) go to the
    /// successor before the subscribers do.
    fn hand_off_server(&self) -> Vec<u8> {
        self.pubsub.hand_off()
    }

    fn take_over_server(&self, state: &[u8]) -> Result<(), String> {
        let topics = self.pubsub.take_over(state).map_err(|e| e.to_string())?;
        tracing::info!(topics, "took over the topics");
        Ok(())
    }

    /// A handoff failed after the successor took the topics: what it
    /// numbered meanwhile must not alias ours.
    fn take_back_server(&self) {
        self.pubsub.renumber();
    }

    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Client, Reject> {
        if request.path() != "/ws" {
            return Err(Reject::new(
                404,
                "not found: WebSockets are at /ws?topics=a,b",
            ));
        }
        let query = request.query().unwrap_or("");
        let positions = query_values(query, "positions").any(|v| v == "1");
        let grant = match (&self.tokens, query_values(query, "token").next()) {
            (None, _) | (Some(_), None) => None,
            (Some(tokens), Some(raw)) => {
                let token = percent_decode(raw)
                    .ok_or_else(|| Reject::new(400, "the token is not valid percent-encoded"))?;
                Some(tokens.check(&token).map_err(|why| Reject::new(401, why))?)
            }
        };
        let mut opening: Vec<(String, Start)> = Vec::new();
        let listed = query_values(query, "topics").next().unwrap_or("");
        for topic in topic_list("topics", listed).map_err(|why| Reject::new(400, why))? {
            if !opening.iter().any(|(t, _)| *t == topic) {
                opening.push((topic, Start::Now));
            }
        }
        // `latest=a,b`: each starts with its latest kept publication
        // ("cache" mode; needs --history).
        let latest = query_values(query, "latest").next().unwrap_or("");
        for topic in topic_list("latest", latest).map_err(|why| Reject::new(400, why))? {
            match opening.iter_mut().find(|(t, _)| *t == topic) {
                Some((_, start)) => *start = Start::Latest,
                None => opening.push((topic, Start::Latest)),
            }
        }
        for raw in query_values(query, "since") {
            let (topic, position) = parse_since(raw).map_err(|why| Reject::new(400, why))?;
            match opening.iter_mut().find(|(t, _)| *t == topic) {
                Some((_, start)) => *start = Start::After(position),
                None => opening.push((topic, Start::After(position))),
            }
        }
        if opening.len() > MAX_TOPICS_PER_CONNECTION {
            return Err(Reject::new(400, "more than 256 topics"));
        }
        if self.tokens.is_some() {
            match &grant {
                None if !opening.is_empty() => {
                    return Err(Reject::new(
                        401,
                        "subscribing needs a token: ?token=<jwt> (or a first message token:<jwt>)",
                    ));
                }
                Some(grant) => {
                    if let Some((topic, _)) = opening.iter().find(|(t, _)| !grant.allows(t)) {
                        return Err(Reject::new(
                            403,
                            format!("not allowed: the token does not name {}", shorten(topic)),
                        ));
                    }
                }
                None => {}
            }
        }
        Ok(Client {
            positions,
            opening,
            grant,
        })
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        let path = request.path();
        let telling = matches!(request.method(), "GET" | "HEAD")
            && (path == "/stats" || path == "/metrics" || path.starts_with("/topics/"));
        if telling && let Some(refused) = self.refuse_stats(request) {
            return Some(refused);
        }
        if let Some(page) = support::metrics_page(request.method(), path) {
            return Some(page);
        }
        Some(match (request.method(), path) {
            ("GET" | "HEAD", "/") => HttpResponse::html(PAGE),
            ("GET" | "HEAD", "/rapidws-bus.mjs") => {
                HttpResponse::new(200, "text/javascript", CLIENT)
            }
            ("GET" | "HEAD", "/stats") => self.stats(),
            ("GET" | "HEAD", _) if path.starts_with("/topics/") => self.topic(path),
            ("POST", _) if path == "/publish" || path.starts_with("/publish/") => {
                let token = self.publish_token.as_ref();
                if let Some(refused) = token.and_then(|t| t.refuse(request, "publishing")) {
                    return Some(refused);
                }
                if path == "/publish" {
                    self.publish_lines(request)
                } else {
                    self.publish(request)
                }
            }
            (_, _) if path == "/publish" || path.starts_with("/publish/") => {
                HttpResponse::text(405, "use POST to publish\n")
            }
            (_, "/ws") => return None, // the usual refusal of a bad upgrade
            _ => HttpResponse::text(
                404,
                "not found: try /, /ws?topics=a,b, POST /publish/<topic> or /topics/<topic>\n",
            ),
        })
    }
}

/// `since=<topic>:<epoch>:<offset>` (the topic percent-encoded; it may hold
/// colons itself).
fn parse_since(raw: &str) -> Result<(String, Position), String> {
    let shape = "since is <topic>:<epoch>:<offset>, the epoch and offset from a delivery";
    let mut parts = raw.rsplitn(3, ':');
    let (Some(offset), Some(epoch), Some(topic)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(shape.into());
    };
    let topic =
        percent_decode(topic).ok_or("a topic in since is not valid percent-encoded UTF-8")?;
    check_topic(&topic).map_err(|why| format!("since: {why}"))?;
    let position: Position = format!("{epoch}:{offset}")
        .parse()
        .map_err(|why| format!("{shape}: {why}"))?;
    Ok((topic, position))
}

/// A position as JSON fields (`"epoch":""`, offset 0 when there is none).
fn position_fields(position: Option<Position>) -> (String, u64) {
    match position {
        Some(position) => (position.epoch.to_string(), position.offset),
        None => (String::new(), 0),
    }
}

impl Bus {
    /// `None` if `request` may see the bus's counters and topics, else the
    /// answer: with tokens on, they need the publish token (and with only
    /// `--jwt-secret`, nobody reads them unless `--open-stats`).
    fn refuse_stats(&self, request: &Request<'_>) -> Option<HttpResponse> {
        if !self.closed_stats {
            return None;
        }
        match &self.publish_token {
            Some(token) => token.refuse(request, "this page"),
            None => Some(HttpResponse::text(
                403,
                "this bus's counters are closed: start it with --publish-token (and send it) or --open-stats\n",
            )),
        }
    }

    /// Subscribes `conn` to `topic` as `how` says: through the bridge when
    /// there is one (a resume then replays from Redis's history).
    fn subscribe_how(&self, conn: &Conn, topic: &str, how: &Subscribe) -> Result<(), PubSubError> {
        match &self.bridge {
            Some(bridge) => bridge.subscribe_with(conn, topic, how).map(drop),
            None => self.pubsub.subscribe_with(conn, topic, how).map(drop),
        }
    }

    fn how(&self, positions: bool, start: Start) -> Subscribe {
        let how = Subscribe::new().start(start);
        if positions {
            how.envelope(self.json.clone())
        } else {
            how
        }
    }

    /// Whether the connection may join `topic`: always without
    /// `--jwt-secret`, else if its token names it.
    fn may_join(&self, session: &Client, topic: &str) -> bool {
        self.tokens.is_none() || session.grant.as_ref().is_some_and(|g| g.allows(topic))
    }

    /// `token:<jwt>`: takes the token (a first one, or a fresh one before
    /// the last expires), leaves the topics it does not name, and watches
    /// its expiry. A token that is not valid closes with 1008 and why.
    fn authorize(&self, conn: &Conn, session: &mut Client, token: &str) -> Result<(), ()> {
        let Some(tokens) = &self.tokens else {
            let _ = conn.send_text(&refusal(session.positions, "this bus takes no tokens"));
            return Ok(());
        };
        match tokens.check(token.trim()) {
            Ok(grant) => {
                tokens.watch(conn, &grant, session.grant.as_ref());
                for topic in self.pubsub.topics(conn) {
                    if !grant.allows(&topic) {
                        self.pubsub.unsubscribe(conn, &topic);
                    }
                }
                session.grant = Some(grant);
                Ok(())
            }
            Err(why) => {
                if let Err(error) = conn.close(CloseCode::POLICY_VIOLATION, &why) {
                    tracing::debug!(id = conn.id(), %error, "token refusal not sent");
                }
                Err(())
            }
        }
    }

    fn subscribe(&self, conn: &Conn, topic: &str, positions: bool) -> Result<(), String> {
        check_topic(topic).map_err(|why| why.to_string())?;
        if self.pubsub.topics(conn).len() >= MAX_TOPICS_PER_CONNECTION {
            return Err("more than 256 topics".into());
        }
        match self
            .pubsub
            .subscribe_with(conn, topic, &self.how(positions, Start::Now))
        {
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
        let message = match std::str::from_utf8(body) {
            Ok(text) => Message::Text(text),
            Err(_) => Message::Binary(body),
        };
        let query = request.query().unwrap_or("");
        let key = match query_values(query, "key").next().map(percent_decode) {
            None => None,
            Some(Some(key)) if key.len() <= MAX_KEY_LEN => Some(key),
            Some(Some(_)) => return HttpResponse::text(400, "a key is at most 256 bytes\n"),
            Some(None) => {
                return HttpResponse::text(400, "the key is not valid percent-encoded UTF-8\n");
            }
        };
        let mut options = PublishOptions::new();
        if let Some(key) = &key {
            options = options.key(key);
        }
        let published = match &self.bridge {
            Some(bridge) => bridge.publish_wait(&topic, message, options),
            None => self.pubsub.publish_with(&topic, message, options),
        };
        let (epoch, offset) = position_fields(published.position);
        let answer = json!({
            "delivered": published.subscribers,
            "epoch": epoch,
            "offset": offset,
        });
        HttpResponse::new(200, "application/json", format!("{answer}\n"))
    }

    /// `POST /publish` with NDJSON: one publication per line, one answer per
    /// line, in order (a bad line gets `{"error":...}` and the rest go on).
    /// Every line is read before any is published: a batch of more than
    /// [`MAX_BATCH`] lines, or with more than [`MAX_BAD_LINES`] bad ones, is
    /// refused whole, so an answer is never many times its request.
    fn publish_lines(&self, request: &Request<'_>) -> HttpResponse {
        let Ok(body) = std::str::from_utf8(request.body()) else {
            return HttpResponse::text(400, "the body is not UTF-8 (NDJSON)\n");
        };
        let lines: Vec<&str> = body.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.len() > MAX_BATCH {
            let why = format!(
                "{} publications in one request, at most {MAX_BATCH}: split the batch\n",
                lines.len()
            );
            return HttpResponse::text(413, why);
        }
        let read: Vec<Result<Line, String>> = lines.into_iter().map(read_line).collect();
        let bad = read.iter().filter(|line| line.is_err()).count();
        if bad > MAX_BAD_LINES {
            let (at, why) = read
                .iter()
                .enumerate()
                .find_map(|(at, line)| line.as_ref().err().map(|why| (at + 1, why.as_str())))
                .unwrap_or((0, ""));
            let why = format!(
                "{bad} of {} lines are not publications (line {at}: {why}); nothing was published\n",
                read.len()
            );
            return HttpResponse::text(400, why);
        }
        // Every line published first, then each waited for: their round
        // trips to Redis overlap.
        let receipts: Vec<_> = read
            .into_iter()
            .map(|line| line.map(|line| self.publish_line(&line)))
            .collect();
        let mut answers = String::new();
        for receipt in receipts {
            let answer = match receipt.map(Receipt::wait) {
                Ok(published) => {
                    let (epoch, offset) = position_fields(published.position);
                    json!({"delivered": published.subscribers, "epoch": epoch, "offset": offset})
                }
                Err(why) => json!({ "error": why }),
            };
            answers.push_str(&answer.to_string());
            answers.push('\n');
        }
        HttpResponse::new(200, "application/x-ndjson", answers)
    }

    /// Publishes one line that [`read_line`] read.
    fn publish_line(&self, line: &Line) -> Receipt {
        let message = match &line.data {
            Data::Text(text) => Message::Text(text),
            Data::Binary(binary) => Message::Binary(binary),
        };
        let mut options = PublishOptions::new();
        if let Some(key) = &line.key {
            options = options.key(key);
        }
        match &self.bridge {
            Some(bridge) => bridge.publish_with(&line.topic, message, options),
            None => Receipt::from(self.pubsub.publish_with(&line.topic, message, options)),
        }
    }

    fn topic(&self, path: &str) -> HttpResponse {
        let Some(topic) = percent_decode(&path["/topics/".len()..]) else {
            return HttpResponse::text(400, "the topic is not valid percent-encoded UTF-8\n");
        };
        if let Err(why) = check_topic(&topic) {
            return HttpResponse::text(400, format!("{why}\n"));
        }
        // With Redis: every node's subscribers, and Redis's position.
        let everywhere = self.bridge.as_ref().and_then(|b| b.occupancy_wait(&topic));
        let (subscribers, position) = match everywhere {
            Some(o) => (o.subscribers, o.position.or(self.pubsub.position(&topic))),
            None => (
                self.pubsub.subscribers(&topic),
                self.pubsub.position(&topic),
            ),
        };
        let (epoch, offset) = position_fields(position);
        let answer = json!({
            "subscribers": subscribers,
            "epoch": epoch,
            "offset": offset,
        });
        HttpResponse::new(200, "application/json", format!("{answer}\n"))
    }

    fn stats(&self) -> HttpResponse {
        let stats = self.pubsub.stats();
        let mut answer = json!({
            "topics": self.pubsub.topic_count(),
            "published": stats.published,
            "delivered": stats.delivered,
            "dropped": stats.dropped,
            "closed": stats.closed,
            "gone": stats.gone,
            "replayed": stats.replayed,
            "conflated": stats.conflated,
        });
        let usage = self.pubsub.usage();
        answer["usage"] = json!({
            "topics": usage.topics,
            "topic_bytes": usage.topic_bytes,
            "topics_refused": usage.topics_refused,
            "history_publications": usage.history_publications,
            "history_bytes": usage.history_bytes,
            "history_shed": usage.history_shed,
            "waiting_bytes": usage.waiting_bytes,
        });
        if let Some(bridge) = &self.bridge {
            let b = bridge.stats();
            answer["bridge"] = json!({
                "connected": b.connected,
                "relayed": b.relayed,
                "recorded": b.recorded,
                "received": b.received,
                "lost": b.lost,
                "unrecorded": b.unrecorded,
                "filled": b.filled,
                "refused": b.refused,
                "reconnects": b.reconnects,
            });
        }
        HttpResponse::new(200, "application/json", format!("{answer}\n"))
    }
}

/// One NDJSON publication, read and checked.
struct Line {
    topic: String,
    data: Data,
    key: Option<String>,
}

enum Data {
    Text(String),
    Binary(Vec<u8>),
}

/// One NDJSON line: `{"topic":..,"data":..[,"key":..]}` (or `"data_b64"`
/// for a binary payload); why not, in a few words.
fn read_line(line: &str) -> Result<Line, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    // (Indexing a value that is not an object to take from it would panic.)
    let serde_json::Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    let mut take = |name: &str| fields.remove(name).unwrap_or_default();
    let topic = match take("topic") {
        serde_json::Value::String(topic) => topic,
        _ => return Err("no \"topic\" string".into()),
    };
    check_topic(&topic).map_err(|why| why.to_string())?;
    let data = match (take("data"), take("data_b64")) {
        (serde_json::Value::String(text), serde_json::Value::Null) => Data::Text(text),
        (serde_json::Value::Null, serde_json::Value::String(encoded)) => Data::Binary(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| format!("data_b64: {e}"))?,
        ),
        _ => return Err("one of \"data\" (text) or \"data_b64\" (binary)".into()),
    };
    let key = match take("key") {
        serde_json::Value::Null => None,
        serde_json::Value::String(key) if key.len() <= MAX_KEY_LEN => Some(key),
        _ => return Err("\"key\" is a string of at most 256 bytes".into()),
    };
    Ok(Line { topic, data, key })
}

/// A topic for an error message: long ones cut.
fn shorten(topic: &str) -> String {
    match topic.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &topic[..at]),
        None => topic.to_owned(),
    }
}

/// The values of `name` in a query string (`a=1&topics=x,y`), undecoded,
/// in order.
fn query_values<'q>(query: &'q str, name: &str) -> impl Iterator<Item = &'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(move |(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The topics of `topics=a,b` (or `latest=`), each decoded and checked:
/// an empty list is no topic, but an empty name in a list (`a,,b`, `a,`)
/// is refused as any empty topic name is, not skipped.
fn topic_list(param: &str, listed: &str) -> Result<Vec<String>, String> {
    if listed.is_empty() {
        return Ok(Vec::new());
    }
    listed
        .split(',')
        .map(|raw| {
            if raw.is_empty() {
                return Err(format!(
                    "an empty topic name in {param}= (two commas in a row, or one at an end)"
                ));
            }
            let topic = percent_decode(raw).ok_or("a topic is not valid percent-encoded UTF-8")?;
            check_topic(&topic).map_err(|why| why.to_string())?;
            Ok(topic)
        })
        .collect()
}

/// `%XX` escapes decoded (`+` is kept as it is); `None` for a broken escape
/// (anything but two hex digits after `%`: `%+A` is not a newline) or bytes
/// that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let high = char::from(bytes.next()?).to_digit(16)?;
            let low = char::from(bytes.next()?).to_digit(16)?;
            out.push((high << 4 | low) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

fn main() -> std::process::ExitCode {
    support::log_to_stderr();
    let args: Args = support::parse_with_addr("127.0.0.1:9004");
    let bridged = args.redis.is_some() || !args.redis_cluster.is_empty();
    if let Err(why) = secrets::check(&args.secrets(), bridged) {
        eprintln!("error: {why}");
        return std::process::ExitCode::from(2);
    }
    let config = args
        .serve
        .config()
        .max_message_size(args.max_message_size)
        .max_frame_size(args.max_message_size)
        .max_http_body_size(args.max_message_size);
    let overflow = match args.overflow {
        _ if args.close_slow => Overflow::Close(CloseCode::POLICY_VIOLATION),
        OverflowArg::Close => Overflow::Close(CloseCode::POLICY_VIOLATION),
        OverflowArg::Drop => Overflow::Drop,
        OverflowArg::Conflate => Overflow::Conflate { close: None },
    };
    if args.serve.metrics {
        // Before the PubSub: it takes its metric handles when built.
        support::install_metrics();
    }
    let history = History::new(args.history, Duration::from_secs(args.history_secs));
    let limits = Limits::new()
        .history_bytes(args.max_history_bytes)
        .topic_bytes(args.max_topic_bytes)
        .waiting_bytes(args.max_waiting_bytes);
    let pubsub = PubSub::builder()
        .overflow(overflow)
        .history(history)
        .limits(limits)
        .build();
    if args.publish_token.is_none() {
        tracing::warn!(
            addr = %args.serve.addr,
            "anyone who reaches this address may publish: set --publish-token"
        );
    }
    let closed_stats =
        !args.open_stats && (args.publish_token.is_some() || args.jwt_secret.is_some());
    let builder = match (&args.redis, args.redis_cluster.as_slice()) {
        (Some(url), _) => Some((Bridge::builder(url), format!("--redis {url}"))),
        (None, []) => None,
        (None, nodes) => {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let flag = format!("--redis-cluster {}", nodes.join(","));
            Some((Bridge::cluster(&nodes), flag))
        }
    };
    let (secret, max_message_size) = (args.redis_secret.clone(), args.max_message_size);
    let (publish_token, jwt_secret) = (args.publish_token.clone(), args.jwt_secret.clone());
    support::serve_with("notify_bus", &args.serve, config, move |_runtime| {
        // The bridge runs on a thread of its own.
        let bridge = builder.map(|(builder, flag)| {
            let mut builder = builder.max_message_size(max_message_size);
            if let Some(secret) = &secret {
                builder = builder.secret(secret.as_bytes());
            }
            builder.start(&pubsub).unwrap_or_else(|error| {
                eprintln!("error: {flag}: {error}");
                std::process::exit(2);
            })
        });
        Bus {
            pubsub,
            json: Arc::new(Json),
            bridge,
            publish_token: publish_token.map(auth::PublishToken),
            tokens: jwt_secret.as_deref().map(auth::Tokens::new),
            closed_stats,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_escapes() {
        let first = |query, name| query_values(query, name).next();
        assert_eq!(first("topics=a,b", "topics"), Some("a,b"));
        assert_eq!(first("x=1&topics=&y", "topics"), Some(""));
        assert_eq!(first("x=1", "topics"), None);
        let all: Vec<_> = query_values("since=a:1:2&x&since=b:3:4", "since").collect();
        assert_eq!(all, ["a:1:2", "b:3:4"]);
        assert_eq!(percent_decode("a%2Cb%20c+d").as_deref(), Some("a,b c+d"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        for broken in ["%+A", "%-1", "%+0", "% A", "%A"] {
            assert_eq!(percent_decode(broken), None, "{broken}");
        }
        assert_eq!(percent_decode("%0a%0A").as_deref(), Some("\n\n"));
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn an_empty_name_in_a_topic_list_is_refused() {
        assert_eq!(topic_list("topics", ""), Ok(vec![]));
        assert_eq!(
            topic_list("topics", "a,b%20c"),
            Ok(vec!["a".into(), "b c".into()])
        );
        for bad in ["a,,b", "a,", ",a", ","] {
            let why = topic_list("topics", bad).unwrap_err();
            assert!(why.contains("empty topic name in topics="), "{bad}: {why}");
        }
    }

    #[test]
    fn since_names_a_topic_and_a_position() {
        let (topic, position) = parse_since("a%3Ab:00ff:7").unwrap();
        assert_eq!((topic.as_str(), position.offset), ("a:b", 7));
        assert_eq!(position.epoch.as_u64(), 0xff);
        let (topic, _) = parse_since("x:y:ab:0").unwrap();
        assert_eq!(topic, "x:y", "the topic may hold colons");
        for bad in ["a", "a:1", ":ab:1", "a:zz:1", "a:ab:-1", "a:ab:x"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}
