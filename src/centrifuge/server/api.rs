//! Centrifugo's server HTTP API on the same port: `POST /api/<method>`
//! with the key in `X-API-Key` (or `Authorization: apikey <key>`), a JSON
//! body, and a JSON answer: `{"result":...}`, or `{"error":{...}}` with
//! status 200 as Centrifugo answers a method's error. Methods: publish,
//! broadcast, history, presence and presence_stats (108, not available,
//! unless presence is on; with a Redis bridge, every node's clients,
//! waited for here: an answer cannot come later).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::Centrifuge;
use super::everywhere::stats;
use crate::centrifuge::messages::{Error, HistoryRequest, ReplyBody, StreamPosition};
use crate::centrifuge::{Format, error, json};
use crate::connection::handler::HttpResponse;
use crate::handshake::Request;
use crate::proto::Message;

/// The most channels one broadcast may name.
const MAX_BROADCAST: usize = 1000;

#[derive(Deserialize)]
struct Publish<'a> {
    channel: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

#[derive(Deserialize)]
struct Broadcast<'a> {
    channels: Vec<String>,
    #[serde(borrow)]
    data: &'a RawValue,
}

#[derive(Deserialize)]
struct History {
    channel: String,
    #[serde(default)]
    limit: i32,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    reverse: bool,
}

#[derive(Deserialize)]
struct Channel {
    channel: String,
}

#[derive(Deserialize)]
struct Since {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    epoch: String,
}

fn answer(body: String) -> HttpResponse {
    HttpResponse::new(200, "application/json", body)
}

fn error_body(e: &Error) -> String {
    serde_json::json!({"error": {"code": e.code, "message": e.message}}).to_string()
}

fn bad(why: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::text(400, format!("{why}\n"))
}

/// Compares without stopping at the first difference, so the time taken
/// says nothing of how much of a key was right.
fn same_key(given: &[u8], key: &str) -> bool {
    let key = key.as_bytes();
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

impl Centrifuge {
    /// The API's answer to `request`, or `None` for a path it does not
    /// serve.
    pub(super) fn api(&self, request: &Request<'_>) -> Option<HttpResponse> {
        let method = request.path().strip_prefix("/api/")?;
        let key = self.options.api_key.as_deref()?;
        if request.method() != "POST" {
            return Some(HttpResponse::text(405, "the API takes POST\n"));
        }
        let given = request.header("x-api-key").or_else(|| {
            request
                .header("authorization")
                .and_then(|value| value.strip_prefix(b"apikey "))
        });
        if !given.is_some_and(|given| same_key(given, key)) {
            return Some(HttpResponse::text(401, "a wrong or missing API key\n"));
        }
        let body = request.body();
        Some(match method {
            "publish" => match serde_json::from_slice::<Publish<'_>>(body) {
                Ok(p) => match self.api_publish(&p.channel, p.data) {
                    Ok(result) => answer(format!("{{\"result\":{result}}}")),
                    Err(e) => answer(error_body(&e)),
                },
                Err(e) => bad(e),
            },
            "broadcast" => match serde_json::from_slice::<Broadcast<'_>>(body) {
                Ok(b) if b.channels.len() > MAX_BROADCAST => {
                    bad(format!("at most {MAX_BROADCAST} channels"))
                }
                Ok(b) => {
                    let responses: Vec<String> = b
                        .channels
                        .iter()
                        .map(|channel| match self.api_publish(channel, b.data) {
                            Ok(result) => format!("{{\"result\":{result}}}"),
                            Err(e) => error_body(&e),
                        })
                        .collect();
                    answer(format!(
                        "{{\"result\":{{\"responses\":[{}]}}}}",
                        responses.join(",")
                    ))
                }
                Err(e) => bad(e),
            },
            "history" => match serde_json::from_slice::<History>(body) {
                Ok(h) => {
                    let request = HistoryRequest {
                        channel: h.channel,
                        limit: h.limit,
                        since: h.since.map(|s| StreamPosition {
                            offset: s.offset,
                            epoch: s.epoch,
                        }),
                        reverse: h.reverse,
                    };
                    match self.history(Format::Json, request) {
                        ReplyBody::History(result) => {
                            let mut out = b"{\"result\":".to_vec();
                            json::encode_history(&mut out, &result);
                            out.push(b'}');
                            answer(String::from_utf8_lossy(&out).into_owned())
                        }
                        ReplyBody::Error(e) => answer(error_body(&e)),
                        _ => answer(error_body(&Error::new(error::INTERNAL))),
                    }
                }
                Err(e) => bad(e),
            },
            "presence" | "presence_stats" if !self.options.presence => {
                answer(error_body(&Error::new(error::NOT_AVAILABLE)))
            }
            "presence" | "presence_stats" => match serde_json::from_slice::<Channel>(body) {
                Ok(c) if method == "presence" => {
                    let mut out = b"{\"result\":".to_vec();
                    let clients = self.presence_wait(&c.channel);
                    json::encode_presence(&mut out, &clients);
                    out.push(b'}');
                    answer(String::from_utf8_lossy(&out).into_owned())
                }
                Ok(c) => {
                    let (clients, users) = stats(&self.presence_wait(&c.channel));
                    answer(format!(
                        "{{\"result\":{{\"num_clients\":{clients},\"num_users\":{users}}}}}"
                    ))
                }
                Err(e) => bad(e),
            },
            _ => HttpResponse::text(404, "no such API method\n"),
        })
    }

    /// Publishes `data` to `channel`: the result object (its position when
    /// the channel keeps history).
    fn api_publish(&self, channel: &str, data: &RawValue) -> Result<String, Error> {
        if !super::join_leave::channel_ok(channel) {
            return Err(Error::new(error::BAD_REQUEST));
        }
        let published = self
            .pubsub
            .publish(channel, Message::Binary(data.get().as_bytes()));
        Ok(match published.position {
            Some(position) if self.pubsub.history(channel).is_on() => {
                format!(
                    "{{\"offset\":{},\"epoch\":\"{}\"}}",
                    position.offset, position.epoch
                )
            }
            _ => "{}".to_owned(),
        })
    }
}
