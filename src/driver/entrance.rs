//! The way into a socket server for connections accepted elsewhere: a
//! router's, or an accept loop of the user's.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;

use crate::connection::hub::{Hub, LiveGuard};

/// Connections admitted before `serve` runs wait for it, at most this
/// many; more are refused.
const WAITING_MAX: usize = 1024;

/// Hands connections accepted elsewhere to a socket server (tokio's
/// groups, or io_uring's reactors), each with the bytes already read from
/// it (a `Router`'s sniffed bytes): from then on it is served as the
/// server's own accepted connections are (on a group's epoll with no task
/// of its own, or in a reactor's ring), under the same handler, config,
/// limits, metrics and shutdown. Cheap to clone; get it from the server's
/// `entrance()`.
///
/// A connection comes in plain: its HTTP request is next (after `read`).
/// TLS terminated elsewhere is a stream, not a socket: serve it with the
/// stream driver (`rapidws::stream`). A PROXY protocol header, if the
/// listener's clients send one, is the router's to read (its
/// `proxy_protocol`); the address it names is the `peer` given here.
///
/// Connections admitted before `serve` runs wait for it (at most 1,024),
/// so a router may listen before its server starts; they are closed if
/// the server is dropped without serving.
#[derive(Clone)]
pub struct Entrance {
    door: Arc<Door>,
}

impl std::fmt::Debug for Entrance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*state_of(&self.door) {
            State::Waiting(waiting) => format!("waiting for serve ({} connections)", waiting.len()),
            State::Open(_) => "open".to_owned(),
            State::Closed => "closed".to_owned(),
        };
        f.debug_struct("Entrance")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// Shared by a server and its entrances.
struct Door {
    hub: Arc<Hub>,
    state: Mutex<State>,
}

/// Where a door is in its server's life.
enum State {
    /// `serve` has not run yet: what came waits for it.
    Waiting(Vec<Admitted>),
    /// `serve` runs: each connection goes straight to a loop.
    Open(AdmitFn),
    /// `serve` ended: nothing more is taken.
    Closed,
}

/// A connection admitted: its socket, its peer, its place in the live
/// count, and what was read from it.
pub(crate) type Admitted = (TcpStream, SocketAddr, LiveGuard, BytesMut);

/// Hands one connection to one of the server's loops.
pub(crate) type AdmitFn = Box<dyn Fn(Admitted) + Send + Sync>;

/// The server's hold on its door: `serve` opens it, and it closes when
/// this is dropped (with `serve`'s end, or with a server that never
/// served: what waited is closed then). Dropped before the server's loops
/// are told that no more connections will come, so none is handed over
/// after that.
pub(crate) struct Keeper(Arc<Door>);

impl Keeper {
    /// A server's door, waiting for `serve`; closed when this is dropped.
    pub(crate) fn new(hub: Arc<Hub>) -> Keeper {
        Keeper(Arc::new(Door {
            hub,
            state: Mutex::new(State::Waiting(Vec::new())),
        }))
    }

    /// An entrance through this door.
    pub(crate) fn entrance(&self) -> Entrance {
        Entrance {
            door: self.0.clone(),
        }
    }

    /// Opens the door, each connection going through `admit`, those that
    /// waited first.
    pub(crate) fn open(&self, admit: AdmitFn) {
        let mut state = state_of(&self.0);
        if let State::Waiting(waiting) = std::mem::replace(&mut *state, State::Closed) {
            for admitted in waiting {
                admit(admitted);
            }
        }
        *state = State::Open(admit);
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let closed = std::mem::replace(&mut *state_of(&self.0), State::Closed);
        // What waited is closed here, outside the lock.
        drop(closed);
    }
}

/// The door's state, even if a thread panicked holding it.
fn state_of(door: &Door) -> std::sync::MutexGuard<'_, State> {
    door.state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Entrance {
    /// Serves `stream`, whose peer is `peer` and from which `read` was
    /// already read (the start of its request; may be empty), on the
    /// server's least loaded group (tokio) or its next reactor (io_uring).
    /// Its handshake timeout starts when a loop takes it.
    ///
    /// Before `serve` runs, the connection waits for it. Refused, with
    /// the stream closed, once the shutdown began, once `serve` returned
    /// (or the server was dropped), or with 1,024 connections waiting
    /// already (`ErrorKind::NotConnected`).
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
        let refused = |why: &str| Err(io::Error::new(io::ErrorKind::NotConnected, why));
        if self.door.hub.is_shutting_down() {
            return refused("the server is shutting down");
        }
        match &mut *state_of(&self.door) {
            State::Closed => refused("the server is not serving any more"),
            State::Waiting(waiting) if waiting.len() >= WAITING_MAX => {
                refused("too many connections wait for the server to serve")
            }
            State::Waiting(waiting) => {
                waiting.push(self.admitted(stream, peer, read));
                Ok(())
            }
            State::Open(admit) => {
                admit(self.admitted(stream, peer, read));
                Ok(())
            }
        }
    }

    /// `stream` made ready for a loop, and counted live from now, so a
    /// shutdown waits for it.
    fn admitted(&self, stream: TcpStream, peer: SocketAddr, read: BytesMut) -> Admitted {
        crate::driver::tcp::prepare(&stream, &self.door.hub.config, peer);
        (stream, peer, self.door.hub.enter(), read)
    }
}
