//! The running process's side of a handoff, the same for every driver: it
//! runs on a thread of its own (it waits on the channel and on the loops),
//! and reaches the server's loops through [`Loops`].

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::channel::Channel;
use super::identity;
use super::protocol::Predecessor;
use super::{LOOP_TIMEOUT, Loops, Phase, ask, take_back};
use crate::connection::handler::ServerHandler;
use crate::connection::hub::Hub;
use crate::connection::lifecycle::Env;

/// How long the handoff goes on passing over the loops for connections
/// that could not move yet (a reply being written).
const PASSES_FOR: Duration = Duration::from_millis(300);

/// A successor that connected and showed that it is one: the kernel
/// says it runs as our user or root (`SO_PEERCRED`), and it greeted back
/// as a successor does. Nothing in the server has changed yet.
pub(crate) struct Met {
    predecessor: Predecessor,
    peer: identity::Peer,
}

/// Meets the process that connected on `stream`: its user checked, the
/// greeting given and its answer awaited (at most
/// `protocol::GREETING_TIMEOUT`). `None`, logged with its pid and uid,
/// if it is not a successor we hand over to: nothing was frozen or sent
/// but the greeting, and the server serves on as it did. Blocking.
pub(crate) fn meet(stream: UnixStream) -> Option<Met> {
    let peer = match identity::check_successor(&stream) {
        Ok(peer) => peer,
        Err(error) => {
            tracing::warn!(%error, "refused a process at the handoff socket; serving on");
            return None;
        }
    };
    match Predecessor::greet(Channel::new(stream)) {
        Ok(predecessor) => Some(Met { predecessor, peer }),
        Err(error) => {
            tracing::warn!(
                %error, pid = peer.pid, uid = peer.uid,
                "a process connected to the handoff socket and did not greet as a successor; \
                 nothing was handed over, serving on"
            );
            None
        }
    }
}

/// Hands the server to the successor `met`: stops handling requests and
/// open connections' input (so nothing is published here any more: the
/// bytes wait, and move), has the loops stop accepting, sends the
/// server's state, then has each loop give up a batch at a time, each
/// sent and acknowledged before the next leaves it (a socket leaves its
/// loop for its batch's trip only); a few passes, for connections that
/// could not move at the first (a reply being written); and last the
/// listening sockets `listeners`. True once the successor has
/// everything; false if the handoff failed: the batch it did not take is
/// back in the loops, requests and input are handled again, and the
/// loops accept and serve on (the successor never had the listening
/// sockets).
pub(crate) fn hand_off<H: ServerHandler>(
    met: Met,
    listeners: &[OwnedFd],
    loops: &dyn Loops,
    env: &Env<H>,
) -> bool {
    let Met {
        mut predecessor,
        peer,
    } = met;
    let (pid, uid) = (peer.pid, peer.uid);
    tracing::info!(pid, uid, "a successor connected; handing over");
    let began = Instant::now();
    let hub = &env.hub;
    // No request is handled from here on (on any thread: a loop, a wss
    // connection's task); once none is being handled, nothing publishes.
    hub.freeze_requests(true);
    if !requests_settled(hub) {
        predecessor.abandon();
        tracing::error!("a request was still being handled after 10 s; the handoff gives up");
        return serve_on(loops, env, false);
    }
    // Nor is any open connection's input (what a callback does, a publish,
    // would come after the state left): once every loop has answered
    // between two of its turns, none handles any.
    hub.freeze_input(true);
    for index in 0..loops.count() {
        if ask(loops, index, 0, Phase::Freeze).is_none() {
            predecessor.abandon();
            tracing::error!("a loop did not answer for 10 s; the handoff gives up");
            return serve_on(loops, env, false);
        }
    }
    loops.stop_accepting();
    let state = env.handler.hand_off_server();
    if let Err(error) = predecessor.send_state(&state, &addresses(listeners)) {
        predecessor.abandon();
        // It may hold the state, but no connection and no listening
        // socket: it has served nobody, so nothing it numbered can reach
        // a client, and the state stays ours as it was.
        tracing::error!(
            %error, pid, uid,
            "the successor did not take the server's state; serving on with everything"
        );
        return serve_on(loops, env, false);
    }
    let mut handed = 0;
    // Passes until one moves nothing after PASSES_FOR: a connection still
    // writing an answer moves once it is written.
    let passing = Instant::now();
    loop {
        let before = handed;
        for index in 0..loops.count() {
            let mut from = Some(0);
            while let Some(slot) = from {
                let (batch, next) = ask(loops, index, slot, Phase::Move).unwrap_or_default();
                from = next;
                if batch.is_empty() {
                    continue;
                }
                if let Err(error) = predecessor.send_batch(&batch) {
                    predecessor.abandon();
                    tracing::error!(
                        %error, pid, uid, handed,
                        "the handoff failed; serving on with the connections not handed over"
                    );
                    take_back(batch, loops, hub);
                    return serve_on(loops, env, handed > 0);
                }
                handed += batch.len();
                // The successor's now: our descriptors close.
                drop(batch);
            }
        }
        if handed == before {
            if passing.elapsed() >= PASSES_FOR {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The point of no return: the listening sockets go only now.
    let fds: Vec<_> = listeners.iter().map(|fd| fd.as_fd()).collect();
    if let Err(error) = predecessor.finish(&fds) {
        predecessor.abandon();
        // A successor that could not acknowledge closes them (and what it
        // took, with 1012): we are the one process accepting again.
        tracing::error!(
            %error, pid, uid, handed,
            "the successor did not take the listening sockets; serving on"
        );
        return serve_on(loops, env, handed > 0);
    }
    tracing::info!(
        connections = handed,
        ms = began.elapsed().as_millis() as u64,
        "handed every connection that can move to the successor"
    );
    true
}

/// Where each of `listeners` listens (for the successor's `local_addr`
/// before they come, and to check them when they do).
fn addresses(listeners: &[OwnedFd]) -> Vec<SocketAddr> {
    listeners
        .iter()
        .filter_map(|fd| {
            let listener = std::net::TcpListener::from(fd.try_clone().ok()?);
            listener.local_addr().ok()
        })
        .collect()
}

/// Waits (at most [`LOOP_TIMEOUT`]) until no request is being handled
/// anywhere; false if one still is then.
fn requests_settled(hub: &Hub) -> bool {
    let deadline = Instant::now() + LOOP_TIMEOUT;
    while hub.requests_handled() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// After a failed handoff (false, for `hand_off` to return): with
/// `disown`, the successor has served with the server's state (it
/// acknowledged it, then connections), and the handler disowns what it
/// did with it (`take_back_server`: a bus renumbers its topics); requests are
/// handled again, and every loop gives each of its connections a turn (a
/// request that waited whole in its buffer is handled now) and accepts.
fn serve_on<H: ServerHandler>(loops: &dyn Loops, env: &Env<H>, disown: bool) -> bool {
    if disown {
        env.handler.take_back_server();
    }
    env.hub.freeze_requests(false);
    env.hub.freeze_input(false);
    for index in 0..loops.count() {
        ask(loops, index, 0, Phase::Thaw);
    }
    false
}
