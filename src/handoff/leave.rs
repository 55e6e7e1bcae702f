//! The running process's side of a handoff, the same for every driver: it
//! runs on a thread of its own (it waits on the channel and on the loops),
//! and reaches the server's loops through [`Loops`].

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::channel::Channel;
use super::protocol::{ANSWER_TIMEOUT, Predecessor, refused};
use super::{Loops, Phase, ask, take_back};
use crate::connection::endpoint::Endpoint;
use crate::connection::handler::ServerHandler;
use crate::connection::lifecycle::Env;

/// How long the handoff goes on passing over the loops for connections
/// that could not move yet (a reply being written).
const PASSES_FOR: Duration = Duration::from_millis(300);

/// Hands the server to the successor on `stream`: stops handling requests
/// and open connections' input (so nothing is published here any more: the
/// bytes wait, and move), has the loops stop accepting,
/// sends the server's state and the listening sockets `listeners`, then
/// has each loop give up a batch at a time, each sent and acknowledged
/// before the next leaves it (a socket leaves its loop for its batch's
/// trip only); a few passes, for connections that could not move at the
/// first (a reply being written). True once the successor has everything;
/// false if the handoff failed: the batch it did not take is back in the
/// loops, requests and input are handled again, and the loops accept and
/// serve on.
pub(crate) fn hand_off<H: ServerHandler>(
    stream: UnixStream,
    listeners: &[OwnedFd],
    loops: &dyn Loops,
    env: &Env<H>,
) -> bool {
    let mut predecessor = match Predecessor::greet(Channel::new(stream)) {
        Ok(predecessor) => predecessor,
        Err(error) => {
            tracing::error!(%error, "a successor connected, but the handoff could not begin");
            return false;
        }
    };
    let began = Instant::now();
    let endpoint = &env.endpoint;
    // No request is handled from here on (on any thread: a loop, a wss
    // connection's task); once none is being handled, nothing publishes.
    endpoint.freeze_requests(true);
    if !requests_settled(endpoint) {
        predecessor.abandon();
        tracing::error!("a request was still being handled after 10 s; the handoff gives up");
        return serve_on(loops, env, false);
    }
    // Nor is any open connection's input (what a callback does, a publish,
    // would come after the state left): once every loop has answered
    // between two of its turns, none handles any.
    endpoint.freeze_input(true);
    for index in 0..loops.count() {
        if ask(loops, index, 0, Phase::Freeze).is_none() {
            predecessor.abandon();
            tracing::error!("a loop did not answer for 10 s; the handoff gives up");
            return serve_on(loops, env, false);
        }
    }
    loops.stop_accepting();
    let state = env.handler.hand_off_server();
    let fds: Vec<_> = listeners.iter().map(|fd| fd.as_fd()).collect();
    if let Err(error) = predecessor.send_state(&state, &fds) {
        predecessor.abandon();
        tracing::error!(%error, "the successor did not take the server's state; serving on");
        // Unless it refused, it may have taken it all the same.
        return serve_on(loops, env, !refused(&error));
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
                        %error,
                        handed,
                        "the handoff failed; serving on with the connections not handed over"
                    );
                    take_back(batch, loops, endpoint);
                    return serve_on(loops, env, true);
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
    if let Err(error) = predecessor.finish() {
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

/// Waits (at most `ANSWER_TIMEOUT`) until no request is being handled
/// anywhere; false if one still is then.
fn requests_settled(endpoint: &Endpoint) -> bool {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while endpoint.requests_handled() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// After a failed handoff (false, for `hand_off` to return): with
/// `disown`, the server's state may be in the successor's hands, and the
/// handler disowns what it does with it (`take_back_server`); requests are
/// handled again, and every loop gives each of its connections a turn (a
/// request that waited whole in its buffer is handled now) and accepts.
fn serve_on<H: ServerHandler>(loops: &dyn Loops, env: &Env<H>, disown: bool) -> bool {
    if disown {
        env.handler.take_back_server();
    }
    env.endpoint.freeze_requests(false);
    env.endpoint.freeze_input(false);
    for index in 0..loops.count() {
        ask(loops, index, 0, Phase::Thaw);
    }
    false
}
