//! What a client writes to a proxy and how it reads the answers, sans-I/O:
//! HTTP CONNECT (RFC 9110 §9.3.6, with Basic credentials) and SOCKS5 (RFC
//! 1928, with RFC 1929's username and password). Each reader takes the bytes
//! received so far and says "more", "done, n bytes used", or why the proxy
//! said no; none of them can be made to panic or to wait for more than a
//! bounded number of bytes (`fuzz/fuzz_targets/proxy_reply.rs`).

use std::net::IpAddr;

use base64::Engine;

use crate::client::error::ProxyError;
use crate::client::url::Host;

/// The longest CONNECT response head a client reads.
pub const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// How far a reader got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The answer is incomplete: read more and call again with all of it.
    More,
    /// The answer took this many bytes; what follows belongs to the tunnel.
    Done(usize),
}

// ---- HTTP CONNECT ----

/// The CONNECT request for `host:port`, with Basic credentials if given.
pub fn connect_request(host: &Host, port: u16, credentials: Option<(&str, &str)>) -> Vec<u8> {
    let authority = format!("{host}:{port}");
    let mut out = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    if let Some((user, password)) = credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        out.extend_from_slice(format!("Proxy-Authorization: Basic {token}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Reads the proxy's answer to CONNECT: any 2xx opens the tunnel.
pub fn read_connect_response(buf: &[u8]) -> Result<Read, ProxyError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_CONNECT_HEAD => {
            let status = response.code.unwrap_or(0);
            if (200..300).contains(&status) {
                Ok(Read::Done(n))
            } else {
                Err(ProxyError::Refused { status })
            }
        }
        Ok(httparse::Status::Partial) if buf.len() < MAX_CONNECT_HEAD => Ok(Read::More),
        Ok(_) => Err(ProxyError::Malformed("response head too large")),
        Err(_) => Err(ProxyError::Malformed("not an HTTP response")),
    }
}

// ---- SOCKS5 ----

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const USER_PASS: u8 = 2;

/// The greeting: the methods offered (username and password only with
/// credentials).
pub fn socks_greeting(with_credentials: bool) -> Vec<u8> {
    if with_credentials {
        vec![VERSION, 2, NO_AUTH, USER_PASS]
    } else {
        vec![VERSION, 1, NO_AUTH]
    }
}

/// The method the proxy chose: true if it wants the username and password.
pub fn read_socks_method(buf: &[u8], with_credentials: bool) -> Result<Option<bool>, ProxyError> {
    let [version, method, ..] = *buf else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(ProxyError::Malformed("not a SOCKS5 answer"));
    }
    match method {
        NO_AUTH => Ok(Some(false)),
        USER_PASS if with_credentials => Ok(Some(true)),
        0xff => Err(ProxyError::NoAcceptableMethod),
        _ => Err(ProxyError::Malformed("a method that was not offered")),
    }
}

/// RFC 1929's request: the username and password.
pub fn socks_auth(user: &str, password: &str) -> Result<Vec<u8>, ProxyError> {
    let (u, p) = (user.as_bytes(), password.as_bytes());
    if u.is_empty() || p.is_empty() {
        return Err(ProxyError::EmptyCredentials);
    }
    let ulen = u8::try_from(u.len()).map_err(|_| ProxyError::TooLong)?;
    let plen = u8::try_from(p.len()).map_err(|_| ProxyError::TooLong)?;
    let mut out = vec![1, ulen];
    out.extend_from_slice(u);
    out.push(plen);
    out.extend_from_slice(p);
    Ok(out)
}

/// The answer to the username and password: status 0 is success. Its
/// version byte should be 1; some servers write 5, and like curl this
/// reads only the status.
pub fn read_socks_auth(buf: &[u8]) -> Result<Read, ProxyError> {
    match *buf {
        [_, 0, ..] => Ok(Read::Done(2)),
        [_, _, ..] => Err(ProxyError::AuthenticationFailed),
        _ => Ok(Read::More),
    }
}

/// The CONNECT request for `host:port`: an address as it is, a name for
/// the proxy to resolve (`socks5h`).
pub fn socks_connect(host: &Host, port: u16) -> Result<Vec<u8>, ProxyError> {
    let mut out = vec![VERSION, 1, 0];
    match host {
        Host::V4(ip) => {
            out.push(1);
            out.extend_from_slice(&ip.octets());
        }
        Host::V6(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        Host::Name(name) => {
            let len = u8::try_from(name.len()).map_err(|_| ProxyError::TooLong)?;
            out.push(3);
            out.push(len);
            out.extend_from_slice(name.as_bytes());
        }
    }
    out.extend_from_slice(&port.to_be_bytes());
    Ok(out)
}

/// [`socks_connect`] for an address already resolved (`socks5`).
pub fn socks_connect_ip(ip: IpAddr, port: u16) -> Vec<u8> {
    let host = match ip {
        IpAddr::V4(ip) => Host::V4(ip),
        IpAddr::V6(ip) => Host::V6(ip),
    };
    socks_connect(&host, port).expect("an address always fits")
}

/// The answer to CONNECT: success, with the address the proxy bound
/// (skipped), or the reply code.
pub fn read_socks_connect(buf: &[u8]) -> Result<Read, ProxyError> {
    let [version, reply, _reserved, kind, ..] = *buf else {
        return Ok(Read::More);
    };
    if version != VERSION {
        return Err(ProxyError::Malformed("not a SOCKS5 answer"));
    }
    if reply != 0 {
        return Err(ProxyError::Socks { reply });
    }
    let address = match kind {
        1 => 4,
        4 => 16,
        3 => match buf.get(4) {
            Some(&len) => 1 + usize::from(len),
            None => return Ok(Read::More),
        },
        _ => return Err(ProxyError::Malformed("unknown address type")),
    };
    let len = 4 + address + 2;
    Ok(if buf.len() >= len {
        Read::Done(len)
    } else {
        Read::More
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn connect_request_carries_basic_credentials() {
        let host = Host::Name("example.com".into());
        let plain = connect_request(&host, 443, None);
        assert_eq!(
            plain,
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
        );
        let with = connect_request(
            &Host::V6(Ipv6Addr::LOCALHOST),
            80,
            Some(("Aladdin", "open sesame")),
        );
        let text = String::from_utf8(with).unwrap();
        assert!(text.starts_with("CONNECT [::1]:80 HTTP/1.1\r\n"), "{text}");
        // RFC 7617's example.
        assert!(text.contains("Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
    }

    #[test]
    fn connect_responses() {
        let ok = b"HTTP/1.1 200 Connection established\r\n\r\nrest";
        assert_eq!(read_connect_response(ok), Ok(Read::Done(ok.len() - 4)));
        for cut in 0..ok.len() - 4 {
            assert_eq!(read_connect_response(&ok[..cut]), Ok(Read::More), "{cut}");
        }
        let refused =
            b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n";
        assert_eq!(
            read_connect_response(refused),
            Err(ProxyError::Refused { status: 407 })
        );
        assert_eq!(ProxyError::Refused { status: 407 }.status(), Some(407));
        assert!(matches!(
            read_connect_response(b"SSH-2.0-x\r\n"),
            Err(ProxyError::Malformed(_))
        ));
        let endless = [
            b"HTTP/1.1 200 OK\r\nX: ".as_slice(),
            &[b'a'; MAX_CONNECT_HEAD],
        ]
        .concat();
        assert!(matches!(
            read_connect_response(&endless),
            Err(ProxyError::Malformed(_))
        ));
    }

    #[test]
    fn socks_method_and_auth() {
        assert_eq!(socks_greeting(false), [5, 1, 0]);
        assert_eq!(socks_greeting(true), [5, 2, 0, 2]);
        assert_eq!(read_socks_method(&[5], true), Ok(None));
        assert_eq!(read_socks_method(&[5, 0], true), Ok(Some(false)));
        assert_eq!(read_socks_method(&[5, 2], true), Ok(Some(true)));
        assert!(matches!(
            read_socks_method(&[5, 2], false),
            Err(ProxyError::Malformed(_))
        ));
        assert_eq!(
            read_socks_method(&[5, 0xff], false),
            Err(ProxyError::NoAcceptableMethod)
        );
        assert!(matches!(
            read_socks_method(&[4, 0], false),
            Err(ProxyError::Malformed(_))
        ));
        assert_eq!(
            socks_auth("al", "pw").unwrap(),
            [1, 2, b'a', b'l', 2, b'p', b'w']
        );
        assert_eq!(socks_auth(&"u".repeat(256), "p"), Err(ProxyError::TooLong));
        assert_eq!(socks_auth("alice", ""), Err(ProxyError::EmptyCredentials));
        assert_eq!(socks_auth("", "pw"), Err(ProxyError::EmptyCredentials));
        assert_eq!(
            read_socks_auth(&[5, 0]),
            Ok(Read::Done(2)),
            "a version 5 answer"
        );
        assert_eq!(read_socks_auth(&[1]), Ok(Read::More));
        assert_eq!(read_socks_auth(&[1, 0]), Ok(Read::Done(2)));
        assert_eq!(
            read_socks_auth(&[1, 1]),
            Err(ProxyError::AuthenticationFailed)
        );
    }

    #[test]
    fn socks_connect_requests_and_replies() {
        assert_eq!(
            socks_connect(&Host::V4(Ipv4Addr::new(127, 0, 0, 1)), 9001).unwrap(),
            [5, 1, 0, 1, 127, 0, 0, 1, 0x23, 0x29]
        );
        let named = socks_connect(&Host::Name("ab.c".into()), 80).unwrap();
        assert_eq!(named, [5, 1, 0, 3, 4, b'a', b'b', b'.', b'c', 0, 80]);
        assert_eq!(
            socks_connect_ip(Ipv6Addr::LOCALHOST.into(), 1).len(),
            4 + 16 + 2
        );
        assert_eq!(
            socks_connect(&Host::Name("a".repeat(256)), 80),
            Err(ProxyError::TooLong)
        );

        let v4 = [5, 0, 0, 1, 10, 0, 0, 1, 0x1f, 0x90];
        for cut in 0..v4.len() {
            assert_eq!(read_socks_connect(&v4[..cut]), Ok(Read::More), "{cut}");
        }
        assert_eq!(read_socks_connect(&v4), Ok(Read::Done(10)));
        let name = [5, 0, 0, 3, 3, b'a', b'b', b'c', 0, 80, 0xee];
        assert_eq!(read_socks_connect(&name), Ok(Read::Done(10)));
        assert_eq!(read_socks_connect(&[5, 0, 0, 3]), Ok(Read::More));
        let v6 = [&[5u8, 0, 0, 4][..], &[0; 18]].concat();
        assert_eq!(read_socks_connect(&v6), Ok(Read::Done(22)));
        assert_eq!(
            read_socks_connect(&[5, 5, 0, 1]),
            Err(ProxyError::Socks { reply: 5 })
        );
        assert!(
            ProxyError::Socks { reply: 5 }
                .to_string()
                .contains("connection refused")
        );
        assert!(matches!(
            read_socks_connect(&[5, 0, 0, 9]),
            Err(ProxyError::Malformed(_))
        ));
        assert!(matches!(
            read_socks_connect(&[4, 0, 0, 1]),
            Err(ProxyError::Malformed(_))
        ));
    }
}
