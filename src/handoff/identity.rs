//! Who is at the other end of the handoff socket, in the kernel's words:
//! `SO_PEERCRED` gives the user and process that connected (asked by the
//! running process) or that listens (asked by the successor). Checked on
//! both sides before a byte of the handoff is read or sent, so a process
//! of another user that reaches the socket anyway (the file's mode is
//! 0600, but root's, or a process with `CAP_DAC_OVERRIDE`, passes it; or
//! the path was not ours) learns nothing and is given nothing.
//!
//! - The running process hands over only to its own user, or to root.
//! - The successor takes over only from its own user: a root successor
//!   refuses a server of another user (it would serve on that user's
//!   port, with that user's state), and a successor of another user could
//!   not connect to a root server's socket anyway.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The process at the other end of the socket, as the kernel saw it when
/// it connected (or listened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

impl Peer {
    /// The other end of `stream`.
    pub(crate) fn of(stream: &UnixStream) -> io::Result<Peer> {
        let cred = rustix::net::sockopt::socket_peercred(stream)?;
        Ok(Peer {
            pid: cred.pid.as_raw_pid(),
            uid: cred.uid.as_raw(),
        })
    }
}

/// This process's effective user (the one the kernel records for its
/// sockets).
pub(crate) fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Whether a running process of user `own` may hand over to a successor
/// of user `peer`: the same user, or root.
pub(crate) fn successor_allowed(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

/// Whether a successor of user `own` may take over from a running process
/// of user `peer`: the same user only.
pub(crate) fn predecessor_allowed(peer: u32, own: u32) -> bool {
    peer == own
}

/// The running process's check of a process that connected to its
/// handoff socket: who it is, or `PermissionDenied` naming both users.
pub(crate) fn check_successor(stream: &UnixStream) -> io::Result<Peer> {
    let (peer, own) = (Peer::of(stream)?, own_uid());
    if successor_allowed(peer.uid, own) {
        return Ok(peer);
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "process {} of uid {} connected to the handoff socket; this server runs as \
             uid {own} and hands over only to its own user or root",
            peer.pid, peer.uid
        ),
    ))
}

/// The successor's check of the process listening at `path`, before it
/// reads anything from it: `PermissionDenied` naming both users if it
/// runs as another user.
pub(crate) fn check_predecessor(stream: &UnixStream, path: &Path) -> io::Result<Peer> {
    let (peer, own) = (Peer::of(stream)?, own_uid());
    if predecessor_allowed(peer.uid, own) {
        return Ok(peer);
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "taking over from {}: the process listening there (pid {}) runs as uid {}, \
             this one as uid {own}; a server is taken over only by its own user",
            path.display(),
            peer.pid,
            peer.uid
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_process_hands_over_to_its_own_user_or_root() {
        assert!(successor_allowed(1000, 1000));
        assert!(successor_allowed(0, 1000));
        assert!(successor_allowed(0, 0));
        assert!(!successor_allowed(65534, 1000));
        assert!(!successor_allowed(1000, 0));
    }

    #[test]
    fn a_successor_takes_over_from_its_own_user_only() {
        assert!(predecessor_allowed(1000, 1000));
        assert!(predecessor_allowed(0, 0));
        // Root does not take over another user's server, nor the reverse.
        assert!(!predecessor_allowed(65534, 0));
        assert!(!predecessor_allowed(0, 1000));
    }

    #[test]
    fn the_kernel_names_this_process_at_either_end_of_a_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let me = Peer::of(&a).unwrap();
        assert_eq!(me, Peer::of(&b).unwrap());
        assert_eq!(me.pid, std::process::id() as i32);
        assert_eq!(me.uid, own_uid());
        assert!(check_successor(&a).is_ok());
        assert!(check_predecessor(&b, Path::new("x")).is_ok());
    }
}
