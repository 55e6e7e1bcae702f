//! What the two processes say to each other over the channel.
//!
//! ```text
//! predecessor                                  successor
//!   HELLO version                       ──▶
//!   (requests stop being handled here)
//!   STATE server state + listening sockets ──▶   applies it
//!                                       ◀──      ACK (it accepts from now)
//!                                                or REFUSE reason
//!   BATCH n records + n connections     ──▶      reads every record
//!                                       ◀──      ACK (they are its now)
//!                                                or REFUSE reason (they stay)
//!   ... one batch after the other ...
//!   DONE                                ──▶
//!                                       ◀──      ACK
//! ```
//!
//! Before the server's own state (its pub/sub topics, numbering and
//! history) leaves, the predecessor stops handling requests (a bus's
//! publishers): nothing is published there after it, and the successor,
//! which applies it before it serves anything, numbers on from it.
//!
//! A batch is the successor's once it acknowledges it, and it acknowledges
//! before it serves any of it: so a connection the predecessor takes back
//! (no acknowledgement came: the successor refused, died or hung) was never
//! served by the successor, and nothing is served twice. A batch holds at
//! most [`MAX_FDS`] connections and about [`BATCH_BYTES`] of records (or
//! one larger record). The predecessor takes each batch out of its loops
//! only when the one before is acknowledged, so a connection is frozen for
//! one batch's trip, not the whole handoff's.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rapidws_core::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

use super::channel::{Channel, MAX_FDS};

const HELLO: u8 = b'H';
const BATCH: u8 = b'B';
const DONE: u8 = b'D';
const STATE: u8 = b'S';
const ACK: u8 = b'A';
const REFUSE: u8 = b'N';

/// The protocol's version: a successor refuses a predecessor of another.
const VERSION: u8 = 1;

/// Records in one batch, about (a single larger record goes alone).
const BATCH_BYTES: usize = 4 << 20;

/// The longest message a successor reads: a batch of records up to
/// `BATCH_BYTES`, or one record with a connection's whole queue and read
/// buffer.
const MAX_MESSAGE: usize = 256 << 20;

/// How long the predecessor waits for an answer, or for the successor to
/// take a message, before it takes a batch back (its connections are
/// frozen meanwhile).
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the successor waits for the predecessor's next message.
const NEXT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection leaving: its descriptor and its record.
pub(crate) struct Departure {
    pub(crate) fd: OwnedFd,
    pub(crate) record: Vec<u8>,
}

/// The predecessor's side.
pub(crate) struct Predecessor {
    channel: Channel,
}

/// Whether `batch` is as large as a batch may be: [`MAX_FDS`]
/// connections, or [`BATCH_BYTES`] of records.
pub(crate) fn batch_is_full(batch: &[Departure], bytes: usize) -> bool {
    batch.len() >= MAX_FDS || bytes >= BATCH_BYTES
}

impl Predecessor {
    /// Greets a successor that connected.
    pub(crate) fn greet(channel: Channel) -> io::Result<Self> {
        channel.set_timeout(Some(ANSWER_TIMEOUT))?;
        let mut channel = channel;
        channel.send(&[HELLO, VERSION], &[])?;
        Ok(Predecessor { channel })
    }

    /// Hands over the server's own state and the listening sockets (the
    /// successor accepts from now on), and waits for the acknowledgement.
    pub(crate) fn send_state(
        &mut self,
        state: &[u8],
        listeners: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        let mut message = Vec::with_capacity(state.len() + 1);
        message.push(STATE);
        message.extend_from_slice(state);
        self.channel.send(&message, listeners)?;
        self.answer()
    }

    /// Sends a batch (at most [`MAX_FDS`] departures; see
    /// [`batch_is_full`]) and waits for its acknowledgement: `Ok` once the
    /// successor has them (our descriptors can close), `Err` if it refused,
    /// went away or did not answer within [`ANSWER_TIMEOUT`] (they are
    /// still ours).
    pub(crate) fn send_batch(&mut self, batch: &[Departure]) -> io::Result<()> {
        let mut out = SnapshotWriter::new();
        out.u8(BATCH).u32(batch.len() as u32);
        for departure in batch {
            out.bytes(&departure.record);
        }
        let fds: Vec<_> = batch.iter().map(|d| d.fd.as_fd()).collect();
        self.channel.send(&out.finish(), &fds)?;
        self.answer()
    }

    /// Says that nothing more comes, and waits for the acknowledgement.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        self.channel.send(&[DONE], &[])?;
        self.answer()
    }

    /// Gives up after a failure: the channel ends both ways, so a successor
    /// that acknowledges what it was sent only now fails to (and serves
    /// none of it), and the batch is the predecessor's again.
    pub(crate) fn abandon(self) {
        self.channel.shut_down();
    }

    /// Waits for ACK; anything else is an error (a refusal with its reason).
    fn answer(&mut self) -> io::Result<()> {
        match self.channel.recv(64 << 10)? {
            Some((answer, _)) if answer == [ACK] => Ok(()),
            // (ConnectionRefused: a refusal, not a loss: see `refused`.)
            Some((answer, _)) if answer.first() == Some(&REFUSE) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "the successor refused: {}",
                    String::from_utf8_lossy(&answer[1..])
                ),
            )),
            Some(_) => Err(out_of_step("the successor answered out of turn")),
            None => Err(gone("the successor went away")),
        }
    }
}

/// The other end said something the protocol does not allow here.
fn out_of_step(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// The other end closed the channel before the protocol's end.
fn gone(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, why)
}

/// Whether `error` is the successor's refusal (it said no, so it kept
/// nothing), rather than a loss (it may have taken what was sent).
pub(crate) fn refused(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::ConnectionRefused
}

/// The successor's side.
pub(crate) struct Successor {
    channel: Channel,
}

/// What came next from the predecessor.
pub(crate) enum Received<T> {
    /// Connections, acknowledged: now the successor's.
    Batch(Vec<(T, OwnedFd)>),
    /// Nothing more comes (acknowledged too).
    Done,
}

impl Successor {
    /// The server's state and the listening sockets, which come right
    /// after the greeting; answer with [`Successor::answer`] once applied.
    pub(crate) fn receive_state(&mut self) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
        match self.channel.recv(MAX_MESSAGE)? {
            Some((mut message, fds)) if message.first() == Some(&STATE) => {
                message.remove(0);
                Ok((message, fds))
            }
            Some(_) => Err(out_of_step(
                "the running process did not send its state first",
            )),
            None => Err(gone(
                "the running process went away before it sent its state",
            )),
        }
    }

    /// Acknowledges what came last (the server's state, applied: then
    /// connections may come; a batch, read), or refuses it with the reason.
    pub(crate) fn answer(&mut self, taken: Result<(), &str>) -> io::Result<()> {
        match taken {
            Ok(()) => self.channel.send(&[ACK], &[]),
            Err(why) => {
                let mut refusal = vec![REFUSE];
                refusal.extend_from_slice(why.as_bytes());
                self.channel.send(&refusal, &[])
            }
        }
    }

    /// Takes the greeting.
    pub(crate) fn meet(mut channel: Channel) -> io::Result<Self> {
        channel.set_timeout(Some(NEXT_TIMEOUT))?;
        match channel.recv(16)? {
            Some((hello, fds)) if hello == [HELLO, VERSION] && fds.is_empty() => {
                Ok(Successor { channel })
            }
            Some((hello, _)) if hello.first() == Some(&HELLO) => Err(out_of_step(format!(
                "the running process speaks handoff version {:?}, this one {VERSION}",
                hello.get(1)
            ))),
            Some(_) => Err(out_of_step(
                "the running process did not greet as a handoff does",
            )),
            None => Err(gone("the running process closed the handoff socket")),
        }
    }

    /// The next batch, each record read by `read` (which checks it all);
    /// acknowledged once every record of it reads, refused (and then
    /// `Err`) if one does not. A batch whose acknowledgement cannot be
    /// sent (the predecessor gave up on it) is dropped, not served: `Err`.
    pub(crate) fn receive<T>(
        &mut self,
        mut read: impl FnMut(&[u8]) -> Result<T, SnapshotError>,
    ) -> io::Result<Received<T>> {
        let Some((message, fds)) = self.channel.recv(MAX_MESSAGE)? else {
            return Err(gone("the running process went away before it was done"));
        };
        if message == [DONE] {
            self.answer(Ok(()))?;
            return Ok(Received::Done);
        }
        match read_batch(&message, fds, &mut read) {
            Ok(batch) => {
                self.answer(Ok(()))?;
                Ok(Received::Batch(batch))
            }
            Err(error) => {
                let _ = self.answer(Err(&error.to_string()));
                Err(out_of_step(error.to_string()))
            }
        }
    }
}

fn read_batch<T>(
    message: &[u8],
    fds: Vec<OwnedFd>,
    read: &mut impl FnMut(&[u8]) -> Result<T, SnapshotError>,
) -> Result<Vec<(T, OwnedFd)>, SnapshotError> {
    let mut from = SnapshotReader::new(message);
    if from.u8()? != BATCH {
        return Err(SnapshotError::Invalid("message kind"));
    }
    let count = from.u32()? as usize;
    if count != fds.len() {
        return Err(SnapshotError::Invalid("records and connections differ"));
    }
    let mut batch = Vec::with_capacity(count);
    for fd in fds {
        batch.push((read(from.bytes()?)?, fd));
    }
    from.finish()?;
    Ok(batch)
}
