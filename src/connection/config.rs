//! Server configuration: limits, timeouts and buffer sizes, with defaults that
//! suit a public server.

use std::time::Duration;

use crate::connection::origin::Origins;
use crate::connection::proxied::{Network, ProxyProtocol};
use crate::proto::deflate::DeflateConfig;
use crate::proto::{CloseCode, Limits};

/// Settings shared by every connection of a server.
///
/// ```
/// use std::time::Duration;
/// let config = rapidws::Config::default()
///     .max_message_size(1 << 20)
///     .handshake_timeout(Duration::from_secs(5));
/// assert_eq!(config.limits().max_message_size, 1 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) limits: Limits,
    pub(crate) max_handshake_size: usize,
    pub(crate) max_http_body_size: usize,
    pub(crate) handshake_timeout: Duration,
    pub(crate) close_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_outbound_bytes: usize,
    pub(crate) max_unsent_bytes: Option<u32>,
    pub(crate) slow_consumer: SlowConsumer,
    pub(crate) read_buffer_size: usize,
    pub(crate) deflate: Option<DeflateConfig>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) ping_interval: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) origins: Origins,
    pub(crate) proxy_protocol: Option<ProxyProtocol>,
    pub(crate) trusted_proxies: Vec<Network>,
}

/// What happens when a connection's outbound queue reaches
/// [`Config::max_outbound_bytes`]: its peer reads more slowly than the
/// server sends.
///
/// Under both policies the server's memory stays bounded: a send that finds
/// the queue full is refused with [`SendError::QueueFull`](crate::SendError)
/// and queues nothing, and a connection whose queue is full stops reading
/// from its peer until it is written down to half, so a peer that sends requests
/// but never reads the answers is slowed down by TCP itself rather than
/// buffered for. (Below the bound it keeps reading while its writes are
/// blocked, so requests are answered while pushes drain.) A producer that
/// awaits [`Conn::ready`](crate::Conn::ready) never gets here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlowConsumer {
    /// Wait for the peer (the default): the send that found the queue full
    /// is refused and the connection stays open. Sends are accepted again as
    /// soon as the queue is below its bound (as [`Conn`](crate::Conn) says),
    /// and the handler's `on_drain` is called once the queue has been
    /// written out completely: the peer has caught up. Right when the
    /// handler can skip or coalesce messages (market data, presence).
    #[default]
    Pause,
    /// Give up on the peer: the send is refused and the connection is closed
    /// with this code, usually [`CloseCode::POLICY_VIOLATION`] (1008) or
    /// [`CloseCode::TRY_AGAIN_LATER`] (1013). The close frame goes out after
    /// what is already queued; a peer that still does not read is dropped
    /// after the close timeout. Right when every message matters and a
    /// client that falls behind should reconnect and resynchronize.
    Close(CloseCode),
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            max_handshake_size: 8 * 1024,
            max_http_body_size: 64 * 1024,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            max_outbound_bytes: 4 << 20,
            max_unsent_bytes: None,
            slow_consumer: SlowConsumer::Pause,
            read_buffer_size: 16 * 1024,
            deflate: None,
            max_connections: None,
            ping_interval: None,
            idle_timeout: None,
            origins: Origins::default(),
            proxy_protocol: None,
            trusted_proxies: Vec::new(),
        }
    }
}

impl Config {
    /// The largest frame payload accepted (default 16 MiB). A frame whose header
    /// announces more fails the connection with 1009 before its payload is read.
    pub fn max_frame_size(mut self, bytes: usize) -> Self {
        self.limits.max_frame_size = bytes;
        self
    }

    /// The largest message accepted, over all its fragments (default 16 MiB);
    /// exceeding it fails the connection with 1009.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.limits.max_message_size = bytes;
        self
    }

    /// The largest HTTP upgrade request head (default 8 KiB); larger gets 431.
    pub fn max_handshake_size(mut self, bytes: usize) -> Self {
        self.max_handshake_size = bytes;
        self
    }

    /// The largest body of a plain HTTP request the handler answers
    /// (`ServerHandler::on_http`; default 64 KiB). The body is read whole, within
    /// the handshake timeout, before the handler is asked; a
    /// `Content-Length` over this gets 413 without reading it, and a body
    /// without a `Content-Length` (chunked) gets 411.
    pub fn max_http_body_size(mut self, bytes: usize) -> Self {
        self.max_http_body_size = bytes;
        self
    }

    /// How long a client has to send its complete upgrade request (default 10 s);
    /// after that it gets 408 and is disconnected.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// How long the server waits for the peer's close frame after sending its
    /// own, and for the peer to end TCP after the handshake (default 5 s).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// How long a graceful shutdown waits for connections to close after they
    /// were sent 1001 (default 10 s); the rest are then dropped.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The soft bound on bytes queued for one connection (default 4 MiB). A send
    /// is refused with `SendError::QueueFull` once this many bytes wait, so the
    /// queue never exceeds the bound by more than one message. What else
    /// happens then is [`Config::slow_consumer`]'s policy. Reading pauses at
    /// the bound and resumes at half; producers waiting in `Conn::ready` wait
    /// from half and are woken at a quarter; replies have a bound of their
    /// own of the same size. See `Conn`.
    pub fn max_outbound_bytes(mut self, bytes: usize) -> Self {
        self.max_outbound_bytes = bytes;
        self
    }

    /// The most bytes of a connection's output its kernel socket may hold
    /// not yet sent (default `None`: the kernel's own bound, its whole send
    /// buffer, up to 4 MiB on a stock Linux). Linux only
    /// (`TCP_NOTSENT_LOWAT`, set on every TCP connection a socket server
    /// accepts or takes over in a handoff); elsewhere it does nothing.
    /// `Some(0)` is the same as `None`.
    ///
    /// What the kernel holds has left the outbound queue, so a reply
    /// ([`Conn::reply`](crate::Conn::reply)) cannot overtake it. When a peer
    /// reads more slowly than the server pushes, a reply waits behind these
    /// bytes, the rest of the message being written, and what already sits
    /// in the peer's own receive buffer. Set it on a server that pushes bulk
    /// and answers requests on the same connection: against a client
    /// reading 1 MiB pushes at about 400 MB/s, 512 KiB cut the server's
    /// share of what waited ahead of each reply from 3.5 MB to 0.6 MB, and
    /// the request p99 from 28 to 19 ms (docs/connection.md, "Replies under
    /// push"). The price is more, smaller writes: at 2 GB/s of pushes to
    /// one fast client, about 40% more server CPU (128 KiB: far more). A
    /// server that does not answer requests behind bulk pushes gains
    /// nothing from it. Hyper's and axum's upgrades over plain TCP get it
    /// (they join the tokio groups); those the stream driver serves (TLS
    /// through hyper or axum, your own streams) are the caller's sockets:
    /// set the option on them yourself.
    pub fn max_unsent_bytes(mut self, bytes: impl Into<Option<u32>>) -> Self {
        self.max_unsent_bytes = bytes.into().filter(|&bytes| bytes > 0);
        self
    }

    /// What to do with a connection whose outbound queue is full (default
    /// [`SlowConsumer::Pause`]).
    ///
    /// # Panics
    /// If the policy closes with a code that may not be sent (see
    /// [`CloseCode::is_sendable`]).
    pub fn slow_consumer(mut self, policy: SlowConsumer) -> Self {
        if let SlowConsumer::Close(code) = policy {
            assert!(
                code.is_sendable(),
                "{code} may not be sent in a close frame"
            );
        }
        self.slow_consumer = policy;
        self
    }

    /// The most WebSocket connections served at once (default: no limit
    /// but the process's file descriptors). An upgrade request above it is
    /// answered `503 Service Unavailable` before the upgrade hook sees it.
    /// Connections still in the handshake do not count: the handshake
    /// timeout bounds them. The count is checked as each request arrives, so
    /// upgrades completing at the same instant on different threads may pass
    /// the limit by one each.
    pub fn max_connections(mut self, limit: impl Into<Option<usize>>) -> Self {
        self.max_connections = limit.into();
        self
    }

    /// Pings a connection whose peer has sent nothing for this long, and
    /// again at the same interval while it stays quiet (default: off). Any
    /// bytes from the peer, its pong included, count as activity, and so
    /// does room it makes by reading when our writes were blocked (a peer
    /// reading a long queue is alive). A ping
    /// is skipped while the outbound queue is full. Useful to keep NAT and
    /// proxy mappings alive, and with [`Config::idle_timeout`] to find peers
    /// that are gone without a word.
    pub fn ping_interval(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.ping_interval = interval.into().filter(|d| !d.is_zero());
        self
    }

    /// Closes a connection (1001, "idle timeout") whose peer has sent
    /// nothing for this long (default: off). With [`Config::ping_interval`]
    /// set shorter, a live peer answers the pings and is never idle, so only
    /// dead or stuck peers are closed. If the peer does not answer the close
    /// either, it is dropped after the close timeout.
    ///
    /// Both timers are checked by a sweep every quarter of the shorter one
    /// (at least every 10 ms), so they fire up to a quarter late, never
    /// early.
    pub fn idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.idle_timeout = timeout.into().filter(|d| !d.is_zero());
        self
    }

    /// Lets web pages from these origins open WebSockets here, beside the
    /// pages of the host a request is sent to: each as a browser writes it
    /// in `Origin`, `scheme://host[:port]` (`https://app.example`,
    /// `http://localhost:3000`), compared without regard to case. Calls add
    /// up.
    ///
    /// By default an upgrade from a browser page of another host is refused
    /// with 403 (cross-site WebSocket hijacking: a browser lets any page open
    /// a WebSocket to any server, with that server's cookies). The rule is
    /// gorilla/websocket's: a request without `Origin` (not from a browser)
    /// is let in; one with `Origin` only if the origin's host and port are
    /// the request's `Host` (over HTTP/2, its `:authority`). It holds on every
    /// driver, upgrades through hyper and axum included.
    pub fn allow_origins<I>(mut self, origins: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.origins = self.origins.with(origins.into_iter().map(Into::into));
        self
    }

    /// Lets a page of any origin open a WebSocket here (see
    /// [`Config::allow_origins`]): for a public hub that authenticates
    /// each connection by something a page of another site cannot send on
    /// its behalf (a token in the URL or the first message), never by a
    /// cookie.
    pub fn allow_any_origin(mut self) -> Self {
        self.origins = Origins::Any;
        self
    }

    /// Reads a PROXY protocol header (version 1 or 2, as HAProxy's
    /// `send-proxy` and `send-proxy-v2` and AWS's NLB send it) at the
    /// start of every connection of the tokio and io_uring servers (with
    /// TLS, before the TLS handshake, not a byte past it):
    /// the client's address it names becomes the connection's
    /// ([`Conn::peer_addr`](crate::Conn::peer_addr)). Then the header is
    /// required: a connection without a valid one is closed without an
    /// answer (see [`ProxyProtocol`]). Its wait counts against
    /// `handshake_timeout`. `None` (the default) reads none.
    ///
    /// On the socket servers' own listeners only: the stream driver, hyper
    /// and axum never read one, and a connection that comes through an
    /// `Entrance` had its header read by the router.
    pub fn proxy_protocol(mut self, protocol: impl Into<Option<ProxyProtocol>>) -> Self {
        self.proxy_protocol = protocol.into();
        self
    }

    /// Trusts `Forwarded` (RFC 7239), or else `X-Forwarded-For` and
    /// `X-Forwarded-Host`, on requests whose connection comes from these
    /// networks (the reverse proxies': nginx, a load balancer in HTTP
    /// mode): the client's address they name becomes the connection's
    /// ([`Conn::peer_addr`](crate::Conn::peer_addr); port 0 when the
    /// header gives none), and the host the client sent is the one the
    /// `Origin` check compares with. Calls add up; none by default.
    ///
    /// The chain is read from its right end, the nearest proxy's own
    /// observation, past every further trusted proxy; the first address
    /// that is not one is the client's, so what a client writes in these
    /// headers itself is never believed. From any other peer the headers
    /// are not read. A trusted proxy's header that does not read is
    /// answered 400. On the socket servers and the stream driver; hyper
    /// and axum upgrades do not read them.
    pub fn trust_proxies(mut self, networks: impl IntoIterator<Item = Network>) -> Self {
        self.trusted_proxies.extend(networks);
        self
    }

    /// The size of the pooled buffer a connection reads into (default 16 KiB,
    /// minimum 512).
    pub fn read_buffer_size(mut self, bytes: usize) -> Self {
        self.read_buffer_size = bytes.max(512);
        self
    }

    /// Offers permessage-deflate (RFC 7692) with these settings to clients
    /// that ask for it; `None` turns it off, which is the default. The message
    /// size limit applies to the inflated size. See [`DeflateConfig`] for what
    /// each setting costs. (With the `deflate` feature, on by default.)
    #[cfg(feature = "deflate")]
    pub fn permessage_deflate(mut self, deflate: impl Into<Option<DeflateConfig>>) -> Self {
        self.deflate = deflate.into();
        self
    }

    /// The protocol limits this configuration sets (message and frame sizes).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The permessage-deflate settings, if it is on.
    pub fn deflate(&self) -> Option<&DeflateConfig> {
        self.deflate.as_ref()
    }
}
