//! Proxies a client connects through: HTTP CONNECT (with Basic
//! credentials) and SOCKS5 (with a username and password), given
//! explicitly or taken from the environment when the caller opts in. The
//! answers are read by the sans-I/O readers in `reply.rs`; this file only
//! moves their bytes.

mod reply;

#[doc(hidden)]
pub use reply::{
    MAX_CONNECT_HEAD, Read, connect_request, read_connect_response, read_socks_auth,
    read_socks_connect, read_socks_method, socks_auth, socks_connect, socks_connect_ip,
    socks_greeting,
};

use std::net::IpAddr;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::{ConnectError, ProxyError};
use super::url::{Host, Url, UrlError};

/// A proxy to reach WebSocket servers through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proxy {
    kind: Kind,
    pub(crate) host: Host,
    pub(crate) port: u16,
    credentials: Option<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// HTTP CONNECT.
    Http,
    /// SOCKS5; `remote_dns`: the proxy resolves the name (`socks5h`).
    Socks5 { remote_dns: bool },
}

impl Proxy {
    /// A proxy from its URL: `http://[user:password@]host[:port]` (port 80
    /// by default) for HTTP CONNECT, `socks5://[user:password@]host[:port]`
    /// (port 1080) for SOCKS5 with names resolved here, `socks5h://...` for
    /// SOCKS5 with names resolved by the proxy. Credentials are
    /// percent-decoded.
    pub fn new(url: &str) -> Result<Proxy, ConnectError> {
        if !url.contains("://") {
            // `Url::parse` would suggest a WebSocket URL.
            return Err(ConnectError::Url(UrlError::new(
                "no scheme: give a proxy as http://host:port, socks5://host:port \
                 or socks5h://host:port",
            )));
        }
        let url = Url::parse(url)?;
        let (kind, default_port) = match url.scheme.as_str() {
            "http" => (Kind::Http, 80),
            "socks5" => (Kind::Socks5 { remote_dns: false }, 1080),
            "socks5h" => (Kind::Socks5 { remote_dns: true }, 1080),
            other => {
                return Err(ConnectError::Proxy(ProxyError::UnsupportedScheme(
                    other.into(),
                )));
            }
        };
        Ok(Proxy {
            kind,
            port: url.port_or(default_port),
            host: url.host,
            credentials: url.credentials,
        })
    }

    /// The proxy the environment names for `target`, as curl reads it:
    /// `https_proxy` or `HTTPS_PROXY` for `wss`, `http_proxy` for `ws`
    /// (lower case only, as curl: `HTTP_PROXY` can be set by a CGI
    /// request's `Proxy:` header), then `all_proxy` or `ALL_PROXY`; none if
    /// `no_proxy` or `NO_PROXY` matches the host. An empty variable counts
    /// as unset.
    pub(crate) fn from_env(target: &Url) -> Option<Result<Proxy, ConnectError>> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let scheme_var = if target.scheme == "wss" {
            var("https_proxy").or_else(|| var("HTTPS_PROXY"))
        } else {
            var("http_proxy")
        };
        let mut url = scheme_var.or_else(|| var("all_proxy").or_else(|| var("ALL_PROXY")))?;
        if !url.contains("://") {
            // `proxy:3128`, as curl takes it.
            url = format!("http://{}", url.trim());
        }
        let no_proxy = var("no_proxy")
            .or_else(|| var("NO_PROXY"))
            .unwrap_or_default();
        if bypasses(&no_proxy, &target.host) {
            return None;
        }
        Some(Proxy::new(&url))
    }

    /// Opens a tunnel to `host:port` over `stream`, a connection to this
    /// proxy.
    pub(crate) async fn tunnel<S>(
        &self,
        stream: &mut S,
        host: &Host,
        port: u16,
    ) -> Result<(), ConnectError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let credentials = self
            .credentials
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.as_str()));
        let mut buf = BytesMut::with_capacity(512);
        match self.kind {
            Kind::Http => {
                write(stream, &connect_request(host, port, credentials)).await?;
                read_until(stream, &mut buf, read_connect_response).await?;
            }
            Kind::Socks5 { remote_dns } => {
                write(stream, &socks_greeting(credentials.is_some())).await?;
                let wants_auth = loop {
                    match read_socks_method(&buf, credentials.is_some())
                        .map_err(ConnectError::Proxy)?
                    {
                        Some(wants) => break wants,
                        None => read_more(stream, &mut buf).await?,
                    }
                };
                let _ = buf.split_to(2);
                if let (true, Some((user, password))) = (wants_auth, credentials) {
                    write(
                        stream,
                        &socks_auth(user, password).map_err(ConnectError::Proxy)?,
                    )
                    .await?;
                    read_until(stream, &mut buf, read_socks_auth).await?;
                }
                let request = match host {
                    Host::Name(name) if !remote_dns => {
                        let ip = resolve_one(name, port).await?;
                        socks_connect_ip(ip, port)
                    }
                    _ => socks_connect(host, port).map_err(ConnectError::Proxy)?,
                };
                write(stream, &request).await?;
                read_until(stream, &mut buf, read_socks_connect).await?;
            }
        }
        if !buf.is_empty() {
            // The server cannot have spoken yet: nothing was sent to it.
            return Err(ConnectError::Proxy(ProxyError::Malformed(
                "bytes after the answer, before the client spoke",
            )));
        }
        Ok(())
    }
}

/// Whether `no_proxy` names `host`. Entries are separated by commas or
/// spaces: `*` (every host); a name, which also matches its subdomains
/// (`example.com`, `.example.com` and `*.example.com` all match
/// `api.example.com`); an IP address, matched exactly; or a network in
/// CIDR form (`10.0.0.0/8`, `fd00::/8`). A `:port` after a name or an
/// address is ignored.
pub(crate) fn bypasses(no_proxy: &str, host: &Host) -> bool {
    let ip: Option<IpAddr> = match host {
        Host::Name(_) => None,
        Host::V4(ip) => Some((*ip).into()),
        Host::V6(ip) => Some((*ip).into()),
    };
    no_proxy
        .split([',', ' '])
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            if let Some((network, bits)) = entry.split_once('/') {
                return ip.is_some_and(|ip| in_network(ip, network, bits));
            }
            let entry = match entry.strip_prefix('[') {
                Some(bracketed) => bracketed.split(']').next().unwrap_or(bracketed),
                None => match entry.rsplit_once(':') {
                    // host:port, not an IPv6 address.
                    Some((name, port))
                        if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        name
                    }
                    _ => entry,
                },
            };
            match (ip, host) {
                (Some(ip), _) => entry.parse::<IpAddr>() == Ok(ip),
                (None, Host::Name(name)) => {
                    let name = name.trim_end_matches('.');
                    let entry = entry.trim_start_matches('*').trim_start_matches('.');
                    let entry = entry.trim_end_matches('.').to_ascii_lowercase();
                    !entry.is_empty() && (name == entry || name.ends_with(&format!(".{entry}")))
                }
                (None, _) => false,
            }
        })
}

/// Whether `ip` is in `network/bits`.
fn in_network(ip: IpAddr, network: &str, bits: &str) -> bool {
    let (Ok(network), Ok(bits)) = (network.parse::<IpAddr>(), bits.parse::<u32>()) else {
        return false;
    };
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(network)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(ip) & mask == u32::from(network) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(network)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(ip) & mask == u128::from(network) & mask
        }
        _ => false,
    }
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> Result<(), ConnectError> {
    stream.write_all(bytes).await.map_err(ConnectError::Io)?;
    stream.flush().await.map_err(ConnectError::Io)
}

async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<(), ConnectError> {
    buf.reserve(512);
    match stream.read_buf(buf).await {
        Ok(0) => Err(ConnectError::Proxy(ProxyError::Malformed(
            "the proxy closed the connection",
        ))),
        Ok(_) => Ok(()),
        Err(error) => Err(ConnectError::Io(error)),
    }
}

/// Reads until `reader` is done, then drops the answer from `buf`.
async fn read_until<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    reader: fn(&[u8]) -> Result<Read, ProxyError>,
) -> Result<(), ConnectError> {
    loop {
        match reader(buf).map_err(ConnectError::Proxy)? {
            Read::Done(n) => {
                let _ = buf.split_to(n);
                return Ok(());
            }
            Read::More => read_more(stream, buf).await?,
        }
    }
}

async fn resolve_one(name: &str, port: u16) -> Result<IpAddr, ConnectError> {
    let dns = |error| ConnectError::Dns {
        host: name.to_owned(),
        error,
    };
    let mut addrs = tokio::net::lookup_host((name, port)).await.map_err(dns)?;
    addrs.next().map(|addr| addr.ip()).ok_or_else(|| {
        dns(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        Url::parse(&format!("ws://{s}/")).unwrap().host
    }

    #[test]
    fn proxy_urls() {
        let p = Proxy::new("http://user:pa%20ss@proxy.local:3128").unwrap();
        assert_eq!(p.kind, Kind::Http);
        assert_eq!(p.port, 3128);
        assert_eq!(p.credentials, Some(("user".into(), "pa ss".into())));
        assert_eq!(Proxy::new("http://proxy").unwrap().port, 80);
        let s = Proxy::new("socks5://127.0.0.1").unwrap();
        assert_eq!((s.kind, s.port), (Kind::Socks5 { remote_dns: false }, 1080));
        let h = Proxy::new("socks5h://[::1]:9050").unwrap();
        assert_eq!((h.kind, h.port), (Kind::Socks5 { remote_dns: true }, 9050));
        assert!(matches!(
            Proxy::new("https://proxy"),
            Err(ConnectError::Proxy(ProxyError::UnsupportedScheme(s))) if s == "https"
        ));
        // Without a scheme the error names the proxy schemes, not ws://.
        let Err(ConnectError::Url(error)) = Proxy::new("proxy:3128") else {
            panic!("a proxy without a scheme was taken");
        };
        assert!(error.reason().contains("http://host:port"), "{error}");
        assert!(!error.reason().contains("ws://"), "{error}");
        let error = Proxy::new("https://proxy").unwrap_err().to_string();
        assert!(error.contains("http, socks5, socks5h"), "{error}");
    }

    #[test]
    fn no_proxy_matching() {
        assert!(bypasses("*", &host("anything.example")));
        assert!(bypasses("localhost,127.0.0.1", &host("127.0.0.1")));
        assert!(bypasses("example.com", &host("example.com")));
        assert!(bypasses("example.com", &host("api.example.com")));
        assert!(bypasses(".example.com", &host("api.example.com")));
        assert!(bypasses("Example.COM:443", &host("example.com")));
        assert!(bypasses("[::1]", &host("[::1]")));
        assert!(bypasses(" a.test  b.test ", &host("b.test")));
        assert!(!bypasses("example.com", &host("notexample.com")));
        assert!(!bypasses("", &host("example.com")));
        assert!(!bypasses("127.0.0.1", &host("127.0.0.2")));
        // Addresses match exactly, never as a suffix; names never match an
        // address.
        assert!(!bypasses("0.0.1", &host("127.0.0.1")));
        assert!(!bypasses("localhost", &host("127.0.0.1")));
        assert!(bypasses("*.example.com", &host("api.example.com")));
        assert!(!bypasses("*.example.com", &host("example.org")));
        // Networks.
        assert!(bypasses("10.0.0.0/8", &host("10.1.2.3")));
        assert!(!bypasses("10.0.0.0/8", &host("11.1.2.3")));
        assert!(bypasses("192.168.1.0/24,fd00::/8", &host("[fd12::1]")));
        assert!(!bypasses("fd00::/8", &host("[fe80::1]")));
        assert!(bypasses("0.0.0.0/0", &host("1.2.3.4")));
        assert!(!bypasses("10.0.0.0/8", &host("ten.example")));
        assert!(!bypasses("10.0.0.0/33", &host("10.0.0.1")));
    }
}
