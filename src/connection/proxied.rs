//! Behind proxies: the PROXY protocol on a listener
//! ([`Config::proxy_protocol`]), and forwarding headers from trusted
//! proxies ([`Config::trust_proxies`]).
//!
//! Behind a
//! load balancer in TCP mode (HAProxy's `send-proxy`, an AWS NLB), the
//! client's address comes in a header before the request, and becomes the
//! connection's ([`Conn::peer_addr`](crate::Conn::peer_addr)).
//!
//! Once enabled, the header is required: a connection without a valid one
//! is closed without a byte in answer, as HAProxy and nginx do, since a
//! peer allowed to skip it could also send one naming any address it
//! likes. For the same reason, a listener that others than the balancer
//! can reach should name the balancer's addresses
//! ([`ProxyProtocol::from_sources`]).
//!
//! [`Config::proxy_protocol`]: crate::Config::proxy_protocol
//! [`Config::trust_proxies`]: crate::Config::trust_proxies

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use bytes::{Buf, BytesMut};
use rapidws_core::handshake::{ForwardedError, Request, forwarded};
use rapidws_core::sniff::proxy::{self, Parsed, Proxied};

/// Which connections must start with a PROXY protocol header (versions 1
/// and 2 both taken), and from where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyProtocol {
    /// Empty: from any address.
    sources: Vec<Network>,
}

impl ProxyProtocol {
    /// Every connection starts with a header, from whichever address.
    pub fn required() -> ProxyProtocol {
        ProxyProtocol::default()
    }

    /// Only connections from these networks (the load balancers') are
    /// taken; any other is closed at once.
    pub fn from_sources(mut self, sources: impl IntoIterator<Item = Network>) -> ProxyProtocol {
        self.sources = sources.into_iter().collect();
        self
    }

    /// Whether a connection from `peer` may be taken at all.
    pub(crate) fn admits(&self, peer: IpAddr) -> bool {
        self.sources.is_empty() || self.sources.iter().any(|n| n.contains(peer))
    }
}

/// An IP network, `10.0.0.0/8` or `2001:db8::/32` (an address alone is a
/// network of one). An IPv4 address met as IPv6 (`::ffff:10.1.2.3`, from a
/// dual-stack socket) is matched as IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// The network of `addr`'s first `prefix` bits; `None` past the
    /// address's width.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Network> {
        let addr = addr.to_canonical();
        let width = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= width).then_some(Network { addr, prefix })
    }

    /// Whether `ip` is in it.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => (u128::from(v4.to_bits()) << 96, 32),
            IpAddr::V6(v6) => (v6.to_bits(), 128),
        };
        let ((network, width), (candidate, other)) = (bits(self.addr), bits(ip.to_canonical()));
        if width != other {
            return false;
        }
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix))
            .unwrap_or(0);
        network & mask == candidate & mask
    }
}

/// Why a network did not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkError(String);

impl std::fmt::Display for NetworkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not an IP network (ADDRESS or ADDRESS/PREFIX): {:?}",
            self.0
        )
    }
}

impl std::error::Error for NetworkError {}

impl FromStr for Network {
    type Err = NetworkError;

    fn from_str(text: &str) -> Result<Network, NetworkError> {
        let error = || NetworkError(text.to_owned());
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => {
                let digits = !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_digit());
                (addr, Some(prefix).filter(|_| digits).ok_or_else(error)?)
            }
            None => (text, ""),
        };
        let addr: IpAddr = addr.parse().map_err(|_| error())?;
        let width = if addr.to_canonical().is_ipv4() {
            32
        } else {
            128
        };
        let prefix = match prefix {
            "" => width,
            digits => digits.parse().map_err(|_| error())?,
        };
        Network::new(addr, prefix).ok_or_else(error)
    }
}

/// What trusted proxies ([`Config::trust_proxies`]) said of a request:
/// the client's address, and the `Host` the client sent.
///
/// [`Config::trust_proxies`]: crate::Config::trust_proxies
pub(crate) struct Told<'a> {
    pub(crate) client: Option<SocketAddr>,
    pub(crate) host: Option<std::borrow::Cow<'a, str>>,
}

/// Reads `request`'s forwarding headers if `peer` is one of `trusted`
/// (none read otherwise, or with no proxy trusted). A client address
/// without a port (`X-Forwarded-For`) gets port 0.
pub(crate) fn told_by<'a>(
    request: &Request<'a>,
    peer: SocketAddr,
    trusted: &[Network],
) -> Result<Told<'a>, ForwardedError> {
    let nothing = Told {
        client: None,
        host: None,
    };
    if trusted.is_empty() {
        return Ok(nothing);
    }
    let headers: Vec<(&'a str, &'a [u8])> = request.headers().collect();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|network| network.contains(ip));
    let Some(told) = forwarded(peer.ip(), headers.iter().copied(), is_trusted)? else {
        return Ok(nothing);
    };
    Ok(Told {
        client: told
            .client
            .map(|ip| SocketAddr::new(ip, told.port.unwrap_or(0))),
        host: told.host,
    })
}

/// What reading the header at the start of a connection came to.
pub(crate) enum Header {
    /// Not all of it has come.
    Waiting,
    /// Read and consumed; `peer` is the client's now (or unchanged, for a
    /// proxy's own connection).
    Read,
    /// The connection is refused: why, for the log.
    Refused(&'static str),
}

/// Reads the header at the start of `input`, consuming it.
pub(crate) fn read_header(input: &mut BytesMut, peer: &mut SocketAddr) -> Header {
    match proxy::parse(input) {
        Ok(Parsed::Partial) => Header::Waiting,
        Ok(Parsed::Complete(proxied, taken)) => {
            input.advance(taken);
            if let Proxied::Inet { source, .. } = proxied {
                *peer = source;
            }
            Header::Read
        }
        Err(error) => Header::Refused(error.reason()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_read_and_match() {
        let net: Network = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.255.1.2".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(!net.contains("::a00:1".parse().unwrap()));
        let one: Network = "192.0.2.7".parse().unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let v6: Network = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        let all: Network = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let mapped: Network = "::ffff:10.0.0.0/8".parse().unwrap();
        assert!(mapped.contains("10.9.9.9".parse().unwrap()));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0/8",
            "x",
            "10.0.0.0/+8",
            "",
        ] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sources_admit_only_their_networks() {
        assert!(ProxyProtocol::required().admits("203.0.113.9".parse().unwrap()));
        let only = ProxyProtocol::required().from_sources(["127.0.0.0/8".parse().unwrap()]);
        assert!(only.admits("127.0.0.2".parse().unwrap()));
        assert!(!only.admits("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn the_header_is_consumed_and_the_request_left() {
        let mut peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut input = BytesMut::from(&b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 80\r\nGET"[..]);
        assert!(matches!(read_header(&mut input, &mut peer), Header::Read));
        assert_eq!(peer, "192.0.2.7:5000".parse().unwrap());
        assert_eq!(&input[..], b"GET");
        let mut input = BytesMut::from(&b"PROXY UNKNOWN\r\n"[..]);
        assert!(matches!(read_header(&mut input, &mut peer), Header::Read));
        assert_eq!(peer, "192.0.2.7:5000".parse().unwrap());
        let mut input = BytesMut::from(&b"PROXY TCP4"[..]);
        assert!(matches!(
            read_header(&mut input, &mut peer),
            Header::Waiting
        ));
        let mut input = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        assert!(matches!(
            read_header(&mut input, &mut peer),
            Header::Refused(_)
        ));
    }
}
