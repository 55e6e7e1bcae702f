//! The Centrifugo codec's Protobuf replies and pushes, read back by an
//! independent decoder: Python's protobuf, compiled from
//! tests/centrifuge/client.proto (tests/centrifuge/setup.sh installs it
//! into tests/centrifuge/.venv on first use). What it reads is compared
//! field by field, in protobuf's JSON mapping (64-bit integers as strings,
//! bytes as base64).

use std::io::Write;
use std::process::{Command, Stdio};

use rapidws::Bytes;
use rapidws::centrifuge::*;
use serde_json::{Value, json};

fn python() -> String {
    let setup = format!("{}/tests/centrifuge/setup.sh", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(setup)
        .output()
        .expect("run setup.sh");
    assert!(
        out.status.success(),
        "setup.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Each frame as the peer decoded it: a list of replies.
fn decoded_by_python(frames: &[Vec<u8>]) -> Vec<Value> {
    let peer = format!("{}/tests/centrifuge/peer.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(python())
        .args([peer.as_str(), "replies"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start peer.py");
    let mut stdin = child.stdin.take().unwrap();
    for frame in frames {
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(stdin, "{hex}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[test]
fn python_reads_every_reply_and_push_as_written() {
    let info = ClientInfo {
        user: "u1".into(),
        client: "c1".into(),
        conn_info: Bytes::from_static(b"{\"a\":1}"),
        chan_info: Bytes::from_static(&[0, 255]),
    };
    let publication = |offset: u64, data: &'static [u8]| Publication {
        data: Bytes::from_static(data),
        offset,
        ..Default::default()
    };
    let sub = SubscribeResult {
        recoverable: true,
        positioned: true,
        epoch: "ep".into(),
        offset: u64::MAX,
        publications: vec![publication(u64::MAX - 1, b"x"), publication(u64::MAX, b"")],
        recovered: true,
        was_recovering: true,
        expires: true,
        ttl: 60,
        data: Bytes::from_static(b"d"),
    };
    let connect = ConnectResult {
        client: "c1".into(),
        version: "0.1".into(),
        ping: 25,
        pong: true,
        expires: true,
        ttl: 3600,
        data: Bytes::from_static(b"hi"),
        subs: vec![("news".into(), sub.clone())],
        session: "s".into(),
        node: "n".into(),
    };
    let full = Publication {
        data: Bytes::from(vec![7u8; 300]),
        info: Some(info.clone()),
        offset: 1,
        tags: vec![("k".into(), "v".into())],
        time: -5,
    };
    let push = |body| {
        Reply::push(Push {
            channel: "ch".into(),
            body,
        })
    };
    // One frame of many replies, then one frame for each push.
    let mut batch = Vec::new();
    for reply in [
        Reply {
            id: 1,
            body: ReplyBody::Connect(connect),
        },
        Reply {
            id: 2,
            body: ReplyBody::Subscribe(sub),
        },
        Reply::error(3, Error::new(error::INTERNAL)),
        Reply {
            id: 4,
            body: ReplyBody::Unsubscribe,
        },
        Reply {
            id: 5,
            body: ReplyBody::Publish,
        },
        Reply {
            id: 6,
            body: ReplyBody::Presence(vec![("c1".into(), info.clone())]),
        },
        Reply {
            id: 7,
            body: ReplyBody::PresenceStats {
                num_clients: 3,
                num_users: 2,
            },
        },
        Reply {
            id: 8,
            body: ReplyBody::History(HistoryResult {
                publications: vec![full.clone()],
                epoch: "e".into(),
                offset: 9,
            }),
        },
        Reply {
            id: 9,
            body: ReplyBody::Ping,
        },
        Reply {
            id: 10,
            body: ReplyBody::Rpc {
                data: Bytes::from_static(b"r"),
            },
        },
        Reply {
            id: 11,
            body: ReplyBody::Refresh(RefreshResult {
                client: "c1".into(),
                version: "v".into(),
                expires: true,
                ttl: 1,
            }),
        },
        Reply {
            id: 12,
            body: ReplyBody::SubRefresh {
                expires: true,
                ttl: 2,
            },
        },
    ] {
        Format::Protobuf.encode(&mut batch, &reply);
    }
    let pushes = [
        push(PushBody::Pub(full)),
        push(PushBody::Join(info.clone())),
        push(PushBody::Leave(info)),
        push(PushBody::Unsubscribe {
            code: 2500,
            reason: "bye".into(),
        }),
        push(PushBody::Message {
            data: Bytes::from_static(b"m"),
        }),
        push(PushBody::Subscribe {
            recoverable: true,
            epoch: "e".into(),
            offset: 4,
            positioned: true,
            data: Bytes::from_static(b"s"),
        }),
        push(PushBody::Disconnect(Disconnect::new(disconnect::SHUTDOWN))),
        push(PushBody::Refresh {
            expires: true,
            ttl: 9,
        }),
    ];
    let mut frames = vec![batch];
    frames.extend(pushes.iter().map(|p| Format::Protobuf.encode_one(p)));
    let got = decoded_by_python(&frames);

    let info = json!({"user": "u1", "client": "c1", "conn_info": b64(b"{\"a\":1}"), "chan_info": b64(&[0, 255])});
    let max = u64::MAX.to_string();
    let sub = json!({
        "expires": true, "ttl": 60, "recoverable": true, "epoch": "ep",
        "publications": [{"data": b64(b"x"), "offset": (u64::MAX - 1).to_string()}, {"offset": max}],
        "recovered": true, "offset": max, "positioned": true, "data": b64(b"d"), "was_recovering": true,
    });
    let full = json!({"data": b64(&[7; 300]), "info": info, "offset": "1", "tags": {"k": "v"}, "time": "-5"});
    assert_eq!(
        got[0],
        json!([
            {"id": 1, "connect": {"client": "c1", "version": "0.1", "expires": true, "ttl": 3600, "data": b64(b"hi"),
                "subs": {"news": sub}, "ping": 25, "pong": true, "session": "s", "node": "n"}},
            {"id": 2, "subscribe": sub},
            {"id": 3, "error": {"code": 100, "message": "internal server error", "temporary": true}},
            {"id": 4, "unsubscribe": {}},
            {"id": 5, "publish": {}},
            {"id": 6, "presence": {"presence": {"c1": info}}},
            {"id": 7, "presence_stats": {"num_clients": 3, "num_users": 2}},
            {"id": 8, "history": {"publications": [full], "epoch": "e", "offset": "9"}},
            {"id": 9, "ping": {}},
            {"id": 10, "rpc": {"data": b64(b"r")}},
            {"id": 11, "refresh": {"client": "c1", "version": "v", "expires": true, "ttl": 1}},
            {"id": 12, "sub_refresh": {"expires": true, "ttl": 2}},
        ])
    );
    let push = |mut body: Value| {
        body["channel"] = json!("ch");
        json!([{"push": body}])
    };
    assert_eq!(
        got[1..],
        [
            push(json!({"pub": full})),
            push(json!({"join": {"info": info}})),
            push(json!({"leave": {"info": info}})),
            push(json!({"unsubscribe": {"code": 2500, "reason": "bye"}})),
            push(json!({"message": {"data": b64(b"m")}})),
            push(
                json!({"subscribe": {"recoverable": true, "epoch": "e", "offset": "4", "positioned": true, "data": b64(b"s")}})
            ),
            push(json!({"disconnect": {"code": 3001, "reason": "shutdown", "reconnect": true}})),
            push(json!({"refresh": {"expires": true, "ttl": 9}})),
        ]
    );
}
