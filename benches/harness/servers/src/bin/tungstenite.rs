//! tokio-tungstenite with its default configuration. Pongs are queued by the
//! library while reading and flushed with the next write.

use tokio_tungstenite::tungstenite::Message;

fn main() {
    rapidws_baselines::serve(|stream, args| async move {
        let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        let payload = bytes::Bytes::from(vec![0x5a; args.push_size]);
        let is_data = |m: &Message| m.is_text() || m.is_binary();
        let push = || Message::Binary(payload.clone());
        rapidws_baselines::echo_and_push(ws, args, is_data, push).await;
    });
}
