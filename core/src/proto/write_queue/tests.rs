use super::*;
use crate::proto::frame::{DecodeRules, FrameHeader, decode_header};

#[test]
fn large_copies_never_land_just_ahead_of_their_source() {
    // Sources at every offset within 64 bytes, into tails at every offset:
    // the bytes written are the same, the copy never starts 1-63 bytes ahead.
    let source = vec![0xabu8; 5000 + 64];
    for src_offset in 0..64 {
        for prefix in [0usize, 1, 3, 60] {
            let mut q = WriteQueue::new();
            q.provide_buffer(BytesMut::with_capacity(16 * 1024));
            q.push_raw(&vec![b'x'; prefix]);
            let payload = &source[src_offset..src_offset + 5000];
            q.push_frame(true, 0, OpCode::Binary, payload);
            let copy = q.tail.as_ptr() as usize + q.tail.len() - payload.len();
            let ahead = copy.wrapping_sub(payload.as_ptr() as usize) % 4096;
            assert!(
                !(1..64).contains(&ahead),
                "src {src_offset} prefix {prefix}"
            );
            let mut expected = vec![b'x'; prefix];
            let mut header = [0u8; MAX_HEADER_LEN];
            let n = encode_header(&mut header, true, 0, OpCode::Binary, 5000, None);
            expected.extend_from_slice(&header[..n]);
            expected.extend_from_slice(payload);
            assert_eq!(drain(&mut q, 1000), expected);
        }
    }
}

fn drain(q: &mut WriteQueue, max_per_write: usize) -> Vec<u8> {
    let mut written = Vec::new();
    while !q.is_empty() {
        let mut slices = [IoSlice::new(&[]); 4];
        let n = q.io_slices(&mut slices);
        let mut budget = max_per_write;
        let mut took = 0;
        for s in &slices[..n] {
            let k = s.len().min(budget);
            written.extend_from_slice(&s[..k]);
            budget -= k;
            took += k;
        }
        q.advance(took);
    }
    written
}

#[test]
fn keeps_frame_order_across_copied_and_shared_payloads() {
    let big = Bytes::from(vec![0xAB; 4000]);
    let mut q = WriteQueue::new();
    q.push_frame(true, 0, OpCode::Text, b"one");
    q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
    q.push_frame(true, 0, OpCode::Pong, b"p");
    q.push_frame_shared(true, 0, OpCode::Binary, Bytes::from_static(b"tiny"));

    let mut expected = vec![0x81, 3];
    expected.extend_from_slice(b"one");
    expected.extend_from_slice(&[0x82, 126, 0x0F, 0xA0]);
    expected.extend_from_slice(&big);
    expected.extend_from_slice(&[0x8A, 1, b'p', 0x82, 4]);
    expected.extend_from_slice(b"tiny");
    assert_eq!(q.len(), expected.len());

    for max in [1usize, 3, 7, 1000, usize::MAX] {
        let mut copy = WriteQueue::new();
        copy.push_frame(true, 0, OpCode::Text, b"one");
        copy.push_frame_shared(true, 0, OpCode::Binary, big.clone());
        copy.push_frame(true, 0, OpCode::Pong, b"p");
        copy.push_frame_shared(true, 0, OpCode::Binary, Bytes::from_static(b"tiny"));
        assert_eq!(drain(&mut copy, max), expected, "{max} bytes per write");
    }
    let mut all = vec![0xEE];
    q.move_into(&mut all);
    assert_eq!((all[0], &all[1..]), (0xEE, &expected[..]));
    assert!(q.is_empty());
}

#[test]
fn large_shared_payloads_are_not_copied() {
    let big = Bytes::from(vec![1u8; 10_000]);
    let mut q = WriteQueue::new();
    q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
    let mut slices = [IoSlice::new(&[]); 4];
    let n = q.io_slices(&mut slices);
    assert_eq!(n, 2, "header and payload");
    assert_eq!(slices[1].as_ptr(), big.as_ptr());
}

#[test]
fn frames_written_in_place_get_the_header_their_length_needs() {
    // Guesses below, at and above each header-size boundary, and payloads
    // that end up shorter or longer than guessed.
    for (guess, actual) in [
        (10, 10),
        (10, 125),
        (10, 126),
        (200, 100),
        (200, 70_000),
        (70_000, 200),
        (70_000, 65_536),
        (0, 0),
    ] {
        let mut q = WriteQueue::new();
        q.push_raw(b"before");
        let payload: Vec<u8> = (0..actual).map(|i| i as u8).collect();
        assert!(
            q.push_frame_with(true, RSV1_BITS, OpCode::Text, guess, |buf| {
                buf.extend_from_slice(&payload);
                true
            })
        );
        q.push_raw(b"after");
        let mut expected = b"before".to_vec();
        let mut header = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut header,
            true,
            RSV1_BITS,
            OpCode::Text,
            actual as u64,
            None,
        );
        expected.extend_from_slice(&header[..n]);
        expected.extend_from_slice(&payload);
        expected.extend_from_slice(b"after");
        assert_eq!(q.len(), expected.len(), "{guess} then {actual}");
        assert_eq!(drain(&mut q, usize::MAX), expected, "{guess} then {actual}");
    }
    let mut q = WriteQueue::new();
    q.push_raw(b"x");
    assert!(!q.push_frame_with(true, 0, OpCode::Binary, 50, |_| false));
    assert_eq!(drain(&mut q, usize::MAX), b"x");
}

const RSV1_BITS: u8 = 0b100;

#[test]
fn append_moves_everything_in_order() {
    let mut a = WriteQueue::new();
    a.push_raw(b"a");
    let mut b = WriteQueue::new();
    b.push_raw(b"b");
    b.push_frame_shared(true, 0, OpCode::Binary, Bytes::from(vec![2u8; 600]));
    b.push_raw(b"c");
    a.append(&mut b);
    assert!(b.is_empty());
    let out = drain(&mut a, usize::MAX);
    assert_eq!(&out[..2], b"ab");
    assert_eq!(out.len(), 2 + 4 + 600 + 1);
    assert_eq!(out[out.len() - 1], b'c');
}

/// Every frame in `bytes`, checked to be masked, as (header, unmasked
/// payload).
fn client_frames(bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    frames(bytes, DecodeRules::SERVER)
}

/// Every frame in `bytes`, decoded by `rules` (RSV1 allowed), as (header,
/// unmasked payload); panics on a frame cut short or malformed.
fn frames(bytes: &[u8], rules: DecodeRules) -> Vec<(FrameHeader, Vec<u8>)> {
    let rules = DecodeRules {
        allowed_rsv: RSV1_BITS,
        ..rules
    };
    let mut frames = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (header, len) = decode_header(rest, rules)
            .expect("a well-formed frame")
            .expect("a whole frame");
        let end = len + header.payload_len as usize;
        let mut payload = rest[len..end].to_vec();
        if let Some(key) = header.mask {
            apply_mask(&mut payload, key, 0);
        }
        frames.push((header, payload));
        rest = &rest[end..];
    }
    frames
}

#[test]
fn a_client_queue_masks_every_kind_of_push_with_its_own_key() {
    let big = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let small = Bytes::from_static(b"small shared");
    let written: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    let mut q = WriteQueue::with_role(Role::Client);
    assert_eq!(q.role(), Role::Client);
    q.push_frame(true, 0, OpCode::Text, b"copied");
    q.push_frame_shared(true, 0, OpCode::Binary, big.clone());
    q.push_frame_shared(false, 0, OpCode::Binary, small.clone());
    q.push_frame(true, 0, OpCode::Continuation, b"");
    q.push_frame(true, 0, OpCode::Ping, b"ping");
    // A guess too small for the header the payload needs.
    assert!(
        q.push_frame_with(true, RSV1_BITS, OpCode::Binary, 10, |buf| {
            buf.extend_from_slice(&written);
            true
        })
    );
    assert!(!q.push_frame_with(true, 0, OpCode::Binary, 10, |_| false));
    let len = q.len();
    let mut bytes = Vec::new();
    q.move_into(&mut bytes);
    assert_eq!(bytes.len(), len);
    let frames = client_frames(&bytes);
    let payloads: Vec<&[u8]> = frames.iter().map(|(_, p)| &p[..]).collect();
    assert_eq!(
        payloads,
        [&b"copied"[..], &big, &small, b"", b"ping", &written]
    );
    assert_eq!(frames[5].0.rsv, RSV1_BITS);
    assert!(!frames[2].0.fin);
    let mut keys: Vec<[u8; 4]> = frames.iter().map(|(h, _)| h.mask.unwrap()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), frames.len(), "a fresh key per frame");
    // The shared payloads were copied to be masked, not masked in place.
    assert_eq!(big[..4], [0, 1, 2, 3]);
    assert_eq!(&small[..], b"small shared");
}

#[test]
fn a_client_queue_keeps_its_role_through_draining_and_appending() {
    let mut q = WriteQueue::with_role(Role::Client);
    q.push_frame(true, 0, OpCode::Text, b"x");
    let mut server = WriteQueue::new();
    server.push_raw(b"raw");
    q.append(&mut server);
    assert_eq!((q.role(), server.role()), (Role::Client, Role::Server));
    assert_eq!(q.len(), 2 + 4 + 1 + 3);
    q.advance(q.len());
    assert!(q.is_empty());
    assert_eq!(q.role(), Role::Client);
    q.push_frame(true, 0, OpCode::Text, b"y");
    let mut bytes = Vec::new();
    q.move_into(&mut bytes);
    assert_eq!(client_frames(&bytes)[0].1, b"y");
    assert_eq!(WriteQueue::default().role(), Role::Server);
}

#[test]
fn the_role_costs_a_server_queue_no_space() {
    // Every idle connection holds a queue in its `ConnShared`.
    assert_eq!(size_of::<WriteQueue>(), 48);
}

#[test]
fn the_copy_buffer_can_be_taken_out_and_given_back() {
    let mut q = WriteQueue::new();
    assert!(q.needs_buffer());
    assert!(q.provide_buffer(BytesMut::with_capacity(64)).is_none());
    q.push_raw(b"xy");
    assert!(q.take_buffer().is_none(), "not while bytes are queued");
    q.advance(2);
    let buf = q.take_buffer().expect("empty queue gives its buffer back");
    assert!(buf.capacity() > 0);
    assert!(q.needs_buffer());
}

/// Every frame in a server's `bytes`, as (header, payload).
fn server_frames(bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    frames(bytes, DecodeRules::CLIENT)
}

/// The first byte of each frame's payload, as a char: tests tag payloads.
fn tags(frames: &[(FrameHeader, Vec<u8>)]) -> String {
    frames
        .iter()
        .map(|(_, p)| p.first().map_or('-', |&b| b as char))
        .collect()
}

fn big(tag: u8, len: usize) -> Bytes {
    Bytes::from(vec![tag; len])
}

#[test]
fn replies_overtake_messages_not_started_and_wait_for_the_one_being_written() {
    let mut q = WriteQueue::new();
    for tag in [b'a', b'b', b'c'] {
        q.push_frame_shared(true, 0, OpCode::Binary, big(tag, 40_000));
    }
    let mut wire = Vec::new();
    // The writer is 10 bytes into `a`.
    let mut slices = [IoSlice::new(&[]); 8];
    let n = q.io_slices(&mut slices);
    wire.extend_from_slice(
        &slices[..n]
            .iter()
            .flat_map(|s| s.iter())
            .copied()
            .take(10)
            .collect::<Vec<_>>(),
    );
    q.advance(10);
    q.push_reply(0, OpCode::Text, b"1st");
    q.push_reply(0, OpCode::Text, b"2nd");
    assert_eq!(q.reply_len(), 10);
    q.move_into(&mut wire);
    assert_eq!(tags(&server_frames(&wire)), "a12bc");
}

#[test]
fn replies_go_first_when_nothing_has_started_and_in_order_when_nothing_waits() {
    let mut q = WriteQueue::new();
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'a', 40_000));
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'b', 40_000));
    q.push_reply(0, OpCode::Text, b"r");
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    assert_eq!(tags(&server_frames(&wire)), "rab");

    // An empty queue, or one of small messages: the reply takes its place
    // in line, with no spill made.
    let mut q = WriteQueue::new();
    q.push_frame(true, 0, OpCode::Text, b"x");
    q.push_reply(0, OpCode::Text, b"r");
    assert!(q.spill.is_none());
    assert_eq!(q.reply_len(), 0);
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    assert_eq!(tags(&server_frames(&wire)), "xr");
}

#[test]
fn a_reply_never_lands_inside_a_fragmented_message() {
    // Started: the reply waits for all its fragments, even ones pushed later;
    // a pong may go between them.
    let mut q = WriteQueue::new();
    q.push_frame(false, 0, OpCode::Binary, &[b'f'; 20_000]);
    q.advance(3);
    q.push_reply(0, OpCode::Text, b"r");
    q.push_pong(b"p");
    q.push_frame(false, 0, OpCode::Continuation, &[b'g'; 20_000]);
    q.push_frame(true, 0, OpCode::Continuation, &[b'h'; 100]);
    q.push_frame(true, 0, OpCode::Binary, &[b'z'; 100]);
    let mut wire = vec![0x02, 126, 0x4e];
    q.move_into(&mut wire);
    let frames = server_frames(&wire);
    assert_eq!(tags(&frames), "fghrpz");
    assert_valid_message_stream(&frames);

    // Not started: the reply goes ahead of it (and of the message before,
    // which has not started either).
    let mut q = WriteQueue::new();
    q.push_frame(true, 0, OpCode::Binary, &[b'a'; 20_000]);
    q.push_frame(false, 0, OpCode::Binary, &[b'f'; 10]);
    q.push_reply(0, OpCode::Text, b"r");
    q.push_frame(true, 0, OpCode::Continuation, &[b'g'; 10]);
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    let frames = server_frames(&wire);
    assert_eq!(tags(&frames), "rafg");
    assert_valid_message_stream(&frames);
}

/// Data frames form whole messages: no new message starts while one is
/// fragmented, and continuations come only inside one.
fn assert_valid_message_stream(frames: &[(FrameHeader, Vec<u8>)]) {
    let mut open = false;
    for (i, (header, _)) in frames.iter().enumerate() {
        match header.opcode {
            OpCode::Continuation => assert!(open, "frame {i}: a continuation outside a message"),
            OpCode::Text | OpCode::Binary => assert!(!open, "frame {i}: a message inside another"),
            _ => continue,
        }
        open = !header.fin;
    }
    assert!(!open, "the last message is unfinished");
}

#[test]
fn pongs_behind_a_stuck_write_are_all_kept_up_to_the_budget() {
    let mut q = WriteQueue::new();
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'a', 40_000));
    let mut calls = 0;
    let written = q
        .write_with(|_| {
            calls += 1;
            if calls > 1 {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(100)
            }
        })
        .unwrap();
    assert_eq!(
        written,
        Written {
            bytes: 100,
            all: false
        }
    );
    // Autobahn 2.10 over a stream slow to take writes: ten pings, ten pongs.
    let before = q.len();
    for i in 0..10u32 {
        q.push_pong(&i.to_be_bytes());
    }
    assert_eq!(q.len(), before + 10 * 6, "ten pongs wait");
    let mut wire = vec![0u8; 0];
    let mut header = [0u8; MAX_HEADER_LEN];
    let n = encode_header(&mut header, true, 0, OpCode::Binary, 40_000, None);
    wire.extend_from_slice(&header[..n]);
    wire.extend_from_slice(&[b'a'; 100 - 4]);
    q.move_into(&mut wire);
    let frames = server_frames(&wire);
    assert_eq!(frames.len(), 11);
    for (i, frame) in frames[1..].iter().enumerate() {
        assert_eq!(frame.1, (i as u32).to_be_bytes());
    }
}

#[test]
fn pongs_are_all_sent_while_writes_go_through_and_a_started_one_is_kept() {
    // Autobahn 2.10: ten pings in one read get ten pongs.
    let mut q = WriteQueue::new();
    for i in 0..10u8 {
        q.push_pong(&[b'0' + i]);
    }
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    assert_eq!(tags(&server_frames(&wire)), "0123456789");

    // With the first pong partly written, the next ones are added after it.
    let mut q = WriteQueue::new();
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'a', 40_000));
    q.advance(10);
    q.push_pong(b"p");
    q.advance(40_004 - 10 + 1);
    q.push_pong(b"q");
    q.push_pong(b"r");
    let mut wire = vec![];
    q.move_into(&mut wire);
    assert_eq!(&wire[..2], &[1, b'p'], "the rest of the first pong");
    assert_eq!(tags(&server_frames(&wire[2..])), "qr");
}

#[test]
fn taking_to_send_stops_at_a_boundary_so_replies_can_still_overtake_the_rest() {
    let mut q = WriteQueue::new();
    for tag in b'a'..=b'e' {
        q.push_frame_shared(true, 0, OpCode::Binary, big(tag, 1 << 20));
    }
    let mut first = q.take_to_send(256 * 1024);
    assert_eq!(first.len(), (1 << 20) + 10, "one message");
    q.push_reply(0, OpCode::Text, b"r");
    let mut second = q.take_to_send(256 * 1024);
    assert_eq!(
        second.len(),
        3 + (1 << 20) + 10,
        "the reply and one message"
    );
    let mut wire = Vec::new();
    first.move_into(&mut wire);
    second.move_into(&mut wire);
    q.move_into(&mut wire);
    assert_eq!(tags(&server_frames(&wire)), "arbcde");

    // A queue without a spill goes whole, buffer and all.
    let mut q = WriteQueue::with_role(Role::Client);
    q.provide_buffer(BytesMut::with_capacity(4096));
    q.push_frame(true, 0, OpCode::Text, b"x");
    let taken = q.take_to_send(1);
    assert_eq!((taken.role(), q.role()), (Role::Client, Role::Client));
    assert!(q.is_empty() && q.needs_buffer() && !taken.needs_buffer());
}

#[test]
fn a_client_queue_masks_replies_and_pongs() {
    let mut q = WriteQueue::with_role(Role::Client);
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'a', 40_000));
    q.push_frame_shared(true, 0, OpCode::Binary, big(b'b', 40_000));
    q.push_reply(0, OpCode::Text, b"reply");
    q.push_pong(b"pong");
    assert!(q.push_reply_with(RSV1_BITS, OpCode::Text, 4, |buf| {
        buf.extend_from_slice(b"made");
        true
    }));
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    let payloads: Vec<Vec<u8>> = client_frames(&wire).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        &payloads[..3],
        [b"reply".to_vec(), b"pong".to_vec(), b"made".to_vec()]
    );
    assert_eq!((payloads[3][0], payloads[4][0]), (b'a', b'b'));
}

/// Random pushes (fragmented or not), replies, pongs and writes of random
/// sizes, through both kinds of writer: the bytes always parse as whole
/// frames forming whole messages, ordered messages and replies each keep
/// their order, no byte is written twice, and the queue ends empty.
#[test]
fn random_traffic_keeps_frames_whole_and_each_lane_in_order() {
    use rand::{RngExt, SeedableRng};
    for seed in 0..crate::rounds(300) as u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut q = WriteQueue::new();
        let mut wire = Vec::new();
        let mut pushed = 0usize;
        let (mut ordered, mut replies) = (0u32, 0u32);
        let mut open = false;
        for _ in 0..rng.random_range(1..60) {
            match rng.random_range(0..10) {
                0..=3 => {
                    // An ordered message (or a fragment of one), tagged with its number.
                    let len = [1, 100, 3000, 20_000, 70_000][rng.random_range(0..5)];
                    let mut payload = vec![0u8; len.max(4)];
                    payload[..4].copy_from_slice(&ordered.to_be_bytes());
                    let fin = rng.random_bool(0.7);
                    let opcode = if open {
                        OpCode::Continuation
                    } else {
                        OpCode::Binary
                    };
                    let before = q.len();
                    if rng.random_bool(0.5) {
                        q.push_frame(fin, 0, opcode, &payload);
                    } else {
                        q.push_frame_shared(fin, 0, opcode, Bytes::from(payload));
                    }
                    pushed += q.len() - before;
                    open = !fin;
                    if fin {
                        ordered += 1;
                    }
                }
                4 | 5 => {
                    let before = q.len();
                    let mut payload = b"R".to_vec();
                    payload.extend_from_slice(&replies.to_be_bytes());
                    q.push_reply(0, OpCode::Text, &payload);
                    pushed += q.len() - before;
                    replies += 1;
                }
                6 => {
                    let before = q.len();
                    q.push_pong(b"P");
                    pushed += q.len() - before;
                }
                7 => {
                    let mut taken = q.take_to_send(rng.random_range(0..100_000));
                    taken.move_into(&mut wire);
                }
                _ => {
                    let budget = rng.random_range(0..50_000);
                    q.write_with(write_at_most(budget, &mut wire)).unwrap();
                }
            }
        }
        if open {
            let before = q.len();
            q.push_frame(true, 0, OpCode::Continuation, b"end!");
            pushed += q.len() - before;
            ordered += 1;
        }
        q.move_into(&mut wire);
        let frames = server_frames(&wire);
        assert_valid_message_stream(&frames);
        let mut seen = (0u32, 0u32);
        for (header, payload) in &frames {
            match header.opcode {
                OpCode::Binary => {
                    let n = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    assert_eq!(n, seen.0, "seed {seed}: ordered messages in order");
                    seen.0 += 1;
                }
                OpCode::Text => {
                    let n = u32::from_be_bytes(payload[1..5].try_into().unwrap());
                    assert_eq!(n, seen.1, "seed {seed}: replies in order");
                    seen.1 += 1;
                }
                _ => {}
            }
        }
        assert_eq!(seen, (ordered, replies), "seed {seed}");
        assert!(
            wire.len() <= pushed,
            "seed {seed}: nothing written twice: {} of {pushed}",
            wire.len()
        );
        assert!(q.is_empty() && q.spill.is_none());
    }
}

#[test]
fn unsent_pongs_never_pass_their_budget() {
    // Writes not blocked, but nothing written either: a flood of pings.
    let mut q = WriteQueue::new();
    q.push_frame(true, 0, OpCode::Text, b"x");
    for i in 0..100_000u32 {
        q.push_pong(&i.to_be_bytes());
        assert!(
            q.reply_len() <= PONG_BUDGET + 6,
            "{} at ping {i}",
            q.reply_len()
        );
    }
    let mut wire = Vec::new();
    q.move_into(&mut wire);
    let frames = server_frames(&wire);
    let last = &frames.last().unwrap().1;
    assert_eq!(
        last,
        &99_999u32.to_be_bytes(),
        "the latest ping is answered"
    );
    let pongs: Vec<u32> = frames[1..]
        .iter()
        .map(|(_, p)| u32::from_be_bytes(p[..4].try_into().unwrap()))
        .collect();
    assert!(pongs.windows(2).all(|w| w[0] < w[1]), "in the pings' order");
}

#[test]
fn prepared_frames_go_out_whole_in_order_and_large_ones_uncopied() {
    use crate::proto::Prepared;
    let small = Prepared::new(OpCode::Text, b"small news");
    let large = Prepared::new(OpCode::Binary, &[7u8; 4000]);
    let mut q = WriteQueue::new();
    q.push_frame(true, 0, OpCode::Text, b"before");
    q.push_prepared(OpCode::Text, small.frame().clone());
    q.push_prepared(OpCode::Binary, large.frame().clone());
    q.push_prepared(OpCode::Text, small.frame().clone());
    q.push_frame(true, 0, OpCode::Text, b"after");
    let mut slices = [IoSlice::new(&[]); 8];
    let n = q.io_slices(&mut slices);
    assert!(
        slices[..n]
            .iter()
            .any(|s| s.as_ptr() == large.frame().as_ptr() && s.len() == large.frame().len()),
        "the large frame is queued by reference"
    );
    let mut expected = Vec::new();
    let mut plain = WriteQueue::new();
    plain.push_frame(true, 0, OpCode::Text, b"before");
    plain.push_frame(true, 0, OpCode::Text, b"small news");
    plain.push_frame(true, 0, OpCode::Binary, &[7u8; 4000]);
    plain.push_frame(true, 0, OpCode::Text, b"small news");
    plain.push_frame(true, 0, OpCode::Text, b"after");
    plain.move_into(&mut expected);
    assert_eq!(q.len(), expected.len());
    assert_eq!(drain(&mut q, 1000), expected);
}

#[test]
fn replies_overtake_prepared_frames_not_yet_started() {
    use crate::proto::Prepared;
    let news = Prepared::new(OpCode::Binary, &[1u8; 20_000]);
    let mut q = WriteQueue::new();
    for _ in 0..3 {
        q.push_prepared(OpCode::Binary, news.frame().clone());
    }
    q.push_reply(0, OpCode::Text, b"answer");
    let mut out = Vec::new();
    q.move_into(&mut out);
    let mut expected = Vec::new();
    let mut reply = WriteQueue::new();
    reply.push_frame(true, 0, OpCode::Text, b"answer");
    reply.move_into(&mut expected);
    assert_eq!(
        &out[..expected.len()],
        &expected[..],
        "the reply goes first"
    );
    assert_eq!(out.len(), expected.len() + 3 * news.frame().len());
}

#[test]
fn bytes_begun_elsewhere_go_out_before_any_reply() {
    // The rest of a 40 KiB frame another writer began (its header went
    // out there), then a pong and a reply: they wait behind all of it.
    for len in [100, 40 << 10] {
        let begun: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut q = WriteQueue::new();
        q.push_started(&begun);
        q.push_pong(b"p");
        q.push_reply(0, OpCode::Text, b"r");
        let out = drain(&mut q, 4096);
        assert_eq!(&out[..len], &begun[..], "{len} bytes");
        assert_eq!(
            &out[len..],
            &[0x8A, 1, b'p', 0x81, 1, b'r'][..],
            "{len} bytes"
        );
    }
}
