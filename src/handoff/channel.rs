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
//! it brought is closed.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

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
}

impl Channel {
    pub(crate) fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            broken: false,
        }
    }

    /// How long a receive, or a send, may wait for the other end (`None`:
    /// for ever).
    pub(crate) fn set_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)
    }

    /// Ends the channel both ways: the other end's next send or receive
    /// fails.
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
        // The header goes with the descriptors; at least its first byte
        // does, and the rest follows as plain bytes.
        let mut sent = loop {
            match sendmsg(
                self.stream.as_fd(),
                &[IoSlice::new(&header)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(error.into()),
            }
        };
        if sent == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while sent < HEADER {
            sent += self.stream.write(&header[sent..])?;
        }
        self.stream.write_all(payload)
    }

    /// Receives the next message: its payload (at most `max_len` bytes) and
    /// descriptors. `Ok(None)` if the other end closed between messages.
    pub(crate) fn recv(&mut self, max_len: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        if self.broken {
            return Err(invalid(
                "an earlier message was refused; the channel is out of step",
            ));
        }
        let received = self.recv_message(max_len);
        if received.is_err() {
            self.broken = true;
        }
        received
    }

    fn recv_message(&mut self, max_len: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        let mut header = [0u8; HEADER];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = loop {
            match recvmsg(
                self.stream.as_fd(),
                &mut [IoSliceMut::new(&mut header)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(received) => break received,
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(error.into()),
            }
        };
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
        self.stream.read_exact(&mut header[received.bytes..])?;
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
        (&mut self.stream)
            .take(len as u64)
            .read_to_end(&mut payload)?;
        if payload.len() < len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(Some((payload, fds)))
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
    use std::net::{TcpListener, TcpStream};

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
}
