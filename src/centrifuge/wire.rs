//! Protobuf's wire format, by hand: varints, tags and length-delimited
//! fields read from a borrowed slice (never an allocation sized by the
//! peer), and written to a `Vec`.

use super::DecodeError;

/// A field's value as the wire carries it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value<'a> {
    Varint(u64),
    Fixed64,
    Fixed32,
    Bytes(&'a [u8]),
}

impl<'a> Value<'a> {
    pub(super) fn varint(self) -> Result<u64, DecodeError> {
        match self {
            Value::Varint(v) => Ok(v),
            _ => Err(DecodeError::Protobuf(
                "a varint field has another wire type",
            )),
        }
    }

    pub(super) fn bytes(self) -> Result<&'a [u8], DecodeError> {
        match self {
            Value::Bytes(b) => Ok(b),
            _ => Err(DecodeError::Protobuf(
                "a length-delimited field has another wire type",
            )),
        }
    }

    pub(super) fn string(self) -> Result<String, DecodeError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Protobuf("a string field is not UTF-8"))
    }

    pub(super) fn bool(self) -> Result<bool, DecodeError> {
        Ok(self.varint()? != 0)
    }

    /// uint32: a longer value is cut to its low bits, as protobuf does.
    pub(super) fn u32(self) -> Result<u32, DecodeError> {
        Ok(self.varint()? as u32)
    }

    /// int32: negative values come sign-extended to ten bytes.
    pub(super) fn i32(self) -> Result<i32, DecodeError> {
        Ok(self.varint()? as i32)
    }
}

/// Reads `(field number, value)` pairs off a message's bytes.
pub(super) struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Fields<'a> {
        Fields { buf }
    }

    pub(super) fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, DecodeError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = read_varint(&mut self.buf)?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(DecodeError::Protobuf("a field number out of range"));
        }
        let value = match key & 7 {
            0 => Value::Varint(read_varint(&mut self.buf)?),
            1 => {
                self.skip(8)?;
                Value::Fixed64
            }
            2 => {
                let len = read_varint(&mut self.buf)?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.skip(4)?;
                Value::Fixed32
            }
            _ => return Err(DecodeError::Protobuf("a group or unknown wire type")),
        };
        Ok(Some((number as u32, value)))
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], DecodeError> {
        if len > self.buf.len() as u64 {
            return Err(DecodeError::Protobuf("a length past the end of the frame"));
        }
        let (head, rest) = self.buf.split_at(len as usize);
        self.buf = rest;
        Ok(head)
    }

    fn skip(&mut self, len: u64) -> Result<(), DecodeError> {
        self.take(len).map(|_| ())
    }
}

/// Reads a varint off the front of `buf`: at most ten bytes, the tenth
/// holding only the top bit.
pub(super) fn read_varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        if i == 9 && byte > 1 {
            break;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    Err(DecodeError::Protobuf("a varint truncated or over 64 bits"))
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

/// Proto3 leaves zero values out: each writer below writes nothing for 0,
/// false or empty.
pub(super) fn put_u64(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        put_key(out, field, 0);
        put_varint(out, value);
    }
}

pub(super) fn put_i64(out: &mut Vec<u8>, field: u32, value: i64) {
    put_u64(out, field, value as u64);
}

pub(super) fn put_bool(out: &mut Vec<u8>, field: u32, value: bool) {
    put_u64(out, field, u64::from(value));
}

pub(super) fn put_bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        put_key(out, field, 2);
        put_varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }
}

/// A message field, written even when empty (an empty result still says
/// which command it answers). Its length goes in front once it is known.
pub(super) fn put_message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    put_key(out, field, 2);
    let start = out.len();
    body(out);
    let mut len = Vec::with_capacity(10);
    put_varint(&mut len, (out.len() - start) as u64);
    out.splice(start..start, len);
}

/// A map entry: key 1, value 2 (a message, written even when empty).
pub(super) fn put_entry(
    out: &mut Vec<u8>,
    field: u32,
    key: &str,
    value: impl FnOnce(&mut Vec<u8>),
) {
    put_message(out, field, |entry| {
        put_bytes(entry, 1, key.as_bytes());
        put_message(entry, 2, value);
    });
}
