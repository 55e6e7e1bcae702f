//! The per-connection protocol state machine, from the end of the handshake on.
//!
//! [`Session::poll_event`] takes the connection's read buffer and returns the
//! next [`Event`], writing any automatic replies (pongs, the close reply, the close
//! frame that fails the connection) into a [`WriteQueue`]. It never touches a
//! socket or a clock, so every driver runs the same code and
//! the fuzzer can drive it without either.
//!
//! Both ends of a connection use it; the [`Role`] decides only which frames
//! are refused (a server fails unmasked frames, a client masked ones) and
//! which side's context-takeover rule its inflater follows. Replies are
//! masked, or not, by the queue they are written into, which must be one for
//! the same role ([`WriteQueue::with_role`]).
//!
//! How bytes flow:
//! - An unfragmented data frame stays in the read buffer until it is complete; it
//!   is unmasked in place (if the peer is a client) as its bytes arrive and
//!   handed to the caller as a borrowed slice (zero copy). The bytes are dropped from the buffer lazily, at
//!   the start of the next call, because the event borrows them.
//! - Frames of a fragmented message are unmasked and appended to an assembly
//!   buffer taken from the pool, then dropped from the read buffer at once, so a
//!   large fragmented message never makes the read buffer grow.
//! - Text is checked incrementally as bytes arrive, so invalid UTF-8 fails the
//!   connection (1007) as soon as it is seen, even in the middle of a frame.
//! - Limits are checked on each frame header, before any payload is buffered.
//! - A compressed message (permessage-deflate, RSV1 on its first frame) takes
//!   the fragmented path even when it is one frame: its payload is inflated
//!   into the assembly buffer as it arrives, bounded by the message size limit,
//!   and its text is checked as it is inflated.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::close::{self, CloseCode, MAX_CLOSE_REASON};
use super::deflate::{DeflateParams, InflateFailure, Inflater};
use super::frame::{DecodeRules, FrameHeader, MAX_CONTROL_PAYLOAD, OpCode, RSV1, decode_header};
use super::mask::apply_mask;
use super::message::Message;
use super::role::Role;
use super::utf8::{self, Utf8Validator};
use super::write_queue::WriteQueue;
use crate::pool::BufferPool;

/// Size limits for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest frame payload accepted, in bytes.
    pub max_frame_size: usize,
    /// The largest message accepted, in bytes, summed over its fragments.
    pub max_message_size: usize,
}

impl Default for Limits {
    /// 16 MiB for both.
    fn default() -> Self {
        Limits {
            max_frame_size: 16 << 20,
            max_message_size: 16 << 20,
        }
    }
}

/// Something that happened on the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A complete message, borrowed from the read or assembly buffer.
    Message(Message<'a>),
    /// The peer pinged; the pong is already queued.
    Ping(&'a [u8]),
    /// The peer sent a pong (solicited or not).
    Pong(&'a [u8]),
    /// The peer's close frame arrived: the close handshake is complete (our reply,
    /// if one was due, is queued, or held: see [`Session::hold_closes`]). `code`
    /// is [`CloseCode::NO_STATUS`] when the frame had no code. Nothing more is
    /// read after this.
    Closed {
        /// The peer's close code (1005 if it gave none).
        code: CloseCode,
        /// The peer's close reason.
        reason: &'a str,
    },
}

/// The peer broke the protocol or a limit. The close frame with `code` and
/// `reason` has been queued; the connection is over once it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    /// The close code to send.
    pub code: CloseCode,
    /// The close reason to send with it.
    pub reason: &'static str,
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.reason, self.code)
    }
}

impl std::error::Error for ProtocolError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    /// We sent a close frame and wait for the peer's; what the peer sent
    /// before it saw ours is still read and delivered.
    CloseSent,
    /// The close handshake is complete, or the connection failed.
    Closed,
}

/// The frame currently being received; its header has been decoded.
#[derive(Debug)]
struct Frame {
    /// Its payload length is read through [`Frame::payload_len`] (not
    /// kept twice: every connection carries this struct).
    header: FrameHeader,
    /// Header bytes still at the front of the read buffer (0 once dropped).
    header_len: usize,
    /// Payload bytes already unmasked and checked.
    done: usize,
    /// How many of those are still in the read buffer, after the header.
    kept: usize,
}

impl Frame {
    /// The payload's length: checked against the frame limit (a `usize`)
    /// before the frame was taken on, so it fits.
    fn payload_len(&self) -> usize {
        self.header.payload_len as usize
    }
}

/// A message being assembled in the assembly buffer: fragmented, compressed,
/// or both.
#[derive(Clone, Copy, Debug)]
struct Fragmented {
    text: bool,
    /// Payload bytes announced so far, over all its frame headers (compressed
    /// bytes, for a compressed message).
    len: usize,
    /// RSV1 was set on its first frame: the payload is inflated as it arrives.
    compressed: bool,
}

enum Step {
    NeedMore,
    /// A frame was handled with nothing to report; go on.
    Skip,
    Ready(Ready),
}

/// An event, described by positions so that no borrow is held while deciding.
enum Ready {
    Message {
        text: bool,
        source: Source,
    },
    Ping(Range<usize>),
    Pong(Range<usize>),
    Closed {
        code: CloseCode,
        reason: Range<usize>,
    },
}

enum Source {
    Input(Range<usize>),
    Assembly,
}

/// A close frame held back (see [`Session::hold_closes`]), with its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// A protocol failure `poll_event` found.
    Failure(CloseCode),
    /// The reply to the peer's close frame.
    Reply(CloseCode),
}

/// One end of one WebSocket connection, server or client.
///
/// Its output is [`poll_event`](Session::poll_event), as the crate's other
/// sans-I/O machines name theirs; its input is the peer's bytes, in the
/// read buffer that call takes. It reads no clock: timeouts are the
/// driver's.
///
/// # Call order
///
/// 1. after reading from the transport into the read buffer,
///    [`poll_event`](Session::poll_event) with it until `Ok(None)` or an
///    error, done with each event before the next call (it borrows the
///    buffer);
/// 2. write out the replies it queued in `out` (pongs, the close reply,
///    a failure's close frame), and whatever the application queued;
/// 3. to end: [`close`](Session::close) starts the close handshake (keep
///    reading until [`is_closed`](Session::is_closed)),
///    [`fail`](Session::fail) ends with a close frame, and
///    [`abandon`](Session::abandon) without one, the connection being gone.
pub struct Session {
    limits: Limits,
    rules: DecodeRules,
    state: State,
    frame: Option<Frame>,
    fragmented: Option<Fragmented>,
    utf8: Utf8Validator,
    /// Read-buffer bytes to drop at the next call (the last event borrowed them).
    consume: usize,
    /// Give `assembly` back to the pool at the next call.
    release_assembly: bool,
    /// The peer's close frame arrived (whoever sent the first one).
    peer_closed: bool,
    /// The close frames `poll_event` would queue on its own are held, not sent at
    /// once (see [`Session::hold_closes`]).
    hold_closes: bool,
    /// A close frame held and not queued yet.
    held: Option<Held>,
    assembly: BytesMut,
    pool: Arc<BufferPool>,
    /// Present when permessage-deflate was negotiated. Inline, not boxed: it
    /// is 16 bytes, and a box of its own per connection cost more in heap
    /// fragmentation than its size (measured on idle connections).
    inflater: Option<Inflater>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("state", &self.state)
            .field("frame", &self.frame)
            .field("fragmented", &self.fragmented)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session for `role` with the given limits; fragmented messages are
    /// assembled in buffers from `pool`. Its replies go into the queue passed
    /// to each call, which must be a queue for the same role.
    pub fn new(role: Role, limits: Limits, pool: Arc<BufferPool>) -> Self {
        Session {
            limits,
            rules: role.decode_rules(),
            state: State::Open,
            frame: None,
            fragmented: None,
            utf8: Utf8Validator::new(),
            consume: 0,
            release_assembly: false,
            peer_closed: false,
            hold_closes: false,
            held: None,
            assembly: BytesMut::new(),
            pool,
            inflater: None,
        }
    }

    /// A session for `role` that accepts messages compressed with the
    /// permessage-deflate parameters `deflate` (RSV1 marks them), inflating
    /// with the window kept between messages when the peer keeps its
    /// context; without parameters, the same as [`Session::new`].
    pub fn with_deflate(
        role: Role,
        limits: Limits,
        pool: Arc<BufferPool>,
        deflate: Option<&DeflateParams>,
    ) -> Self {
        let mut session = Session::new(role, limits, pool);
        if let Some(params) = deflate {
            session.accept_compressed(params);
        }
        session
    }

    /// Accepts messages marked with RSV1 and inflates them.
    #[cfg(feature = "deflate")]
    fn accept_compressed(&mut self, params: &DeflateParams) {
        self.rules.allowed_rsv |= RSV1;
        self.inflater = Some(Inflater::new(params.receive_keeps_context(self.role())));
    }

    /// Without the `deflate` feature there is no inflater: the parameters are
    /// ignored, and a compressed frame fails with 1002 as if none had been
    /// agreed (a server built so never agrees any).
    #[cfg(not(feature = "deflate"))]
    fn accept_compressed(&mut self, _: &DeflateParams) {}

    /// The end of the connection this session plays (read back from the
    /// frames it expects, so it costs no field).
    pub fn role(&self) -> Role {
        if self.rules.expect_masked {
            Role::Server
        } else {
            Role::Client
        }
    }

    /// Returns the next event found in `input`, or `Ok(None)` when `input` holds
    /// no complete event (it then holds only the start of a frame, or nothing).
    ///
    /// The input buffer is passed to each call rather than kept by the
    /// session because the event borrows it: a message's payload is a slice
    /// of it (zero copy). Pass the same buffer every time, appending new
    /// bytes at its end: the session remembers how far it got in it. Bytes
    /// the previous event borrowed are dropped from `input` first. Replies
    /// owed to the peer are appended to `out`. On error the connection has
    /// failed: the close frame is in `out` and every later call returns
    /// `Ok(None)`.
    pub fn poll_event<'s>(
        &'s mut self,
        input: &'s mut BytesMut,
        out: &mut WriteQueue,
    ) -> Result<Option<Event<'s>>, ProtocolError> {
        debug_assert_eq!(out.role(), self.role(), "replies need a queue of our role");
        let ready = loop {
            match self.step(input, out)? {
                Step::NeedMore => {
                    self.settle(input);
                    return Ok(None);
                }
                Step::Skip => continue,
                Step::Ready(ready) => break ready,
            }
        };
        let event = match ready {
            Ready::Ping(r) => Event::Ping(&input[r]),
            Ready::Pong(r) => Event::Pong(&input[r]),
            Ready::Closed { code, reason } => Event::Closed {
                code,
                // Checked when the close frame was parsed.
                reason: utf8::validate(&input[reason]).unwrap_or_default(),
            },
            Ready::Message { text, source } => {
                let bytes: &'s [u8] = match source {
                    Source::Input(r) => &input[r],
                    Source::Assembly => &self.assembly[..],
                };
                if !text {
                    Event::Message(Message::Binary(bytes))
                } else {
                    match utf8::validate(bytes) {
                        Ok(text) => Event::Message(Message::Text(text)),
                        Err(_) => {
                            // Only the fields the borrow of `assembly` leaves free.
                            self.state = State::Closed;
                            self.frame = None;
                            self.fragmented = None;
                            if self.hold_closes {
                                self.held = Some(Held::Failure(CloseCode::INVALID_PAYLOAD));
                            } else {
                                write_close(out, CloseCode::INVALID_PAYLOAD, INVALID_TEXT);
                            }
                            return Err(ProtocolError {
                                code: CloseCode::INVALID_PAYLOAD,
                                reason: INVALID_TEXT,
                            });
                        }
                    }
                }
            }
        };
        Ok(Some(event))
    }

    /// Whether `input` holds bytes beyond those the previous event borrowed
    /// (which the next [`Session::poll_event`] drops first): whether reading on
    /// could find anything.
    pub fn has_unread(&self, input: &BytesMut) -> bool {
        input.len() > self.consume
    }

    /// Starts the close handshake: queues a close frame. Returns `false` (and
    /// queues nothing) if a close was already sent or the connection is over.
    ///
    /// Messages that arrive until the peer's close are still delivered, under
    /// the same limits: the peer sent them before it saw our close, and its
    /// TCP stack acknowledged them, so its application counts them as
    /// delivered (RFC 6455 §1.4 forbids sending data after a close, not
    /// receiving it). Pings are no longer answered.
    ///
    /// A code that may not be sent (see [`CloseCode::is_sendable`]) is replaced by
    /// 1000; a reason longer than 123 bytes is cut at a character boundary.
    pub fn close(&mut self, code: CloseCode, reason: &str, out: &mut WriteQueue) -> bool {
        debug_assert_eq!(out.role(), self.role(), "a close needs a queue of our role");
        if self.state != State::Open {
            return false;
        }
        let code = if code.is_sendable() {
            code
        } else {
            CloseCode::NORMAL
        };
        write_close(out, code, close::truncate_reason(reason));
        self.state = State::CloseSent;
        true
    }

    /// Fails the connection: queues a close frame with `code` (unless one was
    /// already sent) and ends the session. Used by drivers, e.g. with 1011 when a
    /// handler panics.
    pub fn fail(
        &mut self,
        code: CloseCode,
        reason: &'static str,
        out: &mut WriteQueue,
    ) -> ProtocolError {
        // A held failure is overtaken: this one's close goes out instead.
        if self.state == State::Open || self.held.take().is_some() {
            write_close(out, code, close::truncate_reason(reason));
        }
        self.end_reading();
        ProtocolError { code, reason }
    }

    /// A failure found by `poll_event`: answered with its close frame at once, or
    /// held (see [`Session::hold_closes`]).
    fn fail_read(
        &mut self,
        code: CloseCode,
        reason: &'static str,
        out: &mut WriteQueue,
    ) -> ProtocolError {
        if self.hold_closes && self.state == State::Open {
            self.held = Some(Held::Failure(code));
            self.end_reading();
            return ProtocolError { code, reason };
        }
        self.fail(code, reason, out)
    }

    /// From now on, the close frames [`Session::poll_event`] would queue on its own
    /// are held instead ([`Session::held_close`]) until
    /// [`Session::release_close`]: a protocol failure's (reading ends as
    /// usual), and the reply to the peer's close frame. For a caller whose
    /// application has not yet handled every message that arrived before
    /// them: its replies to those messages go out first, as a peer that
    /// pipelines requests expects (RFC 6455 §5.5.1 lets an endpoint send its
    /// close reply after the message it is sending). Failures the caller
    /// starts ([`Session::fail`]) are never held.
    pub fn hold_closes(&mut self) {
        self.hold_closes = true;
    }

    /// The code of the close frame held and not queued yet: a failure's, or
    /// the reply to the peer's close (its own code, 1000 for a close without
    /// one).
    pub fn held_close(&self) -> Option<CloseCode> {
        self.held.map(|held| match held {
            Held::Failure(code) | Held::Reply(code) => code,
        })
    }

    /// Queues the held close frame with its own code: a failure's with
    /// `reason`, a reply with none (the peer's close is answered, not
    /// explained). Returns false, queueing nothing, if none is held.
    pub fn release_close(&mut self, reason: &str, out: &mut WriteQueue) -> bool {
        match self.held.take() {
            Some(Held::Failure(code)) => {
                write_close(out, code, close::truncate_reason(reason));
                true
            }
            Some(Held::Reply(code)) => {
                write_close(out, code, "");
                true
            }
            None => false,
        }
    }

    /// Ends the session without sending anything, because the connection is
    /// already gone (TCP closed, or the close handshake timed out).
    pub fn abandon(&mut self) {
        self.held = None;
        self.end_reading();
    }

    /// Nothing more will be read: drops the message in progress and the
    /// buffers and inflate state it held.
    fn end_reading(&mut self) {
        self.state = State::Closed;
        self.frame = None;
        self.fragmented = None;
        self.release_assembly = true;
        if let Some(inflater) = &mut self.inflater {
            inflater.release();
        }
    }

    /// True until a close frame has been sent or received.
    pub fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// True once we sent a close frame and still wait for the peer's.
    pub fn is_closing(&self) -> bool {
        self.state == State::CloseSent
    }

    /// True once the close handshake is complete or the connection failed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// True once the peer's close frame has arrived: with ours written too, the
    /// close handshake is complete and nothing more may come from the peer.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// How many bytes, counted from the start of the read buffer, the frame in
    /// progress will occupy once complete: a hint for sizing the read buffer. It
    /// is 0 between frames and for fragments of a fragmented message, which are
    /// moved out of the read buffer as they arrive. The length comes from the
    /// peer: grow towards it as data arrives rather than reserving it up front.
    pub fn bytes_wanted(&self) -> usize {
        match &self.frame {
            Some(f) if self.fragmented.is_none() || f.header.opcode.is_control() => {
                f.header_len + f.kept + (f.payload_len() - f.done)
            }
            _ => 0,
        }
    }

    /// Drops what the previous event borrowed and releases a delivered assembly.
    /// (The caller must pass the same buffer again; a shorter one is only cleared,
    /// never a reason to panic.)
    fn settle(&mut self, input: &mut BytesMut) {
        if self.consume > 0 {
            input.advance(self.consume.min(input.len()));
            self.consume = 0;
        }
        if self.release_assembly {
            self.release_assembly = false;
            let buf = std::mem::take(&mut self.assembly);
            if buf.capacity() > 0 {
                self.pool.give(buf);
            }
        }
    }

    fn step(&mut self, input: &mut BytesMut, out: &mut WriteQueue) -> Result<Step, ProtocolError> {
        self.settle(input);
        if self.state == State::Closed {
            // Nothing after the close frame (or a failure) is read.
            input.clear();
            return Ok(Step::NeedMore);
        }
        if self.frame.is_none() {
            match decode_header(input, self.rules) {
                Ok(None) => return Ok(Step::NeedMore),
                Ok(Some((header, header_len))) => self.start_frame(header, header_len, out)?,
                Err(e) => return Err(self.fail_read(e.close_code(), e.reason(), out)),
            }
        }
        let Some(frame) = self.frame.as_mut() else {
            return Ok(Step::NeedMore);
        };

        let start = frame.header_len + frame.kept;
        let avail = (input.len() - start).min(frame.payload_len() - frame.done);
        let opcode = frame.header.opcode;
        let fin = frame.header.fin;

        if opcode.is_control() {
            if avail < frame.payload_len() {
                return Ok(Step::NeedMore);
            }
            let payload = frame.header_len..frame.header_len + frame.payload_len();
            if let Some(key) = frame.header.mask {
                apply_mask(&mut input[payload.clone()], key, 0);
            }
            self.consume = payload.end;
            self.frame = None;
            return self.control(opcode, payload, input, out);
        }

        if let Some(key) = frame.header.mask {
            apply_mask(&mut input[start..start + avail], key, frame.done);
        }

        if let Some(fragmented) = self.fragmented {
            // Part of an assembled message: check, append (inflated, if it is
            // compressed), drop from the input.
            let piece = &input[start..start + avail];
            let before = self.assembly.len();
            if fragmented.compressed {
                let limit = self.limits.max_message_size;
                let inflated = match self.inflater.as_mut() {
                    Some(inflater) => inflater.feed(piece, &mut self.assembly, limit),
                    // RSV1 passes the decoder only when deflate was negotiated.
                    None => Err(InflateFailure::Invalid),
                };
                if let Err(failure) = inflated {
                    return Err(self.fail_inflate(failure, out));
                }
            } else {
                self.assembly.extend_from_slice(piece);
            }
            if fragmented.text && self.utf8.feed(&self.assembly[before..]).is_err() {
                return Err(self.fail_read(CloseCode::INVALID_PAYLOAD, INVALID_TEXT, out));
            }
            input.advance(start + avail);
            frame.header_len = 0;
            frame.done += avail;
            if frame.done < frame.payload_len() {
                return Ok(Step::NeedMore);
            }
            self.frame = None;
            if !fin {
                return Ok(Step::Skip);
            }
            self.fragmented = None;
            if fragmented.compressed {
                let before = self.assembly.len();
                let limit = self.limits.max_message_size;
                let inflated = match self.inflater.as_mut() {
                    Some(inflater) => inflater.finish(&mut self.assembly, limit),
                    None => Err(InflateFailure::Invalid),
                };
                if let Err(failure) = inflated {
                    return Err(self.fail_inflate(failure, out));
                }
                if fragmented.text && self.utf8.feed(&self.assembly[before..]).is_err() {
                    return Err(self.fail_read(CloseCode::INVALID_PAYLOAD, INVALID_TEXT, out));
                }
            }
            if fragmented.text && self.utf8.finish().is_err() {
                return Err(self.fail_read(CloseCode::INVALID_PAYLOAD, INVALID_TEXT, out));
            }
            self.release_assembly = true;
            return Ok(Step::Ready(Ready::Message {
                text: fragmented.text,
                source: Source::Assembly,
            }));
        }

        // An unfragmented message: it stays in the input until complete.
        let text = opcode == OpCode::Text;
        if avail < frame.payload_len() - frame.done {
            if text && self.utf8.feed(&input[start..start + avail]).is_err() {
                return Err(self.fail_read(CloseCode::INVALID_PAYLOAD, INVALID_TEXT, out));
            }
            frame.kept += avail;
            frame.done += avail;
            return Ok(Step::NeedMore);
        }
        let payload = frame.header_len..frame.header_len + frame.payload_len();
        self.consume = payload.end;
        self.frame = None;
        // A text frame that arrived whole is validated once, when `poll_event` turns it
        // into a `&str`.
        Ok(Step::Ready(Ready::Message {
            text,
            source: Source::Input(payload),
        }))
    }

    /// Checks a new frame header against the message sequence and the limits,
    /// before any of its payload is buffered.
    fn start_frame(
        &mut self,
        header: FrameHeader,
        header_len: usize,
        out: &mut WriteQueue,
    ) -> Result<(), ProtocolError> {
        // Control frames were limited to 125 bytes by the decoder, and RSV1
        // to connections that negotiated permessage-deflate.
        let len = header.payload_len;
        let compressed = header.rsv & RSV1 != 0;
        if compressed && (header.opcode.is_control() || header.opcode == OpCode::Continuation) {
            return Err(self.fail_read(
                CloseCode::PROTOCOL_ERROR,
                "RSV1 set on a control or continuation frame",
                out,
            ));
        }
        if !header.opcode.is_control() {
            if len > self.limits.max_frame_size as u64 {
                return Err(self.fail_read(CloseCode::MESSAGE_TOO_BIG, FRAME_TOO_BIG, out));
            }
            let len = len as usize;
            let max_message = self.limits.max_message_size;
            match (header.opcode, self.fragmented.as_mut()) {
                (OpCode::Continuation, None) => {
                    return Err(self.fail_read(
                        CloseCode::PROTOCOL_ERROR,
                        "continuation frame without a message to continue",
                        out,
                    ));
                }
                (OpCode::Continuation, Some(fragmented)) => {
                    let max_message = wire_limit(max_message, fragmented.compressed);
                    if len > max_message - fragmented.len {
                        return Err(self.fail_read(
                            CloseCode::MESSAGE_TOO_BIG,
                            MESSAGE_TOO_BIG,
                            out,
                        ));
                    }
                    fragmented.len += len;
                }
                (_, Some(_)) => {
                    return Err(self.fail_read(
                        CloseCode::PROTOCOL_ERROR,
                        "new data frame inside a fragmented message",
                        out,
                    ));
                }
                (opcode, None) => {
                    if len > wire_limit(max_message, compressed) {
                        return Err(self.fail_read(
                            CloseCode::MESSAGE_TOO_BIG,
                            MESSAGE_TOO_BIG,
                            out,
                        ));
                    }
                    self.utf8 = Utf8Validator::new();
                    if !header.fin || compressed {
                        self.fragmented = Some(Fragmented {
                            text: opcode == OpCode::Text,
                            len,
                            compressed,
                        });
                        if self.assembly.capacity() == 0 {
                            // The announced length is the peer's word: start
                            // small and grow with the bytes that really arrive.
                            self.assembly = self.pool.take(len.min(ASSEMBLY_START));
                        }
                    }
                }
            }
        }
        debug_assert!(!header.opcode.is_control() || len <= MAX_CONTROL_PAYLOAD as u64);
        self.frame = Some(Frame {
            header,
            header_len,
            done: 0,
            kept: 0,
        });
        Ok(())
    }

    /// Handles a complete control frame whose payload is `input[payload]`.
    fn control(
        &mut self,
        opcode: OpCode,
        payload: Range<usize>,
        input: &[u8],
        out: &mut WriteQueue,
    ) -> Result<Step, ProtocolError> {
        match opcode {
            OpCode::Ping => {
                if self.state == State::Open {
                    out.push_pong(&input[payload.clone()]);
                }
                Ok(Step::Ready(Ready::Ping(payload)))
            }
            OpCode::Pong => Ok(Step::Ready(Ready::Pong(payload))),
            _ => {
                let (code, reason) = match close::parse_close_payload(&input[payload.clone()]) {
                    Err(bad) => return Err(self.fail_read(bad.close_code(), bad.reason(), out)),
                    Ok(Some((code, _))) => (code, payload.start + 2..payload.end),
                    Ok(None) => (CloseCode::NO_STATUS, payload.end..payload.end),
                };
                if self.state == State::Open {
                    // Echo the peer's code, as RFC 6455 §5.5.1 suggests; a close
                    // without a code is answered with a normal closure.
                    let reply = if code == CloseCode::NO_STATUS {
                        CloseCode::NORMAL
                    } else {
                        code
                    };
                    if self.hold_closes {
                        self.held = Some(Held::Reply(reply));
                    } else {
                        write_close(out, reply, "");
                    }
                }
                self.end_reading();
                self.peer_closed = true;
                Ok(Step::Ready(Ready::Closed { code, reason }))
            }
        }
    }
}

impl Session {
    fn fail_inflate(&mut self, failure: InflateFailure, out: &mut WriteQueue) -> ProtocolError {
        match failure {
            InflateFailure::TooBig => {
                self.fail_read(CloseCode::MESSAGE_TOO_BIG, MESSAGE_TOO_BIG, out)
            }
            InflateFailure::Invalid => {
                self.fail_read(CloseCode::INVALID_PAYLOAD, INVALID_DEFLATE, out)
            }
        }
    }
}

/// The most payload bytes a message may put on the wire. A compressed message
/// is limited by its inflated size as it is inflated; on the wire it may be a
/// little larger than that (deflate adds 5 bytes per stored block of up to
/// 64 KiB when data does not compress), so its frames get that much slack.
fn wire_limit(max_message: usize, compressed: bool) -> usize {
    if compressed {
        max_message.saturating_add(max_message / 1024 + 64)
    } else {
        max_message
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.assembly);
        if buf.capacity() > 0 {
            self.pool.give(buf);
        }
    }
}

/// The most an assembly buffer starts with, whatever the first fragment claims.
const ASSEMBLY_START: usize = 64 * 1024;

const INVALID_TEXT: &str = "text is not valid UTF-8";
const FRAME_TOO_BIG: &str = "frame exceeds the maximum frame size";
const MESSAGE_TOO_BIG: &str = "message exceeds the maximum message size";
/// Invalid compressed data fails with 1007, as data "not consistent with the
/// type of the message" (RFC 6455 §7.4.1), the code most servers use for it.
const INVALID_DEFLATE: &str = "invalid compressed data";

fn write_close(out: &mut WriteQueue, code: CloseCode, reason: &str) {
    let mut payload = [0u8; 2 + MAX_CLOSE_REASON];
    let reason = close::truncate_reason(reason);
    payload[..2].copy_from_slice(&code.0.to_be_bytes());
    payload[2..2 + reason.len()].copy_from_slice(reason.as_bytes());
    out.push_frame(true, 0, OpCode::Close, &payload[..2 + reason.len()]);
}

mod snapshot;
pub use snapshot::{SessionSnapshot, Unmovable};
#[cfg(test)]
mod tests;
