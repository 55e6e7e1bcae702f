//! The URLs a client is given, sans-I/O: a WebSocket server's (`ws://`,
//! `wss://`) and a proxy's (`http://`, `socks5://`).
//!
//! Only what a connection needs is parsed: the scheme, credentials, the
//! host (a name, an IPv4 address, or an IPv6 literal in brackets), the port
//! and the request target. Anything else is refused with a reason rather
//! than guessed at: a fragment (RFC 6455 §3 forbids it), a host with
//! characters no DNS name has (internationalised names must be given in
//! their ASCII form), a port out of range, spaces or controls in the path.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::handshake::percent_decode;

/// Why a URL was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlError {
    reason: &'static str,
}

impl UrlError {
    pub(crate) fn new(reason: &'static str) -> Self {
        UrlError { reason }
    }

    /// A URL a WebSocket client cannot connect to.
    pub(crate) fn scheme() -> Self {
        UrlError::new(
            "the scheme is not ws or wss: a WebSocket URL starts with ws:// (wss:// for TLS); \
             for an http:// or https:// address, give the same host and path as ws:// or wss://",
        )
    }

    /// What is wrong with it, in a few words.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid URL: {}", self.reason)
    }
}

impl std::error::Error for UrlError {}

/// A host as a URL names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A name to resolve, lower-cased.
    Name(String),
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address (written in brackets).
    V6(Ipv6Addr),
}

impl fmt::Display for Host {
    /// As the `Host` header and an HTTP CONNECT target write it: IPv6 in
    /// brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::V4(ip) => write!(f, "{ip}"),
            Host::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// A parsed URL: `scheme://[user[:password]@]host[:port][/path][?query]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// Lower-cased.
    pub scheme: String,
    /// Percent-decoded user name and password, if the URL has them.
    pub credentials: Option<(String, String)>,
    /// The host: a name or an address.
    pub host: Host,
    /// The port the URL gives, or `None` for the scheme's default.
    pub port: Option<u16>,
    /// Path and query, as they are sent: `/` when the URL has no path.
    pub target: String,
}

impl Url {
    /// Parses `input` (surrounding whitespace is ignored).
    pub fn parse(input: &str) -> Result<Url, UrlError> {
        let input = input.trim();
        let (scheme, rest) = input
            .split_once("://")
            .ok_or(UrlError::new("no scheme (expected e.g. ws://host/)"))?;
        let valid_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
        if !valid_scheme {
            return Err(UrlError::new("the scheme is not valid"));
        }
        if rest.contains('#') {
            return Err(UrlError::new("a WebSocket URL must not have a fragment"));
        }
        let scheme = scheme.to_ascii_lowercase();
        // In the schemes browsers call special, a backslash is a slash
        // (WHATWG URL): `ws://a:1\@b/` is host `a`, port 1, path `/@b/`.
        // Reading the `@` as the end of credentials instead would connect
        // where an allow-list checked with a browser's parser did not look.
        let special = matches!(scheme.as_str(), "ws" | "wss" | "http" | "https");
        let ends_authority: &[char] = if special {
            &['/', '?', '\\']
        } else {
            &['/', '?']
        };
        let authority_end = rest.find(ends_authority).unwrap_or(rest.len());
        let (authority, target) = rest.split_at(authority_end);
        let target = match target {
            "" => "/".to_owned(),
            t if t.starts_with('?') => format!("/{t}"),
            t if special => {
                let (path, query) = t.split_at(t.find('?').unwrap_or(t.len()));
                format!("{}{query}", path.replace('\\', "/"))
            }
            t => t.to_owned(),
        };
        if !target.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(UrlError::new(
                "the path has spaces, controls or non-ASCII characters (percent-encode them)",
            ));
        }
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(parse_userinfo(userinfo)?), host_port),
            None => (None, authority),
        };
        let (host, port) = parse_host_port(host_port)?;
        Ok(Url {
            scheme,
            credentials,
            host,
            port,
            target,
        })
    }

    /// The port, or `default` when the URL gives none.
    pub fn port_or(&self, default: u16) -> u16 {
        self.port.unwrap_or(default)
    }

    /// `host` or `host:port` as the `Host` header wants it: the port is left
    /// out when it is the scheme's default.
    pub fn authority(&self, default_port: u16) -> String {
        match self.port {
            Some(port) if port != default_port => format!("{}:{port}", self.host),
            _ => self.host.to_string(),
        }
    }
}

fn parse_userinfo(userinfo: &str) -> Result<(String, String), UrlError> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let bad = || UrlError::new("the credentials are not validly percent-encoded");
    Ok((
        percent_decode(user).ok_or_else(bad)?,
        percent_decode(password).ok_or_else(bad)?,
    ))
}

fn parse_host_port(host_port: &str) -> Result<(Host, Option<u16>), UrlError> {
    let (host, port) = if let Some(rest) = host_port.strip_prefix('[') {
        let (literal, after) = rest
            .split_once(']')
            .ok_or(UrlError::new("an IPv6 literal without its closing ]"))?;
        let ip = literal
            .parse::<Ipv6Addr>()
            .map_err(|_| UrlError::new("the IPv6 literal is not valid"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or(UrlError::new("unexpected text after the IPv6 literal"))?,
            ),
        };
        (Host::V6(ip), port)
    } else {
        let (host, port) = match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        };
        (parse_name(host)?, port)
    };
    let port = match port {
        None => None,
        Some(p) => {
            let valid = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            match p.parse::<u16>() {
                Ok(port) if valid && port != 0 => Some(port),
                _ => return Err(UrlError::new("the port is not a number from 1 to 65535")),
            }
        }
    };
    Ok((host, port))
}

fn parse_name(host: &str) -> Result<Host, UrlError> {
    if host.is_empty() {
        return Err(UrlError::new("no host"));
    }
    if ends_in_a_number(host) {
        return parse_ipv4(host)
            .map(Host::V4)
            .ok_or(UrlError::new("the host is not a valid IPv4 address"));
    }
    let valid = host.len() <= 253
        && host.split('.').enumerate().all(|(i, label)| {
            // A trailing dot (an absolute name) leaves one empty label.
            (label.is_empty() && i > 0 && host.ends_with('.') && i == host.split('.').count() - 1)
                || (!label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        });
    if !valid {
        return Err(UrlError::new(
            "the host is not a valid name (internationalised names must be given in their xn-- form)",
        ));
    }
    Ok(Host::Name(host.to_ascii_lowercase()))
}

/// Whether a browser reads `host` as an IPv4 address (WHATWG URL, "ends in
/// a number"): its last label (a trailing dot aside) is decimal digits, or
/// `0x` and hex digits. Such a host is an address or an error, never a name
/// to resolve: `2130706433` and `0x7f.1` are 127.0.0.1, as in a browser.
fn ends_in_a_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .or_else(|| last.strip_prefix("0X"))
        .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An IPv4 address in any form a browser takes (WHATWG URL's IPv4 parser):
/// one to four parts, each decimal, octal (a leading 0) or hex (`0x`); the
/// last part fills the bytes the others leave (`127.1` is 127.0.0.1).
fn parse_ipv4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut numbers = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) =
            if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (hex, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else if part.is_empty() {
                return None;
            } else {
                (*part, 10)
            };
        if !digits.bytes().all(|b| char::from(b).is_digit(radix)) {
            return None;
        }
        // Leading zeros cannot overflow the check: they are trimmed.
        let digits = digits.trim_start_matches('0');
        let number = if digits.is_empty() {
            0
        } else if digits.len() > 12 {
            return None;
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        numbers.push(number);
    }
    let (last, first) = numbers.split_last()?;
    if first.iter().any(|&n| n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return None;
    }
    let mut address = *last;
    for (i, n) in first.iter().enumerate() {
        address += n << (8 * (3 - i));
    }
    Some(Ipv4Addr::from(u32::try_from(address).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Url {
        Url::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> &'static str {
        Url::parse(s).expect_err(s).reason()
    }

    #[test]
    fn names_addresses_and_ports() {
        let url = parse("ws://Example.COM/chat?room=1");
        assert_eq!(url.scheme, "ws");
        assert_eq!(url.host, Host::Name("example.com".into()));
        assert_eq!(url.port, None);
        assert_eq!(url.target, "/chat?room=1");
        assert_eq!(url.authority(80), "example.com");

        let url = parse("WSS://127.0.0.1:9001");
        assert_eq!(url.scheme, "wss");
        assert_eq!(url.host, Host::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(url.port, Some(9001));
        assert_eq!(url.target, "/");
        assert_eq!(url.authority(443), "127.0.0.1:9001");

        let url = parse("ws://[::1]:9002/x");
        assert_eq!(url.host, Host::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(url.port, Some(9002));
        assert_eq!(url.authority(80), "[::1]:9002");

        let url = parse("ws://[2001:db8::1]");
        assert_eq!(url.port_or(80), 80);
        assert_eq!(url.authority(80), "[2001:db8::1]");

        // The default port is left out of the Host header.
        assert_eq!(parse("wss://a.example:443/").authority(443), "a.example");
        assert_eq!(parse("ws://host?x=1").target, "/?x=1");
        assert_eq!(
            parse("ws://absolute.example./").host,
            Host::Name("absolute.example.".into())
        );
    }

    #[test]
    fn credentials_are_percent_decoded() {
        let url = parse("http://us%40er:p%3Ass@proxy.local:3128");
        assert_eq!(url.credentials, Some(("us@er".into(), "p:ss".into())));
        assert_eq!(url.port, Some(3128));
        let url = parse("socks5://alice@127.0.0.1:1080");
        assert_eq!(url.credentials, Some(("alice".into(), String::new())));
        for broken in [
            "http://a%4@proxy/",
            "http://a%+A@proxy/",
            "http://a:%-1@proxy/",
        ] {
            assert_eq!(
                refused(broken),
                "the credentials are not validly percent-encoded",
                "{broken}"
            );
        }
    }

    /// The cases where a parser that is not a browser's would connect
    /// somewhere else than the browser's reading says (the client tests
    /// compare many more with Node's WHATWG parser).
    #[test]
    fn hosts_are_read_as_a_browser_reads_them() {
        let url = parse("ws://127.0.0.2:1\\@127.0.0.1:41103/");
        assert_eq!(url.host, Host::V4(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(url.port, Some(1));
        assert_eq!(url.credentials, None);
        assert_eq!(url.target, "/@127.0.0.1:41103/");
        assert_eq!(parse("wss://h\\a\\b?c\\d").target, "/a/b?c\\d");
        for (host, ip) in [
            ("2130706433", [127, 0, 0, 1]),
            ("0x7f.1", [127, 0, 0, 1]),
            ("0x7F000001", [127, 0, 0, 1]),
            ("0177.0.0.1", [127, 0, 0, 1]),
            ("127.1", [127, 0, 0, 1]),
            ("127.0.1", [127, 0, 0, 1]),
            ("1.2.3.4.", [1, 2, 3, 4]),
            ("0x", [0, 0, 0, 0]),
            ("00000000000000000000001.0.0.1", [1, 0, 0, 1]),
            ("4294967295", [255, 255, 255, 255]),
        ] {
            assert_eq!(
                parse(&format!("ws://{host}/")).host,
                Host::V4(Ipv4Addr::from(ip)),
                "{host}"
            );
        }
        for host in [
            "4294967296",
            "1.2.3.256",
            "1.2.65536",
            "256.1.1.1",
            "1.2.3.4.5",
            "09.1.1.1",
            "example.1",
            "1..1",
            "0xg.1",
            "99999999999999999999",
        ] {
            assert_eq!(
                refused(&format!("ws://{host}/")),
                "the host is not a valid IPv4 address",
                "{host}"
            );
        }
        // Not numbers at the end: names.
        assert_eq!(parse("ws://1.2.3.x/").host, Host::Name("1.2.3.x".into()));
        assert_eq!(parse("ws://0x7f.ex/").host, Host::Name("0x7f.ex".into()));
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(
            refused("example.com/chat"),
            "no scheme (expected e.g. ws://host/)"
        );
        assert_eq!(refused("1ws://x/"), "the scheme is not valid");
        assert_eq!(
            refused("ws://x/#top"),
            "a WebSocket URL must not have a fragment"
        );
        assert_eq!(refused("ws:///path"), "no host");
        assert_eq!(
            refused("ws://x:0/"),
            "the port is not a number from 1 to 65535"
        );
        assert_eq!(
            refused("ws://x:65536/"),
            "the port is not a number from 1 to 65535"
        );
        assert_eq!(
            refused("ws://x:/"),
            "the port is not a number from 1 to 65535"
        );
        assert_eq!(
            refused("ws://x:+80/"),
            "the port is not a number from 1 to 65535"
        );
        assert_eq!(
            refused("ws://[::1/"),
            "an IPv6 literal without its closing ]"
        );
        assert_eq!(refused("ws://[::g]/"), "the IPv6 literal is not valid");
        assert_eq!(
            refused("ws://[::1]x/"),
            "unexpected text after the IPv6 literal"
        );
        assert!(refused("ws://bücher.example/").starts_with("the host is not a valid name"));
        assert!(refused("ws://a..b/").starts_with("the host is not a valid name"));
        assert!(refused("ws://a b/").starts_with("the host is not a valid name"));
        assert!(refused("ws://x/a b").starts_with("the path has spaces"));
        assert!(refused("ws://x/ä").starts_with("the path has spaces"));
        let long = format!("ws://{}/", "a".repeat(64));
        assert!(refused(&long).starts_with("the host is not a valid name"));
    }

    #[test]
    fn arbitrary_input_never_panics() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let alphabet = b"ws:/[]@%?#.:1f-x ";
        for _ in 0..crate::rounds(20_000) {
            let len = rng.random_range(0..24);
            let s: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
                .collect();
            if let Ok(url) = Url::parse(&s) {
                assert!(url.target.starts_with('/'), "{s:?}");
                let _ = url.authority(80);
            }
        }
    }
}
