//! Handing live connections to the next process (feature `handoff`,
//! Linux): a deploy that keeps every connection. ARCHITECTURE.md, "The
//! handoff", has the whole story; in short, the running process (the
//! predecessor) listens on a Unix socket, and a new process of the same
//! program (the successor) connects to it, takes the listening sockets,
//! then every connection that can move: its descriptor (`SCM_RIGHTS`) and
//! its state as a record. The predecessor closes what stays with 1012 and
//! exits.
//!
//! | file | job |
//! |---|---|
//! | `channel.rs` | the Unix socket between the two processes: messages with descriptors (`SCM_RIGHTS`), bounded |
//! | `protocol.rs` | what the two say: the greeting with the listeners, acknowledged batches, the end |
//! | `record.rs` | one connection as data (the same from every driver) |
//!
//! The connection's own part (what moves, what stays) is the lifecycle's:
//! `connection/lifecycle/handoff.rs`; the driver's (freezing its loops,
//! sockets out and in) is in the driver (`tokio/handoff.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use rapidws_core::snapshot::SnapshotError;

use crate::pool::BufferPool;
use crate::proto::{Limits, Session};

pub(crate) mod channel;
pub(crate) mod protocol;
pub(crate) mod record;

use record::{Moved, OpenRecord, Record};

/// A connection handed over, read and checked, on its way to a server loop.
pub(crate) struct Arriving {
    pub(crate) peer: SocketAddr,
    pub(crate) stage: ArrivingStage,
}

/// Where in its life it arrives.
pub(crate) enum ArrivingStage {
    /// Its request is still coming: the bytes read so far.
    Handshake(Vec<u8>),
    /// Open: its session restored (checked against this process's limits),
    /// and the rest of its record.
    Open {
        session: Session,
        record: Box<OpenRecord>,
    },
}

impl Arriving {
    /// Reads a record, restoring its session within `ceiling` (this
    /// process's limits): every field checked, so a record this process
    /// could not have made is refused.
    pub(crate) fn read(
        bytes: &[u8],
        ceiling: Limits,
        pool: &Arc<BufferPool>,
    ) -> Result<Arriving, SnapshotError> {
        let Record { peer, stage } = Record::decode(bytes)?;
        let stage = match stage {
            Moved::Handshake { input } => ArrivingStage::Handshake(input),
            Moved::Open(record) => ArrivingStage::Open {
                session: Session::restore(&record.session, ceiling, pool.clone())?,
                record,
            },
        };
        Ok(Arriving { peer, stage })
    }
}
