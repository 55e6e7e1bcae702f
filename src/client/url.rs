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
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, target) = rest.split_at(authority_end);
        let target = match target {
            "" => "/".to_owned(),
            t if t.starts_with('?') => format!("/{t}"),
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
            scheme: scheme.to_ascii_lowercase(),
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
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(Host::V4(ip));
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

/// Decodes `%XX` escapes; `None` for a broken escape or bytes that are not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
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
        assert_eq!(
            refused("http://a%4@proxy/"),
            "the credentials are not validly percent-encoded"
        );
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
