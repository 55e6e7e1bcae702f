//! The Protobuf format (subprotocol `centrifuge-protobuf`): a binary frame
//! holds commands (or replies), each behind its length as a varint.
//! Unknown fields are read past; a request this crate does not serve is
//! kept by its place, so the reply can still say which method it was.

use bytes::Bytes;

use super::messages::{
    ClientInfo, Command, ConnectRequest, ConnectResult, HistoryRequest, Publication, Push,
    PushBody, Reply, ReplyBody, Request, StreamPosition, SubscribeRequest, SubscribeResult,
};
use super::wire::{
    Fields, Value, put_bool, put_bytes, put_entry, put_i64, put_message, put_u64, put_varint,
    read_varint,
};
use super::{DecodeError, MAX_COMMANDS};

/// The commands in one binary frame, in order.
pub(super) fn decode_commands(mut frame: &[u8]) -> Result<Vec<Command>, DecodeError> {
    let mut commands = Vec::new();
    while !frame.is_empty() {
        if commands.len() == MAX_COMMANDS {
            return Err(DecodeError::TooManyCommands);
        }
        let len = read_varint(&mut frame)?;
        if len > frame.len() as u64 {
            return Err(DecodeError::Protobuf(
                "a command's length past the end of the frame",
            ));
        }
        let (body, rest) = frame.split_at(len as usize);
        frame = rest;
        commands.push(command(body)?);
    }
    Ok(commands)
}

fn command(body: &[u8]) -> Result<Command, DecodeError> {
    let mut id = 0;
    // The first request in field order wins, whatever order the wire has.
    let mut request: Option<(u32, Request)> = None;
    let mut fields = Fields::new(body);
    while let Some((number, value)) = fields.next_field()? {
        let parsed = match number {
            1 => {
                id = value.u32()?;
                continue;
            }
            4 => Request::Connect(connect(value.bytes()?)?),
            5 => Request::Subscribe(subscribe(value.bytes()?)?),
            6 => Request::Unsubscribe {
                channel: channel(value)?,
            },
            7 => {
                let (mut channel, mut data) = (String::new(), Bytes::new());
                each(value, |n, v| {
                    match n {
                        1 => channel = v.string()?,
                        2 => data = bytes(v)?,
                        _ => {}
                    }
                    Ok(())
                })?;
                Request::Publish { channel, data }
            }
            8 => Request::Presence {
                channel: channel(value)?,
            },
            9 => Request::PresenceStats {
                channel: channel(value)?,
            },
            10 => Request::History(history(value)?),
            11 => {
                each(value, |_, _| Ok(()))?;
                Request::Ping
            }
            12 => {
                let mut data = Bytes::new();
                each(value, |n, v| {
                    if n == 1 {
                        data = bytes(v)?;
                    }
                    Ok(())
                })?;
                Request::Send { data }
            }
            13 => {
                let (mut method, mut data) = (String::new(), Bytes::new());
                each(value, |n, v| {
                    match n {
                        1 => data = bytes(v)?,
                        2 => method = v.string()?,
                        _ => {}
                    }
                    Ok(())
                })?;
                Request::Rpc { method, data }
            }
            14 => {
                let mut token = String::new();
                each(value, |n, v| {
                    if n == 1 {
                        token = v.string()?;
                    }
                    Ok(())
                })?;
                Request::Refresh { token }
            }
            15 => {
                let (mut channel, mut token) = (String::new(), String::new());
                each(value, |n, v| {
                    match n {
                        1 => channel = v.string()?,
                        2 => token = v.string()?,
                        _ => {}
                    }
                    Ok(())
                })?;
                Request::SubRefresh { channel, token }
            }
            _ => continue,
        };
        if request.as_ref().is_none_or(|(first, _)| number < *first) {
            request = Some((number, parsed));
        }
    }
    Ok(Command {
        id,
        request: request.map_or(Request::Pong, |(_, r)| r),
    })
}

/// Calls `f` with each field of the message in `value`.
fn each<'a>(
    value: Value<'a>,
    mut f: impl FnMut(u32, Value<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let mut fields = Fields::new(value.bytes()?);
    while let Some((number, value)) = fields.next_field()? {
        f(number, value)?;
    }
    Ok(())
}

fn bytes(value: Value<'_>) -> Result<Bytes, DecodeError> {
    Ok(Bytes::copy_from_slice(value.bytes()?))
}

/// A request whose field 1 is its channel.
fn channel(value: Value<'_>) -> Result<String, DecodeError> {
    let mut channel = String::new();
    each(value, |n, v| {
        if n == 1 {
            channel = v.string()?;
        }
        Ok(())
    })?;
    Ok(channel)
}

fn connect(body: &[u8]) -> Result<ConnectRequest, DecodeError> {
    let mut out = ConnectRequest::default();
    each(Value::Bytes(body), |n, v| {
        match n {
            1 => out.token = v.string()?,
            2 => out.data = bytes(v)?,
            3 => {
                let (mut key, mut sub) = (String::new(), SubscribeRequest::default());
                each(v, |n, v| {
                    match n {
                        1 => key = v.string()?,
                        2 => sub = subscribe(v.bytes()?)?,
                        _ => {}
                    }
                    Ok(())
                })?;
                out.subs.push((key, sub));
            }
            4 => out.name = v.string()?,
            5 => out.version = v.string()?,
            6 => {
                let (mut key, mut value) = (String::new(), String::new());
                each(v, |n, v| {
                    match n {
                        1 => key = v.string()?,
                        2 => value = v.string()?,
                        _ => {}
                    }
                    Ok(())
                })?;
                out.headers.push((key, value));
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(out)
}

fn subscribe(body: &[u8]) -> Result<SubscribeRequest, DecodeError> {
    let mut out = SubscribeRequest::default();
    each(Value::Bytes(body), |n, v| {
        match n {
            1 => out.channel = v.string()?,
            2 => out.token = v.string()?,
            3 => out.recover = v.bool()?,
            6 => out.epoch = v.string()?,
            7 => out.offset = v.varint()?,
            8 => out.data = bytes(v)?,
            9 => out.positioned = v.bool()?,
            10 => out.recoverable = v.bool()?,
            11 => out.join_leave = v.bool()?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(out)
}

fn history(value: Value<'_>) -> Result<HistoryRequest, DecodeError> {
    let mut out = HistoryRequest::default();
    each(value, |n, v| {
        match n {
            1 => out.channel = v.string()?,
            7 => out.limit = v.i32()?,
            8 => {
                let mut since = StreamPosition::default();
                each(v, |n, v| {
                    match n {
                        1 => since.offset = v.varint()?,
                        2 => since.epoch = v.string()?,
                        _ => {}
                    }
                    Ok(())
                })?;
                out.since = Some(since);
            }
            9 => out.reverse = v.bool()?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(out)
}

/// Appends one reply, behind its length, to a frame.
pub(super) fn encode_reply(out: &mut Vec<u8>, reply: &Reply) {
    let mut body = Vec::new();
    reply_body(&mut body, reply);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

fn reply_body(out: &mut Vec<u8>, reply: &Reply) {
    put_u64(out, 1, reply.id.into());
    match &reply.body {
        ReplyBody::Error(e) => put_message(out, 2, |m| {
            put_u64(m, 1, e.code.into());
            put_bytes(m, 2, e.message.as_bytes());
            put_bool(m, 3, e.temporary);
        }),
        ReplyBody::Push(p) => put_message(out, 4, |m| push(m, p)),
        ReplyBody::Connect(c) => put_message(out, 5, |m| connect_result(m, c)),
        ReplyBody::Subscribe(s) => put_message(out, 6, |m| subscribe_result(m, s)),
        ReplyBody::Unsubscribe => put_message(out, 7, |_| {}),
        ReplyBody::Publish => put_message(out, 8, |_| {}),
        ReplyBody::Presence(clients) => put_message(out, 9, |m| {
            for (id, info) in clients {
                put_entry(m, 1, id, |e| client_info(e, info));
            }
        }),
        ReplyBody::PresenceStats {
            num_clients,
            num_users,
        } => put_message(out, 10, |m| {
            put_u64(m, 1, (*num_clients).into());
            put_u64(m, 2, (*num_users).into());
        }),
        ReplyBody::History(h) => put_message(out, 11, |m| {
            for p in &h.publications {
                put_message(m, 1, |m| publication(m, p));
            }
            put_bytes(m, 2, h.epoch.as_bytes());
            put_u64(m, 3, h.offset);
        }),
        ReplyBody::Ping => put_message(out, 12, |_| {}),
        ReplyBody::Rpc { data } => put_message(out, 13, |m| put_bytes(m, 1, data)),
        ReplyBody::Refresh(r) => put_message(out, 14, |m| {
            put_bytes(m, 1, r.client.as_bytes());
            put_bytes(m, 2, r.version.as_bytes());
            put_bool(m, 3, r.expires);
            put_u64(m, 4, r.ttl.into());
        }),
        ReplyBody::SubRefresh { expires, ttl } => put_message(out, 15, |m| {
            put_bool(m, 1, *expires);
            put_u64(m, 2, (*ttl).into());
        }),
    }
}

fn connect_result(m: &mut Vec<u8>, c: &ConnectResult) {
    put_bytes(m, 1, c.client.as_bytes());
    put_bytes(m, 2, c.version.as_bytes());
    put_bool(m, 3, c.expires);
    put_u64(m, 4, c.ttl.into());
    put_bytes(m, 5, &c.data);
    for (channel, sub) in &c.subs {
        put_entry(m, 6, channel, |e| subscribe_result(e, sub));
    }
    put_u64(m, 7, c.ping.into());
    put_bool(m, 8, c.pong);
    put_bytes(m, 9, c.session.as_bytes());
    put_bytes(m, 10, c.node.as_bytes());
}

fn subscribe_result(m: &mut Vec<u8>, s: &SubscribeResult) {
    put_bool(m, 1, s.expires);
    put_u64(m, 2, s.ttl.into());
    put_bool(m, 3, s.recoverable);
    put_bytes(m, 6, s.epoch.as_bytes());
    for p in &s.publications {
        put_message(m, 7, |m| publication(m, p));
    }
    put_bool(m, 8, s.recovered);
    put_u64(m, 9, s.offset);
    put_bool(m, 10, s.positioned);
    put_bytes(m, 11, &s.data);
    put_bool(m, 12, s.was_recovering);
}

fn client_info(m: &mut Vec<u8>, info: &ClientInfo) {
    put_bytes(m, 1, info.user.as_bytes());
    put_bytes(m, 2, info.client.as_bytes());
    put_bytes(m, 3, &info.conn_info);
    put_bytes(m, 4, &info.chan_info);
}

pub(super) fn publication(m: &mut Vec<u8>, p: &Publication) {
    put_bytes(m, 4, &p.data);
    if let Some(info) = &p.info {
        put_message(m, 5, |m| client_info(m, info));
    }
    put_u64(m, 6, p.offset);
    for (key, value) in &p.tags {
        put_message(m, 7, |e| {
            put_bytes(e, 1, key.as_bytes());
            put_bytes(e, 2, value.as_bytes());
        });
    }
    put_i64(m, 9, p.time);
}

fn push(m: &mut Vec<u8>, p: &Push) {
    put_bytes(m, 2, p.channel.as_bytes());
    match &p.body {
        PushBody::Pub(publ) => put_message(m, 4, |m| publication(m, publ)),
        PushBody::Join(info) => put_message(m, 5, |m| put_message(m, 1, |m| client_info(m, info))),
        PushBody::Leave(info) => put_message(m, 6, |m| put_message(m, 1, |m| client_info(m, info))),
        PushBody::Unsubscribe { code, reason } => put_message(m, 7, |m| {
            put_u64(m, 2, (*code).into());
            put_bytes(m, 3, reason.as_bytes());
        }),
        PushBody::Message { data } => put_message(m, 8, |m| put_bytes(m, 1, data)),
        PushBody::Subscribe {
            recoverable,
            epoch,
            offset,
            positioned,
            data,
        } => put_message(m, 9, |m| {
            put_bool(m, 1, *recoverable);
            put_bytes(m, 4, epoch.as_bytes());
            put_u64(m, 5, *offset);
            put_bool(m, 6, *positioned);
            put_bytes(m, 7, data);
        }),
        PushBody::Disconnect(d) => put_message(m, 11, |m| {
            put_u64(m, 1, d.code.into());
            put_bytes(m, 2, d.reason.as_bytes());
            put_bool(m, 3, d.reconnect);
        }),
        PushBody::Refresh { expires, ttl } => put_message(m, 12, |m| {
            put_bool(m, 1, *expires);
            put_u64(m, 2, (*ttl).into());
        }),
    }
}
