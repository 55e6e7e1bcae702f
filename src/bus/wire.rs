//! The bus's JSON on the WebSocket (`positions=1`): the delivery envelope
//! the server writes once per publication, and what a subscriber reads
//! back ([`Incoming`]).

use base64::Engine as _;
use serde_json::{Value, json};

use super::Since;
use crate::proto::{MessageKind, OwnedMessage};
use crate::pubsub::{Envelope, Position, Publication};

/// `positions=1`'s envelope: `{"topic":..,"epoch":"<16 hex>","offset":N,
/// "data":"<text>"}` (`"data_b64"` for a binary payload), and
/// `{"topic":..,"recovered":true|false}` where a resume ends or a gap is.
pub(crate) struct Json;

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

/// A refused command, as the connection's format shows it.
pub(crate) fn refusal(positions: bool, why: &str) -> String {
    if positions {
        json!({ "error": why }).to_string()
    } else {
        format!("error: {why}")
    }
}

/// A position as JSON fields (`"epoch":""`, offset 0 when there is none).
pub(crate) fn position_fields(position: Option<Position>) -> (String, u64) {
    match position {
        Some(position) => (position.epoch.to_string(), position.offset),
        None => (String::new(), 0),
    }
}

/// A delivery's payload as the bus sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// Published as text (`"data"`).
    Text(String),
    /// Published as binary (`"data_b64"`, decoded).
    Binary(Vec<u8>),
}

/// One message a `positions=1` subscriber is sent, read.
///
/// ```
/// use rapidws::bus::{Data, Incoming};
///
/// let text = r#"{"topic":"a","epoch":"00000000000000ab","offset":3,"data":"hi"}"#;
/// let Incoming::Delivery { topic, position, data } = text.parse().unwrap() else {
///     unreachable!()
/// };
/// assert_eq!((topic.as_str(), position.offset), ("a", 3));
/// assert_eq!(data, Data::Text("hi".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A publication on `topic`, at `position`.
    Delivery {
        /// The topic it was published on.
        topic: String,
        /// Where it sits in the topic.
        position: Position,
        /// Its payload.
        data: Data,
    },
    /// `{"topic":..,"recovered":..}`: `true` where a resumed topic's replay
    /// ended with nothing missed; `false` where something was missed that
    /// will not come (a discontinuity).
    Recovery {
        /// The topic.
        topic: String,
        /// Whether nothing was missed.
        recovered: bool,
    },
    /// `{"topic":..,"since":"<epoch>:<offset>"}` (with `starts=1`): the
    /// topic was subscribed from now, and its deliveries follow this
    /// position (sent before any of them): a subscriber that has had no
    /// delivery on it yet resumes from here.
    Since(Since),
    /// `{"subscribed":..}`: a `subscribe:<topic>` command was done.
    Subscribed(String),
    /// `{"unsubscribed":..}`.
    Unsubscribed(String),
    /// `{"authorized":true}`: a `token:<jwt>` was taken.
    Authorized,
    /// `{"error":..}`: a command was refused, and why.
    Error(String),
}

/// Why a message is not one the bus sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseIncomingError(String);

impl std::fmt::Display for ParseIncomingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a bus message: {}", self.0)
    }
}

impl std::error::Error for ParseIncomingError {}

impl std::str::FromStr for Incoming {
    type Err = ParseIncomingError;

    fn from_str(text: &str) -> Result<Incoming, ParseIncomingError> {
        let bad = |why: &str| ParseIncomingError(why.to_owned());
        let value: Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
        let Value::Object(mut fields) = value else {
            return Err(bad("not a JSON object"));
        };
        let mut take = |name: &str| fields.remove(name).unwrap_or_default();
        if let Value::String(why) = take("error") {
            return Ok(Incoming::Error(why));
        }
        if let Value::String(topic) = take("subscribed") {
            return Ok(Incoming::Subscribed(topic));
        }
        if let Value::String(topic) = take("unsubscribed") {
            return Ok(Incoming::Unsubscribed(topic));
        }
        if take("authorized") == Value::Bool(true) {
            return Ok(Incoming::Authorized);
        }
        let Value::String(topic) = take("topic") else {
            return Err(bad("no \"topic\""));
        };
        if let Value::Bool(recovered) = take("recovered") {
            return Ok(Incoming::Recovery { topic, recovered });
        }
        if let Value::String(since) = take("since") {
            let position = since
                .parse()
                .map_err(|_| bad("since is <epoch>:<offset>"))?;
            return Ok(Incoming::Since(Since { topic, position }));
        }
        let (Value::String(epoch), Some(offset)) = (take("epoch"), take("offset").as_u64()) else {
            return Err(bad("a delivery has an \"epoch\" string and an \"offset\""));
        };
        let epoch = epoch
            .parse()
            .map_err(|_| bad("the epoch is not 16 hex digits"))?;
        let data = match (take("data"), take("data_b64")) {
            (Value::String(text), Value::Null) => Data::Text(text),
            (Value::Null, Value::String(encoded)) => Data::Binary(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| bad("data_b64 is not base64"))?,
            ),
            _ => return Err(bad("a delivery has one of \"data\" or \"data_b64\"")),
        };
        Ok(Incoming::Delivery {
            topic,
            position: Position { epoch, offset },
            data,
        })
    }
}

#[cfg(test)]
#[path = "wire/tests.rs"]
mod tests;
