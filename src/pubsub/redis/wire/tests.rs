use super::*;

fn stamp(node: [u8; 16], count: u64) -> Stamp {
    Stamp {
        node,
        count,
        time: 1_700_000_000_000 + count,
    }
}

#[test]
fn messages_carry_their_node_count_time_and_kind() {
    let node = [7u8; 16];
    for secret in [None, Some(&b"shared"[..])] {
        for (opcode, payload) in [
            (OpCode::Text, &b"hello"[..]),
            (OpCode::Binary, &[0u8, 255, 1][..]),
            (OpCode::Text, &b""[..]),
        ] {
            for key in [None, Some("AAPL"), Some("")] {
                let wire = encode(stamp(node, 42), (key, opcode, payload), "rapidws:t", secret);
                let want = Decoded {
                    stamp: stamp(node, 42),
                    key,
                    opcode,
                    payload,
                };
                assert_eq!(decode(&wire, "rapidws:t", secret), Some(want));
            }
        }
    }
    assert_eq!(decode(b"", "c", None), None);
    assert_eq!(decode(&[3; HEADER - 1], "c", None), None, "too short");
    assert_eq!(decode(&[2; 50], "c", None), None, "version 2");
    let text = |key| (key, OpCode::Text, &b"x"[..]);
    let mut unknown = encode(stamp(node, 1), text(None), "c", None);
    unknown[33] = b'?';
    assert_eq!(decode(&unknown, "c", None), None);
    // A key longer than what follows, and a key that is not UTF-8.
    let mut keyed = encode(stamp(node, 1), (Some("k"), OpCode::Text, b""), "c", None);
    keyed[35] = 9;
    assert_eq!(decode(&keyed, "c", None), None);
    let mut keyed = encode(stamp(node, 1), (Some("k"), OpCode::Text, b""), "c", None);
    keyed[36] = 0xff;
    assert_eq!(decode(&keyed, "c", None), None);
}

#[test]
fn a_sealed_message_is_the_encoded_one() {
    let content = (Some("k"), OpCode::Binary, &[1u8, 2, 3][..]);
    for secret in [None, Some(&b"shared"[..])] {
        let mut message = unsealed([4; 16], content);
        seal(&mut message, (9, 1_700_000_000_009), "rapidws:c", secret);
        let whole = encode(stamp([4; 16], 9), content, "rapidws:c", secret);
        assert_eq!(message, whole);
    }
}

#[test]
fn with_a_secret_only_signed_messages_on_their_channel_pass() {
    let secret = Some(&b"shared"[..]);
    let node = [3u8; 16];
    let hi = (Some("k"), OpCode::Text, &b"hi"[..]);
    let signed = encode(stamp(node, 5), hi, "rapidws:a", secret);
    assert!(decode(&signed, "rapidws:a", secret).is_some());
    assert_eq!(
        decode(&signed, "rapidws:b", secret),
        None,
        "moved to another channel"
    );
    assert_eq!(
        decode(&signed, "rapidws:a", Some(b"other")),
        None,
        "another secret"
    );
    let unsigned = encode(stamp(node, 5), hi, "rapidws:a", None);
    assert_eq!(decode(&unsigned, "rapidws:a", secret), None, "not signed");
    for at in 0..signed.len() {
        let mut changed = signed.clone();
        changed[at] ^= 1;
        assert_eq!(
            decode(&changed, "rapidws:a", secret),
            None,
            "byte {at} changed"
        );
    }
    assert_eq!(decode(&signed[..TAG - 1], "rapidws:a", secret), None);
}

#[test]
fn recorded_messages_carry_redis_position_in_front() {
    let epoch: Epoch = "00ab00cd00ef0012".parse().unwrap();
    let inner = encode(stamp([1; 16], 3), (None, OpCode::Text, b"x:y"), "c", None);
    let mut wire = format!("r{epoch}42:").into_bytes();
    wire.extend_from_slice(&inner);
    let (position, rest) = recorded(&wire).unwrap();
    assert_eq!(position, Position { epoch, offset: 42 });
    assert_eq!(rest, &inner[..]);
    assert_eq!(recorded(&inner), None, "not recorded");
    assert_eq!(recorded(b"r00ab00cd00ef001242"), None, "no colon");
    assert_eq!(recorded(b"r00ab00cd00ef0012x:"), None, "not a number");
    assert_eq!(recorded(b"rzzab00cd00ef00121:"), None, "not hex");
    assert_eq!(recorded(b"r00ab"), None, "short");
    let long = format!("r{epoch}{}:", "9".repeat(30));
    assert_eq!(recorded(long.as_bytes()), None, "offset past u64");
    let huge = format!("r{epoch}{}:", u64::MAX);
    assert_eq!(recorded(huge.as_bytes()), None, "offset near u64's end");
}
