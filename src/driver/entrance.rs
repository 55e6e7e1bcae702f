//! The way into a socket server for connections accepted elsewhere: a
//! router's, or an accept loop of the user's.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;

use crate::connection::hub::{Hub, LiveGuard};

/// Hands connections accepted elsewhere to a socket server (tokio's
/// groups, or io_uring's reactors), each with the bytes already read from
/// it (a `Router`'s sniffed bytes): from then on it is served as the
/// server's own accepted connections are (on a group's epoll with no task
/// of its own, or in a reactor's ring), under the same handler, config,
/// limits, metrics and shutdown. Cheap to clone; get it from the server's
/// `entrance()` before `serve` runs.
///
/// A connection comes in plain: its HTTP request is next (after `read`).
/// TLS terminated elsewhere is a stream, not a socket: serve it with the
/// stream driver (`rapidws::stream`). A PROXY protocol header, if the
/// listener's clients send one, is the router's to read (its
/// `proxy_protocol`); the address it names is the `peer` given here.
#[derive(Clone)]
pub struct Entrance {
    door: Arc<Door>,
}

impl std::fmt::Debug for Entrance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entrance")
            .field("open", &admit_of(&self.door).is_some())
            .finish_non_exhaustive()
    }
}

/// Shared by a server and its entrances: open while `serve` runs.
pub(crate) struct Door {
    hub: Arc<Hub>,
    admit: Mutex<Option<AdmitFn>>,
}

/// Hands one connection to one of the server's loops: the socket, its
/// peer, its place in the live count, and what was read from it.
pub(crate) type AdmitFn = Box<dyn Fn(TcpStream, SocketAddr, LiveGuard, BytesMut) + Send + Sync>;

impl Door {
    pub(crate) fn new(hub: Arc<Hub>) -> Arc<Door> {
        Arc::new(Door {
            hub,
            admit: Mutex::new(None),
        })
    }

    /// Opens the door, each connection going through `admit`, until the
    /// returned guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, admit: AdmitFn) -> Open {
        *admit_of(self) = Some(admit);
        Open(self.clone())
    }
}

/// The door is open while this lives: dropped before the server's loops
/// are told that no more connections will come, so none is handed over
/// after that.
pub(crate) struct Open(Arc<Door>);

impl Drop for Open {
    fn drop(&mut self) {
        *admit_of(&self.0) = None;
    }
}

/// The door's admitting function, even if a thread panicked holding it.
fn admit_of(door: &Door) -> std::sync::MutexGuard<'_, Option<AdmitFn>> {
    door.admit
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Entrance {
    pub(crate) fn new(door: Arc<Door>) -> Entrance {
        Entrance { door }
    }

    /// Serves `stream`, whose peer is `peer` and from which `read` was
    /// already read (the start of its request; may be empty), on the
    /// server's least loaded group (tokio) or its next reactor (io_uring).
    /// The handshake timeout starts now.
    ///
    /// Refused, with the stream closed, when the server is not serving:
    /// before `serve` runs, once it returned, and once its shutdown began
    /// (`ErrorKind::NotConnected`).
    #[cfg(feature = "stream")]
    pub fn admit(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        read: BytesMut,
    ) -> io::Result<()> {
        // Out of tokio's reactor: the server watches it itself.
        self.admit_std(stream.into_std()?, peer, read)
    }

    /// [`Entrance::admit`] for a standard library socket (blocking or not).
    pub fn admit_std(&self, stream: TcpStream, peer: SocketAddr, read: BytesMut) -> io::Result<()> {
        let admit = admit_of(&self.door);
        let Some(admit) = admit.as_ref().filter(|_| !self.door.hub.is_shutting_down()) else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the server is not serving: not started, shutting down or ended",
            ));
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "could not set TCP_NODELAY");
        }
        // Counted before it is handed over, so a shutdown waits for it.
        admit(stream, peer, self.door.hub.enter(), read);
        Ok(())
    }
}
