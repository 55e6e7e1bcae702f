//! sockudo-ws's pub/sub (`sockudo_ws::pubsub::PubSub`) in the harness's
//! fan-out protocol: `/ws?topics=a,b` subscribes at open (at `/ws`, like
//! `sockudo-axum`), and a text message
//! `<topic>\n<payload>` publishes `<payload>` to `<topic>`. Used as its
//! README shows: each connection is a subscriber with an unbounded channel
//! (`create_subscriber`), a task writes what the channel brings through the
//! socket's writer half, and the reader half publishes. On its axum
//! integration, with defaults.

use std::sync::Arc;

use axum::extract::RawQuery;
use axum::routing::get;
use sockudo_ws::Message;
use sockudo_ws::axum_integration::{WebSocket, WebSocketUpgrade};
use sockudo_ws::pubsub::PubSub;

fn main() {
    let pubsub = Arc::new(PubSub::new());
    rapidws_baselines::serve_axum(move |_| {
        axum::Router::new().route(
            "/ws",
            get(
                move |RawQuery(query): RawQuery, upgrade: WebSocketUpgrade| async move {
                    let topics = topics(query.as_deref());
                    upgrade.on_upgrade(move |socket| serve(pubsub, topics, socket))
                },
            ),
        )
    });
}

/// The topics of `topics=a,b`.
fn topics(query: Option<&str>) -> Vec<String> {
    query
        .and_then(|q| q.strip_prefix("topics="))
        .unwrap_or("")
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn serve(pubsub: Arc<PubSub>, topics: Vec<String>, socket: WebSocket) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let id = pubsub.create_subscriber(tx);
    for topic in &topics {
        pubsub.subscribe(id, topic);
    }
    let (mut reader, mut writer) = socket.split();
    let writes = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if writer.send(message).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(message)) = reader.next().await {
        if let Message::Text(text) = message
            && let Some(at) = text.iter().position(|&b| b == b'\n')
            && let Ok(topic) = std::str::from_utf8(&text[..at])
        {
            pubsub.publish(topic, Message::Text(text.slice(at + 1..)));
        }
    }
    pubsub.remove_subscriber(id);
    writes.abort();
}
