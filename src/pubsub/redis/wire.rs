//! The bridge's messages on the wire: what a node publishes (its id, its
//! count, when it published, the kind and key, the payload, and with a
//! secret a MAC), and the position Redis puts in front of a recorded one.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::proto::OpCode;
use crate::pubsub::{Epoch, Position};

/// An HMAC-SHA256 tag's length.
pub const TAG: usize = 32;

/// A message on the wire, version 3: the version, the node (16 bytes),
/// its count (8 bytes, big-endian), when it was published (milliseconds
/// since the Unix epoch on the node's clock, 8 bytes, big-endian), the
/// kind (`t` or `b`, or `T` and `B` with a key: then the key's length, 2
/// bytes big-endian, and the key), the payload, and with a secret an
/// HMAC-SHA256 tag (32 bytes) over the channel's length (4 bytes), the
/// channel, and everything before the tag.
pub const HEADER: usize = 1 + 16 + 8 + 8 + 1;

/// The wire format's version.
const VERSION: u8 = 3;

/// Who published a message, and when: what the replay checks go by
/// (signed with the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The node's random id.
    pub node: [u8; 16],
    /// The node's count of its messages: only grows.
    pub count: u64,
    /// Milliseconds since the Unix epoch, on the node's clock.
    pub time: u64,
}

/// A message in the format `HEADER` describes, signed with `secret` if given.
pub fn encode(
    stamp: Stamp,
    (key, opcode, payload): (Option<&str>, OpCode, &[u8]),
    channel: &str,
    secret: Option<&[u8]>,
) -> Vec<u8> {
    let key_len = key.map_or(0, |k| 2 + k.len());
    let mut message = Vec::with_capacity(HEADER + key_len + payload.len() + TAG);
    message.push(VERSION);
    message.extend_from_slice(&stamp.node);
    message.extend_from_slice(&stamp.count.to_be_bytes());
    message.extend_from_slice(&stamp.time.to_be_bytes());
    let text = opcode == OpCode::Text;
    match key {
        None => message.push(if text { b't' } else { b'b' }),
        Some(key) => {
            message.push(if text { b'T' } else { b'B' });
            let len = u16::try_from(key.len()).expect("keys over 64 KiB are not relayed");
            message.extend_from_slice(&len.to_be_bytes());
            message.extend_from_slice(key.as_bytes());
        }
    }
    message.extend_from_slice(payload);
    if let Some(secret) = secret {
        let tag = sign(secret, channel, &message).finalize().into_bytes();
        message.extend_from_slice(&tag);
    }
    message
}

/// The highest offset taken from Redis: from there on it is refused
/// (Redis's numbering is not trusted, and offsets are added to).
pub const MAX_OFFSET: u64 = 1 << 62;

/// Where a message's count and time sit, to be written as it leaves.
const STAMPED: std::ops::Range<usize> = 17..33;

/// [`encode`] without its count, time and MAC, which [`seal`] adds as
/// the message leaves for Redis.
pub fn unsealed(node: [u8; 16], content: (Option<&str>, OpCode, &[u8])) -> Vec<u8> {
    let blank = Stamp {
        node,
        count: 0,
        time: 0,
    };
    let mut message = encode(blank, content, "", None);
    message.reserve_exact(TAG);
    message
}

/// Writes `count` and `time` into a message [`unsealed`] made, and with a
/// secret appends its MAC: what [`encode`] would have made. Done by the
/// bridge's task as each message leaves, in the order they leave, so a
/// node's counts reach Redis (and every node) in order whichever thread
/// published them, and the time signed is the time sent.
pub fn seal(
    message: &mut Vec<u8>,
    (count, time): (u64, u64),
    channel: &str,
    secret: Option<&[u8]>,
) {
    message[STAMPED.start..STAMPED.start + 8].copy_from_slice(&count.to_be_bytes());
    message[STAMPED.start + 8..STAMPED.end].copy_from_slice(&time.to_be_bytes());
    if let Some(secret) = secret {
        let tag = sign(secret, channel, message).finalize().into_bytes();
        message.extend_from_slice(&tag);
    }
}

/// A message read back.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Who published it, and when.
    pub stamp: Stamp,
    /// Its key, if it has one.
    pub key: Option<&'a str>,
    /// Text or binary.
    pub opcode: OpCode,
    /// The payload as published.
    pub payload: &'a [u8],
}

/// [`encode`] read back (its tag checked with `secret`); `None` for
/// anything else.
pub fn decode<'a>(message: &'a [u8], channel: &str, secret: Option<&[u8]>) -> Option<Decoded<'a>> {
    let signed = match secret {
        Some(secret) => {
            let at = message.len().checked_sub(TAG)?;
            let (signed, tag) = message.split_at(at);
            sign(secret, channel, signed).verify_slice(tag).ok()?;
            signed
        }
        None => message,
    };
    if signed.len() < HEADER || signed[0] != VERSION {
        return None;
    }
    let stamp = Stamp {
        node: signed[1..17].try_into().ok()?,
        count: u64::from_be_bytes(signed[17..25].try_into().ok()?),
        time: u64::from_be_bytes(signed[25..33].try_into().ok()?),
    };
    let (opcode, keyed) = match signed[33] {
        b't' => (OpCode::Text, false),
        b'b' => (OpCode::Binary, false),
        b'T' => (OpCode::Text, true),
        b'B' => (OpCode::Binary, true),
        _ => return None,
    };
    let rest = &signed[HEADER..];
    let (key, payload) = if keyed {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        let key = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
        (Some(key), &rest[2 + len..])
    } else {
        (None, rest)
    };
    Some(Decoded {
        stamp,
        key,
        opcode,
        payload,
    })
}

/// Milliseconds since the Unix epoch, on this node's clock (0 if the
/// clock is before it).
pub(super) fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// The MAC of a message on `channel`, fed all but its tag.
fn sign(secret: &[u8], channel: &str, signed: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(&(channel.len() as u32).to_be_bytes());
    mac.update(channel.as_bytes());
    mac.update(signed);
    mac
}

/// A recorded message as Redis publishes it: `r`, the topic's epoch (16
/// hex digits), the offset (decimal), `:`, and the node's message. The
/// position is Redis's, outside the node's MAC (see "Redis is not
/// trusted"). `None` for anything else.
pub fn recorded(message: &[u8]) -> Option<(Position, &[u8])> {
    let rest = message.strip_prefix(b"r")?;
    let epoch = std::str::from_utf8(rest.get(..16)?).ok()?;
    let epoch: Epoch = epoch.parse().ok()?;
    let rest = &rest[16..];
    let colon = rest.iter().take(21).position(|&b| b == b':')?;
    let offset: u64 = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
    if offset >= MAX_OFFSET {
        return None;
    }
    Some((Position { epoch, offset }, &rest[colon + 1..]))
}

#[cfg(test)]
mod tests;
