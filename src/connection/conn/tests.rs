//! `Conn` against a hand-made outbox: sends, replies, readiness, close, and the queue's limits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

use super::*;
use crate::connection::outbox::{Outbound, Phase, Waiters};
use crate::connection::wake::ConnWake;
#[cfg(feature = "deflate")]
use crate::proto::deflate::Compressor;
use crate::proto::frame::RSV1;

struct CountWakes(AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn conn(max_outbound: usize) -> (Conn, Arc<CountWakes>) {
    conn_with(max_outbound, SlowConsumer::Pause)
}

fn conn_with(max_outbound: usize, on_full: SlowConsumer) -> (Conn, Arc<CountWakes>) {
    let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
    let outbound = Outbound {
        pool: Arc::default(),
        max_bytes: max_outbound,
        meters: crate::connection::meters::Meters::new("test"),
        on_full,
    };
    let shared = ConnShared::new(
        7,
        "127.0.0.1:1".parse().unwrap(),
        Arc::new(outbound),
        ConnWake::Waker(Waker::from(wakes.clone())),
        crate::proto::Role::Server,
    );
    (Conn::from_shared(shared), wakes)
}

#[test]
fn resuming_reading_wakes_the_driver_only_after_a_pause() {
    let (conn, wakes) = conn(1 << 20);
    let woken = || wakes.0.load(Ordering::SeqCst);
    conn.resume_reading();
    assert_eq!(woken(), 0, "nothing was paused");
    conn.pause_reading();
    assert!(conn.shared().is_reading_paused());
    assert_eq!(woken(), 0, "the driver finds the pause at the next frame");
    conn.resume_reading();
    assert!(!conn.shared().is_reading_paused());
    assert_eq!(woken(), 1);
    assert!(conn.shared().take_attention(), "the driver looks again");
    conn.resume_reading();
    assert_eq!(woken(), 1, "once per pause");
}

#[test]
fn sends_queue_frames_in_order_and_wake_once_per_flush() {
    let (conn, wakes) = conn(1 << 20);
    conn.send_text("a").unwrap();
    conn.send_binary(b"b").unwrap();
    conn.send_shared(MessageKind::Binary, Bytes::from(vec![9u8; 2000]))
        .unwrap();
    conn.ping(b"p").unwrap();
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "one wake until the queue is flushed"
    );
    assert_eq!(conn.queued_bytes(), 3 + 3 + 4 + 2000 + 3);
    let mut outbox = conn.shared().lock();
    outbox.unschedule_flush();
    drop(outbox);
    conn.send_text("c").unwrap();
    assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
}

/// A send io_uring cut short for a handoff: its rest goes back ahead
/// of what was queued since (a shared segment, which a reply could
/// overtake), a reply queued later comes after all of it, and nothing
/// counts as being sent any more.
#[cfg(all(target_os = "linux", feature = "handoff", feature = "uring"))]
#[test]
fn a_send_cut_short_goes_back_ahead_of_everything_queued_since() {
    let (conn, _) = conn(1 << 20);
    conn.send_binary(&[1u8; 100]).unwrap();
    let mut taken = crate::proto::WriteQueue::new();
    conn.shared().lock().take_for_send(&mut taken);
    assert_eq!(taken.len(), 102);
    // Shared bytes: the queue keeps them as a segment of their own, where
    // a reply could overtake them.
    conn.send_shared(MessageKind::Binary, Bytes::from(vec![2u8; 2000]))
        .unwrap();
    // 30 bytes went out before the send was cancelled.
    taken.advance(30);
    let mut outbox = conn.shared().lock();
    outbox.no_longer_sending(30);
    assert!(!outbox.may_hand_off(), "72 bytes are still being sent");
    outbox.put_back(&mut taken, &crate::pool::BufferPool::default());
    assert!(taken.is_empty());
    assert!(outbox.may_hand_off(), "nothing is being sent any more");
    outbox.push_reply_message(OpCode::Pong, b"r");
    let mut out = crate::proto::WriteQueue::new();
    outbox.take_for_send(&mut out);
    let mut bytes = Vec::new();
    out.move_into(&mut bytes);
    let mut expected = vec![0x82, 100];
    expected.extend([1u8; 100]);
    expected.drain(..30);
    expected.extend([0x82, 126, 0x07, 0xD0]);
    expected.extend([2u8; 2000]);
    expected.extend([0x8A, 1, b'r']);
    assert_eq!(bytes, expected);
}

#[test]
fn a_full_queue_refuses_sends_and_asks_for_drain() {
    let (conn, _) = conn(10);
    conn.send_binary(&[0u8; 50]).unwrap();
    assert_eq!(conn.send_binary(b"x"), Err(SendError::QueueFull));
    assert!(conn.shared().lock().wants_drain());
    assert_eq!(conn.queued_bytes(), 52);
}

#[test]
fn a_full_queue_closes_the_connection_under_the_close_policy() {
    let (conn, wakes) = conn_with(10, SlowConsumer::Close(CloseCode::TRY_AGAIN_LATER));
    conn.send_binary(&[0u8; 50]).unwrap();
    let before = wakes.0.load(Ordering::SeqCst);
    assert_eq!(conn.send_binary(b"x"), Err(SendError::QueueFull));
    assert!(
        wakes.0.load(Ordering::SeqCst) > before,
        "the driver is woken"
    );
    assert!(conn.shared().take_attention());
    let outbox = conn.shared().lock();
    assert!(!outbox.wants_drain());
    assert_eq!(outbox.phase(), Phase::Closing);
    let (code, _) = outbox.close_request().unwrap();
    assert_eq!(*code, CloseCode::TRY_AGAIN_LATER);
    drop(outbox);
    assert_eq!(conn.send_binary(b"x"), Err(SendError::Closed));
}

#[test]
fn a_keepalive_ping_on_a_full_queue_is_skipped_without_the_policy() {
    for on_full in [
        SlowConsumer::Pause,
        SlowConsumer::Close(CloseCode::TRY_AGAIN_LATER),
    ] {
        let (conn, _) = conn_with(10, on_full);
        conn.send_binary(&[0u8; 50]).unwrap();
        conn.keepalive_ping();
        assert_eq!(conn.queued_bytes(), 52, "no ping queued");
        let outbox = conn.shared().lock();
        assert!(!outbox.wants_drain());
        assert_eq!(outbox.phase(), Phase::Open);
    }
    let (conn, _) = conn(1 << 20);
    conn.keepalive_ping();
    assert_eq!(conn.queued_bytes(), 2, "an empty ping");
}

#[test]
fn close_validates_and_then_refuses_sends() {
    let (conn, _) = conn(1 << 20);
    assert_eq!(
        conn.close(CloseCode(1005), ""),
        Err(SendError::InvalidCloseCode)
    );
    assert_eq!(
        conn.close(CloseCode::NORMAL, &"x".repeat(124)),
        Err(SendError::PayloadTooLong)
    );
    assert!(conn.is_open());
    conn.close(CloseCode::NORMAL, "bye").unwrap();
    assert!(!conn.is_open());
    assert!(conn.shared().take_attention());
    assert_eq!(conn.send_text("late"), Err(SendError::Closed));
    assert_eq!(conn.close(CloseCode::NORMAL, ""), Err(SendError::Closed));
    let request = conn.shared().lock().take_close_request();
    assert_eq!(request, Some((CloseCode::NORMAL, "bye".to_owned())));
}

#[test]
#[cfg(feature = "deflate")]
fn with_deflate_sends_are_compressed_and_small_ones_and_pings_are_not() {
    use crate::proto::Role;
    use crate::proto::deflate::{DeflateConfig, DeflateParams, Inflater};
    use crate::proto::frame::{DecodeRules, decode_header};

    let (conn, _) = conn(1 << 20);
    let config = DeflateConfig::default();
    let params = DeflateParams::new(true, true);
    conn.shared()
        .lock()
        .set_compressor(Compressor::new(Role::Server, &params, &config));
    let text = "compress me, compress me, compress me, compress me ".repeat(20);
    conn.send_text(&text).unwrap();
    conn.send_shared(MessageKind::Binary, Bytes::from(vec![3u8; 5000]))
        .unwrap();
    conn.send_text("tiny").unwrap();
    conn.ping(b"p").unwrap();

    let mut wire = Vec::new();
    conn.shared().lock().queue().move_into(&mut wire);
    let mut frames = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let rules = DecodeRules {
            allowed_rsv: RSV1,
            ..DecodeRules::CLIENT
        };
        let (header, len) = decode_header(&wire[at..], rules).unwrap().unwrap();
        let payload = &wire[at + len..at + len + header.payload_len as usize];
        frames.push((header.opcode, header.rsv, payload.to_vec()));
        at += len + payload.len();
    }
    let inflate = |packed: &[u8]| {
        let mut inflater = Inflater::new(false);
        let mut out = bytes::BytesMut::new();
        inflater.feed(packed, &mut out, 1 << 20).unwrap();
        inflater.finish(&mut out, 1 << 20).unwrap();
        out.to_vec()
    };
    assert_eq!((frames[0].0, frames[0].1), (OpCode::Text, RSV1));
    assert!(frames[0].2.len() < text.len() / 4);
    assert_eq!(inflate(&frames[0].2), text.as_bytes());
    assert_eq!((frames[1].0, frames[1].1), (OpCode::Binary, RSV1));
    assert_eq!(inflate(&frames[1].2), vec![3u8; 5000]);
    assert_eq!(
        frames[2],
        (OpCode::Text, 0, b"tiny".to_vec()),
        "under 64 bytes"
    );
    assert_eq!(frames[3], (OpCode::Ping, 0, b"p".to_vec()));
}

#[test]
fn replies_have_a_bound_of_their_own_and_go_ahead_of_what_has_not_started() {
    let (conn, _) = conn(100);
    conn.send_shared(MessageKind::Binary, Bytes::from(vec![1u8; 20_000]))
        .unwrap();
    conn.send_shared(MessageKind::Binary, Bytes::from(vec![2u8; 20_000]))
        .unwrap_err();
    conn.reply(Message::Text("r1")).unwrap();
    conn.reply(Message::Binary(&[9u8; 200])).unwrap();
    assert_eq!(
        conn.reply(Message::Text("r3")),
        Err(SendError::QueueFull),
        "replies over the bound"
    );
    let mut wire = Vec::new();
    conn.shared().lock().queue().move_into(&mut wire);
    assert_eq!(&wire[..4], &[0x81, 2, b'r', b'1'], "ahead of the push");
    assert_eq!(wire.len(), 4 + 204 + 20_004);
}

#[test]
#[cfg(feature = "deflate")]
fn a_reply_is_compressed_only_without_context_takeover() {
    use crate::proto::Role;
    use crate::proto::deflate::{DeflateConfig, DeflateParams};

    let text = "a reply worth compressing, a reply worth compressing ".repeat(4);
    for no_context in [false, true] {
        let (conn, _) = conn(1 << 20);
        let params = DeflateParams::new(no_context, true);
        let compressor = Compressor::new(Role::Server, &params, &DeflateConfig::default());
        conn.shared().lock().set_compressor(compressor);
        // Incompressible, so that it stays long.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..40_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        conn.send_shared(MessageKind::Binary, Bytes::from(noise))
            .unwrap();
        conn.reply(Message::Text(&text)).unwrap();
        let mut wire = Vec::new();
        conn.shared().lock().queue().move_into(&mut wire);
        let compressed = wire[0] & 0x40 != 0;
        assert_eq!(wire[0] & 0x0f, 1, "the reply went first");
        assert_eq!(compressed, no_context, "no_context_takeover: {no_context}");
    }
}

/// What the driver does once the peer read everything: the queue is
/// written out, and the tasks waiting for room are taken (the bound is
/// 10 in these tests: woken at 5 or less).
fn write_out(conn: &Conn) -> Option<Waiters> {
    let mut outbox = conn.shared().lock();
    let n = outbox.queue().len();
    outbox.queue().advance(n);
    outbox.take_waiting_if_room(5)
}

#[test]
fn send_when_ready_waits_for_room_and_fails_once_closed() {
    use std::future::Future;
    let (conn, _) = conn(10);
    let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    conn.send_binary(&[0u8; 50]).unwrap();
    let payload = Bytes::from_static(b"next");
    let mut send = std::pin::pin!(conn.send_when_ready(MessageKind::Binary, payload));
    assert!(send.as_mut().poll(&mut cx).is_pending());
    assert!(
        !conn.shared().lock().wants_drain(),
        "no on_drain for a waiter"
    );
    let waiting = write_out(&conn);
    wake_all(waiting);
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert_eq!(send.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
    assert_eq!(conn.queued_bytes(), 6);

    conn.send_binary(&[0u8; 50]).unwrap();
    let mut send = std::pin::pin!(conn.send_when_ready(MessageKind::Binary, Bytes::new()));
    assert!(send.as_mut().poll(&mut cx).is_pending());
    conn.close(CloseCode::NORMAL, "").unwrap();
    assert_eq!(wakes.0.load(Ordering::SeqCst), 2, "the close wakes it");
    assert_eq!(
        send.as_mut().poll(&mut cx),
        Poll::Ready(Err(SendError::Closed))
    );
}

#[test]
fn a_dropped_send_when_ready_sends_nothing_and_leaves_no_harm() {
    use std::future::Future;
    let (conn, _) = conn(10);
    let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    conn.send_binary(&[0u8; 50]).unwrap();
    {
        let send = conn.send_when_ready(MessageKind::Binary, Bytes::from_static(b"lost"));
        let mut send = std::pin::pin!(send);
        assert!(send.as_mut().poll(&mut cx).is_pending());
        let mut ready = std::pin::pin!(conn.ready());
        assert!(ready.as_mut().poll(&mut cx).is_pending());
    }
    let waiting = write_out(&conn);
    assert_eq!(waiting.as_ref().map(|w| w.len()), Some(1), "one task, once");
    wake_all(waiting);
    assert_eq!(conn.queued_bytes(), 0, "the dropped send queued nothing");
    assert!(!conn.shared().lock().has_waiting());
}

#[test]
fn rejects_invalid_text_and_long_pings() {
    let (conn, _) = conn(1 << 20);
    assert_eq!(
        conn.send_shared(MessageKind::Text, Bytes::from_static(b"\xff")),
        Err(SendError::InvalidUtf8)
    );
    assert_eq!(conn.ping(&[0u8; 126]), Err(SendError::PayloadTooLong));
    assert_eq!(conn.queued_bytes(), 0);
}
