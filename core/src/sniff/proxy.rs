//! The PROXY protocol's header (HAProxy's, versions 1 and 2): the address a
//! load balancer took a connection from, sent by it before the first byte of
//! the connection's own protocol.
//!
//! [`parse`] reads the header at the start of what has arrived so far and
//! says how many bytes it took; what follows is the connection's own. It
//! reads nothing past the header: at most [`MAX_V1`] bytes for version 1,
//! the length version 2 announces (refused past [`MAX_V2`]) for version 2,
//! and answers [`Parsed::Partial`] until it has them. Anything else is an
//! [`Error`]: a server that expects the header refuses the connection,
//! since a peer allowed to skip it could claim any address by sending one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::matchers::prefix;

/// Version 2's first 12 bytes.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Version 1's first 6 bytes.
pub const V1_PREFIX: &[u8; 6] = b"PROXY ";

/// The longest version 1 header, its CRLF included (the specification's
/// bound).
pub const MAX_V1: usize = 107;

/// The longest version 2 header taken, its 16 fixed bytes included. The
/// specification allows 16 + 65,535; what proxies send is the addresses
/// (at most 216 bytes) and a few TLVs (SNI, ALPN, a unique id, TLS
/// details), far below this.
pub const MAX_V2: usize = 4096;

/// What a header says of the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proxied {
    /// A proxied IP connection: where the client came from, and the
    /// address it reached on the proxy.
    Inet {
        /// The client's address.
        source: SocketAddr,
        /// The address the client connected to.
        destination: SocketAddr,
        /// Version 2's transport: a stream (TCP) or datagrams (UDP);
        /// version 1 speaks of TCP only.
        datagram: bool,
    },
    /// A proxied UNIX socket connection (version 2): the paths, without
    /// their trailing NULs.
    Unix {
        /// The client's socket path (often empty: an unnamed socket).
        source: Vec<u8>,
        /// The path it connected to.
        destination: Vec<u8>,
    },
    /// No client address: the proxy's own connection (version 2's LOCAL,
    /// a health check) or one of a family it does not name (version 1's
    /// UNKNOWN, version 2's UNSPEC). The connection's own addresses stand.
    Local,
}

impl Proxied {
    /// The client's IP address and port, if the header gave one.
    pub fn source(&self) -> Option<SocketAddr> {
        match self {
            Proxied::Inet { source, .. } => Some(*source),
            _ => None,
        }
    }
}

/// The outcome of [`parse`] on the bytes so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed to decide.
    Partial,
    /// A whole header: what it says, and how many bytes it took.
    Complete(Proxied, usize),
}

/// Why a header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The bytes start as neither version's header.
    NotProxy,
    /// Version 1: no CRLF within [`MAX_V1`] bytes.
    V1TooLong,
    /// Version 1: a line that does not read as the specification writes it.
    V1Malformed,
    /// Version 2: a version nibble other than 2.
    V2Version,
    /// Version 2: a command other than LOCAL or PROXY.
    V2Command,
    /// Version 2: an address family or transport it does not define.
    V2Family,
    /// Version 2: a length past [`MAX_V2`].
    V2TooLong,
    /// Version 2: a length shorter than its family's addresses, or a TLV
    /// that runs past the header's end.
    V2Truncated,
}

impl Error {
    /// A short reason, for logs and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Error::NotProxy => "no PROXY protocol header",
            Error::V1TooLong => "PROXY v1 header longer than 107 bytes",
            Error::V1Malformed => "malformed PROXY v1 header",
            Error::V2Version => "PROXY v2 header of an unknown version",
            Error::V2Command => "PROXY v2 header with an unknown command",
            Error::V2Family => "PROXY v2 header with an unknown address family",
            Error::V2TooLong => "PROXY v2 header longer than allowed",
            Error::V2Truncated => "PROXY v2 header shorter than its addresses or TLVs",
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Error {}

/// Whether `input` starts (so far) like a header of either version:
/// `Some(true)` once enough is seen to be sure of the signature, `Some(false)`
/// as soon as it cannot be one, `None` while too few bytes have come. A
/// router's matcher; [`parse`] decides the rest.
pub fn sniff(input: &[u8]) -> Option<bool> {
    // The two cannot both agree with one input: their first bytes differ.
    match prefix(input, V1_PREFIX) {
        Some(false) => prefix(input, &V2_SIGNATURE),
        agreed => agreed,
    }
}

/// Reads a header of either version at the start of `input` (see the
/// module's doc).
pub fn parse(input: &[u8]) -> Result<Parsed, Error> {
    match sniff(input) {
        None => Ok(Parsed::Partial),
        Some(false) => Err(Error::NotProxy),
        Some(true) if input.starts_with(V1_PREFIX) => parse_v1(input),
        Some(true) => parse_v2(input),
    }
}

fn parse_v1(input: &[u8]) -> Result<Parsed, Error> {
    let window = &input[..input.len().min(MAX_V1)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if input.len() >= MAX_V1 {
            Err(Error::V1TooLong)
        } else {
            Ok(Parsed::Partial)
        };
    };
    let line = std::str::from_utf8(&input[V1_PREFIX.len()..end]).map_err(|_| Error::V1Malformed)?;
    let taken = end + 2;
    let mut fields = line.split(' ');
    let family = fields.next().ok_or(Error::V1Malformed)?;
    let ip = |text: &str, v6: bool| -> Result<IpAddr, Error> {
        let addr = if v6 {
            IpAddr::V6(text.parse::<Ipv6Addr>().map_err(|_| Error::V1Malformed)?)
        } else {
            IpAddr::V4(text.parse::<Ipv4Addr>().map_err(|_| Error::V1Malformed)?)
        };
        Ok(addr)
    };
    let v6 = match family {
        // The rest of the line, whatever it says, is ignored.
        "UNKNOWN" => return Ok(Parsed::Complete(Proxied::Local, taken)),
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(Error::V1Malformed),
    };
    let mut next = || fields.next().ok_or(Error::V1Malformed);
    let (source, destination) = (ip(next()?, v6)?, ip(next()?, v6)?);
    let (source_port, destination_port) = (port(next()?)?, port(next()?)?);
    if fields.next().is_some() {
        return Err(Error::V1Malformed);
    }
    let proxied = Proxied::Inet {
        source: SocketAddr::new(source, source_port),
        destination: SocketAddr::new(destination, destination_port),
        datagram: false,
    };
    Ok(Parsed::Complete(proxied, taken))
}

/// A decimal port, 0 to 65535, without a sign or leading zeros.
fn port(text: &str) -> Result<u16, Error> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return Err(Error::V1Malformed);
    }
    text.parse().map_err(|_| Error::V1Malformed)
}

fn parse_v2(input: &[u8]) -> Result<Parsed, Error> {
    let Some(fixed) = input.get(..16) else {
        return Ok(Parsed::Partial);
    };
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    if version != 2 {
        return Err(Error::V2Version);
    }
    let local = match command {
        0 => true,
        1 => false,
        _ => return Err(Error::V2Command),
    };
    let (family, transport) = (fixed[13] >> 4, fixed[13] & 0x0f);
    let length = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let taken = 16 + length;
    if taken > MAX_V2 {
        return Err(Error::V2TooLong);
    }
    // Known values only, even for LOCAL (whose addresses are ignored): a
    // proxy that sends others speaks a version this does not.
    let addresses = match family {
        0 => 0,
        1 => 12,
        2 => 36,
        3 => 216,
        _ => return Err(Error::V2Family),
    };
    if transport > 2 || (family == 0) != (transport == 0) {
        return Err(Error::V2Family);
    }
    if length < addresses {
        return Err(Error::V2Truncated);
    }
    let Some(body) = input.get(16..taken) else {
        return Ok(Parsed::Partial);
    };
    skip_tlvs(&body[addresses..])?;
    if local || family == 0 {
        return Ok(Parsed::Complete(Proxied::Local, taken));
    }
    let datagram = transport == 2;
    let proxied = match family {
        1 => {
            let ip = |at: usize| {
                IpAddr::V4(Ipv4Addr::new(
                    body[at],
                    body[at + 1],
                    body[at + 2],
                    body[at + 3],
                ))
            };
            let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
            Proxied::Inet {
                source: SocketAddr::new(ip(0), port(8)),
                destination: SocketAddr::new(ip(4), port(10)),
                datagram,
            }
        }
        2 => {
            let ip = |at: usize| {
                let mut octets = [0; 16];
                octets.copy_from_slice(&body[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
            Proxied::Inet {
                source: SocketAddr::new(ip(0), port(32)),
                destination: SocketAddr::new(ip(16), port(34)),
                datagram,
            }
        }
        _ => {
            let path = |at: usize| {
                let raw = &body[at..at + 108];
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                raw[..end].to_vec()
            };
            Proxied::Unix {
                source: path(0),
                destination: path(108),
            }
        }
    };
    Ok(Parsed::Complete(proxied, taken))
}

/// Walks the TLVs after the addresses (type, 16-bit length, value): none
/// is used, each must end within the header.
fn skip_tlvs(mut rest: &[u8]) -> Result<(), Error> {
    while !rest.is_empty() {
        let Some(head) = rest.get(..3) else {
            return Err(Error::V2Truncated);
        };
        let end = 3 + usize::from(u16::from_be_bytes([head[1], head[2]]));
        rest = rest.get(end..).ok_or(Error::V2Truncated)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
