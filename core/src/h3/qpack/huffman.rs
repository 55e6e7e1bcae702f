//! The Huffman code of HPACK (RFC 7541, Appendix B), which QPACK uses for
//! string literals.
//!
//! The code is canonical: sorting the 257 symbols (the 256 bytes and EOS)
//! by code length, then by value, and counting up gives every code. So the
//! table here is only each symbol's length; the codes, and the decoder's
//! tables, are computed from it at compile time.

/// Each symbol's code length in bits: bytes 0 to 255, then EOS (256).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const EOS: usize = 256;
/// The longest code (EOS's).
const MAX_LEN: usize = 30;

/// The decoder's tables for canonical decoding: how many codes have each
/// length, the first code of each length, and the symbols in code order.
struct Tables {
    count: [u16; MAX_LEN + 1],
    first: [u32; MAX_LEN + 1],
    /// Where each length's symbols start in `symbols`.
    start: [u16; MAX_LEN + 1],
    symbols: [u16; 257],
    codes: [u32; 257],
}

const TABLES: Tables = build();

const fn build() -> Tables {
    let mut count = [0u16; MAX_LEN + 1];
    let mut i = 0;
    while i < 257 {
        count[LENGTHS[i] as usize] += 1;
        i += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut start = [0u16; MAX_LEN + 1];
    let mut code = 0u32;
    let mut placed = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        first[len] = code;
        start[len] = placed;
        code = (code + count[len] as u32) << 1;
        placed += count[len];
        len += 1;
    }
    // Symbols of each length in order of value: the canonical order.
    let mut symbols = [0u16; 257];
    let mut codes = [0u32; 257];
    let mut next = start;
    let mut symbol = 0;
    while symbol < 257 {
        let len = LENGTHS[symbol] as usize;
        let rank = next[len];
        symbols[rank as usize] = symbol as u16;
        codes[symbol] = first[len] + (rank - start[len]) as u32;
        next[len] += 1;
        symbol += 1;
    }
    Tables {
        count,
        first,
        start,
        symbols,
        codes,
    }
}

/// Why a Huffman string was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HuffmanError {
    /// EOS inside the string, or padding longer than 7 bits or not all
    /// ones (RFC 7541, section 5.2).
    Invalid,
    /// The decoded string would pass the caller's limit.
    TooLong,
}

/// Appends the decoding of `input` to `out`, refusing to let `out` grow
/// past `limit` bytes.
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<(), HuffmanError> {
    let tables = &TABLES;
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let offset = code.wrapping_sub(tables.first[len]);
            if offset < u32::from(tables.count[len]) {
                let symbol = tables.symbols[usize::from(tables.start[len]) + offset as usize];
                if usize::from(symbol) == EOS {
                    return Err(HuffmanError::Invalid);
                }
                if out.len() >= limit {
                    return Err(HuffmanError::TooLong);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == MAX_LEN {
                // Every 30-bit pattern is a code (EOS is the last), so this
                // is unreachable; refuse rather than trust that.
                return Err(HuffmanError::Invalid);
            }
        }
    }
    // What is left is padding: at most 7 bits, all ones.
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HuffmanError::Invalid);
    }
    Ok(())
}

/// The length of `input` Huffman-coded, in bytes.
pub(crate) fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input
        .iter()
        .map(|&byte| usize::from(LENGTHS[usize::from(byte)]))
        .sum();
    bits.div_ceil(8)
}

/// Appends `input` Huffman-coded to `out`, padded with ones.
pub(crate) fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &byte in input {
        let len = u32::from(LENGTHS[usize::from(byte)]);
        acc = (acc << len) | u64::from(TABLES.codes[usize::from(byte)]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 7541's examples (C.4 and C.6).
    const EXAMPLES: [(&str, &str); 8] = [
        ("www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
        ("no-cache", "a8eb10649cbf"),
        ("custom-key", "25a849e95ba97d7f"),
        ("custom-value", "25a849e95bb8e8b4bf"),
        ("302", "6402"),
        ("private", "aec3771a4b"),
        (
            "Mon, 21 Oct 2013 20:13:21 GMT",
            "d07abe941054d444a8200595040b8166e082a62d1bff",
        ),
        (
            "https://www.example.com",
            "9d29ad171863c78f0b97c8e9ae82ae43d3",
        ),
    ];

    #[test]
    fn the_rfcs_examples_decode_and_encode() {
        for (text, coded) in EXAMPLES {
            let coded = hex(coded);
            let mut out = Vec::new();
            decode(&coded, &mut out, usize::MAX).unwrap();
            assert_eq!(out, text.as_bytes());
            let mut back = Vec::new();
            encode(text.as_bytes(), &mut back);
            assert_eq!(back, coded, "{text}");
            assert_eq!(encoded_len(text.as_bytes()), coded.len());
        }
    }

    #[test]
    fn the_codes_are_a_prefix_code_of_the_rfcs_lengths() {
        // A few codes from the RFC's table, and EOS all ones.
        assert_eq!(
            (TABLES.codes[usize::from(b'0')], LENGTHS[usize::from(b'0')]),
            (0x0, 5)
        );
        assert_eq!(
            (TABLES.codes[usize::from(b'a')], LENGTHS[usize::from(b'a')]),
            (0x3, 5)
        );
        assert_eq!((TABLES.codes[0], LENGTHS[0]), (0x1ff8, 13));
        assert_eq!((TABLES.codes[255], LENGTHS[255]), (0x3ffffee, 26));
        assert_eq!((TABLES.codes[EOS], LENGTHS[EOS]), (0x3fff_ffff, 30));
        // Kraft's equality: a complete prefix code.
        let sum: u64 = LENGTHS
            .iter()
            .map(|&len| 1u64 << (MAX_LEN - usize::from(len)))
            .sum();
        assert_eq!(sum, 1 << MAX_LEN);
    }

    #[test]
    fn every_byte_string_round_trips() {
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(2000) {
            let len = rng.random_range(0..64);
            let text: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let mut coded = Vec::new();
            encode(&text, &mut coded);
            assert_eq!(coded.len(), encoded_len(&text));
            let mut out = Vec::new();
            decode(&coded, &mut out, usize::MAX).unwrap();
            assert_eq!(out, text);
        }
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // "0" is 00000 (5 bits): padding of three zeros is not ones.
        assert_eq!(decode(&[0x00], &mut out, 100), Err(HuffmanError::Invalid));
        // "0" then 111 is right.
        out.clear();
        assert_eq!(decode(&[0x07], &mut out, 100), Ok(()));
        assert_eq!(out, b"0");
        // A whole byte of padding is too long.
        out.clear();
        assert_eq!(
            decode(&[0x07, 0xff], &mut out, 100),
            Err(HuffmanError::Invalid)
        );
        // EOS (30 ones) inside the string.
        out.clear();
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out, 100),
            Err(HuffmanError::Invalid)
        );
    }

    #[test]
    fn the_limit_holds() {
        let mut coded = Vec::new();
        encode(b"aaaaaaaaaa", &mut coded);
        let mut out = Vec::new();
        assert_eq!(decode(&coded, &mut out, 4), Err(HuffmanError::TooLong));
        assert!(out.len() <= 4);
    }

    #[test]
    fn random_input_never_panics() {
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(5000) {
            let len = rng.random_range(0..32);
            let input: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let mut out = Vec::new();
            let _ = decode(&input, &mut out, 16);
            assert!(out.len() <= 16);
        }
    }
}
