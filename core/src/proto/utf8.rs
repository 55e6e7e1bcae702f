//! Incremental UTF-8 validation for text messages that arrive in pieces.
//!
//! A text message may be split over several frames, and a frame over several
//! reads, at any byte, including inside a multi-byte character. Autobahn section 6
//! requires failing as soon as the bytes received so far cannot be the start of
//! valid UTF-8, not when the message ends. [`Utf8Validator`] keeps at most three
//! bytes of an unfinished character between pieces and asks `simdutf8` (SIMD, with
//! its own run-time CPU detection) about everything else.

use simdutf8::compat::from_utf8;

/// The bytes seen so far are not, and cannot become, valid UTF-8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidUtf8;

impl std::fmt::Display for InvalidUtf8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("invalid UTF-8")
    }
}

impl std::error::Error for InvalidUtf8 {}

/// Validates a byte stream piece by piece. Create one per text message.
#[derive(Clone, Debug, Default)]
pub struct Utf8Validator {
    /// An unfinished character from the end of the previous piece.
    partial: [u8; 4],
    partial_len: u8,
}

impl Utf8Validator {
    /// A validator at the start of a message.
    pub const fn new() -> Self {
        Utf8Validator {
            partial: [0; 4],
            partial_len: 0,
        }
    }

    /// Validates the next piece. Fails if the stream so far cannot be a prefix of
    /// valid UTF-8.
    pub fn feed(&mut self, mut piece: &[u8]) -> Result<(), InvalidUtf8> {
        if self.partial_len > 0 {
            let have = usize::from(self.partial_len);
            let need = sequence_len(self.partial[0]);
            let take = (need - have).min(piece.len());
            self.partial[have..have + take].copy_from_slice(&piece[..take]);
            self.partial_len += take as u8;
            piece = &piece[take..];
            let filled = &self.partial[..usize::from(self.partial_len)];
            match from_utf8(filled) {
                Ok(_) => self.partial_len = 0,
                // Still unfinished but still plausible: wait for more.
                Err(e) if e.error_len().is_none() => return Ok(()),
                Err(_) => return Err(InvalidUtf8),
            }
        }
        match from_utf8(piece) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_none() => {
                // The piece ends inside a character that may still be completed.
                let tail = &piece[e.valid_up_to()..];
                self.partial[..tail.len()].copy_from_slice(tail);
                self.partial_len = tail.len() as u8;
                Ok(())
            }
            Err(_) => Err(InvalidUtf8),
        }
    }

    /// Ends the stream: fails if it stops inside a character.
    pub fn finish(&mut self) -> Result<(), InvalidUtf8> {
        let unfinished = self.partial_len != 0;
        self.partial_len = 0;
        if unfinished { Err(InvalidUtf8) } else { Ok(()) }
    }

    /// True if no unfinished character is pending.
    pub fn is_at_boundary(&self) -> bool {
        self.partial_len == 0
    }
}

/// Validates a complete buffer in one call (the common, unfragmented case).
#[inline]
pub fn validate(bytes: &[u8]) -> Result<&str, InvalidUtf8> {
    simdutf8::basic::from_utf8(bytes).map_err(|_| InvalidUtf8)
}

/// The encoded length announced by a valid leading byte. Only called on bytes
/// that `simdutf8` already accepted as the start of an unfinished character.
fn sequence_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    fn feed_in_pieces(bytes: &[u8], cuts: &[usize]) -> Result<(), InvalidUtf8> {
        let mut v = Utf8Validator::new();
        let mut at = 0;
        for &cut in cuts {
            v.feed(&bytes[at..cut])?;
            at = cut;
        }
        v.feed(&bytes[at..])?;
        v.finish()
    }

    const SAMPLES: &[&str] = &[
        "",
        "hello",
        "κόσμε",
        "Hello-µ@ßöäüàá-UTF-8!!",
        "\u{10FFFF}\u{FFFF}\u{80}\u{7FF}\u{800}",
        "𝄞 music 🎵 and emoji 👩‍👩‍👧",
    ];

    #[test]
    fn valid_text_split_at_every_byte_is_accepted() {
        for s in SAMPLES {
            let b = s.as_bytes();
            for cut in 0..=b.len() {
                assert_eq!(feed_in_pieces(b, &[cut]), Ok(()), "{s:?} cut at {cut}");
            }
            let every: Vec<usize> = (0..=b.len()).collect();
            assert_eq!(feed_in_pieces(b, &every), Ok(()), "{s:?} byte by byte");
        }
    }

    #[test]
    fn matches_std_on_random_bytes_in_random_pieces() {
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(5000) {
            let len = rng.random_range(0..24);
            // Mostly valid text, sometimes with random bytes spliced in.
            let mut bytes = SAMPLES[rng.random_range(0..SAMPLES.len())]
                .as_bytes()
                .to_vec();
            for _ in 0..len {
                if rng.random_bool(0.3) {
                    bytes.insert(rng.random_range(0..=bytes.len()), rng.random());
                }
            }
            let mut cuts: Vec<usize> = (0..rng.random_range(0..4))
                .map(|_| rng.random_range(0..=bytes.len()))
                .collect();
            cuts.sort_unstable();
            let expected = std::str::from_utf8(&bytes).is_ok();
            assert_eq!(
                feed_in_pieces(&bytes, &cuts).is_ok(),
                expected,
                "{bytes:x?} {cuts:?}"
            );
        }
    }

    #[test]
    fn fails_fast_before_the_stream_ends() {
        // U+110000 would need F4 90: it is out of range, known at the second byte.
        let mut v = Utf8Validator::new();
        v.feed(b"abc\xF4").unwrap();
        assert_eq!(v.feed(b"\x90"), Err(InvalidUtf8));
        // A surrogate (ED A0..) is known to be invalid at its second byte.
        let mut v = Utf8Validator::new();
        v.feed(b"\xED").unwrap();
        assert_eq!(v.feed(b"\xA0\x80"), Err(InvalidUtf8));
        // An overlong encoding of '/' (C0 AF) fails at its first byte.
        let mut v = Utf8Validator::new();
        assert_eq!(v.feed(b"ok\xC0"), Err(InvalidUtf8));
        // A stray continuation byte fails immediately.
        let mut v = Utf8Validator::new();
        assert_eq!(v.feed(b"\x80"), Err(InvalidUtf8));
    }

    #[test]
    fn an_unfinished_character_at_the_end_fails_on_finish() {
        let mut v = Utf8Validator::new();
        v.feed("é".as_bytes().split_at(1).0).unwrap();
        assert!(!v.is_at_boundary());
        assert_eq!(v.finish(), Err(InvalidUtf8));
        assert!(v.is_at_boundary());
    }

    #[test]
    fn a_partial_character_split_over_three_pieces_is_completed() {
        let bytes = "🎵".as_bytes();
        let mut v = Utf8Validator::new();
        v.feed(&bytes[..1]).unwrap();
        v.feed(&bytes[1..2]).unwrap();
        v.feed(&bytes[2..]).unwrap();
        assert_eq!(v.finish(), Ok(()));
    }
}
