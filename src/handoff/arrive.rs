//! The successor's side of a handoff, the same for every driver: meeting
//! the running process (its state applied, its listening sockets taken),
//! then taking in its connections batch by batch, each placed in a loop
//! through [`Loops::arrive`]. Blocking: it runs before the server starts
//! (meeting) and on a thread of its own (taking in).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::channel::Channel;
use super::protocol::{Received, Successor};
use super::{Arriving, Loops};
use crate::connection::endpoint::Endpoint;

/// Connects to the process listening at `path`, takes its server state
/// and hands it to `apply` (`ServerHandler::take_over_server`: the
/// predecessor learns whether it was taken), and its listening sockets
/// (at least one), non-blocking (see `set_nonblocking`).
pub(crate) fn meet(
    path: &Path,
    apply: impl FnOnce(&[u8]) -> Result<(), String>,
) -> io::Result<(Successor, Vec<std::net::TcpListener>)> {
    let stream = UnixStream::connect(path).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("taking over from {}: {error}", path.display()),
        )
    })?;
    let mut successor = Successor::meet(Channel::new(stream))?;
    let (state, listeners) = successor.receive_state()?;
    let refuse = |successor: &mut Successor, why: String| {
        let _ = successor.answer(Err(&why));
        Err(io::Error::new(io::ErrorKind::InvalidData, why))
    };
    if listeners.is_empty() {
        return refuse(&mut successor, "no listening socket handed over".into());
    }
    let listeners: Vec<_> = listeners
        .into_iter()
        .map(std::net::TcpListener::from)
        .collect();
    if let Some(not_tcp) = listeners.iter().find_map(|l| l.local_addr().err()) {
        return refuse(
            &mut successor,
            format!("a listening socket handed over is not TCP: {not_tcp}"),
        );
    }
    if let Err(why) = apply(&state) {
        return refuse(
            &mut successor,
            format!("the running process's state was refused: {why}"),
        );
    }
    for listener in &listeners {
        listener.set_nonblocking(true)?;
    }
    successor.answer(Ok(()))?;
    Ok((successor, listeners))
}

/// Takes in the connections the predecessor sends, each read and checked
/// before the batch is acknowledged, and hands them to `loops`. Runs until
/// the predecessor is done: true; false if it failed half-way (what it
/// did not send stays its own, and it serves on and accepts again: only
/// one process may, so this one closes what it took with 1012 and ends).
pub(crate) fn take_in(mut successor: Successor, loops: &dyn Loops, endpoint: &Endpoint) -> bool {
    let (limits, pool) = (endpoint.config.limits, endpoint.pool.clone());
    let mut taken = 0usize;
    loop {
        match successor.receive(|bytes| Arriving::read(bytes, limits, &pool)) {
            Ok(Received::Batch(batch)) => {
                taken += batch.len();
                for (arriving, fd) in batch {
                    loops.arrive(fd, arriving);
                }
            }
            Ok(Received::Done) => {
                tracing::info!(connections = taken, "took over every connection");
                return true;
            }
            Err(error) => {
                tracing::error!(%error, taken, "the handoff stopped; the rest stays with the running process");
                tracing::error!("the handoff failed half-way; closing what came (1012) and ending");
                endpoint.begin_spread(crate::Spread::over(std::time::Duration::ZERO));
                return false;
            }
        }
    }
}
