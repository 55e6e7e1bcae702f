//! The protocol's messages as Rust values: what a client commands, what the
//! server replies and pushes. Field names follow Centrifugo's `client.proto`;
//! `data` fields are the application's payload, raw JSON in the JSON format
//! and any bytes in Protobuf.

// The fields are the protocol's, named as `client.proto` names them; the
// types' docs say what they mean together.
#![allow(missing_docs)]

use bytes::Bytes;

/// One command from a client: its `id` (0 for none) and what it asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Matches the reply to the command; 0 asks for no reply.
    pub id: u32,
    /// The request: the first one the command carries, in the protocol's
    /// field order (connect, subscribe, ...), as Centrifugo takes it.
    pub request: Request,
}

/// What a command asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// An empty command (`{}`): the client's answer to a server ping.
    Pong,
    Connect(ConnectRequest),
    Subscribe(SubscribeRequest),
    Unsubscribe {
        channel: String,
    },
    Publish {
        channel: String,
        data: Bytes,
    },
    Presence {
        channel: String,
    },
    PresenceStats {
        channel: String,
    },
    History(HistoryRequest),
    /// `ping` asks for a `ping` reply (a client that measures latency).
    Ping,
    /// A message to the server that gets no reply.
    Send {
        data: Bytes,
    },
    Rpc {
        method: String,
        data: Bytes,
    },
    Refresh {
        token: String,
    },
    SubRefresh {
        channel: String,
        token: String,
    },
}

impl Request {
    /// The method's name as Centrifugo's docs and errors spell it.
    pub fn method(&self) -> &'static str {
        match self {
            Request::Pong => "pong",
            Request::Connect(_) => "connect",
            Request::Subscribe(_) => "subscribe",
            Request::Unsubscribe { .. } => "unsubscribe",
            Request::Publish { .. } => "publish",
            Request::Presence { .. } => "presence",
            Request::PresenceStats { .. } => "presence_stats",
            Request::History(_) => "history",
            Request::Ping => "ping",
            Request::Send { .. } => "send",
            Request::Rpc { .. } => "rpc",
            Request::Refresh { .. } => "refresh",
            Request::SubRefresh { .. } => "sub_refresh",
        }
    }
}

/// `connect`: the client's token (empty when anonymous), its own data, and
/// subscriptions to make at once (`subs`, by channel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectRequest {
    pub token: String,
    pub data: Bytes,
    pub subs: Vec<(String, SubscribeRequest)>,
    pub name: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
}

/// `subscribe`: the channel, its token, and where to recover from (`recover`
/// with `epoch` and `offset`: the last publication the client had).
/// Fields this crate does not serve (delta, filters, map subscriptions) are
/// read past, as Centrifugo ignores flags it does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub channel: String,
    pub token: String,
    pub recover: bool,
    pub epoch: String,
    pub offset: u64,
    pub data: Bytes,
    pub positioned: bool,
    pub recoverable: bool,
    pub join_leave: bool,
}

/// `history`: up to `limit` publications (0: none, only the stream's top;
/// negative: all kept), after `since` if given, newest first if `reverse`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryRequest {
    pub channel: String,
    pub limit: i32,
    pub since: Option<StreamPosition>,
    pub reverse: bool,
}

/// A place in a channel's stream: Centrifugo's epoch (a string naming one
/// life of the stream) and offset (the publication's number in it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamPosition {
    pub offset: u64,
    pub epoch: String,
}

/// An error in a reply (`code` from [`error`](super::error)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: u32,
    pub message: String,
    /// The client may retry the command.
    pub temporary: bool,
}

/// One message from the server: a reply to command `id`, or a push (id 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub id: u32,
    pub body: ReplyBody,
}

impl Reply {
    /// A push: a reply with no id.
    pub fn push(push: Push) -> Reply {
        Reply {
            id: 0,
            body: ReplyBody::Push(push),
        }
    }

    /// An error answering command `id`.
    pub fn error(id: u32, error: Error) -> Reply {
        Reply {
            id,
            body: ReplyBody::Error(error),
        }
    }
}

/// What a reply carries: an error, a push, or the result of its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    Error(Error),
    Push(Push),
    Connect(ConnectResult),
    Subscribe(SubscribeResult),
    Unsubscribe,
    Publish,
    Presence(Vec<(String, ClientInfo)>),
    PresenceStats { num_clients: u32, num_users: u32 },
    History(HistoryResult),
    Ping,
    Rpc { data: Bytes },
    Refresh(RefreshResult),
    SubRefresh { expires: bool, ttl: u32 },
}

/// The connect reply: the client's id, the server's version, when the
/// connection expires, and the ping interval (`ping` seconds; `pong`: the
/// server wants the client's empty command back).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectResult {
    pub client: String,
    pub version: String,
    pub expires: bool,
    pub ttl: u32,
    pub data: Bytes,
    pub subs: Vec<(String, SubscribeResult)>,
    pub ping: u32,
    pub pong: bool,
    pub session: String,
    pub node: String,
}

/// The subscribe reply: whether the channel keeps a stream (`recoverable`,
/// `positioned`) and its position (`epoch`, `offset`), and for a client that
/// came back (`was_recovering`) whether it got all it missed (`recovered`)
/// and the missed publications, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeResult {
    pub expires: bool,
    pub ttl: u32,
    pub recoverable: bool,
    pub epoch: String,
    pub publications: Vec<Publication>,
    pub recovered: bool,
    pub offset: u64,
    pub positioned: bool,
    pub data: Bytes,
    pub was_recovering: bool,
}

/// The history reply: the publications and the stream's top position.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryResult {
    pub publications: Vec<Publication>,
    pub epoch: String,
    pub offset: u64,
}

/// The refresh reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefreshResult {
    pub client: String,
    pub version: String,
    pub expires: bool,
    pub ttl: u32,
}

/// Who a connection is: its user (empty when anonymous), its client id,
/// and the JSON the connection token and the channel gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub user: String,
    pub client: String,
    pub conn_info: Bytes,
    pub chan_info: Bytes,
}

/// A publication in a channel: its payload, its publisher (when a client
/// published it), its offset in the channel's stream, and its tags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Publication {
    pub data: Bytes,
    pub info: Option<ClientInfo>,
    pub offset: u64,
    pub tags: Vec<(String, String)>,
    /// Unix milliseconds; 0 leaves it out.
    pub time: i64,
}

/// A push: something the server sends about a channel (or the
/// connection), unasked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub channel: String,
    pub body: PushBody,
}

/// What a push carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushBody {
    Pub(Publication),
    Join(ClientInfo),
    Leave(ClientInfo),
    /// The server ended the subscription.
    Unsubscribe {
        code: u32,
        reason: String,
    },
    /// A message to this client alone.
    Message {
        data: Bytes,
    },
    /// A subscription the server made for the client.
    Subscribe {
        recoverable: bool,
        epoch: String,
        offset: u64,
        positioned: bool,
        data: Bytes,
    },
    Disconnect(Disconnect),
    Refresh {
        expires: bool,
        ttl: u32,
    },
}

/// Why the server ends a connection. Over a WebSocket Centrifugo sends it as
/// the close frame's code and reason; the push exists for transports that
/// have no close frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnect {
    pub code: u32,
    pub reason: String,
    pub reconnect: bool,
}
