//! What the property tests of the sans-I/O core send and see (shared by
//! `tests/roundtrip.rs` and `tests/roles.rs`): a message, how it is cut into
//! fragments, and the events a reader reports.
#![allow(dead_code)]

use rapidws_core::proto::OpCode;

/// What a reader saw, in order (pongs are kept apart: when they arrive
/// depends on how the bytes were cut).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Close(u16, String),
}

#[derive(Clone, Debug)]
pub struct TestMessage {
    pub text: bool,
    pub payload: Vec<u8>,
    /// Where to cut the payload into fragments, as fractions of its length.
    pub cuts: Vec<u16>,
    /// A ping goes between the first two fragments (if there are two).
    pub ping_inside: bool,
    /// Sent with `push_frame_shared` rather than copied in by the sender.
    pub shared: bool,
}

impl TestMessage {
    pub fn seen(&self) -> Seen {
        if self.text {
            Seen::Text(String::from_utf8(self.payload.clone()).unwrap())
        } else {
            Seen::Binary(self.payload.clone())
        }
    }

    pub fn opcode(&self) -> OpCode {
        if self.text {
            OpCode::Text
        } else {
            OpCode::Binary
        }
    }

    /// `body` cut into fragments (one, when there are no cuts).
    pub fn fragments<'a>(&self, body: &'a [u8]) -> Vec<&'a [u8]> {
        let mut at: Vec<usize> = self
            .cuts
            .iter()
            .map(|&f| body.len() * usize::from(f) / 65536)
            .collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut start = 0;
        for end in at {
            pieces.push(&body[start..end]);
            start = end;
        }
        pieces.push(&body[start..]);
        pieces
    }
}
