//! Why a client could not connect: one variant per kind of failure, so a
//! caller can match on it (retry on `Connect`, give up on `Status(401)`).

use std::fmt;
use std::io;
use std::net::SocketAddr;

use bytes::Bytes;

use super::url::UrlError;
use crate::handshake::{ClientHandshakeError, ClientRequestError};

/// Which step ran out of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Resolving the name and connecting TCP (to the server or the proxy):
    /// `Client::connect_timeout`.
    Connect,
    /// The proxy's answer (HTTP CONNECT or SOCKS5): part of the connect
    /// timeout.
    Proxy,
    /// The TLS handshake and the upgrade: `Config::handshake_timeout`.
    Handshake,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connecting",
            Stage::Proxy => "waiting for the proxy",
            Stage::Handshake => "the handshake",
        })
    }
}

/// A response other than `101 Switching Protocols`: the status, the header
/// fields, and the start of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status the server answered with.
    pub status: u16,
    /// Every header field, in order, as `(name, value)`.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, up to `Content-Length` and at most [`MAX_REFUSAL_BODY`]
    /// bytes, as far as it came within the handshake timeout.
    pub body: Bytes,
}

/// The most of a refusal's body that is kept.
pub const MAX_REFUSAL_BODY: usize = 64 * 1024;

impl Refusal {
    /// The body's first line, if it is short text: the reason most servers
    /// give for a refusal ("not found: WebSockets are at /ws"), which the
    /// error's `Display` shows after the status.
    pub fn reason(&self) -> Option<&str> {
        let text = std::str::from_utf8(&self.body[..self.body.len().min(512)]).ok()?;
        let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
        let printable = line.chars().all(|c| !c.is_control());
        (printable && line.len() <= 200).then_some(line)
    }

    /// The first value of header `name` (matched case-insensitively), e.g.
    /// a redirect's `Location`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Why a connection could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not one a client can connect to (see [`UrlError`]), or
    /// its scheme is not `ws` or `wss`.
    Url(UrlError),
    /// The URL's scheme is `wss` but TLS is not available: the crate was
    /// built without `rustls`, or no roots were given (a `ClientConfig`, or
    /// the `webpki-roots` or `native-roots` feature).
    TlsUnavailable(&'static str),
    /// The request could not be written: an extra header or a subprotocol
    /// is not valid.
    Request(ClientRequestError),
    /// The proxy could not be reached (its name did not resolve, TCP to it
    /// failed or timed out): `error` says how. The target was not tried.
    ProxyUnreachable {
        /// The proxy, as `host:port`.
        proxy: String,
        /// What happened on the way to it.
        error: Box<ConnectError>,
    },
    /// The host name did not resolve (or resolved to no address).
    Dns {
        /// The name that was looked up.
        host: String,
        /// What the resolver said.
        error: io::Error,
    },
    /// TCP could not connect to any of the host's addresses (refused,
    /// unreachable); the error is the last address's.
    Connect {
        /// The address tried last.
        addr: SocketAddr,
        /// Why it failed.
        error: io::Error,
    },
    /// A step took longer than its timeout.
    Timeout(Stage),
    /// The TLS handshake failed: a certificate that is not valid for the
    /// host or not trusted, a protocol error (`error.get_ref()` holds
    /// rustls's error).
    Tls(io::Error),
    /// The proxy refused the tunnel or broke its protocol.
    Proxy(ProxyError),
    /// The server answered with a status other than 101.
    Status(Box<Refusal>),
    /// The server's `101` does not complete the upgrade: a wrong
    /// `Sec-WebSocket-Accept`, a subprotocol or extension that was not
    /// offered, a malformed head.
    Handshake(ClientHandshakeError),
    /// The connection failed or ended during the handshake.
    Io(io::Error),
    /// The runtime is shutting down, or the client is: the connection
    /// was not opened.
    Closed,
}

impl ConnectError {
    /// The HTTP status, for [`ConnectError::Status`] (and a proxy's refusal).
    pub fn status(&self) -> Option<u16> {
        match self {
            ConnectError::Status(refusal) => Some(refusal.status),
            ConnectError::Proxy(proxy) => proxy.status(),
            _ => None,
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Url(e) => write!(f, "{e}"),
            ConnectError::TlsUnavailable(why) => write!(f, "wss is not available: {why}"),
            ConnectError::Request(e) => write!(f, "invalid request: {e}"),
            ConnectError::Dns { host, error } => write!(f, "could not resolve {host}: {error}"),
            ConnectError::Connect { addr, error } => {
                write!(f, "could not connect to {addr}: {error}")
            }
            ConnectError::ProxyUnreachable { proxy, error } => write!(
                f,
                "could not reach the proxy {proxy} ({error}); the target was not tried: \
                 check the proxy (Client::proxy, or http_proxy, https_proxy and all_proxy \
                 in the environment)"
            ),
            ConnectError::Timeout(stage) => write!(f, "timed out {stage}"),
            ConnectError::Tls(e) => {
                write!(f, "TLS handshake failed: {e}")?;
                match tls_hint(e) {
                    Some(hint) => write!(f, " ({hint})"),
                    None => Ok(()),
                }
            }
            ConnectError::Proxy(e) => write!(f, "proxy: {e}"),
            ConnectError::Status(refusal) => {
                write!(f, "the server answered {} instead of 101", refusal.status)?;
                match refusal.reason() {
                    Some(reason) => write!(f, ": {reason}"),
                    None => Ok(()),
                }
            }
            ConnectError::Handshake(e) => write!(f, "bad upgrade response: {e}"),
            ConnectError::Io(e) => write!(f, "connection failed during the handshake: {e}"),
            ConnectError::Closed => f.write_str("the client or its runtime is shutting down"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Url(e) => Some(e),
            ConnectError::Request(e) => Some(e),
            ConnectError::Dns { error, .. } | ConnectError::Connect { error, .. } => Some(error),
            ConnectError::Tls(e) | ConnectError::Io(e) => Some(e),
            ConnectError::Proxy(e) => Some(e),
            ConnectError::ProxyUnreachable { error, .. } => Some(error.as_ref()),
            ConnectError::Handshake(e) => Some(e),
            _ => None,
        }
    }
}

/// The likely cause of a TLS failure and what fixes it, for the errors a
/// newcomer meets first: a private or self-signed certificate, a CA's
/// certificate served as the server's own, a name it does not cover, a
/// port that does not speak TLS.
fn tls_hint(error: &io::Error) -> Option<&'static str> {
    #[cfg(feature = "rustls")]
    {
        use rustls::{CertificateError, Error};
        let rustls = error.get_ref()?.downcast_ref::<Error>()?;
        Some(match rustls {
            Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                "the server's certificate is not signed by an authority this client trusts: \
                 for a private CA or a self-signed certificate, add it to the roots of the \
                 rustls ClientConfig given to Client::tls (the examples' --cafile PEM)"
            }
            // webpki's, which rustls passes on as `Other`.
            Error::InvalidCertificate(CertificateError::Other(other))
                if other.to_string().contains("CaUsedAsEndEntity") =>
            {
                "the server presents a CA certificate (CA:TRUE, as a plain \
                 `openssl req -x509` makes) as its own: make the server's certificate \
                 with CA:FALSE (`-addext basicConstraints=critical,CA:FALSE`), or trust \
                 exactly that certificate (the examples' --cafile pins it)"
            }
            Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => {
                "the certificate does not name the host in the URL: connect by a name (or \
                 address) in its subjectAltName"
            }
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => "the certificate has expired (or this machine's clock is wrong)",
            Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
            ) => "the certificate is not valid yet (or this machine's clock is wrong)",
            Error::InvalidMessage(_) => {
                "the server did not answer in TLS: if this port serves plain ws://, use a \
                 ws:// URL"
            }
            _ => return None,
        })
    }
    #[cfg(not(feature = "rustls"))]
    {
        let _ = error;
        None
    }
}

impl From<UrlError> for ConnectError {
    fn from(e: UrlError) -> Self {
        ConnectError::Url(e)
    }
}

/// Why a proxy did not open the tunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy URL's scheme is not `http`, `socks5` or `socks5h`.
    UnsupportedScheme(String),
    /// The HTTP proxy answered CONNECT with this status (407: it wants
    /// credentials, or refused the ones given).
    Refused {
        /// The proxy's HTTP status.
        status: u16,
    },
    /// The SOCKS5 proxy accepts none of the offered methods (no
    /// authentication, or username and password when credentials are given).
    NoAcceptableMethod,
    /// The SOCKS5 proxy refused the username and password.
    AuthenticationFailed,
    /// The SOCKS5 proxy could not connect (the reply code: 1 general
    /// failure, 2 not allowed, 3 network unreachable, 4 host unreachable, 5
    /// connection refused, 6 TTL expired, 7 command not supported, 8 address
    /// type not supported).
    Socks {
        /// The SOCKS5 reply code (RFC 1928 §6).
        reply: u8,
    },
    /// The answer is not the protocol's: not HTTP, not SOCKS5, a head over
    /// [`MAX_CONNECT_HEAD`](super::proxy::MAX_CONNECT_HEAD), or a field out of range.
    Malformed(&'static str),
    /// Credentials or a host name too long for SOCKS5 (255 bytes each).
    TooLong,
    /// SOCKS5 credentials with an empty username or password (RFC 1929
    /// wants 1 to 255 bytes each).
    EmptyCredentials,
}

impl ProxyError {
    /// The HTTP status of a refused CONNECT.
    pub fn status(&self) -> Option<u16> {
        match self {
            ProxyError::Refused { status } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::UnsupportedScheme(s) => {
                write!(f, "unsupported proxy scheme {s:?} (http, socks5, socks5h)")
            }
            ProxyError::Refused { status } => write!(f, "CONNECT refused with status {status}"),
            ProxyError::NoAcceptableMethod => {
                f.write_str("the SOCKS5 proxy accepts none of the offered methods")
            }
            ProxyError::AuthenticationFailed => {
                f.write_str("the SOCKS5 proxy refused the username and password")
            }
            ProxyError::Socks { reply } => {
                write!(
                    f,
                    "the SOCKS5 proxy could not connect: {}",
                    socks_reply(*reply)
                )
            }
            ProxyError::Malformed(why) => write!(f, "malformed answer: {why}"),
            ProxyError::TooLong => f.write_str("credentials or host name too long for SOCKS5"),
            ProxyError::EmptyCredentials => {
                f.write_str("SOCKS5 needs a non-empty username and password")
            }
        }
    }
}

impl std::error::Error for ProxyError {}

/// What a SOCKS5 reply code means (RFC 1928, section 6).
fn socks_reply(code: u8) -> &'static str {
    match code {
        1 => "general failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unknown reply code",
    }
}
