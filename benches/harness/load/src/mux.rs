//! Stream multiplexers compared (`rapidws-load mux <serve|throughput|open|idle>`):
//! rapidws's smux, the `async_smux` crate and the `yamux` crate, each over
//! one plain TCP connection, each driven by its own client. The Go side
//! (xtaci/smux) is `go/cmd/smuxbench`, which takes the same subcommands and
//! flags and prints the same JSON lines; `bin/mux-bench.rs` runs them all.
//!
//! What each subcommand measures:
//! - `throughput`: N streams on one session; on each, one task writes
//!   `--size`-byte chunks without pause and another reads the echo. The
//!   figure is the echoed bytes read per second, all streams together.
//! - `open`: `--concurrency` tasks each open a stream, write one byte, read
//!   it back and close the stream, again and again: streams per second.
//! - `idle`: opens streams, writes one byte on each and reads the one the
//!   server writes back; at every step prints `{"opened":N}` and waits for
//!   a line on stdin. The server (`serve --hold`) reads that byte, writes
//!   one back, keeps the stream without a task of its own,
//!   and prints `{"held":N}` every thousand, so the runner can read the
//!   server's memory per held stream.
//!
//! The echo on the server is the same for every Rust library: a task per
//! stream reading into 32 KiB and writing it back (Go's `io.CopyBuffer` with
//! 32 KiB does the same); the client splits each stream with
//! `tokio::io::split`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

use crate::emit;

/// Streams a session may hold in these runs (the idle step opens 10,000).
const MAX_STREAMS: usize = 20_000;

#[derive(Subcommand, Debug)]
pub enum MuxMode {
    /// Accept sessions forever; echo every stream, or hold them (`--hold`).
    Serve(ServeArgs),
    /// Echoed bytes per second over N streams of one session.
    Throughput(ThroughputArgs),
    /// Streams opened (one byte each way, then closed) per second.
    Open(OpenArgs),
    /// Open idle streams in steps, waiting for a line on stdin after each.
    Idle(IdleArgs),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lib {
    /// `rapidws::mux` (smux versions 1 and 2).
    Rapidws,
    /// The `async_smux` crate (smux version 1 only).
    AsyncSmux,
    /// The `yamux` crate (libp2p's; its own protocol, not smux).
    Yamux,
    /// No multiplexer: every stream is a TCP connection of its own (the
    /// ceiling the others are measured against).
    Tcp,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Rapidws => "rapidws",
            Lib::AsyncSmux => "async_smux",
            Lib::Yamux => "yamux",
            Lib::Tcp => "tcp",
        }
    }
}

/// The flags every subcommand shares.
#[derive(Args, Debug, Clone, Copy)]
pub struct Common {
    #[arg(long, value_enum)]
    pub lib: Lib,
    /// smux version (rapidws; async_smux speaks 1 only, yamux has none).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub version: u8,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long)]
    pub listen: SocketAddr,
    /// Keep accepted streams (after one byte each way) instead of echoing.
    #[arg(long)]
    pub hold: bool,
}

#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long)]
    pub addr: SocketAddr,
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Bytes per write.
    #[arg(long, default_value_t = 16384)]
    pub size: usize,
    #[command(flatten)]
    pub window: crate::Window,
}

#[derive(Args, Debug)]
pub struct OpenArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long)]
    pub addr: SocketAddr,
    #[arg(long, default_value_t = 10)]
    pub concurrency: usize,
    #[command(flatten)]
    pub window: crate::Window,
}

#[derive(Args, Debug)]
pub struct IdleArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long)]
    pub addr: SocketAddr,
    /// Stream counts at which to stop, report and wait for a line on stdin.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub steps: Vec<usize>,
}

pub async fn run(mode: MuxMode) -> io::Result<()> {
    match mode {
        MuxMode::Serve(args) => serve(args).await,
        MuxMode::Throughput(args) => throughput(args).await,
        MuxMode::Open(args) => open(args).await,
        MuxMode::Idle(args) => idle(args).await,
    }
}

/// A stream of any of the libraries, as tokio I/O.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}
type BoxIo = Box<dyn Io>;

/// The dialling side's session.
enum Session {
    Rapidws(rapidws::mux::Mux),
    AsyncSmux(async_smux::MuxConnector<TcpStream>),
    Yamux(mpsc::UnboundedSender<oneshot::Sender<io::Result<yamux::Stream>>>),
    Tcp(SocketAddr),
}

fn rapidws_config(version: Option<u8>) -> rapidws::mux::Config {
    rapidws::mux::Config {
        version: version.map(|v| {
            if v == 2 {
                rapidws::mux::Version::V2
            } else {
                rapidws::mux::Version::V1
            }
        }),
        max_streams: MAX_STREAMS,
        ..Default::default()
    }
}

fn yamux_config() -> yamux::Config {
    let mut config = yamux::Config::default();
    // yamux asks for 256 KiB of connection window per stream allowed.
    config.set_max_connection_receive_window(Some(256 * 1024 * MAX_STREAMS));
    config.set_max_num_streams(MAX_STREAMS);
    config
}

impl Session {
    async fn dial(common: Common, addr: SocketAddr) -> io::Result<Session> {
        if common.lib == Lib::Tcp {
            return Ok(Session::Tcp(addr));
        }
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(match common.lib {
            Lib::Rapidws => Session::Rapidws(rapidws::mux::Mux::new(
                tcp,
                rapidws::mux::Side::Dialer,
                rapidws_config(Some(common.version)),
            )),
            Lib::AsyncSmux => {
                let (connector, _acceptor, worker) = async_smux::MuxBuilder::client()
                    .with_connection(tcp)
                    .build();
                tokio::spawn(worker);
                Session::AsyncSmux(connector)
            }
            Lib::Yamux => {
                let connection =
                    yamux::Connection::new(tcp.compat(), yamux_config(), yamux::Mode::Client);
                let (open, requests) = mpsc::unbounded_channel();
                tokio::spawn(drive_yamux(connection, requests, None));
                Session::Yamux(open)
            }
            Lib::Tcp => unreachable!("returned above"),
        })
    }

    /// A stream that has carried one byte each way (the server echoes or
    /// answers it), so that every library has taken it in fully.
    async fn open_used(&self) -> io::Result<BoxIo> {
        let mut stream = self.open().await?;
        stream.write_all(b"x").await?;
        let mut back = [0u8; 1];
        stream.read_exact(&mut back).await?;
        Ok(stream)
    }

    async fn open(&self) -> io::Result<BoxIo> {
        match self {
            Session::Rapidws(mux) => {
                Ok(Box::new(mux.open_stream().await.map_err(io::Error::other)?))
            }
            Session::AsyncSmux(connector) => {
                Ok(Box::new(connector.connect().map_err(io::Error::other)?))
            }
            Session::Yamux(open) => {
                let (answer, answered) = oneshot::channel();
                open.send(answer)
                    .map_err(|_| io::Error::other("the yamux connection ended"))?;
                let stream = answered
                    .await
                    .map_err(|_| io::Error::other("the yamux connection ended"))??;
                Ok(Box::new(stream.compat()))
            }
            Session::Tcp(addr) => {
                let tcp = TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                Ok(Box::new(tcp))
            }
        }
    }
}

/// yamux's `Connection` does all of its work inside `poll_next_inbound`
/// and `poll_new_outbound`, which need `&mut`: one task owns it, opens the
/// streams asked for and hands over the inbound ones.
async fn drive_yamux(
    mut connection: yamux::Connection<tokio_util::compat::Compat<TcpStream>>,
    mut requests: mpsc::UnboundedReceiver<oneshot::Sender<io::Result<yamux::Stream>>>,
    inbound: Option<mpsc::UnboundedSender<yamux::Stream>>,
) {
    let mut waiting = std::collections::VecDeque::new();
    let mut requests_open = true;
    std::future::poll_fn(|cx| {
        loop {
            while requests_open {
                match requests.poll_recv(cx) {
                    Poll::Ready(Some(answer)) => waiting.push_back(answer),
                    Poll::Ready(None) => requests_open = false,
                    Poll::Pending => break,
                }
            }
            while !waiting.is_empty() {
                match connection.poll_new_outbound(cx) {
                    Poll::Ready(result) => {
                        let answer: oneshot::Sender<_> = waiting.pop_front().expect("not empty");
                        let _ = answer.send(result.map_err(io::Error::other));
                    }
                    Poll::Pending => break,
                }
            }
            match connection.poll_next_inbound(cx) {
                Poll::Ready(Some(Ok(stream))) => {
                    if let Some(inbound) = &inbound {
                        let _ = inbound.send(stream);
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    eprintln!("yamux connection: {error}");
                    return Poll::Ready(());
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

async fn serve(args: ServeArgs) -> io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    eprintln!(
        "{} serving smux-style streams on {} ({})",
        args.common.lib.name(),
        args.listen,
        if args.hold { "holding" } else { "echoing" }
    );
    let held = Arc::new(AtomicU64::new(0));
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let (streams, mut incoming) = mpsc::unbounded_channel::<BoxIo>();
        match args.common.lib {
            Lib::Tcp => {
                let _ = streams.send(Box::new(tcp));
            }
            Lib::Rapidws => {
                // The version is the one the peer speaks.
                let mux =
                    rapidws::mux::Mux::new(tcp, rapidws::mux::Side::Acceptor, rapidws_config(None));
                let hold = args.hold;
                tokio::spawn(async move {
                    while let Some(stream) = mux.accept_stream().await {
                        if !hold {
                            tokio::spawn(echo_bytes(stream));
                            continue;
                        }
                        if streams.send(Box::new(stream)).is_err() {
                            break;
                        }
                    }
                });
            }
            Lib::AsyncSmux => {
                let (connector, mut acceptor, worker) = async_smux::MuxBuilder::server()
                    .with_connection(tcp)
                    .build();
                tokio::spawn(worker);
                tokio::spawn(async move {
                    while let Some(stream) = acceptor.accept().await {
                        if streams.send(Box::new(stream)).is_err() {
                            break;
                        }
                    }
                    // The session ends when every handle is gone: keep the
                    // connector as long as the acceptor.
                    drop(connector);
                });
            }
            Lib::Yamux => {
                let connection =
                    yamux::Connection::new(tcp.compat(), yamux_config(), yamux::Mode::Server);
                let (inbound, mut accepted) = mpsc::unbounded_channel();
                let (_open, requests) = mpsc::unbounded_channel();
                tokio::spawn(drive_yamux(connection, requests, Some(inbound)));
                tokio::spawn(async move {
                    while let Some(stream) = accepted.recv().await {
                        if streams.send(Box::new(stream.compat())).is_err() {
                            break;
                        }
                    }
                });
            }
        }
        let held = held.clone();
        let hold = args.hold;
        let lib = args.common.lib;
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Some(mut stream) = incoming.recv().await {
                if !hold {
                    tokio::spawn(async move {
                        let _ = echo(&mut stream).await;
                    });
                    continue;
                }
                // One byte each way, so that every library has taken the
                // stream in fully (yamux acknowledges a stream only with
                // the first frame it sends on it).
                let mut first = [0u8; 1];
                if stream.read_exact(&mut first).await.is_err()
                    || stream.write_all(&first).await.is_err()
                {
                    continue;
                }
                kept.push(stream);
                let now = held.fetch_add(1, Ordering::Relaxed) + 1;
                if now.is_multiple_of(1000) {
                    emit(&serde_json::json!({ "held": now }));
                }
            }
            if hold && lib == Lib::Tcp {
                // The connection was the only stream: keep holding it.
                std::future::pending::<()>().await;
            }
            drop(kept);
        });
    }
}

async fn echo(stream: &mut BoxIo) -> io::Result<()> {
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return stream.shutdown().await;
        }
        stream.write_all(&buffer[..n]).await?;
    }
}

/// rapidws's echo: what is read is written back as it is, not copied
/// (`read_bytes`, `write_bytes`), as a proxy or an echo on rapidws would.
async fn echo_bytes(mut stream: rapidws::mux::Stream) -> io::Result<()> {
    while let Some(bytes) = stream.read_bytes(32 * 1024).await? {
        stream.write_bytes(bytes).await?;
    }
    stream.shutdown().await
}

/// Sleeps through the warm-up and the window and returns (bytes or count
/// at the window's start, at its end, seconds measured).
async fn measure(window: crate::Window, counter: &AtomicU64) -> (u64, f64) {
    tokio::time::sleep(Duration::from_secs_f64(window.warmup)).await;
    let (start, from) = (Instant::now(), counter.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs_f64(window.duration)).await;
    let to = counter.load(Ordering::Relaxed);
    (to - from, start.elapsed().as_secs_f64())
}

/// Ends the process at the first stream error: a figure measured while some
/// streams failed would be no figure.
fn fail(what: &str, error: io::Error) -> ! {
    eprintln!("error: {what}: {error}");
    std::process::exit(1)
}

async fn throughput(args: ThroughputArgs) -> io::Result<()> {
    let session = Session::dial(args.common, args.addr).await?;
    let read = Arc::new(AtomicU64::new(0));
    let chunk: Arc<[u8]> = (0..args.size).map(|i| (i * 131 % 251) as u8).collect();
    for _ in 0..args.streams {
        let (mut reader, mut writer) = tokio::io::split(session.open().await?);
        let chunk = chunk.clone();
        tokio::spawn(async move {
            loop {
                if let Err(error) = writer.write_all(&chunk).await {
                    fail("write", error);
                }
            }
        });
        let read = read.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 32 * 1024];
            loop {
                match reader.read(&mut buffer).await {
                    Ok(0) => fail("read", io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => read.fetch_add(n as u64, Ordering::Relaxed),
                    Err(error) => fail("read", error),
                };
            }
        });
    }
    let (bytes, secs) = measure(args.window, &read).await;
    emit(&serde_json::json!({
        "lib": args.common.lib.name(),
        "version": args.common.version,
        "streams": args.streams,
        "size": args.size,
        "bytes": bytes,
        "secs": secs,
        "bytes_per_sec": bytes as f64 / secs,
    }));
    std::process::exit(0)
}

async fn open(args: OpenArgs) -> io::Result<()> {
    let session = Arc::new(Session::dial(args.common, args.addr).await?);
    let done = Arc::new(AtomicU64::new(0));
    for _ in 0..args.concurrency {
        let (session, done) = (session.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                let result = async {
                    let mut stream = session.open_used().await?;
                    stream.shutdown().await
                };
                match result.await {
                    Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                    Err(error) => fail("open", error),
                };
            }
        });
    }
    let (streams, secs) = measure(args.window, &done).await;
    emit(&serde_json::json!({
        "lib": args.common.lib.name(),
        "version": args.common.version,
        "concurrency": args.concurrency,
        "streams": streams,
        "secs": secs,
        "streams_per_sec": streams as f64 / secs,
    }));
    std::process::exit(0)
}

async fn idle(args: IdleArgs) -> io::Result<()> {
    let session = Session::dial(args.common, args.addr).await?;
    let mut kept = Vec::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    for step in args.steps {
        while kept.len() < step {
            kept.push(session.open_used().await?);
        }
        emit(&serde_json::json!({ "opened": kept.len() }));
        // The last step's line (or the end of stdin) ends the run, as
        // smuxbench's does.
        if stdin.next_line().await?.is_none() {
            break;
        }
    }
    Ok(())
}
