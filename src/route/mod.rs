//! One port, many protocols: each accepted connection goes to the server
//! of its protocol, told by its first bytes (cmux's idea). HTTP/1,
//! HTTP/2's preface (h2c, gRPC), TLS by the server name and ALPN of its
//! ClientHello (read, not terminated), smux, a prefix or a test of the
//! user's, or anything; behind a load balancer, a PROXY protocol header
//! first.
//!
//! | file | concern |
//! |---|---|
//! | `mod.rs` | [`Router`], [`Matcher`], [`Routed`]: the routes, the sniff, the accept loop |
//! | `sniffed.rs` | [`Sniffed`]: the stream with the bytes read to route it put back |
//!
//! The first route whose matcher says yes takes the connection, in the
//! order given; a later route is chosen only once every earlier one has
//! said no, so a matcher that needs more bytes makes the router read more.
//! The sniff is bounded in bytes ([`Router::max_sniff_bytes`]) and in time
//! ([`Router::sniff_timeout`]): a peer that sends nothing, dribbles, or
//! sends what no route claims is closed, and counted ([`Router::stats`]).
//! The matchers are rapidws-core's `sniff` module: sans-I/O and fuzzed.

mod sniffed;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rapidws_core::sniff::hello::{self, ClientHello};
use rapidws_core::sniff::matchers;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

pub use sniffed::Sniffed;

use crate::connection::proxied::{Header, ProxyProtocol, read_header};
use crate::driver::listen::{MAX_BACKOFF, MIN_BACKOFF, concerns_one_connection};

/// What reading a ClientHello from the bytes so far came to.
type HelloRead = Result<hello::Read, hello::Error>;

/// A test of a connection's first bytes: `Some(true)` or `Some(false)`
/// once they decide, `None` while more are needed.
type Test = Arc<dyn Fn(&[u8]) -> Option<bool> + Send + Sync>;

/// What a route takes.
#[derive(Clone)]
pub struct Matcher(Kind);

#[derive(Clone)]
enum Kind {
    Http1,
    Http2,
    Tls {
        alpn: Option<Vec<u8>>,
        server_name: Option<String>,
    },
    Smux,
    Prefix(Bytes),
    Test(Test),
    Any,
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Kind::Http1 => f.write_str("http1"),
            Kind::Http2 => f.write_str("http2"),
            Kind::Tls { alpn, server_name } => f
                .debug_struct("tls")
                .field("alpn", &alpn.as_deref().map(String::from_utf8_lossy))
                .field("server_name", server_name)
                .finish(),
            Kind::Smux => f.write_str("smux"),
            Kind::Prefix(prefix) => write!(f, "prefix({prefix:?})"),
            Kind::Test(_) => f.write_str("test"),
            Kind::Any => f.write_str("any"),
        }
    }
}

impl Matcher {
    /// An HTTP/1.x request line (`GET /path HTTP/1.1`).
    pub fn http1() -> Matcher {
        Matcher(Kind::Http1)
    }

    /// HTTP/2's client preface: h2c with prior knowledge, gRPC without TLS.
    pub fn http2() -> Matcher {
        Matcher(Kind::Http2)
    }

    /// A TLS ClientHello, any; narrowed by [`Matcher::alpn`] and
    /// [`Matcher::server_name`]. TLS is not terminated: the route gets
    /// the hello's bytes with the rest, and what it offered in
    /// [`Routed::hello`].
    pub fn tls() -> Matcher {
        Matcher(Kind::Tls {
            alpn: None,
            server_name: None,
        })
    }

    /// With [`Matcher::tls`]: only a hello that offers this protocol in
    /// ALPN (`b"h2"`, `b"http/1.1"`, `b"smux"`).
    pub fn alpn(self, protocol: &[u8]) -> Matcher {
        match self.0 {
            Kind::Tls { server_name, .. } => Matcher(Kind::Tls {
                alpn: Some(protocol.to_vec()),
                server_name,
            }),
            other => Matcher(other),
        }
    }

    /// With [`Matcher::tls`]: only a hello that names this server (SNI,
    /// compared without regard to case).
    pub fn server_name(self, name: &str) -> Matcher {
        match self.0 {
            Kind::Tls { alpn, .. } => Matcher(Kind::Tls {
                alpn,
                server_name: Some(name.to_owned()),
            }),
            other => Matcher(other),
        }
    }

    /// An smux session (versions 1 and 2): its first frame a SYN.
    pub fn smux() -> Matcher {
        Matcher(Kind::Smux)
    }

    /// Connections that start with these bytes (a protocol's magic).
    pub fn prefix(bytes: impl Into<Bytes>) -> Matcher {
        Matcher(Kind::Prefix(bytes.into()))
    }

    /// A test of the user's over the first bytes: `Some(true)` takes the
    /// connection, `Some(false)` passes it on, `None` asks for more.
    pub fn test(test: impl Fn(&[u8]) -> Option<bool> + Send + Sync + 'static) -> Matcher {
        Matcher(Kind::Test(Arc::new(test)))
    }

    /// Anything: put it last.
    pub fn any() -> Matcher {
        Matcher(Kind::Any)
    }

    /// Whether `input` (so far) is this route's. The ClientHello is
    /// read from `input` (`hello_read`), once, by the first TLS matcher that
    /// asks.
    fn decide(&self, input: &[u8], hello_read: &mut Option<HelloRead>) -> Option<bool> {
        match &self.0 {
            Kind::Http1 => matchers::http1(input),
            Kind::Http2 => matchers::http2(input),
            Kind::Smux => matchers::smux(input),
            Kind::Prefix(prefix) => matchers::prefix(input, prefix),
            Kind::Test(test) => test(input),
            Kind::Any => Some(true),
            Kind::Tls { alpn, server_name } => {
                let read = match hello_read.get_or_insert_with(|| hello::read(input)) {
                    Ok(hello::Read::Partial) => return None,
                    Ok(hello::Read::Complete(read)) => read,
                    Err(_) => return Some(false),
                };
                let alpn_ok = alpn.as_deref().is_none_or(|p| read.offers(p));
                let name_ok = server_name.as_deref().is_none_or(|name| {
                    read.server_name
                        .as_deref()
                        .is_some_and(|n| n.eq_ignore_ascii_case(name))
                });
                Some(alpn_ok && name_ok)
            }
        }
    }
}

/// A connection a route took.
#[derive(Debug)]
pub struct Routed<S> {
    /// The connection, its first bytes put back in front.
    pub stream: Sniffed<S>,
    /// The peer: the client, or with the PROXY protocol the address its
    /// header names.
    pub peer: SocketAddr,
    /// What the ClientHello offered, when a TLS matcher read one.
    pub hello: Option<ClientHello>,
}

type Serve<S> = Arc<dyn Fn(Routed<S>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// How the sniffs went, since the router was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterStats {
    /// Connections a route took.
    pub routed: u64,
    /// Refused by every route.
    pub unclaimed: u64,
    /// Closed before a route decided: nothing (or too little) came within
    /// the sniff timeout.
    pub timed_out: u64,
    /// Closed at the byte bound with a route still undecided.
    pub too_long: u64,
    /// Closed for a PROXY protocol header missing, broken, or from a
    /// source not listed.
    pub proxy_refused: u64,
    /// The peer ended or broke the connection while it was sniffed.
    pub gone: u64,
}

#[derive(Default)]
struct Counts {
    routed: AtomicU64,
    unclaimed: AtomicU64,
    timed_out: AtomicU64,
    too_long: AtomicU64,
    proxy_refused: AtomicU64,
    gone: AtomicU64,
}

impl Counts {
    /// Adds one to `count`, and with the `metrics` feature to
    /// `rapidws_route_connections_total` under its outcome.
    fn add(&self, count: Count) {
        let (counter, _outcome) = match count {
            Count::Routed => (&self.routed, "routed"),
            Count::Unclaimed => (&self.unclaimed, "unclaimed"),
            Count::TimedOut => (&self.timed_out, "timed_out"),
            Count::TooLong => (&self.too_long, "too_long"),
            Count::ProxyRefused => (&self.proxy_refused, "proxy_refused"),
            Count::Gone => (&self.gone, "gone"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("rapidws_route_connections_total", "outcome" => _outcome).increment(1);
    }
}

/// What became of a sniffed connection: one of [`RouterStats`]'s counts.
#[derive(Clone, Copy, Debug)]
enum Count {
    Routed,
    Unclaimed,
    TimedOut,
    TooLong,
    ProxyRefused,
    Gone,
}

/// Routes connections by their first bytes (see the module's doc). `S`:
/// the byte stream routed (`TcpStream` for [`Router::serve`]; any, for
/// [`Router::route`] called on a stream of one's own, a TLS stream
/// included, to route again inside it).
pub struct Router<S = TcpStream> {
    routes: Vec<(Matcher, Serve<S>)>,
    sniff_timeout: Duration,
    max_sniff_bytes: usize,
    proxy_protocol: Option<ProxyProtocol>,
    counts: Counts,
}

impl<S> std::fmt::Debug for Router<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let matchers: Vec<_> = self.routes.iter().map(|(m, _)| m).collect();
        f.debug_struct("Router")
            .field("routes", &matchers)
            .field("sniff_timeout", &self.sniff_timeout)
            .field("max_sniff_bytes", &self.max_sniff_bytes)
            .finish()
    }
}

impl<S> Default for Router<S> {
    fn default() -> Self {
        Router {
            routes: Vec::new(),
            sniff_timeout: Duration::from_secs(5),
            max_sniff_bytes: hello::MAX_INPUT,
            proxy_protocol: None,
            counts: Counts::default(),
        }
    }
}

impl<S> Router<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// A router with no routes: 5 s and 32 KiB to decide.
    pub fn new() -> Router<S> {
        Router::default()
    }

    /// Adds a route: connections `matcher` takes go to `serve`, which owns
    /// them from then on (spawned by [`Router::serve`], awaited by
    /// [`Router::route`]).
    pub fn route_to<F, Fut>(mut self, matcher: Matcher, serve: F) -> Router<S>
    where
        F: Fn(Routed<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.routes
            .push((matcher, Arc::new(move |routed| Box::pin(serve(routed)))));
        self
    }

    /// How long a connection may take to send enough to decide (default
    /// 5 s), the PROXY header included.
    pub fn sniff_timeout(mut self, timeout: Duration) -> Router<S> {
        self.sniff_timeout = timeout;
        self
    }

    /// How many bytes are read at most to decide (default 32 KiB: a
    /// ClientHello cut in small records fits).
    pub fn max_sniff_bytes(mut self, bytes: usize) -> Router<S> {
        self.max_sniff_bytes = bytes.max(1);
        self
    }

    /// Every connection starts with a PROXY protocol header (see
    /// [`ProxyProtocol`]): read before the sniff, its address is the
    /// [`Routed::peer`]; without a valid one, the connection is closed.
    pub fn proxy_protocol(mut self, protocol: ProxyProtocol) -> Router<S> {
        self.proxy_protocol = Some(protocol);
        self
    }

    /// How the sniffs went so far. (With the `metrics` feature, the same
    /// counts of every router go to `rapidws_route_connections_total`,
    /// labelled `outcome`.)
    pub fn stats(&self) -> RouterStats {
        let c = &self.counts;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        RouterStats {
            routed: get(&c.routed),
            unclaimed: get(&c.unclaimed),
            timed_out: get(&c.timed_out),
            too_long: get(&c.too_long),
            proxy_refused: get(&c.proxy_refused),
            gone: get(&c.gone),
        }
    }

    /// Sniffs `stream` (from `peer`) and serves it by the route that takes
    /// it, until that route's future ends; a connection no route takes is
    /// dropped (closed) here.
    pub async fn route(&self, mut stream: S, mut peer: SocketAddr) {
        let sniff = self.sniff(&mut stream, &mut peer);
        let outcome = tokio::time::timeout(self.sniff_timeout, sniff).await;
        let counts = &self.counts;
        let (index, prefix, hello) = match outcome {
            Ok(Ok(chosen)) => chosen,
            Ok(Err(count)) => {
                counts.add(count);
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "no route decided within the sniff timeout; closed");
                counts.add(Count::TimedOut);
                return;
            }
        };
        counts.add(Count::Routed);
        let routed = Routed {
            stream: Sniffed::new(prefix, stream),
            peer,
            hello,
        };
        (self.routes[index].1)(routed).await;
    }

    /// Reads until a route takes the connection: its index, the bytes read
    /// (the PROXY header's not among them), and the hello, if read; or the
    /// count to add to.
    async fn sniff(
        &self,
        stream: &mut S,
        peer: &mut SocketAddr,
    ) -> Result<(usize, BytesMut, Option<ClientHello>), Count> {
        let mut input = BytesMut::with_capacity(512);
        let mut header = self.proxy_protocol.is_some();
        if let Some(protocol) = &self.proxy_protocol
            && !protocol.admits(peer.ip())
        {
            tracing::debug!(%peer, "not a listed PROXY protocol source; closed");
            return Err(Count::ProxyRefused);
        }
        loop {
            if header {
                match read_header(&mut input, peer) {
                    Header::Waiting => {}
                    Header::Read => header = false,
                    Header::Refused(why) => {
                        tracing::debug!(%peer, why, "closed");
                        return Err(Count::ProxyRefused);
                    }
                }
            }
            if !header {
                let mut hello = None;
                let mut undecided = false;
                for (index, (matcher, _)) in self.routes.iter().enumerate() {
                    match matcher.decide(&input, &mut hello) {
                        Some(true) => {
                            let hello = match hello {
                                Some(Ok(hello::Read::Complete(read))) => Some(read),
                                _ => None,
                            };
                            return Ok((index, input, hello));
                        }
                        Some(false) => {}
                        None => {
                            undecided = true;
                            break;
                        }
                    }
                }
                if !undecided {
                    tracing::debug!(%peer, "no route takes the connection; closed");
                    return Err(Count::Unclaimed);
                }
            }
            if input.len() >= self.max_sniff_bytes {
                tracing::debug!(%peer, "no route decided within the byte bound; closed");
                return Err(Count::TooLong);
            }
            let want = (self.max_sniff_bytes - input.len()).min(4096);
            input.reserve(want);
            let mut limited = (&mut *stream).take(want as u64);
            match limited.read_buf(&mut input).await {
                Ok(0) | Err(_) => return Err(Count::Gone),
                Ok(_) => {}
            }
        }
    }
}

impl Router<TcpStream> {
    /// Accepts connections on `listener` and routes each in a task of its
    /// own, until the listener fails for good. Accept errors that concern
    /// one connection are skipped; running out of descriptors pauses
    /// accepting a moment.
    pub async fn serve(self, listener: TcpListener) -> io::Result<()> {
        let router = Arc::new(self);
        let mut backoff = MIN_BACKOFF;
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff = MIN_BACKOFF;
                    let _ = stream.set_nodelay(true);
                    let router = router.clone();
                    tokio::spawn(async move { router.route(stream, peer).await });
                }
                Err(error) if concerns_one_connection(&error) => {
                    tracing::debug!(%error, "accept failed for one connection");
                }
                Err(error) => {
                    // Out of descriptors or memory: a pause, growing.
                    tracing::warn!(%error, ?backoff, "accept failed; pausing");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
