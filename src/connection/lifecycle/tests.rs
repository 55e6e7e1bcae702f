//! The whole life of a connection driven without a socket: requests,
//! refusals, deadlines, the close handshake, FIN and the linger, pausing,
//! and both ways of writing. `now` is a value here, so every deadline is
//! tested at its exact instant.

use std::sync::Mutex;
use std::task::Waker;
use std::time::Duration;

use super::*;
use crate::proto::PONG_BUDGET;
use crate::proto::frame::write_frame;
use crate::proto::{CloseCode, Message, OpCode};
use crate::{Accept, Config, Reject, Request};

/// Echoes messages, records `on_open` and `on_close`; its upgrade hook
/// sets `max_message`, if any, as the connection's own limit.
#[derive(Default)]
struct Echo {
    seen: Mutex<Vec<String>>,
    max_message: Option<usize>,
}

impl Handler for Echo {
    type State = ();

    fn on_open(&self, _: &Conn, _: &mut ()) {
        self.seen.lock().unwrap().push("open".into());
    }

    fn on_message(&self, conn: &Conn, _: &mut (), message: Message<'_>) {
        let _ = conn.send(message);
    }

    fn on_close(&self, _: &Conn, _: &mut (), code: CloseCode, reason: &str) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("close {} {reason}", code.0));
    }
}

impl ServerHandler for Echo {
    fn on_upgrade(&self, _: &Request<'_>, accept: &mut Accept) -> Result<(), Reject> {
        if let Some(bytes) = self.max_message {
            accept.max_message_size(bytes);
        }
        Ok(())
    }
}

const REQUEST: &[u8] = b"GET /chat HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n\
    Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\n\r\n";

const KEY: [u8; 4] = [1, 2, 3, 4];

/// A lifecycle, its server's settings and what the "driver" did.
struct Harness {
    env: Env<Echo>,
    life: Lifecycle<Echo>,
    now: Instant,
    /// Bytes the lifecycle had written.
    wire: Vec<u8>,
    /// The read buffer a driver would keep.
    input: BytesMut,
    fins: usize,
}

impl Harness {
    fn new(config: Config) -> Harness {
        Harness::with(config, Echo::default())
    }

    fn with(config: Config, handler: Echo) -> Harness {
        let env = Env::server(Hub::new(config, "test"), Arc::new(handler));
        let now = Instant::now();
        let life = Lifecycle::accept(peer(), env.hub.enter(), wake(), &env, now);
        Harness {
            env,
            life,
            now,
            wire: Vec::new(),
            input: BytesMut::new(),
            fins: 0,
        }
    }

    /// Bytes arrive.
    fn receive(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
        self.life.handle_input(&mut self.input, &self.env, self.now);
    }

    /// Does what `poll` asks (writing everything at once) until it says to
    /// wait or close, and returns that.
    fn run(&mut self) -> Action {
        loop {
            match self.life.poll_action(&self.env, self.now) {
                Action::Write => {
                    let wire = &mut self.wire;
                    let done = self.life.write_in_place(&self.env.hub.pool, |slices| {
                        slices.iter().for_each(|s| wire.extend_from_slice(s));
                        Ok(slices.iter().map(|s| s.len()).sum())
                    });
                    assert!(done, "a writer that takes everything");
                }
                Action::ShutDown => self.fins += 1,
                action => return action,
            }
        }
    }

    /// Takes what was written so far.
    fn written(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.wire)
    }

    fn open(config: Config) -> Harness {
        let mut harness = Harness::new(config);
        harness.receive(REQUEST);
        assert_eq!(harness.run(), Action::Wait);
        assert!(harness.written().starts_with(b"HTTP/1.1 101 "));
        harness
    }

    fn seen(&self) -> Vec<String> {
        self.env.handler.seen.lock().unwrap().clone()
    }

    fn later(&mut self, by: Duration) {
        self.now += by;
    }
}

fn peer() -> SocketAddr {
    "127.0.0.1:40000".parse().unwrap()
}

fn wake() -> ConnWake {
    ConnWake::Waker(Waker::noop().clone())
}

fn masked(opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    write_frame(&mut frame, true, 0, opcode, payload, Some(KEY));
    frame
}

fn unmasked(opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    write_frame(&mut frame, true, 0, opcode, payload, None);
    frame
}

fn close_payload(code: u16) -> Vec<u8> {
    code.to_be_bytes().to_vec()
}

#[test]
fn a_request_is_answered_and_the_frames_after_it_are_handled() {
    let mut h = Harness::new(Config::default());
    assert!(h.life.wants_read());
    assert_eq!(h.life.bytes_wanted(&h.env), 8 * 1024 + 1);
    let mut bytes = REQUEST.to_vec();
    bytes.extend(masked(OpCode::Text, b"hello"));
    h.receive(&bytes);
    assert!(h.input.is_empty(), "request and frame consumed");
    assert_eq!(h.run(), Action::Wait);
    let wire = h.written();
    assert!(wire.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
    assert!(
        wire.ends_with(&unmasked(OpCode::Text, b"hello")),
        "101 then echo"
    );
    assert_eq!(h.seen(), ["open"]);
    assert!(h.life.wants_read());
    assert_eq!(
        h.life.poll_timeout(),
        None,
        "an open connection has no deadline"
    );
    assert_eq!(h.env.hub.open(), 1);
}

#[test]
fn a_request_in_pieces_waits_in_the_drivers_buffer() {
    let mut h = Harness::new(Config::default());
    let (head, rest) = REQUEST.split_at(40);
    h.receive(head);
    assert_eq!(&h.input[..], head, "kept for the rest");
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().is_empty());
    h.receive(rest);
    assert!(h.input.is_empty());
    h.run();
    assert!(h.written().starts_with(b"HTTP/1.1 101 "));
}

#[test]
fn a_bad_request_gets_its_error_then_fin_then_a_bounded_linger() {
    let mut h = Harness::new(Config::default());
    h.receive(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(!h.life.wants_read(), "nothing is read while answering");
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().starts_with(b"HTTP/1.1 405 "));
    assert_eq!(h.fins, 1, "FIN after the response");
    assert!(h.life.wants_read(), "lingering until the peer's FIN");
    assert_eq!(h.life.poll_timeout(), Some(h.now + Duration::from_secs(5)));
    h.receive(&[0u8; 1000]);
    assert!(h.input.is_empty(), "discarded");
    assert_eq!(h.run(), Action::Wait);
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End);
    assert!(h.seen().is_empty(), "never opened");
}

#[test]
fn the_linger_is_bounded_in_bytes_and_time() {
    let mut h = Harness::new(Config::default());
    h.receive(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(h.run(), Action::Wait);
    let read = vec![0u8; 1 << 20];
    for _ in 1..LINGER_LIMIT / read.len() {
        h.receive(&read);
        assert_eq!(h.run(), Action::Wait, "an upload read through");
    }
    h.receive(&read);
    assert_eq!(h.run(), Action::End, "a peer that keeps sending");

    let mut h = Harness::new(Config::default());
    h.receive(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(h.run(), Action::Wait);
    h.later(Duration::from_secs(5) - Duration::from_millis(1));
    assert_eq!(h.run(), Action::Wait);
    h.later(Duration::from_millis(1));
    assert_eq!(h.run(), Action::End, "a peer that never sends FIN");
}

#[test]
fn a_silent_client_gets_408_at_the_handshake_timeout_exactly() {
    let mut h = Harness::new(Config::default().handshake_timeout(Duration::from_secs(3)));
    assert_eq!(h.life.poll_timeout(), Some(h.now + Duration::from_secs(3)));
    h.receive(b"GET / HTTP/1.1\r\n");
    h.later(Duration::from_secs(3) - Duration::from_nanos(1));
    assert_eq!(h.run(), Action::Wait);
    h.later(Duration::from_nanos(1));
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().starts_with(b"HTTP/1.1 408 "));
    assert_eq!(h.fins, 1);
}

#[test]
fn a_port_check_gets_no_answer_and_a_cut_request_gets_400() {
    let mut h = Harness::new(Config::default());
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End);
    assert!(h.written().is_empty());

    let mut h = Harness::new(Config::default());
    h.receive(&REQUEST[..30]);
    h.life.handle_eof();
    assert_eq!(
        h.run(),
        Action::End,
        "written, FIN sent, and the peer has left"
    );
    assert!(h.written().starts_with(b"HTTP/1.1 400 "));
    assert_eq!(h.fins, 1);
}

#[test]
fn a_shutdown_answers_handshakes_503() {
    let mut h = Harness::new(Config::default());
    h.receive(&REQUEST[..30]);
    h.env.hub.begin_shutdown();
    h.receive(&REQUEST[30..]);
    h.run();
    assert!(h.written().starts_with(b"HTTP/1.1 503 "));
    assert!(h.seen().is_empty());
}

#[test]
fn a_complete_close_handshake_closes_at_once() {
    let mut h = Harness::open(Config::default());
    h.receive(&masked(OpCode::Close, &close_payload(1000)));
    assert_eq!(h.run(), Action::End, "no FIN, no linger");
    assert_eq!(h.written(), unmasked(OpCode::Close, &close_payload(1000)));
    assert_eq!(h.fins, 0);
    assert_eq!(h.seen(), ["open", "close 1000 "]);
    assert_eq!(h.env.hub.open(), 0);
}

#[test]
fn our_close_waits_for_the_peers_until_the_deadline() {
    let mut h = Harness::open(Config::default().close_timeout(Duration::from_secs(2)));
    let conn = h.life.conn().unwrap().clone();
    conn.close(CloseCode::NORMAL, "bye").unwrap();
    assert_eq!(h.run(), Action::Wait);
    let mut expected = close_payload(1000);
    expected.extend(b"bye");
    assert_eq!(h.written(), unmasked(OpCode::Close, &expected));
    assert_eq!(h.life.poll_timeout(), Some(h.now + Duration::from_secs(2)));
    // A peer that floods data instead of answering is cut off on time.
    h.later(Duration::from_secs(1));
    h.receive(&masked(OpCode::Binary, &[7u8; 100]));
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().is_empty(), "data after our close is dropped");
    h.later(Duration::from_secs(1));
    h.receive(&masked(OpCode::Binary, &[7u8; 100]));
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.seen(), ["open", "close 1006 close handshake timed out"]);
}

#[test]
fn our_close_answered_ends_tcp_at_once() {
    let mut h = Harness::open(Config::default());
    let conn = h.life.conn().unwrap().clone();
    conn.close(CloseCode::GOING_AWAY, "").unwrap();
    assert_eq!(h.run(), Action::Wait);
    h.receive(&masked(OpCode::Close, &close_payload(1001)));
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.fins, 0);
    assert_eq!(h.seen(), ["open", "close 1001 "]);
}

#[test]
fn a_protocol_error_fails_with_its_code_then_fin_and_linger() {
    let mut h = Harness::open(Config::default());
    h.receive(&unmasked(OpCode::Text, b"not masked"));
    assert_eq!(h.run(), Action::Wait);
    let wire = h.written();
    assert_eq!(&wire[..4], &[0x88, 28, 0x03, 0xea], "close 1002");
    assert_eq!(h.fins, 1);
    assert!(h.life.wants_read(), "waiting for the peer's FIN");
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.seen(), ["open", "close 1002 client frame is not masked"]);
}

#[test]
fn eof_or_a_read_error_without_a_close_is_1006() {
    let mut h = Harness::open(Config::default());
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End);
    assert_eq!(
        h.seen(),
        ["open", "close 1006 connection closed without a close frame"]
    );

    let mut h = Harness::open(Config::default());
    h.life
        .handle_read_error(&io::ErrorKind::ConnectionReset.into());
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.seen()[1], "close 1006 read failed: connection reset");
}

/// Writes through a socket that takes `budget` bytes, then would block.
fn write_some(h: &mut Harness, budget: usize) -> bool {
    let write = crate::proto::write_at_most(budget, &mut h.wire);
    h.life.write_in_place(&h.env.hub.pool, write)
}

#[test]
fn a_blocked_write_does_not_stop_reading_below_the_bound() {
    let mut h = Harness::open(Config::default());
    h.receive(&masked(OpCode::Binary, &[1u8; 1000]));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert!(!write_some(&mut h, 100));
    assert_eq!(
        h.life.poll_action(&h.env, h.now),
        Action::Write,
        "still to write"
    );
    assert!(!h.life.is_paused() && h.life.wants_read());
    // A request arrives meanwhile and is answered.
    h.receive(&masked(OpCode::Text, b"request"));
    assert_eq!(h.run(), Action::Wait);
    let mut expected = unmasked(OpCode::Binary, &[1u8; 1000]);
    expected.extend(unmasked(OpCode::Text, b"request"));
    assert!(h.written() == expected, "the echo, then the answer");
}

#[test]
fn a_full_queue_holds_the_input_until_it_is_written_down_to_half() {
    let mut h = Harness::open(Config::default().max_outbound_bytes(3000));
    let mut burst = Vec::new();
    for i in 0..5u8 {
        burst.extend(masked(OpCode::Binary, &[i; 1000]));
    }
    h.receive(&burst);
    // Three echoes (3012 bytes) fill the queue: the other two frames wait.
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert!(h.life.is_paused() && !h.life.wants_read() && !h.life.holds_input(&h.env));
    assert_eq!(h.life.conn().unwrap().queued_bytes(), 3 * 1004);
    assert!(!h.input.is_empty(), "the rest waits in the driver's buffer");
    // Drained to 1912 bytes: above half the bound, still paused.
    assert!(!write_some(&mut h, 1100));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert!(h.life.is_paused());
    // Drained to 1412: the held frames are due, then reading goes on.
    assert!(!write_some(&mut h, 500));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert!(h.life.holds_input(&h.env) && h.life.wants_read());
    h.life.handle_input(&mut h.input, &h.env, h.now);
    assert!(h.input.is_empty() && !h.life.holds_input(&h.env));
    assert_eq!(h.run(), Action::Wait);
    let mut expected = Vec::new();
    for i in 0..5u8 {
        expected.extend(unmasked(OpCode::Binary, &[i; 1000]));
    }
    assert_eq!(h.written(), expected, "every echo, in order");
}

#[test]
fn a_producer_waits_at_half_the_bound_and_is_woken_at_a_quarter_or_by_the_close() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake};
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);

    let mut h = Harness::open(Config::default().max_outbound_bytes(4000));
    let conn = h.life.conn().unwrap().clone();
    assert_eq!(conn.poll_ready(&mut cx), Poll::Ready(Ok(())));
    conn.send_binary(&[7u8; 2000]).unwrap();
    assert_eq!(
        conn.poll_ready(&mut cx),
        Poll::Pending,
        "2004 bytes: half full"
    );
    assert_eq!(conn.poll_ready(&mut cx), Poll::Pending, "registered once");
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert!(
        !h.life.is_paused(),
        "a producer's half does not stop reading"
    );
    assert!(!write_some(&mut h, 900));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "1104 bytes left: not yet"
    );
    assert!(!write_some(&mut h, 200));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "904 bytes left: woken");
    assert_eq!(conn.poll_ready(&mut cx), Poll::Ready(Ok(())));

    conn.send_binary(&[8u8; 2000]).unwrap();
    assert_eq!(conn.poll_ready(&mut cx), Poll::Pending);
    conn.close(CloseCode::NORMAL, "").unwrap();
    assert_eq!(count.0.load(Ordering::SeqCst), 2, "the close wakes it");
    assert_eq!(
        conn.poll_ready(&mut cx),
        Poll::Ready(Err(crate::SendError::Closed))
    );
}

#[test]
fn pings_while_a_send_is_out_are_answered_within_the_pong_budget() {
    let mut h = Harness::open(Config::default());
    h.receive(&masked(OpCode::Binary, &[1u8; 50_000]));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    let mut taken = WriteQueue::new();
    h.life.take_queue(&mut taken);
    // The send is still out when pings come. Ten get ten pongs (Autobahn
    // 2.10, over a stream that is slow to take writes); a flood of them
    // costs no more than the budget, and the latest is answered.
    let ping = |i: u32| masked(OpCode::Ping, &i.to_be_bytes());
    h.receive(&(0..10).flat_map(ping).collect::<Vec<_>>());
    let conn = h.life.conn().unwrap().clone();
    assert_eq!(conn.queued_bytes(), taken.len() + 10 * 6, "ten pongs wait");
    h.receive(&(10..1000).flat_map(ping).collect::<Vec<_>>());
    assert!(conn.queued_bytes() <= taken.len() + PONG_BUDGET + 6);
    h.life.handle_sent(taken.len());
    h.life.handle_write_finished(0);
    assert_eq!(h.run(), Action::Wait);
    let written = h.written();
    let last = unmasked(OpCode::Pong, &999u32.to_be_bytes());
    assert!(written.starts_with(&unmasked(OpCode::Pong, &0u32.to_be_bytes())));
    assert!(written.ends_with(&last), "the latest ping's pong is last");
}

#[test]
fn a_write_that_owns_its_buffers_is_tracked_until_finished() {
    let mut h = Harness::open(Config::default().max_outbound_bytes(1000));
    h.receive(&masked(OpCode::Binary, &[1u8; 2000]));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    let mut taken = WriteQueue::new();
    h.life.take_queue(&mut taken);
    assert_eq!(taken.len(), 2004);
    assert!(h.life.writing);
    assert!(
        h.life.is_paused(),
        "over max_outbound_bytes: reading pauses"
    );
    let conn = h.life.conn().unwrap().clone();
    assert_eq!(conn.queued_bytes(), 2004, "bytes in flight count");
    assert_eq!(
        h.life.poll_action(&h.env, h.now),
        Action::Wait,
        "nothing new to write"
    );
    assert_eq!(conn.send_binary(b"x"), Err(crate::SendError::QueueFull));
    h.life.handle_sent(1000);
    assert_eq!(
        conn.queued_bytes(),
        1004,
        "what was taken counts until sent"
    );
    h.life.handle_sent(1004);
    h.life.handle_write_finished(0);
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Wait);
    assert!(
        !h.life.is_paused() && h.life.wants_read(),
        "flushed: reading again"
    );
    conn.send_binary(b"more").unwrap();
    assert_eq!(
        h.life.poll_action(&h.env, h.now),
        Action::Write,
        "the newer bytes"
    );
    let mut taken = WriteQueue::new();
    h.life.take_queue(&mut taken);
    assert_eq!(taken.len(), 6);
    h.life.handle_sent(taken.len());
    h.life.handle_write_finished(0);
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Wait);
    assert_eq!(conn.queued_bytes(), 0);
}

#[test]
fn a_failed_write_ends_the_connection_with_1006() {
    let mut h = Harness::open(Config::default());
    h.receive(&masked(OpCode::Text, b"x"));
    assert_eq!(h.life.poll_action(&h.env, h.now), Action::Write);
    let done = h
        .life
        .write_in_place(&h.env.hub.pool, |_| Err(io::ErrorKind::BrokenPipe.into()));
    assert!(!done);
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.seen()[1], "close 1006 write failed: broken pipe");
}

#[test]
fn an_abort_drops_the_connection_at_once() {
    let mut h = Harness::open(Config::default());
    h.life.conn().unwrap().shared().abort();
    assert_eq!(h.run(), Action::End);
    assert_eq!(
        h.seen(),
        ["open", "close 1006 connection aborted by server shutdown"]
    );
}

#[test]
fn an_upgraded_connection_opens_at_once() {
    let env = Env::server(
        Hub::new(Config::default(), "test"),
        Arc::new(Echo::default()),
    );
    let handed = Arc::new(Mutex::new(Vec::new()));
    let to = handed.clone();
    let upgraded = Upgraded {
        // A frame read after the handshake: the driver's first input.
        prefix: BytesMut::from(&masked(OpCode::Text, b"hi")[..]),
        hand_out: Some(Box::new(move |conn: &Conn| {
            to.lock().unwrap().push(conn.id())
        })),
        ..Upgraded::server((), None)
    };
    let (mut life, mut input) =
        Lifecycle::upgraded(peer(), env.hub.enter(), wake(), upgraded, &env);
    assert_eq!(*env.handler.seen.lock().unwrap(), ["open"]);
    let id = life.conn().expect("open").id();
    assert_eq!(
        *handed.lock().unwrap(),
        [id],
        "handed out once, after on_open"
    );
    assert_eq!(life.poll_timeout(), None);
    assert_eq!(input, masked(OpCode::Text, b"hi"), "the prefix comes back");
    let now = Instant::now();
    life.handle_input(&mut input, &env, now);
    assert_eq!(life.poll_action(&env, now), Action::Write);
    let mut wire = Vec::new();
    life.write_in_place(&env.hub.pool, |slices| {
        slices.iter().for_each(|s| wire.extend_from_slice(s));
        Ok(slices.iter().map(|s| s.len()).sum())
    });
    assert_eq!(wire, unmasked(OpCode::Text, b"hi"), "no handshake bytes");
}

#[test]
fn dropping_a_connection_ends_it_for_the_server() {
    let h = Harness::open(Config::default());
    assert_eq!((h.env.hub.live(), h.env.hub.open()), (1, 1));
    let Harness { env, life, .. } = h;
    drop(life);
    assert_eq!((env.hub.live(), env.hub.open()), (0, 0));
    assert_eq!(
        *env.handler.seen.lock().unwrap(),
        ["open", "close 1006 connection dropped"]
    );
}

/// A client's connection, opened after its handshake: the harness plays
/// the server, sending unmasked frames.
fn client(config: Config) -> Harness {
    // A client's connections carry no server hooks.
    let env = Env {
        hub: Hub::new(config, "test"),
        handler: Arc::new(Echo::default()),
        hooks: None,
    };
    let upgraded = Upgraded {
        role: Role::Client,
        ..Upgraded::server((), None)
    };
    let (life, _) = Lifecycle::upgraded(peer(), env.hub.enter(), wake(), upgraded, &env);
    Harness {
        env,
        life,
        now: Instant::now(),
        wire: Vec::new(),
        input: BytesMut::new(),
        fins: 0,
    }
}

/// The frames in `wire`, unmasked: (opcode, payload), each checked to be
/// masked.
fn client_frames(mut wire: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while !wire.is_empty() {
        assert!(wire[1] & 0x80 != 0, "a client's frames are masked");
        let len = usize::from(wire[1] & 0x7f);
        assert!(len < 126, "short frames only here");
        let key = &wire[2..6];
        let payload = wire[6..6 + len]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect();
        frames.push((wire[0] & 0x0f, payload));
        wire = &wire[6 + len..];
    }
    frames
}

#[test]
fn a_client_masks_and_refuses_masked_frames() {
    let mut h = client(Config::default());
    h.receive(&unmasked(OpCode::Text, b"from the server"));
    assert_eq!(h.run(), Action::Wait);
    let echoed = client_frames(&h.written());
    assert_eq!(echoed, [(1, b"from the server".to_vec())]);

    // A masked frame from the server fails the connection with 1002.
    h.receive(&masked(OpCode::Text, b"masked"));
    assert_eq!(h.run(), Action::Wait);
    let close = client_frames(&h.written());
    assert_eq!(close[0].0, 8);
    assert_eq!(close[0].1[..2], 1002u16.to_be_bytes());
    assert_eq!(h.fins, 1, "a failure ends TCP from our side too");
}

#[test]
fn a_client_waits_for_the_server_to_close_tcp_first() {
    let mut h = client(Config::default());
    h.life
        .conn()
        .unwrap()
        .close(CloseCode(4000), "done")
        .unwrap();
    assert_eq!(h.run(), Action::Wait);
    let close = client_frames(&h.written());
    assert_eq!(close, [(8, [&4000u16.to_be_bytes()[..], b"done"].concat())]);
    // The server's answer completes the handshake: no FIN from the client
    // (RFC 6455 §7.1.1), it reads on until the server's.
    h.receive(&unmasked(OpCode::Close, &4000u16.to_be_bytes()));
    assert_eq!(h.run(), Action::Wait);
    assert_eq!(h.fins, 0);
    assert!(h.life.wants_read());
    assert_eq!(h.seen(), ["open", "close 4000 "]);
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.fins, 0);
}

#[test]
fn a_client_closes_tcp_itself_if_the_server_does_not() {
    let timeout = Duration::from_secs(5);
    let mut h = client(Config::default().close_timeout(timeout));
    // The server closes first; the client answers and waits for its FIN.
    h.receive(&unmasked(OpCode::Close, &1001u16.to_be_bytes()));
    assert_eq!(h.run(), Action::Wait);
    let answer = client_frames(&h.written());
    assert_eq!(answer, [(8, 1001u16.to_be_bytes().to_vec())]);
    assert_eq!(h.seen(), ["open", "close 1001 "]);
    let deadline = h.life.poll_timeout().expect("bounded by the close timeout");
    assert_eq!(deadline, h.now + timeout);
    // Bytes after the close are read and dropped.
    h.receive(b"late bytes");
    assert_eq!(h.run(), Action::Wait);
    h.later(timeout);
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.fins, 0);
}

#[test]
fn a_client_that_has_the_servers_fin_already_closes_at_once() {
    let mut h = client(Config::default());
    // The server's close and its FIN arrive together, before our answer is
    // written.
    h.receive(&unmasked(OpCode::Close, &1000u16.to_be_bytes()));
    h.life.handle_eof();
    assert_eq!(h.run(), Action::End, "nothing left to wait for");
    let answer = client_frames(&h.written());
    assert_eq!(answer, [(8, 1000u16.to_be_bytes().to_vec())]);
    assert_eq!(h.fins, 0);
}

/// The outbox locks one echoed message costs the whole path (its frame in,
/// `on_message`'s send, the write, the polls around them), counted on this
/// thread: the outbox is what `Conn` handles and the driver share, and each
/// lock is an atomic round trip on the echo path (docs/connection.md, "Sending").
#[test]
fn an_echoed_message_takes_few_outbox_locks() {
    use crate::connection::outbox::OUTBOX_LOCKS;
    let mut h = Harness::open(Config::default());
    let messages = 100;
    let before = OUTBOX_LOCKS.with(|locks| locks.get());
    for _ in 0..messages {
        h.receive(&masked(OpCode::Text, b"hello"));
        assert_eq!(h.run(), Action::Wait);
    }
    let locks = OUTBOX_LOCKS.with(|locks| locks.get()) - before;
    let echoes = unmasked(OpCode::Text, b"hello").repeat(messages);
    assert!(h.wire.ends_with(&echoes), "every message echoed");
    let per_message = locks as f64 / messages as f64;
    eprintln!("outbox locks per echoed message: {per_message}");
    // 9 before the outbox's uses were merged: a lock to mark
    // the flush as scheduled, two reads, the send, the poll after input,
    // the write, the poll after it, `on_drain`'s check, the pending-work look.
    assert!(per_message <= 6.0, "{per_message} locks per echoed message");
}

#[test]
fn the_upgrade_hook_sets_the_connections_own_limits() {
    let handler = Echo {
        max_message: Some(10),
        ..Echo::default()
    };
    let mut h = Harness::with(Config::default(), handler);
    h.receive(REQUEST);
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().starts_with(b"HTTP/1.1 101 "));
    h.receive(&masked(OpCode::Binary, &[7; 10]));
    assert_eq!(h.run(), Action::Wait);
    assert_eq!(
        h.written(),
        unmasked(OpCode::Binary, &[7; 10]),
        "at the limit"
    );
    // The server's limit is 1 MiB; this connection's is 10 bytes.
    h.receive(&masked(OpCode::Binary, &[7; 11]));
    assert_eq!(h.run(), Action::Wait, "lingering for the peer's FIN");
    assert_eq!(h.fins, 1);
    let close = h.written();
    assert_eq!(&close[..4], &[0x88, close[1], 0x03, 0xf1], "close 1009");
    assert_eq!(
        h.seen()[1],
        "close 1009 message exceeds the maximum message size"
    );
}

/// A handoff freezes input before the server's state leaves: an open
/// connection's frames wait in the driver's buffer, unhandled (nothing a
/// callback would do, a publish, happens after the state left), and it
/// reads nothing more; when a failed handoff thaws it, they are handled
/// at once, in order. A connection closing is not frozen: it reads and
/// handles the peer's close reply.
#[cfg(all(target_os = "linux", feature = "handoff"))]
#[test]
fn frozen_input_waits_unhandled_and_is_handled_when_thawed() {
    let mut h = Harness::open(Config::default());
    h.env.hub.freeze_input(true);
    assert!(!h.life.reads_now(&h.env) && h.life.wants_read());
    let mut frames = masked(OpCode::Text, b"one");
    frames.extend(masked(OpCode::Text, b"two"));
    h.receive(&frames);
    assert_eq!(h.run(), Action::Wait);
    assert!(h.written().is_empty(), "nothing echoed while frozen");
    assert_eq!(h.input.len(), frames.len(), "the frames wait, whole");
    assert!(
        !h.life.holds_input(&h.env),
        "not due: the driver must not spin"
    );
    h.env.hub.freeze_input(false);
    assert!(h.life.reads_now(&h.env));
    h.life.thaw(&mut h.input, &h.env);
    assert_eq!(h.run(), Action::Wait);
    let mut echoed = unmasked(OpCode::Text, b"one");
    echoed.extend(unmasked(OpCode::Text, b"two"));
    assert_eq!(h.written(), echoed);
    assert!(h.input.is_empty());

    // Closing: the close reply is read and handled though input is frozen.
    let conn = h.life.conn().unwrap().clone();
    conn.close(CloseCode::NORMAL, "bye").unwrap();
    assert_eq!(h.run(), Action::Wait);
    h.written();
    h.env.hub.freeze_input(true);
    assert!(h.life.reads_now(&h.env), "a closing connection reads on");
    h.receive(&masked(OpCode::Close, &close_payload(1000)));
    assert!(h.input.is_empty());
    assert_eq!(h.run(), Action::End);
    assert_eq!(h.seen(), ["open", "close 1000 "]);
}

/// The peer's end arrives after frames that wait frozen (io_uring's
/// receive may deliver both before it is cancelled): the frames are no
/// less the peer's, so they are handled when input thaws (`holds_input`
/// says they are due, without a thaw call: a stream task only polls),
/// and only then does the end count (as any end without a close frame).
#[cfg(all(target_os = "linux", feature = "handoff"))]
#[test]
fn frames_frozen_before_the_peers_end_are_handled_when_thawed() {
    let mut h = Harness::open(Config::default());
    h.env.hub.freeze_input(true);
    h.receive(&masked(OpCode::Text, b"last words"));
    h.life.handle_eof();
    assert_eq!(h.run(), Action::Wait, "not an abrupt end: frames wait");
    assert!(!h.life.holds_input(&h.env));
    assert_eq!(h.seen(), ["open"]);
    h.env.hub.freeze_input(false);
    assert!(h.life.holds_input(&h.env), "due once thawed");
    h.life.handle_input(&mut h.input, &h.env, h.now);
    assert!(h.input.is_empty());
    let echo = unmasked(OpCode::Text, b"last words").len();
    assert_eq!(
        h.life.conn().unwrap().queued_bytes(),
        echo,
        "handled: echoed"
    );
    assert_eq!(h.run(), Action::End);
    assert_eq!(
        h.seen(),
        ["open", "close 1006 connection closed without a close frame"]
    );
}
