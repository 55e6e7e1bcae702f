//! The JSON format: a text frame holds commands (or replies), one JSON
//! object a line. `data` fields are raw JSON, taken and given as they are
//! (serde_json's `RawValue` checks them and keeps their text); replies are
//! written by hand, so that which fields are left out when empty matches
//! Centrifugo's encoder field by field.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::messages::{
    ClientInfo, Command, ConnectRequest, ConnectResult, HistoryRequest, HistoryResult, Publication,
    Push, PushBody, Reply, ReplyBody, Request, StreamPosition, SubscribeRequest, SubscribeResult,
};
use super::{DecodeError, MAX_COMMANDS};

/// The commands in one text frame, in order; blank lines are skipped.
pub(super) fn decode_commands(frame: &str) -> Result<Vec<Command>, DecodeError> {
    let mut commands = Vec::new();
    for line in frame.split('\n') {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // serde's derived structs take an array too; a command is an object.
        if !line.starts_with('{') {
            return Err(DecodeError::Json("a command is not an object".into()));
        }
        if commands.len() == MAX_COMMANDS {
            return Err(DecodeError::TooManyCommands);
        }
        let wire: WireCommand<'_> =
            serde_json::from_str(line).map_err(|e| DecodeError::Json(e.to_string()))?;
        commands.push(wire.into_command());
    }
    Ok(commands)
}

fn raw(value: Option<&RawValue>) -> Bytes {
    value.map_or_else(Bytes::new, |v| Bytes::copy_from_slice(v.get().as_bytes()))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCommand<'a> {
    id: u32,
    #[serde(borrow)]
    connect: Option<WireConnect<'a>>,
    #[serde(borrow)]
    subscribe: Option<WireSubscribe<'a>>,
    unsubscribe: Option<WireChannel>,
    #[serde(borrow)]
    publish: Option<WireData<'a>>,
    presence: Option<WireChannel>,
    presence_stats: Option<WireChannel>,
    history: Option<WireHistory>,
    ping: Option<IgnoredAny>,
    #[serde(borrow)]
    send: Option<WireData<'a>>,
    #[serde(borrow)]
    rpc: Option<WireData<'a>>,
    refresh: Option<WireToken>,
    sub_refresh: Option<WireToken>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireConnect<'a> {
    token: String,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    subs: BTreeMap<String, WireSubscribe<'a>>,
    name: String,
    version: String,
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireSubscribe<'a> {
    channel: String,
    token: String,
    recover: bool,
    epoch: String,
    offset: u64,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    positioned: bool,
    recoverable: bool,
    join_leave: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireChannel {
    channel: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireToken {
    channel: String,
    token: String,
}

/// publish, send and rpc: a channel or a method, and data.
#[derive(Deserialize, Default)]
#[serde(default)]
struct WireData<'a> {
    channel: String,
    method: String,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireHistory {
    channel: String,
    limit: i32,
    since: Option<WirePosition>,
    reverse: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WirePosition {
    offset: u64,
    epoch: String,
}

impl WireSubscribe<'_> {
    fn into_request(self) -> SubscribeRequest {
        SubscribeRequest {
            channel: self.channel,
            token: self.token,
            recover: self.recover,
            epoch: self.epoch,
            offset: self.offset,
            data: raw(self.data),
            positioned: self.positioned,
            recoverable: self.recoverable,
            join_leave: self.join_leave,
        }
    }
}

impl WireCommand<'_> {
    /// The first request present, in the protocol's field order.
    fn into_command(self) -> Command {
        let request = if let Some(c) = self.connect {
            Request::Connect(ConnectRequest {
                token: c.token,
                data: raw(c.data),
                subs: c
                    .subs
                    .into_iter()
                    .map(|(k, s)| (k, s.into_request()))
                    .collect(),
                name: c.name,
                version: c.version,
                headers: c.headers.into_iter().collect(),
            })
        } else if let Some(s) = self.subscribe {
            Request::Subscribe(s.into_request())
        } else if let Some(u) = self.unsubscribe {
            Request::Unsubscribe { channel: u.channel }
        } else if let Some(p) = self.publish {
            Request::Publish {
                channel: p.channel,
                data: raw(p.data),
            }
        } else if let Some(p) = self.presence {
            Request::Presence { channel: p.channel }
        } else if let Some(p) = self.presence_stats {
            Request::PresenceStats { channel: p.channel }
        } else if let Some(h) = self.history {
            Request::History(HistoryRequest {
                channel: h.channel,
                limit: h.limit,
                since: h.since.map(|p| StreamPosition {
                    offset: p.offset,
                    epoch: p.epoch,
                }),
                reverse: h.reverse,
            })
        } else if self.ping.is_some() {
            Request::Ping
        } else if let Some(s) = self.send {
            Request::Send { data: raw(s.data) }
        } else if let Some(r) = self.rpc {
            Request::Rpc {
                method: r.method,
                data: raw(r.data),
            }
        } else if let Some(r) = self.refresh {
            Request::Refresh { token: r.token }
        } else if let Some(r) = self.sub_refresh {
            Request::SubRefresh {
                channel: r.channel,
                token: r.token,
            }
        } else {
            Request::Pong
        };
        Command {
            id: self.id,
            request,
        }
    }
}

/// Writes a JSON object's fields, a comma before each but the first.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn open(out: &'a mut Vec<u8>) -> Object<'a> {
        out.push(b'{');
        Object { out, first: true }
    }

    fn key(&mut self, name: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        string(self.out, name);
        self.out.push(b':');
        self.out
    }

    fn str(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.str_always(name, value);
        }
    }

    fn str_always(&mut self, name: &str, value: &str) {
        string(self.key(name), value);
    }

    fn u64(&mut self, name: &str, value: u64) {
        if value != 0 {
            self.u64_always(name, value);
        }
    }

    fn u64_always(&mut self, name: &str, value: u64) {
        let out = self.key(name);
        out.extend_from_slice(value.to_string().as_bytes());
    }

    fn i64(&mut self, name: &str, value: i64) {
        if value != 0 {
            let out = self.key(name);
            out.extend_from_slice(value.to_string().as_bytes());
        }
    }

    fn bool(&mut self, name: &str, value: bool) {
        if value {
            self.key(name).extend_from_slice(b"true");
        }
    }

    /// Raw JSON, left out when empty. Its newlines go: a newline ends a
    /// message in the frame, and in valid JSON it is only whitespace.
    fn raw(&mut self, name: &str, value: &[u8]) {
        if !value.is_empty() {
            let out = self.key(name);
            out.extend(value.iter().copied().filter(|&b| b != b'\n'));
        }
    }

    fn object(&mut self, name: &str, body: impl FnOnce(&mut Object<'_>)) {
        let out = self.key(name);
        let mut inner = Object::open(out);
        body(&mut inner);
        inner.out.push(b'}');
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// A JSON string: quotes, backslashes and control characters escaped.
fn string(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    for &b in value.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 15)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Appends one reply (one line, without its newline).
pub(super) fn encode_reply(out: &mut Vec<u8>, reply: &Reply) {
    let mut o = Object::open(out);
    o.u64("id", reply.id.into());
    match &reply.body {
        ReplyBody::Error(e) => o.object("error", |o| {
            o.u64("code", e.code.into());
            o.str("message", &e.message);
            o.bool("temporary", e.temporary);
        }),
        ReplyBody::Push(p) => o.object("push", |o| push(o, p)),
        ReplyBody::Connect(c) => o.object("connect", |o| connect_result(o, c)),
        ReplyBody::Subscribe(s) => o.object("subscribe", |o| subscribe_result(o, s)),
        ReplyBody::Unsubscribe => o.object("unsubscribe", |_| {}),
        ReplyBody::Publish => o.object("publish", |_| {}),
        ReplyBody::Presence(clients) => o.object("presence", |o| {
            o.object("presence", |o| {
                for (id, info) in clients {
                    o.object(id, |o| client_info(o, info));
                }
            })
        }),
        ReplyBody::PresenceStats {
            num_clients,
            num_users,
        } => o.object("presence_stats", |o| {
            o.u64_always("num_clients", (*num_clients).into());
            o.u64_always("num_users", (*num_users).into());
        }),
        ReplyBody::History(h) => o.object("history", |o| {
            publications(o, "publications", &h.publications, true);
            o.str_always("epoch", &h.epoch);
            o.u64_always("offset", h.offset);
        }),
        ReplyBody::Ping => o.object("ping", |_| {}),
        ReplyBody::Rpc { data } => o.object("rpc", |o| o.raw("data", data)),
        ReplyBody::Refresh(r) => o.object("refresh", |o| {
            o.str("client", &r.client);
            o.str("version", &r.version);
            o.bool("expires", r.expires);
            o.u64("ttl", r.ttl.into());
        }),
        ReplyBody::SubRefresh { expires, ttl } => o.object("sub_refresh", |o| {
            o.bool("expires", *expires);
            o.u64("ttl", (*ttl).into());
        }),
    }
    o.close();
}

/// A history result as an object of its own (the server API's `result`).
pub(super) fn encode_history(out: &mut Vec<u8>, h: &HistoryResult) {
    let mut o = Object::open(out);
    publications(&mut o, "publications", &h.publications, true);
    o.str_always("epoch", &h.epoch);
    o.u64_always("offset", h.offset);
    o.close();
}

/// A presence result as an object of its own (the server API's `result`).
pub(super) fn encode_presence(out: &mut Vec<u8>, clients: &[(String, ClientInfo)]) {
    let mut o = Object::open(out);
    o.object("presence", |o| {
        for (id, info) in clients {
            o.object(id, |o| client_info(o, info));
        }
    });
    o.close();
}

fn publications(o: &mut Object<'_>, name: &str, list: &[Publication], always: bool) {
    if list.is_empty() && !always {
        return;
    }
    let out = o.key(name);
    out.push(b'[');
    for (i, p) in list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut inner = Object::open(out);
        publication(&mut inner, p);
        inner.close();
    }
    out.push(b']');
}

fn connect_result(o: &mut Object<'_>, c: &ConnectResult) {
    o.str("client", &c.client);
    o.str("version", &c.version);
    o.bool("expires", c.expires);
    o.u64("ttl", c.ttl.into());
    o.raw("data", &c.data);
    if !c.subs.is_empty() {
        o.object("subs", |o| {
            for (channel, sub) in &c.subs {
                o.object(channel, |o| subscribe_result(o, sub));
            }
        });
    }
    o.u64("ping", c.ping.into());
    o.bool("pong", c.pong);
    o.str("session", &c.session);
    o.str("node", &c.node);
}

fn subscribe_result(o: &mut Object<'_>, s: &SubscribeResult) {
    o.bool("expires", s.expires);
    o.u64("ttl", s.ttl.into());
    o.bool("recoverable", s.recoverable);
    o.str("epoch", &s.epoch);
    publications(o, "publications", &s.publications, false);
    o.bool("recovered", s.recovered);
    o.u64("offset", s.offset);
    o.bool("positioned", s.positioned);
    o.raw("data", &s.data);
    o.bool("was_recovering", s.was_recovering);
}

fn client_info(o: &mut Object<'_>, info: &ClientInfo) {
    o.str_always("user", &info.user);
    o.str_always("client", &info.client);
    o.raw("conn_info", &info.conn_info);
    o.raw("chan_info", &info.chan_info);
}

fn publication(o: &mut Object<'_>, p: &Publication) {
    o.raw("data", &p.data);
    if let Some(info) = &p.info {
        o.object("info", |o| client_info(o, info));
    }
    o.u64("offset", p.offset);
    if !p.tags.is_empty() {
        o.object("tags", |o| {
            for (key, value) in &p.tags {
                o.str_always(key, value);
            }
        });
    }
    o.i64("time", p.time);
}

fn push(o: &mut Object<'_>, p: &Push) {
    o.str("channel", &p.channel);
    match &p.body {
        PushBody::Pub(publ) => o.object("pub", |o| publication(o, publ)),
        PushBody::Join(info) => o.object("join", |o| o.object("info", |o| client_info(o, info))),
        PushBody::Leave(info) => o.object("leave", |o| o.object("info", |o| client_info(o, info))),
        PushBody::Unsubscribe { code, reason } => o.object("unsubscribe", |o| {
            o.u64("code", (*code).into());
            o.str("reason", reason);
        }),
        PushBody::Message { data } => o.object("message", |o| o.raw("data", data)),
        PushBody::Subscribe {
            recoverable,
            epoch,
            offset,
            positioned,
            data,
        } => o.object("subscribe", |o| {
            o.bool("recoverable", *recoverable);
            o.str("epoch", epoch);
            o.u64("offset", *offset);
            o.bool("positioned", *positioned);
            o.raw("data", data);
        }),
        PushBody::Disconnect(d) => o.object("disconnect", |o| {
            o.u64("code", d.code.into());
            o.str("reason", &d.reason);
            o.bool("reconnect", d.reconnect);
        }),
        PushBody::Refresh { expires, ttl } => o.object("refresh", |o| {
            o.bool("expires", *expires);
            o.u64("ttl", (*ttl).into());
        }),
    }
}
