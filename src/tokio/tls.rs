//! wss on the tokio server: a TLS handshake (rustls, through
//! `stream::tls`) in front of the stream driver. The handshake timeout covers the TLS
//! handshake and the upgrade request together, counted from the accept; a
//! peer that sends plain HTTP, garbage, or nothing gets its connection closed
//! and a log line (at debug level: a public port sees scanners all day).
//!
//! With `Server::also_plain`, the first byte decides: 0x16 starts a TLS
//! handshake record, anything else is taken for a plain HTTP request and
//! the connection goes to a connection group, as on a server without TLS.
//!
//! With `Config::proxy_protocol`, the PROXY header comes first, before
//! either: it is read here, not a byte past it, so that rustls (or the
//! group) reads on from the socket where the header ended.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use crate::connection::handler::Handler;
use crate::connection::hub::{Hub, LiveGuard, deadline_from};
use crate::connection::lifecycle::Env;
use crate::connection::proxied::{Header, read_header};
use crate::stream::tls::TlsStream;
use crate::stream::{self, Start};
use crate::tokio::group::{GroupShared, Incoming};

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// Serves one accepted TCP connection as wss.
///
/// The TLS handshake runs in a future of its own, boxed and freed once it
/// is over: the task keeps room for its largest state for its whole life,
/// and an idle connection should not pay for the handshake's (see
/// `stream::connection::serve`).
pub(crate) async fn serve<H: Handler>(accepted: Box<Accepted<H>>) {
    let Some(serving) = Box::pin(handshake(accepted)).await else {
        return;
    };
    serving.await;
}

/// An accepted connection, before its handshake (boxed by the accept loop:
/// the task holds only the pointer).
pub(crate) struct Accepted<H: Handler> {
    pub(crate) config: Arc<rustls::ServerConfig>,
    pub(crate) tcp: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) live: LiveGuard,
    pub(crate) env: Env<H>,
    /// With `Server::also_plain`: the group a plain connection goes to.
    pub(crate) plain: Option<Arc<GroupShared<H::State>>>,
}

/// The TLS handshake (or, with `Server::also_plain`, the hand-over of a
/// plain connection): the connection's serving future once it is done,
/// `None` if the connection is over or handed over.
async fn handshake<H: Handler>(accepted: Box<Accepted<H>>) -> Option<impl Future<Output = ()>> {
    let Accepted {
        config,
        tcp,
        peer,
        live,
        env,
        plain,
    } = *accepted;
    let started = Instant::now();
    let mut peer = peer;
    let mut tcp = match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => tcp,
        Err(error) => {
            tracing::debug!(%peer, %error, "could not watch a new connection; dropped");
            return None;
        }
    };
    let deadline = deadline_from(started, env.hub.config.handshake_timeout);
    if let Some(protocol) = &env.hub.config.proxy_protocol {
        let meters = env.hub.meters();
        if !protocol.admits(peer.ip()) {
            tracing::debug!(%peer, "not a listed PROXY protocol source; connection closed");
            meters.rejected("proxy_source");
            return None;
        }
        match in_time(&env.hub, deadline, read_proxy_header(&mut tcp, &mut peer)).await? {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                tracing::debug!(%peer, why, "connection closed");
                meters.rejected("proxy_header");
                return None;
            }
            // Closed quietly, as the plain path closes a late header.
            Err(_) => {
                tracing::debug!(%peer, "no PROXY header within the handshake timeout; connection closed");
                return None;
            }
        }
    }
    if let Some(group) = plain {
        let mut first = [0u8; 1];
        let peeked = in_time(&env.hub, deadline, tcp.peek(&mut first)).await?;
        match peeked {
            Ok(Ok(1..)) if first[0] == TLS_HANDSHAKE => {}
            Ok(Ok(1..)) => {
                // Plain ws: a group serves it, from the request on.
                match tcp.into_std() {
                    Ok(stream) => group.hand_over(Incoming {
                        stream: mio::net::TcpStream::from_std(stream),
                        peer,
                        live,
                        // (Its PROXY header, if any, was read above.)
                        start: crate::tokio::group::Start::Accepted {
                            proxy_header: false,
                        },
                    }),
                    Err(error) => {
                        tracing::debug!(%peer, %error, "could not hand a plain connection over");
                    }
                }
                return None;
            }
            Ok(Ok(_)) => return None,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "reading the first byte failed; connection closed");
                return None;
            }
            Err(_) => {
                tracing::debug!(%peer, "nothing sent within the handshake timeout; connection closed");
                return None;
            }
        }
    }
    let handshake = in_time(
        &env.hub,
        deadline,
        TlsStream::accept(config, tcp, env.hub.pool.clone()),
    )
    .await?;
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed; connection closed");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out; connection closed");
            return None;
        }
    };
    let start = Start::Request {
        prefix: BytesMut::new(),
    };
    Some(stream::serve(tls, peer, start, live, env, started))
}

/// Reads a PROXY protocol header off `tcp` without reading a byte past it
/// (the TLS handshake follows, read by rustls from the socket): `peer`
/// becomes the address it names. Bounded by the header's own bounds.
async fn read_proxy_header(
    tcp: &mut tokio::net::TcpStream,
    peer: &mut SocketAddr,
) -> Result<(), &'static str> {
    use rapidws_core::sniff::proxy::V2_SIGNATURE;

    let mut header = BytesMut::new();
    let mut chunk = [0u8; 512];
    loop {
        // As much as cannot be past the header's end: the shortest header,
        // `PROXY UNKNOWN\r\n`, is 15 bytes; version 2's fixed part (16)
        // ends with the length of the rest; version 1 ends at its line's
        // end, so past 15 bytes it comes a byte at a time (at most 107).
        let want = match header.get(..16) {
            Some(fixed) if fixed[..12] == V2_SIGNATURE => {
                16 + usize::from(u16::from_be_bytes([fixed[14], fixed[15]]))
            }
            _ => (header.len() + 1).max(15),
        };
        let room = want.saturating_sub(header.len()).min(chunk.len());
        if tcp.readable().await.is_err() {
            return Err("reading the PROXY header failed");
        }
        match tcp.try_read(&mut chunk[..room]) {
            Ok(0) => return Err("the connection ended before its PROXY header"),
            Ok(n) => header.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return Err("reading the PROXY header failed"),
        }
        // Each read is looked at: what cannot start a header is refused
        // at once.
        match read_header(&mut header, peer) {
            Header::Read => return Ok(()),
            Header::Refused(why) => return Err(why),
            Header::Waiting => {}
        }
    }
}

/// `work` bounded by the handshake's `deadline` (`Err` once it passed), or
/// `None` if the server aborts first. A shutdown gives the handshake its
/// time (the upgrade then gets 503); an abort does not.
async fn in_time<T>(
    hub: &Hub,
    deadline: Instant,
    work: impl Future<Output = T>,
) -> Option<Result<T, tokio::time::error::Elapsed>> {
    let work = tokio::time::timeout_at(deadline.into(), work);
    tokio::select! {
        biased;
        () = hub.abort_requested() => None,
        done = work => Some(done),
    }
}
