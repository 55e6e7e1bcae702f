//! Centrifugo's wire as the centrifugo_compat example speaks it, seen by a
//! plain WebSocket client (tokio-tungstenite): connect and subscribe in one
//! frame answered in order, the connect reply's `ping` and `pong`, the
//! subscribe reply's position, publication pushes with their offsets, the
//! server's `{}` pings, presence (and through the server HTTP API), the Protobuf subprotocol, and what ends a
//! connection (a malformed frame, a command before connect: 3501) or
//! refuses an upgrade (another path: 404); join and leave pushes to the
//! subscribers that ask for them.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Ws;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn server(backend: &str) -> (Child, SocketAddr) {
    let args = [
        "--backend",
        backend,
        "--history",
        "5",
        "--ping-secs",
        "1",
        "--client-publish",
        "--presence",
        "--join-leave",
        "--api-key",
        "k",
    ];
    let (child, addr) = start_example("centrifugo_compat", &args).await;
    (child, addr)
}

async fn next(client: &mut Client) -> Ws {
    tokio::time::timeout(Duration::from_secs(5), client.next())
        .await
        .expect("a message within 5 s")
        .expect("the connection is open")
        .expect("a frame")
}

/// The next reply or push, past (and answering) the server's pings.
async fn next_json(client: &mut Client) -> Value {
    loop {
        match next(client).await {
            Ws::Text(text) if text.as_str() == "{}" => client.send(Ws::text("{}")).await.unwrap(),
            Ws::Text(text) => {
                return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            }
            other => panic!("not text: {other:?}"),
        }
    }
}

async fn close_code(client: &mut Client) -> u16 {
    loop {
        if let Ws::Close(frame) = next(client).await {
            return frame.map_or(0, |f| f.code.into());
        }
    }
}

async fn json_wire_on(backend: &str) {
    let (_server, addr) = server(backend).await;
    let url = format!("ws://{addr}/connection/websocket");
    let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    // As the JS SDK sends them: one frame, a flag the server does not know.
    let batch = "{\"id\":1,\"connect\":{\"name\":\"js\"}}\n{\"id\":2,\"subscribe\":{\"channel\":\"c\",\"flag\":3}}";
    client.send(Ws::text(batch)).await.unwrap();
    let connect = next_json(&mut client).await;
    assert_eq!(
        (connect["id"].clone(), connect["connect"]["ping"].clone()),
        (json!(1), json!(1)),
        "{connect}"
    );
    assert_eq!(connect["connect"]["pong"], true, "{connect}");
    assert!(
        connect["connect"]["client"]
            .as_str()
            .is_some_and(|c| c.len() == 36),
        "{connect}"
    );
    let subscribe = next_json(&mut client).await;
    assert_eq!(subscribe["id"], 2, "{subscribe}");
    let result = &subscribe["subscribe"];
    assert_eq!(
        (result["recoverable"].clone(), result["positioned"].clone()),
        (json!(true), json!(true)),
        "{subscribe}"
    );
    let epoch = result["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16, "{subscribe}");
    assert_eq!(
        result.get("offset"),
        None,
        "offset 0 is left out: {subscribe}"
    );

    // A publish: its reply, and the push with its offset.
    client
        .send(Ws::text(
            "{\"id\":3,\"publish\":{\"channel\":\"c\",\"data\":{\"x\": 1}}}",
        ))
        .await
        .unwrap();
    let mut got = [next_json(&mut client).await, next_json(&mut client).await];
    got.sort_by_key(|v| v.get("id").is_none());
    assert_eq!(got[0], json!({"id": 3, "publish": {}}));
    assert_eq!(
        got[1],
        json!({"push": {"channel": "c", "pub": {"data": {"x": 1}, "offset": 1}}})
    );

    // The server's pings, answered: the connection stays over three.
    for _ in 0..3 {
        assert_eq!(next(&mut client).await, Ws::text("{}"));
        client.send(Ws::text("{}")).await.unwrap();
    }
    // Presence: this client, in a channel it is in; not in another one.
    let client_id = connect["connect"]["client"].clone();
    client.send(Ws::text("{\"id\":5,\"presence\":{\"channel\":\"c\"}}\n{\"id\":6,\"presence_stats\":{\"channel\":\"c\"}}\n{\"id\":7,\"presence\":{\"channel\":\"d\"}}")).await.unwrap();
    let me = json!({"user": "", "client": client_id});
    let mut presence = json!({"id": 5, "presence": {"presence": {}}});
    presence["presence"]["presence"][client_id.as_str().unwrap()] = me.clone();
    assert_eq!(next_json(&mut client).await, presence);
    assert_eq!(
        next_json(&mut client).await,
        json!({"id": 6, "presence_stats": {"num_clients": 1, "num_users": 1}})
    );
    assert_eq!(next_json(&mut client).await["error"]["code"], 103);
    // The same through the server HTTP API.
    let answer = centrifugo::api(addr, "k", "presence_stats", &json!({"channel": "c"})).await;
    assert_eq!(
        answer,
        json!({"result": {"num_clients": 1, "num_users": 1}})
    );
    let answer = centrifugo::api(addr, "k", "presence", &json!({"channel": "c"})).await;
    assert_eq!(
        answer["result"]["presence"][client_id.as_str().unwrap()],
        me
    );

    // A history of what was kept, then a malformed frame: 3501.
    client
        .send(Ws::text(
            "{\"id\":4,\"history\":{\"channel\":\"c\",\"limit\":-1}}",
        ))
        .await
        .unwrap();
    let history = next_json(&mut client).await;
    let kept =
        json!({"publications": [{"data": {"x": 1}, "offset": 1}], "epoch": epoch, "offset": 1});
    assert_eq!(history, json!({"id": 4, "history": kept}));
    client.send(Ws::text("{\"id\":")).await.unwrap();
    assert_eq!(close_code(&mut client).await, 3501);

    // A command before connect: 3501 too.
    let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    client
        .send(Ws::text("{\"id\":1,\"subscribe\":{\"channel\":\"c\"}}"))
        .await
        .unwrap();
    assert_eq!(close_code(&mut client).await, 3501);

    // Another path is not Centrifugo's.
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/other"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("404"), "{refused}");
}

async fn protobuf_wire_on(backend: &str) {
    let (_server, addr) = server(backend).await;
    let mut request = format!("ws://{addr}/connection/websocket")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "centrifuge-protobuf".parse().unwrap(),
    );
    let (mut client, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "centrifuge-protobuf"
    );
    // Command { id: 1, connect: {} }, behind its length.
    client
        .send(Ws::binary(vec![4, 0x08, 0x01, 0x22, 0x00]))
        .await
        .unwrap();
    let Ws::Binary(reply) = next(&mut client).await else {
        panic!("a binary reply")
    };
    // Reply { id: 1 (08 01), connect (field 5: 2a) {...} } behind its length.
    assert_eq!(usize::from(reply[0]), reply.len() - 1, "{reply:?}");
    assert_eq!(&reply[1..4], [0x08, 0x01, 0x2a], "{reply:?}");
    // The ping: an empty reply (length 0); answered with an empty command.
    for _ in 0..2 {
        assert_eq!(next(&mut client).await, Ws::binary(vec![0]));
        client.send(Ws::binary(vec![0])).await.unwrap();
    }
    // A length past the frame's end: 3501.
    client.send(Ws::binary(vec![9, 0x08])).await.unwrap();
    assert_eq!(close_code(&mut client).await, 3501);
}

#[tokio::test]
async fn json_wire_on_tokio() {
    json_wire_on("tokio").await;
}

#[tokio::test]
async fn protobuf_wire_on_tokio() {
    protobuf_wire_on("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn json_wire_on_uring() {
    json_wire_on("uring").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn protobuf_wire_on_uring() {
    protobuf_wire_on("uring").await;
}

/// Connects and subscribes to `channel` (asking for joins and leaves or
/// not); the client and its id, past the connect and subscribe replies.
async fn subscribed(url: &str, channel: &str, join_leave: bool) -> (Client, String) {
    let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let batch = format!(
        "{{\"id\":1,\"connect\":{{}}}}\n{{\"id\":2,\"subscribe\":{{\"channel\":\"{channel}\",\"join_leave\":{join_leave}}}}}"
    );
    client.send(Ws::text(batch)).await.unwrap();
    let connect = next_json(&mut client).await;
    let id = connect["connect"]["client"].as_str().unwrap().to_owned();
    let subscribe = next_json(&mut client).await;
    assert_eq!(subscribe["id"], 2, "{subscribe}");
    (client, id)
}

fn event(kind: &str, channel: &str, client: &str) -> Value {
    json!({"push": {"channel": channel, kind: {"info": {"user": "", "client": client}}}})
}

async fn joins_and_leaves_on(backend: &str) {
    let (_server, addr) = server(backend).await;
    let url = format!("ws://{addr}/connection/websocket");
    // Who asks hears its own join, then everyone else's.
    let (mut watcher, me) = subscribed(&url, "room", true).await;
    assert_eq!(next_json(&mut watcher).await, event("join", "room", &me));
    let (mut quiet, other) = subscribed(&url, "room", false).await;
    assert_eq!(next_json(&mut watcher).await, event("join", "room", &other));
    // An unsubscribe is a leave.
    quiet
        .send(Ws::text(
            "{\"id\":3,\"unsubscribe\":{\"channel\":\"room\"}}",
        ))
        .await
        .unwrap();
    assert_eq!(
        next_json(&mut quiet).await,
        json!({"id": 3, "unsubscribe": {}})
    );
    assert_eq!(
        next_json(&mut watcher).await,
        event("leave", "room", &other)
    );
    // So is a connection's end; another channel's events go elsewhere.
    let (elsewhere, _) = subscribed(&url, "hall", true).await;
    let (gone, third) = subscribed(&url, "room", false).await;
    assert_eq!(next_json(&mut watcher).await, event("join", "room", &third));
    drop(gone);
    assert_eq!(
        next_json(&mut watcher).await,
        event("leave", "room", &third)
    );
    drop(elsewhere);
    // The one that did not ask heard nothing, and nobody may name the
    // events' own topics.
    let topic = "\\u0001join_leave:room";
    quiet
        .send(Ws::text(format!(
            "{{\"id\":4,\"subscribe\":{{\"channel\":\"{topic}\"}}}}\n{{\"id\":5,\"publish\":{{\"channel\":\"{topic}\",\"data\":{{}}}}}}"
        )))
        .await
        .unwrap();
    assert_eq!(next_json(&mut quiet).await["error"]["code"], 107);
    assert_eq!(next_json(&mut quiet).await["error"]["code"], 107);
}

#[tokio::test]
async fn joins_and_leaves_on_tokio() {
    joins_and_leaves_on("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn joins_and_leaves_on_uring() {
    joins_and_leaves_on("uring").await;
}
