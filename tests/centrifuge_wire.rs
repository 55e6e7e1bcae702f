//! Centrifugo's wire as the centrifugo_compat example speaks it, seen by a
//! plain WebSocket client (tokio-tungstenite): connect and subscribe in one
//! frame answered in order, the connect reply's `ping` and `pong`, the
//! subscribe reply's position, publication pushes with their offsets, the
//! server's `{}` pings, presence (and through the server HTTP API), the Protobuf subprotocol, and what ends a
//! connection (a malformed frame, a command before connect: 3501) or
//! refuses an upgrade (another path: 404); join and leave pushes to the
//! subscribers that ask for them; a client's publications with its info.
//! Subscription tokens (made with the jsonwebtoken crate): the subscribe
//! reply's `expires` and `ttl`, `sub_refresh` extending a subscription past
//! its first token, the bad ones refused as Centrifugo refuses them, and
//! one never refreshed ended with an unsubscribe push (2501) while its
//! connection stays.

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
    // With its publisher, as Centrifugo pushes a client's publication.
    let client_id = connect["connect"]["client"].clone();
    let publisher = json!({"user": "", "client": client_id});
    assert_eq!(
        got[1],
        json!({"push": {"channel": "c", "pub": {"data": {"x": 1}, "info": publisher, "offset": 1}}})
    );

    // The server's pings, answered: the connection stays over three.
    for _ in 0..3 {
        assert_eq!(next(&mut client).await, Ws::text("{}"));
        client.send(Ws::text("{}")).await.unwrap();
    }
    // Presence: this client, in a channel it is in; not in another one.
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
    let kept = json!({"publications": [{"data": {"x": 1}, "info": publisher, "offset": 1}], "epoch": epoch, "offset": 1});
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

const SECRET: &str = "sub-secret";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token with these claims, signed with `secret`.
fn jwt(claims: Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// A subscription token of `user` for `channel`, expiring `secs` from now.
fn sub_token(user: &str, channel: &str, secs: i64, info: Value) -> String {
    let exp = now().checked_add_signed(secs).unwrap();
    jwt(
        json!({"sub": user, "channel": channel, "exp": exp, "info": info}),
        SECRET,
    )
}

/// Connects as `user` (a connection token with `info`, lasting 10
/// minutes) and subscribes to each channel with its token; the client,
/// its id and the subscribe replies.
async fn with_tokens(
    url: &str,
    user: &str,
    subs: &[(&str, String)],
) -> (Client, String, Vec<Value>) {
    let (mut client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let token = jwt(
        json!({"sub": user, "exp": now() + 600, "info": {"name": user}}),
        SECRET,
    );
    let mut batch = json!({"id": 1, "connect": {"token": token}}).to_string();
    for (n, (channel, token)) in subs.iter().enumerate() {
        let subscribe = json!({"id": n + 2, "subscribe": {"channel": channel, "token": token}});
        batch.push('\n');
        batch.push_str(&subscribe.to_string());
    }
    client.send(Ws::text(batch)).await.unwrap();
    let connect = next_json(&mut client).await;
    let id = connect["connect"]["client"]
        .as_str()
        .unwrap_or_else(|| panic!("{connect}"))
        .to_owned();
    let mut replies = Vec::new();
    for _ in subs {
        replies.push(next_json(&mut client).await);
    }
    (client, id, replies)
}

async fn request(client: &mut Client, command: Value) -> Value {
    client.send(Ws::text(command.to_string())).await.unwrap();
    next_json(client).await
}

async fn subscription_tokens_on(backend: &str) {
    let args = [
        "--backend",
        backend,
        "--ping-secs",
        "1",
        "--jwt-secret",
        SECRET,
        "--expired-sub-grace-secs",
        "1",
        "--client-publish",
        "--api-key",
        "k",
    ];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let url = format!("ws://{addr}/connection/websocket");

    // Tokens that last 2 s: the replies say so.
    let subs = [
        ("kept", sub_token("ann", "kept", 2, json!({"seat": 1}))),
        (
            "lapsing",
            sub_token("ann", "lapsing", 2, json!({"seat": 9})),
        ),
    ];
    let (mut ann, ann_id, replies) = with_tokens(&url, "ann", &subs).await;
    for reply in &replies {
        let result = &reply["subscribe"];
        assert_eq!(result["expires"], true, "{reply}");
        let ttl = result["ttl"].as_u64().unwrap_or(0);
        assert!((1..=2).contains(&ttl), "{reply}");
    }

    // What does not end the connection: an expired token (109), none
    // (107), a channel it is not in (103).
    let expired = sub_token("ann", "kept", -10, json!(null));
    let answer = request(
        &mut ann,
        json!({"id": 10, "sub_refresh": {"channel": "kept", "token": expired}}),
    )
    .await;
    assert_eq!(answer["error"]["code"], 109, "{answer}");
    let answer = request(
        &mut ann,
        json!({"id": 11, "sub_refresh": {"channel": "kept", "token": ""}}),
    )
    .await;
    assert_eq!(answer["error"]["code"], 107, "{answer}");
    let elsewhere = sub_token("ann", "elsewhere", 30, json!(null));
    let answer = request(
        &mut ann,
        json!({"id": 12, "sub_refresh": {"channel": "elsewhere", "token": elsewhere}}),
    )
    .await;
    assert_eq!(answer["error"]["code"], 103, "{answer}");

    // A good one for "kept" (with new channel info): 30 s more.
    let fresh = sub_token("ann", "kept", 30, json!({"seat": 2}));
    let answer = request(
        &mut ann,
        json!({"id": 13, "sub_refresh": {"channel": "kept", "token": fresh}}),
    )
    .await;
    assert_eq!(answer["id"], 13, "{answer}");
    assert_eq!(answer["sub_refresh"]["expires"], true, "{answer}");
    let ttl = answer["sub_refresh"]["ttl"].as_u64().unwrap_or(0);
    assert!((29..=30).contains(&ttl), "{answer}");

    // "lapsing" was not refreshed: an unsubscribe push once its grace is
    // up, and nothing else before it but the pings, answered meanwhile.
    let unsubscribed = next_json(&mut ann).await;
    assert_eq!(
        unsubscribed,
        json!({"push": {"channel": "lapsing", "unsubscribe": {"code": 2501, "reason": "subscription expired"}}})
    );

    // Past both first tokens' ttl: "kept" still gets its publications,
    // "lapsing" none. An API publication has no publisher; ann's own
    // carries ann's info and the channel info of its latest token.
    for (channel, n) in [("lapsing", 1), ("kept", 2)] {
        let body = json!({"channel": channel, "data": {"n": n}});
        let answer = centrifugo::api(addr, "k", "publish", &body).await;
        assert_eq!(answer, json!({"result": {}}));
    }
    ann.send(Ws::text(
        json!({"id": 14, "publish": {"channel": "kept", "data": {"n": 3}}}).to_string(),
    ))
    .await
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_json(&mut ann).await);
    }
    seen.sort_by_key(|v| v.get("id").is_none());
    let publisher = json!({
        "user": "ann",
        "client": ann_id,
        "conn_info": {"name": "ann"},
        "chan_info": {"seat": 2},
    });
    assert_eq!(
        seen,
        [
            json!({"id": 14, "publish": {}}),
            json!({"push": {"channel": "kept", "pub": {"data": {"n": 2}, "offset": 1}}}),
            json!({"push": {"channel": "kept", "pub": {"data": {"n": 3}, "info": publisher, "offset": 2}}}),
        ]
    );
    // Subscribed no more, so it may subscribe again, with a new token.
    let again = sub_token("ann", "lapsing", 30, json!(null));
    let answer = request(
        &mut ann,
        json!({"id": 15, "subscribe": {"channel": "lapsing", "token": again}}),
    )
    .await;
    assert_eq!(answer["id"], 15, "{answer}");
    assert_eq!(answer["subscribe"]["expires"], true, "{answer}");

    // What ends the connection (3500, invalid token): a token for another
    // channel, another user's, one signed with another secret.
    let forged = jwt(
        json!({"sub": "bob", "channel": "room", "exp": now() + 30}),
        "guess",
    );
    for bad in [
        sub_token("bob", "other", 30, json!(null)),
        sub_token("eve", "room", 30, json!(null)),
        forged,
    ] {
        let subs = [("room", sub_token("bob", "room", 30, json!(null)))];
        let (mut bob, _, replies) = with_tokens(&url, "bob", &subs).await;
        assert_eq!(replies[0]["subscribe"]["expires"], true, "{}", replies[0]);
        bob.send(Ws::text(
            json!({"id": 3, "sub_refresh": {"channel": "room", "token": bad}}).to_string(),
        ))
        .await
        .unwrap();
        assert_eq!(close_code(&mut bob).await, 3500);
    }
    // ann was not disturbed: still here.
    let answer = request(&mut ann, json!({"id": 16, "ping": {}})).await;
    assert_eq!(answer, json!({"id": 16, "ping": {}}));
}

#[tokio::test]
async fn subscription_tokens_on_tokio() {
    subscription_tokens_on("tokio").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn subscription_tokens_on_uring() {
    subscription_tokens_on("uring").await;
}
