//! Members of a topic on every node: each node registers its own (an id
//! and opaque bytes: who is there, for presence), the bridge's task keeps
//! them in Redis, and any node reads every live node's back
//! ([`Bridge::members`](super::Bridge::members)).
//!
//! Each topic has two keys in its cluster slot (the topic is their hash
//! tag), beside its counts: `<prefix>{<topic>}:w`, a hash of writers (a
//! node and a generation) to the time, by Redis's clock, until which each
//! is alive, and `<prefix>{<topic>}:p`, a hash of `<writer>:<id>` to the
//! member's bytes. A node's writer is renewed every 5 s and good for 15 s,
//! as its counts are: a node that died drops out within that, and its
//! members with it. A node that lost Redis, or whose writer lapsed, writes
//! its members again under a new generation, so what it left behind (a
//! member gone meanwhile) belongs to a writer nobody renews, and goes.

use std::collections::HashMap;

use bytes::Bytes;
use redis::Value;

/// The most members read of one topic (a topic's answer is at most this
/// many times [`MAX_MEMBER_BYTES`]): Redis is not trusted, and one answer
/// must not grow a node's memory without bound.
pub const MAX_MEMBERS: usize = 4096;

/// The most bytes of one member's data shared through Redis (a larger
/// member is kept and answered on its own node only); a larger entry read
/// from Redis is skipped.
pub const MAX_MEMBER_BYTES: usize = 4096;

/// The longest member id shared through Redis (as for the bytes).
pub const MAX_MEMBER_ID: usize = 256;

/// Member changes waiting for the bridge's task at most; past it, every
/// topic's members are written again.
const PENDING: usize = 65_536;

/// Writes a writer's members of a topic (`KEYS[1]` the writers, `KEYS[2]`
/// the members): `ARGV[1]` the writer, `ARGV[2]` how many milliseconds it
/// stays alive (0: it leaves), then pairs of `+<id>` and the member's
/// bytes (added) or `-<id>` and anything (removed). Returns 1 if the
/// writer was alive before, 0 if it had lapsed (its members must be
/// written again).
pub(super) const WRITE: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local had = redis.call('HEXISTS', KEYS[1], ARGV[1])
for i = 3, #ARGV - 1, 2 do
  local field = ARGV[1] .. ':' .. string.sub(ARGV[i], 2)
  if string.sub(ARGV[i], 1, 1) == '+' then
    redis.call('HSET', KEYS[2], field, ARGV[i + 1])
  else
    redis.call('HDEL', KEYS[2], field)
  end
end
if ARGV[2] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return had
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', ms + ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2] * 2)
redis.call('PEXPIRE', KEYS[2], ARGV[2] * 2)
return had
";

/// Reads a topic's members whose writer is alive (forgetting the writers
/// that lapsed and the members of writers that are gone), at most
/// `ARGV[1]` of them and none over `ARGV[2]` bytes, looking at no more
/// than four times as many entries: a flat array of fields and bytes.
pub(super) const READ: &str = r"
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local live = {}
local writers = redis.call('HGETALL', KEYS[1])
for i = 1, #writers, 2 do
  local till = tonumber(writers[i + 1])
  if till and till > ms then
    live[writers[i]] = true
  else
    redis.call('HDEL', KEYS[1], writers[i])
  end
end
local out = {}
local most, biggest = tonumber(ARGV[1]), tonumber(ARGV[2])
local cursor, looked = '0', 0
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 256)
  cursor = page[1]
  local entries = page[2]
  for i = 1, #entries - 1, 2 do
    looked = looked + 1
    local writer = string.match(entries[i], '^([^:]+):')
    if writer and live[writer] then
      if #out < most * 2 and #entries[i + 1] <= biggest then
        out[#out + 1] = entries[i]
        out[#out + 1] = entries[i + 1]
      end
    else
      redis.call('HDEL', KEYS[2], entries[i])
    end
  end
until cursor == '0' or #out >= most * 2 or looked >= most * 4
return out
";

/// The keys of `topic`'s writers and members.
pub(super) fn keys(prefix: &str, topic: &str) -> [String; 2] {
    [
        format!("{prefix}{{{topic}}}:w"),
        format!("{prefix}{{{topic}}}:p"),
    ]
}

/// One member of a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its id, as its node registered it (unique on that node, not
    /// necessarily across nodes).
    pub id: String,
    /// Its bytes, as registered.
    pub data: Bytes,
    /// Registered on this node.
    pub here: bool,
}

/// A topic's members: [`Bridge::members`](super::Bridge::members).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Every live node's members (at most [`MAX_MEMBERS`] from the other
    /// nodes), then this node's own, all of them.
    pub members: Vec<Member>,
    /// Whether Redis answered: false, `members` holds this node's only.
    pub everywhere: bool,
}

/// What one write to Redis says of a writer of a topic.
pub(super) struct Write {
    pub(super) topic: String,
    pub(super) writer: String,
    /// Alive on (renewed), or leaving.
    pub(super) alive: bool,
    /// Ids added (with their bytes) or removed.
    pub(super) ops: Vec<(String, Option<Bytes>)>,
}

/// This node's members of one topic.
struct Topic {
    /// This node's writer of the topic: the node and a generation.
    writer: String,
    members: HashMap<String, Bytes>,
}

/// This node's members of every topic, and the changes not yet in Redis.
pub(super) struct Local {
    /// The node's id as hex: every writer of its own starts with it.
    node: String,
    topics: HashMap<String, Topic>,
    /// Changed (topic, writer at the time, id), in order.
    pending: Vec<(String, String, String)>,
    /// Too many changes to keep: every topic is written again.
    all: bool,
    generation: u64,
}

impl Local {
    pub(super) fn new(node: &[u8; 16]) -> Local {
        Local {
            node: node.iter().map(|b| format!("{b:02x}")).collect(),
            topics: HashMap::new(),
            pending: Vec::new(),
            all: false,
            generation: 0,
        }
    }

    fn new_writer(&mut self) -> String {
        self.generation += 1;
        format!("{}.{}", self.node, self.generation)
    }

    fn note(&mut self, topic: &str, writer: String, id: &str) {
        if self.pending.len() < PENDING {
            self.pending.push((topic.to_owned(), writer, id.to_owned()));
        } else {
            self.all = true;
        }
    }

    pub(super) fn join(&mut self, topic: &str, id: &str, data: Bytes) {
        if !self.topics.contains_key(topic) {
            let writer = self.new_writer();
            let members = HashMap::new();
            self.topics
                .insert(topic.to_owned(), Topic { writer, members });
        }
        let Some(entry) = self.topics.get_mut(topic) else {
            return;
        };
        entry.members.insert(id.to_owned(), data);
        let writer = entry.writer.clone();
        self.note(topic, writer, id);
    }

    pub(super) fn leave(&mut self, topic: &str, id: &str) {
        let Some(entry) = self.topics.get_mut(topic) else {
            return;
        };
        if entry.members.remove(id).is_none() {
            return;
        }
        let writer = entry.writer.clone();
        if entry.members.is_empty() {
            self.topics.remove(topic);
        }
        self.note(topic, writer, id);
    }

    /// This node's members of `topic`.
    pub(super) fn here(&self, topic: &str) -> Vec<Member> {
        let members = self.topics.get(topic).map(|t| &t.members);
        members
            .into_iter()
            .flatten()
            .map(|(id, data)| Member {
                id: id.clone(),
                data: data.clone(),
                here: true,
            })
            .collect()
    }

    /// Whether `writer` is one of this node's.
    pub(super) fn is_own(&self, writer: &str) -> bool {
        writer.strip_prefix(self.node.as_str()).is_some()
    }

    /// The writes that bring Redis up to date with the changes since the
    /// last call: a change under a topic's current writer adds or removes
    /// its member; one under a writer since replaced (the topic emptied,
    /// or written again) removes it and lets that writer go.
    pub(super) fn take(&mut self) -> Vec<Write> {
        if std::mem::take(&mut self.all) {
            self.pending.clear();
            let topics: Vec<String> = self.topics.keys().cloned().collect();
            return topics
                .iter()
                .flat_map(|topic| self.rewrite(topic))
                .collect();
        }
        let mut writes: Vec<Write> = Vec::new();
        for (topic, writer, id) in std::mem::take(&mut self.pending) {
            let current = self.topics.get(&topic).filter(|t| t.writer == writer);
            let op = (
                id.clone(),
                current.and_then(|t| t.members.get(&id).cloned()),
            );
            match writes.last_mut() {
                Some(last) if last.topic == topic && last.writer == writer => last.ops.push(op),
                _ => writes.push(Write {
                    alive: current.is_some(),
                    topic,
                    writer,
                    ops: vec![op],
                }),
            }
        }
        writes
    }

    /// `topic`'s members under a new writer, and its old writer gone
    /// (what Redis holds of it is left to lapse): after Redis was lost,
    /// or when the old writer lapsed there.
    pub(super) fn rewrite(&mut self, topic: &str) -> Vec<Write> {
        let writer = self.new_writer();
        let Some(entry) = self.topics.get_mut(topic) else {
            return Vec::new();
        };
        let old = std::mem::replace(&mut entry.writer, writer.clone());
        let ops = entry
            .members
            .iter()
            .map(|(id, data)| (id.clone(), Some(data.clone())))
            .collect();
        vec![
            Write {
                topic: topic.to_owned(),
                writer,
                alive: true,
                ops,
            },
            Write {
                topic: topic.to_owned(),
                writer: old,
                alive: false,
                ops: Vec::new(),
            },
        ]
    }

    /// Every topic written again (after connecting).
    pub(super) fn rewrite_all(&mut self) -> Vec<Write> {
        self.all = true;
        self.take()
    }

    /// The renewals of every topic's writer (no member changes).
    pub(super) fn renewals(&self) -> Vec<Write> {
        self.topics
            .iter()
            .map(|(topic, entry)| Write {
                topic: topic.clone(),
                writer: entry.writer.clone(),
                alive: true,
                ops: Vec::new(),
            })
            .collect()
    }
}

/// Whether a member is small enough to share through Redis.
pub(super) fn shared(id: &str, data: &[u8]) -> bool {
    id.len() <= MAX_MEMBER_ID && data.len() <= MAX_MEMBER_BYTES && !id.is_empty()
}

/// [`READ`]'s answer as (writer, member): an entry that is not what a
/// bridge writes (not bytes, no writer, an id or data too long, not
/// UTF-8) is skipped, as is a field seen twice (a scan may repeat one);
/// at most [`MAX_MEMBERS`].
pub(super) fn read_of(value: &Value) -> Vec<(String, Member)> {
    let Value::Array(entries) = value else {
        return Vec::new();
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for pair in entries.chunks_exact(2) {
        if out.len() >= MAX_MEMBERS {
            break;
        }
        let (Value::BulkString(field), Value::BulkString(data)) = (&pair[0], &pair[1]) else {
            continue;
        };
        let Ok(field) = std::str::from_utf8(field) else {
            continue;
        };
        let Some((writer, id)) = field.split_once(':') else {
            continue;
        };
        if writer.is_empty() || !shared(id, data) || !seen.insert(field) {
            continue;
        }
        let member = Member {
            id: id.to_owned(),
            data: Bytes::copy_from_slice(data),
            here: false,
        };
        out.push((writer.to_owned(), member));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(bytes.to_vec())
    }

    #[test]
    fn malformed_entries_are_skipped() {
        let long = vec![b'x'; MAX_MEMBER_BYTES + 1];
        let answer = Value::Array(vec![
            bulk(b"w1:a"),
            bulk(b"one"),
            bulk(b"no writer"),
            bulk(b"x"),
            Value::Int(3),
            bulk(b"x"),
            bulk(b"w1:big"),
            bulk(&long),
            bulk(b"\xff:bad"),
            bulk(b"x"),
            bulk(b"w1:a"),
            bulk(b"again"),
            bulk(b"w2:b"),
            bulk(b""),
            bulk(b"w2:odd"),
        ]);
        let read = read_of(&answer);
        let ids: Vec<(&str, &str)> = read
            .iter()
            .map(|(w, m)| (w.as_str(), m.id.as_str()))
            .collect();
        assert_eq!(ids, [("w1", "a"), ("w2", "b")]);
        assert!(read_of(&Value::Int(1)).is_empty());
    }

    #[test]
    fn changes_become_writes_under_the_current_writer() {
        let mut local = Local::new(&[0xab; 16]);
        local.join("t", "a", Bytes::from_static(b"1"));
        local.join("t", "b", Bytes::from_static(b"2"));
        let writes = local.take();
        assert_eq!(writes.len(), 1);
        assert!(writes[0].alive && local.is_own(&writes[0].writer));
        assert_eq!(writes[0].ops.len(), 2);
        // Emptied: its member removed and its writer gone.
        local.leave("t", "a");
        local.leave("t", "b");
        let writes = local.take();
        assert_eq!(writes.len(), 1);
        assert!(!writes[0].alive);
        assert!(writes[0].ops.iter().all(|(_, data)| data.is_none()));
        assert!(local.here("t").is_empty());
        // Written again: a new writer with every member, the old one gone.
        local.join("u", "c", Bytes::new());
        let first = local.take()[0].writer.clone();
        let again = local.rewrite_all();
        assert_eq!(again.len(), 2);
        assert!(again[0].alive && again[0].writer != first && again[0].ops.len() == 1);
        assert!(!again[1].alive && again[1].writer == first);
        assert!(!local.is_own("0123.1"));
    }
}
