//! What the baseline servers share: the command line every server of the
//! harness accepts, and an accept loop. Each binary in `src/bin/` is one library
//! used the way its documentation shows, with its defaults.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};

/// The command line of every harness server (the Go ones take the same flags).
#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    pub addr: SocketAddr,
    /// Push a binary message of this many bytes to every connection (0: off).
    #[arg(long, default_value_t = 0)]
    pub push_size: usize,
    /// Interval between pushes in microseconds.
    #[arg(long, default_value_t = 500)]
    pub push_every_us: u64,
    /// wss: this certificate chain (PEM), with --tls-key (servers that
    /// support it: `serve_maybe_tls`).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key for --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl Args {
    /// The push interval, when pushing is on.
    pub fn push_every(&self) -> Option<Duration> {
        (self.push_size > 0).then(|| Duration::from_micros(self.push_every_us.max(1)))
    }
}

/// Accepts connections for ever, one task each, on a default multi-threaded
/// runtime (one worker per CPU the process may use).
pub fn serve<F, Fut>(handle: F)
where
    F: Fn(TcpStream, Args) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let args = Args::parse();
    accept_loop(args, handle);
}

/// Serves the axum app `app` makes with `axum::serve` (TCP_NODELAY on every
/// connection), on a default multi-threaded runtime.
pub fn serve_axum(app: impl FnOnce(Args) -> axum::Router) {
    use axum::serve::ListenerExt;
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async move {
        let addr = args.addr;
        let listener = TcpListener::bind(addr).await.expect("bind").tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app(args)).await.expect("serve");
    });
}

/// [`serve`] for a library that works over any async stream: with
/// `--tls-cert` and `--tls-key`, each connection is TLS (tokio-rustls, ring)
/// first.
pub fn serve_maybe_tls<F, Fut>(handle: F)
where
    F: Fn(MaybeTls, Args) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let args = Args::parse();
    let Some(acceptor) = tls_acceptor(&args) else {
        accept_loop(args, move |stream, args| {
            handle(MaybeTls::Plain(stream), args)
        });
        return;
    };
    accept_loop(args, move |stream, args| {
        let acceptor = acceptor.clone();
        async move {
            if let Ok(tls) = acceptor.accept(stream).await {
                handle(MaybeTls::Tls(Box::new(tls)), args).await;
            }
        }
    });
}

fn tls_acceptor(args: &Args) -> Option<tokio_rustls::TlsAcceptor> {
    let config = tls_config(args)?;
    Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

/// The TLS configuration for `--tls-cert` and `--tls-key` (ring), if both
/// are given; a bad file ends the process with its name.
pub fn tls_config(args: &Args) -> Option<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = (args.tls_cert.as_ref()?, args.tls_key.as_ref()?);
    let chain = CertificateDer::pem_file_iter(cert)
        .expect("--tls-cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("--tls-cert");
    let key = PrivateKeyDer::from_pem_file(key).expect("--tls-key");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate and key");
    Some(config)
}

/// [`tls_config`] for QUIC: required (QUIC is always TLS), ALPN `h3`.
pub fn h3_tls_config(args: &Args, name: &str) -> rustls::ServerConfig {
    let Some(mut config) = tls_config(args) else {
        eprintln!("error: {name} needs --tls-cert and --tls-key (QUIC is always TLS)");
        std::process::exit(2);
    };
    config.alpn_protocols = vec![b"h3".to_vec()];
    config
}

/// A connection: plain TCP, or TLS over it.
pub enum MaybeTls {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for MaybeTls {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for MaybeTls {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Accepts connections for ever, one task each (`handle`).
fn accept_loop<F, Fut>(args: Args, handle: F)
where
    F: Fn(TcpStream, Args) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind(args.addr).await.expect("bind");
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(handle(stream, args.clone()));
                }
                Err(error) => {
                    eprintln!("accept: {error}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
}

/// A ticker for the push mode; never fires when pushing is off.
pub fn push_ticker(args: &Args) -> Option<tokio::time::Interval> {
    args.push_every().map(tokio::time::interval)
}

/// Waits for the next push tick, or for ever when pushing is off.
pub async fn next_push(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The echo (and push) loop for libraries whose socket is a `Stream` of
/// messages and a `Sink` for them: echoes every data message, sends `push()`
/// on every push tick, and ends on the first error or the end of the stream.
pub async fn echo_and_push<S, M, E>(
    mut ws: S,
    args: Args,
    is_data: impl Fn(&M) -> bool,
    push: impl Fn() -> M,
) where
    S: Stream<Item = Result<M, E>> + Sink<M> + Unpin,
{
    let mut ticker = push_ticker(&args);
    loop {
        let outgoing = tokio::select! {
            message = ws.next() => match message {
                Some(Ok(message)) if is_data(&message) => message,
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return,
            },
            _ = next_push(&mut ticker) => push(),
        };
        if ws.send(outgoing).await.is_err() {
            return;
        }
    }
}
