//! One connection's commands, in the order they came (a frame may carry
//! several: the JS SDK sends connect and subscribe together). Each reply is
//! a frame of its own, queued before anything the command causes, so a
//! subscribe's reply (with the publications it recovered) reaches the wire
//! before the live pushes that follow it.

use std::hash::{BuildHasher, RandomState};

use bytes::Bytes;

use super::envelope::{message, publication_of};
use super::everywhere::stats;
use super::info;
use super::join_leave::{self, Kind, channel_ok};
use super::token::{Claims, TokenError, now_secs, verify};
use super::{Centrifuge, ClientContext, Session};
use crate::centrifuge::messages::{
    Command, ConnectResult, Error, HistoryRequest, HistoryResult, RefreshResult, Reply, ReplyBody,
    Request, SubscribeRequest, SubscribeResult,
};
use crate::centrifuge::{ClientInfo, Format, disconnect, error};
use crate::connection::conn::Conn;
use crate::proto::Message;
use crate::pubsub::{Epoch, Position, PubSubError, Start, Subscribe};

/// A close code: the command ends the connection.
pub(super) type Close = u16;

/// Why a token was not taken: the connection ends, or the command is
/// answered with an error.
pub(super) enum Checked {
    Close(Close),
    Refuse(Error),
}

/// A connect, subscribe or refresh result's `expires` and `ttl` (seconds
/// left).
pub(super) fn ttl_of(expires_at: u64) -> (bool, u32) {
    if expires_at == 0 {
        return (false, 0);
    }
    let left = expires_at.saturating_sub(now_secs());
    (true, u32::try_from(left).unwrap_or(u32::MAX))
}

impl Centrifuge {
    pub(super) fn handle_frame(
        &self,
        conn: &Conn,
        session: &mut Session,
        frame: &[u8],
    ) -> Result<(), Close> {
        let commands = session.format.decode(frame).map_err(|e| {
            tracing::debug!("centrifuge: {e}");
            disconnect::BAD_REQUEST
        })?;
        for command in commands {
            self.command(conn, session, command)?;
        }
        // After the frame's commands: a late sub_refresh still counts.
        self.expire_subscriptions(conn, session);
        Ok(())
    }

    fn command(&self, conn: &Conn, session: &mut Session, command: Command) -> Result<(), Close> {
        let id = command.id;
        if !session.connected && !matches!(command.request, Request::Connect(_)) {
            return Err(disconnect::BAD_REQUEST);
        }
        // A command that asks for a reply has an id; only pongs and sends
        // go without.
        let needs_id = !matches!(command.request, Request::Pong | Request::Send { .. });
        if needs_id && id == 0 {
            return Err(disconnect::BAD_REQUEST);
        }
        let body = match command.request {
            Request::Pong => {
                if let Some(slot) = &session.slot {
                    slot.pong();
                }
                return Ok(());
            }
            Request::Connect(connect) => {
                if session.connected {
                    return Err(disconnect::BAD_REQUEST);
                }
                let claims = match self.check_token(&connect.token) {
                    Ok(claims) => claims,
                    Err(Checked::Close(code)) => return Err(code),
                    Err(Checked::Refuse(error)) => {
                        reply(conn, session.format, Reply::error(id, error));
                        return Ok(());
                    }
                };
                session.connected = true;
                session.client = client_id(conn);
                session.user = claims.user;
                session.info = claims.info;
                if let Some(slot) = &session.slot {
                    slot.connected(claims.expires_at);
                }
                let (expires, ttl) = ttl_of(claims.expires_at);
                ReplyBody::Connect(ConnectResult {
                    client: session.client.clone(),
                    version: self.options.version.clone(),
                    ping: self.options.ping.as_secs() as u32,
                    pong: true,
                    expires,
                    ttl,
                    ..Default::default()
                })
            }
            Request::Subscribe(subscribe) => return self.subscribe(conn, session, id, subscribe),
            Request::Unsubscribe { channel } => {
                self.leave(conn, session, &channel);
                ReplyBody::Unsubscribe
            }
            Request::Publish { channel, data } => {
                if !self.options.client_publish {
                    ReplyBody::Error(Error::new(error::PERMISSION_DENIED))
                } else if !channel_ok(&channel) {
                    ReplyBody::Error(Error::new(error::BAD_REQUEST))
                } else {
                    // With its publisher, as Centrifugo publishes a
                    // client's publication.
                    let payload = info::publication(&info_in(session, &channel), &data);
                    self.pubsub.publish(&channel, Message::Binary(&payload));
                    ReplyBody::Publish
                }
            }
            Request::History(history) => self.history(session.format, history),
            Request::Presence { channel } | Request::PresenceStats { channel }
                if !self.options.presence || !session.channels.contains(&channel) =>
            {
                // Centrifugo's default: presence of channels one is in.
                let code = if self.options.presence {
                    error::PERMISSION_DENIED
                } else {
                    error::NOT_AVAILABLE
                };
                ReplyBody::Error(Error::new(code))
            }
            // Answered when every node's presence is in (with a bridge,
            // later, from its thread).
            Request::Presence { channel } => {
                let (conn, format) = (conn.clone(), session.format);
                self.presence_with(&channel, move |clients| {
                    let body = ReplyBody::Presence(clients);
                    reply(&conn, format, Reply { id, body });
                });
                return Ok(());
            }
            Request::PresenceStats { channel } => {
                let (conn, format) = (conn.clone(), session.format);
                self.presence_with(&channel, move |clients| {
                    let (num_clients, num_users) = stats(&clients);
                    let body = ReplyBody::PresenceStats {
                        num_clients,
                        num_users,
                    };
                    reply(&conn, format, Reply { id, body });
                });
                return Ok(());
            }
            Request::Refresh { token } if self.options.jwt_secret.is_some() => {
                let claims = match self.check_token(&token) {
                    Ok(claims) if claims.user == session.user && !token.is_empty() => claims,
                    Ok(_) => return Err(disconnect::INVALID_TOKEN),
                    Err(Checked::Close(code)) => return Err(code),
                    Err(Checked::Refuse(error)) => {
                        reply(conn, session.format, Reply::error(id, error));
                        return Ok(());
                    }
                };
                if let Some(slot) = &session.slot {
                    slot.connected(claims.expires_at);
                }
                let (expires, ttl) = ttl_of(claims.expires_at);
                ReplyBody::Refresh(RefreshResult {
                    client: session.client.clone(),
                    version: self.options.version.clone(),
                    expires,
                    ttl,
                })
            }
            Request::Refresh { .. } => ReplyBody::Error(Error::new(error::NOT_AVAILABLE)),
            Request::SubRefresh { channel, token } => {
                return self.sub_refresh(conn, session, id, channel, token);
            }
            Request::Ping => ReplyBody::Ping,
            Request::Send { data } => {
                self.options
                    .application
                    .send(&context(conn, session), &data);
                return Ok(());
            }
            Request::Rpc { method, data } => {
                match self
                    .options
                    .application
                    .rpc(&context(conn, session), &method, &data)
                {
                    Ok(data) => ReplyBody::Rpc { data },
                    Err(error) => ReplyBody::Error(error),
                }
            }
        };
        reply(conn, session.format, Reply { id, body });
        Ok(())
    }

    /// What a connect, refresh or subscribe token grants: an empty one is anonymous
    /// (if allowed), an expired one is answered with 109 (the SDK asks its
    /// application for a new one), a bad one closes with 3500.
    pub(super) fn check_token(&self, token: &str) -> Result<Claims, Checked> {
        if token.is_empty() {
            return if self.options.anonymous {
                Ok(Claims::default())
            } else {
                Err(Checked::Close(disconnect::INVALID_TOKEN))
            };
        }
        let Some(secret) = &self.options.jwt_secret else {
            return Err(Checked::Close(disconnect::INVALID_TOKEN));
        };
        match verify(token, secret, now_secs()) {
            Ok(claims) => Ok(claims),
            Err(TokenError::Expired) => Err(Checked::Refuse(Error::new(error::TOKEN_EXPIRED))),
            Err(TokenError::Invalid) => Err(Checked::Close(disconnect::INVALID_TOKEN)),
        }
    }

    /// Subscribes: the reply first (with what the client missed, if it
    /// recovers), then the subscription from the position the reply gave,
    /// so that whatever was published in between follows the reply. With a
    /// Redis bridge, what this node lacks of the channel's history is read
    /// from Redis first, so that a client recovers on any node.
    fn subscribe(
        &self,
        conn: &Conn,
        session: &mut Session,
        id: u32,
        request: SubscribeRequest,
    ) -> Result<(), Close> {
        let channel = &request.channel;
        if channel.is_empty() {
            return Err(disconnect::BAD_REQUEST);
        }
        let refuse = |error: Error| {
            reply(conn, session.format, Reply::error(id, error));
            Ok(())
        };
        if !channel_ok(channel) {
            return refuse(Error::new(error::BAD_REQUEST));
        }
        if session.channels.contains(channel) {
            return refuse(Error::new(error::ALREADY_SUBSCRIBED));
        }
        if session.channels.len() >= self.options.max_subscriptions {
            return refuse(Error::new(error::LIMIT_EXCEEDED));
        }
        // A subscription token: this user's, for this channel; its `exp`
        // the subscription's (refreshed with sub_refresh), its `info` the
        // channel info.
        let (expires_at, chan_info) = if request.token.is_empty() {
            (0, Bytes::new())
        } else {
            match self.check_token(&request.token) {
                Ok(claims) if claims.user == session.user && claims.channel == *channel => {
                    (claims.expires_at, claims.info)
                }
                Ok(_) => return Err(disconnect::INVALID_TOKEN),
                Err(Checked::Close(code)) => return Err(code),
                Err(Checked::Refuse(error)) => return refuse(error),
            }
        };
        let mut info = info_of(session);
        info.chan_info = chan_info.clone();
        let joining = Joining {
            id,
            format: session.format,
            info,
            expires_at,
            request,
        };
        #[cfg(feature = "redis")]
        if let Some(bridge) = &self.bridge {
            let start = match recovering_from(&joining.request) {
                Some(seen) => Start::After(seen),
                None => Start::Latest,
            };
            let (this, later, on) = (self.clone(), joining.clone(), conn.clone());
            let channel = joining.request.channel.clone();
            let loading = bridge.prepare(&channel, start, move || {
                // Answered from the bridge's thread: an error ends the
                // connection, as it would have here (and a refusal too,
                // the channel being counted as subscribed meanwhile).
                let reason = match this.join(&on, later) {
                    Ok(Joined::Yes | Joined::Closed) => return,
                    Ok(Joined::Refused) => disconnect::SERVER_ERROR,
                    Err(code) => code,
                };
                let why = crate::centrifuge::Disconnect::new(reason).reason;
                let _ = on.close(crate::proto::CloseCode(reason), &why);
            });
            if loading {
                session.grants.set(&channel, expires_at, chan_info);
                session.channels.insert(channel);
                return Ok(());
            }
        }
        let channel = joining.request.channel.clone();
        if self.join(conn, joining)? == Joined::Yes {
            session.grants.set(&channel, expires_at, chan_info);
            session.channels.insert(channel);
        }
        Ok(())
    }

    /// A subscribe, checked: its reply, and the subscription.
    fn join(&self, conn: &Conn, joining: Joining) -> Result<Joined, Close> {
        let Joining {
            id,
            format,
            info,
            expires_at,
            request,
        } = joining;
        let channel = request.channel.as_str();
        let (expires, ttl) = ttl_of(expires_at);
        let mut result = SubscribeResult {
            expires,
            ttl,
            ..Default::default()
        };
        let start = if self.pubsub.history(channel).is_on() {
            // The client's own position, if it resumes: an epoch that is
            // not one of ours recovers nothing.
            let seen = recovering_from(&request);
            let Some(kept) = self.pubsub.kept(channel, Some(seen.unwrap_or(NOWHERE))) else {
                reply(
                    conn,
                    format,
                    Reply::error(id, Error::new(error::LIMIT_EXCEEDED)),
                );
                return Ok(Joined::Refused);
            };
            result.recoverable = true;
            result.positioned = true;
            result.epoch = kept.position.epoch.to_string();
            result.offset = kept.position.offset;
            if request.recover {
                result.was_recovering = true;
                if kept.whole {
                    // As Centrifugo answers a recovery: the client's own
                    // position, and the publications that follow it.
                    result.recovered = true;
                    result.epoch = request.epoch.clone();
                    result.offset = request.offset;
                    result.publications = kept
                        .publications
                        .iter()
                        .map(|p| publication_of(format, p))
                        .collect();
                }
            }
            Start::After(kept.position)
        } else {
            Start::Now
        };
        reply(
            conn,
            format,
            Reply {
                id,
                body: ReplyBody::Subscribe(result),
            },
        );
        // Present before subscribed: a connection that ends meanwhile
        // (on another thread, when Redis was read first) takes it away,
        // or the failed subscribe below does.
        if self.options.presence {
            self.present(channel, &info);
        }
        let how = Subscribe::new()
            .start(start)
            .envelope(self.envelope(format));
        let ended = match self.pubsub.subscribe_with(conn, channel, &how) {
            // Lost between the read and the join (the history let go of
            // it, the epoch changed): the client reconnects and recovers.
            Ok(joined) if joined.recovered == Some(false) => Err(disconnect::INSUFFICIENT_STATE),
            Ok(_) => Ok(Joined::Yes),
            Err(PubSubError::Closed) => Ok(Joined::Closed),
            Err(_) => Err(disconnect::SERVER_ERROR),
        };
        if ended != Ok(Joined::Yes) {
            self.absent(channel, &info.client);
            return ended;
        }
        if self.options.join_leave {
            // Its own join too, as Centrifugo does: subscribed to the
            // events before the join goes out.
            if let Some(events) = join_leave::topic(channel).filter(|_| request.join_leave) {
                let how = Subscribe::new().envelope(self.join_envelope(format));
                if let Err(PubSubError::Closed) = self.pubsub.subscribe_with(conn, &events, &how) {
                    return Ok(Joined::Closed);
                }
            }
            self.announce(&info, channel, Kind::Join);
        }
        Ok(Joined::Yes)
    }

    /// Ends this session's subscription to `channel`, if it has one (and
    /// its join and leave events'), and tells the channel it left;
    /// whether it had one.
    pub(super) fn leave(&self, conn: &Conn, session: &mut Session, channel: &str) -> bool {
        if !session.channels.remove(channel) {
            return false;
        }
        let who = info_in(session, channel);
        session.grants.forget(channel);
        self.pubsub.unsubscribe(conn, channel);
        if let Some(events) = join_leave::topic(channel) {
            self.pubsub.unsubscribe(conn, &events);
        }
        self.absent(channel, &session.client);
        self.announce(&who, channel, Kind::Leave);
        true
    }

    /// Tells `channel`'s subscribers that ask that this client joined or
    /// left it (when the server pushes joins and leaves).
    pub(super) fn announce(&self, who: &ClientInfo, channel: &str, kind: Kind) {
        if !self.options.join_leave {
            return;
        }
        if let Some(events) = join_leave::topic(channel) {
            let event = join_leave::encode(kind, who);
            self.pubsub.publish(&events, Message::Binary(&event));
        }
    }

    pub(super) fn history(&self, format: Format, request: HistoryRequest) -> ReplyBody {
        if !channel_ok(&request.channel) {
            return ReplyBody::Error(Error::new(error::BAD_REQUEST));
        }
        if !self.pubsub.history(&request.channel).is_on() {
            return ReplyBody::Error(Error::new(error::NOT_AVAILABLE));
        }
        let since = request.since.as_ref().map(|since| Position {
            epoch: epoch_of(&since.epoch),
            offset: since.offset,
        });
        let Some(kept) = self.pubsub.kept(&request.channel, since) else {
            return ReplyBody::Error(Error::new(error::INTERNAL));
        };
        if !kept.whole {
            return ReplyBody::Error(Error::new(error::UNRECOVERABLE_POSITION));
        }
        let limit = usize::try_from(request.limit).unwrap_or(usize::MAX);
        let mut publications: Vec<_> = if request.reverse {
            kept.publications
                .iter()
                .rev()
                .take(limit)
                .map(|p| publication_of(format, p))
                .collect()
        } else {
            kept.publications
                .iter()
                .take(limit)
                .map(|p| publication_of(format, p))
                .collect()
        };
        publications.shrink_to_fit();
        ReplyBody::History(HistoryResult {
            publications,
            epoch: kept.position.epoch.to_string(),
            offset: kept.position.offset,
        })
    }
}

/// A subscribe that passed its checks, with what answering it needs
/// (on another thread, when Redis is read first).
#[derive(Clone)]
struct Joining {
    id: u32,
    format: Format,
    info: ClientInfo,
    /// When its token expires (Unix seconds; 0: never).
    expires_at: u64,
    request: SubscribeRequest,
}

/// How a checked subscribe ended.
#[derive(Debug, PartialEq, Eq)]
enum Joined {
    Yes,
    /// Answered with an error (no room for the channel).
    Refused,
    /// The connection ended first.
    Closed,
}

/// A client's epoch: one that does not read is no epoch of ours (0).
fn epoch_of(text: &str) -> Epoch {
    text.parse().unwrap_or(Epoch::from_u64(0))
}

/// Where a subscribe recovers from: the client's last position, if it
/// asks to recover.
fn recovering_from(request: &SubscribeRequest) -> Option<Position> {
    request.recover.then(|| Position {
        epoch: epoch_of(&request.epoch),
        offset: request.offset,
    })
}

/// A position in no epoch: `kept` answers the top and nothing else.
const NOWHERE: Position = Position {
    epoch: Epoch::from_u64(0),
    offset: u64::MAX,
};

pub(super) fn reply(conn: &Conn, format: Format, reply: Reply) {
    let _ = match message(format, format.encode_one(&reply)) {
        crate::proto::OwnedMessage::Text(text) => conn.send(Message::Text(&text)),
        crate::proto::OwnedMessage::Binary(data) => conn.send(Message::Binary(&data)),
    };
}

/// Who the session's client is, as presence and join pushes show it.
pub(super) fn info_of(session: &Session) -> ClientInfo {
    ClientInfo {
        user: session.user.clone(),
        client: session.client.clone(),
        conn_info: session.info.clone(),
        chan_info: Default::default(),
    }
}

/// Who the session's client is in `channel`: with the channel info its
/// subscription token gave it.
pub(super) fn info_in(session: &Session, channel: &str) -> ClientInfo {
    ClientInfo {
        chan_info: session.grants.chan_info(channel),
        ..info_of(session)
    }
}

fn context<'a>(conn: &'a Conn, session: &'a Session) -> ClientContext<'a> {
    ClientContext {
        conn,
        client: &session.client,
        user: &session.user,
        channels: &session.channels,
    }
}

/// A client id in the shape of a UUID: random, and unique in the process
/// (its connection's id is in it).
fn client_id(conn: &Conn) -> String {
    let random = RandomState::new().hash_one(conn.id());
    let id = conn.id();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        random >> 32,
        (random >> 16) & 0xffff,
        random & 0xfff,
        0x8000 | (id >> 48) as u16 & 0x3fff,
        id & 0xffff_ffff_ffff
    )
}
