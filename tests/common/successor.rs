//! A successor played by hand, over a raw Unix socket, to be as wrong as a
//! test needs: it reads the handoff's messages as src/handoff/channel.rs gives
//! them (an 8-byte header: the payload's length and the number of
//! descriptors, little-endian `u32`s; then the payload; the descriptors
//! on the header), counts the descriptors it is sent and which of them
//! are listening sockets, and says what it is told to.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};

/// The protocol's version, as the greeting carries it.
pub const VERSION: u8 = 2;

pub struct RawSuccessor {
    pub stream: UnixStream,
    /// Descriptors received so far.
    pub descriptors: usize,
    /// Of them, sockets that listen (a server's listening sockets).
    pub listening: usize,
    /// The last descriptors received, kept open until the next message.
    pub kept: Vec<OwnedFd>,
}

impl RawSuccessor {
    /// Connects to the handoff socket at `path`; reads wait at most 30 s.
    pub fn connect(path: &Path) -> RawSuccessor {
        let stream = UnixStream::connect(path).expect("connect to the handoff socket");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        RawSuccessor {
            stream,
            descriptors: 0,
            listening: 0,
            kept: Vec::new(),
        }
    }

    /// The next message's payload; `None` if the other end closed (or
    /// shut) the channel.
    pub fn next(&mut self) -> Option<Vec<u8>> {
        let mut header = [0u8; 8];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = recvmsg(
            &self.stream,
            &mut [std::io::IoSliceMut::new(&mut header)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .ok()?;
        self.kept.clear();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                self.kept.extend(rights);
            }
        }
        self.descriptors += self.kept.len();
        self.listening += self
            .kept
            .iter()
            .filter(|fd| rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false))
            .count();
        if received.bytes == 0 {
            return None;
        }
        self.stream.read_exact(&mut header[received.bytes..]).ok()?;
        let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).ok()?;
        Some(payload)
    }

    /// Sends `payload` as one message, without descriptors; false if the
    /// other end no longer takes it.
    pub fn send(&mut self, payload: &[u8]) -> bool {
        let mut message = (payload.len() as u32).to_le_bytes().to_vec();
        message.extend_from_slice(&[0; 4]);
        message.extend_from_slice(payload);
        self.stream.write_all(&message).is_ok()
    }

    /// Takes the running process's greeting, and greets back.
    pub fn greet(&mut self) {
        assert_eq!(
            self.next().as_deref(),
            Some(&[b'H', VERSION][..]),
            "the greeting"
        );
        assert!(self.send(&[b'H', VERSION]), "greeting back");
    }

    /// Greets, and takes the server's state (not yet answered).
    pub fn take_state(&mut self) -> Vec<u8> {
        self.greet();
        let state = self.next().expect("the server's state");
        assert_eq!(state[0], b'S', "the server's state");
        state
    }

    /// Acknowledges what came last.
    pub fn ack(&mut self) -> bool {
        self.send(b"A")
    }

    /// Refuses what came last.
    pub fn refuse(&mut self, why: &str) -> bool {
        self.send(&[b"N", why.as_bytes()].concat())
    }

    /// Whether the running process ends the channel within `within`
    /// (reading, and dropping, whatever it sends before).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.stream.set_read_timeout(Some(within)).unwrap();
        let start = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) if start.elapsed() < within => {}
                Ok(_) => return false,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return !matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    );
                }
            }
        }
    }
}

/// A path for a handoff socket, unique to the test process and `name`
/// (under a directory named for `suite`), nothing there yet.
pub fn socket_path(suite: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rapidws-{suite}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    path
}
