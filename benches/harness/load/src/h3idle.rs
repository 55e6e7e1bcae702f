//! `h3-idle`: opens N WebSockets over HTTP/3 (RFC 9220), each on a QUIC
//! connection of its own, checks each with a message echoed back, and
//! holds them, so that a server's memory per idle HTTP/3 WebSocket (quinn's
//! connection state included) can be read from its RSS. Each line on stdin
//! is a command: `ping` sends a ping on every WebSocket and reports how
//! many answered; `exit` (or end of input) closes them all.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use rapidws::h3::{Client, DataStream, quinn};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::emit;
use crate::wire::{FrameReader, masked_frame};

#[derive(Args, Debug, Clone)]
pub struct H3IdleArgs {
    /// The HTTP/3 server (UDP).
    #[arg(long, default_value = "127.0.0.1:9443")]
    pub addr: SocketAddr,
    /// The WebSocket's path.
    #[arg(long, default_value = "/ws")]
    pub path: String,
    /// The certificate (PEM) the server's must be, for `localhost`.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: PathBuf,
    /// WebSockets (and QUIC connections) to open.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Openings in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
}

/// One WebSocket held: its QUIC connection, the HTTP/3 client (whose
/// control stream lives with the connection) and its stream.
struct Held {
    conn: quinn::Connection,
    _client: Client,
    stream: DataStream,
    input: BytesMut,
}

pub async fn run(args: H3IdleArgs) -> io::Result<()> {
    let endpoint = endpoint(&args)?;
    let started = Instant::now();
    let held = Rc::new(RefCell::new(Vec::with_capacity(args.conns)));
    let errors = Rc::new(RefCell::new((0usize, None::<String>)));
    let next = Rc::new(RefCell::new(0usize));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (endpoint, args, held, errors, next) = (
            endpoint.clone(),
            args.clone(),
            held.clone(),
            errors.clone(),
            next.clone(),
        );
        workers.push(tokio::task::spawn_local(async move {
            loop {
                {
                    let mut next = next.borrow_mut();
                    if *next >= args.conns {
                        return;
                    }
                    *next += 1;
                }
                match open(&endpoint, &args).await {
                    Ok(one) => held.borrow_mut().push(one),
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
    let (failed, first_error) = errors.borrow().clone();
    emit(&json!({
        "event": "connected",
        "connected": held.borrow().len(),
        "errors": failed,
        "first_error": first_error,
        "secs": started.elapsed().as_secs_f64(),
    }));
    let mut held = held.take();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "ping" => {
                let answered = ping_all(&mut held).await;
                emit(&json!({"event": "ping", "answered": answered, "of": held.len()}));
            }
            "exit" => break,
            _ => {}
        }
    }
    for one in &held {
        one.conn.close(0x100u32.into(), b"");
    }
    endpoint.wait_idle().await;
    Ok(())
}

fn endpoint(args: &H3IdleArgs) -> io::Result<quinn::Endpoint> {
    let tls = crate::wire::tls_client(&args.tls_ca)?;
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(io::Error::other)?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().expect("an address"))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    // Held for as long as asked: QUIC keepalives under the server's idle
    // timeout (30 s by default).
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_secs(10)));
    config.transport_config(Arc::new(transport));
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// Opens one WebSocket and checks it with an echo.
async fn open(endpoint: &quinn::Endpoint, args: &H3IdleArgs) -> io::Result<Held> {
    let conn = endpoint
        .connect(args.addr, "localhost")
        .map_err(io::Error::other)?
        .await?;
    let client = Client::new(conn.clone()).await?;
    let authority = format!("localhost:{}", args.addr.port());
    let (response, mut stream) = client.open_websocket(&authority, &args.path, &[]).await?;
    if response.status() != 200 {
        return Err(io::Error::other(format!("status {}", response.status())));
    }
    stream
        .write_all(&masked_frame(0x1, b"hello", [1, 2, 3, 4]))
        .await?;
    let mut input = BytesMut::with_capacity(64);
    let mut reader = FrameReader::default();
    loop {
        if let Some(seen) = reader.next(&mut input).map_err(io::Error::other)? {
            if seen.opcode == 0x1 && seen.len == 5 {
                break;
            }
            continue;
        }
        if stream.read_buf(&mut input).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    // An idle connection holds no buffer of ours.
    Ok(Held {
        conn,
        _client: client,
        stream,
        input: BytesMut::new(),
    })
}

/// Pings every WebSocket; how many answered with a pong within 20 s.
async fn ping_all(held: &mut [Held]) -> usize {
    let ping = masked_frame(0x9, b"", [5, 6, 7, 8]);
    let mut answered = 0;
    for one in held.iter_mut() {
        let answer = async {
            one.stream.write_all(&ping).await?;
            let mut reader = FrameReader::default();
            loop {
                if let Some(seen) = reader.next(&mut one.input).map_err(io::Error::other)?
                    && seen.opcode == 0xA
                {
                    return io::Result::Ok(());
                }
                if one.stream.read_buf(&mut one.input).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
        };
        if matches!(
            tokio::time::timeout(Duration::from_secs(20), answer).await,
            Ok(Ok(()))
        ) {
            answered += 1;
        }
    }
    answered
}
