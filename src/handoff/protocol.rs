//! What the two processes say to each other over the channel.
//!
//! ```text
//! predecessor                                  successor
//!   (who connected: same user or root)           (who listens: same user)
//!   HELLO version                       ──▶
//!                                       ◀──      HELLO version
//!   (requests, then input, stop being handled here; accepting stops)
//!   STATE listening addresses + server state ──▶ applies it
//!                                       ◀──      ACK, or REFUSE reason
//!   BATCH n records + n connections     ──▶      reads every record
//!                                       ◀──      ACK (they are its now)
//!                                                or REFUSE reason (they stay)
//!   ... one batch after the other ...
//!   DONE + the listening sockets        ──▶      checks them
//!                                       ◀──      ACK (it accepts from now)
//! ```
//!
//! Nothing is frozen until the successor greets back (within
//! [`GREETING_TIMEOUT`]); from the state on, every answer comes within
//! [`ANSWER_TIMEOUT`]. A batch (at most [`MAX_FDS`] connections, about
//! [`BATCH_BYTES`] of records) is the successor's once acknowledged, and it
//! acknowledges before it serves any; the listening sockets go last, with
//! DONE. `docs/handoff.md` in the repository has the reasons.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rapidws_core::snapshot::{SnapshotError, SnapshotReader, SnapshotWriter};

use super::channel::{Channel, MAX_FDS};
use crate::connection::record::{read_addr, write_addr};

const HELLO: u8 = b'H';
const BATCH: u8 = b'B';
const DONE: u8 = b'D';
const STATE: u8 = b'S';
const ACK: u8 = b'A';
const REFUSE: u8 = b'N';

/// The protocol's version: each side refuses a peer of another.
const VERSION: u8 = 2;

/// Records in one batch, about (a single larger record goes alone).
const BATCH_BYTES: usize = 4 << 20;

/// The longest message a successor reads: a batch of records up to
/// `BATCH_BYTES`, or one record with a connection's whole queue and read
/// buffer.
const MAX_MESSAGE: usize = 256 << 20;

/// How long the predecessor waits for a successor that connected to
/// greet back. Nothing is frozen meanwhile.
pub(crate) const GREETING_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the predecessor gives each later exchange (the state, a
/// batch, the end): its message sent and the answer read. Requests and
/// input are frozen meanwhile, so this is what a successor that goes
/// silent costs: once, since the handoff ends with it.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the successor waits for the predecessor's next message (the
/// predecessor may be waiting on its own loops meanwhile).
const NEXT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the successor gives an answer to leave.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// Greets a process that connected, and waits (at most
    /// [`GREETING_TIMEOUT`]) for it to greet back as a successor of this
    /// version does. Nothing has changed in the server until this
    /// returns `Ok`.
    pub(crate) fn greet(mut channel: Channel) -> io::Result<Self> {
        channel.set_deadline(Some(Instant::now() + GREETING_TIMEOUT));
        channel.send(&[HELLO, VERSION], &[])?;
        match channel.recv(16) {
            Ok(Some((hello, fds))) if hello == [HELLO, VERSION] && fds.is_empty() => {
                Ok(Predecessor { channel })
            }
            Ok(Some(_)) => Err(out_of_step(
                "it did not greet back as a successor of this version does",
            )),
            Ok(None) => Err(gone("it went away without greeting back")),
            Err(error) => Err(late(error, GREETING_TIMEOUT, "greet back")),
        }
    }

    /// Hands over the server's own state, with the addresses the
    /// listening sockets (which come at the end) listen on, and waits
    /// for the acknowledgement: `Ok` once the successor applied it.
    pub(crate) fn send_state(&mut self, state: &[u8], addrs: &[SocketAddr]) -> io::Result<()> {
        let mut out = SnapshotWriter::new();
        out.u8(STATE).u32(addrs.len() as u32);
        for addr in addrs {
            write_addr(&mut out, *addr);
        }
        out.bytes(state);
        self.exchange(&out.finish(), &[])
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
        self.exchange(&out.finish(), &fds)
    }

    /// Says that nothing more comes, handing over the listening sockets,
    /// and waits for the acknowledgement: `Ok` once the successor accepts
    /// on them. `Err` if it did not take them (it refused, went away, or
    /// did not answer in time, and then cannot any more): it is then to
    /// close them, and accepts nothing.
    pub(crate) fn finish(&mut self, listeners: &[BorrowedFd<'_>]) -> io::Result<()> {
        self.exchange(&[DONE], listeners)
    }

    /// Gives up after a failure: the channel ends both ways, so a successor
    /// that acknowledges what it was sent only now fails to (and serves
    /// none of it), and the batch is the predecessor's again.
    pub(crate) fn abandon(self) {
        self.channel.shut_down();
    }

    /// Sends `message` with `fds` and waits for ACK, all within
    /// [`ANSWER_TIMEOUT`]; anything else is an error (a refusal with its
    /// reason).
    fn exchange(&mut self, message: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        self.channel
            .set_deadline(Some(Instant::now() + ANSWER_TIMEOUT));
        self.channel
            .send(message, fds)
            .map_err(|error| late(error, ANSWER_TIMEOUT, "take the message"))?;
        let answer = match self.channel.recv(64 << 10) {
            Err(error) if error.kind() == io::ErrorKind::TimedOut && !self.channel.is_broken() => {
                // It may be answering this instant. Once the channel is
                // shut it cannot any more, and an answer given before is
                // still here to read: so both sides agree on whether it
                // took this message. (Shut, the channel carries no more.)
                self.channel.shut_down();
                self.channel
                    .set_deadline(Some(Instant::now() + ANSWER_TIMEOUT));
                match self.channel.recv(64 << 10) {
                    Ok(Some((answer, _))) if answer == [ACK] => return Ok(()),
                    _ => return Err(late(error, ANSWER_TIMEOUT, "answer")),
                }
            }
            answer => answer,
        };
        match answer {
            Ok(Some((answer, _))) if answer == [ACK] => Ok(()),
            Ok(Some((answer, _))) if answer.first() == Some(&REFUSE) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "the successor refused: {}",
                    String::from_utf8_lossy(&answer[1..])
                ),
            )),
            Ok(Some(_)) => Err(out_of_step("the successor answered out of turn")),
            Ok(None) => Err(gone("the successor went away")),
            Err(error) => Err(late(error, ANSWER_TIMEOUT, "answer")),
        }
    }
}

/// `error`, said plainly if it is the other end's silence: it did not
/// `what` within `within`.
fn late(error: io::Error, within: Duration, what: &str) -> io::Error {
    if error.kind() != io::ErrorKind::TimedOut {
        return error;
    }
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("it did not {what} within {} ms", within.as_millis()),
    )
}

/// The other end said something the protocol does not allow here.
fn out_of_step(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// The other end closed the channel before the protocol's end.
fn gone(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, why)
}

/// The successor's side.
pub(crate) struct Successor {
    channel: Channel,
    /// Where the listening sockets listen, as the predecessor said with
    /// its state (they come at the end, and must match).
    announced: Vec<SocketAddr>,
}

/// What came next from the predecessor.
pub(crate) enum Received<T> {
    /// Connections, acknowledged: now the successor's.
    Batch(Vec<(T, OwnedFd)>),
    /// Nothing more comes: the listening sockets, to check, then answer
    /// ([`Successor::answer`]).
    Done(Vec<OwnedFd>),
}

impl Successor {
    /// Takes the greeting, and greets back.
    pub(crate) fn meet(mut channel: Channel) -> io::Result<Self> {
        channel.set_deadline(Some(Instant::now() + NEXT_TIMEOUT));
        match channel.recv(16)? {
            Some((hello, fds)) if hello == [HELLO, VERSION] && fds.is_empty() => {}
            Some((hello, _)) if hello.first() == Some(&HELLO) => {
                return Err(out_of_step(format!(
                    "the running process speaks handoff version {:?}, this one {VERSION}",
                    hello.get(1)
                )));
            }
            Some(_) => {
                return Err(out_of_step(
                    "the running process did not greet as a handoff does",
                ));
            }
            None => return Err(gone("the running process closed the handoff socket")),
        }
        channel.set_deadline(Some(Instant::now() + SEND_TIMEOUT));
        channel.send(&[HELLO, VERSION], &[])?;
        Ok(Successor {
            channel,
            announced: Vec::new(),
        })
    }

    /// The server's state, which comes right after the greeting, with
    /// the addresses of the listening sockets to come (at least one);
    /// answer with [`Successor::answer`] once applied.
    pub(crate) fn receive_state(&mut self) -> io::Result<Vec<u8>> {
        self.channel
            .set_deadline(Some(Instant::now() + NEXT_TIMEOUT));
        let (message, fds) = match self.channel.recv(MAX_MESSAGE)? {
            Some((message, fds)) if message.first() == Some(&STATE) => (message, fds),
            Some(_) => {
                return Err(out_of_step(
                    "the running process did not send its state first",
                ));
            }
            None => {
                return Err(gone(
                    "the running process went away before it sent its state",
                ));
            }
        };
        let read = || -> Result<_, SnapshotError> {
            let mut from = SnapshotReader::new(&message[1..]);
            let count = from.u32()? as usize;
            if count == 0 || count > MAX_FDS {
                return Err(SnapshotError::Invalid("listening sockets"));
            }
            let addrs = (0..count)
                .map(|_| read_addr(&mut from))
                .collect::<Result<Vec<_>, _>>()?;
            let state = from.bytes()?.to_vec();
            from.finish()?;
            Ok((addrs, state))
        };
        match read() {
            Ok((addrs, state)) if fds.is_empty() => {
                self.announced = addrs;
                Ok(state)
            }
            Ok(_) => Err(self.refuse("descriptors came with the state")),
            Err(error) => Err(self.refuse(&format!("the state does not read: {error}"))),
        }
    }

    /// Where the listening sockets listen, as announced with the state.
    pub(crate) fn announced(&self) -> &[SocketAddr] {
        &self.announced
    }

    /// Acknowledges what came last (the server's state, applied: then
    /// connections may come; a batch, read; the end, its sockets
    /// checked), or refuses it with the reason. `Err` if the answer could
    /// not be given (the predecessor gave up meanwhile): what came is
    /// then not this process's.
    pub(crate) fn answer(&mut self, taken: Result<(), &str>) -> io::Result<()> {
        self.channel
            .set_deadline(Some(Instant::now() + SEND_TIMEOUT));
        match taken {
            Ok(()) => self.channel.send(&[ACK], &[]),
            Err(why) => {
                let mut refusal = vec![REFUSE];
                refusal.extend_from_slice(why.as_bytes());
                self.channel.send(&refusal, &[])
            }
        }
    }

    /// Refuses what came with `why`, as the error to return.
    fn refuse(&mut self, why: &str) -> io::Error {
        let _ = self.answer(Err(why));
        out_of_step(why)
    }

    /// The next batch, each record read by `read` (which checks it all);
    /// acknowledged once every record of it reads, refused (and then
    /// `Err`) if one does not. A batch whose acknowledgement cannot be
    /// sent (the predecessor gave up on it) is dropped, not served: `Err`.
    /// Or the end, with the listening sockets, not yet answered.
    pub(crate) fn receive<T>(
        &mut self,
        mut read: impl FnMut(&[u8]) -> Result<T, SnapshotError>,
    ) -> io::Result<Received<T>> {
        self.channel
            .set_deadline(Some(Instant::now() + NEXT_TIMEOUT));
        let Some((message, fds)) = self.channel.recv(MAX_MESSAGE)? else {
            return Err(gone("the running process went away before it was done"));
        };
        if message == [DONE] {
            return Ok(Received::Done(fds));
        }
        match read_batch(&message, fds, &mut read) {
            Ok(batch) => {
                self.answer(Ok(()))?;
                Ok(Received::Batch(batch))
            }
            Err(error) => Err(self.refuse(&error.to_string())),
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
