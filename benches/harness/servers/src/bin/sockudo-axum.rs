//! sockudo-ws's axum integration (`sockudo_ws::axum_integration`) with its
//! defaults: an `axum::serve` app whose `/ws` route upgrades and echoes (and
//! pushes, in push mode).

use axum::routing::get;
use sockudo_ws::Message;
use sockudo_ws::axum_integration::WebSocketUpgrade;

fn main() {
    rapidws_baselines::serve_axum(|args| {
        axum::Router::new().route(
            "/ws",
            get(move |upgrade: WebSocketUpgrade| async move {
                upgrade.on_upgrade(move |socket| async move {
                    let payload = bytes::Bytes::from(vec![0x5a; args.push_size]);
                    let is_data = |m: &Message| matches!(m, Message::Text(_) | Message::Binary(_));
                    let push = || Message::Binary(payload.clone());
                    rapidws_baselines::echo_and_push(socket, args, is_data, push).await;
                })
            }),
        )
    });
}
