//! tokio-tungstenite with its default configuration. Pongs are queued by the
//! library while reading and flushed with the next write.

use futures_util::{SinkExt, StreamExt};
use rapidws_baselines::{next_push, push_ticker};
use tokio_tungstenite::tungstenite::Message;

fn main() {
    rapidws_baselines::serve(|stream, args| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        let mut ticker = push_ticker(&args);
        let push = bytes::Bytes::from(vec![0x5a; args.push_size]);
        loop {
            tokio::select! {
                message = ws.next() => match message {
                    Some(Ok(message)) if message.is_text() || message.is_binary() => {
                        if ws.send(message).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                },
                _ = next_push(&mut ticker) => {
                    if ws.send(Message::Binary(push.clone())).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}
