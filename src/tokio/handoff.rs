//! The tokio server's part in a handoff (feature `handoff`): waiting for
//! a successor on tokio's reactor, its groups as the handoff's [`Loops`];
//! and, in the successor, the predecessor's connections taken in (it was
//! met before the server started: `driver/surface.rs`). What both sides
//! do is `handoff::leave` and `handoff::arrive` (the same for io_uring); a
//! group's part is in `group.rs`, a connection's in its lifecycle.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};

use super::group::{GroupShared, Incoming, least_loaded};
use crate::connection::handler::ServerHandler;
use crate::connection::hub::Hub;
use crate::connection::lifecycle::Env;
use crate::connection::record::Arriving;
use crate::driver::surface::HandoffSettings;
use crate::handoff::protocol::Successor;
use crate::handoff::socket::HandoffSocket;
use crate::handoff::{Leaving, Loops, Phase, arrive, leave};

/// A tokio server's two sides of a handoff, as it serves.
pub(super) struct Handoff {
    /// Where it waits for a successor.
    socket: OnceLock<Waiting>,
    /// Where it is to wait for one once its predecessor, which listens
    /// there now, is done: the path, and the word that it is (`true`) or
    /// that it failed (`false`: the path stays the predecessor's).
    later: Option<(PathBuf, Option<watch::Receiver<Option<bool>>>)>,
    /// The channel the predecessor's connections come on, if this server
    /// took over (its state was applied already).
    predecessor: Option<Successor>,
    /// How what stays is closed once a successor has the rest.
    after: crate::Spread,
}

impl Handoff {
    /// What the builder set, on tokio's reactor (the handoff socket is
    /// watched from here on).
    pub(super) fn new(settings: HandoffSettings) -> io::Result<Self> {
        let after = settings.after_spread();
        let HandoffSettings {
            socket,
            later,
            predecessor,
            ..
        } = settings;
        let socket = match socket {
            Some(socket) => OnceLock::from(Waiting::on_tokio(socket)?),
            None => OnceLock::new(),
        };
        Ok(Handoff {
            socket,
            later: later.map(|path| (path, None)),
            predecessor: predecessor.map(|(_, successor)| successor),
            after,
        })
    }

    /// How what stays is closed once a successor has the rest.
    pub(super) fn after_spread(&self) -> crate::Spread {
        self.after.clone()
    }

    /// If this server took over: takes in the predecessor's connections on
    /// a thread of its own (see `handoff::arrive::take_in`); its listening
    /// sockets come last, through what is returned.
    pub(super) fn take_in<S: Send + 'static>(
        &mut self,
        groups: &[Arc<GroupShared<S>>],
        hub: &Arc<Hub>,
    ) -> io::Result<Coming> {
        let Some(successor) = self.predecessor.take() else {
            return Ok(Coming(None));
        };
        let (done, finished) = watch::channel(None);
        if let Some((_, waiting)) = &mut self.later {
            *waiting = Some(finished);
        }
        let (give, coming) = oneshot::channel();
        let groups = GroupLoops {
            groups: groups.to_vec(),
            hub: hub.clone(),
        };
        std::thread::Builder::new()
            .name("rapidws-take-over".into())
            .spawn(move || {
                let listeners = arrive::take_in(successor, &groups, &groups.hub);
                let whole = listeners.is_some();
                if let Some(listeners) = listeners {
                    // Before the word that it is done: the accept loop
                    // has them by the time a successor of ours can come.
                    let _ = give.send(listeners);
                }
                let _ = done.send(Some(whole));
            })?;
        Ok(Coming(Some(coming)))
    }

    /// The next successor to connect and show that it is one (see
    /// `handoff::leave::meet`: its user, its greeting, on a blocking
    /// thread); never, without a handoff socket. Until it returns the
    /// server serves and accepts as ever; keep the future across turns
    /// (it is not to be dropped midway: a greeting under way would be).
    pub(super) async fn successor(&self) -> leave::Met {
        loop {
            let stream = self.connected().await;
            match tokio::task::spawn_blocking(move || leave::meet(stream)).await {
                Ok(Some(met)) => return met,
                Ok(None) => {}
                Err(error) => tracing::error!(%error, "meeting a successor failed"),
            }
        }
    }

    /// The next process to connect to the handoff socket (never, without
    /// one). An accept that fails is logged and waited past.
    async fn connected(&self) -> UnixStream {
        if self.socket.get().is_none()
            && let Some((path, Some(finished))) = &self.later
        {
            let mut finished = finished.clone();
            let whole = finished.wait_for(Option::is_some).await.map(|w| *w);
            if whole.ok().flatten() != Some(true) {
                // The predecessor serves on: its path stays its own.
                return std::future::pending().await;
            }
            match Waiting::bind(path, true) {
                Ok(socket) => {
                    tracing::info!(path = %path.display(), "listening for a successor");
                    let _ = self.socket.set(socket);
                }
                Err(error) => {
                    tracing::error!(%error, path = %path.display(), "cannot listen for a successor");
                    return std::future::pending().await;
                }
            }
        }
        let Some(socket) = self.socket.get() else {
            return std::future::pending().await;
        };
        loop {
            match socket.accept().await {
                Ok(stream) => return stream,
                Err(error) => {
                    let path = socket.path.display();
                    tracing::warn!(%error, %path, "accepting a successor failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Hands the server to `successor` (see `handoff::leave::hand_off`,
    /// run on a blocking thread): true if it has everything now, and this
    /// server is to end; false if it failed, and the server serves on.
    pub(super) async fn hand_off<H: ServerHandler>(
        &self,
        successor: leave::Met,
        listeners: &[AsyncFd<mio::net::TcpListener>],
        groups: &[Arc<GroupShared<H::State>>],
        env: &Env<H>,
    ) -> io::Result<bool> {
        let fds = listeners
            .iter()
            .map(|listener| listener.get_ref().as_fd().try_clone_to_owned())
            .collect::<io::Result<Vec<OwnedFd>>>()?;
        let loops = GroupLoops {
            groups: groups.to_vec(),
            hub: env.hub.clone(),
        };
        let env = env.clone();
        tokio::task::spawn_blocking(move || leave::hand_off(successor, &fds, &loops, &env))
            .await
            .map_err(io::Error::other)
    }
}

/// The predecessor's listening sockets on their way (from the end of the
/// handoff), if this server took over.
pub(super) struct Coming(Option<oneshot::Receiver<Vec<std::net::TcpListener>>>);

impl Coming {
    /// The listening sockets, once they come; never, if they do not (the
    /// handoff failed, and this server is closing what came).
    pub(super) async fn listeners(&mut self) -> Vec<std::net::TcpListener> {
        let Some(coming) = &mut self.0 else {
            return std::future::pending().await;
        };
        let listeners = coming.await;
        self.0 = None;
        match listeners {
            Ok(listeners) => listeners,
            Err(_) => std::future::pending().await,
        }
    }
}

/// The handoff socket on tokio's reactor.
pub(super) struct Waiting {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Waiting {
    /// Listens at `path` (see [`HandoffSocket::bind`]).
    fn bind(path: &Path, replacing: bool) -> io::Result<Self> {
        Waiting::on_tokio(HandoffSocket::bind(path, replacing)?)
    }

    /// `socket`, watched by tokio's reactor.
    fn on_tokio(socket: HandoffSocket) -> io::Result<Self> {
        let HandoffSocket { listener, path } = socket;
        Ok(Waiting {
            listener: tokio::net::UnixListener::from_std(listener)?,
            path,
        })
    }

    /// The next successor to connect.
    async fn accept(&self) -> io::Result<UnixStream> {
        let (stream, _) = self.listener.accept().await?;
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

/// The groups, as the handoff sees them.
struct GroupLoops<S> {
    groups: Vec<Arc<GroupShared<S>>>,
    hub: Arc<Hub>,
}

impl<S: Send + 'static> Loops for GroupLoops<S> {
    fn count(&self) -> usize {
        self.groups.len()
    }

    fn post(&self, index: usize, slot: u32, phase: Phase, reply: Leaving) {
        self.groups[index].hand_off(slot, phase, reply);
    }

    fn arrive(&self, fd: OwnedFd, arriving: Arriving) {
        least_loaded(&self.groups).hand_over(Incoming::moved(fd, arriving, &self.hub));
    }
}
