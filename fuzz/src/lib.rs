//! What the fuzz targets check, shared by them (one file per target in
//! `fuzz_targets/` only picks the function).
//!
//! Each function takes raw fuzzer bytes and panics (so libFuzzer reports a
//! crash) when rapidws breaks an invariant: not only on its own panics, but
//! when output is malformed, unbounded, or a close code falls outside the
//! set the input can justify.

use std::sync::Arc;

use bytes::BytesMut;
use rapidws::DeflateConfig;
use rapidws_core::handshake::negotiate;
use rapidws_core::handshake::{
    self, ClientHandshakeError, ClientRequest, accept_key, parse_extensions,
};
use rapidws_core::pool::BufferPool;
use rapidws_core::proto::apply_mask;
use rapidws_core::proto::deflate::{Compressor, DeflateParams, InflateFailure, Inflater};
use rapidws_core::proto::frame::{DecodeRules, MAX_HEADER_LEN, RSV1, decode_header, encode_header};
use rapidws_core::proto::parse_close_payload;
use rapidws_core::proto::{Event, Limits, Message, OpCode, Role, Session, WriteQueue};

/// Small limits, so that the 1009 paths are within a fuzzer's reach.
pub const LIMITS: Limits = Limits {
    max_frame_size: 4096,
    max_message_size: 16 * 1024,
};

/// A tiny deterministic generator for chunk sizes: the fuzzer picks the seed,
/// so a crash replays exactly.
pub struct Chunker(u32);

impl Chunker {
    pub fn new(seed: u8) -> Self {
        Chunker(u32::from(seed).wrapping_mul(2_654_435_761) | 1)
    }

    /// The next chunk length, 1..=max.
    pub fn next(&mut self, max: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        1 + (self.0 as usize % max.max(1))
    }

    /// Splits `data` into chunks of up to 600 bytes, with a generator of
    /// its own (this one's sequence goes on unchanged).
    pub fn clone_split<'a>(&mut self, data: &'a [u8]) -> Vec<&'a [u8]> {
        Chunker(self.0.rotate_left(7) | 1).split(data, 600)
    }

    /// Splits `data` into chunks of up to `max` bytes.
    pub fn split<'a>(&mut self, mut data: &'a [u8], max: usize) -> Vec<&'a [u8]> {
        let mut chunks = Vec::new();
        while !data.is_empty() {
            let n = self.next(max).min(data.len());
            chunks.push(&data[..n]);
            data = &data[n..];
        }
        chunks
    }
}

/// Every queued byte, in order.
pub fn drain(queue: &mut WriteQueue) -> Vec<u8> {
    let mut bytes = Vec::new();
    queue.move_into(&mut bytes);
    bytes
}

// ---------------------------------------------------------------- frames

/// `decode_header` on arbitrary bytes, as a server and as a client: a header
/// it accepts re-encodes to the same bytes (if it used the shortest length
/// form) and every prefix of it is reported as incomplete, never as another
/// header.
pub fn frame_header(data: &[u8]) {
    for rules in [
        DecodeRules::SERVER,
        DecodeRules::CLIENT,
        DecodeRules {
            expect_masked: true,
            allowed_rsv: RSV1,
        },
    ] {
        let Ok(Some((header, len))) = decode_header(data, rules) else {
            continue;
        };
        assert!(len <= data.len() && len <= MAX_HEADER_LEN);
        assert_eq!(header.mask.is_some(), rules.expect_masked);
        assert_eq!(header.rsv & !rules.allowed_rsv, 0);
        if header.opcode.is_control() {
            assert!(header.fin && header.payload_len <= 125);
        }
        let mut encoded = [0u8; MAX_HEADER_LEN];
        let n = encode_header(
            &mut encoded,
            header.fin,
            header.rsv,
            header.opcode,
            header.payload_len,
            header.mask,
        );
        assert!(n <= len);
        if n == len {
            assert_eq!(&encoded[..n], &data[..len], "{header:?}");
        }
        for cut in 0..len {
            assert!(
                !matches!(decode_header(&data[..cut], rules), Ok(Some(_))),
                "a prefix of {len} bytes decoded as a header"
            );
        }
    }
}

// ---------------------------------------------------------------- handshake

/// `parse_request` on arbitrary bytes. An accepted request has a valid key,
/// every accessor works, a prefix of its head is incomplete, and the `101`
/// written for it (with whatever permessage-deflate negotiation makes of its
/// offers) is a well-formed HTTP response. A refused one maps to a status
/// whose error response is well-formed too.
pub fn handshake_request(data: &[u8]) {
    const MAX_HEAD: usize = 8 * 1024;
    let mut headers = handshake::header_buffer();
    match handshake::parse_request(data, &mut headers, MAX_HEAD) {
        Ok(None) => assert!(data.len() < MAX_HEAD),
        Ok(Some((request, head_len))) => {
            assert!(head_len <= data.len() && head_len <= MAX_HEAD);
            assert_eq!(request.method(), "GET");
            assert_eq!(request.key().len(), 24);
            let _ = (request.path(), request.query(), request.header_str("host"));
            let _ = request.headers().count();
            let protocol = request.protocols().next();
            for (config, _) in deflate_configs() {
                let params = negotiate(request.extension_offers(), &config);
                let mut out = WriteQueue::new();
                handshake::write_accept(&mut out, request.key(), protocol, params.as_ref());
                let response = drain(&mut out);
                assert_eq!(parse_response(&response), 101);
            }
            let mut again = handshake::header_buffer();
            assert!(matches!(
                handshake::parse_request(&data[..head_len - 1], &mut again, MAX_HEAD),
                Ok(None)
            ));
        }
        Err(error) => {
            let status = error.status();
            assert!([400, 405, 408, 426, 431].contains(&status), "{error:?}");
            let mut out = WriteQueue::new();
            handshake::write_error(&mut out, status, error.reason());
            assert_eq!(parse_response(&drain(&mut out)), status);
        }
    }
}

/// The status of a complete HTTP response that is nothing but its head and
/// its `Content-Length` body.
fn parse_response(bytes: &[u8]) -> u16 {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut response = httparse::Response::new(&mut headers);
    let status = response.parse(bytes).expect("a well-formed response");
    let httparse::Status::Complete(head_len) = status else {
        panic!(
            "an incomplete response: {:?}",
            String::from_utf8_lossy(bytes)
        );
    };
    let body = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map_or(0, |h| {
            std::str::from_utf8(h.value).unwrap().parse().unwrap()
        });
    assert_eq!(head_len + body, bytes.len());
    response.code.unwrap()
}

/// Server settings to negotiate with, each with its window size.
fn deflate_configs() -> [(DeflateConfig, u8); 3] {
    [
        (DeflateConfig::default(), 15),
        (
            DeflateConfig::default()
                .server_context_takeover(true)
                .client_context_takeover(true),
            15,
        ),
        (DeflateConfig::default().server_max_window_bits(9), 9),
    ]
}

// ---------------------------------------------------------------- extensions

/// `parse_extensions` and `negotiate` on an arbitrary header value. Names
/// and parameter values that parse are tokens; a negotiated result is within
/// the RFC's bounds and the response line written for it parses as exactly
/// one permessage-deflate extension.
pub fn extensions(data: &[u8]) {
    if let Ok(value) = std::str::from_utf8(data) {
        for offer in parse_extensions(value) {
            let Ok(offer) = offer else { break };
            assert!(is_token(offer.name), "{:?}", offer.name);
            for param in offer.params() {
                assert!(is_token(param.name), "{:?}", param.name);
                if let Some(v) = &param.value {
                    assert!(is_token(v), "{v:?}");
                }
            }
        }
    }
    // The same bytes as one header, and split at line feeds over several.
    let split: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    for (config, bits) in deflate_configs() {
        for values in [vec![data], split.clone()] {
            let Some(params) = negotiate(values, &config) else {
                continue;
            };
            assert!((9..=15).contains(&params.server_max_window_bits));
            assert!(params.server_max_window_bits <= bits);
            let mut out = WriteQueue::new();
            handshake::write_accept(&mut out, b"dGhlIHNhbXBsZSBub25jZQ==", None, Some(&params));
            let response = drain(&mut out);
            let text = std::str::from_utf8(&response).unwrap();
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Extensions: "))
                .expect("an extensions line");
            let offers: Vec<_> = parse_extensions(line).collect();
            assert_eq!(offers.len(), 1, "{line}");
            assert_eq!(offers[0].unwrap().name, "permessage-deflate");
        }
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

// ---------------------------------------------------------------- session

/// Whether and how the session under test negotiated permessage-deflate.
#[derive(Clone, Copy, Debug)]
pub enum Compression {
    Off,
    /// The client starts every message afresh.
    NoContext,
    /// The client keeps its window from message to message.
    Context,
}

impl Compression {
    fn params(self) -> Option<DeflateParams> {
        let (offer, config): (&[u8], _) = match self {
            Compression::Off => return None,
            Compression::NoContext => (b"permessage-deflate", DeflateConfig::default()),
            Compression::Context => (
                b"permessage-deflate",
                DeflateConfig::default().client_context_takeover(true),
            ),
        };
        Some(negotiate([offer], &config).expect("a plain offer is accepted"))
    }
}

/// A whole server session fed arbitrary bytes in chunks (sizes from the first
/// byte). Checked: no panic; every event is within the limits; an error's
/// close code is 1002, 1007 or 1009; a closed session reports nothing more;
/// the bytes kept from the input stay bounded by one frame; and what the
/// session writes back is a valid server frame stream, no larger than the
/// input plus one close frame, ending with at most one close frame.
pub fn session(data: &[u8], compression: Compression) {
    run_session(data, Role::Server, compression.params());
}

/// The same as [`session`] for a client session: the input is what a server
/// would send (unmasked frames; a masked one fails with 1002), and what it
/// writes back must be masked client frames. The first byte also picks
/// whether deflate was agreed, and whether the server keeps its window.
pub fn client_session(data: &[u8]) {
    let Some(&seed) = data.first() else {
        return;
    };
    let params = match seed % 3 {
        0 => None,
        1 => Some(DeflateParams::new(true, true)),
        _ => Some(DeflateParams::new(false, true)),
    };
    run_session(data, Role::Client, params);
}

fn run_session(data: &[u8], role: Role, params: Option<DeflateParams>) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let pool = Arc::new(BufferPool::with_classes(&[(4096, 4), (16 * 1024, 4)]));
    let mut session = Session::with_deflate(role, LIMITS, pool, params.as_ref());
    let mut input = BytesMut::new();
    let mut out = WriteQueue::with_role(role);
    let mut fed = 0;
    let mut failure = None;
    let mut ended = false;
    let mut chunker = Chunker::new(seed);
    let max_chunk = if seed & 0x80 != 0 { 7 } else { 512 };
    for chunk in chunker.split(stream, max_chunk) {
        input.extend_from_slice(chunk);
        fed += chunk.len();
        loop {
            match session.poll_event(&mut input, &mut out) {
                Ok(None) => break,
                Ok(Some(event)) => {
                    assert!(!ended, "an event after the session ended: {event:?}");
                    match event {
                        Event::Message(message) => {
                            let len = match message {
                                Message::Text(t) => t.len(),
                                Message::Binary(b) => b.len(),
                            };
                            assert!(len <= LIMITS.max_message_size);
                        }
                        Event::Ping(p) | Event::Pong(p) => assert!(p.len() <= 125),
                        Event::Closed { code, reason } => {
                            assert!(reason.len() <= 123);
                            assert!(code.0 == 1005 || code.is_sendable(), "{code:?}");
                            ended = true;
                        }
                    }
                }
                Err(error) => {
                    assert!(!ended, "an error after the session ended: {error:?}");
                    assert!(
                        [1002, 1007, 1009].contains(&error.code.0),
                        "unexpected close code {error}"
                    );
                    failure = Some(error.code.0);
                    ended = true;
                }
            }
        }
        if !ended {
            // A whole frame is kept at most, plus what this chunk brought.
            assert!(
                input.len() <= MAX_HEADER_LEN + LIMITS.max_frame_size + chunk.len(),
                "the read buffer holds {} bytes",
                input.len()
            );
        } else {
            assert!(session.is_closed() || session.peer_closed());
        }
    }
    let written = drain(&mut out);
    // A server's replies are no larger than what they answer, plus one close
    // frame. A client's carry a 4-byte key each: a pong answers a ping of at
    // least 2 bytes, so at most twice the input, plus a masked close frame.
    let bound = match role {
        Role::Server => fed + 4 + 123,
        Role::Client => 2 * fed + 2 + 4 + 125,
    };
    assert!(
        written.len() <= bound,
        "{} bytes written for {fed} read",
        written.len()
    );
    check_replies(&written, role, failure);
}

/// The session's output parses as `role`'s frames (a client's masked, a
/// server's not): pongs and at most one close frame, which comes last and
/// carries `failure` if the session failed. (The session alone never sends
/// data frames.)
fn check_replies(mut bytes: &[u8], role: Role, failure: Option<u16>) {
    // Decoded as the peer receives them, which insists on the masking.
    let rules = match role {
        Role::Server => DecodeRules::CLIENT,
        Role::Client => DecodeRules::SERVER,
    };
    let mut closed = false;
    while !bytes.is_empty() {
        assert!(!closed, "bytes after the close frame");
        let (header, len) = decode_header(bytes, rules)
            .unwrap_or_else(|e| panic!("a valid {role:?} frame: {e}"))
            .expect("a whole frame header");
        let end = len + header.payload_len as usize;
        let mut payload = bytes[len..end].to_vec();
        if let Some(key) = header.mask {
            apply_mask(&mut payload, key, 0);
        }
        match header.opcode {
            OpCode::Pong => {}
            OpCode::Close => {
                let parsed = parse_close_payload(&payload).expect("a valid close payload");
                if let Some(expected) = failure {
                    assert_eq!(parsed.map(|(code, _)| code.0), Some(expected));
                }
                closed = true;
            }
            other => panic!("the session wrote a {other:?} frame"),
        }
        bytes = &bytes[end..];
    }
    if failure.is_some() {
        assert!(closed, "failed without a close frame");
    }
}

// ---------------------------------------------------------------- session handoff

/// A session's events, owned, to compare two readings of one stream.
#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Message(bool, Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Closed(u16, String),
    Failed(u16),
}

/// Reads what `input` holds (and stops at the end or the first failure),
/// appending the events to `events`; false once the session has ended.
fn read_all(
    session: &mut Session,
    input: &mut BytesMut,
    out: &mut WriteQueue,
    events: &mut Vec<Owned>,
) -> bool {
    loop {
        match session.poll_event(input, out) {
            Ok(None) => return true,
            Ok(Some(event)) => events.push(match event {
                Event::Message(Message::Text(t)) => Owned::Message(true, t.as_bytes().to_vec()),
                Event::Message(Message::Binary(b)) => Owned::Message(false, b.to_vec()),
                Event::Ping(p) => Owned::Ping(p.to_vec()),
                Event::Pong(p) => Owned::Pong(p.to_vec()),
                Event::Closed { code, reason } => {
                    events.push(Owned::Closed(code.0, reason.to_owned()));
                    return false;
                }
            }),
            Err(error) => {
                events.push(Owned::Failed(error.code.0));
                return false;
            }
        }
    }
}

/// The handoff of a session to another process, differentially: the first
/// byte picks the chunking and where the stream is cut; a server session
/// reads up to the cut, is snapshotted, encoded, decoded and restored, and
/// the restored one reads the rest. Its events and replies, after the first
/// one's, must be exactly those of one session reading the whole stream (a
/// session that could not move must say why, and only for a reason its
/// stream gives). Then the same bytes are taken as a snapshot themselves:
/// decoding and restoring them must never panic, and a restored session
/// reads on under its limits.
pub fn session_handoff(data: &[u8]) {
    use rapidws_core::proto::{SessionSnapshot, Unmovable};
    use rapidws_core::snapshot::{SnapshotReader, SnapshotWriter};
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let pool = || Arc::new(BufferPool::with_classes(&[(4096, 4), (16 * 1024, 4)]));
    let cut = if stream.is_empty() {
        0
    } else {
        usize::from(seed) * stream.len() / 255
    };
    // The reference: one session, the whole stream.
    let mut whole = Session::new(Role::Server, LIMITS, pool());
    let (mut input, mut out, mut expected) = (BytesMut::new(), WriteQueue::new(), Vec::new());
    let mut chunker = Chunker::new(seed);
    for chunk in chunker.split(stream, 97) {
        input.extend_from_slice(chunk);
        if !read_all(&mut whole, &mut input, &mut out, &mut expected) {
            break;
        }
    }
    let expected_replies = drain(&mut out);

    // The first process, to the cut.
    let mut first = Session::new(Role::Server, LIMITS, pool());
    let (mut input, mut out, mut events) = (BytesMut::new(), WriteQueue::new(), Vec::new());
    let mut replies = Vec::new();
    let mut open = true;
    let mut chunker = Chunker::new(seed.rotate_left(3));
    for chunk in chunker.split(&stream[..cut], 61) {
        input.extend_from_slice(chunk);
        open = read_all(&mut first, &mut input, &mut out, &mut events);
        if !open {
            break;
        }
    }
    if open {
        match first.snapshot(&mut input) {
            Ok(snapshot) => {
                let mut writer = SnapshotWriter::new();
                snapshot.encode(&mut writer);
                let bytes = writer.finish();
                let mut reader = SnapshotReader::new(&bytes);
                let decoded = SessionSnapshot::decode(&mut reader).expect("our own snapshot");
                reader.finish().expect("read whole");
                assert_eq!(decoded, snapshot);
                let mut second = Session::restore(&decoded, LIMITS, pool()).expect("restores");
                let mut out2 = WriteQueue::new();
                let mut rest = input.split();
                rest.extend_from_slice(&stream[cut..]);
                read_all(&mut second, &mut rest, &mut out2, &mut events);
                replies.extend(drain(&mut out));
                replies.extend(drain(&mut out2));
            }
            // A server session without deflate closes, or holds a failure,
            // only after its stream said so: the reference saw it too.
            Err(Unmovable::Closing | Unmovable::HeldClose) => {
                panic!("an open session without held failures refused to move")
            }
            Err(other) => panic!("a session without deflate refused to move: {other}"),
        }
    }
    replies.extend(drain(&mut out));
    assert_eq!(events, expected, "events across the handoff");
    assert_eq!(replies, expected_replies, "replies across the handoff");

    // The bytes as a snapshot of their own.
    let mut reader = SnapshotReader::new(stream);
    if let Ok(snapshot) = SessionSnapshot::decode(&mut reader)
        && let Ok(mut session) = Session::restore(&snapshot, LIMITS, pool())
    {
        let mut input = BytesMut::from(reader.rest());
        let mut out = WriteQueue::with_role(session.role());
        let mut events = Vec::new();
        read_all(&mut session, &mut input, &mut out, &mut events);
        for event in &events {
            if let Owned::Message(_, bytes) = event {
                assert!(bytes.len() <= snapshot.limits().max_message_size);
            }
        }
    }
}

// ---------------------------------------------------------------- client handshake

/// The accept value of the RFC 6455 §1.3 example. Seeds carry it where the
/// `Sec-WebSocket-Accept` goes; [`client_handshake`] replaces it with the
/// value for the key its request really used (random, so the fuzzer could
/// never guess it), at the same length.
pub const SEED_ACCEPT: &[u8; 28] = b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// The protocols every fuzzed request offers.
const OFFERED_PROTOCOLS: [&str; 2] = ["chat", "superchat"];

/// The response parser and checker on arbitrary bytes: the first byte picks
/// the request (deflate offered or not, and with which settings), the rest
/// is the server's response. Checked: no panic; incomplete only below the
/// head limit; accepted only with status 101, exactly one
/// `Sec-WebSocket-Accept` equal to the key's, a head that ends where
/// `httparse` says and whose every prefix is incomplete, an offered
/// protocol, and deflate parameters within what was offered; `NotSwitching`
/// only for another status; `parse_response` then `check` agreeing with
/// `read_response`.
pub fn client_handshake(data: &[u8]) {
    const MAX_HEAD: usize = 4096;
    let Some((&selector, response)) = data.split_first() else {
        return;
    };
    let offer = client_offers()[usize::from(selector) % 4];
    let mut request = ClientRequest::new("example.com", "/fuzz").protocols(&OFFERED_PROTOCOLS);
    if let Some(offer) = offer {
        request = request.permessage_deflate(offer.config);
    }
    let mut out = WriteQueue::new();
    let client = request.write(&mut out).expect("a valid request");
    let accept = accept_key(client.key());
    let mut response = response.to_vec();
    replace_all(&mut response, SEED_ACCEPT, &accept);

    let result = client.read_response(&response, MAX_HEAD);
    let mut headers = handshake::header_buffer();
    let parsed = handshake::parse_response(&response, &mut headers, MAX_HEAD);
    match (&result, &parsed) {
        (Ok(None), Ok(None)) => assert!(response.len() < MAX_HEAD),
        (_, Ok(Some((parsed, head_len)))) => {
            let checked = client
                .check(parsed)
                .map(|a| Some((*head_len, a.protocol, a.deflate)));
            let read = result.map(|a| a.map(|a| (a.head_len, a.protocol, a.deflate)));
            assert_eq!(read, checked);
            assert!(*head_len <= response.len() && *head_len <= MAX_HEAD);
            if let Err(ClientHandshakeError::NotSwitching { status }) = result {
                assert_eq!(status, parsed.status());
                assert_ne!(status, 101);
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        other => panic!("read_response and parse_response disagree: {other:?}"),
    }
    let Ok(Some(accepted)) = result else {
        return;
    };
    let head_len = accepted.head_len;
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut independent = httparse::Response::new(&mut fields);
    assert_eq!(
        independent.parse(&response),
        Ok(httparse::Status::Complete(head_len))
    );
    assert_eq!(independent.code, Some(101));
    let accepts: Vec<&[u8]> = independent
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept"))
        .map(|h| h.value.trim_ascii())
        .collect();
    assert_eq!(accepts, [&accept[..]]);
    if let Some(protocol) = accepted.protocol {
        assert!(OFFERED_PROTOCOLS.contains(&protocol));
    }
    match (accepted.deflate, offer) {
        (None, _) => {}
        (Some(_), None) => panic!("deflate agreed without an offer"),
        (Some(params), Some(offer)) => {
            // The server may name any window up to the one asked for (8
            // included: the inflater takes any); the client's is one it
            // can write.
            assert!((8..=offer.server_window).contains(&params.server_max_window_bits));
            assert!((9..=offer.client_window).contains(&params.client_max_window_bits));
            if offer.drops_contexts {
                assert!(params.server_no_context_takeover, "asked, so confirmed");
                assert!(params.client_no_context_takeover, "promised, so kept");
            }
        }
    }
    let mut again = handshake::header_buffer();
    assert!(matches!(
        handshake::parse_response(&response[..head_len - 1], &mut again, MAX_HEAD),
        Ok(None)
    ));
}

/// A permessage-deflate offer a fuzzed request makes, and what it asks for.
#[derive(Clone, Copy)]
struct DeflateOffer {
    config: DeflateConfig,
    /// The largest server window the answer may name.
    server_window: u8,
    /// The largest client window the answer may ask for.
    client_window: u8,
    /// Whether it asks for `server_no_context_takeover` and promises
    /// `client_no_context_takeover`.
    drops_contexts: bool,
}

/// The requests the response is checked against: no deflate, or one of
/// these offers.
fn client_offers() -> [Option<DeflateOffer>; 4] {
    let keep = DeflateConfig::default()
        .server_context_takeover(true)
        .client_context_takeover(true);
    let small = DeflateConfig::default()
        .server_max_window_bits(10)
        .client_max_window_bits(12);
    let offer = |config, server_window, client_window, drops_contexts| {
        Some(DeflateOffer {
            config,
            server_window,
            client_window,
            drops_contexts,
        })
    };
    [
        None,
        offer(DeflateConfig::default(), 15, 15, true),
        offer(keep, 15, 15, false),
        offer(small, 10, 12, true),
    ]
}

/// Replaces every occurrence of `from` in `bytes` with `to` (same length).
fn replace_all(bytes: &mut [u8], from: &[u8; 28], to: &[u8; 28]) {
    let mut at = 0;
    while at + from.len() <= bytes.len() {
        if &bytes[at..at + from.len()] == from {
            bytes[at..at + from.len()].copy_from_slice(to);
            at += from.len();
        } else {
            at += 1;
        }
    }
}

// ---------------------------------------------------------------- inflate

/// The inflater on arbitrary input in chunks, under a size cap: it stops
/// with `TooBig` rather than exceed it, and never holds more than one byte
/// past it. Then, as a round trip, the same bytes are compressed as two
/// messages with an empty one between them, and must inflate back to
/// exactly themselves.
pub fn inflate(data: &[u8]) {
    let Some((&seed, payload)) = data.split_first() else {
        return;
    };
    let keep_context = seed & 1 != 0;
    let limit = if seed & 2 != 0 { 1024 } else { 64 * 1024 };
    let mut inflater = Inflater::new(keep_context);
    let mut out = BytesMut::new();
    let mut failed = false;
    for chunk in Chunker::new(seed).split(payload, 300) {
        match inflater.feed(chunk, &mut out, limit) {
            Ok(()) => assert!(out.len() <= limit),
            Err(InflateFailure::TooBig) => {
                assert!(out.len() <= limit + 1);
                failed = true;
                break;
            }
            Err(InflateFailure::Invalid) => {
                failed = true;
                break;
            }
        }
    }
    if failed {
        inflater.release();
    } else if inflater.finish(&mut out, limit).is_ok() {
        assert!(out.len() <= limit);
    }
    round_trip(payload, keep_context);
}

fn round_trip(payload: &[u8], keep_context: bool) {
    let config = DeflateConfig::default()
        .server_context_takeover(keep_context)
        .compress_min_size(0);
    let params = negotiate([&b"permessage-deflate"[..]], &config).unwrap();
    let mut compressor = Compressor::new(Role::Server, &params, &config);
    let mut inflater = Inflater::new(keep_context);
    let (first, second) = payload.split_at(payload.len() / 2);
    // An empty message between the two: right after a sync flush it is the
    // case zlib writes no bytes for (a bug the property tests found).
    for message in [first, b"", second] {
        let mut compressed = BytesMut::new();
        assert!(compressor.compress(message, &mut compressed));
        let mut inflated = BytesMut::new();
        let limit = message.len();
        inflater
            .feed(&compressed, &mut inflated, limit)
            .expect("our own output inflates");
        inflater
            .finish(&mut inflated, limit)
            .expect("our own output ends cleanly");
        assert_eq!(&inflated[..], message);
    }
}

/// The proxy answers' readers (HTTP CONNECT, and SOCKS5's method choice,
/// username/password answer and CONNECT reply) on arbitrary bytes: the
/// first byte picks the reader. Checked: no panic; the same answer twice;
/// "more" only below the reader's bound; "done" with a length within the
/// input, whose every shorter prefix asks for more (or is malformed); a
/// CONNECT refused only for a status outside 2xx, and only once its head is
/// complete.
pub fn proxy_reply(data: &[u8]) {
    use rapidws::client::ProxyError;
    use rapidws::client::proxy::{self, Read};
    let Some((&selector, answer)) = data.split_first() else {
        return;
    };
    let reader: fn(&[u8]) -> Result<Read, ProxyError> = match selector % 5 {
        0 => proxy::read_connect_response,
        1 => |b| proxy::read_socks_method(b, true).map(|m| m.map_or(Read::More, |_| Read::Done(2))),
        2 => {
            |b| proxy::read_socks_method(b, false).map(|m| m.map_or(Read::More, |_| Read::Done(2)))
        }
        3 => proxy::read_socks_auth,
        _ => proxy::read_socks_connect,
    };
    let bound = if selector % 5 == 0 {
        proxy::MAX_CONNECT_HEAD
    } else {
        // The longest SOCKS5 reply: a 255-byte name and a port.
        4 + 1 + 255 + 2
    };
    let result = reader(answer);
    assert_eq!(result, reader(answer), "the same answer twice");
    match result {
        Ok(Read::More) => assert!(answer.len() < bound, "more wanted past the bound"),
        Ok(Read::Done(n)) => {
            assert!(
                n > 0 && n <= answer.len(),
                "done with {n} of {}",
                answer.len()
            );
            for cut in 0..n {
                let prefix = reader(&answer[..cut]);
                assert!(
                    matches!(prefix, Ok(Read::More) | Err(ProxyError::Malformed(_))),
                    "a prefix of {cut} bytes: {prefix:?}"
                );
            }
        }
        Err(ProxyError::Refused { status }) => {
            assert!(selector % 5 == 0 && !(200..300).contains(&status));
            // Refused only once the head is complete: one byte less of the
            // shortest refused prefix asks for more.
            let refused =
                |k: usize| matches!(reader(&answer[..k]), Err(ProxyError::Refused { .. }));
            let first = (1..=answer.len()).find(|&k| refused(k)).unwrap();
            let before = reader(&answer[..first - 1]);
            assert_eq!(before, Ok(Read::More), "refused at {first} bytes");
        }
        Err(_) => {}
    }
}

/// `PubSub::take_over` on any bytes: what a successor reads from its
/// predecessor over the handoff socket (a bus's topics). Checked: no panic
/// and no runaway allocation whatever the bytes; what it took, it hands on
/// in a form another bus takes again, with the same latest positions.
pub fn pubsub_handoff(data: &[u8]) {
    use rapidws::pubsub::{History, PubSub};
    let bus = || {
        PubSub::builder()
            .history(History::new(16, std::time::Duration::from_secs(60)))
            .build()
    };
    let first = bus();
    if first.take_over(data).is_err() {
        return;
    }
    let again = first.hand_off();
    let second = bus();
    let taken = second.take_over(&again);
    assert!(taken.is_ok(), "its own hand-off refused: {taken:?}");
    assert_eq!(
        second.hand_off().len(),
        again.len(),
        "the same topics, kept the same"
    );
}

/// A message from Redis as the pub/sub bridge reads it (`r<epoch><offset>:`
/// in front, then the node's message: version, node, count, time, kind,
/// key, payload, with or without a MAC): reading never panics, an offset
/// is never past the bound, and what reads is the one encoding of itself
/// (encoded again, and sealed from an unsealed copy, it is the same bytes).
pub fn redis_wire(data: &[u8]) {
    use rapidws::pubsub::redis::{MAX_OFFSET, decode, encode, recorded, seal, unsealed};
    let Some((&selector, data)) = data.split_first() else {
        return;
    };
    let secret = (selector & 1 == 1).then_some(&b"a secret the nodes share"[..]);
    let channel = "rapidws:t";
    let message = match recorded(data) {
        Some((position, inner)) => {
            assert!(position.offset < MAX_OFFSET, "{position:?}");
            assert!(inner.len() < data.len());
            inner
        }
        None => data,
    };
    let Some(decoded) = decode(message, channel, secret) else {
        return;
    };
    let content = (decoded.key, decoded.opcode, decoded.payload);
    assert_eq!(encode(decoded.stamp, content, channel, secret), message);
    let mut sealed = unsealed(decoded.stamp.node, content);
    let stamp = (decoded.stamp.count, decoded.stamp.time);
    seal(&mut sealed, stamp, channel, secret);
    assert_eq!(sealed, message, "sealed as encoded");
}

/// An smux frame header (rapidws-core's `mux::frame`): decoding never
/// panics, encodes back to the same eight bytes, and what `check` accepts
/// obeys smux's rules for every version and payload limit.
pub fn mux_frame(data: &[u8]) {
    use rapidws_core::mux::frame::{Command, Header, UPD_LEN};
    let Some(header) = Header::decode(data) else {
        assert!(data.len() < 8);
        return;
    };
    assert_eq!(header.encode()[..], data[..8]);
    let limit = data.get(8).map_or(u16::MAX, |&b| u16::from(b) << 8 | 0xff);
    for version in [1, 2] {
        match header.check(version, limit) {
            Ok(command) => {
                assert_eq!(header.version, version);
                assert_eq!(command.byte(), header.command);
                let length = usize::from(header.length);
                match command {
                    Command::Syn | Command::Fin | Command::Nop => assert_eq!(length, 0),
                    Command::Upd => assert!(version == 2 && length == UPD_LEN),
                    Command::Psh => assert!(header.length <= limit),
                }
            }
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
}

/// A whole smux session (rapidws-core's `mux::Mux`) fed the fuzzer's bytes
/// as its peer's, in chunks, with an application that accepts, reads,
/// echoes, opens, finishes and closes streams as a chunker says, and time
/// moving on: nothing panics; the streams, the unread bytes and what is
/// owed stay within their bounds; every stream the peer opens has the
/// peer's parity; what the session holds is what its budget counts (a
/// small one, shed past it); every frame sent is whole and one an smux
/// receiver accepts; a failed session sends nothing and reads nothing.
///
/// The first byte: bit 0 version 2, bit 1 the accepting side, bit 2 the
/// version left to the peer, bits 3-7 the budget (1 to 32 × 2 KiB); the
/// whole byte seeds the chunker.
pub fn mux_session(data: &[u8]) {
    use bytes::Bytes;
    use rapidws_core::mux::frame::{Command, Header};
    use rapidws_core::mux::{Budget, Config, INITIAL_WINDOW, Mux, MuxError, Read, Side, Version};
    use std::time::{Duration, Instant};

    let Some((&first, wire)) = data.split_first() else {
        return;
    };
    let version = if first & 1 == 0 {
        Version::V1
    } else {
        Version::V2
    };
    let config = Config {
        version: (first & 4 == 0).then_some(version),
        max_frame_size: 300,
        max_receive_frame: 2000,
        max_streams: 8,
        receive_buffer: 4096,
        send_buffer: 1024,
        budget: Budget::new((usize::from(first >> 3) + 1) * 2048),
        ..Config::default()
    };
    let side = if first & 2 == 0 {
        Side::Dialer
    } else {
        Side::Acceptor
    };
    let start = Instant::now();
    let mut now = start;
    let mut mux = Mux::new(side, config.clone(), now);
    let mut chunker = Chunker::new(first);
    let mut input = BytesMut::new();
    let mut open: Vec<u32> = Vec::new();
    let mut buf = [0u8; 700];
    for chunk in chunker.clone_split(wire) {
        input.extend_from_slice(chunk);
        now += Duration::from_millis(chunker.next(4000) as u64);
        let failed = mux.handle_input(&mut input, now).is_err() | mux.handle_timeout(now).is_err();
        // Bounds.
        assert!(mux.streams() <= config.max_streams);
        match mux.version() {
            Some(Version::V1) => {
                assert!(
                    mux.buffered() <= config.receive_buffer + usize::from(config.max_receive_frame)
                )
            }
            _ => assert!(mux.buffered() <= mux.streams() * INITIAL_WINDOW as usize),
        }
        // The application.
        while let Some(id) = mux.accept() {
            assert_eq!(id % 2 == 1, side == Side::Acceptor, "the peer's parity");
            open.push(id);
        }
        assert_eq!(config.budget.used(), mux.held());
        if let Some(MuxError::Budget { .. }) = mux.error() {
            assert_eq!(mux.held(), 0, "a shed session lets go of everything");
        }
        while mux.poll_event().is_some() {}
        if chunker.next(4) == 1
            && let Ok(id) = mux.open()
        {
            open.push(id);
        }
        open.retain(|&id| {
            let want = chunker.next(buf.len());
            // Copied out, or taken as it is; echoed either way.
            let read = if chunker.next(2) == 1 {
                mux.read_bytes(id, want)
            } else {
                mux.read(id, &mut buf[..want])
                    .map(|read| read.map(|n| Bytes::copy_from_slice(&buf[..n])))
            };
            match read {
                Ok(Read::Data(mut bytes)) => {
                    let _ = if chunker.next(2) == 1 {
                        mux.write_bytes(id, &mut bytes)
                    } else {
                        mux.write(id, &bytes)
                    };
                    true
                }
                Ok(Read::End) => {
                    let _ = mux.finish(id);
                    if chunker.next(2) == 1 {
                        mux.close(id);
                        false
                    } else {
                        true
                    }
                }
                Ok(Read::Empty) => {
                    if chunker.next(16) == 1 {
                        mux.close(id);
                        false
                    } else {
                        true
                    }
                }
                Err(_) => {
                    mux.close(id);
                    false
                }
            }
        });
        // What it sends: whole frames an smux receiver accepts.
        let mut out = BytesMut::new();
        let limit = chunker.next(3000);
        mux.poll_transmit(&mut out, limit);
        assert!(out.len() < limit + 8 + usize::from(config.max_frame_size) + 8 + 8);
        if failed || mux.is_failed() {
            assert!(out.is_empty() && !mux.wants_input() && !mux.has_output());
            assert!(mux.open().is_err());
            return;
        }
        let mut rest = &out[..];
        while !rest.is_empty() {
            let header = Header::decode(rest).expect("whole frames");
            let spoken = mux
                .version()
                .expect("nothing is sent before the version")
                .byte();
            let command = header
                .check(spoken, config.max_frame_size)
                .expect("a frame smux accepts");
            if command == Command::Nop {
                assert_eq!(header.stream, 0);
            } else {
                assert_ne!(header.stream, 0);
            }
            rest = &rest[8 + usize::from(header.length)..];
        }
    }
}

/// HTTP/3's own parsing (rapidws-core's `h3`): the fuzzer's bytes after
/// the first as a stream of frames. A HEADERS payload is decoded by QPACK
/// under a size limit the first byte picks, checked as a request head and
/// as a WebSocket upgrade and a WebTransport session; a SETTINGS payload
/// decoded; a DATA payload read as WebTransport's capsules, a frame of
/// type 0x30 as a datagram (its session prefix). Nothing panics, a
/// decoded section stays within the limit and survives being encoded and
/// decoded again, and settings decoded encode to the same settings.
pub fn h3_request(data: &[u8]) {
    use rapidws_core::h3::frame::kind;
    use rapidws_core::h3::{FrameHead, RequestHead, Settings, qpack, webtransport};

    let Some((&first, mut wire)) = data.split_first() else {
        return;
    };
    let limit = usize::from(first) * 64 + 64;
    while let Some(head) = FrameHead::decode(wire) {
        let rest = &wire[head.len..];
        let Some(payload) = usize::try_from(head.length)
            .ok()
            .and_then(|n| rest.get(..n))
        else {
            return;
        };
        wire = &rest[payload.len()..];
        match head.kind {
            kind::HEADERS => {
                let Ok(section) = qpack::decode(payload, limit) else {
                    continue;
                };
                assert!(section.size() <= limit);
                let mut again = Vec::new();
                qpack::encode(section.iter(), &mut again);
                assert_eq!(qpack::decode(&again, limit).as_ref(), Ok(&section));
                if let Ok(request) = RequestHead::parse(section) {
                    if request.webtransport().is_some() {
                        assert_eq!(request.method(), "CONNECT");
                    }
                    let headers = request.headers();
                    if let Ok(upgrade) = request.websocket(&headers) {
                        assert_eq!(request.method(), "CONNECT");
                        assert!(
                            request
                                .path()
                                .is_some_and(|p| p.starts_with(upgrade.path()))
                        );
                    }
                }
            }
            kind::SETTINGS => {
                if let Ok(settings) = Settings::decode(payload) {
                    let mut out = Vec::new();
                    settings.encode(&mut out);
                    let head = FrameHead::decode(&out).expect("a whole frame");
                    assert_eq!(Settings::decode(&out[head.len..]), Ok(settings));
                }
            }
            // A WebTransport session's stream: capsules in DATA.
            kind::DATA => capsules(payload),
            // A datagram: its session prefix.
            0x30 => {
                if let Some((session, _)) = webtransport::datagram_session(payload) {
                    assert_eq!(session % 4, 0);
                    // Encoded again (minimally: the input may not be), it
                    // names the same session.
                    let mut again = Vec::new();
                    webtransport::put_datagram_prefix(session, &mut again);
                    assert_eq!(
                        webtransport::datagram_session(&again),
                        Some((session, again.len()))
                    );
                }
            }
            _ => {}
        }
    }
}

/// WebTransport's capsules one after another: a `WT_CLOSE_SESSION`
/// decoded is encoded to the same code and reason.
fn capsules(mut payload: &[u8]) {
    use rapidws_core::h3::webtransport::{self, capsule};
    while let Some((kind, length, len)) = webtransport::capsule_head(payload) {
        let rest = &payload[len..];
        let Some(body) = usize::try_from(length).ok().and_then(|n| rest.get(..n)) else {
            return;
        };
        payload = &rest[body.len()..];
        if kind == capsule::CLOSE_SESSION
            && let Ok((code, reason)) = webtransport::decode_close(body)
        {
            assert!(reason.len() <= webtransport::MAX_CLOSE_REASON);
            let mut again = Vec::new();
            webtransport::put_close(code, reason, &mut again);
            let (_, _, head) = webtransport::capsule_head(&again).expect("a whole capsule");
            assert_eq!(
                webtransport::decode_close(&again[head..]),
                Ok((code, reason))
            );
        }
    }
}

/// The PROXY protocol's header (versions 1 and 2): the same answer twice;
/// `Partial` only below the version's bound; a header taken whole is never
/// longer than its input or its bound, reads the same with anything after
/// it, and every shorter prefix of it is `Partial`; a refusal stands
/// whatever comes after it.
pub fn proxy_header(data: &[u8]) {
    use rapidws_core::sniff::proxy::{MAX_V1, MAX_V2, Parsed, V1_PREFIX, parse};
    let result = parse(data);
    assert_eq!(result, parse(data), "the same answer twice");
    let bound = if data.starts_with(V1_PREFIX) {
        MAX_V1
    } else {
        MAX_V2
    };
    let mut more = data.to_vec();
    more.extend_from_slice(b"\r\n\0more");
    match result {
        Ok(Parsed::Partial) => assert!(data.len() < bound, "more wanted past the bound"),
        Ok(Parsed::Complete(proxied, taken)) => {
            assert!(
                taken <= data.len() && taken <= bound,
                "took {taken} of {}",
                data.len()
            );
            assert_eq!(parse(&more), Ok(Parsed::Complete(proxied, taken)));
            for n in [0, taken / 2, taken.saturating_sub(1)] {
                if n < taken {
                    assert_eq!(parse(&data[..n]), Ok(Parsed::Partial), "prefix of {n}");
                }
            }
        }
        Err(error) => {
            assert!(!error.reason().is_empty());
            assert!(parse(&more).is_err(), "a refusal undone by what followed");
        }
    }
}

/// A TLS ClientHello read without terminating TLS: the same answer twice;
/// `Partial` only within the bound of bytes walked; a hello read whole
/// reads the same with records after it; a refusal stands whatever
/// follows.
pub fn tls_hello(data: &[u8]) {
    use rapidws_core::sniff::hello::{MAX_INPUT, Read, read};
    let result = read(data);
    assert_eq!(result, read(data), "the same answer twice");
    let mut more = data.to_vec();
    more.extend_from_slice(&[22, 3, 3, 0, 1, 1]);
    match result {
        Ok(Read::Partial) => assert!(
            data.len() <= MAX_INPUT + 5 + (1 << 14),
            "more wanted past the bound"
        ),
        Ok(Read::Complete(hello)) => {
            assert_eq!(read(&more), Ok(Read::Complete(hello.clone())));
            assert!(hello.alpn.iter().all(|p| !p.is_empty()));
        }
        Err(error) => {
            assert!(!error.reason().is_empty());
            assert!(read(&more).is_err(), "a refusal undone by what followed");
        }
    }
}

/// Forwarding headers from a trusted proxy: the same answer twice; from an
/// untrusted peer nothing is read; a refusal says why. The input is header lines: a first
/// byte picks each line's name, a newline ends it. (Read from the right,
/// a chain stops at its first untrusted hop: the unit tests show which.)
pub fn forwarded(data: &[u8]) {
    use rapidws_core::handshake::{ForwardedError, forwarded};
    use std::net::IpAddr;
    let names = [
        "Forwarded",
        "X-Forwarded-For",
        "X-Forwarded-Proto",
        "X-Forwarded-Host",
    ];
    let headers: Vec<(&str, &[u8])> = data
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split_first())
        .map(|(&pick, value)| (names[usize::from(pick) % names.len()], value))
        .collect();
    let trusted = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 10 || v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback(),
    };
    let proxy: IpAddr = "127.0.0.1".parse().unwrap();
    let read = forwarded(proxy, headers.iter().copied(), trusted);
    assert_eq!(
        read,
        forwarded(proxy, headers.iter().copied(), trusted),
        "the same answer twice"
    );
    let stranger: IpAddr = "192.0.2.1".parse().unwrap();
    assert_eq!(
        forwarded(stranger, headers.iter().copied(), trusted),
        Ok(None)
    );
    if let Err(error) = read {
        assert!(matches!(
            error,
            ForwardedError::Malformed | ForwardedError::TooManyHops
        ));
        assert!(!error.reason().is_empty());
    }
}
