//! Percent-encoding (RFC 3986) for query values and URL credentials: the
//! bus's topics and positions in a subscribe URL, a proxy's user and
//! password in the client's.

use std::fmt::Write;

/// `%XX` escapes decoded (`+` is kept as it is); `None` for a broken escape
/// (anything but two hex digits after `%`: `%+A` is not a newline) or bytes
/// that are not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let high = char::from(bytes.next()?).to_digit(16)?;
            let low = char::from(bytes.next()?).to_digit(16)?;
            out.push((high << 4 | low) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// `text` with every byte but the URL's unreserved ones (letters, digits,
/// `-._~`) escaped as `%XX`: safe in a query value and in a list of them
/// (`,`, `:`, `&`, `=` and `+` are escaped).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_broken_ones_are_refused() {
        assert_eq!(percent_decode("a%2Cb%20c+d").as_deref(), Some("a,b c+d"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        for broken in ["%+A", "%-1", "%+0", "% A", "%A"] {
            assert_eq!(percent_decode(broken), None, "{broken}");
        }
        assert_eq!(percent_decode("%0a%0A").as_deref(), Some("\n\n"));
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn encoding_round_trips_and_leaves_no_separator() {
        for text in ["a", "a:b", "a,b c+d&e=f", "✓ news/eu", "%41", "~._-", ""] {
            let encoded = percent_encode(text);
            assert!(
                !encoded.contains([',', ':', '&', '=', '+', ' ']),
                "{encoded}"
            );
            assert_eq!(percent_decode(&encoded).as_deref(), Some(text));
        }
    }
}
