//! Two [`Mux`]es talking in memory: the protocol's rules, its bounds, and
//! random traffic fed in random pieces.

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::frame::{Command, HEADER_LEN, Header};
use super::*;

/// Frames sent by one side, as (command, stream, payload).
pub(super) fn frames(mut bytes: &[u8]) -> Vec<(Command, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(header) = Header::decode(bytes) {
        let length = usize::from(header.length);
        let command = Command::from_byte(header.command).unwrap();
        out.push((
            command,
            header.stream,
            bytes[HEADER_LEN..HEADER_LEN + length].to_vec(),
        ));
        bytes = &bytes[HEADER_LEN + length..];
    }
    assert!(bytes.is_empty(), "a partial frame was sent");
    out
}

pub(super) fn frame(version: u8, command: Command, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Header {
        version,
        command: command.byte(),
        length: payload.len() as u16,
        stream,
    }
    .encode()
    .to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

pub(super) fn config(version: Version) -> Config {
    Config {
        version: Some(version),
        ..Config::default()
    }
}

pub(super) fn drain_all(mux: &mut Mux) -> Vec<u8> {
    let mut out = BytesMut::new();
    loop {
        let before = out.len();
        mux.poll_transmit(&mut out, usize::MAX);
        if out.len() == before {
            return out.to_vec();
        }
    }
}

pub(super) fn feed(mux: &mut Mux, bytes: &[u8]) -> Result<(), MuxError> {
    let mut input = BytesMut::from(bytes);
    mux.handle_input(&mut input, Instant::now())?;
    assert!(input.is_empty(), "{} bytes left", input.len());
    Ok(())
}

pub(super) fn read_all(mux: &mut Mux, id: u32) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    let mut buf = [0; 1000];
    loop {
        match mux.read(id, &mut buf).unwrap() {
            Read::Data(n) => data.extend_from_slice(&buf[..n]),
            Read::Empty => return (data, false),
            Read::End => return (data, true),
        }
    }
}

/// A dialer and an acceptor joined by two in-memory pipes.
struct Pair {
    dialer: Mux,
    acceptor: Mux,
}

impl Pair {
    fn new(dialer: Config, acceptor: Config) -> Pair {
        let now = Instant::now();
        Pair {
            dialer: Mux::new(Side::Dialer, dialer, now),
            acceptor: Mux::new(Side::Acceptor, acceptor, now),
        }
    }

    /// Moves bytes both ways until neither has anything to send.
    fn pump(&mut self) {
        loop {
            let a = drain_all(&mut self.dialer);
            let b = drain_all(&mut self.acceptor);
            if a.is_empty() && b.is_empty() {
                return;
            }
            feed(&mut self.acceptor, &a).unwrap();
            feed(&mut self.dialer, &b).unwrap();
        }
    }
}

#[test]
fn ids_are_odd_from_the_dialer_and_even_from_the_acceptor() {
    let mut pair = Pair::new(Config::default(), Config::default());
    assert_eq!(pair.dialer.open(), Ok(3));
    assert_eq!(pair.dialer.open(), Ok(5));
    assert_eq!(pair.acceptor.open(), Ok(2));
    assert_eq!(pair.acceptor.open(), Ok(4));
    pair.pump();
    let mut accepted = Vec::new();
    while let Some(id) = pair.acceptor.accept() {
        accepted.push(id);
    }
    assert_eq!(accepted, [3, 5]);
    assert_eq!(pair.dialer.accept(), Some(2));
    assert_eq!(pair.dialer.accept(), Some(4));
    assert_eq!(pair.dialer.streams(), 4);
    assert_eq!(pair.dialer.stats().opened, 2);
    assert_eq!(pair.dialer.stats().incoming, 2);
}

#[test]
fn the_wire_is_smux() {
    let mut mux = Mux::new(Side::Dialer, config(Version::V2), Instant::now());
    let id = mux.open().unwrap();
    assert_eq!(mux.write(id, b"hello").unwrap(), 5);
    mux.finish(id).unwrap();
    let sent = drain_all(&mut mux);
    let mut want = frame(2, Command::Syn, 3, b"");
    want.extend(frame(2, Command::Psh, 3, b"hello"));
    want.extend(frame(2, Command::Fin, 3, b""));
    assert_eq!(sent, want);
    // The peer's data, then its FIN; the first read owes an UPD of
    // (bytes read, our window).
    feed(&mut mux, &frame(2, Command::Psh, 3, b"world")).unwrap();
    feed(&mut mux, &frame(2, Command::Fin, 3, b"")).unwrap();
    assert_eq!(mux.poll_event(), Some(Event::Readable(3)));
    assert_eq!(mux.poll_event(), None);
    assert_eq!(read_all(&mut mux, 3), (b"world".to_vec(), true));
    let mut upd = 5u32.to_le_bytes().to_vec();
    upd.extend(INITIAL_WINDOW.to_le_bytes());
    assert_eq!(drain_all(&mut mux), frame(2, Command::Upd, 3, &upd));
}

#[test]
fn data_and_half_closes_cross_both_ways_in_both_versions() {
    for version in [Version::V1, Version::V2] {
        let mut pair = Pair::new(config(version), config(version));
        let id = pair.dialer.open().unwrap();
        pair.dialer.write(id, b"ping").unwrap();
        pair.dialer.finish(id).unwrap();
        pair.pump();
        let accepted = pair.acceptor.accept().unwrap();
        assert_eq!(
            read_all(&mut pair.acceptor, accepted),
            (b"ping".to_vec(), true)
        );
        // Half-closed: the acceptor still writes, the dialer still reads.
        pair.acceptor.write(accepted, b"pong").unwrap();
        pair.acceptor.finish(accepted).unwrap();
        pair.pump();
        assert_eq!(read_all(&mut pair.dialer, id), (b"pong".to_vec(), true));
        assert_eq!(
            pair.dialer.write(id, b"late"),
            Err(StreamError::Finished),
            "{version:?}"
        );
        pair.dialer.close(id);
        pair.acceptor.close(accepted);
        assert_eq!((pair.dialer.streams(), pair.acceptor.streams()), (0, 0));
    }
}

#[test]
fn a_server_speaks_the_version_of_the_peers_first_frame() {
    for version in [Version::V1, Version::V2] {
        let adopting = Config {
            version: None,
            ..Config::default()
        };
        let mut pair = Pair::new(config(version), adopting);
        // Opened before the peer spoke: its SYN waits.
        let early = pair.acceptor.open().unwrap();
        assert!(!pair.acceptor.has_output());
        assert!(drain_all(&mut pair.acceptor).is_empty());
        let id = pair.dialer.open().unwrap();
        pair.pump();
        assert_eq!(pair.acceptor.version(), Some(version));
        assert_eq!(pair.acceptor.accept(), Some(id));
        assert_eq!(pair.dialer.accept(), Some(early));
    }
    // A version that does not exist ends it.
    let adopting = Config {
        version: None,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, adopting, Instant::now());
    assert!(feed(&mut mux, &frame(3, Command::Syn, 3, b"")).is_err());
}

#[test]
fn a_frame_no_smux_accepts_ends_the_session_with_its_reason() {
    let cases: [(Vec<u8>, &str); 5] = [
        (frame(2, Command::Syn, 3, b""), "version 2 on a version 1"),
        (vec![1, 9, 0, 0, 3, 0, 0, 0], "unknown command 9"),
        (frame(1, Command::Upd, 3, &[0; 8]), "unknown command 4"),
        (
            frame(1, Command::Syn, 3, b"x"),
            "Syn frame with a payload of 1",
        ),
        (
            frame(1, Command::Nop, 0, b"xy"),
            "Nop frame with a payload of 2",
        ),
    ];
    for (bytes, reason) in cases {
        let mut mux = Mux::new(Side::Acceptor, Config::default(), Instant::now());
        let id = mux.open().unwrap();
        let error = feed(&mut mux, &bytes).unwrap_err();
        assert!(error.to_string().contains(reason), "{error} / {reason}");
        assert!(mux.is_failed() && !mux.wants_input() && !mux.has_output());
        assert_eq!(mux.write(id, b"x"), Err(StreamError::Ended));
        assert_eq!(mux.read(id, &mut [0; 4]), Err(StreamError::Ended));
        assert_eq!(mux.open(), Err(OpenError::Ended));
    }
    // Longer than the receiving side allows.
    let small = Config {
        max_receive_frame: 100,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, small, Instant::now());
    feed(&mut mux, &frame(1, Command::Syn, 3, b"")).unwrap();
    feed(&mut mux, &frame(1, Command::Psh, 3, &[7; 100])).unwrap();
    let error = feed(&mut mux, &frame(1, Command::Psh, 3, &[7; 101])).unwrap_err();
    assert!(error.to_string().contains("101 bytes"), "{error}");
    // What arrived before the error is still read, then the end.
    assert_eq!(mux.read(3, &mut [0; 200]), Ok(Read::Data(100)));
    assert_eq!(mux.read(3, &mut [0; 200]), Err(StreamError::Ended));
}

#[test]
fn syns_past_the_limit_get_a_fin_and_the_session_goes_on() {
    let limited = Config {
        max_streams: 3,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, limited, Instant::now());
    let mut flood = Vec::new();
    for id in (1..=41).step_by(2) {
        flood.extend(frame(1, Command::Syn, id, b""));
    }
    // And a SYN for stream 0, and one again for a stream it has.
    flood.extend(frame(1, Command::Syn, 0, b""));
    flood.extend(frame(1, Command::Syn, 1, b""));
    feed(&mut mux, &flood).unwrap();
    assert_eq!(mux.streams(), 3);
    // 18 past the limit, and stream 0.
    assert_eq!(mux.stats().refused, 19);
    // Stream 0's SYN gets no answer (0 is no stream's id).
    let answers = frames(&drain_all(&mut mux));
    assert_eq!(answers.len(), 18);
    assert!(
        answers
            .iter()
            .all(|(command, id, _)| *command == Command::Fin && *id > 5)
    );
    // The three taken in still work.
    feed(&mut mux, &frame(1, Command::Psh, 1, b"abc")).unwrap();
    assert_eq!(mux.accept(), Some(1));
    assert_eq!(read_all(&mut mux, 1), (b"abc".to_vec(), false));
    // Data for the refused ones is dropped and counted.
    feed(&mut mux, &frame(1, Command::Psh, 7, b"dropped")).unwrap();
    assert_eq!(mux.stats().discarded_frames, 1);
    assert_eq!(mux.stats().discarded_bytes, 7);
    assert_eq!(mux.open(), Err(OpenError::TooManyStreams));
}

#[test]
fn a_peer_that_never_reads_our_answers_is_not_read_either() {
    let mut mux = Mux::new(Side::Acceptor, Config::default(), Instant::now());
    let mut flood = BytesMut::new();
    for i in 0..5000u32 {
        flood.extend_from_slice(&frame(1, Command::Syn, 100_001 + 2 * i, b""));
    }
    let mut input = flood.clone();
    mux.handle_input(&mut input, Instant::now()).unwrap();
    // 512 streams taken in, then 1024 refusals owed: reading stopped.
    assert!(!mux.wants_input());
    assert_eq!(mux.streams(), 512);
    assert_eq!(
        mux.stats().refused as usize,
        super::multiplexer::CONTROL_LIMIT
    );
    assert!(!input.is_empty());
    // Once the answers are out, it reads on.
    drain_all(&mut mux);
    assert!(mux.wants_input());
    mux.handle_input(&mut input, Instant::now()).unwrap();
    assert_eq!(mux.stats().refused, 2 * 1024);
}

#[test]
fn version_1_stops_reading_at_the_session_budget_and_resumes_when_read() {
    let budget = Config {
        receive_buffer: 100_000,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, budget, Instant::now());
    let mut input = BytesMut::new();
    input.extend_from_slice(&frame(1, Command::Syn, 3, b""));
    for _ in 0..10 {
        input.extend_from_slice(&frame(1, Command::Psh, 3, &[1; 30_000]));
    }
    mux.handle_input(&mut input, Instant::now()).unwrap();
    // Four frames (at most one past the budget), then no more.
    assert_eq!(mux.buffered(), 120_000);
    assert!(!mux.wants_input());
    assert_eq!(input.len(), 6 * (HEADER_LEN + 30_000));
    let id = mux.accept().unwrap();
    assert_eq!(mux.read(id, &mut [0; 50_000]), Ok(Read::Data(50_000)));
    assert!(mux.wants_input());
    mux.handle_input(&mut input, Instant::now()).unwrap();
    assert_eq!(mux.buffered(), 100_000);
    // A stream the application closes gives its bytes back.
    mux.close(id);
    assert_eq!(mux.buffered(), 0);

    // Version 2 reads on: its windows bound each stream, and its writers
    // wait for window updates that only reading brings.
    let budget = Config {
        version: Some(Version::V2),
        receive_buffer: 100_000,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, budget, Instant::now());
    let mut input = BytesMut::new();
    for id in [3, 5] {
        input.extend_from_slice(&frame(2, Command::Syn, id, b""));
        for _ in 0..4 {
            input.extend_from_slice(&frame(2, Command::Psh, id, &[1; 60_000]));
        }
    }
    mux.handle_input(&mut input, Instant::now()).unwrap();
    assert!(input.is_empty() && mux.wants_input());
    assert_eq!(mux.buffered(), 480_000);
}

#[test]
fn version_2_sends_within_the_window_and_refuses_a_peer_past_it() {
    let mut pair = Pair::new(config(Version::V2), config(Version::V2));
    let id = pair.dialer.open().unwrap();
    let mut sent = 0usize;
    // Only 256 KiB can leave before the acceptor reads.
    while sent < 1 << 20 {
        let n = pair.dialer.write(id, &vec![9; 64 << 10]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
        let bytes = drain_all(&mut pair.dialer);
        feed(&mut pair.acceptor, &bytes).unwrap();
    }
    assert_eq!(pair.acceptor.buffered(), INITIAL_WINDOW as usize);
    let accepted = pair.acceptor.accept().unwrap();
    // Megabytes more: natively only (Miri interprets every byte).
    let goal = if cfg!(miri) { 1 << 19 } else { 1 << 21 };
    // Reading sends UPDs: the rest flows.
    let mut total = 0;
    for _ in 0..100 {
        let (data, _) = read_all(&mut pair.acceptor, accepted);
        total += data.len();
        pair.pump();
        if let Ok(n) = pair.dialer.write(id, &vec![9; 64 << 10]) {
            sent += n;
        }
        if total >= goal {
            assert!(sent >= total);
            break;
        }
    }
    assert!(total >= goal, "{total}");

    // A peer that ignores the window ends the session.
    let mut mux = Mux::new(Side::Acceptor, config(Version::V2), Instant::now());
    feed(&mut mux, &frame(2, Command::Syn, 3, b"")).unwrap();
    for _ in 0..(INITIAL_WINDOW / 65535) {
        feed(&mut mux, &frame(2, Command::Psh, 3, &[0; 65535])).unwrap();
    }
    let error = feed(&mut mux, &frame(2, Command::Psh, 3, &[0; 65535])).unwrap_err();
    assert!(
        matches!(error, MuxError::Window { stream: 3, .. }),
        "{error}"
    );
}

#[test]
fn one_streams_bulk_waits_a_frame_for_anothers_small_write() {
    let mut mux = Mux::new(Side::Dialer, config(Version::V1), Instant::now());
    let bulk = mux.open().unwrap();
    let small = mux.open().unwrap();
    assert_eq!(mux.write(bulk, &vec![0; 100_000]).unwrap(), 100_000);
    assert_eq!(mux.write(small, b"hi").unwrap(), 2);
    let sent = frames(&drain_all(&mut mux));
    let order: Vec<_> = sent
        .iter()
        .filter(|(command, _, _)| *command == Command::Psh)
        .map(|(_, id, payload)| (*id, payload.len()))
        .collect();
    assert_eq!(order[..2], [(bulk, 32768), (small, 2)]);
    assert!(order[2..].iter().all(|(id, _)| *id == bulk));
    // A higher priority goes first.
    let urgent = mux.open().unwrap();
    mux.set_priority(urgent, 5).unwrap();
    mux.write(bulk, &vec![0; 100_000]).unwrap();
    mux.write(urgent, b"now").unwrap();
    let sent = frames(&drain_all(&mut mux));
    let first = sent
        .iter()
        .find(|(command, _, _)| *command == Command::Psh)
        .unwrap();
    assert_eq!((first.1, first.2.as_slice()), (urgent, &b"now"[..]));
}

#[test]
fn a_full_send_buffer_says_when_it_has_room_again() {
    let small = Config {
        send_buffer: 1000,
        max_frame_size: 400,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Dialer, small, Instant::now());
    let id = mux.open().unwrap();
    assert_eq!(mux.write(id, &[1; 1500]).unwrap(), 1000);
    assert_eq!(mux.write(id, &[1; 10]).unwrap(), 0);
    // One frame at a time: the SYN, then 400 bytes (600 still queued:
    // more than half), then 400 more.
    let mut out = BytesMut::new();
    for _ in 0..2 {
        let limit = out.len() + 1;
        mux.poll_transmit(&mut out, limit);
        assert_eq!(mux.poll_event(), None);
    }
    let limit = out.len() + 1;
    mux.poll_transmit(&mut out, limit);
    assert_eq!(mux.poll_event(), Some(Event::Writable(id)));
}

#[test]
fn a_closed_stream_sends_its_fin_goes_away_and_drops_what_comes_later() {
    let mut pair = Pair::new(Config::default(), Config::default());
    let id = pair.dialer.open().unwrap();
    pair.dialer.write(id, b"last words").unwrap();
    pair.dialer.close(id);
    assert_eq!(pair.dialer.streams(), 1, "until its FIN is out");
    pair.pump();
    assert_eq!(pair.dialer.streams(), 0);
    let accepted = pair.acceptor.accept().unwrap();
    assert_eq!(
        read_all(&mut pair.acceptor, accepted),
        (b"last words".to_vec(), true)
    );
    pair.acceptor.write(accepted, b"too late").unwrap();
    pair.pump();
    assert_eq!(pair.dialer.stats().discarded_bytes, 8);
    assert_eq!(pair.dialer.read(id, &mut [0; 8]), Err(StreamError::Unknown));
}

#[test]
fn shutting_down_finishes_every_stream_and_refuses_new_ones() {
    let mut pair = Pair::new(Config::default(), Config::default());
    let a = pair.dialer.open().unwrap();
    let b = pair.dialer.open().unwrap();
    pair.dialer.write(a, b"x").unwrap();
    pair.pump();
    pair.acceptor.shut_down();
    assert_eq!(pair.acceptor.open(), Err(OpenError::Ended));
    pair.pump();
    assert_eq!(read_all(&mut pair.dialer, a), (vec![], true));
    assert_eq!(read_all(&mut pair.dialer, b), (vec![], true));
    let c = pair.dialer.open().unwrap();
    pair.pump();
    assert_eq!(pair.dialer.read(c, &mut [0; 1]), Ok(Read::End), "refused");
    assert!(!pair.acceptor.has_output());
}

#[test]
fn keepalive_sends_nops_and_ends_a_silent_session() {
    let start = Instant::now();
    let mut mux = Mux::new(Side::Dialer, Config::default(), start);
    assert_eq!(mux.poll_timeout(), Some(start + Duration::from_secs(10)));
    mux.handle_timeout(start + Duration::from_secs(10)).unwrap();
    assert_eq!(drain_all(&mut mux), frame(1, Command::Nop, 0, b""));
    // A NOP from the peer keeps it alive.
    let mut input = BytesMut::from(&frame(1, Command::Nop, 0, b"")[..]);
    mux.handle_input(&mut input, start + Duration::from_secs(25))
        .unwrap();
    mux.handle_timeout(start + Duration::from_secs(50)).unwrap();
    let error = mux
        .handle_timeout(start + Duration::from_secs(55))
        .unwrap_err();
    assert_eq!(error, MuxError::KeepaliveTimeout);
    assert_eq!(mux.poll_timeout(), None);
    // Off: no deadline at all.
    let quiet = Config {
        keepalive_interval: None,
        keepalive_timeout: None,
        ..Config::default()
    };
    assert_eq!(Mux::new(Side::Dialer, quiet, start).poll_timeout(), None);
}

#[test]
fn config_check_says_what_is_wrong() {
    assert_eq!(Config::default().check(), Ok(()));
    let bad = Config {
        keepalive_timeout: Some(Duration::from_secs(5)),
        ..Config::default()
    };
    assert!(bad.check().unwrap_err().contains("keepalive_timeout"));
    let zero = Config {
        max_streams: 0,
        ..Config::default()
    };
    assert!(zero.check().is_err());
}

/// Random writes, reads and half-closes on many streams both ways, the
/// bytes between the two sides cut at random: everything arrives, in order.
#[test]
fn random_traffic_in_random_pieces_arrives_whole() {
    for round in 0..crate::rounds(40) {
        let mut rng = StdRng::seed_from_u64(round as u64);
        let version = if round % 2 == 0 {
            Version::V1
        } else {
            Version::V2
        };
        let small = Config {
            version: Some(version),
            max_frame_size: rng.random_range(1..2000),
            send_buffer: rng.random_range(1..5000),
            receive_buffer: rng.random_range(1..50_000),
            ..Config::default()
        };
        let mut sides = [
            Mux::new(Side::Dialer, small.clone(), Instant::now()),
            Mux::new(Side::Acceptor, small, Instant::now()),
        ];
        // Per side: the streams it opened, (id, what to send, sent so far).
        let mut plans: [Vec<(u32, Bytes, usize)>; 2] = [Vec::new(), Vec::new()];
        let mut wires = [BytesMut::new(), BytesMut::new()];
        // The acceptor's frames go through an `Output` (payloads not
        // copied) and onto its wire in random pieces; the dialer's are
        // copied onto its wire.
        let mut output = Output::new();
        for side in 0..2 {
            for _ in 0..rng.random_range(1..6) {
                let id = sides[side].open().unwrap();
                // Smaller under Miri, which interprets every byte.
                let len = rng.random_range(0..if cfg!(miri) { 2_000 } else { 20_000 });
                let data = (0..len).map(|_| rng.random()).collect::<Vec<u8>>().into();
                plans[side].push((id, data, 0));
            }
        }
        let mut accepted: [Vec<(u32, Vec<u8>, bool)>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..100_000 {
            let side = rng.random_range(0..2usize);
            let mux = &mut sides[side];
            // Write some of each plan.
            for (id, data, sent) in &mut plans[side] {
                if *sent < data.len() {
                    let end = (*sent + rng.random_range(1..3000)).min(data.len());
                    // Copied, or given as a slice of what is sent.
                    *sent += if rng.random_range(0..2) == 0 {
                        mux.write(*id, &data[*sent..end]).unwrap()
                    } else {
                        mux.write_bytes(*id, &mut data.slice(*sent..end)).unwrap()
                    };
                    if *sent == data.len() {
                        mux.finish(*id).unwrap();
                    }
                } else if data.is_empty() {
                    mux.finish(*id).unwrap();
                }
            }
            while let Some(id) = mux.accept() {
                accepted[side].push((id, Vec::new(), false));
            }
            let mut buf = vec![0; rng.random_range(1..4000)];
            for (id, got, ended) in &mut accepted[side] {
                while !*ended {
                    // Copied out, or taken as it is.
                    let read = if rng.random_range(0..2) == 0 {
                        mux.read(*id, &mut buf).unwrap().map(|n| buf[..n].to_vec())
                    } else {
                        mux.read_bytes(*id, buf.len())
                            .unwrap()
                            .map(|bytes| bytes.to_vec())
                    };
                    match read {
                        Read::Data(bytes) => got.extend_from_slice(&bytes),
                        Read::End => *ended = true,
                        Read::Empty => break,
                    }
                }
            }
            while mux.poll_event().is_some() {}
            if side == 0 {
                let limit = wires[side].len() + rng.random_range(1..10_000);
                mux.poll_transmit(&mut wires[side], limit);
            } else {
                let limit = Transmit::len(&output) + rng.random_range(1..10_000);
                mux.poll_transmit(&mut output, limit);
                while output.has_remaining() && rng.random_range(0..5) != 0 {
                    let n = rng.random_range(1..=output.remaining());
                    wires[side].extend_from_slice(&output.copy_to_bytes(n));
                }
            }
            // Deliver a random piece of what this side sent.
            let piece = rng.random_range(0..=wires[side].len());
            let mut input = wires[side].split_to(piece);
            let other = &mut sides[1 - side];
            other.handle_input(&mut input, Instant::now()).unwrap();
            // Whatever the budget left unread goes back in front.
            if !input.is_empty() {
                input.unsplit(std::mem::take(&mut wires[side]));
                wires[side] = input;
            }
            let done = (0..2).all(|s| {
                plans[s].iter().all(|(_, data, sent)| *sent == data.len())
                    && accepted[1 - s].len() == plans[s].len()
                    && accepted[1 - s].iter().all(|(_, _, ended)| *ended)
            });
            if done {
                break;
            }
        }
        for side in 0..2 {
            let mut want: Vec<_> = plans[side]
                .iter()
                .map(|(id, data, ..)| (*id, data.to_vec()))
                .collect();
            let mut got: Vec<_> = accepted[1 - side]
                .iter()
                .map(|(id, data, _)| (*id, data.clone()))
                .collect();
            want.sort();
            got.sort();
            assert_eq!(want.len(), got.len(), "round {round}");
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    w == g,
                    "round {round}: stream {} differs ({} vs {} bytes)",
                    w.0,
                    w.1.len(),
                    g.1.len()
                );
            }
        }
    }
}

#[test]
fn a_dropped_stream_the_peer_finished_and_gives_no_window_goes() {
    // Version 2: our stream has sent its window's worth; the peer (smux's
    // `Close`) sends its FIN and will never send a window update.
    let mut mux = Mux::new(Side::Dialer, config(Version::V2), Instant::now());
    let id = mux.open().unwrap();
    let mut sent = 0;
    while sent < INITIAL_WINDOW as usize + 1000 {
        sent += mux.write(id, &[5; 4096]).unwrap();
        drain_all(&mut mux);
    }
    assert!(mux.unsent() == 1 && !mux.has_output());
    mux.close(id);
    assert_eq!(mux.streams(), 1, "waits for the window");
    feed(&mut mux, &frame(2, Command::Fin, id, b"")).unwrap();
    // The peer may still read (smux's CloseWrite): one keepalive tick
    // later it still waits.
    let start = Instant::now();
    mux.handle_timeout(start + Duration::from_secs(10)).unwrap();
    assert_eq!(frames(&drain_all(&mut mux)), [(Command::Nop, 0, vec![])]);
    assert_eq!(mux.streams(), 1);
    // At the next, what it could not send is dropped; its FIN goes; it
    // is gone.
    mux.handle_timeout(start + Duration::from_secs(20)).unwrap();
    let sent = frames(&drain_all(&mut mux));
    assert_eq!(
        sent,
        [(Command::Nop, 0, vec![]), (Command::Fin, id, vec![])]
    );
    assert_eq!((mux.streams(), mux.unsent()), (0, 0));
}

#[test]
fn a_window_update_past_what_was_sent_ends_the_session() {
    let mut mux = Mux::new(Side::Dialer, config(Version::V2), Instant::now());
    let id = mux.open().unwrap();
    mux.write(id, b"four").unwrap();
    drain_all(&mut mux);
    let mut upd = 4u32.to_le_bytes().to_vec();
    upd.extend(1000u32.to_le_bytes());
    feed(&mut mux, &frame(2, Command::Upd, id, &upd)).unwrap();
    let mut upd = 5u32.to_le_bytes().to_vec();
    upd.extend(1000u32.to_le_bytes());
    let error = feed(&mut mux, &frame(2, Command::Upd, id, &upd)).unwrap_err();
    assert_eq!(error, MuxError::Update { stream: id });
}

#[test]
fn refusing_incoming_closes_the_waiting_and_answers_new_syns() {
    let mut mux = Mux::new(Side::Acceptor, Config::default(), Instant::now());
    feed(&mut mux, &frame(1, Command::Syn, 3, b"")).unwrap();
    mux.refuse_incoming();
    feed(&mut mux, &frame(1, Command::Syn, 5, b"")).unwrap();
    let sent = frames(&drain_all(&mut mux));
    assert_eq!(sent, [(Command::Fin, 5, vec![]), (Command::Fin, 3, vec![])]);
    assert_eq!((mux.streams(), mux.accept()), (0, None));
}

#[test]
fn the_keepalive_clock_restarts_when_we_read_again() {
    // Version 1, no NOPs of our own: a stall of ours longer than the
    // timeout is not the peer's silence.
    let start = Instant::now();
    let stalling = Config {
        receive_buffer: 10,
        keepalive_interval: None,
        ..Config::default()
    };
    let mut mux = Mux::new(Side::Acceptor, stalling, start);
    let mut input = BytesMut::from(&frame(1, Command::Syn, 3, b"")[..]);
    input.extend_from_slice(&frame(1, Command::Psh, 3, &[1; 20]));
    mux.handle_input(&mut input, start).unwrap();
    assert!(!mux.wants_input());
    assert_eq!(
        mux.poll_timeout(),
        None,
        "no silence is counted while we do not read"
    );
    let later = start + Duration::from_secs(100);
    mux.read(3, &mut [0; 20]).unwrap();
    assert_eq!(
        mux.poll_timeout(),
        Some(start),
        "due at once: the clock restarts"
    );
    mux.handle_timeout(later).unwrap();
    assert_eq!(mux.poll_timeout(), Some(later + Duration::from_secs(30)));
    // And a peer silent from then on is found out.
    let error = mux
        .handle_timeout(later + Duration::from_secs(30))
        .unwrap_err();
    assert_eq!(error, MuxError::KeepaliveTimeout);
}

#[test]
fn a_long_payload_goes_out_as_the_slice_it_was_written_into() {
    use std::io::IoSlice;
    // One write, one frame: the SYN and the frame's header copied in
    // front, then the payload where the write put it.
    let mut mux = Mux::new(Side::Dialer, config(Version::V1), Instant::now());
    let id = mux.open().unwrap();
    assert_eq!(mux.write(id, &[1; 10_000]).unwrap(), 10_000);
    let at = mux.streams[&id].send.front().as_ptr();
    let mut out = Output::new();
    mux.poll_transmit(&mut out, usize::MAX);
    let mut slices = [IoSlice::new(&[]); 4];
    assert_eq!(out.chunks_vectored(&mut slices), 2);
    assert_eq!(slices[1].len(), 10_000);
    assert_eq!(slices[1].as_ptr(), at, "the block the write went into");
    assert!(mux.streams[&id].send.is_empty());

    // Frames shorter than a slice's minimum are copied beside their
    // headers: one piece for all of them.
    let small = Config {
        max_frame_size: 1500,
        ..config(Version::V1)
    };
    let mut mux = Mux::new(Side::Dialer, small, Instant::now());
    let id = mux.open().unwrap();
    assert_eq!(mux.write(id, &[1; 3000]).unwrap(), 3000);
    let mut out = Output::new();
    mux.poll_transmit(&mut out, usize::MAX);
    assert_eq!(out.chunks_vectored(&mut slices), 1);
    assert_eq!(out.remaining(), 3 * 8 + 3000);
    assert!(mux.streams[&id].send.is_empty());
}

#[test]
fn bytes_given_and_taken_are_not_copied_and_count_as_reads_and_writes() {
    use std::io::IoSlice;
    let mut pair = Pair::new(config(Version::V2), config(Version::V2));
    let id = pair.dialer.open().unwrap();
    // Given: the frame's payload is the caller's own buffer.
    let sent = Bytes::from((0..10_000).map(|i| i as u8).collect::<Vec<u8>>());
    let mut rest = sent.clone();
    assert_eq!(pair.dialer.write_bytes(id, &mut rest).unwrap(), 10_000);
    assert!(rest.is_empty());
    assert_eq!(pair.dialer.held(), 10_000, "counted as written and unsent");
    let mut out = Output::new();
    pair.dialer.poll_transmit(&mut out, usize::MAX);
    let mut slices = [IoSlice::new(&[]); 4];
    let n = out.chunks_vectored(&mut slices);
    assert_eq!(slices[n - 1].as_ptr(), sent.as_ptr());
    assert_eq!(pair.dialer.held(), 0);
    let wire = out.copy_to_bytes(out.remaining());
    feed(&mut pair.acceptor, &wire).unwrap();

    // Taken: a slice of the receive buffer, in pieces as asked, counted
    // as read (the budget, and the window update a read owes).
    let accepted = pair.acceptor.accept().unwrap();
    assert_eq!(pair.acceptor.held(), 10_000);
    let first = match pair.acceptor.read_bytes(accepted, 4_000).unwrap() {
        Read::Data(bytes) => bytes,
        other => panic!("{other:?}"),
    };
    assert_eq!(first, sent.slice(..4_000));
    assert_eq!(pair.acceptor.held(), 6_000);
    assert_eq!(pair.acceptor.buffered(), 6_000);
    let updates: Vec<_> = frames(&drain_all(&mut pair.acceptor))
        .into_iter()
        .filter(|(command, ..)| *command == Command::Upd)
        .collect();
    assert_eq!(updates.len(), 1, "the first read announces the window");
    assert_eq!(&updates[0].2[..4], &4_000u32.to_le_bytes());
    let second = match pair.acceptor.read_bytes(accepted, usize::MAX).unwrap() {
        Read::Data(bytes) => bytes,
        other => panic!("{other:?}"),
    };
    assert_eq!(second, sent.slice(4_000..));
    assert_eq!(
        second.as_ptr(),
        first.as_ptr().wrapping_add(4_000),
        "both from one block"
    );
    assert_eq!(pair.acceptor.read_bytes(accepted, 10).unwrap(), Read::Empty);

    // The peer's FIN ends the reads of either kind.
    pair.dialer.finish(id).unwrap();
    pair.pump();
    assert_eq!(pair.acceptor.read_bytes(accepted, 10).unwrap(), Read::End);
}
