//! sockudo-ws's HTTP/3 server (`WebSocketServer::<Http3>`, feature `http3`)
//! with its defaults, as its `http3_echo` example serves: every WebSocket
//! echoed (and pushed to, in push mode) on UDP `--addr`, with `--tls-cert`
//! and `--tls-key` (required). It takes sockudo-ws's own dialect, not RFC
//! 9220's (`rapidws-load --h3 sockudo`: `:protocol` webtransport; h3 0.0.8
//! underneath refuses `:protocol` websocket).

use sockudo_ws::{Config, Http3, Message, WebSocketServer};

fn main() {
    use clap::Parser;
    let args = rapidws_baselines::Args::parse();
    let tls = rapidws_baselines::h3_tls_config(&args, "sockudo-h3");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async move {
        let server = WebSocketServer::<Http3>::bind(args.addr, tls, Config::builder().build())
            .await
            .expect("bind");
        server
            .serve(move |socket, _request| {
                let args = args.clone();
                async move {
                    let payload = bytes::Bytes::from(vec![0x5a; args.push_size]);
                    let is_data = |m: &Message| matches!(m, Message::Text(_) | Message::Binary(_));
                    let push = || Message::Binary(payload.clone());
                    rapidws_baselines::echo_and_push(socket, args, is_data, push).await;
                }
            })
            .await
            .expect("serve");
    });
}
