//! tokio-websockets with its default configuration and limits; wss over
//! tokio-rustls with `--tls-cert` and `--tls-key`.

use tokio_websockets::{Message, ServerBuilder};

fn main() {
    // With --tls-cert/--tls-key: wss, over tokio-rustls (the harness's wss peer).
    rapidws_baselines::serve_maybe_tls(|stream, args| async move {
        let Ok((_request, ws)) = ServerBuilder::new().accept(stream).await else {
            return;
        };
        let payload = bytes::Bytes::from(vec![0x5a; args.push_size]);
        let is_data = |m: &Message| m.is_text() || m.is_binary();
        let push = || Message::binary(payload.clone());
        rapidws_baselines::echo_and_push(ws, args, is_data, push).await;
    });
}
