//! The tokio server's part in a handoff (feature `handoff`): listening for
//! a successor, freezing the groups and sending their connections, taking
//! back what a failed handoff leaves; and, in the successor, taking the
//! connections in. The protocol is `handoff::protocol`'s, the records
//! `handoff::record`'s; a connection's own part is its lifecycle's.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use super::group::{GroupShared, Incoming, Phase, least_loaded};
use crate::connection::endpoint::Endpoint;
use crate::connection::handler::ServerHandler;
use crate::connection::lifecycle::Env;
use crate::handoff::Arriving;
use crate::handoff::channel::Channel;
use crate::handoff::protocol::{
    ANSWER_TIMEOUT, Departure, Predecessor, Received, Successor, refused,
};

/// A tokio server's two sides of a handoff.
#[derive(Default)]
pub(super) struct Handoff {
    /// Where it waits for a successor.
    pub(super) socket: OnceLock<HandoffSocket>,
    /// Where it is to wait for one once its predecessor, which listens
    /// there now, is done: the path, and the word that it is (`true`) or
    /// that it failed (`false`: the path stays the predecessor's).
    pub(super) later: Option<(PathBuf, Option<watch::Receiver<Option<bool>>>)>,
    /// Where it took over from, and the channel the predecessor's
    /// connections come on (its state was applied already).
    pub(super) predecessor: Option<(PathBuf, Successor)>,
}

impl Handoff {
    /// If this server took over: takes in the predecessor's connections on
    /// a thread of its own (see [`take_in`]), before anything is accepted.
    pub(super) fn take_in<S: Send + 'static>(
        &mut self,
        groups: &[Arc<GroupShared<S>>],
        endpoint: &Arc<Endpoint>,
    ) -> io::Result<()> {
        let Some((_, successor)) = self.predecessor.take() else {
            return Ok(());
        };
        let (done, finished) = watch::channel(None);
        if let Some((_, waiting)) = &mut self.later {
            *waiting = Some(finished);
        }
        let (groups, endpoint) = (groups.to_vec(), endpoint.clone());
        std::thread::Builder::new()
            .name("rapidws-take-over".into())
            .spawn(move || {
                let whole = take_in(successor, groups, endpoint.clone());
                if !whole {
                    // The predecessor serves on with what it did not hand
                    // over, and accepts again: only one process may.
                    tracing::error!(
                        "the handoff failed half-way; closing what came (1012) and ending"
                    );
                    endpoint.begin_spread(crate::Spread::over(std::time::Duration::ZERO));
                }
                let _ = done.send(Some(whole));
            })?;
        Ok(())
    }

    /// The next successor to connect (never, without a handoff socket).
    /// An accept that fails is logged and waited past.
    pub(super) async fn successor(&self) -> UnixStream {
        if self.socket.get().is_none()
            && let Some((path, Some(finished))) = &self.later
        {
            let mut finished = finished.clone();
            let whole = finished.wait_for(Option::is_some).await.map(|w| *w);
            if whole.ok().flatten() != Some(true) {
                // The predecessor serves on: its path stays its own.
                return std::future::pending().await;
            }
            match HandoffSocket::bind(path, true) {
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

    /// Hands the server to `successor` (see [`hand_off`]): true if it has
    /// everything now, and this server is to end.
    pub(super) async fn hand_off<H: ServerHandler>(
        &self,
        successor: UnixStream,
        listener: &tokio::io::unix::AsyncFd<mio::net::TcpListener>,
        groups: &[Arc<GroupShared<H::State>>],
        env: &Env<H>,
    ) -> io::Result<bool> {
        let listener = listener.get_ref().as_fd().try_clone_to_owned()?;
        Ok(hand_off(successor, listener, groups, env).await)
    }
}

/// Where a running server waits for its successor: a Unix socket only its
/// user may connect to (mode 0600).
pub(crate) struct HandoffSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
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
            listener: tokio::net::UnixListener::from_std(listener)?,
            path: path.to_owned(),
        })
    }

    /// The next successor to connect.
    pub(crate) async fn accept(&self) -> io::Result<UnixStream> {
        let (stream, _) = self.listener.accept().await?;
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

/// Connects to the process listening at `path`, takes its server state
/// and hands it to `apply` (`ServerHandler::take_over_server`: the
/// predecessor learns whether it was taken), and its listening socket.
pub(super) async fn meet(
    path: &Path,
    apply: impl FnOnce(&[u8]) -> Result<(), String> + Send + 'static,
) -> io::Result<(Successor, std::net::TcpListener)> {
    let path = path.to_owned();
    blocking(move || {
        let stream = UnixStream::connect(&path).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("taking over from {}: {error}", path.display()),
            )
        })?;
        let mut successor = Successor::meet(Channel::new(stream))?;
        let (state, listeners) = successor.receive_state()?;
        let listener = match <[OwnedFd; 1]>::try_from(listeners) {
            Ok([listener]) => listener,
            Err(fds) => {
                let why = format!("{} listening sockets handed over, not one", fds.len());
                let _ = successor.answer(Err(&why));
                return Err(io::Error::new(io::ErrorKind::InvalidData, why));
            }
        };
        if let Err(why) = apply(&state) {
            let _ = successor.answer(Err(&why));
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the running process's state was refused: {why}"),
            ));
        }
        successor.answer(Ok(()))?;
        let listener = std::net::TcpListener::from(listener);
        listener.set_nonblocking(true)?;
        Ok((successor, listener))
    })
    .await
}

/// Runs `f`, which waits on the handoff's channel, on tokio's blocking
/// threads; a panic in it is an error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)?
}

/// Takes in the connections the predecessor sends, each read and checked
/// before the batch is acknowledged, and hands them to the groups. Runs on
/// a thread of its own until the predecessor is done (or fails: what it
/// did not send stays its own).
fn take_in<S: Send + 'static>(
    mut successor: Successor,
    groups: Vec<Arc<GroupShared<S>>>,
    endpoint: Arc<Endpoint>,
) -> bool {
    let (limits, pool) = (endpoint.config.limits, endpoint.pool.clone());
    let mut taken = 0usize;
    loop {
        match successor.receive(|bytes| Arriving::read(bytes, limits, &pool)) {
            Ok(Received::Batch(batch)) => {
                taken += batch.len();
                for (arriving, fd) in batch {
                    least_loaded(&groups).hand_over(Incoming::moved(fd, arriving, &endpoint));
                }
            }
            Ok(Received::Done) => {
                tracing::info!(connections = taken, "took over every connection");
                return true;
            }
            Err(error) => {
                tracing::error!(%error, taken, "the handoff stopped; the rest stays with the running process");
                return false;
            }
        }
    }
}

/// Hands the server to the successor on `stream`: stops handling
/// requests (so nothing is published here any more), sends the server's
/// state and the listening socket `listener`, then has each group give up
/// a batch at a time, each sent and acknowledged before the next leaves it
/// (a connection is frozen for its batch's trip only); a few passes, for
/// connections that could not move at the first (a reply being written).
/// True once the successor has everything; false if the handoff failed:
/// the batch it did not take is back in the groups, requests are handled
/// again, and the server goes on with the connections it has, accepting.
async fn hand_off<H: ServerHandler>(
    stream: UnixStream,
    listener: OwnedFd,
    groups: &[Arc<GroupShared<H::State>>],
    env: &Env<H>,
) -> bool {
    let mut predecessor = match blocking(move || Predecessor::greet(Channel::new(stream))).await {
        Ok(predecessor) => predecessor,
        Err(error) => {
            tracing::error!(%error, "a successor connected, but the handoff could not begin");
            return false;
        }
    };
    let began = std::time::Instant::now();
    let endpoint = &env.endpoint;
    // No request is handled from here on (on any thread: a group, a wss
    // connection's task); once none is being handled, nothing publishes.
    endpoint.freeze_requests(true);
    if !requests_settled(endpoint).await {
        predecessor.abandon();
        tracing::error!("a request was still being handled after 10 s; the handoff gives up");
        return serve_on(groups, env, false).await;
    }
    let state = env.handler.hand_off_server();
    let sent = tokio::task::spawn_blocking(move || {
        let sent = predecessor.send_state(&state, &[listener.as_fd()]);
        (predecessor, sent)
    })
    .await;
    predecessor = match sent {
        Ok((predecessor, Ok(()))) => predecessor,
        Ok((predecessor, Err(error))) => {
            predecessor.abandon();
            tracing::error!(%error, "the successor did not take the server's state; serving on");
            // Unless it refused, it may have taken it all the same.
            return serve_on(groups, env, !refused(&error)).await;
        }
        Err(error) => {
            tracing::error!(%error, "the handoff's thread failed; serving on");
            return serve_on(groups, env, true).await;
        }
    };
    let mut handed = 0;
    // Passes until one moves nothing after PASSES_FOR: a connection still
    // writing an answer moves once it is written.
    let passing = std::time::Instant::now();
    loop {
        let before = handed;
        for group in groups {
            let mut from = Some(0);
            while let Some(slot) = from {
                let (batch, next) = ask(group, slot, Phase::Move).await;
                from = next;
                if batch.is_empty() {
                    continue;
                }
                let sent = tokio::task::spawn_blocking(move || {
                    let sent = predecessor.send_batch(&batch);
                    (predecessor, sent, batch)
                })
                .await;
                let (back, error, batch) = match sent {
                    Ok((back, Ok(()), batch)) => {
                        predecessor = back;
                        handed += batch.len();
                        // The successor's now: our descriptors close.
                        drop(batch);
                        continue;
                    }
                    Ok((back, Err(error), batch)) => (back, error, batch),
                    Err(error) => {
                        // The sending thread panicked: its batch went with it.
                        tracing::error!(%error, "the handoff's thread failed");
                        return serve_on(groups, env, true).await;
                    }
                };
                back.abandon();
                tracing::error!(
                    %error,
                    handed,
                    "the handoff failed; serving on with the connections not handed over"
                );
                take_back(batch, groups, endpoint);
                return serve_on(groups, env, true).await;
            }
        }
        if handed == before {
            if passing.elapsed() >= PASSES_FOR {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    if let Err(error) = blocking(move || predecessor.finish()).await {
        // It has every connection; only its last word is missing.
        tracing::warn!(%error, "the successor did not acknowledge the handoff's end");
    }
    tracing::info!(
        connections = handed,
        ms = began.elapsed().as_millis() as u64,
        "handed every connection that can move to the successor"
    );
    true
}

/// Asks `group` for `phase` from `slot` on: a batch, and where to go on.
/// A group that ended has nothing (its task drops the request; the timeout
/// is a backstop, after which a late batch stays with the group).
async fn ask<S>(group: &GroupShared<S>, slot: u32, phase: Phase) -> (Vec<Departure>, Option<u32>) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    group.hand_off(slot, phase, reply);
    let answered = tokio::time::timeout(ANSWER_TIMEOUT, answer).await;
    answered.ok().and_then(Result::ok).unwrap_or_default()
}

/// How long the handoff goes on passing over the groups for connections
/// that could not move yet (a reply being written).
const PASSES_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// Waits (at most `ANSWER_TIMEOUT`) until no request is being handled
/// anywhere; false if one still is then.
async fn requests_settled(endpoint: &Endpoint) -> bool {
    let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
    while endpoint.requests_handled() > 0 {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    true
}

/// After a failed handoff (false, for `hand_off` to return): with
/// `disown`, the server's state may be in the successor's hands, and the
/// handler disowns what it does with it (`take_back_server`); requests are
/// handled again, and every group's connections get a turn (a request
/// that waited whole in its buffer is handled now).
async fn serve_on<H: ServerHandler>(
    groups: &[Arc<GroupShared<H::State>>],
    env: &Env<H>,
    disown: bool,
) -> bool {
    if disown {
        env.handler.take_back_server();
    }
    env.endpoint.freeze_requests(false);
    for group in groups {
        ask(group, 0, Phase::Thaw).await;
    }
    false
}

/// Connections a failed handoff did not hand over, back in the groups.
fn take_back<S>(batch: Vec<Departure>, groups: &[Arc<GroupShared<S>>], endpoint: &Arc<Endpoint>) {
    for incoming in Incoming::taken_back(batch, endpoint) {
        least_loaded(groups).hand_over(incoming);
    }
}
