//! wss on the tokio server: a TLS handshake (rustls, through tokio-rustls)
//! in front of the stream driver. The handshake timeout covers the TLS
//! handshake and the upgrade request together, counted from the accept; a
//! peer that sends plain HTTP, garbage, or nothing gets its connection closed
//! and a log line (at debug level: a public port sees scanners all day).

use std::net::SocketAddr;
use std::time::Instant;

use bytes::BytesMut;
use tokio_rustls::TlsAcceptor;

use crate::handler::Handler;
use crate::lifecycle::Env;
use crate::server::{LiveGuard, deadline_from};
use crate::stream::{self, Start};

/// Serves one accepted TCP connection as wss.
pub(crate) async fn serve<H: Handler>(
    acceptor: TlsAcceptor,
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    live: LiveGuard,
    env: Env<H>,
) {
    let started = Instant::now();
    let tcp = match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => tcp,
        Err(error) => {
            tracing::debug!(%peer, %error, "could not watch a new connection; dropped");
            return;
        }
    };
    let deadline = deadline_from(started, env.core.config.handshake_timeout);
    let handshake = tokio::time::timeout_at(deadline.into(), acceptor.accept(tcp));
    let tls = tokio::select! {
        biased;
        // A shutdown gives the handshake its time (the upgrade then gets
        // 503); an abort does not.
        () = env.core.abort_requested() => return,
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed; connection closed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out; connection closed");
                return;
            }
        },
    };
    let start = Start::Request {
        prefix: BytesMut::new(),
    };
    stream::serve(tls, peer, start, live, env, started).await;
}
