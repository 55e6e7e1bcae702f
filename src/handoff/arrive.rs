//! The successor's side of a handoff, the same for every driver: meeting
//! the running process (its user checked, its state applied), then taking
//! in its connections batch by batch, each placed in a loop through
//! [`Loops::arrive`], and last its listening sockets. Blocking: it runs
//! before the server starts (meeting) and on a thread of its own (taking
//! in).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::channel::Channel;
use super::identity;
use super::protocol::{Received, Successor};
use super::{Arriving, Loops};
use crate::connection::hub::Hub;

/// Connects to the process listening at `path`, checks that it runs as
/// this process's user (before reading a byte from it), takes its server
/// state and hands it to `apply` (`ServerHandler::take_over_server`: the
/// predecessor learns whether it was taken). The listening sockets come
/// at the end of [`take_in`]; the successor returned knows where they
/// listen ([`Successor::announced`]).
pub(crate) fn meet(
    path: &Path,
    apply: impl FnOnce(&[u8]) -> Result<(), String>,
) -> io::Result<Successor> {
    let stream = UnixStream::connect(path).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("taking over from {}: {error}", path.display()),
        )
    })?;
    identity::check_predecessor(&stream, path)?;
    let mut successor = Successor::meet(Channel::new(stream))?;
    let state = successor.receive_state()?;
    if let Err(why) = apply(&state) {
        let why = format!("the running process's state was refused: {why}");
        let _ = successor.answer(Err(&why));
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    successor.answer(Ok(()))?;
    Ok(successor)
}

/// Takes in the connections the predecessor sends, each read and checked
/// before the batch is acknowledged, and hands them to `loops`; then the
/// listening sockets, checked against what was announced, non-blocking
/// (see `set_nonblocking`). Runs until the predecessor is done: the
/// listening sockets, to accept on from now; `None` if it failed half-way
/// (what it did not send stays its own, with the listening sockets, and
/// it serves on and accepts again: only one process may, so this one
/// closes what it took with 1012 and ends).
pub(crate) fn take_in(
    mut successor: Successor,
    loops: &dyn Loops,
    hub: &Hub,
) -> Option<Vec<TcpListener>> {
    let (limits, pool) = (hub.config.limits, hub.pool.clone());
    let mut taken = 0usize;
    let failed = loop {
        match successor.receive(|bytes| Arriving::read(bytes, limits, &pool)) {
            Ok(Received::Batch(batch)) => {
                taken += batch.len();
                for (arriving, fd) in batch {
                    loops.arrive(fd, arriving);
                }
            }
            Ok(Received::Done(fds)) => match listening(fds, successor.announced()) {
                Ok(listeners) => match successor.answer(Ok(())) {
                    Ok(()) => {
                        tracing::info!(connections = taken, "took over every connection");
                        return Some(listeners);
                    }
                    // It gave up on us: the sockets close here unused.
                    Err(error) => break error,
                },
                Err(why) => {
                    let _ = successor.answer(Err(&why));
                    break io::Error::new(io::ErrorKind::InvalidData, why);
                }
            },
            Err(error) => break error,
        }
    };
    tracing::error!(error = %failed, taken, "the handoff stopped; the rest stays with the running process");
    tracing::error!("the handoff failed half-way; closing what came (1012) and ending");
    hub.begin_spread(crate::Spread::over(std::time::Duration::ZERO));
    None
}

/// The listening sockets that came with the end: as many as announced,
/// each a TCP socket listening where it was said to, made non-blocking.
fn listening(fds: Vec<OwnedFd>, announced: &[SocketAddr]) -> Result<Vec<TcpListener>, String> {
    if fds.len() != announced.len() {
        return Err(format!(
            "{} listening sockets came, {} were announced",
            fds.len(),
            announced.len()
        ));
    }
    let mut listeners = Vec::with_capacity(fds.len());
    for (fd, addr) in fds.into_iter().zip(announced) {
        if !rustix::net::sockopt::socket_acceptconn(&fd).unwrap_or(false) {
            return Err("a socket handed over to listen on does not listen".into());
        }
        let listener = TcpListener::from(fd);
        match listener.local_addr() {
            Ok(local) if local == *addr => {}
            Ok(local) => return Err(format!("a socket announced at {addr} listens at {local}")),
            Err(error) => {
                return Err(format!(
                    "a listening socket handed over is not TCP: {error}"
                ));
            }
        }
        listener
            .set_nonblocking(true)
            .map_err(|error| format!("a listening socket handed over: {error}"))?;
        listeners.push(listener);
    }
    Ok(listeners)
}
