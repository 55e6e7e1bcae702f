//! Why a client's upgrade could not be written, or its response does not
//! complete the upgrade: one variant per failure, for callers to match on.

/// Why an upgrade request could not be written. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRequestError {
    /// The host is empty or holds a byte that is not visible ASCII.
    InvalidHost,
    /// The target does not start with `/`, or holds a space, a control
    /// character, a `#` or a byte that is not ASCII.
    InvalidTarget,
    /// A subprotocol is not an HTTP token, or is offered twice.
    InvalidProtocol,
    /// An extra header's name is not a token, or its value holds CR, LF or
    /// another control character (it would end the header early).
    InvalidHeader,
    /// An extra header is one the handshake writes itself (`Host`, `Upgrade`,
    /// `Connection`, any `Sec-WebSocket-*`) or one that gives the request a
    /// body (`Content-Length`, `Transfer-Encoding`).
    ReservedHeader,
}

impl ClientRequestError {
    fn reason(self) -> &'static str {
        match self {
            ClientRequestError::InvalidHost => "the host must be non-empty visible ASCII",
            ClientRequestError::InvalidTarget => {
                "the target must start with '/' and be visible ASCII without '#'"
            }
            ClientRequestError::InvalidProtocol => "a subprotocol must be a token, offered once",
            ClientRequestError::InvalidHeader => {
                "an extra header needs a token name and a value without control characters"
            }
            ClientRequestError::ReservedHeader => {
                "an extra header repeats one the handshake writes itself"
            }
        }
    }
}

impl std::fmt::Display for ClientRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for ClientRequestError {}

/// Why the server's response does not complete the upgrade. The connection
/// should be closed: no frame may be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientHandshakeError {
    /// The head is larger than the limit given, with no end in sight.
    HeadTooLarge,
    /// More than [`MAX_HEADERS`](crate::handshake::MAX_HEADERS) header fields.
    TooManyHeaders,
    /// Not parseable as an HTTP/1.x response.
    Malformed,
    /// The server answered in TLS (a record header where the status line
    /// belongs): the port serves `wss://`, and the request went as plain
    /// `ws://`.
    TlsAnswer,
    /// The status line says HTTP/1.0: an upgrade needs HTTP/1.1.
    NotHttp11,
    /// The server answered, but not with `101 Switching Protocols` (a
    /// redirect, an authentication challenge, an error).
    NotSwitching {
        /// The status it answered with.
        status: u16,
    },
    /// No `Upgrade` header with the `websocket` token.
    MissingUpgrade,
    /// No `upgrade` token in `Connection`.
    MissingConnectionUpgrade,
    /// `Sec-WebSocket-Accept` missing, repeated, or not the value the key
    /// calls for.
    BadAccept,
    /// `Sec-WebSocket-Protocol` names a subprotocol that was not offered,
    /// more than one, or appears when none was offered.
    UnofferedProtocol,
    /// `Sec-WebSocket-Extensions` names an extension that was not offered:
    /// anything but permessage-deflate, or permessage-deflate when it was
    /// not offered.
    UnofferedExtension,
    /// The permessage-deflate answer breaks RFC 7692 §7.1: malformed syntax,
    /// a parameter that is unknown, repeated, missing or out of range, a
    /// window larger than offered, or a `client_max_window_bits` that was
    /// not offered, or an offered `server_no_context_takeover` or
    /// `server_max_window_bits` that was not confirmed.
    BadExtension,
    /// The server asked the client to compress with a 256-byte window
    /// (`client_max_window_bits=8`), which zlib cannot write. Using a larger
    /// one would break the agreement, so the handshake fails; the client
    /// never offers 8.
    UnsupportedClientWindow,
}

impl ClientHandshakeError {
    fn reason(self) -> &'static str {
        match self {
            ClientHandshakeError::HeadTooLarge => "response head too large",
            ClientHandshakeError::TooManyHeaders => "too many header fields in the response",
            ClientHandshakeError::Malformed => "malformed HTTP response",
            ClientHandshakeError::TlsAnswer => {
                "the server answered in TLS, not HTTP: this port serves wss://, so use a wss:// URL"
            }
            ClientHandshakeError::NotHttp11 => "the response is not HTTP/1.1",
            ClientHandshakeError::NotSwitching { .. } => "the server did not switch protocols",
            ClientHandshakeError::MissingUpgrade => "missing Upgrade: websocket",
            ClientHandshakeError::MissingConnectionUpgrade => {
                "Connection does not contain the upgrade token"
            }
            ClientHandshakeError::BadAccept => "Sec-WebSocket-Accept does not match the key",
            ClientHandshakeError::UnofferedProtocol => "the server chose a subprotocol not offered",
            ClientHandshakeError::UnofferedExtension => "the server chose an extension not offered",
            ClientHandshakeError::BadExtension => "invalid permessage-deflate parameters",
            ClientHandshakeError::UnsupportedClientWindow => {
                "the server asked for client_max_window_bits=8, which zlib cannot write"
            }
        }
    }
}

impl std::fmt::Display for ClientHandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientHandshakeError::NotSwitching { status } => {
                write!(f, "{} (status {status})", self.reason())
            }
            other => f.write_str(other.reason()),
        }
    }
}

impl std::error::Error for ClientHandshakeError {}
