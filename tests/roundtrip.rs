//! Property tests: random messages, cut into random fragments, with pings
//! between fragments, compressed or not, and read in random chunks, come out
//! exactly as they went in, in both directions:
//!
//! - **client to server**: a client's masked frames, written with
//!   `write_frame` (and compressed by a `Compressor`), read by `Session`;
//! - **server to client**: what rapidws's `WriteQueue`, `Compressor` and
//!   `Session::close` write, read by tungstenite's client, an independent
//!   decoder. tungstenite cannot inflate, so compressed traffic is read by a
//!   client built from `decode_header` and `Inflater` instead.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::BytesMut;
use proptest::prelude::*;
mod messages;

use messages::{Seen, TestMessage};
use rapidws::DeflateConfig;
use rapidws_core::handshake::negotiate;
use rapidws_core::pool::BufferPool;
use rapidws_core::proto::deflate::{Compressor, DeflateParams, Inflater};
use rapidws_core::proto::frame::{DecodeRules, RSV1, decode_header, write_frame};
use rapidws_core::proto::{CloseCode, Event, Limits, Message, OpCode, Session, WriteQueue};
use tokio_tungstenite::tungstenite::{self, protocol::Role};

fn message() -> impl Strategy<Value = TestMessage> {
    let text = prop::collection::vec(any::<char>(), 0..800)
        .prop_map(|chars| (true, chars.into_iter().collect::<String>().into_bytes()));
    let binary = prop::collection::vec(any::<u8>(), 0..3000).prop_map(|bytes| (false, bytes));
    (
        prop_oneof![text, binary],
        prop::collection::vec(any::<u16>(), 0..4),
        any::<bool>(),
    )
        .prop_map(|((text, payload), cuts, ping_inside)| TestMessage {
            text,
            payload,
            cuts,
            ping_inside,
            shared: false,
        })
}

/// Off, on with every message compressed afresh, or on with the sender
/// keeping its window from message to message.
#[derive(Clone, Copy, Debug)]
enum Compression {
    Off,
    NoContext,
    Context,
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::Off),
        Just(Compression::NoContext),
        Just(Compression::Context)
    ]
}

impl Compression {
    /// The parameters both ends agreed to, and the sender's compressor.
    fn agree(self) -> Option<(DeflateParams, Compressor)> {
        let keep = match self {
            Compression::Off => return None,
            Compression::NoContext => false,
            Compression::Context => true,
        };
        let config = DeflateConfig::default()
            .server_context_takeover(keep)
            .client_context_takeover(keep)
            .compress_min_size(0);
        let params = negotiate([&b"permessage-deflate"[..]], &config).unwrap();
        let compressor = Compressor::new(rapidws_core::proto::Role::Server, &params, &config);
        Some((params, compressor))
    }
}

fn compress(compressor: &mut Compressor, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    assert!(compressor.compress(payload, &mut out));
    out.to_vec()
}

/// `bytes` cut into chunks whose sizes cycle through `sizes`.
fn chunks(bytes: &[u8], sizes: &[usize]) -> VecDeque<Vec<u8>> {
    let mut out = VecDeque::new();
    let mut rest = bytes;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = size.min(rest.len());
        out.push_back(rest[..n].to_vec());
        rest = &rest[n..];
    }
    out
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..700, 1..40)
}

// ------------------------------------------------------ client to server

/// The client's frames, and what the server should see of them: each message,
/// after the ping sent between its fragments, if any (a control frame
/// overtakes the message it interrupts).
fn client_wire(
    messages: &[TestMessage],
    mut compressor: Option<&mut Compressor>,
    key: [u8; 4],
) -> (Vec<u8>, Vec<Seen>) {
    let mut wire = BytesMut::new();
    let mut expected = Vec::new();
    for m in messages {
        let (rsv, body) = match compressor.as_deref_mut() {
            Some(c) => (RSV1, compress(c, &m.payload)),
            None => (0, m.payload.clone()),
        };
        let fragments = m.fragments(&body);
        let last = fragments.len() - 1;
        for (i, fragment) in fragments.into_iter().enumerate() {
            let (opcode, rsv) = if i == 0 {
                (m.opcode(), rsv)
            } else {
                (OpCode::Continuation, 0)
            };
            write_frame(&mut wire, i == last, rsv, opcode, fragment, Some(key));
            if i == 0 && last > 0 && m.ping_inside {
                write_frame(&mut wire, true, 0, OpCode::Ping, b"inside", Some(key));
                expected.push(Seen::Ping(b"inside".to_vec()));
            }
        }
        expected.push(m.seen());
    }
    (wire.to_vec(), expected)
}

fn server_reads(wire: &[u8], sizes: &[usize], deflate: Option<&DeflateParams>) -> Vec<Seen> {
    let pool = Arc::new(BufferPool::with_classes(&[(4096, 8), (65536, 4)]));
    let mut session = Session::with_deflate(
        rapidws_core::proto::Role::Server,
        Limits::default(),
        pool,
        deflate,
    );
    let mut input = BytesMut::new();
    let mut out = WriteQueue::new();
    let mut seen = Vec::new();
    for chunk in chunks(wire, sizes) {
        input.extend_from_slice(&chunk);
        while let Some(event) = session
            .poll_event(&mut input, &mut out)
            .expect("a valid stream")
        {
            seen.push(match event {
                Event::Message(Message::Text(t)) => Seen::Text(t.to_owned()),
                Event::Message(Message::Binary(b)) => Seen::Binary(b.to_vec()),
                Event::Ping(p) => Seen::Ping(p.to_vec()),
                other => panic!("unexpected {other:?}"),
            });
        }
    }
    assert!(input.is_empty(), "{} bytes left unread", input.len());
    seen
}

// ------------------------------------------------------ server to client

/// Queues the messages as rapidws sends them: whole and compressed (as
/// `Conn::send` does) or fragmented and plain, then closes with 1000. Returns
/// the bytes and what the client should see.
fn server_wire(
    messages: &[TestMessage],
    mut compressor: Option<&mut Compressor>,
) -> (Vec<u8>, Vec<Seen>) {
    let mut out = WriteQueue::new();
    let mut expected = Vec::new();
    for m in messages {
        if let Some(c) = compressor.as_deref_mut() {
            let guess = m.payload.len() / 3;
            let queued = out.push_frame_with(true, RSV1, m.opcode(), guess, |buf| {
                c.compress(&m.payload, buf)
            });
            assert!(queued);
            expected.push(m.seen());
            continue;
        }
        let fragments = m.fragments(&m.payload);
        let last = fragments.len() - 1;
        for (i, fragment) in fragments.into_iter().enumerate() {
            let opcode = if i == 0 {
                m.opcode()
            } else {
                OpCode::Continuation
            };
            out.push_frame(i == last, 0, opcode, fragment);
            if i == 0 && last > 0 && m.ping_inside {
                out.push_frame(true, 0, OpCode::Ping, b"inside");
                expected.push(Seen::Ping(b"inside".to_vec()));
            }
        }
        expected.push(m.seen());
    }
    expected.push(Seen::Close(1000, "bye".to_owned()));
    let pool = Arc::new(BufferPool::with_classes(&[(4096, 1)]));
    let mut session = Session::new(rapidws_core::proto::Role::Server, Limits::default(), pool);
    assert!(session.close(CloseCode::NORMAL, "bye", &mut out));
    let mut bytes = Vec::new();
    out.move_into(&mut bytes);
    (bytes, expected)
}

/// A socket for tungstenite that yields the wire in the given chunks.
struct ChunkedSocket {
    chunks: VecDeque<Vec<u8>>,
}

impl Read for ChunkedSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(chunk) = self.chunks.front_mut() else {
            return Ok(0);
        };
        let n = buf.len().min(chunk.len());
        buf[..n].copy_from_slice(&chunk[..n]);
        chunk.drain(..n);
        if chunk.is_empty() {
            self.chunks.pop_front();
        }
        Ok(n)
    }
}

impl Write for ChunkedSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tungstenite_reads(wire: &[u8], sizes: &[usize]) -> Vec<Seen> {
    let socket = ChunkedSocket {
        chunks: chunks(wire, sizes),
    };
    let mut client = tungstenite::WebSocket::from_raw_socket(socket, Role::Client, None);
    let mut seen = Vec::new();
    loop {
        match client.read().expect("tungstenite reads rapidws's frames") {
            tungstenite::Message::Text(t) => seen.push(Seen::Text(t.as_str().to_owned())),
            tungstenite::Message::Binary(b) => seen.push(Seen::Binary(b.to_vec())),
            tungstenite::Message::Ping(p) => seen.push(Seen::Ping(p.to_vec())),
            tungstenite::Message::Close(Some(frame)) => {
                seen.push(Seen::Close(
                    frame.code.into(),
                    frame.reason.as_str().to_owned(),
                ));
                return seen;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A client that reads compressed server frames: unmasked, RSV1 on the first
/// frame of a compressed message, inflated with the server's context rule.
fn inflating_client_reads(wire: &[u8], sizes: &[usize], server_keeps_context: bool) -> Vec<Seen> {
    let rules = DecodeRules {
        expect_masked: false,
        allowed_rsv: RSV1,
    };
    let mut inflater = Inflater::new(server_keeps_context);
    let mut buffer = Vec::new();
    let mut seen = Vec::new();
    for chunk in chunks(wire, sizes) {
        buffer.extend_from_slice(&chunk);
        while let Some((header, len)) = decode_header(&buffer, rules).expect("a valid frame") {
            let end = len + header.payload_len as usize;
            if buffer.len() < end {
                break;
            }
            let payload = &buffer[len..end];
            assert!(header.fin, "rapidws sends compressed messages whole");
            let mut plain = BytesMut::new();
            let body = if header.rsv & RSV1 != 0 {
                inflater.feed(payload, &mut plain, 1 << 24).unwrap();
                inflater.finish(&mut plain, 1 << 24).unwrap();
                &plain[..]
            } else {
                payload
            };
            seen.push(match header.opcode {
                OpCode::Text => Seen::Text(String::from_utf8(body.to_vec()).unwrap()),
                OpCode::Binary => Seen::Binary(body.to_vec()),
                OpCode::Close => Seen::Close(
                    u16::from_be_bytes([body[0], body[1]]),
                    String::from_utf8(body[2..].to_vec()).unwrap(),
                ),
                other => panic!("unexpected {other:?}"),
            });
            buffer.drain(..end);
        }
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn client_to_server(
        messages in prop::collection::vec(message(), 1..8),
        compression in compression(),
        key in any::<[u8; 4]>(),
        sizes in chunk_sizes(),
    ) {
        let mut agreed = compression.agree();
        let params = agreed.as_ref().map(|(p, _)| *p);
        let (wire, expected) = client_wire(&messages, agreed.as_mut().map(|(_, c)| c), key);
        prop_assert_eq!(server_reads(&wire, &sizes, params.as_ref()), expected);
    }

    #[test]
    fn server_to_client(
        messages in prop::collection::vec(message(), 1..8),
        compression in compression(),
        sizes in chunk_sizes(),
    ) {
        let mut agreed = compression.agree();
        let keep = !agreed.as_ref().is_some_and(|(p, _)| p.server_no_context_takeover);
        let compressed = agreed.is_some();
        let (wire, expected) = server_wire(&messages, agreed.as_mut().map(|(_, c)| c));
        let seen = if compressed {
            inflating_client_reads(&wire, &sizes, keep)
        } else {
            tungstenite_reads(&wire, &sizes)
        };
        prop_assert_eq!(seen, expected);
    }
}
