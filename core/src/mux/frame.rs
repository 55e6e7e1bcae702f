//! The smux frame header: eight bytes, then the payload.
//!
//! | byte | field |
//! |---|---|
//! | 0 | version (1 or 2) |
//! | 1 | command (SYN 0, FIN 1, PSH 2, NOP 3, UPD 4) |
//! | 2..4 | payload length, u16 little-endian |
//! | 4..8 | stream id, u32 little-endian |
//!
//! The length comes before the id, as xtaci/smux writes it. SYN, FIN and
//! NOP carry nothing; UPD (version 2 only) carries two u32s, little-endian:
//! the bytes its sender has consumed of the stream so far and its window.

use std::fmt;

/// The header's size in bytes.
pub const HEADER_LEN: usize = 8;

/// The payload of an UPD frame: consumed and window, u32 each.
pub const UPD_LEN: usize = 8;

/// What a frame does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Opens a stream.
    Syn,
    /// Ends the sender's side of a stream (a half-close).
    Fin,
    /// Carries stream data.
    Psh,
    /// Does nothing: keepalive. Sent with stream id 0.
    Nop,
    /// Version 2: the receiver's consumed bytes and window for a stream.
    Upd,
}

impl Command {
    /// The command's byte on the wire.
    pub const fn byte(self) -> u8 {
        match self {
            Command::Syn => 0,
            Command::Fin => 1,
            Command::Psh => 2,
            Command::Nop => 3,
            Command::Upd => 4,
        }
    }

    /// The command a byte names, if any.
    pub const fn from_byte(byte: u8) -> Option<Command> {
        Some(match byte {
            0 => Command::Syn,
            1 => Command::Fin,
            2 => Command::Psh,
            3 => Command::Nop,
            4 => Command::Upd,
            _ => return None,
        })
    }
}

/// A decoded header. Whether its length is allowed for its command is the
/// session's to say ([`Header::check`]); decoding only splits the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The protocol version the sender speaks.
    pub version: u8,
    /// The command byte as received (see [`Command::from_byte`]).
    pub command: u8,
    /// The payload's length.
    pub length: u16,
    /// The stream the frame is for (0 for NOP).
    pub stream: u32,
}

impl Header {
    /// Splits the first eight bytes of `bytes` into a header, or `None`
    /// if fewer than eight are there.
    pub fn decode(bytes: &[u8]) -> Option<Header> {
        let bytes: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Header {
            version: bytes[0],
            command: bytes[1],
            length: u16::from_le_bytes([bytes[2], bytes[3]]),
            stream: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        })
    }

    /// The header's eight bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let length = self.length.to_le_bytes();
        let stream = self.stream.to_le_bytes();
        [
            self.version,
            self.command,
            length[0],
            length[1],
            stream[0],
            stream[1],
            stream[2],
            stream[3],
        ]
    }

    /// Whether the header is one a receiver speaking `version` accepts:
    /// the same version, a known command (UPD only in version 2), no
    /// payload on SYN, FIN and NOP, exactly eight bytes on UPD, and at most
    /// `max_payload` on PSH. Returns the command.
    pub fn check(&self, version: u8, max_payload: u16) -> Result<Command, FrameError> {
        if self.version != version {
            return Err(FrameError::Version {
                got: self.version,
                want: version,
            });
        }
        let command = match Command::from_byte(self.command) {
            Some(Command::Upd) if version < 2 => None,
            other => other,
        };
        let Some(command) = command else {
            return Err(FrameError::Command(self.command));
        };
        let allowed = match command {
            Command::Syn | Command::Fin | Command::Nop => self.length == 0,
            Command::Upd => usize::from(self.length) == UPD_LEN,
            Command::Psh => self.length <= max_payload,
        };
        if !allowed {
            return Err(FrameError::Length {
                command,
                length: self.length,
            });
        }
        Ok(command)
    }
}

/// A frame no smux receiver accepts: the session ends with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A version other than the session's (smux does not negotiate).
    Version {
        /// The frame's version byte.
        got: u8,
        /// The session's version.
        want: u8,
    },
    /// A command byte that means nothing (or UPD in version 1).
    Command(u8),
    /// A length the command does not allow.
    Length {
        /// The command.
        command: Command,
        /// The frame's length.
        length: u16,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Version { got, want } => write!(
                f,
                "smux frame of version {got} on a version {want} session (both sides must be configured with the same version)"
            ),
            FrameError::Command(byte) => write!(f, "smux frame with unknown command {byte}"),
            FrameError::Length {
                command: Command::Psh,
                length,
            } => write!(
                f,
                "smux data frame of {length} bytes, longer than this session accepts (raise the receiving side's frame limit or lower the sender's max_frame_size)"
            ),
            FrameError::Length { command, length } => {
                write!(f, "smux {command:?} frame with a payload of {length} bytes")
            }
        }
    }
}

impl std::error::Error for FrameError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_length_before_stream_little_endian() {
        let header = Header {
            version: 2,
            command: Command::Psh.byte(),
            length: 0x0102,
            stream: 0x0304_0506,
        };
        assert_eq!(header.encode(), [2, 2, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03]);
        assert_eq!(Header::decode(&header.encode()), Some(header));
    }

    #[test]
    fn decode_needs_eight_bytes() {
        let bytes = [1, 3, 0, 0, 0, 0, 0, 0, 99];
        for short in 0..HEADER_LEN {
            assert_eq!(Header::decode(&bytes[..short]), None);
        }
        let header = Header::decode(&bytes).unwrap();
        assert_eq!((header.version, header.command), (1, 3));
    }

    #[test]
    fn every_byte_round_trips() {
        for byte in 0..=u8::MAX {
            match Command::from_byte(byte) {
                Some(command) => assert_eq!(command.byte(), byte),
                None => assert!(byte > 4),
            }
        }
    }

    fn header(version: u8, command: u8, length: u16) -> Header {
        Header {
            version,
            command,
            length,
            stream: 3,
        }
    }

    #[test]
    fn check_follows_smux() {
        assert_eq!(header(1, 0, 0).check(1, 100), Ok(Command::Syn));
        assert_eq!(header(2, 4, 8).check(2, 100), Ok(Command::Upd));
        assert_eq!(header(2, 2, 100).check(2, 100), Ok(Command::Psh));
        assert_eq!(header(1, 2, 0).check(1, 100), Ok(Command::Psh));
        assert_eq!(
            header(2, 0, 0).check(1, 100),
            Err(FrameError::Version { got: 2, want: 1 })
        );
        // UPD is version 2's.
        assert_eq!(header(1, 4, 8).check(1, 100), Err(FrameError::Command(4)));
        assert_eq!(header(1, 5, 0).check(1, 100), Err(FrameError::Command(5)));
        for command in [0, 1, 3] {
            assert!(matches!(
                header(2, command, 1).check(2, 100),
                Err(FrameError::Length { length: 1, .. })
            ));
        }
        for length in [0, 7, 9] {
            assert!(header(2, 4, length).check(2, 100).is_err());
        }
        assert!(header(2, 2, 101).check(2, 100).is_err());
        let message = header(2, 2, 101).check(2, 100).unwrap_err().to_string();
        assert!(message.contains("101 bytes"), "{message}");
    }
}
