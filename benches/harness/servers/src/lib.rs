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
#[derive(Parser, Debug, Clone, Copy)]
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
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind(args.addr).await.expect("bind");
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(handle(stream, args));
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
