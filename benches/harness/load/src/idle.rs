//! `idle`: opens N upgraded connections and holds them. Each line on stdin is a
//! command: `ping` sends a ping on every connection and reports how many
//! answered with a pong; `exit` (or end of input) closes them all.
//!
//! With `--deflate` every upgrade offers permessage-deflate, so the memory an
//! idle connection costs is measured with compression negotiated; a server
//! that declines fails each connection with the same message as `deflate`.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::wire::Stream;
use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::TargetArgs;
use crate::deflate;
use crate::emit;
use crate::h3wire::{Bare, Hold};
use crate::wire::{self, FrameReader};

#[derive(Args, Debug, Clone)]
pub struct IdleArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Connections to open (one process may hold fewer than its file limit).
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Connection attempts in flight at once.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Seconds to wait for all pongs.
    #[arg(long, default_value_t = 20.0)]
    pub ping_timeout: f64,
    /// Offer `permessage-deflate; client_no_context_takeover` and count a
    /// connection whose server does not accept it as failed.
    #[arg(long, conflicts_with = "raw")]
    pub deflate: bool,
    /// Over HTTP/3 (`--h3`): hold only this much of each connection, to
    /// break an idle WebSocket's memory down: `quic` (the QUIC connection
    /// alone), `h3` (and HTTP/3's control streams), `ws` (and a WebSocket:
    /// the default). Without a WebSocket, `ping` counts the QUIC
    /// connections still open.
    #[arg(long, value_enum, default_value = "ws", requires = "h3")]
    pub h3_hold: Hold,
}

/// A connection held: upgraded, or (`--h3-hold quic|h3`) bare.
enum Held {
    Upgraded(Stream, BytesMut),
    Bare(Bare),
}

pub async fn run(args: IdleArgs) -> io::Result<()> {
    let started = Instant::now();
    let (held, errors) = open_all(&args).await;
    emit(&json!({
        "event": "connected",
        "connected": held.borrow().len(),
        "errors": errors.0,
        "first_error": errors.1,
        "secs": started.elapsed().as_secs_f64(),
    }));
    let mut held = held.take();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "ping" => {
                let started = Instant::now();
                let deadline = started + Duration::from_secs_f64(args.ping_timeout);
                let alive = ping_all(&mut held, deadline).await;
                emit(&json!({
                    "event": "alive",
                    "alive": alive,
                    "held": held.len(),
                    "secs": started.elapsed().as_secs_f64(),
                }));
            }
            "exit" => break,
            other => eprintln!("idle: unknown command {other:?}"),
        }
    }
    Ok(())
}

async fn open_all(args: &IdleArgs) -> (Rc<RefCell<Vec<Held>>>, (usize, Option<String>)) {
    let held = Rc::new(RefCell::new(Vec::with_capacity(args.conns)));
    let next = Rc::new(Cell::new(0usize));
    let errors = Rc::new(RefCell::new((0usize, None::<String>)));
    let target = args.target.target();
    let sources = args.target.sources();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (held, next, errors, target) =
            (held.clone(), next.clone(), errors.clone(), target.clone());
        let (conns, with_deflate, hold) = (args.conns, args.deflate, args.h3_hold);
        workers.push(tokio::task::spawn_local(async move {
            loop {
                let i = next.get();
                if i >= conns {
                    return;
                }
                next.set(i + 1);
                let opened = match (&target.h3, hold) {
                    (Some(h3), Hold::Quic | Hold::H3) => {
                        h3.hold(target.addr, hold).await.map(Held::Bare)
                    }
                    _ => open(&target, sources.nth(i), with_deflate)
                        .await
                        .map(|(stream, buf)| Held::Upgraded(stream, buf)),
                };
                match opened {
                    Ok(connection) => held.borrow_mut().push(connection),
                    Err(error) => {
                        let mut errors = errors.borrow_mut();
                        errors.0 += 1;
                        errors.1.get_or_insert_with(|| error.to_string());
                    }
                }
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
    let errors = errors.take();
    (held, errors)
}

/// Opens one connection, offering permessage-deflate if `with_deflate`.
/// Nothing is compressed afterwards (pings are control frames), but the
/// server has set up whatever per-connection state its compression needs.
async fn open(
    target: &wire::Target,
    source: Option<IpAddr>,
    with_deflate: bool,
) -> io::Result<(Stream, BytesMut)> {
    if !with_deflate {
        return wire::open(target, source).await;
    }
    let (stream, buf, head) = wire::open_with(target, source, deflate::OFFER).await?;
    match deflate::accepted_extension(&head) {
        Some(_) => Ok((stream, buf)),
        None => Err(io::Error::other(deflate::DECLINED)),
    }
}

/// Pings every connection, then waits (until `deadline`) for each one's
/// pong; a bare QUIC connection is alive if it is still open.
async fn ping_all(held: &mut [Held], deadline: Instant) -> usize {
    let ping = wire::masked_frame(wire::PING, b"alive?", [7, 7, 7, 7]);
    let mut written = vec![false; held.len()];
    for (one, written) in held.iter_mut().zip(&mut written) {
        *written = match one {
            // A TLS stream keeps the record until flushed.
            Held::Upgraded(stream, _) => {
                stream.write_all(&ping).await.is_ok() && stream.flush().await.is_ok()
            }
            Held::Bare(bare) => bare.conn.close_reason().is_none(),
        };
    }
    let mut alive = 0;
    for (one, written) in held.iter_mut().zip(written) {
        let answered = match one {
            Held::Upgraded(stream, buf) => written && wait_pong(stream, buf, deadline).await,
            Held::Bare(_) => written,
        };
        if answered {
            alive += 1;
        }
    }
    alive
}

async fn wait_pong(stream: &mut Stream, buf: &mut BytesMut, deadline: Instant) -> bool {
    let mut reader = FrameReader::default();
    loop {
        while let Ok(Some(seen)) = reader.next(buf) {
            // The raw TCP echo server reflects our ping instead of answering it.
            if seen.opcode == wire::PONG || seen.opcode == wire::PING {
                return true;
            }
        }
        let read = tokio::time::timeout_at(deadline.into(), stream.read_buf(buf)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            return false;
        }
    }
}
