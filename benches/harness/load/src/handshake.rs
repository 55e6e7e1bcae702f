//! `handshake`: upgrades per second. Each worker connects, upgrades, sends a
//! close frame, waits for the server's close (or end of stream), resets the TCP
//! connection (so no TIME_WAIT piles up on our ports) and starts over.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::Stats;
use crate::wire::{self, FrameReader};
use crate::{Phase, SharedPhase, TargetArgs, Window, emit};

#[derive(Args, Debug, Clone)]
pub struct HandshakeArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub window: Window,
    /// Upgrades in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
}

pub async fn run(args: HandshakeArgs) -> io::Result<()> {
    let phase: SharedPhase = Rc::new(Cell::new(Phase::Warmup));
    let stats = Stats::shared();
    let target = args.target.target();
    let sources = args.target.sources();
    let next = Rc::new(Cell::new(0usize));
    let close = wire::masked_frame(wire::CLOSE, &1000u16.to_be_bytes(), [3, 1, 4, 1]);
    for _ in 0..args.concurrency {
        let (phase, stats, target, next, close) = (
            phase.clone(),
            stats.clone(),
            target.clone(),
            next.clone(),
            close.clone(),
        );
        tokio::task::spawn_local(async move {
            while phase.get() != Phase::Stop {
                let i = next.get();
                next.set(i + 1);
                let started = Instant::now();
                match one_upgrade(&target, sources.nth(i), &close).await {
                    Ok(()) if phase.get() == Phase::Measure => {
                        stats.borrow_mut().record(started.elapsed())
                    }
                    Ok(()) => {}
                    Err(error) => {
                        if phase.get() == Phase::Measure {
                            stats.borrow_mut().error(error);
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        });
    }
    let secs = args.window.run(&phase).await.secs;
    let mut result = stats.borrow().summary(secs);
    result["mode"] = json!("handshake");
    result["concurrency"] = json!(args.concurrency);
    // The connection tasks end with the process, right after this returns.
    emit(&result);
    Ok(())
}

async fn one_upgrade(
    target: &wire::Target,
    source: Option<std::net::IpAddr>,
    close: &[u8],
) -> io::Result<()> {
    let (mut stream, mut buf): (_, BytesMut) = wire::open(target, source).await?;
    stream.write_all(close).await?;
    let mut reader = FrameReader::default();
    let deadline = Instant::now() + Duration::from_secs(5);
    'wait: loop {
        while let Some(seen) = reader.next(&mut buf).map_err(io::Error::other)? {
            if seen.opcode == wire::CLOSE {
                break 'wait;
            }
        }
        match tokio::time::timeout_at(deadline.into(), stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::Error::other("no close reply within 5 s")),
        }
    }
    socket2::SockRef::from(stream.tcp()?).set_linger(Some(Duration::ZERO))?;
    Ok(())
}
