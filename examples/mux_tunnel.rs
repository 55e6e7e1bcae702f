//! A reverse tunnel on smux streams: an agent that can reach a private
//! service dials out to a public server once; every TCP connection to the
//! server's `--listen` port becomes a stream the server opens on the
//! agent's WebSocket, and the agent connects it to `--to`.
//!
//! ```text
//! cargo run --release --example mux_tunnel -- server --ws-addr 127.0.0.1:9007 --listen 127.0.0.1:9008
//! cargo run --release --example mux_tunnel -- agent --url ws://127.0.0.1:9007/agent --to 127.0.0.1:3000
//! curl http://127.0.0.1:9008/    # reaches 127.0.0.1:3000 through the agent
//! ```
//!
//! With `--tls-cert`/`--tls-key` the server takes `wss://` (the agent's
//! `--cafile` trusts a self-signed certificate). One agent is served at a
//! time: a newer one replaces the older. The agent reconnects when its
//! mux ends.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};
use rapidws::Reject;
use rapidws::mux::{Config, Mux, Side, Stream, Version};
use rapidws::socket::SocketHandler;
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug)]
#[command(about = "a reverse TCP tunnel over smux streams on one WebSocket")]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// The public side: takes the agent's WebSocket at /agent and turns
    /// every TCP connection to --listen into a stream to it.
    Server {
        /// Where the agent connects (WebSocket, path /agent): IP:PORT or
        /// HOST:PORT.
        #[arg(long, value_name = "ADDR", value_parser = support::socket_addr)]
        ws_addr: SocketAddr,
        /// Where the public connects (TCP): IP:PORT or HOST:PORT.
        #[arg(long, value_name = "ADDR", value_parser = support::socket_addr)]
        listen: SocketAddr,
        /// Serve wss with this certificate chain (PEM; with --tls-key).
        #[arg(long, requires = "tls_key", value_name = "PEM")]
        tls_cert: Option<PathBuf>,
        /// The private key for --tls-cert (PEM).
        #[arg(long, requires = "tls_cert", value_name = "PEM")]
        tls_key: Option<PathBuf>,
        /// The smux version; the agent must speak the same.
        #[arg(long, default_value = "2")]
        version: Version,
    },
    /// The private side: dials the server and connects each stream it
    /// opens to --to.
    Agent {
        /// The server's WebSocket (ws:// or wss://, path /agent).
        #[arg(long)]
        url: String,
        /// Where each stream goes (TCP).
        #[arg(long, value_name = "ADDR")]
        to: String,
        /// Trust this certificate (PEM) for a wss:// server.
        #[arg(long, value_name = "PEM")]
        cafile: Option<PathBuf>,
        /// The smux version; the server must speak the same.
        #[arg(long, default_value = "2")]
        version: Version,
    },
}

fn config(version: Version) -> Config {
    Config {
        version: Some(version),
        ..Config::default()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    support::log_to_stderr();
    let result = match Args::parse().role {
        Role::Server {
            ws_addr,
            listen,
            tls_cert,
            tls_key,
            version,
        } => server(ws_addr, listen, tls_cert.zip(tls_key), version).await,
        Role::Agent {
            url,
            to,
            cafile,
            version,
        } => agent(url, to, cafile, version).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

/// The agent's mux, once one is connected.
type Current = Arc<Mutex<Option<Mux>>>;

async fn server(
    ws_addr: SocketAddr,
    listen: SocketAddr,
    tls: Option<(PathBuf, PathBuf)>,
    version: Version,
) -> Result<(), String> {
    let public = TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on --listen {listen}: {error}"))?;
    let current: Current = Arc::default();
    let agents = current.clone();
    let handler = SocketHandler::with_upgrade(
        |request, _| match request.path() {
            "/agent" => Ok(()),
            path => Err(Reject::new(
                404,
                format!("no endpoint at {path}: agents connect to /agent"),
            )),
        },
        move |socket, ()| {
            let agents = agents.clone();
            async move {
                let mux = Mux::over_websocket(socket, Side::Acceptor, config(version));
                tracing::info!("agent connected");
                if let Some(older) = agents.lock().unwrap().replace(mux.clone()) {
                    tracing::info!("a newer agent replaces the connected one");
                    tokio::spawn(async move { older.close().await });
                }
                let ended = mux.closed().await;
                tracing::info!(?ended, "agent session ended");
                let mut slot = agents.lock().unwrap();
                if slot.as_ref().is_some_and(|held| held.is_closed()) {
                    *slot = None;
                }
            }
        },
    );
    let server = rapidws::tokio::Server::bind(ws_addr, handler, rapidws::Config::default())
        .await
        .map_err(|error| format!("cannot listen on --ws-addr {ws_addr}: {error}"))?;
    let server = match tls {
        Some((cert, key)) => server.tls(support::tls_server_config(&cert, &key)?),
        None => server,
    };
    tracing::info!(%ws_addr, %listen, "mux_tunnel server: agents at /agent, the public at --listen");
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match public.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let agent = current.lock().unwrap().clone();
            let Some(agent) = agent else {
                tracing::warn!(%peer, "no agent connected: connection closed");
                continue;
            };
            tokio::spawn(async move {
                match agent.open_stream().await {
                    Ok(stream) => splice(stream, tcp).await,
                    Err(error) => {
                        tracing::warn!(%peer, %error, "cannot open a stream to the agent")
                    }
                }
            });
        }
    });
    server.serve().await.map_err(|error| error.to_string())
}

async fn agent(
    url: String,
    to: String,
    cafile: Option<PathBuf>,
    version: Version,
) -> Result<(), String> {
    let client = rapidws::client::Client::new(rapidws::Config::default())
        .tls(support::client_tls(cafile.as_deref(), "--cafile")?);
    let mut backoff = Duration::from_millis(100);
    loop {
        let socket = match client.connect(url.as_str()).await {
            Ok((socket, _)) => socket,
            Err(error) => {
                tracing::warn!(%error, ?backoff, "cannot reach the server; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        tracing::info!(%url, to, "agent connected");
        let mux = Mux::over_websocket(socket, Side::Dialer, config(version));
        while let Some(stream) = mux.accept_stream().await {
            let to = to.clone();
            tokio::spawn(async move {
                match TcpStream::connect(&to).await {
                    Ok(tcp) => splice(stream, tcp).await,
                    // The stream ends (dropped: our FIN); the mux stays.
                    Err(error) => tracing::warn!(to, %error, "cannot connect --to"),
                }
            });
        }
        let ended = mux.closed().await;
        tracing::warn!(?ended, "session ended; reconnecting");
        tokio::time::sleep(backoff).await;
    }
}

/// Copies both ways until both ends have finished; each side's end of
/// input becomes the other's FIN.
async fn splice(mut stream: Stream, mut tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    if let Err(error) = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await {
        tracing::debug!(id = stream.id(), %error, "tunnelled connection ended early");
    }
}
