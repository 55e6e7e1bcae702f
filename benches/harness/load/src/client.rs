//! `client`: the closed-loop echo of `echo`, driven through a real client
//! library instead of raw frames: rapidws's (`rapidws::client`, its async
//! socket), tokio-tungstenite's, or fastwebsockets's. Each library is used
//! the way its documentation shows: rapidws's `send` waits for room and the
//! driver writes what is queued; tokio-tungstenite's `send` writes and
//! flushes each message; fastwebsockets's `write_frame` writes each frame.
//! The figures are what one client core pushes through the server, and the
//! client process's own CPU time in the measured window (`client_cpu_secs`),
//! which says whether the client's core or the server's was the limit.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;

use crate::echo::LoopArgs;
use crate::stats::{SharedStats, Stats};
use crate::{Phase, SharedPhase, emit, note_failure};

#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    #[command(flatten)]
    pub shape: LoopArgs,
    /// The client library.
    #[arg(long, value_enum)]
    pub lib: Lib,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lib {
    Rapidws,
    Tungstenite,
    Fastwebsockets,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Rapidws => "rapidws",
            Lib::Tungstenite => "tokio-tungstenite",
            Lib::Fastwebsockets => "fastwebsockets",
        }
    }
}

pub async fn run(args: ClientArgs) -> io::Result<()> {
    let shape = &args.shape;
    let target = &shape.target;
    if target.raw || target.tls_ca.is_some() || target.sources != 1 {
        return Err(io::Error::other(
            "client: plain ws to one address only (no --raw, --tls-ca, --sources)",
        ));
    }
    let url = format!("ws://{}{}", target.addr, target.path);
    let payload = Bytes::from(
        (0..shape.size)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<_>>(),
    );
    let phase: SharedPhase = Rc::new(std::cell::Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let rapidws = rapidws::client::Client::new(rapidws::Config::default());
    // Every connection is open before the clock starts.
    let mut loops: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<()>>>>> =
        Vec::with_capacity(shape.conns);
    for _ in 0..shape.conns {
        let (payload, depth) = (payload.clone(), shape.depth);
        let (phase, stats) = (phase.clone(), stats.clone());
        match args.lib {
            Lib::Rapidws => {
                let (socket, _) = rapidws
                    .connect(url.as_str())
                    .await
                    .map_err(io::Error::other)?;
                loops.push(Box::pin(closed_loop(socket, payload, depth, phase, stats)));
            }
            Lib::Tungstenite => {
                let ws = tungstenite_connect(target.addr, &url).await?;
                loops.push(Box::pin(closed_loop(ws, payload, depth, phase, stats)));
            }
            Lib::Fastwebsockets => {
                let ws = fastwebsockets_connect(target.addr, &target.path).await?;
                loops.push(Box::pin(closed_loop(ws, payload, depth, phase, stats)));
            }
        }
    }
    for one in loops {
        let (phase, stats) = (phase.clone(), stats.clone());
        tokio::task::spawn_local(async move {
            note_failure(one.await, &phase, &stats);
        });
    }
    let measured = shape.window.run(&phase).await;
    let mut result = stats.borrow().summary(measured.secs);
    result["client_cpu_secs"] = json!(measured.cpu_secs);
    result["mode"] = json!("client");
    result["lib"] = json!(args.lib.name());
    result["conns"] = json!(shape.conns);
    result["size"] = json!(shape.size);
    result["depth"] = json!(shape.depth);
    emit(&result);
    Ok(())
}

/// Records the round trip of the oldest message in flight.
fn echoed(
    sent: &mut VecDeque<Instant>,
    phase: &SharedPhase,
    stats: &SharedStats,
) -> io::Result<()> {
    let sent_at = sent
        .pop_front()
        .ok_or_else(|| io::Error::other("unsolicited"))?;
    if phase.get() == Phase::Measure {
        stats.borrow_mut().record(sent_at.elapsed());
    }
    Ok(())
}

fn check_len(len: usize, payload: &Bytes) -> io::Result<()> {
    if len == payload.len() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "echo of {len} bytes, sent {}",
            payload.len()
        )))
    }
}

/// What the closed loop needs from a client library: send the payload as
/// a binary message, and wait for the next echo's length.
trait Echoer {
    async fn send(&mut self, payload: &Bytes) -> io::Result<()>;
    async fn echo_len(&mut self) -> io::Result<usize>;
}

impl Echoer for rapidws::socket::WebSocket {
    async fn send(&mut self, payload: &Bytes) -> io::Result<()> {
        rapidws::socket::WebSocket::send(self, payload.clone())
            .await
            .map_err(io::Error::other)
    }

    async fn echo_len(&mut self) -> io::Result<usize> {
        match self.recv().await {
            Some(Ok(rapidws::OwnedMessage::Binary(echo))) => Ok(echo.len()),
            Some(Ok(_)) => Err(io::Error::other("a text echo")),
            Some(Err(error)) => Err(io::Error::other(error)),
            None => Err(io::Error::other("server closed the connection")),
        }
    }
}

impl Echoer for TungsteniteSocket {
    async fn send(&mut self, payload: &Bytes) -> io::Result<()> {
        use tokio_tungstenite::tungstenite::Message;
        SinkExt::send(self, Message::Binary(payload.clone()))
            .await
            .map_err(io::Error::other)
    }

    async fn echo_len(&mut self) -> io::Result<usize> {
        use tokio_tungstenite::tungstenite::Message;
        loop {
            return match self.next().await {
                Some(Ok(Message::Binary(echo))) => Ok(echo.len()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(other)) => Err(io::Error::other(format!("unexpected {other:?}"))),
                Some(Err(error)) => Err(io::Error::other(error)),
                None => Err(io::Error::other("server closed the connection")),
            };
        }
    }
}

impl Echoer for FastSocket {
    async fn send(&mut self, payload: &Bytes) -> io::Result<()> {
        use fastwebsockets::{Frame, Payload};
        let frame = Frame::binary(Payload::Borrowed(&payload[..]));
        self.write_frame(frame).await.map_err(io::Error::other)
    }

    async fn echo_len(&mut self) -> io::Result<usize> {
        use fastwebsockets::OpCode;
        loop {
            let echo = self.read_frame().await.map_err(io::Error::other)?;
            return match echo.opcode {
                OpCode::Binary => Ok(echo.payload.len()),
                OpCode::Ping | OpCode::Pong => continue,
                other => Err(io::Error::other(format!("unexpected {other:?}"))),
            };
        }
    }
}

/// Keeps `depth` messages in flight on one connection: each echo is
/// answered with a new message. Records each round trip.
async fn closed_loop(
    mut client: impl Echoer,
    payload: Bytes,
    depth: usize,
    phase: SharedPhase,
    stats: SharedStats,
) -> io::Result<()> {
    let mut sent = VecDeque::with_capacity(depth);
    for _ in 0..depth {
        sent.push_back(Instant::now());
        client.send(&payload).await?;
    }
    while phase.get() != Phase::Stop {
        check_len(client.echo_len().await?, &payload)?;
        echoed(&mut sent, &phase, &stats)?;
        sent.push_back(Instant::now());
        client.send(&payload).await?;
    }
    Ok(())
}

type TungsteniteSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn tungstenite_connect(
    addr: std::net::SocketAddr,
    url: &str,
) -> io::Result<TungsteniteSocket> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (ws, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .map_err(io::Error::other)?;
    Ok(ws)
}

type FastSocket = fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Spawns hyper's connection task for fastwebsockets's handshake.
struct Spawn;

impl<F> hyper::rt::Executor<F> for Spawn
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::task::spawn(future);
    }
}

async fn fastwebsockets_connect(addr: std::net::SocketAddr, path: &str) -> io::Result<FastSocket> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let request = hyper::Request::builder()
        .method("GET")
        .uri(path)
        .header("Host", addr.to_string())
        .header("Upgrade", "websocket")
        .header("Connection", "upgrade")
        .header(
            "Sec-WebSocket-Key",
            fastwebsockets::handshake::generate_key(),
        )
        .header("Sec-WebSocket-Version", "13")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(io::Error::other)?;
    let (ws, _) = fastwebsockets::handshake::client(&Spawn, request, tcp)
        .await
        .map_err(io::Error::other)?;
    Ok(ws)
}

#[derive(Args, Debug, Clone)]
pub struct ClientIdleArgs {
    #[command(flatten)]
    pub target: crate::TargetArgs,
    /// The client library.
    #[arg(long, value_enum)]
    pub lib: Lib,
    /// Connections held first ...
    #[arg(long, default_value_t = 1000)]
    pub from: usize,
    /// ... and then: the figure is this process's RSS slope between the two.
    #[arg(long, default_value_t = 6000)]
    pub to: usize,
}

/// `client-idle`: the memory of an idle client connection. Opens `from`
/// connections with the library and holds them, reads this process's RSS
/// after 2 s, opens up to `to`, reads it again, and prints the slope as
/// `{"event":"idle","bytes_per_conn":...}`.
pub async fn idle(args: ClientIdleArgs) -> io::Result<()> {
    let target = &args.target;
    let url = format!("ws://{}{}", target.addr, target.path);
    let rapidws = rapidws::client::Client::new(rapidws::Config::default());
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::with_capacity(args.to);
    let mut marks = Vec::new();
    for step in [args.from, args.to] {
        while held.len() < step {
            held.push(match args.lib {
                Lib::Rapidws => {
                    let (socket, _) = rapidws
                        .connect(url.as_str())
                        .await
                        .map_err(io::Error::other)?;
                    Box::new(socket)
                }
                Lib::Tungstenite => Box::new(tungstenite_connect(target.addr, &url).await?),
                Lib::Fastwebsockets => {
                    Box::new(fastwebsockets_connect(target.addr, &target.path).await?)
                }
            });
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        marks.push(resident_bytes()?);
    }
    let slope = (marks[1] as f64 - marks[0] as f64) / (args.to - args.from).max(1) as f64;
    emit(&json!({
        "event": "idle",
        "lib": args.lib.name(),
        "bytes_per_conn": slope,
        "rss_from": marks[0],
        "rss_to": marks[1],
    }));
    Ok(())
}

/// This process's resident memory (`VmRSS`).
fn resident_bytes() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| io::Error::other("no VmRSS in /proc/self/status"))
}
