//! What a subscriber remembers between connections (sans-I/O): each
//! topic's last delivered position, the query that resumes after it, and
//! which messages reach the application.

use super::event::Event;
use crate::bus::{Incoming, Since, percent_encode};
use crate::pubsub::Position;

/// Each topic with the last position delivered on it.
#[derive(Debug)]
pub(crate) struct Resume {
    topics: Vec<Topic>,
}

#[derive(Debug)]
struct Topic {
    name: String,
    /// The last position delivered to the application.
    last: Option<Position>,
    /// The server said `recovered: false` and nothing was delivered on the
    /// topic since: a delivery in another epoch is then expected.
    told: bool,
}

impl Resume {
    pub(crate) fn new(topics: impl IntoIterator<Item = String>) -> Resume {
        let mut resume = Resume { topics: Vec::new() };
        for name in topics {
            if !resume.topics.iter().any(|t| t.name == name) {
                resume.topics.push(Topic {
                    name,
                    last: None,
                    told: false,
                });
            }
        }
        resume
    }

    /// The subscribe URL's query: positions on, every topic with a position
    /// resumed after it (`since=`), the others from now (`topics=`).
    pub(crate) fn query(&self) -> String {
        let mut query = String::from("positions=1&starts=1");
        let fresh: Vec<String> = self
            .topics
            .iter()
            .filter(|t| t.last.is_none())
            .map(|t| percent_encode(&t.name))
            .collect();
        if !fresh.is_empty() {
            query.push_str("&topics=");
            query.push_str(&fresh.join(","));
        }
        for topic in &self.topics {
            if let Some(position) = topic.last {
                let since = Since {
                    topic: topic.name.clone(),
                    position,
                };
                query.push_str(&format!("&since={since}"));
            }
        }
        query
    }

    /// What the application is told of `incoming`: a delivery once (a
    /// position at or before the last one delivered in its epoch is a
    /// replay it already has), a discontinuity when the server says so,
    /// or when a delivery comes in another epoch without the server having
    /// said so (never a silent gap). At most two events.
    pub(crate) fn handle(&mut self, incoming: Incoming) -> Vec<Event> {
        match incoming {
            Incoming::Delivery {
                topic,
                position,
                data,
            } => {
                let Some(state) = self.topics.iter_mut().find(|t| t.name == topic) else {
                    return Vec::new();
                };
                let mut events = Vec::new();
                match state.last {
                    Some(last)
                        if last.epoch == position.epoch && position.offset <= last.offset =>
                    {
                        return events;
                    }
                    Some(last) if last.epoch != position.epoch && !state.told => {
                        events.push(Event::Discontinuity {
                            topic: topic.clone(),
                        });
                    }
                    _ => {}
                }
                state.last = Some(position);
                state.told = false;
                events.push(Event::Delivery {
                    topic,
                    position,
                    data,
                });
                events
            }
            Incoming::Recovery {
                topic,
                recovered: false,
            } => match self.topics.iter_mut().find(|t| t.name == topic) {
                Some(state) => {
                    state.told = true;
                    vec![Event::Discontinuity { topic }]
                }
                None => Vec::new(),
            },
            // Where a topic subscribed from now starts: its position until
            // a delivery gives a newer one.
            Incoming::Since(since) => {
                if let Some(state) = self.topics.iter_mut().find(|t| t.name == since.topic)
                    && state.last.is_none()
                {
                    state.last = Some(since.position);
                }
                Vec::new()
            }
            Incoming::Error(why) => vec![Event::Refused { why }],
            Incoming::Recovery { .. }
            | Incoming::Subscribed(_)
            | Incoming::Unsubscribed(_)
            | Incoming::Authorized => Vec::new(),
        }
    }
}

#[cfg(test)]
#[path = "resume/tests.rs"]
mod tests;
