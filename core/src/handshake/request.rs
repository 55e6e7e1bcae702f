//! Parsing and checking the HTTP/1.1 upgrade request (RFC 6455 §4.2.1).
//!
//! Parsing borrows everything from the read buffer and keeps the header index in
//! a caller-provided array on the stack, so a typical browser request is parsed
//! without a single heap allocation.

use std::net::SocketAddr;

use base64::Engine;

/// How many header fields the parser makes room for. More than this is answered
/// with 431.
pub const MAX_HEADERS: usize = 64;

/// The stack array [`parse_request`] indexes header fields into.
pub type HeaderBuffer<'a> = [httparse::Header<'a>; MAX_HEADERS];

/// An empty [`HeaderBuffer`], to be kept on the stack.
pub const fn header_buffer<'a>() -> HeaderBuffer<'a> {
    [httparse::EMPTY_HEADER; MAX_HEADERS]
}

/// Why an upgrade request was refused, and with which HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// The request head is larger than the configured limit (431).
    HeadTooLarge,
    /// More than [`MAX_HEADERS`] header fields (431).
    TooManyHeaders,
    /// Not parseable as HTTP/1.x (400).
    Malformed,
    /// The connection ended, or timed out, before the head was complete (400 or 408).
    Incomplete,
    /// The request did not come in time (`handshake_timeout`).
    TimedOut,
    /// Not a GET (405).
    MethodNotAllowed,
    /// Not HTTP/1.1 (400).
    NotHttp11,
    /// No Host header in an HTTP/1.1 request (400, RFC 9112 3.2).
    MissingHost,
    /// More than one Host header (400, RFC 9112 3.2): which one a proxy
    /// in front went by cannot be known.
    DuplicateHost,
    /// A line of the head ends in a bare LF, not CRLF (400): a proxy in
    /// front may split the head elsewhere (request smuggling).
    BareLineFeed,
    /// No `Upgrade: websocket` (400).
    NotWebSocketUpgrade,
    /// No `upgrade` token in `Connection` (400).
    MissingConnectionUpgrade,
    /// `Sec-WebSocket-Version` missing or not 13 (426, with `Sec-WebSocket-Version: 13`).
    UnsupportedVersion,
    /// No `Sec-WebSocket-Key` (400).
    MissingKey,
    /// `Sec-WebSocket-Key` repeated, or not 16 bytes of base64 (400).
    InvalidKey,
    /// An HTTP/2 or HTTP/3 request that is not an extended CONNECT with
    /// `:protocol = websocket` (RFC 8441) (400).
    NotExtendedConnect,
    /// A plain HTTP request whose `Content-Length` is over the server's
    /// `max_http_body_size` (413).
    BodyTooLarge,
    /// A plain HTTP request with a `Transfer-Encoding` (chunked): only bodies
    /// with a `Content-Length` are read (411).
    LengthRequired,
    /// A `Content-Length` that is not one decimal number (400).
    BadContentLength,
}

impl HandshakeError {
    /// The HTTP status the client gets.
    pub fn status(self) -> u16 {
        match self {
            HandshakeError::HeadTooLarge | HandshakeError::TooManyHeaders => 431,
            HandshakeError::MethodNotAllowed => 405,
            HandshakeError::UnsupportedVersion => 426,
            HandshakeError::TimedOut => 408,
            HandshakeError::BodyTooLarge => 413,
            HandshakeError::LengthRequired => 411,
            _ => 400,
        }
    }

    /// The one-line reason sent as the response body.
    pub fn reason(self) -> &'static str {
        match self {
            HandshakeError::HeadTooLarge => "request head too large",
            HandshakeError::TooManyHeaders => "too many header fields",
            HandshakeError::Malformed => "malformed HTTP request",
            HandshakeError::Incomplete => "incomplete HTTP request",
            HandshakeError::TimedOut => "timed out waiting for the upgrade request",
            HandshakeError::MethodNotAllowed => "a WebSocket upgrade must use GET",
            HandshakeError::NotHttp11 => "a WebSocket upgrade requires HTTP/1.1",
            HandshakeError::MissingHost => "missing Host header",
            HandshakeError::DuplicateHost => "more than one Host header",
            HandshakeError::BareLineFeed => {
                "a line of the request head ends in a bare LF, not CRLF"
            }
            HandshakeError::NotWebSocketUpgrade => "missing or invalid Upgrade: websocket header",
            HandshakeError::MissingConnectionUpgrade => {
                "Connection header must contain the upgrade token"
            }
            HandshakeError::UnsupportedVersion => "unsupported Sec-WebSocket-Version, use 13",
            HandshakeError::MissingKey => {
                "missing Sec-WebSocket-Key header (a WebSocket client sends 16 random bytes in base64)"
            }
            HandshakeError::InvalidKey => {
                "Sec-WebSocket-Key must be one header of 16 random bytes in base64 (24 characters)"
            }
            HandshakeError::NotExtendedConnect => {
                "a WebSocket over HTTP/2 or HTTP/3 must be an extended CONNECT with :protocol websocket"
            }
            HandshakeError::BodyTooLarge => "request body too large",
            HandshakeError::LengthRequired => {
                "a request body needs a Content-Length (no chunked transfer coding)"
            }
            HandshakeError::BadContentLength => "invalid Content-Length",
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status(), self.reason())
    }
}

impl std::error::Error for HandshakeError {}

/// A checked upgrade request, borrowing the read buffer. This is what the
/// handler's upgrade hook sees.
#[derive(Debug)]
pub struct Request<'a> {
    method: &'a str,
    target: &'a str,
    headers: &'a [httparse::Header<'a>],
    key: &'a [u8],
    body: &'a [u8],
    peer: Option<SocketAddr>,
}

impl<'a> Request<'a> {
    /// The client's address as the server sees it: the connection's peer,
    /// or the address a PROXY protocol header or a trusted proxy's
    /// forwarding header named. `None` where the server was not told
    /// (an upgrade inside hyper or axum).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The request, from `peer` (see [`Request::peer_addr`]): what a
    /// server sets before its handler sees the request.
    pub fn with_peer_addr(mut self, peer: SocketAddr) -> Request<'a> {
        self.peer = Some(peer);
        self
    }

    /// The request method (`GET` once checked; `CONNECT` over HTTP/2).
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// The request target without its query, e.g. `/chat`.
    pub fn path(&self) -> &'a str {
        self.target
            .split_once('?')
            .map_or(self.target, |(path, _)| path)
    }

    /// The query string without the `?`, if there is one.
    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, query)| query)
    }

    /// The first value of header `name` (matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        header(self.headers, name)
    }

    /// The first value of header `name` as text, if it is valid UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every header field, in order, as `(name, value)`.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.headers.iter().map(|h| (h.name, h.value))
    }

    /// The subprotocols the client offers in `Sec-WebSocket-Protocol`, in its
    /// order of preference.
    pub fn protocols(&self) -> impl Iterator<Item = &'a str> + 'a {
        tokens(self.headers, "sec-websocket-protocol").filter_map(|t| std::str::from_utf8(t).ok())
    }

    /// The values of every `Sec-WebSocket-Extensions` header, in order: the
    /// client's extension offers, to be read with `parse_extensions`.
    pub fn extension_offers(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        values(self.headers, "sec-websocket-extensions")
    }

    /// The `Sec-WebSocket-Key` (already checked to be 16 bytes in base64;
    /// empty in the request `Handler::on_http` sees).
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The request's body: for a plain HTTP request (`Handler::on_http`),
    /// its `Content-Length` bytes, read whole before the handler is asked
    /// (at most `Config::max_http_body_size`); empty for an upgrade.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }
}

/// Parses the request head at the start of `buf`.
///
/// Returns `Ok(None)` while the head is incomplete (read more and call again), or
/// the checked request and the length of its head: bytes after it are the first
/// frame bytes and must be kept.
pub fn parse_request<'a>(
    buf: &'a [u8],
    headers: &'a mut HeaderBuffer<'a>,
    max_head_len: usize,
) -> Result<Option<(Request<'a>, usize)>, HandshakeError> {
    match parse_head(buf, headers, max_head_len)? {
        None => Ok(None),
        Some((head, head_len)) => Ok(Some((head.check()?, head_len))),
    }
}

/// An HTTP/1.x request head, parsed but not yet checked as an upgrade.
#[derive(Debug)]
pub struct Head<'a> {
    method: &'a str,
    target: &'a str,
    /// The HTTP/1 minor version.
    version: u8,
    headers: &'a [httparse::Header<'a>],
}

impl<'a> Head<'a> {
    /// Whether the client asks for a WebSocket (`Upgrade: websocket`); a
    /// request without it is plain HTTP, for the handler's `on_http`.
    pub fn wants_websocket(&self) -> bool {
        values(self.headers, "upgrade").any(|value| value_has_token(value, "websocket"))
    }

    /// The RFC 6455 checks ([`check_request`]).
    pub fn check(&self) -> Result<Request<'a>, HandshakeError> {
        check_request(self.method, self.target, self.version, self.headers)
    }

    /// The request as it is, for `on_http`: no check, no key, and `body`.
    pub fn as_request(&self, body: &'a [u8]) -> Request<'a> {
        Request {
            method: self.method,
            target: self.target,
            headers: self.headers,
            key: b"",
            body,
            peer: None,
        }
    }

    /// How long the body that follows the head is: its `Content-Length`
    /// (0 without one). Refused are a `Transfer-Encoding` (411: bodies of
    /// unknown length are not read) and a `Content-Length` that is not one
    /// number (several equal ones are one, as RFC 9112 allows).
    pub fn body_len(&self) -> Result<usize, HandshakeError> {
        if header(self.headers, "transfer-encoding").is_some() {
            return Err(HandshakeError::LengthRequired);
        }
        let mut length = None;
        for value in values(self.headers, "content-length") {
            for part in value.split(|&b| b == b',') {
                let digits = trim(part);
                if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit)
                {
                    return Err(HandshakeError::BadContentLength);
                }
                let n: u64 = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .ok_or(HandshakeError::BadContentLength)?;
                if length.is_some_and(|known| known != n) {
                    return Err(HandshakeError::BadContentLength);
                }
                length = Some(n);
            }
        }
        // Over `usize` is over any limit too.
        Ok(length.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)))
    }

    /// Whether it is a `HEAD` request (answered without a body).
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }

    /// Whether the client waits for `100 Continue` before it sends its
    /// body (HTTP/1.1 with `Expect: 100-continue`, RFC 9110 10.1.1).
    pub fn expects_continue(&self) -> bool {
        self.version >= 1
            && values(self.headers, "expect").any(|v| value_has_token(v, "100-continue"))
    }

    /// Whether the client lets the connection carry another request after
    /// this one (RFC 9112, 9.3): HTTP/1.1 unless it says `Connection:
    /// close`; HTTP/1.0 only if it says `Connection: keep-alive`.
    pub fn keeps_alive(&self) -> bool {
        let says = |token| values(self.headers, "connection").any(|v| value_has_token(v, token));
        if self.version >= 1 {
            !says("close")
        } else {
            says("keep-alive")
        }
    }
}

/// Parses a request head at the start of `buf`, without the upgrade checks:
/// `Ok(None)` while incomplete, else the head and its length.
pub fn parse_head<'a>(
    buf: &'a [u8],
    headers: &'a mut HeaderBuffer<'a>,
    max_head_len: usize,
) -> Result<Option<(Head<'a>, usize)>, HandshakeError> {
    let mut req = httparse::Request::new(headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= max_head_len {
                Err(HandshakeError::HeadTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HandshakeError::TooManyHeaders),
        Err(_) => return Err(HandshakeError::Malformed),
    };
    if head_len > max_head_len {
        return Err(HandshakeError::HeadTooLarge);
    }
    if has_bare_lf(&buf[..head_len]) {
        return Err(HandshakeError::BareLineFeed);
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HandshakeError::Malformed);
    };
    match (values(req.headers, "host").count(), version) {
        (0, 1) => return Err(HandshakeError::MissingHost),
        (0 | 1, _) => {}
        _ => return Err(HandshakeError::DuplicateHost),
    }
    let head = Head {
        method,
        target,
        version,
        headers: req.headers,
    };
    Ok(Some((head, head_len)))
}

/// The RFC 6455 §4.2.1 checks on a request head parsed elsewhere (hyper's,
/// for example): `version` is the HTTP/1 minor version (1 for HTTP/1.1), and
/// `headers` every header field in order.
pub fn check_request<'a>(
    method: &'a str,
    target: &'a str,
    version: u8,
    headers: &'a [httparse::Header<'a>],
) -> Result<Request<'a>, HandshakeError> {
    if method != "GET" {
        return Err(HandshakeError::MethodNotAllowed);
    }
    if version != 1 {
        return Err(HandshakeError::NotHttp11);
    }
    let fields = UpgradeFields::collect(headers);
    if !fields.upgrade_websocket {
        return Err(HandshakeError::NotWebSocketUpgrade);
    }
    if !fields.connection_upgrade {
        return Err(HandshakeError::MissingConnectionUpgrade);
    }
    if fields.version.map(trim) != Some(b"13") {
        return Err(HandshakeError::UnsupportedVersion);
    }
    let key = match fields.keys {
        (0, _) => return Err(HandshakeError::MissingKey),
        (1, Some(key)) => Some(trim(key)).filter(|k| is_valid_key(k)),
        _ => None,
    }
    .ok_or(HandshakeError::InvalidKey)?;
    match fields.hosts {
        0 => return Err(HandshakeError::MissingHost),
        1 => {}
        _ => return Err(HandshakeError::DuplicateHost),
    }
    Ok(Request {
        method,
        target,
        headers,
        key,
        body: b"",
        peer: None,
    })
}

/// The RFC 8441 checks on an HTTP/2 request (parsed elsewhere, hyper's h2):
/// an extended CONNECT whose `:protocol` pseudo-header is `websocket`, with
/// `Sec-WebSocket-Version: 13`. HTTP/2 has no `Upgrade`, `Connection` or
/// `Sec-WebSocket-Key` (the answer is a `200` without
/// `Sec-WebSocket-Accept`), so the checked request's [`key`](Request::key)
/// is empty. `target` is the `:path`.
pub fn check_extended_connect<'a>(
    method: &'a str,
    protocol: Option<&str>,
    target: &'a str,
    headers: &'a [httparse::Header<'a>],
) -> Result<Request<'a>, HandshakeError> {
    let websocket = protocol.is_some_and(|protocol| protocol.eq_ignore_ascii_case("websocket"));
    if method != "CONNECT" || !websocket {
        return Err(HandshakeError::NotExtendedConnect);
    }
    if header(headers, "sec-websocket-version").map(trim) != Some(b"13") {
        return Err(HandshakeError::UnsupportedVersion);
    }
    Ok(Request {
        method,
        target,
        headers,
        key: b"",
        body: b"",
        peer: None,
    })
}

/// The header fields the upgrade checks need, found in one pass: names are
/// compared only when their length matches.
#[derive(Default)]
struct UpgradeFields<'a> {
    hosts: usize,
    upgrade_websocket: bool,
    connection_upgrade: bool,
    /// The first `Sec-WebSocket-Version`.
    version: Option<&'a [u8]>,
    /// How many `Sec-WebSocket-Key` fields, and the first one.
    keys: (usize, Option<&'a [u8]>),
}

impl<'a> UpgradeFields<'a> {
    fn collect(headers: &[httparse::Header<'a>]) -> Self {
        let mut fields = UpgradeFields::default();
        for h in headers {
            let name = h.name.as_bytes();
            let is = |expected: &str| name.eq_ignore_ascii_case(expected.as_bytes());
            match name.len() {
                4 if is("host") => fields.hosts += 1,
                7 if is("upgrade") => {
                    fields.upgrade_websocket |= value_has_token(h.value, "websocket");
                }
                10 if is("connection") => {
                    fields.connection_upgrade |= value_has_token(h.value, "upgrade");
                }
                17 if is("sec-websocket-key") => {
                    fields.keys.0 += 1;
                    fields.keys.1.get_or_insert(h.value);
                }
                21 if is("sec-websocket-version") => {
                    fields.version.get_or_insert(h.value);
                }
                _ => {}
            }
        }
        fields
    }
}

/// Whether a line of `head` ends in a LF without a CR before it.
fn has_bare_lf(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(at, &b)| b == b'\n' && (at == 0 || head[at - 1] != b'\r'))
}

/// Whether a comma-separated header value lists `token` (case-insensitively).
pub(super) fn value_has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token.as_bytes()))
}

/// A key is valid if it is base64 for exactly 16 bytes (so 24 characters).
fn is_valid_key(key: &[u8]) -> bool {
    let mut decoded = [0u8; 18];
    key.len() == 24
        && base64::engine::general_purpose::STANDARD.decode_slice(key, &mut decoded) == Ok(16)
}

pub(super) fn header<'a>(headers: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// The value of every `name` header, in order.
pub(super) fn values<'a>(
    headers: &'a [httparse::Header<'a>],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// The comma-separated tokens of every `name` header, trimmed, empty ones skipped.
fn tokens<'a>(
    headers: &'a [httparse::Header<'a>],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    values(headers, name)
        .flat_map(|value| value.split(|&b| b == b','))
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

#[cfg(test)]
mod tests;
