//! A TLS ClientHello read without terminating TLS: the server name (SNI)
//! and the protocols offered (ALPN) a router decides by, the bytes left in
//! place for whichever TLS server the connection goes to.
//!
//! [`read`] looks at what has arrived so far: handshake records (type 22)
//! whose payloads, joined, begin with a ClientHello. It answers
//! [`Read::Partial`] until the whole hello is there (at most
//! [`MAX_HELLO`] bytes of it), then what it offers. It checks the framing
//! of every length it walks, and nothing else: the TLS server that takes
//! the connection checks the rest.

/// The longest ClientHello read (its handshake message, head included).
/// Today's largest, with post-quantum key shares, are under 2 KiB; TLS
/// allows 16 MiB, which no router should wait for.
pub const MAX_HELLO: usize = 16 * 1024;

/// The most bytes [`read`] walks: a hello of [`MAX_HELLO`] cut into records
/// as small as a peer likes would otherwise need more.
pub const MAX_INPUT: usize = 2 * MAX_HELLO;

/// What a ClientHello offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientHello {
    /// The `server_name` extension's host name, if it has one (as sent:
    /// ASCII, any case).
    pub server_name: Option<String>,
    /// The `application_layer_protocol_negotiation` extension's protocols,
    /// in the client's order; empty without the extension.
    pub alpn: Vec<Vec<u8>>,
}

impl ClientHello {
    /// Whether the client offers `protocol` (`b"h2"`, `b"http/1.1"`, ...).
    pub fn offers(&self, protocol: &[u8]) -> bool {
        self.alpn.iter().any(|p| p == protocol)
    }
}

/// The outcome of [`read`] on the bytes so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// More bytes are needed.
    Partial,
    /// The whole ClientHello has come: what it offers.
    Complete(ClientHello),
}

/// Why the bytes are not a ClientHello this reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Not a TLS handshake record (the first byte is not 22, or the
    /// record's version is not 3.x).
    NotTls,
    /// A handshake message other than a ClientHello comes first.
    NotClientHello,
    /// A length that runs past what contains it, or a field the
    /// specification does not allow.
    Malformed,
    /// A ClientHello longer than [`MAX_HELLO`].
    TooLong,
}

impl Error {
    /// A short reason, for logs and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Error::NotTls => "not a TLS handshake record",
            Error::NotClientHello => "a TLS handshake that is not a ClientHello",
            Error::Malformed => "malformed TLS ClientHello",
            Error::TooLong => "TLS ClientHello too long",
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Error {}

/// Whether `input` starts like a TLS handshake record: `None` while fewer
/// than 3 bytes have come. A router's matcher; [`read`] decides the rest.
pub fn sniff(input: &[u8]) -> Option<bool> {
    match input {
        [] => None,
        [22] => None,
        [22, 3] => None,
        [22, 3, minor, ..] => Some(*minor <= 4),
        _ => Some(false),
    }
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const SERVER_NAME: u16 = 0;
const ALPN: u16 = 16;

/// Reads the ClientHello at the start of `input` (see the module's doc).
pub fn read(input: &[u8]) -> Result<Read, Error> {
    if sniff(input) == Some(false) {
        return Err(Error::NotTls);
    }
    // The handshake messages' bytes, joined across records.
    let mut message = Vec::new();
    let mut rest = input;
    loop {
        let Some(head) = rest.get(..5) else {
            return Ok(Read::Partial);
        };
        if head[0] != HANDSHAKE || head[1] != 3 {
            return Err(Error::NotTls);
        }
        let length = usize::from(u16::from_be_bytes([head[3], head[4]]));
        // A record holds at most 2^14 bytes; an empty handshake record is
        // not allowed either.
        if length == 0 || length > 1 << 14 {
            return Err(Error::Malformed);
        }
        let Some(payload) = rest.get(5..5 + length) else {
            // What has come of this record may already show the type.
            let partial = &rest[5..];
            if message.is_empty() && partial.first().is_some_and(|&t| t != CLIENT_HELLO) {
                return Err(Error::NotClientHello);
            }
            return Ok(Read::Partial);
        };
        message.extend_from_slice(payload);
        rest = &rest[5 + length..];
        if input.len() - rest.len() > MAX_INPUT {
            return Err(Error::TooLong);
        }
        if message[0] != CLIENT_HELLO {
            return Err(Error::NotClientHello);
        }
        let Some(size) = message.get(1..4) else {
            continue;
        };
        let size =
            4 + (usize::from(size[0]) << 16 | usize::from(size[1]) << 8 | usize::from(size[2]));
        if size > MAX_HELLO {
            return Err(Error::TooLong);
        }
        if message.len() >= size {
            return parse_hello(&message[4..size]).map(Read::Complete);
        }
    }
}

/// A cursor over a ClientHello's body: every read checks its length.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.0.len() {
            return Err(Error::Malformed);
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<usize, Error> {
        Ok(usize::from(self.take(1)?[0]))
    }

    fn u16(&mut self) -> Result<usize, Error> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a one- or two-byte length, as a cursor of its own.
    fn vector(&mut self, wide: bool) -> Result<Cursor<'a>, Error> {
        let n = if wide { self.u16()? } else { self.u8()? };
        Ok(Cursor(self.take(n)?))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn parse_hello(body: &[u8]) -> Result<ClientHello, Error> {
    let mut body = Cursor(body);
    let _version_and_random = body.take(2 + 32)?;
    let session_id = body.vector(false)?;
    if session_id.0.len() > 32 {
        return Err(Error::Malformed);
    }
    let suites = body.vector(true)?;
    if suites.is_empty() || suites.0.len() % 2 != 0 {
        return Err(Error::Malformed);
    }
    if body.vector(false)?.is_empty() {
        return Err(Error::Malformed);
    }
    let mut hello = ClientHello::default();
    if body.is_empty() {
        // No extensions at all (an old client): nothing to route on.
        return Ok(hello);
    }
    let mut extensions = body.vector(true)?;
    if !body.is_empty() {
        return Err(Error::Malformed);
    }
    let mut seen = Vec::new();
    while !extensions.is_empty() {
        let kind = extensions.u16()? as u16;
        let mut data = extensions.vector(true)?;
        // Each extension at most once (RFC 8446, 4.2).
        if seen.contains(&kind) {
            return Err(Error::Malformed);
        }
        seen.push(kind);
        match kind {
            SERVER_NAME => hello.server_name = server_name(&mut data)?,
            ALPN => hello.alpn = protocols(&mut data)?,
            _ => {}
        }
    }
    Ok(hello)
}

/// The host name of a `server_name` extension (RFC 6066, 3): a list of
/// names, of which one may be a host name (type 0).
fn server_name(data: &mut Cursor<'_>) -> Result<Option<String>, Error> {
    let mut names = data.vector(true)?;
    if !data.is_empty() || names.is_empty() {
        return Err(Error::Malformed);
    }
    let mut host = None;
    while !names.is_empty() {
        let kind = names.u8()?;
        let name = names.vector(true)?.0;
        if kind != 0 {
            continue;
        }
        let ascii = !name.is_empty() && name.iter().all(|b| b.is_ascii_graphic());
        if host.is_some() || !ascii {
            return Err(Error::Malformed);
        }
        host = Some(String::from_utf8_lossy(name).into_owned());
    }
    Ok(host)
}

/// The protocols of an ALPN extension (RFC 7301, 3.1): none empty.
fn protocols(data: &mut Cursor<'_>) -> Result<Vec<Vec<u8>>, Error> {
    let mut list = data.vector(true)?;
    if !data.is_empty() || list.is_empty() {
        return Err(Error::Malformed);
    }
    let mut protocols = Vec::new();
    while !list.is_empty() {
        let name = list.vector(false)?.0;
        if name.is_empty() {
            return Err(Error::Malformed);
        }
        protocols.push(name.to_vec());
    }
    Ok(protocols)
}

#[cfg(test)]
mod tests;
