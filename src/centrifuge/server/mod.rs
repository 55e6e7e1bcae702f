//! Centrifugo's client protocol served on a [`PubSub`]: a [`ServerHandler`]
//! that Centrifugo's SDKs connect to unchanged, at `/connection/websocket`,
//! in JSON or Protobuf (`centrifuge-protobuf`).
//!
//! | file | concern |
//! |---|---|
//! | `mod.rs` | [`Centrifuge`], [`Options`], [`Application`]: the handler and what it is told |
//! | `api.rs` | the server HTTP API: `POST /api/publish`, `broadcast`, `history` |
//! | `presence.rs` | who is subscribed to each channel here |
//! | `everywhere.rs` | presence on every node, through the Redis bridge |
//! | `join_leave.rs` | join and leave pushes, on a companion topic of each channel |
//! | `session.rs` | one connection's commands: connect, subscribe (with recovery), publish, history... |
//! | `sub_tokens.rs` | subscription tokens: what they grant, `sub_refresh`, expiry |
//! | `envelope.rs` | a publication as a push, encoded once per format |
//! | `info.rs` | a publication's publisher, carried in its payload |
//! | `pinger.rs` | the server's pings and the clients' pongs, expiry |
//! | `token.rs` | connection and subscription tokens: JWT, HS256 |

mod api;
mod envelope;
mod everywhere;
mod info;
mod join_leave;
mod pinger;
mod presence;
mod session;
mod sub_tokens;
mod token;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::messages::Error;
use super::{Format, PROTOBUF_SUBPROTOCOL, error};
use crate::connection::conn::Conn;
use crate::connection::handler::{Accept, Handler, HttpResponse, Reject, ServerHandler};
use crate::handshake::Request;
use crate::proto::{CloseCode, Message};
use crate::pubsub::{Envelope, PubSub};
use pinger::{Pinger, Slot};

pub use join_leave::JOIN_LEAVE_PREFIX;

/// The path Centrifugo's SDKs connect to.
pub const WEBSOCKET_PATH: &str = "/connection/websocket";

/// What the application decides for the protocol's open-ended commands.
/// Every method has a default: no RPC methods, sends ignored.
pub trait Application: Send + Sync + 'static {
    /// An `rpc` command: its result's data, or the error to answer.
    fn rpc(&self, client: &ClientContext<'_>, method: &str, data: &[u8]) -> Result<Bytes, Error> {
        let _ = (client, method, data);
        Err(Error::new(error::METHOD_NOT_FOUND))
    }

    /// A `send` command (no reply is sent).
    fn send(&self, client: &ClientContext<'_>, data: &[u8]) {
        let _ = (client, data);
    }
}

/// No application: the defaults.
pub struct NoApplication;

impl Application for NoApplication {}

/// Who sent a command.
#[derive(Debug)]
pub struct ClientContext<'a> {
    /// The connection.
    pub conn: &'a Conn,
    /// The client id the connect reply gave it.
    pub client: &'a str,
    /// Its user (empty when anonymous).
    pub user: &'a str,
    /// The channels it is subscribed to.
    pub channels: &'a HashSet<String>,
}

/// How the handler serves.
#[derive(Clone)]
pub struct Options {
    ping: Duration,
    client_publish: bool,
    max_subscriptions: usize,
    version: String,
    api_key: Option<String>,
    jwt_secret: Option<Vec<u8>>,
    anonymous: bool,
    presence: bool,
    join_leave: bool,
    expired_grace: Duration,
    expired_sub_grace: Duration,
    application: Arc<dyn Application>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            ping: Duration::from_secs(25),
            client_publish: false,
            max_subscriptions: 128,
            version: format!("rapidws {}", env!("CARGO_PKG_VERSION")),
            api_key: None,
            jwt_secret: None,
            anonymous: true,
            presence: false,
            join_leave: false,
            expired_grace: Duration::from_secs(25),
            expired_sub_grace: Duration::from_secs(25),
            application: Arc::new(NoApplication),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("ping", &self.ping)
            .field("client_publish", &self.client_publish)
            .field("max_subscriptions", &self.max_subscriptions)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// Anonymous connections, a ping every 25 seconds, no client
    /// publishes, at most 128 subscriptions a connection.
    pub fn new() -> Options {
        Options::default()
    }

    /// How often the server pings (the connect reply's `ping`, in whole
    /// seconds, at least one). A client that has not answered one ping by
    /// the next is closed with 3012.
    pub fn ping(mut self, every: Duration) -> Options {
        self.ping = every.max(Duration::from_secs(1));
        self
    }

    /// Whether clients may publish to channels (Centrifugo's
    /// `allow_publish_for_client`); refused with 103 otherwise.
    pub fn client_publish(mut self, allow: bool) -> Options {
        self.client_publish = allow;
        self
    }

    /// The most channels one connection may subscribe to (106 past it).
    pub fn max_subscriptions(mut self, count: usize) -> Options {
        self.max_subscriptions = count;
        self
    }

    /// The version the connect reply names.
    pub fn version(mut self, version: impl Into<String>) -> Options {
        self.version = version.into();
        self
    }

    /// Serves the server HTTP API (`POST /api/<method>`) to requests that
    /// carry this key; without one, there is no API.
    pub fn api_key(mut self, key: impl Into<String>) -> Options {
        self.api_key = Some(key.into());
        self
    }

    /// Takes connection tokens: JWTs signed with HS256 and `secret`, whose
    /// `sub` is the user, `exp` when the connection expires unless the
    /// client refreshes it, `info` the client's info.
    pub fn jwt_secret(mut self, secret: impl Into<Vec<u8>>) -> Options {
        self.jwt_secret = Some(secret.into());
        self
    }

    /// Whether a client may connect without a token (default true);
    /// refused with 3500 otherwise.
    pub fn anonymous(mut self, allow: bool) -> Options {
        self.anonymous = allow;
        self
    }

    /// Whether subscribers may ask who else is subscribed (`presence`,
    /// `presence_stats`, of channels they are in); 108 (not available)
    /// otherwise, as the API answers too. With a [`Centrifuge::bridge`],
    /// every node's clients are answered, as Redis has them (see
    /// [`Bridge::join_member`](crate::pubsub::redis::Bridge::join_member)):
    /// a node that dies drops out within 15 s, and when Redis does not
    /// answer within the bridge's timeout, this node's clients are.
    pub fn presence(mut self, on: bool) -> Options {
        self.presence = on;
        self
    }

    /// Whether a client's subscribing and leaving is pushed to the
    /// channel's subscribers that ask for it (`join_leave` in their
    /// subscribe, as the SDKs' `joinLeave` option sends), on every node
    /// the `PubSub` reaches (Centrifugo's `join_leave`). The events travel
    /// on topics under [`JOIN_LEAVE_PREFIX`]; give those no history.
    pub fn join_leave(mut self, on: bool) -> Options {
        self.join_leave = on;
        self
    }

    /// How long a connection whose token expired may stay before it is
    /// closed with 3005, waiting for its refresh (default 25 seconds, as
    /// Centrifugo waits).
    pub fn expired_grace(mut self, grace: Duration) -> Options {
        self.expired_grace = grace;
        self
    }

    /// How long past its token's expiry a subscription may stay, waiting
    /// for its `sub_refresh`, before the server unsubscribes it (an
    /// unsubscribe push with 2501, subscription expired; the connection
    /// stays). Default 25 seconds, as Centrifugo waits; counted in whole
    /// seconds, and noticed at the client's next frame (its pong to the
    /// next ping at the latest).
    pub fn expired_sub_grace(mut self, grace: Duration) -> Options {
        self.expired_sub_grace = grace;
        self
    }

    /// The application's side of RPC and sends.
    pub fn application(mut self, application: Arc<dyn Application>) -> Options {
        self.application = application;
        self
    }
}

/// The handler: serves Centrifugo's client protocol on `pubsub`, whose
/// history (`Builder::history`) makes channels recoverable. Give the
/// `PubSub` [`Overflow::Close`] with 3008 (slow), as Centrifugo closes a
/// client it cannot keep up with: a dropped publication would leave a hole
/// the client cannot see; closed, it reconnects and recovers.
///
/// [`Overflow::Close`]: crate::pubsub::Overflow::Close
#[derive(Clone)]
pub struct Centrifuge {
    pubsub: PubSub,
    options: Options,
    pinger: Arc<Pinger>,
    presence: Arc<presence::Presence>,
    /// Reads what this node lacks of a channel's history from Redis
    /// before a subscribe is answered.
    #[cfg(feature = "redis")]
    bridge: Option<Arc<crate::pubsub::redis::Bridge>>,
    /// One envelope per format, shared by every subscription.
    json: Arc<dyn Envelope>,
    protobuf: Arc<dyn Envelope>,
    /// The same for join and leave pushes.
    json_joins: Arc<dyn Envelope>,
    protobuf_joins: Arc<dyn Envelope>,
}

impl std::fmt::Debug for Centrifuge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Centrifuge")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Centrifuge {
    /// Serves on `pubsub` as `options` say; starts the ping thread.
    pub fn new(pubsub: PubSub, options: Options) -> Centrifuge {
        let events = format!("{JOIN_LEAVE_PREFIX}channel");
        if options.join_leave && pubsub.history(&events).is_on() {
            tracing::warn!(
                "centrifuge: join and leave events are kept in history; give topics under JOIN_LEAVE_PREFIX History::OFF"
            );
        }
        Centrifuge {
            pinger: Pinger::start(options.ping, options.expired_grace),
            presence: Default::default(),
            #[cfg(feature = "redis")]
            bridge: None,
            pubsub,
            options,
            json: Arc::new(envelope::Pushes(Format::Json)),
            protobuf: Arc::new(envelope::Pushes(Format::Protobuf)),
            json_joins: Arc::new(join_leave::Pushes(Format::Json)),
            protobuf_joins: Arc::new(join_leave::Pushes(Format::Protobuf)),
        }
    }

    /// Serves many nodes through `bridge` (started on this handler's
    /// `PubSub`): a client that comes back on another node recovers there,
    /// from the history Redis keeps; a fresh subscribe gets the channel's
    /// position in Redis, the same on every node; presence answers with
    /// every node's clients. The handler keeps the bridge running.
    #[cfg(feature = "redis")]
    pub fn bridge(mut self, bridge: crate::pubsub::redis::Bridge) -> Centrifuge {
        self.bridge = Some(Arc::new(bridge));
        self
    }

    /// The pub/sub it serves on (to publish from the application).
    pub fn pubsub(&self) -> &PubSub {
        &self.pubsub
    }

    fn envelope(&self, format: Format) -> Arc<dyn Envelope> {
        match format {
            Format::Json => self.json.clone(),
            Format::Protobuf => self.protobuf.clone(),
        }
    }

    fn join_envelope(&self, format: Format) -> Arc<dyn Envelope> {
        match format {
            Format::Json => self.json_joins.clone(),
            Format::Protobuf => self.protobuf_joins.clone(),
        }
    }
}

/// One connection's state.
pub struct Session {
    format: Format,
    client: String,
    user: String,
    /// The `info` of its token.
    info: Bytes,
    connected: bool,
    channels: HashSet<String>,
    /// What its subscription tokens granted: expiry, channel info.
    grants: sub_tokens::Grants,
    slot: Option<Arc<Slot>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("format", &self.format)
            .field("client", &self.client)
            .field("user", &self.user)
            .field("channels", &self.channels)
            .finish_non_exhaustive()
    }
}

impl Handler for Centrifuge {
    type State = Session;

    fn on_open(&self, conn: &Conn, session: &mut Session) {
        session.slot = Some(self.pinger.add(conn, session.format));
    }

    fn on_message(&self, conn: &Conn, session: &mut Session, message: Message<'_>) {
        if let Err(code) = self.handle_frame(conn, session, message.as_bytes()) {
            let reason = super::Disconnect::new(code).reason;
            let _ = conn.close(CloseCode(code), &reason);
        }
    }

    fn on_close(&self, conn: &Conn, session: &mut Session, _: CloseCode, _: &str) {
        self.pinger.remove(conn);
        for channel in &session.channels {
            self.absent(channel, &session.client);
            self.announce(
                &session::info_in(session, channel),
                channel,
                join_leave::Kind::Leave,
            );
        }
    }
}

impl ServerHandler for Centrifuge {
    fn on_upgrade(&self, request: &Request<'_>, accept: &mut Accept) -> Result<Session, Reject> {
        if request.path() != WEBSOCKET_PATH {
            return Err(Reject::not_found(
                "Centrifugo's WebSocket is at /connection/websocket",
            ));
        }
        let format = if request.protocols().any(|p| p == PROTOBUF_SUBPROTOCOL) {
            accept.protocol(PROTOBUF_SUBPROTOCOL);
            Format::Protobuf
        } else {
            Format::Json
        };
        Ok(Session {
            format,
            client: String::new(),
            user: String::new(),
            info: Bytes::new(),
            connected: false,
            channels: HashSet::new(),
            grants: Default::default(),
            slot: None,
        })
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        self.api(request)
    }
}
