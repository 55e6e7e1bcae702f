use super::*;

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

fn entry(offset: u64, taken: u64, message: &[u8]) -> Value {
    Value::Array(vec![
        bulk(&format!("0-{offset}")),
        Value::Array(vec![
            bulk("t"),
            bulk(&taken.to_string()),
            bulk("m"),
            Value::BulkString(message.to_vec()),
        ]),
    ])
}

#[test]
fn keys_share_the_topics_slot() {
    assert_eq!(
        keys("rapidws:", "a:b"),
        ["rapidws:{a:b}:m", "rapidws:{a:b}:s"]
    );
}

#[test]
fn a_read_keeps_what_passes_newest_back_to_the_first_hole() {
    let node = [9u8; 16];
    let message = |n: u64| {
        let stamp = Stamp {
            node,
            count: n,
            time: wire::unix_millis(),
        };
        let payload = format!("p{n}");
        wire::encode(stamp, (None, OpCode::Text, payload.as_bytes()), "c", None)
    };
    let check = Check {
        after: 0,
        take: usize::MAX,
        channel: "c",
        secret: None,
        max_message_size: 100,
        history: History::new(100, Duration::from_secs(60)),
    };
    let answer = |entries: Vec<Value>| {
        Value::Array(vec![
            bulk("00000000000000ff"),
            bulk("7"),
            Value::Int(1000),
            Value::Array(entries),
        ])
    };
    // Newest first: 7, 6, 5; 4 is too old.
    let read = read_back(
        &answer(vec![
            entry(7, 1000, &message(7)),
            entry(6, 990, &message(6)),
            entry(5, 950, &message(5)),
            entry(4, 900, &message(4)),
        ]),
        &check,
    )
    .unwrap();
    assert_eq!(read.epoch, Some(Epoch::from_u64(255)));
    assert_eq!(read.last, 7);
    let offsets: Vec<u64> = read.loaded.iter().map(|l| l.offset).collect();
    assert_eq!(offsets, [5, 6, 7]);
    assert_eq!(read.loaded[0].payload, b"p5");
    // A forged entry is a hole: nothing older is taken.
    let read = read_back(
        &answer(vec![
            entry(7, 1000, &message(7)),
            entry(6, 1000, b"forged"),
            entry(5, 1000, &message(5)),
        ]),
        &check,
    )
    .unwrap();
    assert_eq!(read.loaded.len(), 1);
    assert_eq!(read.refused, 1);
    // Out of order: stops there.
    let read = read_back(
        &answer(vec![
            entry(7, 1000, &message(7)),
            entry(9, 1000, &message(9)),
        ]),
        &check,
    )
    .unwrap();
    assert_eq!(read.loaded.len(), 1);
    // No epoch: nothing kept; not an answer: None.
    assert!(read_back(&Value::Nil, &check).unwrap().epoch.is_none());
    assert!(read_back(&Value::Int(3), &check).is_none());
    assert!(read_back(&Value::Array(vec![bulk("zz")]), &check).is_none());
}

#[test]
fn positions_come_back_from_record() {
    let value = Value::Array(vec![bulk("00000000000000ff"), Value::Int(12)]);
    assert_eq!(
        recorded_at(&value),
        Some(Position {
            epoch: Epoch::from_u64(255),
            offset: 12
        })
    );
    assert_eq!(
        recorded_at(&Value::Array(vec![bulk("x"), Value::Int(1)])),
        None
    );
    assert_eq!(recorded_at(&Value::Okay), None);
}

#[test]
fn with_a_secret_a_read_that_does_not_hang_together_is_not_taken() {
    let secret = Some(&b"shared secret"[..]);
    let now = wire::unix_millis();
    let message = |node: u8, count: u64, time: u64| {
        let stamp = Stamp {
            node: [node; 16],
            count,
            time,
        };
        let payload = format!("p{count}");
        wire::encode(stamp, (None, OpCode::Text, payload.as_bytes()), "c", secret)
    };
    let check = Check {
        after: 0,
        take: usize::MAX,
        channel: "c",
        secret,
        max_message_size: 100,
        history: History::new(100, Duration::from_secs(60)),
    };
    let answer = |last: &str, entries: Vec<Value>| {
        Value::Array(vec![
            bulk("00000000000000ff"),
            bulk(last),
            Value::Int(1000),
            Value::Array(entries),
        ])
    };
    let offsets = |read: Read| read.loaded.iter().map(|l| l.offset).collect::<Vec<_>>();
    // Two nodes interleaved, each counting up, clocks a little apart.
    let real = vec![
        entry(4, 1000, &message(2, 21, now - 1000)),
        entry(3, 1000, &message(1, 12, now - 3000)),
        entry(2, 1000, &message(2, 20, now - 4000)),
        entry(1, 1000, &message(1, 11, now - 5000)),
    ];
    let read = read_back(&answer("4", real.clone()), &check).unwrap();
    assert_eq!(offsets(read), [1, 2, 3, 4]);
    // Asked for what follows 2: 1 and 2 are read to check against.
    let after_two = Check { after: 2, ..check };
    let read = read_back(&answer("4", real.clone()), &after_two).unwrap();
    assert_eq!(offsets(read), [3, 4]);
    // A copy of 1 at 5, asked for what follows 4: the read reaches
    // back to 1, and the copy's count does not rise past it.
    let mut copy_of_first = real.clone();
    copy_of_first.insert(0, entry(5, 1000, &message(1, 11, now - 5000)));
    let after_four = Check { after: 4, ..check };
    let read = read_back(&answer("5", copy_of_first), &after_four).unwrap();
    assert_eq!(read.loaded.len(), 0);
    // A real entry put back at the end: its node's count does not rise.
    let mut copied = real.clone();
    copied.insert(0, entry(5, 1000, &message(1, 12, now - 3000)));
    let read = read_back(&answer("5", copied), &check).unwrap();
    assert_eq!(read.loaded.len(), 0);
    assert!(read.refused >= 1);
    // One from before those kept (its node's first here), put back at
    // the end: signed long before the newer ones.
    let mut old = real.clone();
    old.insert(0, entry(5, 1000, &message(3, 7, now - 60_000)));
    let read = read_back(&answer("5", old), &check).unwrap();
    assert_eq!(read.loaded.len(), 0);
    // Signed in the future.
    let read = read_back(
        &answer("1", vec![entry(1, 1000, &message(1, 1, now + 60_000))]),
        &check,
    )
    .unwrap();
    assert_eq!(read.loaded.len(), 0);
    // Without a secret nothing is signed, and nothing is checked.
    let unsigned = Check {
        secret: None,
        ..check
    };
    let plain = |count: u64| {
        let stamp = Stamp {
            node: [1; 16],
            count,
            time: now,
        };
        wire::encode(stamp, (None, OpCode::Text, b"x"), "c", None)
    };
    let read = read_back(
        &answer(
            "2",
            vec![entry(2, 1000, &plain(1)), entry(1, 1000, &plain(1))],
        ),
        &unsigned,
    )
    .unwrap();
    assert_eq!(read.loaded.len(), 2);
}
