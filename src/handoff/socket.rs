//! Where a running server waits for its successor: a Unix socket only its
//! user may connect to (mode 0600). The same for every driver: tokio waits
//! on it with its reactor, the io_uring server on a thread of its own.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The listening Unix socket, non-blocking, and its path.
pub(crate) struct HandoffSocket {
    pub(crate) listener: UnixListener,
    pub(crate) path: PathBuf,
}

impl HandoffSocket {
    /// Listens at `path`. A socket file already there is replaced if no
    /// process answers on it (left by one that ended), or if `replacing`
    /// (this process took over from the one that listens there); otherwise
    /// it is an error: another server is running.
    pub(crate) fn bind(path: &Path, replacing: bool) -> io::Result<Self> {
        let listener = match UnixListener::bind(path) {
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => {
                if !replacing && UnixStream::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "{}: another process listens for a successor there; \
                             take it over (--take-over) or pick another path",
                            path.display()
                        ),
                    ));
                }
                std::fs::remove_file(path)?;
                UnixListener::bind(path)?
            }
            bound => bound?,
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(HandoffSocket {
            listener,
            path: path.to_owned(),
        })
    }

    /// Waits for the next successor, looking every `every` whether
    /// `stopped` (the server is shutting down): `None` then. An accept that
    /// fails is logged and waited past. The stream returned blocks.
    pub(crate) fn wait(&self, every: Duration, stopped: impl Fn() -> bool) -> Option<UnixStream> {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let timeout = Timespec::try_from(every).unwrap_or(Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        });
        while !stopped() {
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "waiting for a successor failed");
                    std::thread::sleep(every);
                    continue;
                }
            }
            match self.listener.accept() {
                Ok((stream, _)) => match stream.set_nonblocking(false) {
                    Ok(()) => return Some(stream),
                    Err(error) => tracing::warn!(%error, "a successor's socket failed"),
                },
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => {
                    let path = self.path.display();
                    tracing::warn!(%error, %path, "accepting a successor failed");
                    std::thread::sleep(every);
                }
            }
        }
        None
    }
}
