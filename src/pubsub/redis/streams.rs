//! History in Redis: one stream per topic, numbered by Redis, read back to
//! resume on any node.
//!
//! Each topic with history has two keys in one cluster slot (the topic is
//! their hash tag): `<prefix>{<topic>}:m`, a hash with the topic's epoch
//! (`e`) and its latest offset (`o`), and `<prefix>{<topic>}:s`, a stream
//! whose entry `0-<offset>` holds the publication (`m`, the node's signed
//! message) and when Redis took it (`t`, seconds). [`RECORD`] numbers,
//! keeps and publishes in one step, so the order of the offsets is the
//! order in which every node hears the publications.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use super::members;
use super::replay::SKEW_MS;
use super::wire::{self, Stamp};
use crate::proto::OpCode;
use crate::pubsub::relay::Loaded;
use crate::pubsub::{Epoch, History, Position};

/// Numbers a publication (making the topic's epoch, `ARGV[1]`, if it has
/// none: then whatever its stream still holds belongs to a lost epoch and
/// goes, as when Redis evicted the epoch but not the stream), keeps it in the stream trimmed to `ARGV[2]` entries, lets the
/// stream go `ARGV[3]` seconds after its last publication and the epoch
/// `ARGV[6]` seconds after it, and publishes it on `ARGV[4]` with its
/// position in front (with `ARGV[7]`: `PUBLISH`, or `SPUBLISH` on a
/// cluster, where the channel is in the keys' slot). Returns `{epoch,
/// offset}`.
pub(super) const RECORD: &str = r"
local epoch = redis.call('HGET', KEYS[1], 'e')
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', KEYS[1], 'e', epoch)
  redis.call('DEL', KEYS[2])
end
local offset = redis.call('HINCRBY', KEYS[1], 'o', 1)
local now = redis.call('TIME')
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], '0-' .. offset, 't', now[1], 'm', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call(ARGV[7], ARGV[4], 'r' .. epoch .. offset .. ':' .. ARGV[5])
return {epoch, offset}
";

/// Reads a topic's epoch, latest offset, Redis's clock (seconds), and at
/// most `ARGV[2]` of the latest entries after offset `ARGV[1]` and up to
/// `ARGV[3]` (newest first); `nil` if the topic has no epoch, unless
/// `ARGV[4]` is given: then that is made its epoch (at offset 0, kept
/// `ARGV[5]` seconds), as a first subscriber's read does, so that every
/// node numbers the topic alike from its first publication on.
pub(super) const READ: &str = r"
local epoch = redis.call('HGET', KEYS[1], 'e')
if not epoch then
  if not ARGV[4] then
    return false
  end
  epoch = ARGV[4]
  redis.call('HSET', KEYS[1], 'e', epoch)
  redis.call('DEL', KEYS[2])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
local offset = redis.call('HGET', KEYS[1], 'o') or '0'
local now = redis.call('TIME')
local entries = redis.call('XREVRANGE', KEYS[2], ARGV[3], '(0-' .. ARGV[1], 'COUNT', ARGV[2])
return {epoch, offset, now[1], entries}
";

/// Gives a topic a new epoch (`ARGV[1]`) and lets its stream go: what
/// Redis kept no longer tells the whole story.
pub(super) const RESET: &str = r"
redis.call('HSET', KEYS[1], 'e', ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Sets this node's (`ARGV[1]`) count of subscribers to a topic
/// (`ARGV[2]`; 0 takes it out), good for `ARGV[3]` milliseconds of
/// Redis's clock.
pub(super) const COUNT: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
if ARGV[2] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. string.format('%d', ms + ARGV[3]))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3] * 2)
return 1
";

/// A topic's subscribers on every node whose count is still good
/// (forgetting the others), and its epoch and latest offset.
pub(super) const TOTAL: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local all = redis.call('HGETALL', KEYS[1])
local sum = 0
for i = 1, #all, 2 do
  local count, till = string.match(all[i + 1], '^(%d+):(%d+)$')
  if count and tonumber(till) > ms then
    sum = sum + tonumber(count)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
local meta = redis.call('HMGET', KEYS[2], 'e', 'o')
return {sum, meta[1], meta[2]}
";

/// The scripts as Redis is asked to run them: by their SHA-1s, loaded on
/// each connection to one server, or (on a cluster, whose shards may
/// restart without them) by their source each time.
#[derive(Clone, Debug)]
pub(super) struct Scripts {
    pub(super) record: String,
    pub(super) read: String,
    pub(super) reset: String,
    pub(super) count: String,
    pub(super) total: String,
    /// [`members::WRITE`] and [`members::READ`].
    pub(super) members_write: String,
    pub(super) members_read: String,
    /// `EVALSHA` or `EVAL`.
    pub(super) eval: &'static str,
}

impl Scripts {
    pub(super) async fn load(
        connection: &mut redis::aio::MultiplexedConnection,
    ) -> redis::RedisResult<Scripts> {
        let mut pipe = redis::pipe();
        let scripts = [RECORD, READ, RESET, COUNT, TOTAL];
        for script in scripts.into_iter().chain([members::WRITE, members::READ]) {
            pipe.cmd("SCRIPT").arg("LOAD").arg(script);
        }
        let (record, read, reset, count, total, members_write, members_read) =
            pipe.query_async(connection).await?;
        Ok(Scripts {
            record,
            read,
            reset,
            count,
            total,
            members_write,
            members_read,
            eval: "EVALSHA",
        })
    }

    pub(super) fn sent_whole() -> Scripts {
        Scripts {
            record: RECORD.to_owned(),
            read: READ.to_owned(),
            reset: RESET.to_owned(),
            count: COUNT.to_owned(),
            total: TOTAL.to_owned(),
            members_write: members::WRITE.to_owned(),
            members_read: members::READ.to_owned(),
            eval: "EVAL",
        }
    }
}

/// How long an epoch is kept past a topic's last publication at least
/// (past the history's age): a subscriber that comes back within it and
/// finds nothing newer resumes as recovered.
const EPOCH_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest time handed to `EXPIRE` (ten years; Redis refuses times
/// whose milliseconds pass an `i64`).
const MAX_EXPIRE: u64 = 10 * 365 * 24 * 3600;

/// The keys of `topic`'s epoch and stream.
pub(super) fn keys(prefix: &str, topic: &str) -> [String; 2] {
    [
        format!("{prefix}{{{topic}}}:m"),
        format!("{prefix}{{{topic}}}:s"),
    ]
}

/// The key of `topic`'s subscriber counts, by node.
fn counts_key(prefix: &str, topic: &str) -> String {
    format!("{prefix}{{{topic}}}:n")
}

/// Adds [`COUNT`] to `pipe`: `node` has `count` subscribers to `topic`,
/// for `good_for`.
pub(super) fn count(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    (prefix, node): (&str, &str),
    topic: &str,
    count: usize,
    good_for: Duration,
) {
    pipe.cmd(scripts.eval)
        .arg(&scripts.count)
        .arg(1)
        .arg(counts_key(prefix, topic))
        .arg(node)
        .arg(count)
        .arg(good_for.as_millis().max(1) as u64);
}

/// Adds [`TOTAL`] to `pipe`.
pub(super) fn total(pipe: &mut redis::Pipeline, scripts: &Scripts, prefix: &str, topic: &str) {
    let [meta, _] = keys(prefix, topic);
    pipe.cmd(scripts.eval)
        .arg(&scripts.total)
        .arg(2)
        .arg(counts_key(prefix, topic))
        .arg(meta);
}

/// [`TOTAL`]'s answer: subscribers everywhere, and the topic's position
/// in Redis (`None` if it has no history there).
pub(super) fn total_of(value: &Value) -> Option<(usize, Option<Position>)> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [sum, epoch, offset] = parts.as_slice() else {
        return None;
    };
    let sum = usize::try_from(number(sum)?).ok()?;
    let position = match (text(epoch), number(offset)) {
        (Some(epoch), Some(offset)) => Some(Position {
            epoch: epoch.parse().ok()?,
            offset,
        }),
        _ => None,
    };
    Some((sum, position))
}

/// The seconds a stream is kept past its last publication.
fn stream_expiry(history: History) -> u64 {
    history.max_age().as_secs().clamp(1, MAX_EXPIRE)
}

fn epoch_expiry(history: History) -> u64 {
    history
        .max_age()
        .max(EPOCH_KEPT)
        .as_secs()
        .clamp(1, MAX_EXPIRE)
}

/// Adds `script` (one of `scripts`) on `topic`'s epoch and stream keys to
/// `pipe`; its arguments follow.
fn on_topic<'p>(
    pipe: &'p mut redis::Pipeline,
    scripts: &Scripts,
    script: &str,
    prefix: &str,
    topic: &str,
) -> &'p mut redis::Pipeline {
    let [meta, stream] = keys(prefix, topic);
    pipe.cmd(scripts.eval)
        .arg(script)
        .arg(2)
        .arg(meta)
        .arg(stream)
}

/// Adds [`RECORD`] for one publication to `pipe`, published with
/// `publish` (`PUBLISH` or `SPUBLISH`).
pub(super) fn record(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    (prefix, publish): (&str, &str),
    (topic, history): (&str, History),
    channel: &str,
    message: &[u8],
) {
    on_topic(pipe, scripts, &scripts.record, prefix, topic)
        .arg(Epoch::new().to_string())
        .arg(history.max_messages())
        .arg(stream_expiry(history))
        .arg(channel)
        .arg(message)
        .arg(epoch_expiry(history))
        .arg(publish);
}

/// Adds [`READ`] to `pipe`: at most `count` entries after `after`, up to
/// `before` (exclusive; `None`: the latest).
pub(super) fn read(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    prefix: &str,
    topic: &str,
    after: u64,
    before: Option<u64>,
    count: usize,
) {
    let upto = match before {
        Some(before) => format!("0-{}", before.saturating_sub(1)),
        None => "+".to_owned(),
    };
    // A few entries more, before the first asked for: what the read is
    // checked against (see `read_back`), not taken.
    let from = after.saturating_sub(CONTEXT);
    on_topic(pipe, scripts, &scripts.read, prefix, topic)
        .arg(from)
        .arg(count.max(1).saturating_add(CONTEXT as usize))
        .arg(upto);
}

/// [`read`] for a subscriber: a topic without an epoch in Redis is
/// given one (see [`READ`]).
pub(super) fn read_or_open(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    prefix: &str,
    (topic, history): (&str, History),
    after: u64,
    before: Option<u64>,
    count: usize,
) {
    read(pipe, scripts, prefix, topic, after, before, count);
    pipe.arg(Epoch::new().to_string())
        .arg(epoch_expiry(history));
}

/// Entries read before the first one asked for, to check the read
/// against.
const CONTEXT: u64 = 32;

/// Adds [`RESET`] to `pipe`.
pub(super) fn reset(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    prefix: &str,
    topic: &str,
    history: History,
) {
    on_topic(pipe, scripts, &scripts.reset, prefix, topic)
        .arg(Epoch::new().to_string())
        .arg(epoch_expiry(history));
}

/// [`RECORD`]'s answer: the position Redis gave.
pub(super) fn recorded_at(value: &Value) -> Option<Position> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [epoch, offset] = parts.as_slice() else {
        return None;
    };
    Some(Position {
        epoch: text(epoch)?.parse().ok()?,
        offset: number(offset)?,
    })
}

/// What [`READ`] found of a topic.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub(super) epoch: Option<Epoch>,
    /// Redis's latest offset.
    pub(super) last: u64,
    /// Publications after the offset asked for, oldest first, checked
    /// like any message from Redis (refused ones left out).
    pub(super) loaded: Vec<Loaded>,
    /// Who published each of `loaded` and when, in the same order: the
    /// node remembers them as heard (a replay of one live is refused).
    pub(super) stamps: Vec<Stamp>,
    /// Entries refused.
    pub(super) refused: u64,
}

/// What a node accepts from Redis: its secret, its size limit; and which
/// entries of a read it takes (the newest `take`, after `after`).
pub(super) struct Check<'a> {
    pub(super) after: u64,
    pub(super) take: usize,
    pub(super) channel: &'a str,
    pub(super) secret: Option<&'a [u8]>,
    pub(super) max_message_size: usize,
    pub(super) history: History,
}

/// [`READ`]'s answer, its entries checked with `check`, those after
/// `check.after` taken; `None` if it is not one (then nothing is taken
/// from it).
///
/// With a secret, the read must also hang together, since the offsets
/// are Redis's and outside the MAC: each node's counts rise with the
/// offsets, and no entry was signed more than the clocks' skew after a
/// newer one (or in the future). A real message put back into the stream
/// at another offset breaks one or the other (its node's later messages
/// have higher counts; one put back after its node's last is older than
/// what came between), and since it cannot be told which entry is the
/// copy, nothing of such a read is taken: a subscriber resuming from it
/// is told it was not recovered. The read reaches up to [`CONTEXT`]
/// entries back before the first asked for, so a copy at the end is
/// checked against what came before it. (Not caught: a message put back
/// right after the newest kept one, whose node published nothing else in
/// what is read, signed within the clocks' skew of the entries before.)
pub(super) fn read_back(value: &Value, check: &Check<'_>) -> Option<Read> {
    let parts = match value {
        Value::Nil => return Some(Read::default()),
        Value::Array(parts) => parts,
        _ => return None,
    };
    let [epoch, last, now, entries] = parts.as_slice() else {
        return None;
    };
    let Value::Array(entries) = entries else {
        return None;
    };
    let mut read = Read {
        epoch: Some(text(epoch)?.parse().ok()?),
        // Far from overflowing whatever is added to it.
        last: number(last).filter(|&last| last < wire::MAX_OFFSET)?,
        ..Read::default()
    };
    let now = number(now)?;
    let at = Instant::now();
    let mut consistent = Consistency::new(wire::unix_millis());
    // Newest first: stop at the first too old, or any out of order.
    let mut next_below = read.last + 1;
    for entry in entries {
        let Some((offset, taken, message)) = stream_entry(entry) else {
            read.refused += 1;
            continue;
        };
        let age = Duration::from_secs(now.saturating_sub(taken));
        if offset >= next_below || age > check.history.max_age() {
            break;
        }
        next_below = offset;
        match accept(message, check) {
            Some((stamp, _)) if check.secret.is_some() && !consistent.takes(stamp) => {
                tracing::warn!(
                    channel = check.channel,
                    offset,
                    "a stream from Redis does not hang together (an entry replayed or moved): \
                     none of it taken"
                );
                read.refused += read.loaded.len() as u64 + 1;
                read.loaded.clear();
                read.stamps.clear();
                break;
            }
            // Read to check the rest against, not taken.
            Some(_) if offset <= check.after || read.loaded.len() >= check.take => {}
            Some((stamp, (key, opcode, payload))) => {
                read.loaded.push(Loaded {
                    offset,
                    key,
                    opcode,
                    payload,
                    at: at.checked_sub(age).unwrap_or(at),
                });
                read.stamps.push(stamp);
            }
            None => {
                // A hole where it was: nothing older can be replayed.
                read.refused += 1;
                break;
            }
        }
    }
    read.loaded.reverse();
    read.stamps.reverse();
    Some(read)
}

/// A stream entry: its offset, when Redis took it, and the message.
fn stream_entry(entry: &Value) -> Option<(u64, u64, &[u8])> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let [id, fields] = parts.as_slice() else {
        return None;
    };
    let offset = text(id)?.strip_prefix("0-")?.parse().ok()?;
    let Value::Array(fields) = fields else {
        return None;
    };
    let (mut taken, mut message) = (None, None);
    for pair in fields.chunks(2) {
        match (text(&pair[0]), pair.get(1)) {
            (Some("t"), Some(value)) => taken = number(value),
            (Some("m"), Some(Value::BulkString(bytes))) => message = Some(bytes.as_slice()),
            _ => {}
        }
    }
    Some((offset, taken?, message?))
}

/// What a read's entries, newest first, have shown so far: each node's
/// lowest count, and the newest entry's time.
struct Consistency {
    lowest: HashMap<[u8; 16], u64>,
    newer: Option<u64>,
    now: u64,
}

impl Consistency {
    fn new(now: u64) -> Consistency {
        Consistency {
            lowest: HashMap::new(),
            newer: None,
            now,
        }
    }

    /// Whether the next older entry, stamped `stamp`, fits what came
    /// after it.
    fn takes(&mut self, stamp: Stamp) -> bool {
        let bound = self.newer.unwrap_or(self.now).saturating_add(SKEW_MS);
        if stamp.time > bound {
            return false;
        }
        match self.lowest.get_mut(&stamp.node) {
            Some(lowest) if stamp.count >= *lowest => return false,
            Some(lowest) => *lowest = stamp.count,
            None => {
                self.lowest.insert(stamp.node, stamp.count);
            }
        }
        self.newer = Some(stamp.time);
        true
    }
}

/// A decoded entry's content: key, kind, payload.
type Content = (Option<String>, OpCode, Vec<u8>);

/// A node's message from a stream, checked as one from the channel is.
fn accept(message: &[u8], check: &Check<'_>) -> Option<(Stamp, Content)> {
    if message.len() > check.max_message_size + wire::HEADER + wire::TAG {
        return None;
    }
    let decoded = wire::decode(message, check.channel, check.secret)?;
    if decoded.payload.len() > check.max_message_size
        || (decoded.opcode == OpCode::Text && crate::proto::validate_utf8(decoded.payload).is_err())
    {
        return None;
    }
    let content = (
        decoded.key.map(str::to_owned),
        decoded.opcode,
        decoded.payload.to_vec(),
    );
    Some((decoded.stamp, content))
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => text(value)?.parse().ok(),
    }
}

#[cfg(test)]
mod tests;
