//! QUIC's variable-length integers (RFC 9000, section 16): the two high
//! bits of the first byte give the length (1, 2, 4 or 8 bytes), the rest
//! is the value, big-endian. HTTP/3 writes frame types, lengths, stream
//! types and settings this way.

use bytes::BufMut;

/// The largest value a varint holds: 2^62 - 1.
pub const MAX: u64 = (1 << 62) - 1;

/// The value at the start of `input` and how many bytes it took; `None`
/// if `input` ends before it does.
pub fn decode(input: &[u8]) -> Option<(u64, usize)> {
    let first = *input.first()?;
    let len = 1usize << (first >> 6);
    let bytes = input.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for &byte in &bytes[1..] {
        value = (value << 8) | u64::from(byte);
    }
    Some((value, len))
}

/// How many bytes `value` takes (the shortest form).
pub fn len(value: u64) -> usize {
    match value {
        0..=63 => 1,
        64..=16_383 => 2,
        16_384..=1_073_741_823 => 4,
        _ => 8,
    }
}

/// Appends `value` in its shortest form.
///
/// # Panics
/// If `value` is over [`MAX`]: every caller writes lengths, types and
/// settings of its own, all far below it.
pub fn encode(value: u64, out: &mut impl BufMut) {
    assert!(value <= MAX, "{value} does not fit a QUIC varint");
    match len(value) {
        1 => out.put_u8(value as u8),
        2 => out.put_u16(0x4000 | value as u16),
        4 => out.put_u32(0x8000_0000 | value as u32),
        _ => out.put_u64(0xc000_0000_0000_0000 | value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn the_rfcs_examples() {
        // RFC 9000, appendix A.1.
        let examples: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in examples {
            assert_eq!(decode(bytes), Some((value, bytes.len())));
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(out, bytes);
        }
        // A longer form than needed is still a valid encoding.
        assert_eq!(decode(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn short_input_is_incomplete() {
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[0x40]), None);
        assert_eq!(decode(&[0x80, 0, 0]), None);
        assert_eq!(decode(&[0xc0, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn values_round_trip_at_every_length() {
        let mut rng = rand::rng();
        let edges = [0, 63, 64, 16_383, 16_384, 1_073_741_823, 1_073_741_824, MAX];
        let random = (0..crate::rounds(1000)).map(|_| rng.random_range(0..=MAX));
        for value in edges.into_iter().chain(random) {
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(out.len(), len(value));
            assert_eq!(decode(&out), Some((value, out.len())));
        }
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn too_large_a_value_is_a_bug() {
        encode(MAX + 1, &mut Vec::new());
    }
}
