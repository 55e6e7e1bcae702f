//! The client's side of the upgrade handshake (RFC 6455 §4.1), sans-I/O:
//! write the request, then check the server's response.
//!
//! ```text
//! let handshake = ClientRequest::new("example.com", "/chat")
//!     .protocols(&["chat"])
//!     .permessage_deflate(DeflateConfig::default())
//!     .write(&mut queue)?;           // the request, with a fresh key
//! // ... send the queue, read into `buf` until:
//! let Some(agreed) = handshake.read_response(&buf, 8192)? else { read more };
//! // buf[agreed.head_len..] are the first frames
//! ```
//!
//! The response is parsed with `httparse` into the same stack array of header
//! fields as a request, borrowing the read buffer: no allocation. Every way
//! a response can be refused is a [`ClientHandshakeError`] variant, so a
//! caller can tell a server that said no (`NotSwitching`, with the status)
//! from one that broke the protocol. To read the headers of a refusal (a
//! redirect's `Location`, a 401's challenge), parse the head with
//! [`parse_response`] and check it with [`ClientHandshake::check`].

mod deflate;
mod error;

pub use error::{ClientHandshakeError, ClientRequestError};

use std::fmt::Write as _;

use base64::Engine;

use super::request::{HeaderBuffer, header, header_buffer, value_has_token, values};
use super::response::{HeadWriter, accept_key};
use crate::proto::WriteQueue;
use crate::proto::deflate::{DeflateConfig, DeflateParams};
use crate::proto::random;

use self::deflate::Offer;

/// Headers the handshake writes or reads itself; a caller's extra header
/// must not repeat or contradict them. `Content-Length` and
/// `Transfer-Encoding` would give the GET a body and desynchronise the
/// connection.
const OWNED_HEADERS: [&str; 10] = [
    "host",
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
    "sec-websocket-accept",
    "content-length",
    "transfer-encoding",
];

/// What a client asks for in its upgrade request. Borrowed, so that writing
/// a request allocates nothing; the [`ClientHandshake`] it starts keeps it to
/// check the response against.
#[derive(Clone, Copy, Debug)]
pub struct ClientRequest<'a> {
    host: &'a str,
    target: &'a str,
    protocols: &'a [&'a str],
    headers: &'a [(&'a str, &'a str)],
    deflate: Option<DeflateConfig>,
}

impl<'a> ClientRequest<'a> {
    /// An upgrade request for `target` (path and query, e.g. `/chat?room=1`)
    /// on `host` (as the `Host` header has it: `example.com`, `[::1]:9001`).
    pub fn new(host: &'a str, target: &'a str) -> Self {
        ClientRequest {
            host,
            target,
            protocols: &[],
            headers: &[],
            deflate: None,
        }
    }

    /// Subprotocols to offer, in order of preference.
    pub fn protocols(mut self, protocols: &'a [&'a str]) -> Self {
        self.protocols = protocols;
        self
    }

    /// Extra header fields, written as given after the handshake's own
    /// (`Origin`, `Authorization`, `User-Agent`, ...).
    pub fn headers(mut self, headers: &'a [(&'a str, &'a str)]) -> Self {
        self.headers = headers;
        self
    }

    /// Offers permessage-deflate with these settings (see [`DeflateConfig`]
    /// for what each means for a client).
    pub fn permessage_deflate(mut self, config: DeflateConfig) -> Self {
        self.deflate = Some(config);
        self
    }

    /// Checks the request, then queues it with a fresh random key. Returns
    /// the handshake in progress, which checks the response.
    pub fn write(self, out: &mut WriteQueue) -> Result<ClientHandshake<'a>, ClientRequestError> {
        self.check()?;
        let mut nonce = [0u8; 16];
        random::fill(&mut nonce);
        let mut key = [0u8; 24];
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(nonce, &mut key)
            .expect("16 bytes encode to exactly 24 base64 characters");
        debug_assert_eq!(written, 24);
        let handshake = ClientHandshake { request: self, key };
        handshake.write_request(out);
        Ok(handshake)
    }

    /// The request as an extended CONNECT (RFC 8441 over HTTP/2, RFC 9220
    /// over HTTP/3), checked as [`write`](ClientRequest::write) checks
    /// it: the fields it carries besides the pseudo-fields (`:method`
    /// CONNECT, `:protocol` websocket, `:scheme`, `:authority` for the
    /// host, `:path` for the target, which the caller's HTTP layer writes):
    /// `sec-websocket-version`, the subprotocols, the permessage-deflate
    /// offer and the extra headers, every name lowercase. There is no key:
    /// the stream is the upgrade's proof. The [`ConnectHandshake`] checks
    /// the response.
    pub fn extended_connect(self) -> Result<(ConnectHandshake<'a>, Fields), ClientRequestError> {
        self.check()?;
        let mut fields = vec![("sec-websocket-version".to_owned(), b"13".to_vec())];
        if !self.protocols.is_empty() {
            fields.push((
                "sec-websocket-protocol".to_owned(),
                self.protocols.join(", ").into_bytes(),
            ));
        }
        if let Some(config) = &self.deflate {
            let mut offer = Vec::new();
            Offer::from_config(config).write(|piece| offer.extend_from_slice(piece));
            fields.push(("sec-websocket-extensions".to_owned(), offer));
        }
        for (name, value) in self.headers {
            fields.push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
        }
        Ok((ConnectHandshake { request: self }, fields))
    }

    /// The offered subprotocol the response's fields name, if any.
    fn chosen_protocol(
        &self,
        headers: &[httparse::Header<'_>],
    ) -> Result<Option<&'a str>, ClientHandshakeError> {
        let mut chosen = values(headers, "sec-websocket-protocol");
        let Some(value) = chosen.next() else {
            return Ok(None);
        };
        if chosen.next().is_some() {
            return Err(ClientHandshakeError::UnofferedProtocol);
        }
        let value = value.trim_ascii();
        self.protocols
            .iter()
            .find(|offered| offered.as_bytes() == value)
            .map(|offered| Some(*offered))
            .ok_or(ClientHandshakeError::UnofferedProtocol)
    }

    /// The subprotocol and the permessage-deflate parameters a response's
    /// fields agree to.
    fn agreed(&self, headers: &[httparse::Header<'_>]) -> Result<Agreed<'a>, ClientHandshakeError> {
        let protocol = self.chosen_protocol(headers)?;
        let offer = self.deflate.as_ref().map(Offer::from_config);
        let deflate =
            deflate::check_answer(values(headers, "sec-websocket-extensions"), offer.as_ref())?;
        Ok(Agreed {
            head_len: 0,
            protocol,
            deflate,
        })
    }

    /// Checks the request without writing it: the host, the target, the
    /// subprotocols and the extra headers (see [`ClientRequestError`]).
    pub fn check(&self) -> Result<(), ClientRequestError> {
        if self.host.is_empty() || !self.host.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientRequestError::InvalidHost);
        }
        if !self.target.starts_with('/')
            || !self
                .target
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'#')
        {
            return Err(ClientRequestError::InvalidTarget);
        }
        for (i, protocol) in self.protocols.iter().enumerate() {
            if !is_token(protocol) || self.protocols[..i].contains(protocol) {
                return Err(ClientRequestError::InvalidProtocol);
            }
        }
        for (name, value) in self.headers {
            if !is_token(name) || value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err(ClientRequestError::InvalidHeader);
            }
            if OWNED_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h)) {
                return Err(ClientRequestError::ReservedHeader);
            }
        }
        Ok(())
    }
}

/// An upgrade request that was written: its key and what it offered, to
/// check the server's response against.
#[derive(Clone, Copy, Debug)]
pub struct ClientHandshake<'a> {
    request: ClientRequest<'a>,
    /// The `Sec-WebSocket-Key`, base64 of 16 random bytes.
    key: [u8; 24],
}

/// What the server agreed to, from a response that completes the upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed<'a> {
    /// How many bytes the response head took: bytes after it in the read
    /// buffer are the server's first frames.
    pub head_len: usize,
    /// The subprotocol the server chose, one of those offered.
    pub protocol: Option<&'a str>,
    /// The permessage-deflate parameters agreed, if it was offered and
    /// accepted: give them to `Session::with_deflate(Role::Client, ...)` and
    /// `Compressor::new(Role::Client, ...)`.
    pub deflate: Option<DeflateParams>,
}

impl<'a> ClientHandshake<'a> {
    /// The `Sec-WebSocket-Key` the request carried.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Parses and checks the response at the start of `buf`: `Ok(None)`
    /// while its head is incomplete (read more and call again with the
    /// longer buffer).
    pub fn read_response(
        &self,
        buf: &[u8],
        max_head_len: usize,
    ) -> Result<Option<Agreed<'a>>, ClientHandshakeError> {
        let mut headers = header_buffer();
        let Some((response, head_len)) = parse_response(buf, &mut headers, max_head_len)? else {
            return Ok(None);
        };
        let mut agreed = self.check(&response)?;
        agreed.head_len = head_len;
        Ok(Some(agreed))
    }

    /// Checks a parsed response against the request (RFC 6455 §4.1, RFC
    /// 7692 §7.1). The `head_len` of the result is 0: [`parse_response`]
    /// returned it.
    pub fn check(&self, response: &Response<'_>) -> Result<Agreed<'a>, ClientHandshakeError> {
        if response.status != 101 {
            return Err(ClientHandshakeError::NotSwitching {
                status: response.status,
            });
        }
        if response.version != 1 {
            return Err(ClientHandshakeError::NotHttp11);
        }
        let headers = response.headers;
        if !values(headers, "upgrade").any(|v| value_has_token(v, "websocket")) {
            return Err(ClientHandshakeError::MissingUpgrade);
        }
        if !values(headers, "connection").any(|v| value_has_token(v, "upgrade")) {
            return Err(ClientHandshakeError::MissingConnectionUpgrade);
        }
        let mut accepts = values(headers, "sec-websocket-accept");
        match (accepts.next(), accepts.next()) {
            (Some(value), None) if value.trim_ascii() == accept_key(&self.key) => {}
            _ => return Err(ClientHandshakeError::BadAccept),
        }
        self.request.agreed(headers)
    }

    fn write_request(&self, out: &mut WriteQueue) {
        let request = &self.request;
        let mut head = HeadWriter(out);
        // Writing into the queue cannot fail.
        let _ = write!(
            head,
            "GET {} HTTP/1.1\r\n\
             Host: {}\r\n\
             Upgrade: websocket\r\n\
             Connection: Upgrade\r\n\
             Sec-WebSocket-Key: ",
            request.target, request.host,
        );
        out.push_raw(&self.key);
        out.push_raw(b"\r\nSec-WebSocket-Version: 13\r\n");
        if let Some((first, rest)) = request.protocols.split_first() {
            out.push_raw(b"Sec-WebSocket-Protocol: ");
            out.push_raw(first.as_bytes());
            for protocol in rest {
                out.push_raw(b", ");
                out.push_raw(protocol.as_bytes());
            }
            out.push_raw(b"\r\n");
        }
        if let Some(config) = &request.deflate {
            out.push_raw(b"Sec-WebSocket-Extensions: ");
            Offer::from_config(config).write(|piece| out.push_raw(piece));
            out.push_raw(b"\r\n");
        }
        for (name, value) in request.headers {
            out.push_raw(name.as_bytes());
            out.push_raw(b": ");
            out.push_raw(value.as_bytes());
            out.push_raw(b"\r\n");
        }
        out.push_raw(b"\r\n");
    }
}

/// Header fields as an HTTP/2 or HTTP/3 layer takes them: lowercase names
/// and their values.
pub type Fields = Vec<(String, Vec<u8>)>;

/// An upgrade asked for as an extended CONNECT
/// ([`ClientRequest::extended_connect`]): what it offered, to check the
/// response against.
#[derive(Clone, Copy, Debug)]
pub struct ConnectHandshake<'a> {
    request: ClientRequest<'a>,
}

impl<'a> ConnectHandshake<'a> {
    /// Checks the response to an extended CONNECT (RFC 8441 section 5, RFC
    /// 9220 section 3): any 2xx status opens the WebSocket (an HTTP layer
    /// skips the interim 1xx), another is
    /// [`NotSwitching`](ClientHandshakeError::NotSwitching); the
    /// subprotocol and the extensions are checked as after a `101`.
    pub fn check(
        &self,
        status: u16,
        headers: &[httparse::Header<'_>],
    ) -> Result<Agreed<'a>, ClientHandshakeError> {
        if !(200..300).contains(&status) {
            return Err(ClientHandshakeError::NotSwitching { status });
        }
        self.request.agreed(headers)
    }
}

/// A parsed response head, borrowing the read buffer.
#[derive(Debug)]
pub struct Response<'a> {
    status: u16,
    /// The minor version of HTTP/1.x.
    version: u8,
    headers: &'a [httparse::Header<'a>],
}

impl<'a> Response<'a> {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The first value of header `name` (matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        header(self.headers, name)
    }

    /// Every header field, in order, as `(name, value)`.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.headers.iter().map(|h| (h.name, h.value))
    }
}

/// Parses the response head at the start of `buf`, indexing its header
/// fields into `headers`. Returns `Ok(None)` while the head is incomplete,
/// or the response and the length of its head. Only HTTP is checked here;
/// [`ClientHandshake::check`] judges the upgrade.
pub fn parse_response<'a>(
    buf: &'a [u8],
    headers: &'a mut HeaderBuffer<'a>,
    max_head_len: usize,
) -> Result<Option<(Response<'a>, usize)>, ClientHandshakeError> {
    // A TLS record (an alert, or a handshake: 0x15 or 0x16, then version
    // 3.x) where the status line belongs: a wss:// port asked in plain.
    if matches!(buf.first(), Some(0x15 | 0x16)) && buf.get(1).is_none_or(|&major| major == 3) {
        return Err(ClientHandshakeError::TlsAnswer);
    }
    let mut response = httparse::Response::new(headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= max_head_len {
                Err(ClientHandshakeError::HeadTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ClientHandshakeError::TooManyHeaders),
        Err(_) => return Err(ClientHandshakeError::Malformed),
    };
    if head_len > max_head_len {
        return Err(ClientHandshakeError::HeadTooLarge);
    }
    let (Some(status), Some(version)) = (response.code, response.version) else {
        return Err(ClientHandshakeError::Malformed);
    };
    let response = Response {
        status,
        version,
        headers: response.headers,
    };
    Ok(Some((response, head_len)))
}

/// RFC 7230 `tchar`, at least one.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests;
