//! wss on the tokio server: a TLS handshake (rustls, through
//! `stream::tls`) in front of the stream driver. The handshake timeout covers the TLS
//! handshake and the upgrade request together, counted from the accept; a
//! peer that sends plain HTTP, garbage, or nothing gets its connection closed
//! and a log line (at debug level: a public port sees scanners all day).
//!
//! With `Server::also_plain`, the first byte decides: 0x16 starts a TLS
//! handshake record, anything else is taken for a plain HTTP request and
//! the connection goes to a connection group, as on a server without TLS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use crate::connection::handler::Handler;
use crate::connection::hub::{Hub, LiveGuard, deadline_from};
use crate::connection::lifecycle::Env;
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
    let tcp = match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => tcp,
        Err(error) => {
            tracing::debug!(%peer, %error, "could not watch a new connection; dropped");
            return None;
        }
    };
    let deadline = deadline_from(started, env.hub.config.handshake_timeout);
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
                        // (No PROXY header: a server with TLS does not
                        // start with the PROXY protocol.)
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
