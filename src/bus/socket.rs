//! The bus's WebSocket side: the upgrade's query read into topics, the
//! text commands, and a subscriber carried to the next process.

use serde_json::{Value, json};

use super::auth::Grant;
use super::query::{MAX_TOPICS_PER_CONNECTION, read_query, shorten};
use super::wire::refusal;
use super::{Bus, Inner};
use crate::connection::conn::Conn;
use crate::connection::handler::{Accept, Handler, HttpResponse, Reject, ServerHandler};
use crate::handshake::Request;
use crate::proto::{CloseCode, Message};
use crate::pubsub::{Position, PubSubError, Start, Subscribe, check_topic};

/// Tells a `starts=1` subscriber where its deliveries on `topic` start:
/// `{"topic":..,"since":"<epoch>:<offset>"}`, before any of them, so that
/// it can resume a topic that has had no delivery yet.
fn tell_since(conn: &Conn, topic: &str, joined: Option<Position>) {
    if let Some(position) = joined {
        let since = json!({ "topic": topic, "since": position.to_string() });
        let _ = conn.send_text(&since.to_string());
    }
}

/// What the bus knows of one connection: how it is answered, what its
/// token allows, and (until it opens) what to subscribe it to.
#[derive(Debug)]
pub struct Member {
    positions: bool,
    /// `starts=1`: told where each topic subscribed from now starts.
    starts: bool,
    opening: Vec<(String, Start)>,
    /// With a JWT secret: what the connection's token allows, once it
    /// presented one.
    grant: Option<Grant>,
}

impl Handler for Bus {
    type State = Member;

    fn on_open(&self, conn: &Conn, member: &mut Member) {
        let bus = &self.inner;
        if let (Some(tokens), Some(grant)) = (&bus.tokens, &member.grant) {
            tokens.watch(conn, grant, None);
        }
        for (topic, start) in member.opening.drain(..) {
            let how = bus.how(member.positions, start);
            // Checked at the upgrade; a closing connection needs no answer,
            // the bus's budget for topics being full does.
            match bus.subscribe_how(conn, &topic, &how) {
                Ok(joined) => {
                    if member.starts && start == Start::Now {
                        tell_since(conn, &topic, joined);
                    }
                }
                Err(PubSubError::Closed) => {}
                Err(why) => {
                    let why = format!("not subscribed to {}: {why}", shorten(&topic));
                    let _ = conn.send_text(&refusal(member.positions, &why));
                }
            }
        }
        member.opening.shrink_to_fit();
    }

    fn on_message(&self, conn: &Conn, member: &mut Member, message: Message<'_>) {
        let bus = &self.inner;
        let positions = member.positions;
        let Message::Text(text) = message else {
            let why = "commands are text: subscribe:<topic> or unsubscribe:<topic>";
            let _ = conn.send_text(&refusal(positions, why));
            return;
        };
        let outcome = match text.split_once(':') {
            Some(("token", token)) => match bus.authorize(conn, member, token) {
                Ok(()) => Ok(json!({ "authorized": true })),
                // Closed with 1008 and the reason.
                Err(()) => return,
            },
            Some(("subscribe", topic)) if !bus.may_join(member, topic) => Err("not allowed".into()),
            Some(("subscribe", topic)) => match bus.subscribe(conn, topic, positions) {
                Ok(joined) => {
                    if positions {
                        let ack = json!({ "subscribed": topic });
                        let _ = conn.send_text(&ack.to_string());
                    }
                    if member.starts {
                        tell_since(conn, topic, joined);
                    }
                    return;
                }
                Err(why) => Err(why),
            },
            Some(("unsubscribe", topic)) => {
                if bus.pubsub.unsubscribe(conn, topic) {
                    Ok(json!({ "unsubscribed": topic }))
                } else {
                    Err(format!("not subscribed to {}", shorten(topic)))
                }
            }
            _ => Err("unknown command: use subscribe:<topic> or unsubscribe:<topic>".into()),
        };
        match outcome {
            // Plain clients get no acknowledgement.
            Ok(ack) if positions => {
                let _ = conn.send_text(&ack.to_string());
            }
            Ok(_) => {}
            Err(why) => {
                let _ = conn.send_text(&refusal(positions, &why));
            }
        }
    }

    fn on_close(&self, conn: &Conn, member: &mut Member, _: CloseCode, _: &str) {
        if let (Some(tokens), Some(grant)) = (&self.inner.tokens, &member.grant) {
            tokens.forget(conn, grant);
        }
    }

    /// A subscriber moves with its topics, each with the position it has
    /// been sent up to (nothing is published here once the publishers
    /// moved, so that is the topic's latest), its format and its token's
    /// grant.
    fn hand_off(&self, conn: &Conn, member: &mut Member) -> Option<Vec<u8>> {
        let pubsub = &self.inner.pubsub;
        let topics: Vec<_> = pubsub
            .topics(conn)
            .iter()
            .map(|topic| {
                let position = pubsub.sent_up_to(conn, topic).map(|p| p.to_string());
                json!([&**topic, position])
            })
            .collect();
        let grant = member.grant.as_ref().map(Grant::to_json);
        // (Its token's expiry watch stays: this process ends soon, and
        // should the connection stay after all, it is still enforced.)
        let state = json!({
            "positions": member.positions,
            "starts": member.starts,
            "topics": topics,
            "grant": grant,
        });
        Some(state.to_string().into_bytes())
    }

    /// The subscriber's topics again, each resumed after the position it
    /// had been sent up to (what was published since, in this process, is
    /// replayed from history first: exactly once).
    fn take_over(&self, conn: &Conn, state: &[u8]) -> Option<Member> {
        let bus = &self.inner;
        let state: Value = serde_json::from_slice(state).ok()?;
        let positions = state["positions"].as_bool()?;
        // (Absent from a predecessor that did not know it.)
        let starts = state["starts"].as_bool().unwrap_or(false);
        let grant = match &state["grant"] {
            Value::Null => None,
            grant => Some(Grant::from_json(grant)?),
        };
        // Everything is read before anything is done: a state that does not
        // read refuses the connection (closed with 1012) with nothing left
        // behind.
        let mut topics = Vec::new();
        for topic in state["topics"].as_array()? {
            let name = topic[0].as_str()?;
            let position = match &topic[1] {
                Value::Null => None,
                position => Some(position.as_str()?.parse::<Position>().ok()?),
            };
            topics.push((name, position));
        }
        if let (Some(tokens), Some(grant)) = (&bus.tokens, &grant) {
            tokens.watch(conn, grant, None);
        }
        for (name, position) in topics {
            let how = match position {
                Some(position) => bus.how(positions, Start::Now).after_handoff(position),
                None => bus.how(positions, Start::Now),
            };
            let _ = bus.subscribe_how(conn, name, &how);
        }
        Some(Member {
            positions,
            starts,
            opening: Vec::new(),
            grant,
        })
    }
}

impl ServerHandler for Bus {
    /// The topics (numbering and history) go to the successor before the
    /// subscribers do.
    fn hand_off_server(&self) -> Vec<u8> {
        self.inner.pubsub.hand_off()
    }

    fn take_over_server(&self, state: &[u8]) -> Result<(), String> {
        let topics = self
            .inner
            .pubsub
            .take_over(state)
            .map_err(|e| e.to_string())?;
        tracing::info!(topics, "took over the topics");
        Ok(())
    }

    /// A handoff failed after the successor took the topics: what it
    /// numbered meanwhile must not alias ours.
    fn take_back_server(&self) {
        self.inner.pubsub.renumber();
    }

    fn on_upgrade(&self, request: &Request<'_>, _: &mut Accept) -> Result<Member, Reject> {
        self.inner
            .upgrade(request.path(), request.query().unwrap_or(""))
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        self.answer_request(request)
    }
}

impl Inner {
    /// The upgrade to `path?query`: the member it makes, or why not.
    pub(super) fn upgrade(&self, path: &str, query: &str) -> Result<Member, Reject> {
        if path != self.path {
            let why = format!("not found: WebSockets are at {}?topics=a,b", self.path);
            return Err(Reject::new(404, why));
        }
        let asked = read_query(query).map_err(|why| Reject::new(400, why))?;
        let grant = match (&self.tokens, asked.token) {
            (None, _) | (Some(_), None) => None,
            (Some(tokens), Some(token)) => {
                Some(tokens.check(&token).map_err(|why| Reject::new(401, why))?)
            }
        };
        if self.tokens.is_some() {
            match &grant {
                None if !asked.topics.is_empty() => {
                    return Err(Reject::new(
                        401,
                        "subscribing needs a token: ?token=<jwt> (or a first message token:<jwt>)",
                    ));
                }
                Some(grant) => {
                    if let Some((topic, _)) = asked.topics.iter().find(|(t, _)| !grant.allows(t)) {
                        return Err(Reject::new(
                            403,
                            format!("not allowed: the token does not name {}", shorten(topic)),
                        ));
                    }
                }
                None => {}
            }
        }
        Ok(Member {
            positions: asked.positions,
            starts: asked.starts,
            opening: asked.topics,
            grant,
        })
    }

    /// Subscribes `conn` to `topic` as `how` says: through the bridge when
    /// there is one (a resume then replays from Redis's history). The
    /// topic's position when it joined, when known now.
    fn subscribe_how(
        &self,
        conn: &Conn,
        topic: &str,
        how: &Subscribe,
    ) -> Result<Option<Position>, PubSubError> {
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            return bridge
                .subscribe_with(conn, topic, how)
                .map(|subscribing| match subscribing {
                    crate::pubsub::redis::Subscribing::Done(done) => Some(done.position),
                    crate::pubsub::redis::Subscribing::Loading => None,
                });
        }
        self.pubsub
            .subscribe_with(conn, topic, how)
            .map(|done| Some(done.position))
    }

    fn how(&self, positions: bool, start: Start) -> Subscribe {
        let how = Subscribe::new().start(start);
        if positions {
            how.envelope(self.json.clone())
        } else {
            how
        }
    }

    /// Whether the connection may join `topic`: always without a JWT
    /// secret, else if its token names it.
    fn may_join(&self, member: &Member, topic: &str) -> bool {
        self.tokens.is_none() || member.grant.as_ref().is_some_and(|g| g.allows(topic))
    }

    /// `token:<jwt>`: takes the token (a first one, or a fresh one before
    /// the last expires), leaves the topics it does not name, and watches
    /// its expiry. A token that is not valid closes with 1008 and why.
    fn authorize(&self, conn: &Conn, member: &mut Member, token: &str) -> Result<(), ()> {
        let Some(tokens) = &self.tokens else {
            let _ = conn.send_text(&refusal(member.positions, "this bus takes no tokens"));
            return Ok(());
        };
        match tokens.check(token.trim()) {
            Ok(grant) => {
                tokens.watch(conn, &grant, member.grant.as_ref());
                for topic in self.pubsub.topics(conn) {
                    if !grant.allows(&topic) {
                        self.pubsub.unsubscribe(conn, &topic);
                    }
                }
                member.grant = Some(grant);
                Ok(())
            }
            Err(why) => {
                let reason = super::auth::close_reason(&why);
                if let Err(error) = conn.close(CloseCode::POLICY_VIOLATION, reason) {
                    tracing::debug!(id = conn.id(), %error, "token refusal not sent");
                }
                Err(())
            }
        }
    }

    fn subscribe(
        &self,
        conn: &Conn,
        topic: &str,
        positions: bool,
    ) -> Result<Option<Position>, String> {
        check_topic(topic).map_err(|why| why.to_string())?;
        if self.pubsub.topics(conn).len() >= MAX_TOPICS_PER_CONNECTION {
            return Err(format!("more than {MAX_TOPICS_PER_CONNECTION} topics"));
        }
        self.subscribe_how(conn, topic, &self.how(positions, Start::Now))
            .map_err(|error| error.to_string())
    }
}
