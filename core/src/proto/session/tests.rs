use rand::{Rng, RngExt, SeedableRng};

use super::*;
use crate::proto::frame::{DecodeRules, write_frame};

const KEY: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// A masked client frame.
fn frame(fin: bool, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, fin, 0, opcode, payload, Some(KEY));
    out
}

fn close_frame(code: u16, reason: &[u8]) -> Vec<u8> {
    let mut p = code.to_be_bytes().to_vec();
    p.extend_from_slice(reason);
    frame(true, OpCode::Close, &p)
}

/// An event with its payload copied, so it can be compared after the borrow ends.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ev {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Closed(u16, String),
    Failed(u16),
}

struct Harness {
    session: Session,
    input: BytesMut,
    out: WriteQueue,
}

impl Harness {
    fn new() -> Self {
        Harness::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Self {
        Harness {
            session: Session::new(Role::Server, limits, Arc::new(BufferPool::default())),
            input: BytesMut::new(),
            out: WriteQueue::new(),
        }
    }

    /// Appends `bytes` to the read buffer and collects every event.
    fn feed(&mut self, bytes: &[u8]) -> Vec<Ev> {
        self.input.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            match self.session.poll_event(&mut self.input, &mut self.out) {
                Ok(None) => break,
                Ok(Some(event)) => events.push(match event {
                    Event::Message(Message::Text(t)) => Ev::Text(t.to_owned()),
                    Event::Message(Message::Binary(b)) => Ev::Binary(b.to_vec()),
                    Event::Ping(p) => Ev::Ping(p.to_vec()),
                    Event::Pong(p) => Ev::Pong(p.to_vec()),
                    Event::Closed { code, reason } => Ev::Closed(code.0, reason.to_owned()),
                }),
                Err(e) => {
                    events.push(Ev::Failed(e.code.0));
                    break;
                }
            }
        }
        events
    }

    /// Everything the session queued for the peer, as (opcode, payload) frames.
    fn sent(&mut self) -> Sent {
        let mut bytes = Vec::new();
        self.out.move_into(&mut bytes);
        let mut frames = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let (h, hl) = decode_header(&bytes[at..], DecodeRules::CLIENT)
                .unwrap()
                .expect("a whole frame");
            assert!(h.fin);
            let start = at + hl;
            let end = start + h.payload_len as usize;
            frames.push((h.opcode, bytes[start..end].to_vec()));
            at = end;
        }
        frames
    }
}

fn close_payload(code: u16) -> Vec<u8> {
    code.to_be_bytes().to_vec()
}

#[test]
fn delivers_text_binary_and_empty_messages() {
    let mut h = Harness::new();
    let mut wire = frame(true, OpCode::Text, "héllo".as_bytes());
    wire.extend(frame(true, OpCode::Binary, &[0, 1, 2, 255]));
    wire.extend(frame(true, OpCode::Text, b""));
    wire.extend(frame(true, OpCode::Binary, b""));
    assert_eq!(
        h.feed(&wire),
        [
            Ev::Text("héllo".into()),
            Ev::Binary(vec![0, 1, 2, 255]),
            Ev::Text(String::new()),
            Ev::Binary(vec![]),
        ]
    );
    assert!(h.input.is_empty(), "all input consumed");
    assert!(h.sent().is_empty());
}

#[test]
fn whole_frames_are_delivered_without_copying() {
    let mut h = Harness::new();
    h.input
        .extend_from_slice(&frame(true, OpCode::Binary, &[7u8; 300]));
    let base = h.input.as_ptr() as usize;
    let len = h.input.len();
    match h.session.poll_event(&mut h.input, &mut h.out).unwrap() {
        Some(Event::Message(Message::Binary(b))) => {
            let at = b.as_ptr() as usize;
            assert!(
                at >= base && at + b.len() <= base + len,
                "borrowed from the read buffer"
            );
            assert_eq!(b, &[7u8; 300][..]);
        }
        other => panic!("unexpected {other:?}"),
    }
    // The bytes are dropped lazily, by the next call.
    assert_eq!(h.input.len(), len);
    assert!(
        h.session
            .poll_event(&mut h.input, &mut h.out)
            .unwrap()
            .is_none()
    );
    assert!(h.input.is_empty());
}

#[test]
fn reassembles_fragments_with_control_frames_interleaved() {
    let mut h = Harness::new();
    let mut wire = frame(false, OpCode::Text, b"frag");
    wire.extend(frame(true, OpCode::Ping, b"p1"));
    wire.extend(frame(false, OpCode::Continuation, b"men"));
    wire.extend(frame(true, OpCode::Pong, b"unsolicited"));
    wire.extend(frame(false, OpCode::Continuation, b""));
    wire.extend(frame(true, OpCode::Continuation, b"ted"));
    assert_eq!(
        h.feed(&wire),
        [
            Ev::Ping(b"p1".to_vec()),
            Ev::Pong(b"unsolicited".to_vec()),
            Ev::Text("fragmented".into()),
        ]
    );
    assert_eq!(h.sent(), [(OpCode::Pong, b"p1".to_vec())]);
    assert!(h.input.is_empty());
}

#[test]
fn answers_every_ping_with_the_same_payload() {
    let mut h = Harness::new();
    let mut wire = Vec::new();
    for i in 0..10u8 {
        wire.extend(frame(true, OpCode::Ping, &[i; 125][..usize::from(i) * 12]));
    }
    assert_eq!(h.feed(&wire).len(), 10);
    let sent = h.sent();
    assert_eq!(sent.len(), 10);
    for (i, (op, payload)) in sent.iter().enumerate() {
        assert_eq!(*op, OpCode::Pong);
        assert_eq!(payload, &vec![i as u8; i * 12]);
    }
}

#[test]
fn continuation_without_a_message_is_a_protocol_error() {
    let mut h = Harness::new();
    assert_eq!(
        h.feed(&frame(true, OpCode::Continuation, b"x")),
        [Ev::Failed(1002)]
    );
    let sent = h.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, OpCode::Close);
    assert_eq!(sent[0].1[..2], close_payload(1002)[..]);
    assert!(h.session.is_closed());
}

#[test]
fn a_new_message_inside_a_fragmented_one_is_a_protocol_error() {
    let mut h = Harness::new();
    let mut wire = frame(false, OpCode::Binary, b"a");
    wire.extend(frame(true, OpCode::Text, b"b"));
    assert_eq!(h.feed(&wire), [Ev::Failed(1002)]);
}

#[test]
fn frame_errors_fail_with_1002_and_a_close_frame() {
    let cases: Vec<Vec<u8>> = vec![
        vec![0x83, 0x80, 1, 2, 3, 4],                // reserved opcode
        vec![0xC1, 0x80, 1, 2, 3, 4],                // RSV1 without an extension
        vec![0x81, 0x00],                            // unmasked
        vec![0x89, 0xFE, 0x00, 0x7E, 1, 2, 3, 4],    // ping longer than 125
        vec![0x09, 0x80, 1, 2, 3, 4],                // fragmented ping
        vec![0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0], // 64-bit length, top bit set
    ];
    for wire in cases {
        let mut h = Harness::new();
        assert_eq!(h.feed(&wire), [Ev::Failed(1002)], "{wire:x?}");
        assert!(
            !h.session.peer_closed(),
            "a failure is not a close handshake"
        );
        let sent = h.sent();
        assert_eq!(sent[0].0, OpCode::Close);
        assert_eq!(sent[0].1[..2], close_payload(1002)[..]);
    }
}

#[test]
fn a_held_failure_queues_nothing_until_released() {
    // Frame errors and invalid UTF-8 (found after the message's borrow).
    for (wire, code) in [
        (vec![0x83, 0x80, 1, 2, 3, 4], 1002),
        (frame(true, OpCode::Text, b"ok\xFFok"), 1007),
    ] {
        let mut h = Harness::new();
        h.session.hold_closes();
        let mut wire_before = frame(true, OpCode::Text, b"first");
        wire_before.extend(&wire);
        wire_before.extend(frame(true, OpCode::Text, b"never read"));
        assert_eq!(
            h.feed(&wire_before),
            [Ev::Text("first".into()), Ev::Failed(code)]
        );
        assert!(h.sent().is_empty(), "no close frame while held");
        assert_eq!(h.session.held_close(), Some(CloseCode(code)));
        assert!(!h.session.is_open());
        assert_eq!(h.feed(&frame(true, OpCode::Text, b"more")), []);
        // Released with the failure's own code, whatever reason is given.
        assert!(h.session.release_close("caught up", &mut h.out));
        assert!(!h.session.release_close("twice", &mut h.out));
        let sent = h.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].1[..2], close_payload(code)[..]);
        assert_eq!(&sent[0].1[2..], b"caught up");
        assert_eq!(h.session.held_close(), None);
    }
}

#[test]
fn a_failure_the_caller_starts_is_never_held_and_overtakes_a_held_one() {
    let mut h = Harness::new();
    h.session.hold_closes();
    h.session
        .fail(CloseCode::INTERNAL_ERROR, "handler panicked", &mut h.out);
    assert_eq!(h.sent()[0].1[..2], close_payload(1011)[..]);

    let mut h = Harness::new();
    h.session.hold_closes();
    assert_eq!(h.feed(&[0x83, 0x80, 1, 2, 3, 4]), [Ev::Failed(1002)]);
    h.session
        .fail(CloseCode::INTERNAL_ERROR, "handler panicked", &mut h.out);
    assert_eq!(h.sent()[0].1[..2], close_payload(1011)[..]);
    assert_eq!(h.session.held_close(), None);
    assert!(!h.session.release_close("late", &mut h.out));
    assert!(h.sent().is_empty());
}

#[test]
fn invalid_utf8_fails_with_1007() {
    let mut h = Harness::new();
    assert_eq!(
        h.feed(&frame(true, OpCode::Text, b"ok\xFFok")),
        [Ev::Failed(1007)]
    );
    assert_eq!(h.sent()[0].1[..2], close_payload(1007)[..]);
}

#[test]
fn invalid_utf8_fails_fast_within_a_fragmented_message() {
    let mut h = Harness::new();
    // U+110000 as F4 90 80 80: out of range, detectable at its second byte.
    assert!(h.feed(&frame(false, OpCode::Text, b"abc\xF4")).is_empty());
    assert_eq!(
        h.feed(&frame(false, OpCode::Continuation, b"\x90\x80\x80")),
        [Ev::Failed(1007)]
    );
}

#[test]
fn invalid_utf8_fails_fast_within_a_frame_that_is_still_arriving() {
    let mut h = Harness::new();
    let mut payload = "κόσμε".as_bytes().to_vec();
    payload.extend_from_slice(b"\xF4\x90\x80\x80");
    payload.extend_from_slice(&[b'x'; 100]);
    let wire = frame(true, OpCode::Text, &payload);
    let bad_at = wire.len() - payload.len() + "κόσμε".len() + 2;
    assert!(h.feed(&wire[..bad_at - 1]).is_empty(), "valid so far");
    assert_eq!(
        h.feed(&wire[bad_at - 1..bad_at]),
        [Ev::Failed(1007)],
        "fails before the rest"
    );
}

#[test]
fn a_message_split_inside_a_character_across_fragments_is_valid() {
    let mut h = Harness::new();
    let bytes = "a€b".as_bytes(); // € is three bytes
    let mut wire = frame(false, OpCode::Text, &bytes[..2]);
    wire.extend(frame(false, OpCode::Continuation, &bytes[2..3]));
    wire.extend(frame(true, OpCode::Continuation, &bytes[3..]));
    assert_eq!(h.feed(&wire), [Ev::Text("a€b".into())]);
}

#[test]
fn a_message_ending_inside_a_character_fails() {
    let mut h = Harness::new();
    let bytes = "a€".as_bytes();
    let mut wire = frame(false, OpCode::Text, &bytes[..2]);
    wire.extend(frame(true, OpCode::Continuation, &bytes[2..3]));
    assert_eq!(h.feed(&wire), [Ev::Failed(1007)]);
}

#[test]
fn peer_close_is_answered_and_ends_reading() {
    let mut h = Harness::new();
    let mut wire = close_frame(3000, b"bye");
    wire.extend(frame(true, OpCode::Text, b"ignored"));
    wire.extend(frame(true, OpCode::Ping, b"ignored"));
    assert_eq!(h.feed(&wire), [Ev::Closed(3000, "bye".into())]);
    assert_eq!(h.sent(), [(OpCode::Close, close_payload(3000))]);
    assert!(h.session.is_closed());
    assert!(h.session.peer_closed());
    assert!(h.feed(&frame(true, OpCode::Text, b"more")).is_empty());
    assert!(h.sent().is_empty());
}

#[test]
fn a_held_close_reply_lets_replies_go_first_then_echoes_the_code_without_a_reason() {
    for (wire, reply) in [
        (close_frame(3000, b"bye"), 3000),
        (frame(true, OpCode::Close, b""), 1000),
    ] {
        let mut h = Harness::new();
        h.session.hold_closes();
        let mut input = frame(true, OpCode::Text, b"question");
        input.extend(&wire);
        let events = h.feed(&input);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0], Ev::Text("question".into()));
        assert!(h.sent().is_empty(), "the reply to the close is held");
        assert_eq!(h.session.held_close(), Some(CloseCode(reply)));
        assert!(h.session.peer_closed());
        assert!(!h.session.is_open());
        // Nothing more is read meanwhile.
        assert!(h.feed(&frame(true, OpCode::Text, b"after")).is_empty());
        // The application's answer, then the close: in that order.
        h.out.push_frame(true, 0, OpCode::Text, b"answer");
        assert!(h.session.release_close("ignored for a reply", &mut h.out));
        assert!(!h.session.release_close("twice", &mut h.out));
        assert_eq!(
            h.sent(),
            [
                (OpCode::Text, b"answer".to_vec()),
                (OpCode::Close, close_payload(reply))
            ]
        );
        assert_eq!(h.session.held_close(), None);
        assert!(h.session.is_closed());
    }
}

#[test]
fn empty_close_is_reported_as_1005_and_answered_with_1000() {
    let mut h = Harness::new();
    assert_eq!(
        h.feed(&frame(true, OpCode::Close, b"")),
        [Ev::Closed(1005, String::new())]
    );
    assert_eq!(h.sent(), [(OpCode::Close, close_payload(1000))]);
}

#[test]
fn bad_close_frames_get_the_right_code() {
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (frame(true, OpCode::Close, &[0x03]), 1002),
        (close_frame(999, b""), 1002),
        (close_frame(1005, b""), 1002),
        (close_frame(1006, b""), 1002),
        (close_frame(1015, b""), 1002),
        (close_frame(5000, b""), 1002),
        (close_frame(1000, b"\xCE\xBA\xE1\xBD"), 1007),
    ];
    for (wire, code) in cases {
        let mut h = Harness::new();
        assert_eq!(h.feed(&wire), [Ev::Failed(code)], "{wire:x?}");
        assert_eq!(h.sent()[0].1[..2], close_payload(code)[..]);
    }
    for code in [1000u16, 1001, 1002, 1003, 1007, 1011, 1014, 3000, 4999] {
        let mut h = Harness::new();
        assert_eq!(
            h.feed(&close_frame(code, b"")),
            [Ev::Closed(code, String::new())]
        );
    }
}

#[test]
fn oversized_frames_fail_with_1009_before_their_payload_arrives() {
    let limits = Limits {
        max_frame_size: 100,
        max_message_size: 150,
    };
    let mut h = Harness::with_limits(limits);
    let wire = frame(true, OpCode::Binary, &[0u8; 101]);
    // Only the header is fed: the limit is enforced on it.
    assert_eq!(h.feed(&wire[..8]), [Ev::Failed(1009)]);
    assert_eq!(h.sent()[0].1[..2], close_payload(1009)[..]);

    let mut h = Harness::with_limits(limits);
    assert!(
        h.feed(&frame(false, OpCode::Binary, &[0u8; 100]))
            .is_empty()
    );
    let second = frame(true, OpCode::Continuation, &[0u8; 51]);
    assert_eq!(h.feed(&second[..6]), [Ev::Failed(1009)], "header only");

    let mut h = Harness::with_limits(limits);
    let mut wire = frame(false, OpCode::Binary, &[1u8; 100]);
    wire.extend(frame(true, OpCode::Continuation, &[2u8; 50]));
    assert_eq!(h.feed(&wire).len(), 1, "exactly at the limit is fine");
}

#[test]
fn handler_close_waits_for_the_peer_and_delivers_data_meanwhile() {
    let mut h = Harness::new();
    assert!(h.session.close(CloseCode(4000), "done", &mut h.out));
    assert!(!h.session.close(CloseCode::NORMAL, "again", &mut h.out));
    let mut expected = 4000u16.to_be_bytes().to_vec();
    expected.extend_from_slice(b"done");
    assert_eq!(h.sent(), [(OpCode::Close, expected)]);
    assert!(h.session.is_closing());
    assert!(!h.session.peer_closed());

    // What the peer sent before it saw our close: a whole message, a
    // fragmented one with a ping between its fragments, then its close.
    let mut wire = frame(true, OpCode::Text, b"late");
    wire.extend(frame(false, OpCode::Binary, b"in "));
    wire.extend(frame(true, OpCode::Ping, b"p"));
    wire.extend(frame(true, OpCode::Continuation, b"parts"));
    wire.extend(close_frame(1000, b""));
    assert_eq!(
        h.feed(&wire),
        [
            Ev::Text("late".into()),
            Ev::Ping(b"p".to_vec()),
            Ev::Binary(b"in parts".to_vec()),
            Ev::Closed(1000, String::new())
        ]
    );
    assert!(
        h.sent().is_empty(),
        "no pong and no second close after ours"
    );
    assert!(h.session.is_closed());
    assert!(h.session.peer_closed());
}

#[test]
fn fail_sends_the_given_code_once() {
    let mut h = Harness::new();
    let e = h
        .session
        .fail(CloseCode::INTERNAL_ERROR, "handler panicked", &mut h.out);
    assert_eq!(e.code, CloseCode::INTERNAL_ERROR);
    let sent = h.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(&sent[0].1[..2], &close_payload(1011)[..]);
    assert_eq!(&sent[0].1[2..], b"handler panicked");
    h.session
        .fail(CloseCode::INTERNAL_ERROR, "again", &mut h.out);
    assert!(h.sent().is_empty());
}

#[test]
fn bytes_wanted_reports_the_rest_of_the_frame() {
    let mut h = Harness::new();
    let wire = frame(true, OpCode::Binary, &[5u8; 1000]);
    assert!(h.feed(&wire[..100]).is_empty());
    assert_eq!(h.session.bytes_wanted(), wire.len());
    assert_eq!(h.feed(&wire[100..]).len(), 1);
    assert_eq!(h.session.bytes_wanted(), 0);
}

/// Random conversations: messages (some fragmented, text or binary, with pings
/// between fragments) then a close.
/// Frames the server sends, as (opcode, payload).
type Sent = Vec<(OpCode, Vec<u8>)>;

fn random_wire(rng: &mut impl Rng) -> (Vec<u8>, Vec<Ev>, Sent) {
    random_wire_of(rng, 12, 0.1)
}

/// [`random_wire`] with fewer than `messages` messages, each large (up to
/// 70,000 bytes) with probability `large`.
fn random_wire_of(rng: &mut impl Rng, messages: usize, large: f64) -> (Vec<u8>, Vec<Ev>, Sent) {
    let mut wire = Vec::new();
    let mut events = Vec::new();
    let mut sent = Vec::new();
    for _ in 0..rng.random_range(1..messages) {
        let text = rng.random_bool(0.5);
        let len = if rng.random_bool(large) {
            rng.random_range(0..70_000)
        } else {
            rng.random_range(0..300)
        };
        let payload: Vec<u8> = if text {
            "aé€🎵"
                .chars()
                .cycle()
                .take(len / 3)
                .collect::<String>()
                .into_bytes()
        } else {
            (0..len).map(|_| rng.random()).collect()
        };
        let opcode = if text { OpCode::Text } else { OpCode::Binary };
        let pieces = rng.random_range(1..5usize).min(payload.len().max(1));
        let mut cuts: Vec<usize> = (1..pieces)
            .map(|_| rng.random_range(0..=payload.len()))
            .collect();
        cuts.sort_unstable();
        cuts.push(payload.len());
        let mut at = 0;
        for (i, &cut) in cuts.iter().enumerate() {
            let op = if i == 0 { opcode } else { OpCode::Continuation };
            wire.extend(frame(i + 1 == cuts.len(), op, &payload[at..cut]));
            at = cut;
            if i + 1 < cuts.len() && rng.random_bool(0.3) {
                let ping: Vec<u8> = (0..rng.random_range(0..=125))
                    .map(|_| rng.random())
                    .collect();
                wire.extend(frame(true, OpCode::Ping, &ping));
                events.push(Ev::Ping(ping.clone()));
                sent.push((OpCode::Pong, ping));
            }
        }
        events.push(if text {
            Ev::Text(String::from_utf8(payload).unwrap())
        } else {
            Ev::Binary(payload)
        });
    }
    wire.extend(close_frame(1000, b"end"));
    events.push(Ev::Closed(1000, "end".into()));
    sent.push((OpCode::Close, close_payload(1000)));
    (wire, events, sent)
}

#[test]
fn byte_by_byte_and_random_chunks_give_the_same_events() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for round in 0..crate::rounds(60) {
        let (wire, events, sent) = random_wire(&mut rng);
        let whole = {
            let mut h = Harness::new();
            let ev = h.feed(&wire);
            (ev, h.sent())
        };
        assert_eq!(whole.0, events, "round {round}, all at once");
        assert_eq!(whole.1, sent, "round {round}, all at once");

        let mut h = Harness::new();
        let mut ev = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            // Byte by byte is too slow for Miri.
            let n = if round % 3 == 0 && !cfg!(miri) {
                1
            } else {
                rng.random_range(1..=2000).min(wire.len() - at)
            };
            ev.extend(h.feed(&wire[at..at + n]));
            at += n;
        }
        assert_eq!(ev, events, "round {round}, in chunks");
        assert_eq!(h.sent(), sent, "round {round}, in chunks");
    }
}

#[test]
fn a_cleared_buffer_after_an_event_is_not_a_reason_to_panic() {
    let mut h = Harness::new();
    h.input
        .extend_from_slice(&frame(true, OpCode::Binary, &[1u8; 50]));
    assert!(
        h.session
            .poll_event(&mut h.input, &mut h.out)
            .unwrap()
            .is_some()
    );
    let mut other = BytesMut::new();
    assert!(
        h.session
            .poll_event(&mut other, &mut h.out)
            .unwrap()
            .is_none()
    );
}

#[test]
fn fragments_do_not_ask_for_read_buffer_room() {
    let mut h = Harness::new();
    let first = frame(false, OpCode::Binary, &[0u8; 5000]);
    assert!(h.feed(&first[..100]).is_empty());
    assert_eq!(
        h.session.bytes_wanted(),
        0,
        "fragments stream into the assembly buffer"
    );
}

/// Compressed messages (permessage-deflate negotiated).
#[cfg(feature = "deflate")]
mod deflate {
    use super::*;
    use crate::proto::Role;
    use crate::proto::deflate::{Compressor, DeflateConfig, DeflateParams};
    use crate::proto::frame::RSV1;

    fn params(client_keeps_context: bool) -> DeflateParams {
        DeflateParams::new(true, !client_keeps_context)
    }

    fn harness(limits: Limits, client_keeps_context: bool) -> Harness {
        let pool = Arc::new(BufferPool::default());
        Harness {
            session: Session::with_deflate(
                Role::Server,
                limits,
                pool,
                Some(&params(client_keeps_context)),
            ),
            input: BytesMut::new(),
            out: WriteQueue::new(),
        }
    }

    /// What a client sends: the message compressed, its tail cut off.
    fn compress(compressor: &mut Compressor, message: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        assert!(compressor.compress(message, &mut out));
        out.to_vec()
    }

    fn client(keeps_context: bool) -> Compressor {
        Compressor::new(
            Role::Client,
            &params(keeps_context),
            &DeflateConfig::default(),
        )
    }

    fn masked(fin: bool, rsv: u8, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, fin, rsv, opcode, payload, Some(KEY));
        out
    }

    #[test]
    fn a_compressed_session_moves_between_messages_unless_the_peer_keeps_its_window() {
        let text = "handoff, handoff, handoff".repeat(8);
        // The peer starts each message afresh: between messages it moves,
        // and the successor inflates what comes next.
        let mut h = harness(Limits::default(), false);
        let mut peer = client(false);
        let first = masked(
            true,
            RSV1,
            OpCode::Text,
            &compress(&mut peer, text.as_bytes()),
        );
        assert_eq!(h.feed(&first), [Ev::Text(text.clone())]);
        let second = masked(
            true,
            RSV1,
            OpCode::Text,
            &compress(&mut peer, text.as_bytes()),
        );
        let (start, end) = second.split_at(5);
        assert!(h.feed(start).is_empty());
        // Its header not whole yet: nothing of it was taken, so it moves.
        let mut b = hand_over(&mut h).expect("moves between compressed messages");
        assert_eq!(b.feed(end), [Ev::Text(text.clone())]);
        // Halfway through a fragmented compressed message it cannot.
        let wire = compress(&mut peer, text.as_bytes());
        let (a, rest) = wire.split_at(wire.len() / 2);
        assert!(b.feed(&masked(false, RSV1, OpCode::Text, a)).is_empty());
        assert_eq!(
            hand_over(&mut b).err(),
            Some(super::super::Unmovable::CompressedMessage)
        );
        assert_eq!(
            b.feed(&masked(true, 0, OpCode::Continuation, rest)),
            [Ev::Text(text.clone())]
        );
        // A peer that keeps its window: the inflater's zlib state stays here.
        let mut h = harness(Limits::default(), true);
        assert_eq!(
            hand_over(&mut h).err(),
            Some(super::super::Unmovable::InflateContext)
        );
    }

    #[test]
    fn compressed_messages_are_inflated_whole_or_fragmented_with_context() {
        let mut h = harness(Limits::default(), true);
        let mut peer = client(true);
        let text = "permessage-deflate, permessage-deflate, permessage-deflate".repeat(5);
        let wire = compress(&mut peer, text.as_bytes());
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Text, &wire)),
            [Ev::Text(text.clone())]
        );
        // The same message again refers back to the first: context kept.
        let wire = compress(&mut peer, text.as_bytes());
        assert!(wire.len() < 10);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Text, &wire)),
            [Ev::Text(text)]
        );

        // Fragmented, with a ping between fragments, fed byte by byte.
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let wire = compress(&mut peer, &data);
        let (a, b) = wire.split_at(wire.len() / 3);
        let mut bytes = masked(false, RSV1, OpCode::Binary, a);
        bytes.extend(frame(true, OpCode::Ping, b"p"));
        bytes.extend(masked(true, 0, OpCode::Continuation, b));
        let mut events = Vec::new();
        for byte in bytes {
            events.extend(h.feed(&[byte]));
        }
        assert_eq!(events, [Ev::Ping(b"p".to_vec()), Ev::Binary(data)]);
        // Plain messages still pass.
        assert_eq!(
            h.feed(&frame(true, OpCode::Text, b"plain")),
            [Ev::Text("plain".into())]
        );
    }

    #[test]
    fn rsv1_is_refused_where_it_does_not_belong() {
        let mut peer = client(false);
        let wire = compress(&mut peer, b"hello hello hello");
        // Not negotiated.
        let mut h = Harness::new();
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Text, &wire)),
            [Ev::Failed(1002)]
        );
        // On a control frame, and on a continuation.
        let mut h = harness(Limits::default(), false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Ping, b"")),
            [Ev::Failed(1002)]
        );
        let mut h = harness(Limits::default(), false);
        let mut bytes = masked(false, RSV1, OpCode::Text, &wire);
        bytes.extend(masked(true, RSV1, OpCode::Continuation, b""));
        assert_eq!(h.feed(&bytes), [Ev::Failed(1002)]);
        // RSV2 and RSV3 stay reserved.
        let mut h = harness(Limits::default(), false);
        assert_eq!(
            h.feed(&masked(true, 0b010, OpCode::Text, b"x")),
            [Ev::Failed(1002)]
        );
    }

    #[test]
    fn invalid_compressed_data_fails_with_1007() {
        let mut h = harness(Limits::default(), false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Binary, &[0xff, 0xff])),
            [Ev::Failed(1007)]
        );
        let sent = h.sent();
        assert_eq!(sent[0].0, OpCode::Close);
        assert_eq!(sent[0].1[..2], close_payload(1007)[..]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "a megabyte is too much for Miri")]
    fn inflated_size_is_bounded_by_the_message_limit() {
        let limits = Limits {
            max_frame_size: 1 << 20,
            max_message_size: 10_000,
        };
        let mut peer = client(false);
        let wire = compress(&mut peer, &[b'a'; 10_001]);
        assert!(wire.len() < 10_001 / 10, "a small frame: {}", wire.len());
        let mut h = harness(limits, false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Binary, &wire)),
            [Ev::Failed(1009)]
        );
        let wire = compress(&mut peer, &[b'a'; 10_000]);
        let mut h = harness(limits, false);
        assert_eq!(h.feed(&masked(true, RSV1, OpCode::Binary, &wire)).len(), 1);
        // A bomb: a megabyte of zeros in about a kilobyte, with a 1 MiB frame
        // limit but the 10 KB message limit; stops at the limit.
        let wire = compress(&mut peer, &vec![0u8; 1 << 20]);
        let mut h = harness(limits, false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Binary, &wire)),
            [Ev::Failed(1009)]
        );
    }

    #[test]
    fn compressed_text_is_checked_as_it_is_inflated() {
        let mut peer = client(false);
        let mut bad = "valid start ".repeat(100).into_bytes();
        bad.extend_from_slice(&[0xc3, 0x28]);
        bad.extend_from_slice(&"valid end".repeat(1000).into_bytes());
        let wire = compress(&mut peer, &bad);
        // Only the first part of the frame arrives: the bad byte is already seen.
        let mut h = harness(Limits::default(), false);
        let bytes = masked(true, RSV1, OpCode::Text, &wire);
        assert_eq!(h.feed(&bytes[..bytes.len() - 5]), [Ev::Failed(1007)]);
        // Ending inside a character.
        let wire = compress(
            &mut peer,
            "ends in "
                .repeat(20)
                .as_bytes()
                .iter()
                .chain(&[0xe2, 0x82])
                .copied()
                .collect::<Vec<_>>()
                .as_slice(),
        );
        let mut h = harness(Limits::default(), false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Text, &wire)),
            [Ev::Failed(1007)]
        );
    }

    #[test]
    fn an_empty_compressed_message_is_one_zero_byte() {
        let mut h = harness(Limits::default(), false);
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Text, &[0x00])),
            [Ev::Text(String::new())]
        );
        assert_eq!(
            h.feed(&masked(true, RSV1, OpCode::Binary, &[])),
            [Ev::Binary(Vec::new())]
        );
    }

    #[test]
    fn random_chunks_of_compressed_traffic_give_the_same_events() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for keep in [false, true] {
            let mut peer = client(keep);
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for i in 0..crate::rounds(40) {
                let len = rng.random_range(0..3000);
                let text: String = (0..len)
                    .map(|j| char::from(b'a' + ((i * j) % 7) as u8))
                    .collect();
                let packed = compress(&mut peer, text.as_bytes());
                let cut = rng.random_range(0..=packed.len());
                if cut == packed.len() {
                    wire.extend(masked(true, RSV1, OpCode::Text, &packed));
                } else {
                    wire.extend(masked(false, RSV1, OpCode::Text, &packed[..cut]));
                    wire.extend(masked(true, 0, OpCode::Continuation, &packed[cut..]));
                }
                expected.push(Ev::Text(text));
            }
            let mut h = harness(Limits::default(), keep);
            let mut events = Vec::new();
            let mut at = 0;
            while at < wire.len() {
                let n = rng.random_range(1..700).min(wire.len() - at);
                events.extend(h.feed(&wire[at..at + n]));
                at += n;
            }
            assert_eq!(events, expected, "context kept: {keep}");
        }
    }

    #[test]
    fn an_idle_session_holds_no_inflate_state_without_client_context() {
        let mut h = harness(Limits::default(), false);
        let mut peer = client(false);
        let wire = compress(&mut peer, &[7u8; 500]);
        assert_eq!(h.feed(&masked(true, RSV1, OpCode::Binary, &wire)).len(), 1);
        h.feed(&[]);
        assert!(!h.session.inflater.as_ref().unwrap().holds_stream());
        let mut h = harness(Limits::default(), true);
        assert_eq!(h.feed(&masked(true, RSV1, OpCode::Binary, &wire)).len(), 1);
        assert!(h.session.inflater.as_ref().unwrap().holds_stream());
    }
}

mod client_role {
    use super::*;
    use crate::proto::deflate::{Compressor, DeflateConfig, DeflateParams};
    use crate::proto::frame::RSV1;

    fn client(deflate: Option<&DeflateParams>) -> Harness {
        Harness {
            session: Session::with_deflate(
                Role::Client,
                Limits::default(),
                Arc::new(BufferPool::default()),
                deflate,
            ),
            input: BytesMut::new(),
            out: WriteQueue::with_role(Role::Client),
        }
    }

    /// A server frame: never masked.
    fn unmasked(fin: bool, rsv: u8, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, fin, rsv, opcode, payload, None);
        out
    }

    /// The client's replies, checked to be masked and unmasked for reading.
    fn sent_by_client(h: &mut Harness) -> Sent {
        let mut bytes = Vec::new();
        h.out.move_into(&mut bytes);
        let mut frames = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let (header, len) = decode_header(&bytes[at..], DecodeRules::SERVER)
                .expect("a client frame is masked")
                .expect("a whole frame");
            let start = at + len;
            let end = start + header.payload_len as usize;
            let mut payload = bytes[start..end].to_vec();
            apply_mask(&mut payload, header.mask.unwrap(), 0);
            frames.push((header.opcode, payload));
            at = end;
        }
        frames
    }

    #[test]
    fn a_client_session_reports_its_role() {
        assert_eq!(client(None).session.role(), Role::Client);
        assert_eq!(Harness::new().session.role(), Role::Server);
    }

    #[test]
    fn a_client_fails_a_masked_server_frame_with_1002() {
        let mut h = client(None);
        assert_eq!(
            h.feed(&frame(true, OpCode::Text, b"hi")),
            [Ev::Failed(1002)]
        );
        let sent = sent_by_client(&mut h);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, OpCode::Close);
        assert_eq!(sent[0].1[..2], close_payload(1002)[..]);
        assert_eq!(&sent[0].1[2..], b"server frame is masked");
    }

    #[test]
    fn a_server_still_fails_an_unmasked_client_frame_with_1002() {
        let mut h = Harness::new();
        assert_eq!(
            h.feed(&unmasked(true, 0, OpCode::Text, b"hi")),
            [Ev::Failed(1002)]
        );
        let sent = h.sent();
        assert_eq!(sent[0].0, OpCode::Close);
        assert_eq!(&sent[0].1[2..], b"client frame is not masked");
    }

    #[test]
    fn a_client_reads_server_frames_and_masks_its_replies() {
        let mut h = client(None);
        let mut wire = unmasked(false, 0, OpCode::Text, "héllo ".as_bytes());
        wire.extend(unmasked(true, 0, OpCode::Ping, b"between"));
        wire.extend(unmasked(true, 0, OpCode::Continuation, "wörld".as_bytes()));
        wire.extend(unmasked(true, 0, OpCode::Binary, &[0, 1, 2]));
        let mut close = 1000u16.to_be_bytes().to_vec();
        close.extend_from_slice(b"done");
        wire.extend(unmasked(true, 0, OpCode::Close, &close));
        // Byte by byte, so the unmasked path sees every partial state.
        let events: Vec<Ev> = wire.iter().flat_map(|b| h.feed(&[*b])).collect();
        assert_eq!(
            events,
            [
                Ev::Ping(b"between".to_vec()),
                Ev::Text("héllo wörld".to_owned()),
                Ev::Binary(vec![0, 1, 2]),
                Ev::Closed(1000, "done".to_owned()),
            ]
        );
        assert_eq!(
            sent_by_client(&mut h),
            [
                (OpCode::Pong, b"between".to_vec()),
                (OpCode::Close, close_payload(1000)),
            ]
        );
    }

    #[test]
    fn a_client_close_is_masked() {
        let mut h = client(None);
        assert!(h.session.close(CloseCode::GOING_AWAY, "bye", &mut h.out));
        let mut expected = close_payload(1001);
        expected.extend_from_slice(b"bye");
        assert_eq!(sent_by_client(&mut h), [(OpCode::Close, expected)]);
    }

    #[test]
    fn a_client_inflates_with_the_servers_context_rule() {
        // The server keeps its context, the client does not: the client's
        // inflater must keep its window, whatever the client's own rule.
        let params = DeflateParams::new(false, true);
        let mut h = client(Some(&params));
        let mut server = Compressor::new(Role::Server, &params, &DeflateConfig::default());
        let message = b"the same words, again and again and again".repeat(4);
        for _ in 0..3 {
            let mut packed = BytesMut::new();
            assert!(server.compress(&message, &mut packed));
            let wire = unmasked(true, RSV1, OpCode::Binary, &packed);
            assert_eq!(h.feed(&wire), [Ev::Binary(message.clone())]);
        }
        assert!(h.session.inflater.as_ref().unwrap().holds_stream());

        // And the other way round: a server without context leaves the
        // client's inflater idle between messages.
        let params = DeflateParams::new(true, false);
        let mut h = client(Some(&params));
        let mut server = Compressor::new(Role::Server, &params, &DeflateConfig::default());
        let mut packed = BytesMut::new();
        assert!(server.compress(&message, &mut packed));
        let wire = unmasked(true, RSV1, OpCode::Binary, &packed);
        assert_eq!(h.feed(&wire), [Ev::Binary(message.clone())]);
        h.feed(&[]);
        assert!(!h.session.inflater.as_ref().unwrap().holds_stream());
    }
}

/// Hands the session of `a` over as a snapshot, through its encoding, to a
/// new harness that reads on from the bytes `a` had not consumed.
fn hand_over(a: &mut Harness) -> Result<Harness, super::Unmovable> {
    use crate::snapshot::{SnapshotReader, SnapshotWriter};
    let snapshot = a.session.snapshot(&mut a.input)?;
    let mut writer = SnapshotWriter::new();
    snapshot.encode(&mut writer);
    let bytes = writer.finish();
    let mut reader = SnapshotReader::new(&bytes);
    let decoded = super::SessionSnapshot::decode(&mut reader).expect("decodes");
    reader.finish().expect("nothing left over");
    assert_eq!(decoded, snapshot);
    let session = Session::restore(&decoded, Limits::default(), Arc::new(BufferPool::default()))
        .expect("restores");
    Ok(Harness {
        session,
        input: a.input.split(),
        out: WriteQueue::new(),
    })
}

#[test]
fn a_session_handed_over_anywhere_goes_on_exactly_where_it_stopped() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x4a4d);
    let mut mid_frame = 0;
    // Under Miri, which interprets every byte twice here, three short
    // conversations.
    let rounds = if cfg!(miri) { 3 } else { 200 };
    for round in 0..rounds {
        let (wire, events, sent) = if cfg!(miri) {
            random_wire_of(&mut rng, 4, 0.0)
        } else {
            random_wire(&mut rng)
        };
        // Where the old process stops reading: anywhere, often inside a
        // frame or a fragmented message.
        let stop = rng.random_range(0..=wire.len());
        let mut a = Harness::new();
        let mut got = Vec::new();
        let mut at = 0;
        while at < stop {
            let n = rng.random_range(1..=3000).min(stop - at);
            got.extend(a.feed(&wire[at..at + n]));
            at += n;
        }
        let mut b = match hand_over(&mut a) {
            Ok(b) => b,
            Err(super::Unmovable::Closing) => {
                // It read the close already: nothing is left to hand over.
                assert_eq!(got, events, "round {round}");
                continue;
            }
            Err(other) => panic!("round {round}: {other}"),
        };
        if !b.input.is_empty() || b.session.frame.is_some() {
            mid_frame += 1;
        }
        got.extend(b.feed(&[]));
        while at < wire.len() {
            let n = rng.random_range(1..=3000).min(wire.len() - at);
            got.extend(b.feed(&wire[at..at + n]));
            at += n;
        }
        assert_eq!(
            got,
            events,
            "round {round}, stopped at {stop} of {}",
            wire.len()
        );
        let mut replies = a.sent();
        replies.extend(b.sent());
        assert_eq!(replies, sent, "round {round}");
    }
    if !cfg!(miri) {
        assert!(mid_frame > 10, "only {mid_frame} hand-overs inside a frame");
    }
}

#[test]
fn sessions_that_cannot_move_say_why() {
    // Closing: our close is out.
    let mut h = Harness::new();
    assert!(h.session.close(CloseCode::NORMAL, "", &mut h.out));
    assert_eq!(hand_over(&mut h).err(), Some(super::Unmovable::Closing));
    // A failure held for the application.
    let mut h = Harness::new();
    h.session.hold_closes();
    h.feed(&frame(true, OpCode::Continuation, b"x"));
    assert_eq!(hand_over(&mut h).err(), Some(super::Unmovable::HeldClose));
}

#[test]
fn snapshots_that_a_session_could_not_have_made_are_refused() {
    use crate::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};
    // A fragmented text message half received, with a fragment in progress.
    let mut h = Harness::new();
    h.feed(&frame(false, OpCode::Text, "é".as_bytes()));
    let mut continuation = frame(true, OpCode::Continuation, b"abcdef");
    continuation.truncate(continuation.len() - 3);
    h.feed(&continuation);
    let snapshot = h.session.snapshot(&mut h.input).unwrap();
    let mut writer = SnapshotWriter::new();
    snapshot.encode(&mut writer);
    let good = writer.finish();
    // Limits above what this process gives a connection are refused.
    let small = Limits {
        max_frame_size: 4,
        max_message_size: 4,
    };
    assert_eq!(
        Session::restore(&snapshot, small, Arc::new(BufferPool::default())).err(),
        Some(SnapshotError::Invalid("limits above this process's"))
    );
    // Every truncation is refused, never a panic.
    for cut in 0..good.len() {
        let mut reader = SnapshotReader::new(&good[..cut]);
        assert!(
            super::SessionSnapshot::decode(&mut reader).is_err(),
            "cut {cut}"
        );
    }
    // Every single-byte change either fails to decode, fails to restore, or
    // restores a session that reads on without panicking.
    // Every byte natively; under Miri, which interprets each restore and
    // read, every fifth, with one pattern.
    let (step, flips): (usize, &[u8]) = if cfg!(miri) {
        (5, &[0x80])
    } else {
        (1, &[0x01, 0x80, 0xff])
    };
    for at in (0..good.len()).step_by(step) {
        for &flip in flips {
            let mut bad = good.clone();
            bad[at] ^= flip;
            let mut reader = SnapshotReader::new(&bad);
            let Ok(decoded) = super::SessionSnapshot::decode(&mut reader) else {
                continue;
            };
            if let Ok(session) =
                Session::restore(&decoded, Limits::default(), Arc::new(BufferPool::default()))
            {
                let mut b = Harness {
                    session,
                    input: BytesMut::new(),
                    out: WriteQueue::new(),
                };
                b.feed(b"def");
                b.feed(&frame(true, OpCode::Binary, b"next"));
            }
        }
    }
    // A version we do not know.
    let mut bad = good.clone();
    bad[0] = 9;
    assert_eq!(
        super::SessionSnapshot::decode(&mut SnapshotReader::new(&bad)).err(),
        Some(SnapshotError::Version(9))
    );
}
