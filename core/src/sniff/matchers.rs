//! What a port router decides by: does a connection's start look like
//! HTTP/1, HTTP/2's preface, or an smux session? Each matcher answers
//! `Some(true)` or `Some(false)` as soon as the bytes so far decide, and
//! `None` while they do not: it never needs more than its bound, and it
//! reads nothing past what it needs. ([`proxy::sniff`](super::proxy::sniff)
//! and [`hello::sniff`](super::hello::sniff) are the same kind.)

use crate::mux::frame::{Command, HEADER_LEN, Header};

/// HTTP/2's client connection preface (RFC 9113, 3.4): what a client with
/// prior knowledge (h2c, gRPC without TLS) sends first.
pub const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The longest HTTP/1 request line [`http1`] waits for.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;

/// The longest method [`http1`] takes (`PROPPATCH`, `MKCALENDAR`, ... fit).
const MAX_METHOD: usize = 24;

/// An HTTP/1.x request line: a method (a token of capitals, RFC 9110's
/// registered ones all are), one space, a target, one space, `HTTP/1.`
/// and a digit, CRLF. Decided within [`MAX_REQUEST_LINE`] bytes (a line
/// not ended by then is `false`); a wrong method byte decides at once.
pub fn http1(input: &[u8]) -> Option<bool> {
    let method = input.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if method > MAX_METHOD {
        return Some(false);
    }
    match input.get(method) {
        None => return None,
        Some(b' ') if method > 0 => {}
        Some(_) => return Some(false),
    }
    let rest = &input[method + 1..];
    let target = rest.iter().take_while(|&&b| b > b' ' && b < 0x7f).count();
    match rest.get(target) {
        None if input.len() >= MAX_REQUEST_LINE => return Some(false),
        None => return None,
        Some(b' ') if target > 0 => {}
        Some(_) => return Some(false),
    }
    let version = &rest[target + 1..];
    let want = b"HTTP/1.";
    let n = version.len().min(want.len());
    if version[..n] != want[..n] {
        return Some(false);
    }
    match version.get(want.len()..) {
        None | Some([]) => None,
        Some([digit, ..]) if !digit.is_ascii_digit() => Some(false),
        Some([_]) => None,
        Some([_, b'\r']) => None,
        Some([_, b'\r', b'\n', ..]) => Some(true),
        Some(_) => Some(false),
    }
}

/// HTTP/2's preface, or as much of it as has come.
pub fn http2(input: &[u8]) -> Option<bool> {
    prefix(input, HTTP2_PREFACE)
}

/// Whether `input` starts with `prefix`: `None` while what has come of
/// it agrees and is shorter.
pub fn prefix(input: &[u8], prefix: &[u8]) -> Option<bool> {
    let n = input.len().min(prefix.len());
    match input[..n] == prefix[..n] {
        false => Some(false),
        true if n == prefix.len() => Some(true),
        true => None,
    }
}

/// An smux session's first frame: a SYN of version 1 or 2, with no
/// payload and a stream id other than 0 (what xtaci/smux's client sends
/// when it opens its first stream). Decided by the first byte when that is
/// not a version, otherwise by the eighth.
pub fn smux(input: &[u8]) -> Option<bool> {
    match input.first() {
        None => return None,
        Some(1 | 2) => {}
        Some(_) => return Some(false),
    }
    if input.len() < HEADER_LEN {
        return None;
    }
    let header = Header::decode(input)?;
    let syn = header.command == Command::Syn.byte() && header.length == 0;
    Some(syn && header.stream != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer after each prefix of `input`: `None` until `at`, then
    /// `Some(want)`.
    fn decided_at(matcher: fn(&[u8]) -> Option<bool>, input: &[u8], at: usize, want: bool) {
        for n in 0..=input.len() {
            let expected = if n < at { None } else { Some(want) };
            assert_eq!(
                matcher(&input[..n]),
                expected,
                "{:?}",
                String::from_utf8_lossy(&input[..n])
            );
        }
    }

    #[test]
    fn http1_request_lines() {
        let line = b"GET /files/a.txt?x=1 HTTP/1.1\r\nHost: a\r\n";
        decided_at(http1, line, 31, true);
        decided_at(http1, b"OPTIONS * HTTP/1.0\r\n", 20, true);
        decided_at(http1, b"CONNECT example.com:443 HTTP/1.1\r\n", 34, true);
        // Decided wrong at the first byte that cannot be.
        decided_at(http1, b"get / HTTP/1.1\r\n", 1, false);
        decided_at(http1, b"GET  / HTTP/1.1\r\n", 5, false);
        decided_at(http1, b" / HTTP/1.1\r\n", 1, false);
        decided_at(http1, b"GET / HTTP/2.0\r\n", 12, false);
        decided_at(http1, b"GET / HTTP/1.x\r\n", 14, false);
        decided_at(http1, b"GET / HTTP/1.1\n", 15, false);
        decided_at(http1, b"GET /\xff HTTP/1.1\r\n", 6, false);
        // HTTP/2's preface is no HTTP/1 request.
        decided_at(http1, HTTP2_PREFACE, 12, false);
        // A line that never ends, and a method that never does.
        let mut long = b"GET /".to_vec();
        long.resize(MAX_REQUEST_LINE, b'a');
        assert_eq!(http1(&long[..MAX_REQUEST_LINE - 1]), None);
        assert_eq!(http1(&long), Some(false));
        assert_eq!(http1(&[b'A'; MAX_METHOD]), None);
        assert_eq!(http1(&[b'A'; MAX_METHOD + 1]), Some(false));
    }

    #[test]
    fn http2_preface() {
        decided_at(http2, HTTP2_PREFACE, 24, true);
        decided_at(http2, b"PRI * HTTP/1.1\r\n", 12, false);
        decided_at(http2, b"GET / HTTP/1.1\r\n", 1, false);
    }

    #[test]
    fn smux_syn() {
        let syn = |version: u8, command: u8, length: u16, stream: u32| {
            Header {
                version,
                command,
                length,
                stream,
            }
            .encode()
        };
        decided_at(smux, &syn(1, 0, 0, 1), 8, true);
        decided_at(smux, &syn(2, 0, 0, 3), 8, true);
        decided_at(smux, &syn(3, 0, 0, 1), 1, false);
        decided_at(smux, &syn(2, 2, 0, 1), 8, false); // PSH first
        decided_at(smux, &syn(2, 0, 5, 1), 8, false); // a SYN with payload
        decided_at(smux, &syn(2, 0, 0, 0), 8, false); // stream 0
        decided_at(smux, b"GET / HTTP/1.1\r\n", 1, false);
        decided_at(smux, &[22, 3, 1, 0, 5], 1, false);
    }

    /// No matcher panics, and each decides within its bound.
    #[test]
    fn arbitrary_input() {
        use rand::RngExt;
        let mut rng = rand::rng();
        for _ in 0..crate::rounds(20_000) {
            let len = rng.random_range(0..64);
            let mut input: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if rng.random_bool(0.5) {
                let seed: &[u8] = [
                    &b"GET / HTTP/1.1\r\n"[..],
                    HTTP2_PREFACE,
                    &[2, 0, 0, 0, 1, 0, 0, 0],
                ][rng.random_range(0..3)];
                input = [seed, &input].concat();
                input.truncate(rng.random_range(0..=input.len()));
            }
            let _ = (http1(&input), http2(&input), smux(&input));
        }
        assert_eq!(http2(&[0; 24]), Some(false));
        assert_eq!(smux(&[1; 8]), Some(false));
    }
}
