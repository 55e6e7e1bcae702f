//! A client `Session` and a server `Session` talking to each other in
//! memory, both directions at once, bytes delivered in random chunks.
//!
//! Each side sends random text (any `char`) and binary messages, some cut
//! into fragments with a ping between them, some handed over as shared
//! `Bytes`; then one side, chosen at random, closes. With permessage-deflate
//! the parameters come from a real negotiation: the client's offer written
//! by `handshake::ClientRequest`, the server's `negotiate` and `write_accept`,
//! and the client's check of that `101`. Checked: each side sees exactly
//! the messages and pings the other sent, in order, and a pong for each of
//! its own pings; both see the close code; and on the wire every frame the
//! client sent is masked, with a key of its own, and none the server sent.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
mod messages;

use messages::{Seen, TestMessage};
use rapidws::DeflateConfig;
use rapidws_core::handshake::{
    ClientRequest, header_buffer, negotiate, parse_request, write_accept,
};
use rapidws_core::pool::BufferPool;
use rapidws_core::proto::deflate::{Compressor, DeflateParams};
use rapidws_core::proto::frame::{DecodeRules, RSV1, decode_header, write_frame};
use rapidws_core::proto::{CloseCode, Event, Limits, Message, OpCode, Role, Session, WriteQueue};

fn message() -> impl Strategy<Value = TestMessage> {
    let text = prop::collection::vec(any::<char>(), 0..300)
        .prop_map(|chars| (true, chars.into_iter().collect::<String>().into_bytes()));
    let binary = prop::collection::vec(any::<u8>(), 0..2000).prop_map(|bytes| (false, bytes));
    (
        prop_oneof![text, binary],
        prop::collection::vec(any::<u16>(), 0..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|((text, payload), cuts, ping_inside, shared)| TestMessage {
            text,
            payload,
            cuts,
            ping_inside,
            shared,
        })
}

/// Both ends' permessage-deflate settings; every field is varied.
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// What the client asks for.
    client_lets_server_keep: bool,
    client_keeps: bool,
    server_window: u8,
    client_window: u8,
    /// What the server allows.
    server_keeps: bool,
    server_lets_client_keep: bool,
}

impl Settings {
    fn client_config(self) -> DeflateConfig {
        DeflateConfig::default()
            .server_context_takeover(self.client_lets_server_keep)
            .client_context_takeover(self.client_keeps)
            .server_max_window_bits(self.server_window)
            .client_max_window_bits(self.client_window)
            .compress_min_size(0)
    }

    fn server_config(self) -> DeflateConfig {
        DeflateConfig::default()
            .server_context_takeover(self.server_keeps)
            .client_context_takeover(self.server_lets_client_keep)
            .compress_min_size(0)
    }
}

fn settings() -> impl Strategy<Value = Settings> {
    (any::<[bool; 4]>(), 9u8..=15, 9u8..=15).prop_map(|(keep, server_window, client_window)| {
        Settings {
            client_lets_server_keep: keep[0],
            client_keeps: keep[1],
            server_window,
            client_window,
            server_keeps: keep[2],
            server_lets_client_keep: keep[3],
        }
    })
}

/// One end: its session, the queue it writes into, and what it saw.
struct Peer {
    session: Session,
    out: WriteQueue,
    input: BytesMut,
    compressor: Option<Compressor>,
    seen: Vec<Seen>,
    pongs: Vec<Vec<u8>>,
}

impl Peer {
    fn new(role: Role, agreed: Option<(&DeflateParams, &DeflateConfig)>) -> Self {
        let pool = Arc::new(BufferPool::with_classes(&[(4096, 8), (65536, 4)]));
        Peer {
            session: Session::with_deflate(
                role,
                Limits::default(),
                pool,
                agreed.map(|(params, _)| params),
            ),
            out: WriteQueue::with_role(role),
            input: BytesMut::new(),
            compressor: agreed.map(|(params, config)| Compressor::new(role, params, config)),
            seen: Vec::new(),
            pongs: Vec::new(),
        }
    }

    /// Queues message number `index` as a sender does; returns what the
    /// other side should see of it.
    fn send(&mut self, index: usize, m: &TestMessage) -> Vec<Seen> {
        let ping = format!("inside {index}").into_bytes();
        let mut expected = Vec::new();
        let fragments = m.fragments(&m.payload);
        let compressed;
        let (rsv, fragments) = match self.compressor.as_mut() {
            // Whole, compressed straight into the queue, as `Conn::send` does.
            Some(compressor) if fragments.len() == 1 => {
                let queued =
                    self.out
                        .push_frame_with(true, RSV1, m.opcode(), m.payload.len() / 2, |buf| {
                            compressor.compress(&m.payload, buf)
                        });
                assert!(queued);
                return vec![m.seen()];
            }
            // Compressed, then cut: RSV1 on the first frame only.
            Some(compressor) => {
                let mut body = BytesMut::new();
                assert!(compressor.compress(&m.payload, &mut body));
                compressed = body;
                (RSV1, m.fragments(&compressed))
            }
            None => (0, fragments),
        };
        let last = fragments.len() - 1;
        for (i, fragment) in fragments.into_iter().enumerate() {
            let (opcode, rsv) = if i == 0 {
                (m.opcode(), rsv)
            } else {
                (OpCode::Continuation, 0)
            };
            if m.shared {
                let shared = Bytes::copy_from_slice(fragment);
                self.out
                    .push_frame_shared(i == last, rsv, opcode, shared.clone());
                assert_eq!(
                    shared, fragment,
                    "a shared payload is never masked in place"
                );
            } else {
                self.out.push_frame(i == last, rsv, opcode, fragment);
            }
            if i == 0 && last > 0 && m.ping_inside {
                self.out.push_frame(true, 0, OpCode::Ping, &ping);
                expected.push(Seen::Ping(ping.clone()));
            }
        }
        expected.push(m.seen());
        expected
    }

    /// Reads `bytes` and records every event; the stream must be valid.
    fn receive(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
        loop {
            let event = match self.session.poll_event(&mut self.input, &mut self.out) {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(error) => panic!("{:?} failed: {error}", self.session.role()),
            };
            match event {
                Event::Message(Message::Text(t)) => self.seen.push(Seen::Text(t.to_owned())),
                Event::Message(Message::Binary(b)) => self.seen.push(Seen::Binary(b.to_vec())),
                Event::Ping(p) => self.seen.push(Seen::Ping(p.to_vec())),
                Event::Pong(p) => self.pongs.push(p.to_vec()),
                Event::Closed { code, reason } => {
                    self.seen.push(Seen::Close(code.0, reason.to_owned()))
                }
            }
        }
    }
}

/// One direction of the connection: bytes in flight, delivered in chunks
/// whose sizes cycle through `sizes`, and everything ever sent.
struct Link {
    in_flight: Vec<u8>,
    wire: Vec<u8>,
    sizes: Vec<usize>,
    next: usize,
}

impl Link {
    fn new(sizes: Vec<usize>) -> Self {
        Link {
            in_flight: Vec::new(),
            wire: Vec::new(),
            sizes,
            next: 0,
        }
    }

    /// Takes what `from` queued and delivers one chunk to `to`; false when
    /// nothing was left to deliver.
    fn carry(&mut self, from: &mut WriteQueue, to: &mut Peer) -> bool {
        let before = self.in_flight.len();
        from.move_into(&mut self.in_flight);
        self.wire.extend_from_slice(&self.in_flight[before..]);
        if self.in_flight.is_empty() {
            return false;
        }
        let n = self.sizes[self.next % self.sizes.len()].min(self.in_flight.len());
        self.next += 1;
        to.receive(&self.in_flight[..n]);
        self.in_flight.drain(..n);
        true
    }
}

/// Moves bytes both ways until neither side has anything left to say.
fn pump(client: &mut Peer, server: &mut Peer, up: &mut Link, down: &mut Link) {
    loop {
        let moved_up = up.carry(&mut client.out, server);
        let moved_down = down.carry(&mut server.out, client);
        if !moved_up && !moved_down {
            return;
        }
    }
}

/// The upgrade, as both ends run it: the client's request, the server's
/// negotiation and `101`, the client's check. Returns what each side agreed.
fn negotiated(settings: Settings) -> (DeflateParams, DeflateParams) {
    let client_config = settings.client_config();
    let mut wire = WriteQueue::new();
    let handshake = ClientRequest::new("localhost", "/roles")
        .permessage_deflate(client_config)
        .write(&mut wire)
        .unwrap();
    let mut request = Vec::new();
    wire.move_into(&mut request);
    let mut headers = header_buffer();
    let (parsed, _) = parse_request(&request, &mut headers, 8192)
        .unwrap()
        .unwrap();
    let server = negotiate(parsed.extension_offers(), &settings.server_config())
        .expect("our server accepts our client's offer");
    write_accept(&mut wire, parsed.key(), None, Some(&server));
    let mut response = Vec::new();
    wire.move_into(&mut response);
    let accepted = handshake
        .read_response(&response, 8192)
        .unwrap()
        .expect("a whole response");
    assert_eq!(accepted.head_len, response.len());
    (accepted.deflate.expect("deflate agreed"), server)
}

/// Every frame on `wire` decodes with the rules for its sender: masked iff
/// the client sent it. Returns the masking keys.
fn frames_on(wire: &[u8], from_client: bool, deflate: bool) -> Vec<[u8; 4]> {
    let rules = DecodeRules {
        expect_masked: from_client,
        allowed_rsv: if deflate { RSV1 } else { 0 },
    };
    let mut keys = Vec::new();
    let mut rest = wire;
    while !rest.is_empty() {
        let (header, len) = decode_header(rest, rules)
            .unwrap_or_else(|e| panic!("a frame from the {}: {e}", side(from_client)))
            .expect("a whole frame header");
        assert_eq!(header.mask.is_some(), from_client);
        keys.extend(header.mask);
        rest = &rest[len + header.payload_len as usize..];
    }
    keys
}

fn side(client: bool) -> &'static str {
    if client { "client" } else { "server" }
}

/// How a conversation ends.
#[derive(Clone, Debug)]
struct Closing {
    by_client: bool,
    code: u16,
    reason: String,
}

fn closing() -> impl Strategy<Value = Closing> {
    (
        any::<bool>(),
        prop_oneof![Just(1000u16), Just(1001), Just(1008), 3000u16..5000],
        prop::collection::vec(any::<char>(), 0..20),
    )
        .prop_map(|(by_client, code, reason)| Closing {
            by_client,
            code,
            reason: reason.into_iter().collect(),
        })
}

struct Conversation<'a> {
    from_client: &'a [TestMessage],
    from_server: &'a [TestMessage],
    settings: Option<Settings>,
    closing: &'a Closing,
    up_sizes: Vec<usize>,
    down_sizes: Vec<usize>,
}

impl Conversation<'_> {
    fn run(self) {
        let agreed = self.settings.map(|s| (negotiated(s), s));
        let client_side = agreed.map(|((client, _), s)| (client, s.client_config()));
        let server_side = agreed.map(|((_, server), s)| (server, s.server_config()));
        let mut client = Peer::new(Role::Client, client_side.as_ref().map(|(p, c)| (p, c)));
        let mut server = Peer::new(Role::Server, server_side.as_ref().map(|(p, c)| (p, c)));
        let mut up = Link::new(self.up_sizes);
        let mut down = Link::new(self.down_sizes);

        let mut server_expects = Vec::new();
        for (i, m) in self.from_client.iter().enumerate() {
            server_expects.extend(client.send(i, m));
        }
        let mut client_expects = Vec::new();
        for (i, m) in self.from_server.iter().enumerate() {
            client_expects.extend(server.send(i, m));
        }
        pump(&mut client, &mut server, &mut up, &mut down);

        // Every message is in; now one side closes and the other answers.
        let closing = self.closing;
        let (initiator, responder_expects, initiator_expects) = if closing.by_client {
            (&mut client, &mut server_expects, &mut client_expects)
        } else {
            (&mut server, &mut client_expects, &mut server_expects)
        };
        assert!(initiator.session.close(
            CloseCode(closing.code),
            &closing.reason,
            &mut initiator.out
        ));
        responder_expects.push(Seen::Close(closing.code, closing.reason.clone()));
        initiator_expects.push(Seen::Close(closing.code, String::new()));
        pump(&mut client, &mut server, &mut up, &mut down);

        assert_eq!(server.seen, server_expects, "what the server saw");
        assert_eq!(client.seen, client_expects, "what the client saw");
        assert_eq!(client.pongs, pongs_owed(self.from_client));
        assert_eq!(server.pongs, pongs_owed(self.from_server));
        assert!(client.session.is_closed() && client.session.peer_closed());
        assert!(server.session.is_closed() && server.session.peer_closed());

        let deflate = agreed.is_some();
        let keys = frames_on(&up.wire, true, deflate);
        frames_on(&down.wire, false, deflate);
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), keys.len(), "a fresh key for every frame");
    }
}

/// The pongs a sender of `messages` gets back: one for each message that
/// carried a ping between its fragments, in order.
fn pongs_owed(messages: &[TestMessage]) -> Vec<Vec<u8>> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.ping_inside && m.fragments(&m.payload).len() > 1)
        .map(|(i, _)| format!("inside {i}").into_bytes())
        .collect()
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..700, 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn client_and_server_sessions_talk_both_ways(
        from_client in prop::collection::vec(message(), 0..6),
        from_server in prop::collection::vec(message(), 0..6),
        settings in prop::option::of(settings()),
        closing in closing(),
        up_sizes in chunk_sizes(),
        down_sizes in chunk_sizes(),
    ) {
        Conversation {
            from_client: &from_client,
            from_server: &from_server,
            settings,
            closing: &closing,
            up_sizes,
            down_sizes,
        }
        .run();
    }
}

/// Every deflate agreement the two ends can reach (context takeover asked,
/// promised and allowed on each side, windows 9 to 15 on each side), each
/// carrying the same fixed messages both ways, whole and fragmented.
#[test]
fn every_deflate_agreement_carries_messages_both_ways() {
    let text = "Grüße, 世界! ".repeat(40).into_bytes();
    let messages = [
        TestMessage {
            text: true,
            payload: text.clone(),
            cuts: vec![],
            ping_inside: false,
            shared: false,
        },
        TestMessage {
            text: true,
            payload: text,
            cuts: vec![20_000, 40_000],
            ping_inside: true,
            shared: false,
        },
        TestMessage {
            text: false,
            payload: (0..3000u32).map(|i| (i % 251) as u8).collect(),
            cuts: vec![30_000],
            ping_inside: false,
            shared: true,
        },
        TestMessage {
            text: false,
            payload: Vec::new(),
            cuts: vec![],
            ping_inside: false,
            shared: false,
        },
    ];
    let mut agreements = 0;
    for keep in 0..16u8 {
        for server_window in 9..=15 {
            for client_window in 9..=15 {
                let settings = Settings {
                    client_lets_server_keep: keep & 1 != 0,
                    client_keeps: keep & 2 != 0,
                    server_window,
                    client_window,
                    server_keeps: keep & 4 != 0,
                    server_lets_client_keep: keep & 8 != 0,
                };
                Conversation {
                    from_client: &messages,
                    from_server: &messages,
                    settings: Some(settings),
                    closing: &Closing {
                        by_client: keep % 3 == 0,
                        code: 1000,
                        reason: "done".to_owned(),
                    },
                    up_sizes: vec![1 + usize::from(server_window) * 37],
                    down_sizes: vec![1 + usize::from(client_window) * 41],
                }
                .run();
                agreements += 1;
            }
        }
    }
    assert_eq!(agreements, 16 * 7 * 7);
}

/// A frame that is masked the wrong way for its receiver fails the
/// connection with 1002, both ways round, with real queues writing it.
#[test]
fn each_role_refuses_the_other_roles_masking() {
    let pool = Arc::new(BufferPool::default());
    // A server's unmasked frame sent to a server; a client's masked one to
    // a client.
    for (sender, receiver) in [(Role::Server, Role::Server), (Role::Client, Role::Client)] {
        let mut out = WriteQueue::with_role(sender);
        out.push_frame(true, 0, OpCode::Text, b"wrong way round");
        let mut input = BytesMut::new();
        let mut wire = Vec::new();
        out.move_into(&mut wire);
        input.extend_from_slice(&wire);
        let mut session = Session::new(receiver, Limits::default(), pool.clone());
        let mut replies = WriteQueue::with_role(receiver);
        let error = session.poll_event(&mut input, &mut replies).unwrap_err();
        assert_eq!(error.code, CloseCode::PROTOCOL_ERROR, "{receiver:?}");
        let mut close = Vec::new();
        replies.move_into(&mut close);
        let keys = frames_on(&close, receiver == Role::Client, false);
        assert_eq!(keys.len(), usize::from(receiver == Role::Client));
    }
    // And the right way round reads fine.
    let mut masked = Vec::new();
    write_frame(
        &mut masked,
        true,
        0,
        OpCode::Text,
        b"ok",
        Some([9, 8, 7, 6]),
    );
    let mut input = BytesMut::from(&masked[..]);
    let mut session = Session::new(Role::Server, Limits::default(), pool);
    let event = session
        .poll_event(&mut input, &mut WriteQueue::new())
        .unwrap();
    assert_eq!(event, Some(Event::Message(Message::Text("ok"))));
}
