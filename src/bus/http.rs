//! The bus's HTTP side: `POST /publish/<topic>`, NDJSON batches on
//! `POST /publish`, `GET /topics/<topic>`, `GET /stats`, and who may see
//! them. Each answer is one line; every refusal says why.

use serde_json::json;

use super::lines::{Line, MAX_BAD_LINES, MAX_BATCH, MAX_KEY_LEN, read_line};
use super::query::query_values;
use super::wire::position_fields;
use super::{Bus, Data, Inner};
use crate::connection::handler::HttpResponse;
use crate::handshake::Request;
use crate::handshake::percent_decode;
use crate::proto::Message;
use crate::pubsub::{PublishOptions, Published, check_topic};

/// A plain HTTP request as the bus reads it, from whichever server it came.
pub(crate) struct Call<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    /// The `Authorization` header's value.
    pub authorization: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// What the bus makes of a request.
pub(crate) enum Answer {
    /// One of the bus's: its answer.
    Done(HttpResponse),
    /// A plain request to the WebSocket's path: the server's usual
    /// refusal of a request that is not an upgrade.
    Upgrade,
    /// Not one of the bus's paths (and allowed, if guarded).
    Other,
}

impl Bus {
    /// The standalone servers' `on_http`: the bus's paths, then the
    /// fallback, then a 404 that lists the bus's paths.
    pub(super) fn answer_request(&self, request: &Request<'_>) -> Option<HttpResponse> {
        let call = Call {
            method: request.method(),
            path: request.path(),
            query: request.query().unwrap_or(""),
            authorization: request.header("authorization"),
            body: request.body(),
        };
        match self.inner.answer(&call) {
            Answer::Done(response) => Some(response),
            Answer::Upgrade => None,
            Answer::Other => {
                let fallback = self.inner.fallback.as_ref();
                fallback
                    .and_then(|answer| answer(request))
                    .or_else(|| Some(self.inner.not_found()))
            }
        }
    }
}

impl Inner {
    pub(crate) fn answer(&self, call: &Call<'_>) -> Answer {
        let path = call.path;
        let telling = matches!(call.method, "GET" | "HEAD")
            && (path == "/stats" || path == "/metrics" || path.starts_with("/topics/"));
        if telling && let Some(refused) = self.refuse_stats(call) {
            return Answer::Done(refused);
        }
        let publishing = path == "/publish" || path.starts_with("/publish/");
        Answer::Done(match (call.method, path) {
            ("GET" | "HEAD", "/stats") => self.stats(),
            ("GET" | "HEAD", _) if path.starts_with("/topics/") => self.topic(path),
            ("POST", _) if publishing => {
                let token = self.publish_token.as_ref();
                if let Some(refused) =
                    token.and_then(|t| t.refuse(call.authorization, "publishing"))
                {
                    return Answer::Done(refused);
                }
                if path == "/publish" {
                    self.publish_lines(call.body)
                } else {
                    self.publish(path, call.query, call.body)
                }
            }
            (_, _) if publishing => HttpResponse::text(405, "use POST to publish\n"),
            (_, _) if path == self.path => return Answer::Upgrade,
            _ => return Answer::Other,
        })
    }

    pub(crate) fn not_found(&self) -> HttpResponse {
        let why = format!(
            "not found: try {}?topics=a,b, POST /publish/<topic> or /topics/<topic>\n",
            self.path
        );
        HttpResponse::text(404, why)
    }

    /// `None` if `call` may see the bus's counters and topics, else the
    /// answer: with tokens on, they need the publish token (and with only
    /// a JWT secret, nobody reads them unless they are opened).
    fn refuse_stats(&self, call: &Call<'_>) -> Option<HttpResponse> {
        if !self.closed_stats {
            return None;
        }
        match &self.publish_token {
            Some(token) => token.refuse(call.authorization, "this page"),
            None => Some(HttpResponse::text(
                403,
                "this bus's counters are closed: it has no publish token to show; open them (Builder::open_stats, notify_bus's --open-stats)\n",
            )),
        }
    }

    fn publish(&self, path: &str, query: &str, body: &[u8]) -> HttpResponse {
        let Some(topic) = percent_decode(&path["/publish/".len()..]) else {
            return HttpResponse::text(400, "the topic is not valid percent-encoded UTF-8\n");
        };
        if let Err(why) = check_topic(&topic) {
            return HttpResponse::text(400, format!("{why}\n"));
        }
        let message = match std::str::from_utf8(body) {
            Ok(text) => Message::Text(text),
            Err(_) => Message::Binary(body),
        };
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
        let published = self.publish_one(&topic, message, options);
        HttpResponse::new(
            200,
            "application/json",
            format!("{}\n", receipt(&published)),
        )
    }

    /// Publishes, through the bridge when there is one (answered once
    /// Redis numbered it).
    fn publish_one(
        &self,
        topic: &str,
        message: Message<'_>,
        options: PublishOptions<'_>,
    ) -> Published {
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            return bridge.publish_wait(topic, message, options);
        }
        self.pubsub.publish_with(topic, message, options)
    }

    /// `POST /publish` with NDJSON: one publication per line, one answer per
    /// line, in order (a bad line gets `{"error":...}` and the rest go on).
    /// Every line is read before any is published: a batch of more than
    /// [`MAX_BATCH`] lines, or with more than [`MAX_BAD_LINES`] bad ones, is
    /// refused whole, so an answer is never many times its request.
    fn publish_lines(&self, body: &[u8]) -> HttpResponse {
        let Ok(body) = std::str::from_utf8(body) else {
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
        let mut answers = String::new();
        for outcome in self.publish_all(read) {
            let answer = match outcome {
                Ok(published) => receipt(&published),
                Err(why) => json!({ "error": why }),
            };
            answers.push_str(&answer.to_string());
            answers.push('\n');
        }
        HttpResponse::new(200, "application/x-ndjson", answers)
    }

    /// Publishes every line that read; with Redis, every one first and
    /// then each waited for, so that their round trips overlap.
    fn publish_all(&self, lines: Vec<Result<Line, String>>) -> Vec<Result<Published, String>> {
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            let receipts: Vec<_> = lines
                .into_iter()
                .map(|line| {
                    line.map(|line| {
                        let (message, options) = as_publish(&line);
                        bridge.publish_with(&line.topic, message, options)
                    })
                })
                .collect();
            return receipts
                .into_iter()
                .map(|receipt| receipt.map(crate::pubsub::redis::Receipt::wait))
                .collect();
        }
        lines
            .into_iter()
            .map(|line| {
                line.map(|line| {
                    let (message, options) = as_publish(&line);
                    self.pubsub.publish_with(&line.topic, message, options)
                })
            })
            .collect()
    }

    fn topic(&self, path: &str) -> HttpResponse {
        let Some(topic) = percent_decode(&path["/topics/".len()..]) else {
            return HttpResponse::text(400, "the topic is not valid percent-encoded UTF-8\n");
        };
        if let Err(why) = check_topic(&topic) {
            return HttpResponse::text(400, format!("{why}\n"));
        }
        let here = || {
            (
                self.pubsub.subscribers(&topic),
                self.pubsub.position(&topic),
            )
        };
        // With Redis: every node's subscribers, and Redis's position.
        #[cfg(feature = "redis")]
        let everywhere = self.bridge.as_ref().and_then(|b| b.occupancy_wait(&topic));
        #[cfg(feature = "redis")]
        let (subscribers, position) = match everywhere {
            Some(o) => (o.subscribers, o.position.or(self.pubsub.position(&topic))),
            None => here(),
        };
        #[cfg(not(feature = "redis"))]
        let (subscribers, position) = here();
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
        #[cfg(feature = "redis")]
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

/// A line as what a publish takes.
fn as_publish(line: &Line) -> (Message<'_>, PublishOptions<'_>) {
    let message = match &line.data {
        Data::Text(text) => Message::Text(text),
        Data::Binary(binary) => Message::Binary(binary),
    };
    let mut options = PublishOptions::new();
    if let Some(key) = &line.key {
        options = options.key(key);
    }
    (message, options)
}

/// A publish's answer: `{"delivered":N,"epoch":"<hex>","offset":O}`.
fn receipt(published: &Published) -> serde_json::Value {
    let (epoch, offset) = position_fields(published.position);
    json!({"delivered": published.subscribers, "epoch": epoch, "offset": offset})
}
