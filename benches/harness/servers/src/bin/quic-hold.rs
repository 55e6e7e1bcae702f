//! A QUIC endpoint that accepts connections and holds them, nothing more: no
//! HTTP/3, no stream, no task per connection. Made with
//! `rapidws::h3::endpoint` and `QuicConfig::default()` (the transport
//! settings `h3_echo` serves with), so that `rapidws-load idle --h3 rfc9220
//! --h3-hold quic` against it measures quinn's own memory per idle
//! connection, the floor under an idle HTTP/3 WebSocket. UDP `--addr`,
//! `--tls-cert` and `--tls-key` required; `QUIC_HOLD_MTU_DISCOVERY=off` in
//! the environment turns `QuicConfig::mtu_discovery` off.

use std::sync::{Arc, Mutex};

fn main() {
    use clap::Parser;
    let args = rapidws_baselines::Args::parse();
    let tls = rapidws_baselines::h3_tls_config(&args, "quic-hold");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async move {
        // `QUIC_HOLD_MTU_DISCOVERY=off`: what MTU discovery's state costs.
        let quic = rapidws::h3::QuicConfig {
            mtu_discovery: std::env::var("QUIC_HOLD_MTU_DISCOVERY").as_deref() != Ok("off"),
            ..Default::default()
        };
        let endpoint = rapidws::h3::endpoint(args.addr, tls, &quic).expect("bind");
        let held = Arc::new(Mutex::new(Vec::new()));
        while let Some(incoming) = endpoint.accept().await {
            let held = held.clone();
            tokio::spawn(async move {
                if let Ok(conn) = incoming.await {
                    held.lock().expect("not poisoned").push(conn);
                }
            });
        }
    });
}
