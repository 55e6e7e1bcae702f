//! HTTP/3's own parsing for WebSockets over QUIC (RFC 9220) and
//! WebTransport, sans-I/O: what bytes on a QUIC stream mean, never the
//! QUIC itself (quinn's, in the `rapidws` crate).
//!
//! | file | what |
//! |---|---|
//! | `varint` | QUIC's variable-length integers |
//! | `frame` | frame heads, and the SETTINGS both sides open with |
//! | `qpack` | field sections (headers) with the static table only, Huffman strings |
//! | `request` | a request's head checked as RFC 9114 asks, and the extended CONNECT that opens a WebSocket |
//! | `webtransport` | WebTransport's own bytes: stream signals, capsules, datagram prefixes, stream error codes |
//!
//! Everything here takes whole byte slices a driver has gathered and
//! bounds what it builds by a limit the caller gives; nothing keeps state
//! between calls. A WebSocket's own bytes then travel in DATA frames, and
//! the WebSocket core (`proto`) reads them as it reads TCP.

pub mod frame;
pub mod qpack;
pub mod request;
pub mod varint;
pub mod webtransport;

pub use frame::{FrameHead, Settings};
pub use qpack::{FieldSection, QpackError};
pub use request::RequestHead;

/// HTTP/3's error codes (RFC 9114 section 8.1, RFC 9204 section 6) that
/// this crate sends.
pub mod code {
    /// Closing without error.
    pub const NO_ERROR: u64 = 0x100;
    /// No more specific code applies.
    pub const GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    /// A bug of ours, or a limit of ours reached.
    pub const INTERNAL_ERROR: u64 = 0x102;
    /// A stream of a type not allowed, or a second control stream.
    pub const STREAM_CREATION_ERROR: u64 = 0x103;
    /// A control or QPACK stream was closed.
    pub const CLOSED_CRITICAL_STREAM: u64 = 0x104;
    /// A frame not allowed where it came.
    pub const FRAME_UNEXPECTED: u64 = 0x105;
    /// A frame that does not parse.
    pub const FRAME_ERROR: u64 = 0x106;
    /// The peer asks more than we give.
    pub const EXCESSIVE_LOAD: u64 = 0x107;
    /// A stream or push id used wrongly (a push not asked for).
    pub const ID_ERROR: u64 = 0x108;
    /// Bad SETTINGS.
    pub const SETTINGS_ERROR: u64 = 0x109;
    /// The control stream did not start with SETTINGS.
    pub const MISSING_SETTINGS: u64 = 0x10a;
    /// The request was not processed.
    pub const REQUEST_REJECTED: u64 = 0x10b;
    /// The request or response was cancelled.
    pub const REQUEST_CANCELLED: u64 = 0x10c;
    /// The stream ended before the request did.
    pub const REQUEST_INCOMPLETE: u64 = 0x10d;
    /// A malformed request or response.
    pub const MESSAGE_ERROR: u64 = 0x10e;
    /// A CONNECT's tunnel failed.
    pub const CONNECT_ERROR: u64 = 0x10f;
    /// A field section QPACK cannot decode.
    pub const QPACK_DECOMPRESSION_FAILED: u64 = 0x200;
}

/// Why HTTP/3 input was refused, with the code the peer gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum H3Error {
    /// A frame that does not parse (`H3_FRAME_ERROR`).
    Frame(&'static str),
    /// A frame where it may not be (`H3_FRAME_UNEXPECTED`).
    Unexpected(&'static str),
    /// Bad SETTINGS (`H3_SETTINGS_ERROR`).
    Settings(&'static str),
    /// A field section that does not decode, or is too large.
    Qpack(QpackError),
    /// A malformed request (`H3_MESSAGE_ERROR`; a server answers 400).
    Message(&'static str),
}

impl H3Error {
    /// The HTTP/3 error code for the stream or connection.
    pub fn code(&self) -> u64 {
        match self {
            H3Error::Frame(_) => code::FRAME_ERROR,
            H3Error::Unexpected(_) => code::FRAME_UNEXPECTED,
            H3Error::Settings(_) => code::SETTINGS_ERROR,
            H3Error::Qpack(QpackError::Invalid(_)) => code::QPACK_DECOMPRESSION_FAILED,
            H3Error::Qpack(QpackError::TooLarge) => code::EXCESSIVE_LOAD,
            H3Error::Message(_) => code::MESSAGE_ERROR,
        }
    }
}

impl std::fmt::Display for H3Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            H3Error::Frame(why) => write!(f, "bad HTTP/3 frame: {why}"),
            H3Error::Unexpected(why) => write!(f, "unexpected HTTP/3 frame: {why}"),
            H3Error::Settings(why) => write!(f, "bad HTTP/3 SETTINGS: {why}"),
            H3Error::Qpack(error) => error.fmt(f),
            H3Error::Message(why) => write!(f, "malformed HTTP/3 request: {why}"),
        }
    }
}

impl std::error::Error for H3Error {}

impl From<QpackError> for H3Error {
    fn from(error: QpackError) -> H3Error {
        H3Error::Qpack(error)
    }
}

/// Appends a whole HEADERS frame carrying `fields`.
pub fn put_headers<'a>(fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>, out: &mut Vec<u8>) {
    let mut section = Vec::new();
    qpack::encode(fields, &mut section);
    frame::put_head(out, frame::kind::HEADERS, section.len() as u64);
    out.extend_from_slice(&section);
}

/// Appends a response's HEADERS frame: `:status`, then `fields`.
pub fn put_response(status: u16, fields: &[(&[u8], &[u8])], out: &mut Vec<u8>) {
    let status = status.to_string();
    let head = [(&b":status"[..], status.as_bytes())];
    put_headers(head.into_iter().chain(fields.iter().copied()), out);
}
