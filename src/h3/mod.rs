//! WebSockets over HTTP/3 (RFC 9220), on quinn (feature `http3`).
//!
//! A QUIC endpoint whose request streams open WebSockets with an extended
//! CONNECT (`:protocol` websocket), served by the [`stream`](crate::stream)
//! driver with the same [`Handler`](crate::Handler), upgrade hook, limits,
//! permessage-deflate and shutdown as every other driver; a bad request
//! gets the same answers as over HTTP/2 (400, 426, the hook's own). The
//! HTTP/3 framing and QPACK are rapidws-core's `h3`, sans-I/O and fuzzed;
//! QUIC is quinn's. [`serve_with`] also gives WebTransport sessions to a
//! [`WebTransport`] handler. The TLS configuration is the caller's, as for
//! wss (its crypto provider too); its ALPN is set to `h3` if it names none.
//! `docs/http3.md` in the repository has the design.
//!
//! ```no_run
//! # async fn run(tls: rustls::ServerConfig) -> std::io::Result<()> {
//! use rapidws::{Accept, Config, Conn, Handler, Message, Reject, Request, ServerHandler};
//!
//! struct Echo;
//!
//! impl Handler for Echo {
//!     type State = ();
//!     fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
//!         let _ = conn.send(message);
//!     }
//! }
//! impl ServerHandler for Echo {
//!     fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
//!         Ok(())
//!     }
//! }
//!
//! let server = rapidws::stream::Server::new(Echo, Config::default());
//! let addr = "127.0.0.1:9443".parse().unwrap();
//! let endpoint = rapidws::h3::endpoint(addr, tls, &rapidws::h3::QuicConfig::default())?;
//! rapidws::h3::serve(endpoint, &server).await;
//! # Ok(())
//! # }
//! ```
//!
//! | file | what |
//! |---|---|
//! | `budget` | what sessions hold of their peers' streams read whole: [`StreamBudget`], [`WebTransportSession::read_to_end`] |
//! | `client` | the client side: [`Client`] opens WebSockets on an HTTP/3 connection |
//! | `connection` | a QUIC connection: the control streams, QPACK's streams read and discarded, a task per request |
//! | `request` | a request stream: its head read, checked, answered; the WebSocket served |
//! | `session` | a WebTransport [`WebTransportSession`] as its handler holds it, and the table that sends the peer's streams and datagrams to theirs |
//! | `webtransport` | a session's CONNECT stream: answered, its handler run, its capsules read, its close said |
//! | `wire` | reading frames off a quinn stream; the error codes and closes the others share |
//! | `data` | a request stream's DATA frames as a byte stream ([`DataStream`]) |

mod budget;
mod client;
mod connection;
mod data;
mod request;
mod session;
mod webtransport;
mod wire;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rapidws_core::h3::{Settings, varint};

use crate::connection::handler::ServerHandler;

pub use budget::{DEFAULT_PER_CONNECTION, DEFAULT_TOTAL, ReadToEndError, StreamBudget, Whole};
pub use client::{Client, Response};
pub use data::DataStream;
/// The QUIC implementation, re-exported: endpoints and connections are
/// quinn's, of the version this crate is built with.
pub use quinn;
pub use rapidws_core::h3::RequestHead;
#[cfg(feature = "pubsub")]
pub(crate) use session::Link;
pub use session::{
    Closed, DatagramError, WebTransport, WebTransportSession, application_code, error_code,
};

/// QUIC's settings that matter to a WebSocket server. The defaults keep an
/// idle connection small and a busy one fast on a LAN or the internet.
#[derive(Clone, Debug)]
pub struct QuicConfig {
    /// A connection silent this long is closed (QUIC's idle timeout; the
    /// WebSocket's own keepalive pings, `Config::keepalive`, keep a live
    /// one from reaching it). Default 30 s.
    pub idle_timeout: Duration,
    /// Bytes a peer may send on one stream ahead of what was read (each
    /// WebSocket is a stream). Default 256 KiB.
    pub stream_window: u32,
    /// Bytes a peer may send on the whole connection ahead of what was
    /// read. Default 1 MiB.
    pub connection_window: u32,
    /// Requests (WebSockets, WebTransport sessions) open at once on one
    /// connection; the peer's unidirectional streams may be this many more
    /// than HTTP/3's own three. A connection that opens a WebTransport
    /// session gets the session's own credit from then on
    /// ([`WebTransport::max_streams`], 100 each way by default). Default
    /// 16: quinn keeps state
    /// for every stream it allows, about 48 bytes per bidirectional and 33
    /// per unidirectional stream of each idle connection (measured: 100
    /// and 103 instead of 10 and 8 made an idle connection 7.3 KiB larger,
    /// 45 KiB in all), and a browser opens one WebSocket per connection.
    pub max_streams: u32,
    /// Whether a client may move to another address and keep its
    /// connection (a phone from Wi-Fi to mobile data). Default on.
    pub migration: bool,
    /// How long a peer may hold an acknowledgement back, asked of peers
    /// that take QUIC's ACK frequency extension (draft-ietf-quic-ack-frequency;
    /// quinn's clients do, `Client::http3()` among them); `None` leaves
    /// each peer its own (25 ms by default). Why it matters: a packet lost
    /// at a stream's tail is resent after the probe timeout, which is the
    /// round trip plus this delay, and until then the WebSocket's stream
    /// stalls, pushes and replies alike. Measured on a 3% lossy path with
    /// a round trip of tens of microseconds (`benches/harness/lossy.sh`):
    /// request p99 15.9 ms with the peer's 25 ms, 5.6 ms with 5 ms, 2.7 ms
    /// with 1 ms. Acknowledgements come sooner, not more often (a peer
    /// still acknowledges every second packet at most). quinn asks for no
    /// less than the peer's own minimum (1 ms for quinn) and no more than
    /// the round trip or 25 ms, whichever is longer. Default 1 ms; under
    /// 16,384 ms (QUIC's limit).
    pub max_ack_delay: Option<Duration>,
    /// Whether to probe the path for packets larger than QUIC's 1,200
    /// bytes (up to 1,452; fewer packets for large messages). Off saves
    /// about 1.8 KiB per idle connection (measured: 28.4 against 30.2 KiB
    /// of quinn's own state, `quic-hold` in the load harness), for a
    /// server that holds many connections with small messages. Default on.
    pub mtu_discovery: bool,
    /// Bytes the UDP socket's receive and send buffers may hold
    /// (`SO_RCVBUF`, `SO_SNDBUF`). One socket carries every connection, so
    /// bursts from many clients meet in it, and a datagram that finds the
    /// buffer full is lost and must be resent: with 208 KiB (Linux's usual
    /// default), 100 connections echoing 1 KiB messages lost about 4,000
    /// datagrams a second on loopback; with 4 MiB, none. The kernel caps
    /// the size at `net.core.rmem_max` / `wmem_max`, which many systems
    /// leave at 208 KiB: raise them (`sysctl -w net.core.rmem_max=4194304
    /// net.core.wmem_max=4194304`) for this to take effect; when the
    /// kernel caps it, a warning says so. Default 4 MiB.
    pub udp_buffer: usize,
}

impl Default for QuicConfig {
    fn default() -> QuicConfig {
        QuicConfig {
            idle_timeout: Duration::from_secs(30),
            stream_window: 256 * 1024,
            connection_window: 1024 * 1024,
            max_streams: 16,
            migration: true,
            max_ack_delay: Some(DEFAULT_MAX_ACK_DELAY),
            mtu_discovery: true,
            udp_buffer: 4 * 1024 * 1024,
        }
    }
}

/// [`WebTransport::max_streams`]'s default: the stream credit a session's
/// peer gets each way, Chromium's own default.
pub const DEFAULT_SESSION_STREAMS: u32 = 100;

/// [`QuicConfig::max_ack_delay`]'s default, also asked by the client.
pub(crate) const DEFAULT_MAX_ACK_DELAY: Duration = Duration::from_millis(1);

/// The ACK frequency extension, asking the peer to acknowledge within
/// `delay` (otherwise quinn's defaults: at least every second
/// ack-eliciting packet, at once when packets come two or more out of
/// order). Refuses a delay QUIC cannot carry.
pub(crate) fn ack_frequency(delay: Duration) -> io::Result<quinn::AckFrequencyConfig> {
    // The transport parameter is in milliseconds, under 2^14.
    if delay >= Duration::from_millis(1 << 14) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("max_ack_delay {delay:?} is over QUIC's limit, 16,383 ms"),
        ));
    }
    let mut config = quinn::AckFrequencyConfig::default();
    config.max_ack_delay(Some(delay));
    Ok(config)
}

/// A QUIC endpoint on `addr` for [`serve`], with `tls` (its ALPN set to
/// `h3` if it has none; TLS 1.3 is QUIC's). Call it on a tokio runtime.
/// Fails with `InvalidInput` for a TLS configuration QUIC cannot use or a
/// setting of `quic` QUIC cannot carry (the error says which).
pub fn endpoint(
    addr: SocketAddr,
    mut tls: rustls::ServerConfig,
    quic: &QuicConfig,
) -> io::Result<quinn::Endpoint> {
    if tls.alpn_protocols.is_empty() {
        tls.alpn_protocols = vec![b"h3".to_vec()];
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(quic.idle_timeout)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    transport
        .max_idle_timeout(Some(idle))
        .stream_receive_window(quic.stream_window.into())
        .receive_window(quic.connection_window.into())
        .max_concurrent_bidi_streams(quic.max_streams.into())
        // The peer's control stream and QPACK's two, and as many as
        // requests for a WebTransport session's.
        .max_concurrent_uni_streams((quic.max_streams.saturating_add(3)).into());
    if let Some(delay) = quic.max_ack_delay {
        transport.ack_frequency_config(Some(ack_frequency(delay)?));
    }
    if !quic.mtu_discovery {
        transport.mtu_discovery_config(None);
    }
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    config.migration(quic.migration);
    let socket = std::net::UdpSocket::bind(addr)?;
    size_buffers(&socket, quic.udp_buffer)?;
    let runtime = quinn::default_runtime().ok_or_else(|| {
        io::Error::other("no async runtime: make the endpoint on a tokio runtime")
    })?;
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(config),
        socket,
        runtime,
    )
}

/// Asks for `bytes` of receive and send buffer on `socket`, and warns if
/// the kernel gives less.
fn size_buffers(socket: &std::net::UdpSocket, bytes: usize) -> io::Result<()> {
    // Linux keeps twice what was asked (for its own bookkeeping) and
    // reports that: a buffer it did not cap reads back as `2 * bytes`.
    let reported = if cfg!(target_os = "linux") { 2 } else { 1 };
    let state = quinn::udp::UdpSocketState::new(socket.into())?;
    let receive = state
        .set_recv_buffer_size(socket.into(), bytes)
        .and_then(|()| state.recv_buffer_size(socket.into()));
    let send = state
        .set_send_buffer_size(socket.into(), bytes)
        .and_then(|()| state.send_buffer_size(socket.into()));
    for (which, sysctl, got) in [
        ("receive", "net.core.rmem_max", receive),
        ("send", "net.core.wmem_max", send),
    ] {
        match got {
            Ok(got) if got >= bytes.saturating_mul(reported) => {}
            Ok(got) => tracing::warn!(
                asked = bytes,
                got = got / reported,
                "the kernel capped the UDP {which} buffer: datagrams may be lost under load \
                 (raise {sysctl}, or lower QuicConfig::udp_buffer)"
            ),
            Err(error) => tracing::warn!(%error, "the UDP {which} buffer could not be sized"),
        }
    }
    Ok(())
}

/// The SETTINGS this server sends: extended CONNECT on, no QPACK dynamic
/// table; with WebTransport, HTTP datagrams and its sessions.
fn settings<H: ServerHandler>(server: &crate::stream::Server<H>, webtransport: bool) -> Settings {
    Settings {
        enable_connect_protocol: true,
        max_field_section_size: Some((server.config().max_handshake_size as u64).min(varint::MAX)),
        h3_datagram: webtransport,
        webtransport_max_sessions: if webtransport {
            webtransport::MAX_SESSIONS
        } else {
            0
        },
        ..Settings::default()
    }
}

/// No WebTransport: [`serve`]'s sessions are refused (a `:protocol`
/// webtransport gets 400, as any protocol other than websocket).
struct NoSessions;

impl WebTransport for NoSessions {
    async fn serve(&self, _: WebTransportSession) {}
}

/// Serves `endpoint`'s connections with `server` until the server is shut
/// down ([`Server::shutdown`](crate::stream::Server::shutdown) or its
/// handle): then no connection is accepted, each connection says GOAWAY,
/// the WebSockets get their close (1001), and the endpoint closes once
/// they are done. (A request that does not come within
/// `Config::handshake_timeout` has its stream reset with
/// `H3_REQUEST_INCOMPLETE`: HTTP/3's way of saying 408.)
pub async fn serve<H: ServerHandler>(endpoint: quinn::Endpoint, server: &crate::stream::Server<H>) {
    run(endpoint, server, None::<Arc<NoSessions>>).await;
}

/// [`serve`], and WebTransport sessions on the same endpoint: an extended
/// CONNECT with `:protocol` webtransport goes to `webtransport` (the
/// origin checked as for WebSockets first), and the sessions' streams and
/// datagrams with it. At shutdown each session is closed (code 0, "server
/// shutting down").
pub async fn serve_with<H: ServerHandler, W: WebTransport>(
    endpoint: quinn::Endpoint,
    server: &crate::stream::Server<H>,
    webtransport: W,
) {
    run(endpoint, server, Some(Arc::new(webtransport))).await;
}

async fn run<H: ServerHandler, W: WebTransport>(
    endpoint: quinn::Endpoint,
    server: &crate::stream::Server<H>,
    webtransport: Option<Arc<W>>,
) {
    let settings = settings(server, webtransport.is_some());
    // One budget for every connection's sessions, asked once.
    let webtransport = webtransport.map(|handler| {
        let budget = handler.stream_budget();
        crate::connection::budgets::watch(budget.budget(), "webtransport");
        (handler, budget)
    });
    let mut connections = tokio::task::JoinSet::new();
    let stopping = loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    connections.spawn(connection::serve(
                        server.clone(),
                        webtransport.clone(),
                        incoming,
                        settings,
                    ));
                }
                // The endpoint was closed elsewhere: its connections end,
                // the server (which may serve TCP too) goes on.
                None => break false,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = server.shutdown_requested() => break true,
        }
    };
    if !stopping {
        while connections.join_next().await.is_some() {}
        return;
    }
    // Each connection sends its GOAWAY, its WebSockets get their close,
    // their last bytes are acknowledged, and it closes; then the endpoint.
    server.shutdown().await;
    let joined = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(connection::CLOSE_WITHIN, joined).await;
    endpoint.close(
        wire::code_of(rapidws_core::h3::code::NO_ERROR),
        b"server shutting down",
    );
    let _ = tokio::time::timeout(connection::CLOSE_WITHIN, endpoint.wait_idle()).await;
}
