//! What the examples share: the `--addr`, `--backend` and `--threads` options,
//! and running a handler on the chosen backend until Ctrl-C (close every
//! connection with 1001 at once) or SIGTERM (close them with 1012 spread
//! over `--spread-secs`), then exiting 0.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use rapidws::{Config, ServerHandler};

#[allow(dead_code)] // the bridges (h2_bridge, h3_bridge)
pub mod bridge;
#[allow(dead_code)] // the echoes (echo, axum_echo, h3_echo)
pub mod echo;
#[allow(dead_code)] // the examples on axum
pub mod http;

/// The `main` of an example with a `run` of its own: logs to stderr,
/// parses the command line, and runs `run` with it (see [`block_on`]).
#[allow(dead_code)] // the examples with a `run` of their own
pub fn main<A: clap::Parser, E: std::fmt::Display, F>(run: impl FnOnce(A) -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
{
    log_to_stderr();
    let args = A::parse();
    block_on(run(args))
}

/// `config` with permessage-deflate if `deflate` (the library's defaults;
/// messages under `min_size` bytes sent uncompressed, if given): what
/// `--deflate` and `--deflate-min-size` ask of the examples with options
/// of their own.
#[allow(dead_code)] // the examples with options of their own
pub fn with_deflate(config: Config, deflate: bool, min_size: Option<usize>) -> Config {
    match (deflate, min_size) {
        (false, _) => config,
        (true, None) => config.permessage_deflate(rapidws::DeflateConfig::default()),
        (true, Some(bytes)) => {
            config.permessage_deflate(rapidws::DeflateConfig::default().compress_min_size(bytes))
        }
    }
}

/// Runs `main` on a tokio runtime: exit 0 when it ends well, 1 with its
/// error on stderr when not (or when the runtime cannot start).
#[allow(dead_code)] // the examples with a `run` of their own
pub fn block_on<E: std::fmt::Display>(
    main: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// An error of any kind, for the examples' own `run`s.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Logs to stderr at the level `RUST_LOG` asks for (default `info`), in
/// colour only on a terminal (a log file gets plain text).
pub fn log_to_stderr() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Parses the command line of an example whose `--addr` (from
/// [`ServeArgs`]) defaults to `addr`: each example has its own port, so
/// that they run side by side without flags (the gateway in front of
/// echo). Bad input ends the process with clap's message, as `parse` does.
#[allow(dead_code)] // echo keeps the shared default (9001)
pub fn parse_with_addr<A: clap::Parser>(addr: &'static str) -> A {
    let command = A::command().mut_arg("addr", |arg| arg.default_value(addr));
    let matches = command.get_matches();
    A::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
}

/// `--threads`: at least one.
fn threads(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (leave it out for one per CPU)".into()),
        Ok(threads) => Ok(threads),
        Err(error) => Err(format!("{error}: a number of threads, at least 1")),
    }
}

/// An address to listen on or connect to: `IP:PORT`, or `HOST:PORT` with
/// the name resolved (its first IPv4 address if it has one, as `localhost`
/// should mean 127.0.0.1 to the clients that will connect to it; else its
/// first).
pub fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(
            "no port: give HOST:PORT or IP:PORT, e.g. 127.0.0.1:9001 or localhost:9001".into(),
        );
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err("give HOST:PORT or IP:PORT, e.g. 127.0.0.1:9001 or localhost:9001 (a port is 0 to 65535)".into());
    }
    let found: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(value)
        .map_err(|error| format!("cannot resolve {host}: {error} (an IP address needs no lookup)"))?
        .collect();
    found
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{host} has no address (an IP address needs no lookup)"))
}

/// Where and how to serve.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on, IP:PORT or HOST:PORT (each example has its
    /// own default port).
    #[arg(long, default_value = "127.0.0.1:9001", value_parser = socket_addr)]
    pub addr: SocketAddr,
    /// Which backend serves the connections.
    #[arg(long, value_enum, default_value_t = Backend::Tokio)]
    pub backend: Backend,
    /// Worker threads for the tokio runtime, or reactor threads for io_uring
    /// (default: one per CPU).
    #[arg(long, value_parser = threads)]
    pub threads: Option<usize>,
    /// Offer permessage-deflate (RFC 7692) to clients that ask for it, with
    /// the library's defaults (no context takeover on either side).
    #[arg(long)]
    pub deflate: bool,
    /// With --deflate: keep the server's compression context between
    /// messages (better ratios, a zlib stream held per connection).
    #[arg(long, requires = "deflate")]
    pub deflate_context_takeover: bool,
    /// With --deflate: send messages shorter than this uncompressed
    /// (default: the library's, 64 bytes).
    #[arg(long, requires = "deflate", value_name = "BYTES")]
    pub deflate_min_size: Option<usize>,
    /// Serve wss with this certificate chain (PEM; with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key for --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    pub tls_key: Option<std::path::PathBuf>,
    /// With --tls-cert: also serve plain ws on the same port (the first
    /// byte tells a TLS handshake from an HTTP request).
    #[arg(long, requires = "tls_cert")]
    pub also_plain: bool,
    /// On SIGTERM, close the connections with 1012 (service restart) spread
    /// evenly over this many seconds, so that their clients do not all
    /// reconnect at once; 0 closes them all at once. The process exits 0
    /// once every connection has ended. After a handoff, the connections
    /// that could not move are closed the same way.
    /// (`--drain-secs` is the same flag's older name.)
    #[arg(long, alias = "drain-secs", value_name = "S", default_value_t = 0.0, value_parser = spread_secs)]
    pub spread_secs: f64,
    /// Serve `GET /metrics`: rapidws's metrics in the Prometheus text format.
    #[arg(long)]
    pub metrics: bool,
    /// Listen at this Unix socket for a successor: a new process of this
    /// program started with `--take-over PATH` (and the same other
    /// arguments) takes the listening socket and every connection over,
    /// and this process then exits 0. (Linux, either backend; the
    /// successor may run the other.)
    #[arg(long, value_name = "PATH")]
    pub handoff_socket: Option<std::path::PathBuf>,
    /// Take the listening socket and every connection over from the
    /// process listening at this Unix socket (its `--handoff-socket`)
    /// instead of binding `--addr`. (Linux, either backend.)
    #[arg(long, value_name = "PATH")]
    pub take_over: Option<std::path::PathBuf>,
    /// Accept through a `rapidws::route::Router` on --addr that hands each
    /// HTTP/1 connection, with the bytes it sniffed, to the server's
    /// `entrance` (anything else is closed), instead of the server's own
    /// listener: what routing costs, measured by the load harness.
    #[arg(long, conflicts_with_all = ["tls_cert", "take_over", "handoff_socket"])]
    pub route: bool,
    /// The most bytes of a connection's output the kernel may hold unsent
    /// (`Config::max_unsent_bytes`, Linux; 0: the kernel's own bound, its
    /// send buffer, which is the library's default; the stream example's
    /// default is 512 KiB). A reply cannot overtake them.
    #[arg(long, value_name = "BYTES")]
    pub max_unsent_bytes: Option<u32>,
    #[command(flatten)]
    pub origins: OriginArgs,
}

/// Which web pages may open connections, beside the server's own.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OriginArgs {
    /// Also let pages of this origin connect (`https://app.example`,
    /// `http://localhost:3000`; repeat for more; `*` for any page, for an
    /// endpoint that authenticates by token, never by cookie). By default
    /// only pages of the host a request is sent to may (others get 403):
    /// behind a proxy that rewrites `Host`, name the public origin here.
    #[arg(long, value_name = "ORIGIN", value_parser = origin)]
    pub allow_origin: Vec<String>,
}

impl OriginArgs {
    /// `config` letting in the origins asked for.
    pub fn apply(&self, config: Config) -> Config {
        if self.allow_origin.iter().any(|origin| origin == "*") {
            config.allow_any_origin()
        } else {
            config.allow_origins(self.allow_origin.iter().cloned())
        }
    }
}

/// `--allow-origin`: `*`, or an origin as a browser writes it in `Origin`.
fn origin(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value == "*" {
        return Ok(value.to_owned());
    }
    let shape = "an origin is scheme://host[:port], as a browser sends it in Origin \
                 (e.g. https://app.example or http://localhost:3000), or *";
    let Some((scheme, rest)) = value.split_once("://") else {
        return Err(shape.to_owned());
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https")
        || rest.is_empty()
        || rest.contains(['/', '?', '#', ' '])
    {
        return Err(format!("{value}: {shape}"));
    }
    Ok(value.to_owned())
}

/// The Prometheus recorder, once `--metrics` installed it.
static METRICS: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
    std::sync::OnceLock::new();

/// Installs the Prometheus recorder (once; later calls do nothing). Call it
/// before the server or the `PubSub` is built: they take their metric
/// handles from the recorder installed when they are made.
pub fn install_metrics() {
    METRICS.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .unwrap_or_else(|error| {
                eprintln!("error: --metrics: cannot install the recorder: {error}");
                std::process::exit(2);
            })
    });
}

/// The answer to `GET /metrics` once `--metrics` installed the recorder:
/// the Prometheus text format. `None` for any other request.
#[allow(dead_code)] // the examples with --metrics
pub fn metrics_page(method: &str, path: &str) -> Option<rapidws::HttpResponse> {
    if !matches!(method, "GET" | "HEAD") || path != "/metrics" {
        return None;
    }
    let text = metrics_text()?;
    Some(rapidws::HttpResponse::new(200, METRICS_TYPE, text))
}

/// The Prometheus text format's content type.
#[allow(dead_code)] // the examples with --metrics
pub const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The Prometheus text at `/metrics`, or `None` without `--metrics`.
#[allow(dead_code)] // the examples with --metrics
pub fn metrics_text() -> Option<String> {
    METRICS.get().map(|handle| handle.render())
}

/// `--spread-secs`: a number of seconds, at least 0 (fractions allowed).
pub fn spread_secs(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => Ok(secs),
        Ok(_) => Err("must be between 0 and 86400 seconds".into()),
        Err(error) => Err(format!("{error}: a number of seconds, e.g. 30 or 2.5")),
    }
}

/// What stopped the process: Ctrl-C (SIGINT) or SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

/// Resolves at the first SIGINT or SIGTERM (on Unix; Ctrl-C elsewhere).
pub async fn stop_signal() -> Stop {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            return tokio::select! {
                () = interrupted() => Stop::Interrupt,
                _ = terminate.recv() => Stop::Terminate,
            };
        }
    }
    interrupted().await;
    Stop::Interrupt
}

/// Resolves at Ctrl-C; never, if Ctrl-C cannot be listened for (that is no
/// reason to stop).
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl ServeArgs {
    /// The server configuration these options ask for.
    pub fn config(&self) -> Config {
        let config = self
            .origins
            .apply(Config::default())
            .max_unsent_bytes(self.max_unsent_bytes.unwrap_or(0));
        if !self.deflate {
            return config;
        }
        let deflate = rapidws::DeflateConfig::default()
            .server_context_takeover(self.deflate_context_takeover);
        let deflate = match self.deflate_min_size {
            Some(bytes) => deflate.compress_min_size(bytes),
            None => deflate,
        };
        config.permessage_deflate(deflate)
    }
}

impl ServeArgs {
    /// `--spread-secs` as a window.
    pub fn spread_window(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.spread_secs)
    }

    /// Why `--handoff-socket` or `--take-over` cannot be served, if so.
    fn handoff_missing(&self) -> Option<&'static str> {
        if self.handoff_socket.is_none() && self.take_over.is_none() {
            return None;
        }
        if !cfg!(all(target_os = "linux", feature = "handoff")) {
            return Some("handing connections over needs Linux and the `handoff` feature");
        }
        None
    }

    /// Why this build cannot serve the TLS asked for, if it cannot.
    fn tls_missing(&self) -> Option<&'static str> {
        self.tls_cert.as_ref()?;
        if !cfg!(feature = "rustls") {
            return Some(
                "this build has no TLS: build it with `--features rustls` \
                 (e.g. cargo run --release --features rustls --example echo -- --tls-cert ...)",
            );
        }
        match self.backend {
            Backend::Uring if self.also_plain => {
                Some("--also-plain is for --backend tokio; io_uring serves either ws or wss")
            }
            _ => None,
        }
    }

    /// The rustls configuration for --tls-cert and --tls-key (ring as the
    /// crypto provider, HTTP/1.1 by ALPN).
    #[cfg(feature = "rustls")]
    fn tls_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tls_server_config(cert, key).map(Some),
            _ => Ok(None),
        }
    }
}

/// The rustls configuration for a certificate chain and its key, both PEM
/// files (ring as the crypto provider, HTTP/1.1 by ALPN).
#[cfg(feature = "rustls")]
pub fn tls_server_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<std::sync::Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let chain = pem_certs(cert)
        .map_err(|error| format!("cannot read --tls-cert {}: {error}", cert.display()))?;
    if chain.is_empty() {
        // The two files given the other way round is the common mistake:
        // say so rather than "no items found".
        let swapped = PrivateKeyDer::from_pem_file(cert).is_ok()
            && pem_certs(key).is_ok_and(|certs| !certs.is_empty());
        if swapped {
            return Err(format!(
                "--tls-cert and --tls-key are swapped: {} holds a private key and {} a \
                 certificate (give the certificate chain to --tls-cert, the key to --tls-key)",
                cert.display(),
                key.display()
            ));
        }
        return Err(format!(
            "--tls-cert {} holds no certificate (a PEM file with \
             -----BEGIN CERTIFICATE----- blocks, the server's first)",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|error| {
        format!(
            "cannot read a private key from --tls-key {} ({error}): a PEM file with a \
             -----BEGIN PRIVATE KEY----- (or RSA/EC PRIVATE KEY) block",
            key.display()
        )
    })?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|error| format!("cannot use the certificate and key: {error}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}

/// The certificates in a PEM file (none if it holds none).
#[cfg(feature = "rustls")]
pub fn pem_certs(
    path: &std::path::Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::pem::Error> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_file_iter(path)?.collect()
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Backend {
    /// Connection groups on a multi-threaded tokio runtime.
    Tokio,
    /// One io_uring reactor per thread (Linux 6.0 or later).
    Uring,
}

impl Backend {
    /// Why this build cannot serve on the backend, if it cannot.
    fn missing(self) -> Option<&'static str> {
        match self {
            Backend::Tokio => None,
            Backend::Uring if cfg!(all(target_os = "linux", feature = "uring")) => None,
            Backend::Uring if cfg!(target_os = "linux") => Some(
                "this build has no io_uring backend: build it with `--features uring` \
                 (e.g. cargo run --release --features uring --example echo -- --backend uring)",
            ),
            Backend::Uring => Some("the io_uring backend needs Linux; use --backend tokio"),
        }
    }
}

/// Serves the handler `make` returns until Ctrl-C. `make` gets a tokio
/// runtime handle for the handler's own tasks: on the tokio backend, the
/// server's runtime; on io_uring, where callbacks run on the reactor threads
/// outside any runtime, a one-thread runtime beside them.
#[allow(dead_code)] // examples with a configuration of their own use `serve_with`
pub fn serve<H: ServerHandler>(
    name: &str,
    args: &ServeArgs,
    make: impl FnOnce(tokio::runtime::Handle) -> H,
) -> ExitCode {
    serve_with(name, args, args.config(), make)
}

/// [`serve`] with a configuration of the example's own (built on
/// [`ServeArgs::config`]).
pub fn serve_with<H: ServerHandler>(
    name: &str,
    args: &ServeArgs,
    config: Config,
    make: impl FnOnce(tokio::runtime::Handle) -> H,
) -> ExitCode {
    serve_beside(name, args, config, |runtime| (make(runtime), None))
}

/// [`serve_with`] for an example that serves something else beside it on
/// the same runtime: `make` also gives that task, which must end at the
/// same signal; once the server is done, it is waited for (the runtime's
/// end would cut it short).
pub fn serve_beside<H: ServerHandler>(
    name: &str,
    args: &ServeArgs,
    config: Config,
    make: impl FnOnce(tokio::runtime::Handle) -> (H, Option<tokio::task::JoinHandle<()>>),
) -> ExitCode {
    let missing = args.backend.missing();
    if let Some(missing) = missing.or_else(|| args.tls_missing().or_else(|| args.handoff_missing()))
    {
        eprintln!("error: {missing}");
        return ExitCode::from(2);
    }
    if args.metrics {
        install_metrics();
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    match (args.backend, args.threads) {
        (Backend::Tokio, Some(threads)) => {
            runtime.worker_threads(threads);
        }
        (Backend::Tokio, None) => {}
        (Backend::Uring, _) => {
            runtime.worker_threads(1);
        }
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let (handler, beside) = make(runtime.handle().clone());
    let served = match args.backend {
        Backend::Tokio => runtime.block_on(serve_tokio(name, args, config, handler)),
        Backend::Uring => serve_uring(name, args, config, handler, &runtime),
    };
    if let (Ok(()), Some(beside)) = (&served, beside) {
        let _ = runtime.block_on(beside);
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_tokio<H: ServerHandler>(
    name: &str,
    args: &ServeArgs,
    config: Config,
    handler: H,
) -> Result<(), String> {
    let server = match &args.take_over {
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        Some(path) => rapidws::tokio::Server::take_over(path, handler, config)
            .await
            .map_err(|error| format!("cannot take over: {error}"))?,
        _ if args.route => rapidws::tokio::Server::without_listener(handler, config),
        _ => rapidws::tokio::Server::bind(args.addr, handler, config)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", args.addr))?,
    };
    #[cfg(all(target_os = "linux", feature = "handoff"))]
    let server = match &args.handoff_socket {
        // What does not move is drained as SIGTERM drains.
        Some(path) => server
            .handoff_socket(path)
            .map_err(|error| format!("--handoff-socket {}: {error}", path.display()))?
            .after_handoff(rapidws::Spread::over(args.spread_window())),
        None => server,
    };
    #[cfg(feature = "rustls")]
    let server = match args.tls_config()? {
        Some(config) if args.also_plain => server.tls(config).also_plain(),
        Some(config) => server.tls(config),
        None => server,
    };
    let scheme = match (&args.tls_cert, args.also_plain) {
        (None, _) => "ws",
        (Some(_), false) => "wss",
        (Some(_), true) => "ws+wss",
    };
    shut_down_on_signal(
        &tokio::runtime::Handle::current(),
        server.handle(),
        args.spread_window(),
    );
    let addr = match args.route {
        true => route(args.addr, server.entrance()).await?,
        false => server.local_addr().map_err(|error| error.to_string())?,
    };
    tracing::info!(%addr, backend = "tokio", scheme, routed = args.route, "{name} server listening");
    server.serve().await.map_err(|error| error.to_string())
}

/// `--route`: a router on `addr`, on the current runtime, handing HTTP/1
/// connections to `entrance`. Its address, once it listens.
async fn route(addr: SocketAddr, entrance: rapidws::tokio::Entrance) -> Result<SocketAddr, String> {
    use rapidws::route::{Matcher, Routed, Router};
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| format!("cannot listen on {addr}: {error}"))?;
    let addr = listener.local_addr().map_err(|error| error.to_string())?;
    let router = Router::new().route_to(
        Matcher::http1(),
        move |routed: Routed<tokio::net::TcpStream>| {
            let (read, tcp) = routed.stream.into_parts();
            let admitted = entrance.admit(tcp, routed.peer, read);
            async move {
                if let Err(error) = admitted {
                    tracing::debug!(%error, "a routed connection was refused");
                }
            }
        },
    );
    tokio::spawn(async move {
        if let Err(error) = router.serve(listener).await {
            tracing::error!(%error, "the router stopped");
        }
    });
    Ok(addr)
}

#[cfg(all(target_os = "linux", feature = "uring"))]
fn serve_uring<H: ServerHandler>(
    name: &str,
    args: &ServeArgs,
    config: Config,
    handler: H,
    runtime: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let mut server = match &args.take_over {
        #[cfg(feature = "handoff")]
        Some(path) => rapidws::uring::Server::take_over(path, handler, config)
            .map_err(|error| format!("cannot take over: {error}"))?,
        _ if args.route => rapidws::uring::Server::without_listener(handler, config),
        _ => rapidws::uring::Server::bind(args.addr, handler, config)
            .map_err(|error| format!("cannot listen on {}: {error}", args.addr))?,
    };
    #[cfg(feature = "handoff")]
    if let Some(path) = &args.handoff_socket {
        server = server
            .handoff_socket(path)
            .map_err(|error| format!("--handoff-socket {}: {error}", path.display()))?
            .after_handoff(rapidws::Spread::over(args.spread_window()));
    }
    if let Some(threads) = args.threads {
        server = server.threads(threads);
    }
    #[cfg(feature = "rustls")]
    if let Some(config) = args.tls_config()? {
        server = server.tls(config);
    }
    let scheme = if args.tls_cert.is_some() { "wss" } else { "ws" };
    shut_down_on_signal(runtime.handle(), server.handle(), args.spread_window());
    let addr = match args.route {
        true => runtime.block_on(route(args.addr, server.entrance()))?,
        false => server.local_addr().map_err(|error| error.to_string())?,
    };
    tracing::info!(%addr, backend = "uring", scheme, routed = args.route, "{name} server listening");
    // Blocks this thread; the reactors run on threads of their own.
    server.serve().map_err(|error| error.to_string())
}

#[cfg(not(all(target_os = "linux", feature = "uring")))]
fn serve_uring<H: ServerHandler>(
    _: &str,
    _: &ServeArgs,
    _: Config,
    _: H,
    _: &tokio::runtime::Runtime,
) -> Result<(), String> {
    unreachable!("`serve` checked Backend::missing first")
}

/// Ctrl-C closes every connection with 1001 at once; SIGTERM closes them
/// with 1012 spread over `window`.
fn shut_down_on_signal(
    runtime: &tokio::runtime::Handle,
    handle: rapidws::ServerHandle,
    window: std::time::Duration,
) {
    runtime.spawn(async move {
        match stop_signal().await {
            Stop::Interrupt => handle.shutdown(),
            Stop::Terminate => handle.shutdown_spread(rapidws::Spread::over(window)),
        }
    });
}

/// A client's rustls configuration for `--cafile` (or `flag`, the option
/// that named `path`, as its errors call it; ring as the provider):
/// the certificates in `path` are trusted as roots, and each one also byte
/// for byte as the server's own certificate whatever its CA flag, as
/// browsers and Python's `ssl` do. (`openssl req -x509` marks a
/// self-signed certificate CA:TRUE, which the web PKI check refuses as a
/// server's certificate: "CaUsedAsEndEntity".) The server's name and its
/// handshake signature are checked either way. Without `path`, the web PKI
/// roots.
#[cfg(feature = "rustls")]
#[allow(dead_code)] // the client examples use it
pub fn client_tls(
    path: Option<&std::path::Path>,
    flag: &str,
) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    use std::sync::Arc;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let mut pinned = Vec::new();
    match path {
        Some(path) => {
            let certs = pem_certs(path)
                .map_err(|error| format!("cannot read {flag} {}: {error}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "{flag} {} holds no certificate (a PEM file with \
                     -----BEGIN CERTIFICATE----- blocks)",
                    path.display()
                ));
            }
            // A certificate webpki cannot take as a root is still pinned.
            roots.add_parsable_certificates(certs.iter().cloned());
            pinned = certs;
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let config = if pinned.is_empty() {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build();
        let verifier = Pinned {
            pinned,
            webpki: webpki.ok(),
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// `--cafile`'s verifier (see [`client_tls`]).
#[cfg(feature = "rustls")]
#[derive(Debug)]
struct Pinned {
    pinned: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// The roots' check, for a certificate that is not one of `pinned`
    /// (`None` if no certificate could be a root).
    webpki: Option<std::sync::Arc<rustls::client::WebPkiServerVerifier>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

#[cfg(feature = "rustls")]
impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|cert| cert.as_ref() == end_entity.as_ref())
        {
            let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, server_name)?;
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        match &self.webpki {
            Some(webpki) => {
                webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            }
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, signature, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, signature, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
