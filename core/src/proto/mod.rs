//! The sans-I/O WebSocket protocol (RFC 6455), after the handshake.
//!
//! Nothing here touches a socket, a runtime or a clock: bytes go in as a
//! `BytesMut`, events and bytes to send come out. Every driver drives the
//! same [`Session`] (through rapidws's connection life), and so do the fuzz
//! targets and the benchmarks.
//!
//! | file | concern |
//! |---|---|
//! | `frame.rs` | frame header decode/encode and its validation |
//! | `mask.rs` | in-place masking, SIMD with a scalar reference |
//! | `random.rs` | a client's masking keys and handshake nonce, from a per-thread CSPRNG |
//! | `utf8.rs` | incremental UTF-8 validation across fragments |
//! | `close.rs` | close codes and close payloads |
//! | `write_queue/` | outbound frames, corked, ready for `writev`; masked in a client's queue; replies that overtake what has not started (`lanes.rs`) |
//! | `message.rs` | the message types handlers see |
//! | `prepared.rs` | a server message framed once (and compressed once) for many connections |
//! | `role.rs` | client or server: masking and the frames each refuses |
//! | `session.rs` | the state machine tying them together |
//! | `deflate/` | permessage-deflate: the agreed parameters, bounded inflate, compression (the negotiation is in `handshake/`) |

pub(crate) mod close;
pub mod deflate;
pub mod frame;
#[allow(unsafe_code)] // the AVX2 masking loop, behind a run-time check
pub(crate) mod mask;
pub(crate) mod message;
pub(crate) mod prepared;
pub(crate) mod random;
pub(crate) mod role;
pub(crate) mod session;
pub(crate) mod utf8;
pub(crate) mod write_queue;

pub use close::{
    BadClose, CloseCode, MAX_CLOSE_REASON, parse_close_payload, put_close_payload, truncate_reason,
};
pub use frame::OpCode;
pub use mask::{apply_mask, apply_mask_scalar};
pub use message::{Message, MessageKind, OwnedMessage};
pub use prepared::Prepared;
pub use random::fill as fill_random;
pub use role::Role;
pub use session::{Event, Limits, ProtocolError, Session, SessionSnapshot, Unmovable};
pub use utf8::{InvalidUtf8, Utf8Validator, validate as validate_utf8};
pub use write_queue::{MAX_IOVECS, PONG_BUDGET, WriteQueue, Written, write_at_most};
