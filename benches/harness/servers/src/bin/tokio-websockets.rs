//! tokio-websockets with its default configuration and limits.

use futures_util::{SinkExt, StreamExt};
use rapidws_baselines::{next_push, push_ticker};
use tokio_websockets::{Message, ServerBuilder};

fn main() {
    rapidws_baselines::serve(|stream, args| async move {
        let Ok((_request, mut ws)) = ServerBuilder::new().accept(stream).await else {
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
                    if ws.send(Message::binary(push.clone())).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}
