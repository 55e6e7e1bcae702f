//! Where a running server waits for its successor: a Unix socket only its
//! user may connect to (mode 0600), from the instant its path names it.
//! The same for every driver: tokio waits on it with its reactor, the
//! io_uring server on a thread of its own. Who connects is checked too
//! (`identity.rs`); this file makes sure that nobody else can.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
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
    /// it is an error: another server is running. Anything there that is
    /// not a socket is left alone (an error). The directory that holds it
    /// must be one no other user can change: see [`check_directory`].
    pub(crate) fn bind(path: &Path, replacing: bool) -> io::Result<Self> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        check_directory(dir)?;
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists and is not a socket", path.display()),
                ));
            }
            Ok(_) if !replacing && UnixStream::connect(path).is_ok() => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{}: another process listens for a successor there; \
                         take it over (--take-over) or pick another path",
                        path.display()
                    ),
                ));
            }
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        // No window in which another user could connect. The socket is
        // bound inside a directory made for it just now, mode 0700 (a
        // umask only takes bits away), which no other user may enter: and
        // connecting needs to search every directory on the way. There it
        // is made 0600, then renamed to `path`, which names it from then on
        // with that mode, and which names the old socket until then (a
        // stale file or the predecessor's is replaced in one step, never
        // missing in between). Not a umask around bind (it is the whole
        // process's, so other threads' files would race with it), nor a
        // mode set on the socket before bind (`fchmod`: Linux honours it
        // today, but documents it nowhere, so nothing would tell us if it
        // stopped).
        let private = Private::new(dir)?;
        let inside = private.0.join("s");
        let listener = UnixListener::bind(&inside).map_err(|error| {
            // (A path near the 108 bytes a Unix socket's may take fails
            // here: this one is about 20 longer than `path`'s directory.)
            io::Error::new(
                error.kind(),
                format!(
                    "binding the handoff socket at {}: {error}",
                    inside.display()
                ),
            )
        })?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inside, path)?;
        drop(private);
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

/// Checks that `dir` (where the handoff socket goes) belongs to this
/// process's user or to root, and that no other user may write to it
/// unless it is sticky (as /tmp is: then nobody can remove or rename
/// another user's file there). Otherwise another user could swap the
/// socket for one of their own, or take the path away.
fn check_directory(dir: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(dir).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("the handoff socket's directory {}: {error}", dir.display()),
        )
    })?;
    let own = super::identity::own_uid();
    let mode = meta.mode();
    let why = if !meta.is_dir() {
        Some("is not a directory".to_owned())
    } else if meta.uid() != own && meta.uid() != 0 {
        Some(format!(
            "belongs to uid {}, not to this process's (uid {own}) or root",
            meta.uid()
        ))
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        Some(format!(
            "is writable by other users (mode {:o}) and not sticky",
            mode & 0o7777
        ))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the handoff socket's directory {} {why}: another user could replace \
                 the socket; use a directory only this user (or root) may change",
                dir.display()
            ),
        )),
    }
}

/// A directory of our own beside the handoff socket's path, mode 0700,
/// removed with whatever is left in it when dropped.
struct Private(PathBuf);

impl Private {
    fn new(dir: &Path) -> io::Result<Private> {
        let mut tries = 0;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let tag = (u64::from(std::process::id()) << 32) | u64::from(nanos);
            let private = dir.join(format!(".rapidws-{tag:x}"));
            // Created here, so ours: another user cannot have made it, nor
            // (the directory being ours or sticky) move it.
            match std::fs::DirBuilder::new().mode(0o700).create(&private) {
                Ok(()) => return Ok(Private(private)),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && tries < 16 => {
                    tries += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("s"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rapidws-handoff-socket-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
        dir
    }

    #[test]
    fn the_socket_is_0600_and_nothing_else_is_left_beside_it() {
        let dir = scratch("mode");
        let path = dir.join("h.sock");
        let socket = HandoffSocket::bind(&path, false).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["h.sock"]);
        // It answers at `path`, though it was bound elsewhere.
        UnixStream::connect(&path).unwrap();
        assert!(socket.listener.accept().is_ok());
        // A live one is not replaced; one that nobody listens on is.
        assert_eq!(
            HandoffSocket::bind(&path, false).err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        drop(socket);
        let again = HandoffSocket::bind(&path, false).unwrap();
        UnixStream::connect(&path).unwrap();
        assert!(again.listener.accept().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_is_not_a_socket_is_left_alone() {
        let dir = scratch("file");
        let path = dir.join("h.sock");
        std::fs::write(&path, b"keep me").unwrap();
        let error = HandoffSocket::bind(&path, true).err().unwrap();
        assert!(error.to_string().contains("not a socket"), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_to_is_refused_unless_sticky() {
        let dir = scratch("open");
        for (mode, refused) in [
            (0o777, true),
            (0o775, true),
            (0o1777, false),
            (0o755, false),
        ] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let bound = HandoffSocket::bind(&dir.join("h.sock"), true);
            assert_eq!(bound.is_err(), refused, "mode {mode:o}");
            if let Err(error) = bound {
                assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
                assert!(
                    error.to_string().contains("writable by other users"),
                    "{error}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
