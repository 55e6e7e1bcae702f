//! Messages as the handler sees them.

use bytes::Bytes;

/// Whether a message is text or binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// UTF-8 text.
    Text,
    /// Binary data.
    Binary,
}

/// A complete message, borrowed from the connection's read buffer.
///
/// It lives only for the `on_message` call: the buffer is reused afterwards, which
/// is why the borrow checker stops it from escaping. Call
/// [`Message::into_owned`] to keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message, already checked to be valid UTF-8.
    Text(&'a str),
    /// Binary data.
    Binary(&'a [u8]),
}

impl<'a> Message<'a> {
    /// Text or binary.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Text(_) => MessageKind::Text,
            Message::Binary(_) => MessageKind::Binary,
        }
    }

    /// Whether it is a text message.
    pub fn is_text(&self) -> bool {
        matches!(self, Message::Text(_))
    }

    /// The payload, whatever the kind.
    pub fn as_bytes(&self) -> &'a [u8] {
        match self {
            Message::Text(s) => s.as_bytes(),
            Message::Binary(b) => b,
        }
    }

    /// The text, or `None` for a binary message.
    pub fn as_text(&self) -> Option<&'a str> {
        match self {
            Message::Text(s) => Some(s),
            Message::Binary(_) => None,
        }
    }

    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload out of the read buffer, for use after the callback.
    pub fn into_owned(self) -> OwnedMessage {
        match self {
            Message::Text(s) => OwnedMessage::Text(s.to_owned()),
            Message::Binary(b) => OwnedMessage::Binary(Bytes::copy_from_slice(b)),
        }
    }
}

/// A message that owns its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedMessage {
    /// UTF-8 text.
    Text(String),
    /// Binary data.
    Binary(Bytes),
}

impl From<String> for OwnedMessage {
    fn from(text: String) -> Self {
        OwnedMessage::Text(text)
    }
}

impl From<&str> for OwnedMessage {
    fn from(text: &str) -> Self {
        OwnedMessage::Text(text.to_owned())
    }
}

impl From<Bytes> for OwnedMessage {
    fn from(data: Bytes) -> Self {
        OwnedMessage::Binary(data)
    }
}

impl From<Vec<u8>> for OwnedMessage {
    fn from(data: Vec<u8>) -> Self {
        OwnedMessage::Binary(data.into())
    }
}

impl From<&[u8]> for OwnedMessage {
    fn from(data: &[u8]) -> Self {
        OwnedMessage::Binary(Bytes::copy_from_slice(data))
    }
}

impl OwnedMessage {
    /// Borrows it back as a [`Message`], e.g. to send it with `Conn::send`.
    pub fn as_message(&self) -> Message<'_> {
        match self {
            OwnedMessage::Text(s) => Message::Text(s),
            OwnedMessage::Binary(b) => Message::Binary(b),
        }
    }
}
