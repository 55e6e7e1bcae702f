//! Centrifugo's client protocol v2 (feature `centrifuge`): the commands a
//! client such as Centrifugo's own SDKs sends, the replies and pushes the
//! server sends back, in both of its formats. Sans-I/O: a frame's payload
//! goes in, values come out; values go in, a frame's payload comes out.
//!
//! ```
//! use rapidws::centrifuge::{Format, Reply, ReplyBody, Request};
//!
//! let frame = b"{\"id\":1,\"connect\":{\"name\":\"js\"}}\n{\"id\":2,\"subscribe\":{\"channel\":\"news\"}}";
//! let commands = Format::Json.decode(frame).unwrap();
//! assert!(matches!(commands[1].request, Request::Subscribe(ref s) if s.channel == "news"));
//!
//! let mut out = Vec::new();
//! Format::Json.encode(&mut out, &Reply { id: 2, body: ReplyBody::Unsubscribe });
//! assert_eq!(out, b"{\"id\":2,\"unsubscribe\":{}}");
//! ```
//!
//! | file | concern |
//! |---|---|
//! | `messages.rs` | [`Command`], [`Reply`], [`Push`] and their parts |
//! | `codes.rs` | error, unsubscribe and close codes, with Centrifugo's words |
//! | `json.rs` | the JSON format: a line a message |
//! | `protobuf.rs` | the Protobuf format: a varint length before each message |
//! | `wire.rs` | protobuf's varints and fields, read and written by hand |
//! | `server/` | [`Centrifuge`]: the protocol served on a `PubSub` |

mod codes;
mod json;
mod messages;
mod protobuf;
mod server;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;

pub use codes::{disconnect, error, reconnects, unsubscribe};
pub use messages::{
    ClientInfo, Command, ConnectRequest, ConnectResult, Disconnect, Error, HistoryRequest,
    HistoryResult, Publication, Push, PushBody, RefreshResult, Reply, ReplyBody, Request,
    StreamPosition, SubscribeRequest, SubscribeResult,
};
pub use server::{
    Application, Centrifuge, ClientContext, JOIN_LEAVE_PREFIX, NoApplication, Options, Session,
    WEBSOCKET_PATH,
};

/// The most commands one frame may carry; the JS SDK batches a handful.
pub const MAX_COMMANDS: usize = 128;

/// The WebSocket subprotocol that picks the Protobuf format.
pub const PROTOBUF_SUBPROTOCOL: &str = "centrifuge-protobuf";

/// The two formats a connection speaks, chosen at the upgrade: Protobuf
/// when the client offers [`PROTOBUF_SUBPROTOCOL`], JSON otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Text frames, one JSON object a line; `data` is raw JSON.
    Json,
    /// Binary frames, each message behind its varint length.
    Protobuf,
}

impl Format {
    /// The commands in one frame's payload, in order; at most
    /// [`MAX_COMMANDS`]. A malformed frame is an error as a whole (the
    /// connection ends with [`disconnect::BAD_REQUEST`]).
    pub fn decode(self, frame: &[u8]) -> Result<Vec<Command>, DecodeError> {
        match self {
            Format::Json => {
                let text = std::str::from_utf8(frame)
                    .map_err(|_| DecodeError::Json("not UTF-8".into()))?;
                json::decode_commands(text)
            }
            Format::Protobuf => protobuf::decode_commands(frame),
        }
    }

    /// Appends a reply to a frame's payload (a newline before it in JSON if
    /// the frame holds one already). In JSON, every `data` must be valid
    /// JSON ([`is_json`]): it is written as it is.
    pub fn encode(self, out: &mut Vec<u8>, reply: &Reply) {
        match self {
            Format::Json => {
                if !out.is_empty() {
                    out.push(b'\n');
                }
                json::encode_reply(out, reply);
            }
            Format::Protobuf => protobuf::encode_reply(out, reply),
        }
    }

    /// One reply as a whole frame's payload.
    pub fn encode_one(self, reply: &Reply) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out, reply);
        out
    }
}

/// Whether `data` is one JSON value, as the JSON format needs every `data`.
pub fn is_json(data: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok()
}

/// Why a frame's commands could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// More than [`MAX_COMMANDS`] in one frame.
    TooManyCommands,
    /// A line is not a command in JSON.
    Json(String),
    /// The bytes are not commands in Protobuf.
    Protobuf(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooManyCommands => {
                write!(f, "more than {MAX_COMMANDS} commands in a frame")
            }
            DecodeError::Json(e) => write!(f, "bad JSON command: {e}"),
            DecodeError::Protobuf(e) => write!(f, "bad Protobuf command: {e}"),
        }
    }
}

impl std::error::Error for DecodeError {}
