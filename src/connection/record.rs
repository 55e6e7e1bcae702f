//! A connection as data: what travels with its descriptor to the next
//! process. The same format from every driver, so a connection moves from
//! the tokio groups to io_uring and back.
//!
//! ```text
//! record  = version:u8 peer stage
//! peer    = family:u8 (4 or 6) ip:bytes port:u32
//! stage   = 0 handshake:bytes                         (a request not answered yet)
//!         | 1 session:SessionSnapshot input:bytes output:bytes
//!             deflate:bool [compressor] quiet:u32 paused:bool state:bytes
//! ```
//!
//! `input` is what was read and not handled (a partial frame, or whole frames
//! held while the queue was full), read again first by the successor;
//! `output` is what was queued and not written, written first. Every field
//! is checked on the way in (the codec's bounds, the session's own checks
//! in `Session::restore`); a record that does not read exactly to its end is
//! refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use rapidws_core::proto::SessionSnapshot;
use rapidws_core::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

use crate::pool::BufferPool;
use crate::proto::deflate::Compressor;
use crate::proto::{Limits, Session};

/// The record format; a successor refuses others.
const VERSION: u8 = 1;

/// The most a record carries of unread input and unwritten output
/// together: a connection with more stays (and is closed with 1012), so
/// that every record fits a message the successor reads
/// (`protocol::MAX_MESSAGE`).
pub(crate) const MAX_CARRIED: usize = 192 << 20;

/// One connection handed over.
pub(crate) struct Record {
    pub(crate) peer: SocketAddr,
    pub(crate) stage: Moved,
}

/// Where in its life the connection was.
pub(crate) enum Moved {
    /// Its request was not complete: the bytes read so far.
    Handshake { input: Vec<u8> },
    /// Upgraded (boxed: the handshake record is tiny).
    Open(Box<OpenRecord>),
}

/// An upgraded connection's state.
pub(crate) struct OpenRecord {
    pub(crate) session: SessionSnapshot,
    /// Read and not handled yet.
    pub(crate) input: Vec<u8>,
    /// Queued and not written yet (already framed, masked if a client's,
    /// compressed if it was).
    pub(crate) output: Vec<u8>,
    /// permessage-deflate's compressor (without context: see
    /// `Compressor::snapshot`).
    pub(crate) compressor: Option<Compressor>,
    /// Keepalive sweeps since the peer was last heard from.
    pub(crate) quiet: u32,
    /// The application had paused reading (`Conn::pause_reading`).
    pub(crate) reading_paused: bool,
    /// The handler's state, from `Handler::hand_off`.
    pub(crate) state: Vec<u8>,
}

impl Record {
    /// The record as bytes. Fails only if the compressor cannot move, which
    /// the caller checked (it is then no record).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = SnapshotWriter::new();
        out.u8(VERSION);
        write_addr(&mut out, self.peer);
        match &self.stage {
            Moved::Handshake { input } => {
                out.u8(0).bytes(input);
            }
            Moved::Open(open) => {
                out.u8(1);
                open.session.encode(&mut out);
                out.bytes(&open.input)
                    .bytes(&open.output)
                    .bool(open.compressor.is_some());
                if let Some(compressor) = &open.compressor {
                    // A compressor that keeps its context never becomes a
                    // record (see `Dispatch::hand_off`).
                    let moved = compressor.snapshot(&mut out);
                    debug_assert!(moved.is_ok());
                }
                out.u32(open.quiet)
                    .bool(open.reading_paused)
                    .bytes(&open.state);
            }
        }
        out.finish()
    }

    /// Reads a record [`Record::encode`] wrote; anything else is refused.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, SnapshotError> {
        let mut from = SnapshotReader::new(bytes);
        let version = from.u8()?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        let peer = read_addr(&mut from)?;
        let stage = match from.u8()? {
            0 => Moved::Handshake {
                input: from.bytes()?.to_vec(),
            },
            1 => {
                let session = SessionSnapshot::decode(&mut from)?;
                let input = from.bytes()?.to_vec();
                let output = from.bytes()?.to_vec();
                let compressor = if from.bool("deflate")? {
                    Some(Compressor::restore(&mut from)?)
                } else {
                    None
                };
                Moved::Open(Box::new(OpenRecord {
                    session,
                    input,
                    output,
                    compressor,
                    quiet: from.u32()?,
                    reading_paused: from.bool("paused")?,
                    state: from.bytes()?.to_vec(),
                }))
            }
            _ => return Err(SnapshotError::Invalid("stage")),
        };
        from.finish()?;
        Ok(Record { peer, stage })
    }
}

/// An address as a record writes it (the peer's; the listening sockets'
/// in the handoff's state message): `family:u8 (4 or 6) ip:bytes port:u32`.
pub(crate) fn write_addr(out: &mut SnapshotWriter, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => out.u8(4).bytes(&ip.octets()),
        IpAddr::V6(ip) => out.u8(6).bytes(&ip.octets()),
    };
    out.u32(u32::from(addr.port()));
}

/// Reads what [`write_addr`] wrote, every field checked.
pub(crate) fn read_addr(from: &mut SnapshotReader<'_>) -> Result<SocketAddr, SnapshotError> {
    let ip = match (from.u8()?, from.bytes()?) {
        (4, ip) => IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(ip).map_err(|_| SnapshotError::Invalid("address"))?,
        )),
        (6, ip) => IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(ip).map_err(|_| SnapshotError::Invalid("address"))?,
        )),
        _ => return Err(SnapshotError::Invalid("address family")),
    };
    let port = u16::try_from(from.u32()?).map_err(|_| SnapshotError::Invalid("port"))?;
    Ok(SocketAddr::new(ip, port))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Limits, Role, Session};

    fn open_record() -> Record {
        let pool = std::sync::Arc::new(crate::pool::BufferPool::default());
        let mut session = Session::new(Role::Server, Limits::default(), pool);
        let snapshot = session.snapshot(&mut bytes::BytesMut::new()).unwrap();
        Record {
            peer: "[::1]:4000".parse().unwrap(),
            stage: Moved::Open(Box::new(OpenRecord {
                session: snapshot,
                input: b"\x81\x85half".to_vec(),
                output: b"\x81\x02hi".to_vec(),
                compressor: None,
                quiet: 2,
                reading_paused: true,
                state: b"state".to_vec(),
            })),
        }
    }

    #[test]
    fn records_read_back_as_written() {
        let handshake = Record {
            peer: "127.0.0.1:9".parse().unwrap(),
            stage: Moved::Handshake {
                input: b"GET / HT".to_vec(),
            },
        };
        let back = Record::decode(&handshake.encode()).unwrap();
        assert_eq!(back.peer, handshake.peer);
        assert!(matches!(back.stage, Moved::Handshake { input } if input == b"GET / HT"));

        let open = open_record();
        let back = Record::decode(&open.encode()).unwrap();
        assert_eq!(back.peer, open.peer);
        let (Moved::Open(back), Moved::Open(open)) = (back.stage, open.stage) else {
            panic!("an open record read back as another stage");
        };
        assert_eq!(back.session, open.session);
        assert_eq!(
            (&back.input, &back.output, back.quiet, back.reading_paused),
            (&open.input, &open.output, open.quiet, open.reading_paused)
        );
        assert_eq!(back.state, open.state);
    }

    #[test]
    fn cut_or_altered_records_are_refused() {
        let bytes = open_record().encode();
        for end in 0..bytes.len() {
            assert!(Record::decode(&bytes[..end]).is_err(), "cut at {end}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Record::decode(&longer).is_err());
        let mut other_version = bytes.clone();
        other_version[0] = 2;
        assert_eq!(
            Record::decode(&other_version).err(),
            Some(SnapshotError::Version(2))
        );
        let mut family = bytes;
        family[1] = 5;
        assert!(Record::decode(&family).is_err());
    }
}
