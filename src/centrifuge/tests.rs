use bytes::Bytes;

use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn json(reply: &Reply) -> String {
    String::from_utf8(Format::Json.encode_one(reply)).unwrap()
}

// Frames Python's protobuf encoded from tests/centrifuge/client.proto
// (`tests/centrifuge/peer.py commands` prints them).
const PY_CONNECT_SUBSCRIBE: &str = "4c080122480a06746f6b2e656e12117b2268656c6c6f223a22776f726c64227d1a120a046e657773120a180132046162636438112206707974686f6e2a03312e3032080a03782d6112016238053308022a2f0a06636861743a311801320378797a388380808080204801500158016206666f7373696c70ffffffffffffffffff01";
const PY_HISTORY: &str = "1b080452170a016838ffffffffffffffffff01420508091201654801";
const PY_PONG_PING_RPC: &str = "000408055a001008066a0c0a055b312c325d120373756d";
const PY_MISC: &str = "0a080a32060a04726f6f6d0a080b42060a04726f6f6d0a080c4a060a04726f6f6d0562030a017808080d72040a0274320e080e7a0a0a04726f6f6d12027433";

#[test]
fn protobuf_connect_and_subscribe_from_python() {
    let commands = Format::Protobuf.decode(&hex(PY_CONNECT_SUBSCRIBE)).unwrap();
    assert_eq!(commands.len(), 2);
    assert_eq!(commands[0].id, 1);
    let Request::Connect(connect) = &commands[0].request else {
        panic!("{:?}", commands[0])
    };
    assert_eq!(connect.token, "tok.en");
    assert_eq!(&connect.data[..], br#"{"hello":"world"}"#);
    assert_eq!(connect.name, "python");
    assert_eq!(connect.version, "1.0");
    assert_eq!(connect.headers, vec![("x-a".to_owned(), "b".to_owned())]);
    assert_eq!(connect.subs.len(), 1);
    let (channel, sub) = &connect.subs[0];
    assert_eq!(channel, "news");
    assert!(sub.recover);
    assert_eq!((sub.epoch.as_str(), sub.offset), ("abcd", 17));
    assert_eq!(commands[1].id, 2);
    let expected = SubscribeRequest {
        channel: "chat:1".into(),
        recover: true,
        epoch: "xyz".into(),
        offset: (1 << 40) + 3,
        positioned: true,
        recoverable: true,
        join_leave: true,
        ..Default::default()
    };
    assert_eq!(commands[1].request, Request::Subscribe(expected));
}

#[test]
fn protobuf_publish_history_and_the_rest_from_python() {
    let publish = "900208033a8b020a06636861743a311280020001";
    // The peer's publish frame carries bytes 0..=255; its head is enough to
    // see the length prefixes read right, and a cut frame is refused.
    assert!(Format::Protobuf.decode(&hex(publish)).is_err());
    let mut full = hex("900208033a8b020a06636861743a31128002");
    full.extend(0..=255u8);
    let commands = Format::Protobuf.decode(&full).unwrap();
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(
        commands,
        vec![Command {
            id: 3,
            request: Request::Publish {
                channel: "chat:1".into(),
                data: Bytes::from(all)
            }
        }]
    );

    let commands = Format::Protobuf.decode(&hex(PY_HISTORY)).unwrap();
    let since = Some(StreamPosition {
        offset: 9,
        epoch: "e".into(),
    });
    let history = HistoryRequest {
        channel: "h".into(),
        limit: -1,
        since,
        reverse: true,
    };
    assert_eq!(
        commands,
        vec![Command {
            id: 4,
            request: Request::History(history)
        }]
    );

    let commands = Format::Protobuf.decode(&hex(PY_PONG_PING_RPC)).unwrap();
    assert_eq!(
        commands,
        vec![
            Command {
                id: 0,
                request: Request::Pong
            },
            Command {
                id: 5,
                request: Request::Ping
            },
            Command {
                id: 6,
                request: Request::Rpc {
                    method: "sum".into(),
                    data: Bytes::from_static(b"[1,2]")
                }
            },
        ]
    );

    let commands = Format::Protobuf.decode(&hex(PY_MISC)).unwrap();
    let room = || "room".to_owned();
    assert_eq!(
        commands,
        vec![
            Command {
                id: 10,
                request: Request::Unsubscribe { channel: room() }
            },
            Command {
                id: 11,
                request: Request::Presence { channel: room() }
            },
            Command {
                id: 12,
                request: Request::PresenceStats { channel: room() }
            },
            Command {
                id: 0,
                request: Request::Send {
                    data: Bytes::from_static(b"x")
                }
            },
            Command {
                id: 13,
                request: Request::Refresh { token: "t2".into() }
            },
            Command {
                id: 14,
                request: Request::SubRefresh {
                    channel: room(),
                    token: "t3".into()
                }
            },
        ]
    );
}

#[test]
fn protobuf_first_request_in_field_order_wins() {
    // id 7, then unsubscribe (field 6) before subscribe (field 5) on the wire.
    let frame = hex("0e080732040a0262622a040a026161");
    let commands = Format::Protobuf.decode(&frame).unwrap();
    assert!(
        matches!(&commands[0].request, Request::Subscribe(s) if s.channel == "aa"),
        "{commands:?}"
    );
}

#[test]
fn protobuf_bad_frames_are_errors() {
    let bad: &[&[u8]] = &[
        // A length past the end, a huge length (never allocated).
        &[5, 8, 1],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        // A varint of eleven bytes, a truncated one.
        &[
            0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
        ],
        &[0x80],
        // Inside a command: a truncated varint, field number 0, a group, a
        // field's length past the command's end.
        &[2, 0x08, 0x80],
        &[2, 0x00, 0x01],
        &[2, 0x0b, 0x0c],
        &[3, 0x22, 0x05, 0x00],
        // A subscribe whose channel is not UTF-8; a varint where a message goes.
        &[6, 0x2a, 0x04, 0x0a, 0x02, 0xff, 0xfe],
        &[2, 0x28, 0x01],
    ];
    for frame in bad {
        assert!(Format::Protobuf.decode(frame).is_err(), "{frame:?}");
    }
    // Unknown fields of every wire type are read past.
    let frame = [12, 0x08, 0x09, 0xf9, 0x01, 1, 2, 3, 4, 5, 6, 7, 8];
    let frame = [&frame[..], &[0xfd, 0x01, 1, 2, 3, 4]].concat();
    let frame = [&[frame.len() as u8 - 1][..], &frame[1..]].concat();
    assert_eq!(
        Format::Protobuf.decode(&frame).unwrap(),
        vec![Command {
            id: 9,
            request: Request::Pong
        }]
    );
    // MAX_COMMANDS empty commands pass, one more does not.
    assert_eq!(
        Format::Protobuf.decode(&[0; MAX_COMMANDS]).unwrap().len(),
        MAX_COMMANDS
    );
    assert_eq!(
        Format::Protobuf.decode(&[0; MAX_COMMANDS + 1]),
        Err(DecodeError::TooManyCommands)
    );
}

#[test]
fn json_commands_as_the_js_sdk_batches_them() {
    // connect and subscribe in one frame, a flag rapidws does not know, a
    // payload whose text must survive as it is.
    let frame = concat!(
        r#"{"connect":{"name":"js","data":{"a": 1.50 ,"b":[true]}},"id":1}"#,
        "\n",
        r#"{"id":2,"subscribe":{"channel":"news","recover":true,"epoch":"e1","offset":18446744073709551615,"flag":3,"delta":"fossil"}}"#,
        "\n{}\n",
    );
    let commands = Format::Json.decode(frame.as_bytes()).unwrap();
    assert_eq!(commands.len(), 3);
    let Request::Connect(connect) = &commands[0].request else {
        panic!()
    };
    assert_eq!((commands[0].id, connect.name.as_str()), (1, "js"));
    assert_eq!(&connect.data[..], br#"{"a": 1.50 ,"b":[true]}"#);
    let Request::Subscribe(sub) = &commands[1].request else {
        panic!()
    };
    assert_eq!(
        (
            sub.channel.as_str(),
            sub.recover,
            sub.epoch.as_str(),
            sub.offset
        ),
        ("news", true, "e1", u64::MAX)
    );
    assert_eq!(
        commands[2],
        Command {
            id: 0,
            request: Request::Pong
        }
    );

    let frame = r#"{"id":3,"publish":{"channel":"c","data":"text"}}
{"id":4,"history":{"channel":"c","limit":-1,"since":{"offset":2,"epoch":"e"},"reverse":true}}
{"id":5,"rpc":{"method":"m","data":null}}
{"id":6,"ping":{}}
{"id":7,"presence_stats":{"channel":"c"}}"#;
    let commands = Format::Json.decode(frame.as_bytes()).unwrap();
    assert_eq!(
        commands[0].request,
        Request::Publish {
            channel: "c".into(),
            data: Bytes::from_static(b"\"text\"")
        }
    );
    let since = Some(StreamPosition {
        offset: 2,
        epoch: "e".into(),
    });
    assert_eq!(
        commands[1].request,
        Request::History(HistoryRequest {
            channel: "c".into(),
            limit: -1,
            since,
            reverse: true
        })
    );
    assert_eq!(
        commands[2].request,
        Request::Rpc {
            method: "m".into(),
            data: Bytes::new()
        }
    );
    assert_eq!(commands[3].request, Request::Ping);
    assert_eq!(
        commands[4].request,
        Request::PresenceStats {
            channel: "c".into()
        }
    );
}

#[test]
fn json_bad_frames_are_errors() {
    let bad: &[&[u8]] = &[
        b"{",
        b"[1]",
        b"{\"id\":-1}",
        b"{\"id\":4294967296}",
        b"{\"subscribe\":{\"offset\":\"5\"}}",
        b"{\"id\":1}\n{\"id\":",
        b"\xff",
        b"{\"publish\":{\"data\":{\"a\":}}}",
    ];
    for frame in bad {
        assert!(
            Format::Json.decode(frame).is_err(),
            "{:?}",
            String::from_utf8_lossy(frame)
        );
    }
    let deep = "[".repeat(100_000);
    assert!(
        Format::Json
            .decode(format!("{{\"send\":{{\"data\":{deep}}}}}").as_bytes())
            .is_err()
    );
    let many = "{}\n".repeat(MAX_COMMANDS);
    assert_eq!(
        Format::Json.decode(many.as_bytes()).unwrap().len(),
        MAX_COMMANDS
    );
    let many = "{}\n".repeat(MAX_COMMANDS + 1);
    assert_eq!(
        Format::Json.decode(many.as_bytes()),
        Err(DecodeError::TooManyCommands)
    );
}

fn publication(offset: u64, data: &'static [u8]) -> Publication {
    Publication {
        data: Bytes::from_static(data),
        offset,
        ..Default::default()
    }
}

#[test]
fn json_replies_as_centrifugo_writes_them() {
    let connect = ConnectResult {
        client: "c1".into(),
        version: "0.1".into(),
        ping: 25,
        pong: true,
        ..Default::default()
    };
    let connect = Reply {
        id: 1,
        body: ReplyBody::Connect(connect),
    };
    assert_eq!(
        json(&connect),
        r#"{"id":1,"connect":{"client":"c1","version":"0.1","ping":25,"pong":true}}"#
    );

    let recovered = SubscribeResult {
        recoverable: true,
        positioned: true,
        epoch: "ep".into(),
        offset: 7,
        publications: vec![publication(6, b"{\"n\":\n6}"), publication(7, b"7")],
        was_recovering: true,
        recovered: true,
        ..Default::default()
    };
    let subscribe = Reply {
        id: 2,
        body: ReplyBody::Subscribe(recovered),
    };
    assert_eq!(
        json(&subscribe),
        r#"{"id":2,"subscribe":{"recoverable":true,"epoch":"ep","publications":[{"data":{"n":6},"offset":6},{"data":7,"offset":7}],"recovered":true,"offset":7,"positioned":true,"was_recovering":true}}"#
    );

    let info = ClientInfo {
        user: "".into(),
        client: "c\"2".into(),
        conn_info: Bytes::from_static(b"{}"),
        ..Default::default()
    };
    let publ = Publication {
        info: Some(info.clone()),
        tags: vec![("k".into(), "v\n".into())],
        ..publication(8, b"[1]")
    };
    let push = Reply::push(Push {
        channel: "news".into(),
        body: PushBody::Pub(publ),
    });
    assert_eq!(
        json(&push),
        r#"{"push":{"channel":"news","pub":{"data":[1],"info":{"user":"","client":"c\"2","conn_info":{}},"offset":8,"tags":{"k":"v\n"}}}}"#
    );
    let join = Reply::push(Push {
        channel: "news".into(),
        body: PushBody::Join(info),
    });
    assert_eq!(
        json(&join),
        r#"{"push":{"channel":"news","join":{"info":{"user":"","client":"c\"2","conn_info":{}}}}}"#
    );

    let error = Reply::error(3, Error::new(error::UNRECOVERABLE_POSITION));
    assert_eq!(
        json(&error),
        r#"{"id":3,"error":{"code":112,"message":"unrecoverable position"}}"#
    );
    let internal = Reply::error(3, Error::new(error::INTERNAL));
    assert_eq!(
        json(&internal),
        r#"{"id":3,"error":{"code":100,"message":"internal server error","temporary":true}}"#
    );

    let history = Reply {
        id: 4,
        body: ReplyBody::History(HistoryResult::default()),
    };
    assert_eq!(
        json(&history),
        r#"{"id":4,"history":{"publications":[],"epoch":"","offset":0}}"#
    );
    let stats = Reply {
        id: 5,
        body: ReplyBody::PresenceStats {
            num_clients: 0,
            num_users: 0,
        },
    };
    assert_eq!(
        json(&stats),
        r#"{"id":5,"presence_stats":{"num_clients":0,"num_users":0}}"#
    );
    let presence = Reply {
        id: 6,
        body: ReplyBody::Presence(vec![]),
    };
    assert_eq!(json(&presence), r#"{"id":6,"presence":{"presence":{}}}"#);

    // Several replies in one frame: a line each.
    let mut frame = Vec::new();
    Format::Json.encode(
        &mut frame,
        &Reply {
            id: 7,
            body: ReplyBody::Ping,
        },
    );
    Format::Json.encode(
        &mut frame,
        &Reply {
            id: 8,
            body: ReplyBody::Publish,
        },
    );
    assert_eq!(frame, b"{\"id\":7,\"ping\":{}}\n{\"id\":8,\"publish\":{}}");
    // Every line is JSON a JSON parser reads back.
    for reply in [connect, subscribe, push, error, history] {
        let text = json(&reply);
        assert!(is_json(text.as_bytes()), "{text}");
        assert!(!text.contains('\n'));
    }
}

#[test]
fn protobuf_replies_by_hand() {
    // id 2 (08 02), unsubscribe (field 7, empty: 3a 00), behind its length.
    assert_eq!(
        Format::Protobuf.encode_one(&Reply {
            id: 2,
            body: ReplyBody::Unsubscribe
        }),
        [4, 0x08, 0x02, 0x3a, 0x00]
    );
    // A push has no id: push (field 4) { channel "c" (12 01 63), pub (22) { offset 300 (30 ac 02) } }.
    let push = Reply::push(Push {
        channel: "c".into(),
        body: PushBody::Pub(publication(300, b"")),
    });
    assert_eq!(
        Format::Protobuf.encode_one(&push),
        [10, 0x22, 8, 0x12, 1, b'c', 0x22, 3, 0x30, 0xac, 0x02]
    );
    // A length over 127 takes two bytes, in front of what it measures.
    let big = Reply {
        id: 1,
        body: ReplyBody::Rpc {
            data: Bytes::from(vec![7; 200]),
        },
    };
    let out = Format::Protobuf.encode_one(&big);
    assert_eq!(&out[..8], [0xd0, 0x01, 0x08, 0x01, 0x6a, 0xcb, 0x01, 0x0a]);
    assert_eq!(out.len(), 2 + 208);
}

#[test]
fn close_codes() {
    assert!(reconnects(disconnect::NO_PONG));
    assert!(!reconnects(disconnect::BAD_REQUEST));
    assert!(reconnects(4000) && !reconnects(4500));
    let d = Disconnect::new(disconnect::INSUFFICIENT_STATE);
    assert_eq!(
        (d.code, d.reason.as_str(), d.reconnect),
        (3010, "insufficient state", true)
    );
}
