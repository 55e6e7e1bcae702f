//! `deflate`: closed-loop echo with permessage-deflate (RFC 7692) negotiated.
//!
//! The client offers `permessage-deflate; client_no_context_takeover`, so it
//! may compress its message once and send the same bytes every time. Replies
//! are inflated by one inflater per connection, which reads the server's
//! messages whether or not the server keeps its context between them, and
//! each one is compared with what was sent. A server that declines the offer
//! fails the run: an uncompressed echo would measure something else.

use std::io;
use std::rc::Rc;

use bytes::{Buf, BytesMut};
use clap::Args;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use serde_json::json;

use crate::echo::{LoopArgs, run_loops};
use crate::{emit, wire};

/// What the client offers.
pub const OFFER: &str = "permessage-deflate; client_no_context_takeover";

/// The error of a connection whose server declined [`OFFER`].
pub const DECLINED: &str = "the server did not accept permessage-deflate";

/// The tail every compressed message ends with before the sender strips it.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

#[derive(Args, Debug, Clone)]
pub struct DeflateArgs {
    #[command(flatten)]
    pub shape: LoopArgs,
}

const RSV1: u8 = 0x40;

pub async fn run(args: DeflateArgs) -> io::Result<()> {
    let shape = &args.shape;
    let target = shape.target.target();
    let sources = shape.target.sources();
    let payload = Rc::new(json_like(shape.size));
    let compressed = compress(&payload);
    let mut negotiated = String::new();
    let mut connections = Vec::with_capacity(shape.conns);
    for i in 0..shape.conns {
        let (stream, buf, head) = wire::open_with(&target, sources.nth(i), OFFER).await?;
        negotiated = accepted_extension(&head).ok_or_else(|| io::Error::other(DECLINED))?;
        connections.push((stream, buf));
    }
    let frame = |mask| {
        let mut frame = wire::masked_frame(wire::TEXT, &compressed, mask);
        frame[0] |= RSV1;
        frame
    };
    let replies = || {
        let (mut reader, payload) = (MessageReader::default(), payload.clone());
        move |buf: &mut BytesMut| {
            let mut count = 0;
            while let Some(message) = reader.next(buf)? {
                if message != payload.as_slice() {
                    return Err(io::Error::other("reply differs from the message sent"));
                }
                count += 1;
            }
            Ok(count)
        }
    };
    let mut result = run_loops("deflate", shape, connections, frame, replies).await;
    result["compressed_size"] = json!(compressed.len());
    result["extension"] = json!(negotiated);
    emit(&result);
    Ok(())
}

/// Text that compresses like real JSON messages do (about 3:1), not like a
/// repeated letter: records with varying numbers from a fixed generator.
pub fn json_like(size: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(size + 64);
    let mut seed: u32 = 0x2545_f491;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    while text.len() < size {
        let record = format!(
            "{{\"id\":{},\"price\":{}.{:02},\"qty\":{},\"side\":\"{}\"}},",
            next() % 100_000,
            next() % 5_000,
            next() % 100,
            next() % 1_000,
            if next() % 2 == 0 { "buy" } else { "sell" }
        );
        text.extend_from_slice(record.as_bytes());
    }
    text.truncate(size);
    text
}

/// One message compressed on its own (no context taken over), with the
/// trailing `00 00 ff ff` removed as RFC 7692 §7.2.1 says.
pub fn compress(payload: &[u8]) -> Vec<u8> {
    let mut deflate = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(payload.len() + 64);
    loop {
        let consumed = deflate.total_in() as usize;
        deflate
            .compress_vec(&payload[consumed..], &mut out, FlushCompress::Sync)
            .expect("deflate of an in-memory buffer");
        if deflate.total_in() as usize == payload.len() && out.ends_with(&TAIL) {
            break;
        }
        out.reserve(out.capacity().max(64));
    }
    out.truncate(out.len() - TAIL.len());
    out
}

/// The `Sec-WebSocket-Extensions` value of a `101` head, if it accepted
/// permessage-deflate.
pub fn accepted_extension(head: &str) -> Option<String> {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("sec-websocket-extensions"))
        .map(|(_, value)| value.trim())
        .find(|value| {
            value
                .split(';')
                .next()
                .is_some_and(|name| name.trim().eq_ignore_ascii_case("permessage-deflate"))
        })
        .map(str::to_owned)
}

/// Reassembles the server's messages and inflates compressed ones.
pub struct MessageReader {
    inflater: Decompress,
    /// Payload of the message so far (compressed if `compressed`).
    message: Vec<u8>,
    compressed: bool,
    in_message: bool,
    inflated: Vec<u8>,
}

impl Default for MessageReader {
    fn default() -> Self {
        MessageReader {
            inflater: Decompress::new(false),
            message: Vec::new(),
            compressed: false,
            in_message: false,
            inflated: Vec::new(),
        }
    }
}

impl MessageReader {
    /// The next whole data message in `buf`, inflated; control frames are
    /// skipped (a close is an error: the server should not end the run).
    pub fn next(&mut self, buf: &mut BytesMut) -> io::Result<Option<&[u8]>> {
        loop {
            let Some((head, header_len, len)) = frame_header(buf)? else {
                return Ok(None);
            };
            let Ok(len) = usize::try_from(len) else {
                return Err(io::Error::other("frame too long"));
            };
            if buf.len() < header_len + len {
                buf.reserve(header_len + len - buf.len());
                return Ok(None);
            }
            let (fin, rsv1, opcode) = (head & 0x80 != 0, head & RSV1 != 0, head & 0x0f);
            buf.advance(header_len);
            let payload = buf.split_to(len);
            match opcode {
                wire::CLOSE => return Err(io::Error::other("server sent a close frame")),
                wire::PING | wire::PONG => continue,
                0 if !self.in_message => {
                    return Err(io::Error::other("continuation without a message"));
                }
                0 => {}
                _ => {
                    self.in_message = true;
                    self.compressed = rsv1;
                    self.message.clear();
                }
            }
            self.message.extend_from_slice(&payload);
            if !fin {
                continue;
            }
            self.in_message = false;
            if !self.compressed {
                return Ok(Some(&self.message));
            }
            self.message.extend_from_slice(&TAIL);
            self.inflate()?;
            return Ok(Some(&self.inflated));
        }
    }

    fn inflate(&mut self) -> io::Result<()> {
        self.inflated.clear();
        let start = self.inflater.total_in();
        loop {
            let consumed = (self.inflater.total_in() - start) as usize;
            if consumed == self.message.len() {
                return Ok(());
            }
            self.inflated.reserve(self.message.len() * 4 + 1024);
            let status = self
                .inflater
                .decompress_vec(
                    &self.message[consumed..],
                    &mut self.inflated,
                    FlushDecompress::Sync,
                )
                .map_err(io::Error::other)?;
            if status == Status::StreamEnd {
                // A final block (allowed by RFC 7692 §7.2.3.4): what follows
                // is only our tail, and the next message starts a new stream.
                self.inflater.reset(false);
                return Ok(());
            }
        }
    }
}

/// `(first byte, header length, payload length)` of a server frame, or `None`
/// if the header is incomplete.
fn frame_header(buf: &[u8]) -> io::Result<Option<(u8, usize, u64)>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    if buf[1] & 0x80 != 0 {
        return Err(io::Error::other("masked frame from the server"));
    }
    let (header_len, len) = match buf[1] & 0x7f {
        126 if buf.len() < 4 => return Ok(None),
        126 => (4, u16::from_be_bytes([buf[2], buf[3]]) as u64),
        127 if buf.len() < 10 => return Ok(None),
        127 => (10, u64::from_be_bytes(buf[2..10].try_into().unwrap())),
        len => (2, len as u64),
    };
    Ok(Some((buf[0], header_len, len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::server_frame as frame;

    #[test]
    fn json_like_text_compresses_about_as_json_does() {
        let text = json_like(1024);
        assert_eq!(text.len(), 1024);
        let ratio = text.len() as f64 / compress(&text).len() as f64;
        assert!((1.5..8.0).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn inflates_messages_with_and_without_context_takeover() {
        let one = json_like(1000);
        let two = json_like(300);
        // A server keeping its context: the second message may refer to the first.
        let mut server = Compress::new(Compression::default(), false);
        let mut stream = Vec::new();
        for message in [&one, &two, &one] {
            let mut out = Vec::with_capacity(4096);
            server
                .compress_vec(message, &mut out, FlushCompress::Sync)
                .unwrap();
            assert!(out.ends_with(&TAIL));
            out.truncate(out.len() - 4);
            stream.extend(frame(0x80 | RSV1 | wire::TEXT, &out));
        }
        // One compressed on its own, split over two frames, a ping between.
        let alone = compress(&two);
        let (a, b) = alone.split_at(alone.len() / 2);
        stream.extend(frame(RSV1 | wire::TEXT, a));
        stream.extend(frame(0x80 | wire::PING, b"p"));
        stream.extend(frame(0x80, b));
        // And an uncompressed one.
        stream.extend(frame(0x80 | wire::TEXT, b"plain"));
        let expected: Vec<&[u8]> = vec![&one, &two, &one, &two, b"plain"];
        for chunk in [1, 7, 100, stream.len()] {
            let mut reader = MessageReader::default();
            let (mut buf, mut seen) = (BytesMut::new(), Vec::new());
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(message) = reader.next(&mut buf).unwrap() {
                    seen.push(message.to_vec());
                }
            }
            assert_eq!(seen, expected, "chunk size {chunk}");
        }
    }

    #[test]
    fn reads_the_accepted_extension_from_the_response() {
        let head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                    sec-websocket-extensions: permessage-deflate; client_no_context_takeover\r\n\r\n";
        assert_eq!(
            accepted_extension(head).as_deref(),
            Some("permessage-deflate; client_no_context_takeover")
        );
        assert_eq!(accepted_extension("HTTP/1.1 101 OK\r\n\r\n"), None);
    }
}
