//! QPACK (RFC 9204) as this crate speaks it: with no dynamic table.
//!
//! Both sides' settings say a table capacity of 0 and no blocked
//! streams, so a field section refers only to the static table or spells
//! its fields out (in Huffman code or not), and the encoder and decoder
//! streams carry nothing a connection must keep. A field line naming the
//! dynamic table is the peer's error (`QPACK_DECOMPRESSION_FAILED`).
//!
//! The decoder is bounded by the size the caller accepts (RFC 9114's
//! measure: each field's name and value plus 32), checked as it decodes,
//! so a Huffman string cannot expand past it.

mod huffman;
mod table;

use std::ops::Range;

use bytes::BufMut;

use table::STATIC;

/// Why a field section was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpackError {
    /// Not a valid encoding, or one naming the dynamic table we said we
    /// do not have (`QPACK_DECOMPRESSION_FAILED`).
    Invalid(&'static str),
    /// Larger than the size accepted (the request gets 431).
    TooLarge,
}

impl std::fmt::Display for QpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QpackError::Invalid(why) => write!(f, "bad QPACK field section: {why}"),
            QpackError::TooLarge => f.write_str("field section too large"),
        }
    }
}

impl std::error::Error for QpackError {}

/// What each field costs besides its name and value (RFC 9114, 4.2.2).
pub const FIELD_OVERHEAD: usize = 32;

/// A decoded field section: its fields in order, in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSection {
    bytes: Vec<u8>,
    /// Each field's name and value in `bytes`.
    fields: Vec<(Range<usize>, Range<usize>)>,
}

impl FieldSection {
    /// The fields in order, as name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.fields
            .iter()
            .map(|(name, value)| (&self.bytes[name.clone()], &self.bytes[value.clone()]))
    }

    /// How many fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The size by RFC 9114's measure.
    pub fn size(&self) -> usize {
        self.fields
            .iter()
            .map(|(name, value)| name.len() + value.len() + FIELD_OVERHEAD)
            .sum()
    }
}

/// Decodes a HEADERS frame's payload, refusing a section larger than
/// `max_size` (RFC 9114's measure).
pub fn decode(mut input: &[u8], max_size: usize) -> Result<FieldSection, QpackError> {
    // The prefix: Required Insert Count, then the base. With no table the
    // count must be 0 (section 4.5.1.1), and the base means nothing.
    let (required, _) = integer(&mut input, 8)?;
    if required != 0 {
        return Err(QpackError::Invalid(
            "it needs a dynamic table (we offered none)",
        ));
    }
    let _base = integer(&mut input, 7)?;
    let mut section = FieldSection::default();
    let mut size = 0usize;
    while let Some(&first) = input.first() {
        let start = section.bytes.len();
        let name_end;
        if first & 0x80 != 0 {
            // Indexed field line: 1 T index(6).
            let (index, flags) = integer(&mut input, 6)?;
            let (name, value) = static_entry(index, flags & 0x40 != 0)?;
            section.bytes.extend_from_slice(name.as_bytes());
            name_end = section.bytes.len();
            section.bytes.extend_from_slice(value.as_bytes());
        } else if first & 0x40 != 0 {
            // Literal with a name reference: 01 N T index(4), then the value.
            let (index, flags) = integer(&mut input, 4)?;
            let (name, _) = static_entry(index, flags & 0x10 != 0)?;
            section.bytes.extend_from_slice(name.as_bytes());
            name_end = section.bytes.len();
            let room = room(max_size, size, name.len())?;
            string(&mut input, 7, &mut section.bytes, room)?;
        } else if first & 0x20 != 0 {
            // Literal with a literal name: 001 N H length(3), then the value.
            let name_room = room(max_size, size, 0)?;
            string(&mut input, 3, &mut section.bytes, name_room)?;
            name_end = section.bytes.len();
            let room = room(max_size, size, name_end - start)?;
            string(&mut input, 7, &mut section.bytes, room)?;
        } else {
            // 0001: indexed post-base; 0000: literal with a post-base name.
            return Err(QpackError::Invalid(
                "a post-base reference (we have no dynamic table)",
            ));
        }
        let end = section.bytes.len();
        size += end - start + FIELD_OVERHEAD;
        if size > max_size {
            return Err(QpackError::TooLarge);
        }
        section.fields.push((start..name_end, name_end..end));
    }
    Ok(section)
}

/// Bytes a string may still take: the limit less what was taken, less
/// the field's fixed cost and what of it is already there.
fn room(max_size: usize, size: usize, taken: usize) -> Result<usize, QpackError> {
    max_size
        .checked_sub(size + FIELD_OVERHEAD + taken)
        .ok_or(QpackError::TooLarge)
}

fn static_entry(index: u64, is_static: bool) -> Result<(&'static str, &'static str), QpackError> {
    if !is_static {
        return Err(QpackError::Invalid(
            "a dynamic table reference (we have no dynamic table)",
        ));
    }
    usize::try_from(index)
        .ok()
        .and_then(|index| STATIC.get(index))
        .copied()
        .ok_or(QpackError::Invalid(
            "a static table index past its 99 entries",
        ))
}

/// A prefixed integer (RFC 7541, section 5.1) with an `n`-bit prefix,
/// and the first byte's bits above the prefix.
fn integer(input: &mut &[u8], n: u32) -> Result<(u64, u8), QpackError> {
    let (&first, rest) = input
        .split_first()
        .ok_or(QpackError::Invalid("the section ends inside a field line"))?;
    *input = rest;
    let mask = ((1u16 << n) - 1) as u8;
    let flags = first & !mask;
    let mut value = u64::from(first & mask);
    if value < u64::from(mask) {
        return Ok((value, flags));
    }
    let mut shift = 0u32;
    loop {
        let (&byte, rest) = input
            .split_first()
            .ok_or(QpackError::Invalid("the section ends inside an integer"))?;
        *input = rest;
        // Past 63 bits: an attack or a bug (QUIC itself carries 62).
        if shift > 56 {
            return Err(QpackError::Invalid("an integer of more than 63 bits"));
        }
        value += u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok((value, flags));
        }
    }
}

/// A string literal whose length has an `n`-bit prefix, the bit above it
/// saying Huffman: appended to `out`, at most `room` bytes of it.
fn string(input: &mut &[u8], n: u32, out: &mut Vec<u8>, room: usize) -> Result<(), QpackError> {
    let huffman_bit = 1u8 << n;
    let (len, flags) = integer(input, n)?;
    let len = usize::try_from(len).map_err(|_| QpackError::TooLarge)?;
    if len > input.len() {
        return Err(QpackError::Invalid("a string longer than the section"));
    }
    let (bytes, rest) = input.split_at(len);
    *input = rest;
    if flags & huffman_bit != 0 {
        let limit = out.len() + room;
        huffman::decode(bytes, out, limit).map_err(|error| match error {
            huffman::HuffmanError::Invalid => QpackError::Invalid("bad Huffman code"),
            huffman::HuffmanError::TooLong => QpackError::TooLarge,
        })
    } else if len > room {
        Err(QpackError::TooLarge)
    } else {
        out.extend_from_slice(bytes);
        Ok(())
    }
}

/// Appends the field section for `fields` (names in lowercase): a static
/// entry by index where one matches, a name by index where one does,
/// the rest spelt out, in Huffman code where that is shorter.
pub fn encode<'a>(fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, out: &mut Vec<u8>) {
    // No dynamic table: Required Insert Count 0, base 0.
    out.extend_from_slice(&[0, 0]);
    for (name, value) in fields {
        let exact = STATIC
            .iter()
            .position(|&(n, v)| n.as_bytes() == name && v.as_bytes() == value);
        if let Some(index) = exact {
            // 1 T=1 index(6).
            put_integer(out, 6, 0xc0, index as u64);
            continue;
        }
        match STATIC.iter().position(|&(n, _)| n.as_bytes() == name) {
            // 01 N=0 T=1 index(4).
            Some(index) => put_integer(out, 4, 0x50, index as u64),
            // 001 N=0 H length(3), then the name.
            None => put_string(out, 3, 0x20, name),
        }
        put_string(out, 7, 0x00, value);
    }
}

/// Appends an integer with an `n`-bit prefix after `flags`.
fn put_integer(out: &mut impl BufMut, n: u32, flags: u8, value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.put_u8(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.put_u8(rest as u8);
}

/// Appends a string literal whose length has an `n`-bit prefix after
/// `flags`, in Huffman code if that is shorter (the bit above the prefix).
fn put_string(out: &mut Vec<u8>, n: u32, flags: u8, text: &[u8]) {
    let coded = huffman::encoded_len(text);
    if coded < text.len() {
        put_integer(out, n, flags | (1 << n), coded as u64);
        huffman::encode(text, out);
    } else {
        put_integer(out, n, flags, text.len() as u64);
        out.extend_from_slice(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    fn fields(section: &FieldSection) -> Vec<(String, String)> {
        section
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn the_rfcs_static_example_decodes() {
        // RFC 9204, B.1: a literal with a static name reference.
        let input = [
            0x00, 0x00, 0x51, 0x0b, 0x2f, 0x69, 0x6e, 0x64, 0x65, 0x78, 0x2e, 0x68, 0x74, 0x6d,
            0x6c,
        ];
        let section = decode(&input, 1000).unwrap();
        assert_eq!(fields(&section), [(":path".into(), "/index.html".into())]);
        assert_eq!(section.size(), 5 + 11 + 32);
    }

    #[test]
    fn an_extended_connect_round_trips() {
        let request: [(&[u8], &[u8]); 7] = [
            (b":method", b"CONNECT"),
            (b":protocol", b"websocket"),
            (b":scheme", b"https"),
            (b":path", b"/ws?room=1"),
            (b":authority", b"localhost:9443"),
            (b"sec-websocket-version", b"13"),
            (b"origin", b""),
        ];
        let mut out = Vec::new();
        encode(request, &mut out);
        // :method CONNECT is static entry 15, indexed in one byte.
        assert_eq!(out[2], 0xc0 | 15);
        let section = decode(&out, 4096).unwrap();
        let got: Vec<(&[u8], &[u8])> = section.iter().collect();
        assert_eq!(got, request);
    }

    #[test]
    fn random_fields_round_trip() {
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(500) {
            let count = rng.random_range(0..12);
            let owned: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
                .map(|_| {
                    if rng.random_bool(0.3) {
                        let (n, v) = STATIC[rng.random_range(0..STATIC.len())];
                        let value = if rng.random_bool(0.5) {
                            v.as_bytes().to_vec()
                        } else {
                            (0..rng.random_range(0..200))
                                .map(|_| rng.random())
                                .collect()
                        };
                        (n.as_bytes().to_vec(), value)
                    } else {
                        let name = (0..rng.random_range(1..40))
                            .map(|_| rng.random_range(b'a'..=b'z'))
                            .collect();
                        let value = (0..rng.random_range(0..300))
                            .map(|_| rng.random())
                            .collect();
                        (name, value)
                    }
                })
                .collect();
            let mut out = Vec::new();
            encode(owned.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
            let section = decode(&out, usize::MAX).unwrap();
            let got: Vec<(Vec<u8>, Vec<u8>)> = section
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect();
            assert_eq!(got, owned);
        }
    }

    #[test]
    fn dynamic_table_references_are_refused() {
        for input in [
            &[0x01, 0x00][..],               // Required Insert Count 1
            &[0x00, 0x00, 0x80],             // indexed, T=0 (dynamic)
            &[0x00, 0x00, 0x40, 0x00],       // name reference, T=0
            &[0x00, 0x00, 0x10],             // indexed post-base
            &[0x00, 0x00, 0x00, 0x00],       // literal with a post-base name
            &[0x00, 0x00, 0xff, 0x24],       // static index 63 + 36 = 99: past the table
            &[0x00, 0x00, 0x51, 0x05, b'/'], // a value longer than the section
            &[0x00],                         // no base
            &[0x00, 0x00, 0x3f],             // a name length cut short
        ] {
            assert!(
                matches!(decode(input, 1000), Err(QpackError::Invalid(_))),
                "{input:02x?}"
            );
        }
        assert_eq!(decode(&[0x00, 0x00], 1000), Ok(FieldSection::default()));
    }

    #[test]
    fn the_size_limit_holds_while_decoding() {
        let long = vec![b'a'; 1000];
        let mut out = Vec::new();
        encode([(&b"x-long"[..], &long[..])], &mut out);
        assert_eq!(decode(&out, 1000), Err(QpackError::TooLarge));
        assert!(decode(&out, 1000 + 6 + 32).is_ok());
        // Many small fields add up.
        let mut out = Vec::new();
        encode((0..100).map(|_| (&b"a"[..], &b""[..])), &mut out);
        assert_eq!(decode(&out, 33 * 99), Err(QpackError::TooLarge));
        assert_eq!(decode(&out, 33 * 100).map(|s| s.len()), Ok(100));
    }

    #[test]
    fn integers_of_every_length_round_trip_and_overlong_ones_are_refused() {
        for n in [3, 4, 6, 7, 8] {
            for value in [
                0,
                1,
                (1 << n) - 2,
                (1 << n) - 1,
                1 << n,
                300,
                1 << 40,
                (1 << 62) - 1,
            ] {
                let mut out = Vec::new();
                put_integer(&mut out, n, 0, value);
                let mut input = &out[..];
                assert_eq!(integer(&mut input, n).unwrap().0, value);
                assert!(input.is_empty());
            }
        }
        let mut input = &[
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ][..];
        assert!(integer(&mut input, 8).is_err());
    }

    #[test]
    fn random_input_never_panics_nor_passes_the_limit() {
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(5000) {
            let len = rng.random_range(0..64);
            let mut input: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if input.len() >= 2 && rng.random_bool(0.7) {
                input[0] = 0;
                input[1] = 0;
            }
            if let Ok(section) = decode(&input, 256) {
                assert!(section.size() <= 256);
            }
        }
    }
}
