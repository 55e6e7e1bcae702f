//! An interactive client, like websocat's basic use: every line typed is
//! sent as a text message, every message received is printed (text as it
//! is, binary as its length and hex).
//!
//! ```text
//! cargo run --release --example client -- ws://127.0.0.1:9001/ [--header K:V] [--protocol P] [--deflate] [--proxy URL]
//! ```
//!
//! Without `--proxy`, the proxy comes from the environment (`https_proxy`
//! or `HTTPS_PROXY` for wss, `http_proxy` for ws, then `all_proxy`, unless
//! `no_proxy` names the host). `--cafile` trusts a certificate for wss
//! (a self-signed test server); otherwise the web PKI roots. At the end of
//! input the client closes with 1000 and waits for the server's answer. The
//! exit status is 0 after a close with 1000 or 1001, 1 otherwise.

use std::process::ExitCode;

use clap::Parser;
use rapidws::client::{Client, ConnectRequest, Proxy};
use rapidws::{CloseCode, Config, DeflateConfig, OwnedMessage};
use tokio::io::{AsyncBufReadExt, BufReader};

// Only its logging is used here.
#[allow(dead_code)]
mod support;

#[derive(Parser, Debug)]
#[command(about = "rapidws interactive client")]
struct Args {
    /// ws:// or wss:// URL.
    url: String,
    /// An extra header (`Name:Value`), repeatable.
    #[arg(long = "header", value_name = "K:V")]
    headers: Vec<String>,
    /// A subprotocol to offer, repeatable (in order of preference).
    #[arg(long = "protocol", value_name = "P")]
    protocols: Vec<String>,
    /// Offer permessage-deflate with the library's defaults.
    #[arg(long)]
    deflate: bool,
    /// Connect through this proxy: http://[user:pass@]host:port (CONNECT),
    /// socks5://... or socks5h://... (names resolved by the proxy).
    #[arg(long, value_name = "URL")]
    proxy: Option<String>,
    /// For wss: trust this certificate (PEM) instead of the web PKI roots.
    #[arg(long, value_name = "PEM")]
    cafile: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    support::log_to_stderr();
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("client: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let mut config = Config::default();
    if args.deflate {
        config = config.permessage_deflate(DeflateConfig::default());
    }
    let mut client =
        Client::new(config).tls(support::client_tls(args.cafile.as_deref(), "--cafile")?);
    client = match &args.proxy {
        Some(url) => client.proxy(Proxy::new(url).map_err(|e| e.to_string())?),
        None => client.proxy_from_env(),
    };
    let mut request = ConnectRequest::new(args.url.as_str());
    for header in &args.headers {
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| format!("--header {header:?}: expected Name:Value"))?;
        request = request.header(name.trim(), value.trim());
    }
    for protocol in &args.protocols {
        request = request.protocol(protocol);
    }
    let (socket, response) = client.connect(request).await.map_err(|e| e.to_string())?;
    if let Some(protocol) = response.protocol() {
        eprintln!("client: subprotocol {protocol}");
    }
    if let Some(deflate) = response.deflate() {
        eprintln!("client: permessage-deflate {deflate:?}");
    }
    let (mut reader, mut writer) = socket.split();
    let typing = tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if writer.send(line).await.is_err() {
                return;
            }
        }
        let _ = writer.close(CloseCode::NORMAL, "");
    });
    while let Some(received) = reader.recv().await {
        match received {
            Ok(OwnedMessage::Text(text)) => println!("{text}"),
            Ok(OwnedMessage::Binary(data)) => {
                let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
                println!("<binary {} bytes> {hex}", data.len());
            }
            Err(error) => eprintln!("client: {error}"),
        }
    }
    typing.abort();
    let code = reader.close_code().unwrap_or(CloseCode::ABNORMAL);
    match reader.close_reason().filter(|reason| !reason.is_empty()) {
        Some(reason) => eprintln!("client: closed with {} {reason:?}", code.0),
        None => eprintln!("client: closed with {}", code.0),
    }
    Ok(
        if code == CloseCode::NORMAL || code == CloseCode::GOING_AWAY {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
