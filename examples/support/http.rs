//! An axum app served on hyper over TCP or TLS, HTTP/1.1 and HTTP/2, with
//! the limits the standalone servers have (axum_echo, h3_echo).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;

/// How long a client has to send a request's head (as the standalone
/// servers' `handshake_timeout`): a slowloris client is cut off after it.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of a request head hyper buffers (HTTP/1.1; its minimum is
/// 8 KiB) or takes as headers (HTTP/2): larger gets 431. An upgrade's head
/// is held to the server's `max_handshake_size` (8 KiB) by the extractor.
const MAX_HEAD: usize = 64 * 1024;

/// The app on hyper, one task per connection, over TCP or rustls.
/// `axum::serve` would do for plain TCP, but it gives no way to set a
/// header timeout or a head limit: behind it a client may hold a
/// connection open forever by sending its headers a byte at a time. Ctrl-C
/// or SIGTERM stops accepting (the listener closes) and says which came.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
) -> super::Stop {
    let shutdown = super::stop_signal();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, for example: wait, go on.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            stop = &mut shutdown => return stop,
        };
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let (tls, app) = (tls.clone(), app.clone());
        tokio::spawn(async move {
            let Some(acceptor) = tls else {
                return serve_connection(tcp, peer, app).await;
            };
            match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => serve_connection(tls, peer, app).await,
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// One connection: HTTP/1.1 or HTTP/2 (by ALPN over TLS, by its preface in
/// plain), upgrades included, with the head bounded in time and size.
async fn serve_connection<I>(io: I, peer: SocketAddr, app: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::Service;
    let service = hyper::service::service_fn(move |mut request| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().call(request)
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD as u32)
        // WebSockets over HTTP/2 (RFC 8441 extended CONNECT).
        .enable_connect_protocol();
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(error) = connection.await {
        tracing::debug!(%peer, %error, "connection failed");
    }
}
