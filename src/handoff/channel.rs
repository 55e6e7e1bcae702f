//! The handoff's channel: a Unix stream socket between a running process
//! and its successor, carrying messages that may each hand over
//! descriptors (`SCM_RIGHTS`). A message is an 8-byte header (the payload's
//! length and the number of descriptors, little-endian `u32`s), then the
//! payload; its descriptors ride on the header's bytes, so the receiver's
//! `recvmsg` of the header takes them, and nothing else does.
//!
//! Bounded both ways: at most [`MAX_FDS`] descriptors a message (the
//! kernel takes 253) and a payload length the receiver names. A message
//! that breaks a bound, or whose descriptors do not match its header (the
//! control data cut short), is refused with an error and every descriptor
//! it brought is closed. And bounded in time: every send and receive ends
//! by the deadline set last ([`Channel::set_deadline`]), however slowly
//! the other end trickles its bytes (each read or write is given only the
//! time left, and the whole message fails with `TimedOut` once it is up).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// The most descriptors one message hands over.
pub(crate) const MAX_FDS: usize = 250;

const HEADER: usize = 8;

/// One end of the channel.
#[derive(Debug)]
pub(crate) struct Channel {
    stream: UnixStream,
    /// A receive failed midway: the stream is no longer at a message's
    /// start, so every later receive fails too.
    broken: bool,
    /// When the current exchange must be over (`None`: never).
    deadline: Option<Instant>,
}

impl Channel {
    pub(crate) fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            broken: false,
            deadline: None,
        }
    }

    /// When every send and receive from now on must be over (`None`: no
    /// limit); past it, they fail with `TimedOut`.
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Whether a receive failed midway (the stream is out of step): one
    /// that timed out before the first byte of a message did not.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Gives the next read or write of the socket the time left before
    /// the deadline; `TimedOut` if there is none.
    fn arm(&self) -> io::Result<()> {
        let Some(deadline) = self.deadline else {
            self.stream.set_read_timeout(None)?;
            return self.stream.set_write_timeout(None);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))
    }

    /// Ends the channel both ways: the other end's next send or receive
    /// fails. What it had sent before stays readable here, and nothing
    /// more can come: so a receive after this learns for certain whether
    /// an answer was given in time.
    pub(crate) fn shut_down(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Sends `payload` with `fds` (at most [`MAX_FDS`]); the descriptors
    /// stay open here too (the receiver gets its own).
    pub(crate) fn send(&mut self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} descriptors in one handoff message (at most {MAX_FDS})",
                    fds.len()
                ),
            ));
        }
        let len = u32::try_from(payload.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "a handoff message over 4 GiB")
        })?;
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..].copy_from_slice(&(fds.len() as u32).to_le_bytes());
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other("handoff control buffer too small"));
        }
        // The descriptors ride on the first bytes sent, which are the
        // header's; header and payload go in one call, so a short message
        // (an answer) is queued whole or not at all.
        let mut sent = self.send_some(&[&header, payload], &mut control)?;
        let mut empty = SendAncillaryBuffer::default();
        while sent < HEADER + payload.len() {
            sent += if sent < HEADER {
                self.send_some(&[&header[sent..], payload], &mut empty)?
            } else {
                self.send_some(&[&payload[sent - HEADER..]], &mut empty)?
            };
        }
        Ok(())
    }

    /// One `sendmsg` of `parts`, by the deadline: how many bytes went.
    fn send_some(
        &mut self,
        parts: &[&[u8]],
        control: &mut SendAncillaryBuffer<'_, '_, '_>,
    ) -> io::Result<usize> {
        let slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
        loop {
            self.arm()?;
            match sendmsg(self.stream.as_fd(), &slices, control, SendFlags::NOSIGNAL) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Err(io::ErrorKind::TimedOut.into()),
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Receives the next message: its payload (at most `max_len` bytes) and
    /// descriptors. `Ok(None)` if the other end closed between messages.
    pub(crate) fn recv(&mut self, max_len: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        if self.broken {
            return Err(invalid(
                "an earlier message was refused; the channel is out of step",
            ));
        }
        let mut started = false;
        let received = self.recv_message(max_len, &mut started);
        if received.is_err() && started {
            self.broken = true;
        }
        received
    }

    /// Reads a message; `started` once a byte of it is read (a failure
    /// after that leaves the stream out of step).
    fn recv_message(
        &mut self,
        max_len: usize,
        started: &mut bool,
    ) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        let mut header = [0u8; HEADER];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = loop {
            self.arm()?;
            match recvmsg(
                self.stream.as_fd(),
                &mut [IoSliceMut::new(&mut header)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(received) => break received,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Err(io::ErrorKind::TimedOut.into()),
                Err(error) => {
                    *started = true;
                    return Err(error.into());
                }
            }
        };
        *started = true;
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if received.bytes == 0 {
            return if fds.is_empty() {
                Ok(None)
            } else {
                Err(invalid("descriptors without a message"))
            };
        }
        if received.flags.contains(ReturnFlags::CTRUNC) {
            return Err(invalid(
                "descriptors cut short (more than the message may carry)",
            ));
        }
        self.read_exact(&mut header[received.bytes..])?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let count = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if count != fds.len() {
            return Err(invalid(
                "a message whose descriptors do not match its header",
            ));
        }
        if len > max_len {
            return Err(invalid("a message longer than allowed"));
        }
        // Grown as the bytes come, not sized by the header alone.
        let mut payload = Vec::new();
        let mut chunk = vec![0u8; len.min(64 << 10)];
        while payload.len() < len {
            let want = (len - payload.len()).min(chunk.len());
            let n = self.read_some(&mut chunk[..want])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            payload.extend_from_slice(&chunk[..n]);
        }
        Ok(Some((payload, fds)))
    }

    /// Fills `buf`, by the deadline.
    fn read_exact(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_some(buf)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => buf = &mut buf[n..],
            }
        }
        Ok(())
    }

    /// One read, by the deadline.
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            self.arm()?;
            match io::Read::read(&mut self.stream, buf) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                read => return read,
            }
        }
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("handoff channel: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// A connected TCP pair on loopback.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn sockets_and_bytes_arrive_together_and_the_sockets_work() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut sender, mut receiver) = (Channel::new(a), Channel::new(b));
        let pairs: Vec<_> = (0..3).map(|_| tcp_pair()).collect();
        let fds: Vec<_> = pairs.iter().map(|(_, server)| server.as_fd()).collect();
        sender.send(b"three connections", &fds).unwrap();
        sender.send(b"and no more", &[]).unwrap();
        let (payload, received) = receiver.recv(1 << 20).unwrap().unwrap();
        assert_eq!(payload, b"three connections");
        assert_eq!(received.len(), 3);
        // Each received descriptor is the same connection: what the client
        // end sends can be read from it.
        for ((client, _), fd) in pairs.iter().zip(received) {
            let mut server = TcpStream::from(fd);
            (&*client).write_all(b"hello").unwrap();
            let mut got = [0u8; 5];
            server.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"hello");
        }
        let (payload, fds) = receiver.recv(1 << 20).unwrap().unwrap();
        assert_eq!((payload.as_slice(), fds.len()), (&b"and no more"[..], 0));
        drop(sender);
        assert!(receiver.recv(1 << 20).unwrap().is_none());
    }

    #[test]
    fn the_most_descriptors_a_message_takes_pass_and_one_more_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut sender, mut receiver) = (Channel::new(a), Channel::new(b));
        let (one, _other) = UnixStream::pair().unwrap();
        let many = vec![one.as_fd(); MAX_FDS];
        sender.send(b"x", &many).unwrap();
        let (_, fds) = receiver.recv(16).unwrap().unwrap();
        assert_eq!(fds.len(), MAX_FDS);
        let too_many = vec![one.as_fd(); MAX_FDS + 1];
        assert_eq!(
            sender.send(b"x", &too_many).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn broken_messages_are_refused() {
        // Longer than the receiver allows.
        let (a, b) = UnixStream::pair().unwrap();
        let (mut sender, mut receiver) = (Channel::new(a), Channel::new(b));
        sender.send(&[7u8; 100], &[]).unwrap();
        sender.send(b"next", &[]).unwrap();
        let error = receiver.recv(99).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        // Out of step from there on: the next message is not read as one.
        assert!(
            receiver
                .recv(1 << 20)
                .unwrap_err()
                .to_string()
                .contains("out of step")
        );
        // A header that promises descriptors it does not carry.
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut receiver = Channel::new(b);
        a.write_all(&[1, 0, 0, 0, 2, 0, 0, 0, b'x']).unwrap();
        assert!(
            receiver
                .recv(16)
                .unwrap_err()
                .to_string()
                .contains("do not match")
        );
        // A message cut short by the sender's end.
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut receiver = Channel::new(b);
        a.write_all(&[10, 0, 0, 0, 0, 0, 0, 0, b'x']).unwrap();
        drop(a);
        assert_eq!(
            receiver.recv(16).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
    #[test]
    fn a_peer_that_trickles_its_bytes_has_until_the_deadline_for_the_whole_message() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut receiver = Channel::new(b);
        // Nothing at all: a timeout, and the channel is still in step.
        receiver.set_deadline(Some(Instant::now() + Duration::from_millis(100)));
        let error = receiver.recv(1 << 20).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(!receiver.is_broken());
        // A byte every 50 ms of a 100-byte message, each within the
        // socket's timeout: the whole still ends at the deadline.
        let trickler = std::thread::spawn(move || {
            a.write_all(&[100, 0, 0, 0, 0, 0, 0, 0]).unwrap();
            for _ in 0..100 {
                if a.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        receiver.set_deadline(Some(start + Duration::from_millis(400)));
        let error = receiver.recv(1 << 20).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(took < Duration::from_millis(1000), "{took:?}");
        assert!(receiver.is_broken());
        drop(receiver);
        trickler.join().unwrap();
    }

    #[test]
    fn a_send_the_peer_does_not_read_ends_at_the_deadline() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut sender = Channel::new(a);
        let start = Instant::now();
        sender.set_deadline(Some(start + Duration::from_millis(200)));
        let error = sender.send(&vec![0u8; 64 << 20], &[]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn an_answer_given_before_the_channel_shut_is_still_read_and_none_after() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut asker, mut answerer) = (Channel::new(a), Channel::new(b));
        answerer.send(b"yes", &[]).unwrap();
        asker.shut_down();
        assert!(answerer.send(b"late", &[]).is_err());
        assert_eq!(asker.recv(16).unwrap().unwrap().0, b"yes");
        assert!(asker.recv(16).unwrap().is_none());
    }
}
