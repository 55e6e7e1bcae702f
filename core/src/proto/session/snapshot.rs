//! A session between two reads, as data ([`SessionSnapshot`]): what another
//! process needs to go on reading the connection exactly where this one
//! stopped, given the bytes left in the read buffer.
//!
//! To keep what travels small and what is restored easy to check, a frame
//! that still has its header in the read buffer is rewound to it: the
//! payload bytes already unmasked in place are masked again (the mask is
//! its own inverse), so the buffer holds the frame as it came off the wire
//! and the successor parses it from its header. Only a fragment of an
//! assembled message (whose earlier bytes have left the buffer for the
//! assembly) travels as a frame in progress: its header fields and how much
//! of its payload was taken. The assembly itself and the message's
//! announced length travel too (its UTF-8 state is found again from it).
//!
//! What cannot move: a session that is closing or closed (it finishes
//! where it is), one holding a failure, and one whose inflater keeps a
//! window between messages (the peer's context takeover) or is in the
//! middle of a compressed message: zlib's state stays in this process.

use bytes::BytesMut;

use super::{Fragmented, Frame, Session, State};
use crate::pool::BufferPool;
use crate::proto::frame::{FrameHeader, OpCode, RSV1};
use crate::proto::mask::apply_mask;
use crate::proto::utf8::Utf8Validator;
use crate::proto::{Limits, Role};
use crate::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

/// The format of [`SessionSnapshot::encode`]; a successor refuses others.
const FORMAT: u8 = 1;

/// Why a session cannot be handed to another process now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmovable {
    /// A close frame was sent or received, or the connection failed.
    Closing,
    /// A close frame is held for the application: a protocol failure's,
    /// or the reply to the peer's close.
    HeldClose,
    /// The peer compresses with context takeover: the inflater's window is
    /// zlib state that stays in this process.
    InflateContext,
    /// A compressed message is half received.
    CompressedMessage,
    /// We compress with context takeover: the deflater's window is zlib
    /// state that stays in this process.
    DeflateContext,
}

impl Unmovable {
    /// Why, in words (what `Display` writes), for a log line.
    pub fn reason(self) -> &'static str {
        match self {
            Unmovable::Closing => "the connection is closing",
            Unmovable::HeldClose => "a close frame waits for the application",
            Unmovable::InflateContext => "the peer compresses with context takeover",
            Unmovable::CompressedMessage => "a compressed message is half received",
            Unmovable::DeflateContext => "we compress with context takeover",
        }
    }
}

impl std::fmt::Display for Unmovable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Unmovable {}

/// A fragment of an assembled message in progress (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fragment {
    fin: bool,
    opcode: OpCode,
    mask: Option<[u8; 4]>,
    payload_len: usize,
    /// Payload bytes already taken into the assembly.
    done: usize,
}

/// A message being assembled.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Assembly {
    text: bool,
    /// Payload bytes announced so far over its frame headers.
    announced: usize,
    /// The bytes assembled so far (a text message's UTF-8 state is theirs:
    /// the successor checks them again).
    bytes: Vec<u8>,
    fragment: Option<Fragment>,
}

/// What a [`Session`] holds between two reads, as data (see the module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSnapshot {
    role: Role,
    limits: Limits,
    /// permessage-deflate was agreed (without the peer's context takeover).
    compressed: bool,
    /// Close frames are held for the application (`Session::hold_closes`).
    hold_closes: bool,
    assembly: Option<Assembly>,
}

impl Session {
    /// The session as data, for another process to go on from, with
    /// `input` (the read buffer, which this first settles and may rewind:
    /// hand its bytes over with the snapshot, and read no more here).
    /// `Err` says why the session cannot move; `input` is then unchanged
    /// but for bytes the last event borrowed, which are dropped as the next
    /// [`Session::poll_event`] would.
    pub fn snapshot(&mut self, input: &mut BytesMut) -> Result<SessionSnapshot, Unmovable> {
        self.settle(input);
        self.movable()?;
        let compressed = self.rules.allowed_rsv & RSV1 != 0;
        let fragment = match (&self.frame, self.fragmented.is_some()) {
            // A fragment whose earlier bytes went to the assembly.
            (Some(frame), true) if !frame.header.opcode.is_control() => {
                debug_assert_eq!((frame.header_len, frame.kept), (0, 0));
                Some(Fragment {
                    fin: frame.header.fin,
                    opcode: frame.header.opcode,
                    mask: frame.header.mask,
                    payload_len: frame.payload_len(),
                    done: frame.done,
                })
            }
            // Its header is still in the buffer: rewind to it.
            (Some(frame), _) => {
                if let Some(key) = frame.header.mask {
                    let unmasked = frame.header_len..frame.header_len + frame.kept;
                    apply_mask(&mut input[unmasked], key, 0);
                }
                None
            }
            (None, _) => None,
        };
        let assembly = self.fragmented.map(|fragmented| Assembly {
            text: fragmented.text,
            announced: fragmented.len,
            bytes: self.assembly.to_vec(),
            fragment,
        });
        // What was rewound is parsed again, from its header, by whoever
        // reads next: here too, should the caller go on instead.
        if assembly.as_ref().is_none_or(|a| a.fragment.is_none()) {
            self.frame = None;
            if self.fragmented.is_none() {
                self.utf8 = Utf8Validator::new();
            }
        }
        Ok(SessionSnapshot {
            role: self.role(),
            limits: self.limits,
            compressed,
            hold_closes: self.hold_closes,
            assembly,
        })
    }

    /// Whether [`Session::snapshot`] would move the session now (it
    /// changes nothing): a caller with work of its own to undo asks first.
    pub fn movable(&self) -> Result<(), Unmovable> {
        if self.held.is_some() {
            return Err(Unmovable::HeldClose);
        }
        if self.state != State::Open {
            return Err(Unmovable::Closing);
        }
        if self.inflater.as_ref().is_some_and(|i| i.keeps_context()) {
            return Err(Unmovable::InflateContext);
        }
        if self.fragmented.is_some_and(|f| f.compressed) {
            return Err(Unmovable::CompressedMessage);
        }
        Ok(())
    }

    /// The limits the session reads under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A session that goes on from `snapshot`, reading the bytes handed over
    /// with it first. The snapshot's limits (the connection's own, which
    /// its upgrade may have set) must be within `ceiling`, the most this
    /// process would give a connection; and everything is checked against
    /// what a session's own reading could have produced (lengths within the
    /// limits, a fragment within what its message announced, its mask as
    /// the role wants it, a text assembly that is UTF-8 so far), so a
    /// snapshot that was not made so is refused rather than trusted.
    pub fn restore(
        snapshot: &SessionSnapshot,
        ceiling: Limits,
        pool: std::sync::Arc<BufferPool>,
    ) -> Result<Session, SnapshotError> {
        if snapshot.limits.max_frame_size > ceiling.max_frame_size
            || snapshot.limits.max_message_size > ceiling.max_message_size
        {
            return Err(SnapshotError::Invalid("limits above this process's"));
        }
        let mut session = Session::new(snapshot.role, snapshot.limits, pool);
        if snapshot.hold_closes {
            session.hold_closes();
        }
        if snapshot.compressed {
            session.accept_compressed_without_context()?;
        }
        let Some(assembly) = &snapshot.assembly else {
            return Ok(session);
        };
        let limits = snapshot.limits;
        if assembly.announced > limits.max_message_size || assembly.bytes.len() > assembly.announced
        {
            return Err(SnapshotError::Invalid("assembly length"));
        }
        // Where the validator stood: fed what was assembled, as it was.
        session.utf8 = Utf8Validator::new();
        if assembly.text && session.utf8.feed(&assembly.bytes).is_err() {
            return Err(SnapshotError::Invalid("assembly UTF-8"));
        }
        if let Some(fragment) = assembly.fragment {
            let masked = session.rules.expect_masked;
            let unread = fragment.payload_len.saturating_sub(fragment.done);
            if fragment.opcode.is_control()
                || fragment.done >= fragment.payload_len
                || fragment.payload_len > limits.max_frame_size
                || fragment.mask.is_some() != masked
                || assembly.bytes.len().saturating_add(unread) > assembly.announced
            {
                return Err(SnapshotError::Invalid("fragment"));
            }
            session.frame = Some(Frame {
                header: FrameHeader {
                    fin: fragment.fin,
                    rsv: 0,
                    opcode: fragment.opcode,
                    mask: fragment.mask,
                    payload_len: fragment.payload_len as u64,
                },
                header_len: 0,
                done: fragment.done,
                kept: 0,
            });
        }
        session.fragmented = Some(Fragmented {
            text: assembly.text,
            len: assembly.announced,
            compressed: false,
        });
        let mut buf = session.pool.take(assembly.bytes.len().max(1));
        buf.extend_from_slice(&assembly.bytes);
        session.assembly = buf;
        Ok(session)
    }

    #[cfg(feature = "deflate")]
    fn accept_compressed_without_context(&mut self) -> Result<(), SnapshotError> {
        self.rules.allowed_rsv |= RSV1;
        self.inflater = Some(crate::proto::deflate::Inflater::new(false));
        Ok(())
    }

    #[cfg(not(feature = "deflate"))]
    fn accept_compressed_without_context(&mut self) -> Result<(), SnapshotError> {
        Err(SnapshotError::Invalid(
            "permessage-deflate (built without it)",
        ))
    }
}

impl SessionSnapshot {
    /// The limits the session reads under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Appends the snapshot to `out`.
    pub fn encode(&self, out: &mut SnapshotWriter) {
        out.u8(FORMAT)
            .bool(self.role == Role::Client)
            .usize(self.limits.max_frame_size)
            .usize(self.limits.max_message_size)
            .bool(self.compressed)
            .bool(self.hold_closes)
            .bool(self.assembly.is_some());
        let Some(assembly) = &self.assembly else {
            return;
        };
        out.bool(assembly.text)
            .usize(assembly.announced)
            .bytes(&assembly.bytes)
            .bool(assembly.fragment.is_some());
        if let Some(fragment) = assembly.fragment {
            out.bool(fragment.fin)
                .u8(fragment.opcode as u8)
                .bool(fragment.mask.is_some())
                .u32(fragment.mask.map_or(0, u32::from_le_bytes))
                .usize(fragment.payload_len)
                .usize(fragment.done);
        }
    }

    /// Reads a snapshot [`encode`](Self::encode) wrote (the fields only:
    /// [`Session::restore`] checks that they fit together).
    pub fn decode(from: &mut SnapshotReader<'_>) -> Result<SessionSnapshot, SnapshotError> {
        let format = from.u8()?;
        if format != FORMAT {
            return Err(SnapshotError::Version(format));
        }
        let role = if from.bool("role")? {
            Role::Client
        } else {
            Role::Server
        };
        let limits = Limits {
            max_frame_size: from.usize("max_frame_size")?,
            max_message_size: from.usize("max_message_size")?,
        };
        let compressed = from.bool("compressed")?;
        let hold_closes = from.bool("hold_closes")?;
        let assembly = if from.bool("assembly")? {
            let text = from.bool("text")?;
            let announced = from.usize("announced")?;
            let bytes = from.bytes()?.to_vec();
            let fragment = if from.bool("fragment")? {
                let fin = from.bool("fin")?;
                let opcode =
                    OpCode::from_bits(from.u8()?).ok_or(SnapshotError::Invalid("opcode"))?;
                let masked = from.bool("masked")?;
                let key = from.u32()?.to_le_bytes();
                Some(Fragment {
                    fin,
                    opcode,
                    mask: masked.then_some(key),
                    payload_len: from.usize("payload_len")?,
                    done: from.usize("done")?,
                })
            } else {
                None
            };
            Some(Assembly {
                text,
                announced,
                bytes,
                fragment,
            })
        } else {
            None
        };
        Ok(SessionSnapshot {
            role,
            limits,
            compressed,
            hold_closes,
            assembly,
        })
    }
}
