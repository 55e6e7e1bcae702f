//! A connection's whole life, sans-I/O: from the first byte of the upgrade
//! request (or from "already upgraded") to done.
//!
//! ```text
//!  handshake ──101──▶ open ──close frame queued──▶ closing ──both closes──▶ done
//!      │                │                            │
//!      │ refused        │ failed, EOF, aborted       │ ours unanswered, or failed
//!      ▼                ▼                            ▼
//!  error response ─▶ FIN ─▶ linger until the peer's FIN (bounded) ──────▶ done
//! ```
//!
//! [`Lifecycle`] owns every decision of that life: answering the request (or
//! 408, 503, 400), the close deadline, when the queue counts as flushed
//! (`on_drain`), when to end TCP and how (close at once after a complete
//! close handshake, otherwise FIN and a bounded linger), and what the handler
//! hears (`on_close` with 1006 and a reason when the connection breaks).
//! Bytes, EOF, write progress and the time go in; what to do next, the next
//! deadline and whether to read come out. It never touches a socket, a
//! runtime or a clock, so a driver (a tokio group over raw sockets, the
//! io_uring reactor, a task over any async stream) is plumbing only, and the
//! tests below drive it with no socket at all. The call contract is on
//! [`Lifecycle`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BytesMut};

use crate::connection::conn::Conn;
use crate::connection::dispatch::{Dispatch, Input, QueueState};
use crate::connection::handler::{Handler, Hooks, ServerHandler};
use crate::connection::hub::{Hub, LiveGuard, Registration, deadline_from};
use crate::connection::keepalive::Sweep;
use crate::connection::meters::rejection_reason;
use crate::connection::upgrade::{self, Answer, Upgraded};
use crate::connection::wake::ConnWake;
use crate::handshake::{HandshakeError, write_error};
use crate::pool::BufferPool;
use crate::proto::{Role, WriteQueue};

/// Bytes read and thrown away while lingering (waiting for the peer to end
/// TCP after our FIN), at most; `close_timeout` bounds the time. Large
/// enough for what a peer sends before it reads our answer: an HTTP client
/// uploads its whole body before it reads a 413, and a peer sends a whole
/// message before it reads the 1009 that refused it. Closing with its bytes
/// still arriving would make the kernel reset the connection, and the peer
/// would see "broken pipe" instead of the answer. Reading and dropping costs
/// no memory, and any open connection can make the server read as much.
const LINGER_LIMIT: usize = 64 << 20;

/// What a server loop shares with all its connections.
pub(crate) struct Env<H: Handler> {
    pub(crate) hub: Arc<Hub>,
    pub(crate) handler: Arc<H>,
    /// The server's callbacks; `None` for a client's connections, which
    /// never start with a request.
    pub(crate) hooks: Option<&'static Hooks<H>>,
}

impl<H: ServerHandler> Env<H> {
    /// A server's: its handler's upgrade hook answers requests.
    pub(crate) fn server(hub: Arc<Hub>, handler: Arc<H>) -> Self {
        Env {
            hub,
            handler,
            hooks: Some(Hooks::of()),
        }
    }
}

impl<H: Handler> Clone for Env<H> {
    fn clone(&self) -> Self {
        Env {
            hub: self.hub.clone(),
            handler: self.handler.clone(),
            hooks: self.hooks,
        }
    }
}

/// What the driver does next, from [`Lifecycle::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Write what is queued: [`Lifecycle::write_in_place`], or
    /// [`Lifecycle::take_queue`] for a write that owns its buffers. A driver
    /// that cannot write now (the socket is not writable) waits for it.
    Write,
    /// End our side of TCP (send FIN: `shutdown(Write)`), then poll again.
    ShutDown,
    /// Nothing to do until bytes arrive (read if [`Lifecycle::wants_read`]),
    /// a write completes, the connection is woken, or the deadline passes.
    Wait,
    /// Over: close the socket. `on_close` has run.
    End,
}

/// One connection, from its first byte to done.
///
/// # How a driver calls it
///
/// Like quinn-proto's `Connection`, grouped by when:
///
/// - **Start**: [`Lifecycle::accept`] for a connection that sends its upgrade
///   request next, [`Lifecycle::upgraded`] for one whose request was answered
///   elsewhere (hyper's upgrade).
/// - **When bytes arrive**: [`Lifecycle::handle_input`] with the driver's read
///   buffer, which keeps what is not consumed yet (a partial request head or
///   frame) and gets the next bytes appended. [`Lifecycle::handle_eof`] for
///   the peer's FIN, [`Lifecycle::handle_read_error`] for an error.
/// - **When writing**: drivers that write in place call
///   [`Lifecycle::write_in_place`] with a non-blocking vectored write; drivers
///   whose writes own their buffers (io_uring) call [`Lifecycle::take_queue`],
///   then report [`Lifecycle::handle_sent`] as bytes go out and
///   [`Lifecycle::handle_write_finished`] (or [`Lifecycle::handle_write_error`] first)
///   once done with what they took.
/// - **Then, every time**: [`Lifecycle::poll_action`] until it says
///   [`Action::Wait`] or [`Action::End`]. Before sleeping, read if
///   [`Lifecycle::wants_read`] (sized by [`Lifecycle::bytes_wanted`]), and
///   set a timer for [`Lifecycle::poll_timeout`]; poll again when it passes, when
///   the connection's [`ConnWake`] fires, or when the socket is ready. If
///   [`Lifecycle::holds_input`], call [`Lifecycle::handle_input`] with the
///   buffer first, without reading: bytes left there while the outbound
///   queue was full are due.
///
/// Deadlines come out as `Instant`s and time goes in as `now`: the close
/// deadline is enforced by `poll` at every call, so a peer that floods us
/// while its close is overdue is still cut off on time.
pub(crate) struct Lifecycle<H: Handler> {
    stage: Stage<H>,
    /// Set once the connection fails, starts to close, or ends TCP: rare,
    /// so boxed (most connections are open and idle).
    ending: Option<Box<Ending>>,
    /// The peer's FIN has arrived, or reading failed.
    read_closed: bool,
    /// What waits to be written reached `max_outbound_bytes`: messages are
    /// not handed to the handler (and the driver does not read) until it
    /// is written down to half of that. Blocked writes alone do not pause: the
    /// bounded queue, not a stopped reader, protects the server, and a
    /// request is answered while pushes drain. (The application's own
    /// pause, `Conn::pause_reading`, is kept apart: see `is_paused`.)
    queue_paused: bool,
    /// [`Lifecycle::handle_input`] left whole frames in the driver's buffer (the
    /// queue was full), or bytes arrived while paused: they go before any
    /// new read once reading resumes.
    held: bool,
    /// [`Lifecycle::handle_input`] left bytes in the driver's buffer because a
    /// handoff froze input: they go before any new read once it is thawed
    /// (or the connection starts to close), and the peer's end after them
    /// is no abrupt end.
    frozen: bool,
    /// The driver holds bytes it took with [`Lifecycle::take_queue`] and has
    /// not finished with.
    writing: bool,
    /// Counts the connection as live until it is dropped (after the driver's
    /// socket, which is declared before this in every driver).
    _live: LiveGuard,
}

enum Stage<H: Handler> {
    /// Reading the request, or answering it with an HTTP error (boxed: it is
    /// short-lived, and an upgraded connection should not carry its size).
    Handshake(Box<Handshake>),
    Open(Open<H>),
    Done,
}

struct Handshake {
    peer: SocketAddr,
    /// How the `Conn` will wake the driver, handed over at the upgrade.
    wake: ConnWake,
    /// The handshake timeout; once refused, the close timeout.
    deadline: Instant,
    /// The `101` (moved into the connection's queue) or the error response.
    response: WriteQueue,
    refused: bool,
    /// Bytes of the request seen so far: they stay in the driver's buffer
    /// until the head is complete, and only a new line is worth parsing.
    seen: usize,
    /// Where a plain HTTP request's body ends, once its head said so (0:
    /// no body awaited): nothing is parsed again until it is all here.
    body_end: usize,
    /// A PROXY protocol header is awaited before the request (see
    /// `lifecycle/proxied.rs`).
    proxy_header: bool,
    /// Plain HTTP requests answered on this connection so far (it stays
    /// open for the next while the client lets it, up to
    /// `KEEP_ALIVE_REQUESTS`).
    answered: u16,
}

/// The most plain HTTP requests one connection carries (a publisher that
/// keeps its connection opens a new one after this many).
const KEEP_ALIVE_REQUESTS: u16 = 1000;

struct Open<H: Handler> {
    dispatch: Dispatch<H>,
    _registration: Registration,
}

impl<H: Handler> Open<H> {
    /// Counts the connection as open, puts the `101` in `response` (if any)
    /// at the head of its queue, and calls `on_open`.
    fn upgrade(
        peer: SocketAddr,
        wake: ConnWake,
        mut response: WriteQueue,
        upgraded: Upgraded<H::State>,
        env: &Env<H>,
    ) -> Self {
        let (hub, handler) = (&env.hub, &env.handler);
        let (dispatch, registration) =
            Dispatch::upgrade(hub, handler, peer, &mut response, upgraded, wake);
        Open {
            dispatch,
            _registration: registration,
        }
    }
}

/// What only a failing or closing connection needs.
#[derive(Default)]
struct Ending {
    /// How reading or writing failed (the first failure counts).
    failure: Option<String>,
    /// The close deadline of an upgraded connection: once a close frame is
    /// queued, every remaining step, writes included, is bounded by it.
    deadline: Option<Instant>,
    /// Set once our FIN is sent: bytes discarded since, while waiting for
    /// the peer's.
    discarded: Option<usize>,
}

/// Starting.
impl<H: Handler> Lifecycle<H> {
    /// A connection whose upgrade request comes next. `wake` is how its
    /// `Conn` will reach the driver once upgraded.
    pub(crate) fn accept(
        peer: SocketAddr,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
        now: Instant,
    ) -> Self {
        let handshake = Handshake {
            peer,
            wake,
            deadline: deadline_from(now, env.hub.config.handshake_timeout),
            answered: 0,
            response: WriteQueue::new(),
            refused: false,
            proxy_header: false,
            seen: 0,
            body_end: 0,
        };
        Lifecycle::new(Stage::Handshake(Box::new(handshake)), live)
    }

    /// A connection whose upgrade was done elsewhere (see [`Upgraded`]).
    /// It opens at once, calling `on_open`, then hands its `Conn` out if
    /// asked to. Returns the bytes read after the handshake: the driver's
    /// read buffer, to [`Lifecycle::handle_input`] before reading more.
    pub(crate) fn upgraded(
        peer: SocketAddr,
        live: LiveGuard,
        wake: ConnWake,
        mut upgraded: Upgraded<H::State>,
        env: &Env<H>,
    ) -> (Self, BytesMut) {
        let prefix = std::mem::take(&mut upgraded.prefix);
        let hand_out = upgraded.hand_out.take();
        let response = WriteQueue::with_role(upgraded.role);
        let open = Open::upgrade(peer, wake, response, upgraded, env);
        if let Some(hand_out) = hand_out {
            hand_out(open.dispatch.conn());
        }
        (Lifecycle::new(Stage::Open(open), live), prefix)
    }

    fn new(stage: Stage<H>, live: LiveGuard) -> Self {
        Lifecycle {
            stage,
            ending: None,
            read_closed: false,
            queue_paused: false,
            held: false,
            frozen: false,
            writing: false,
            _live: live,
        }
    }
}

/// Input: what happened on the socket.
impl<H: Handler> Lifecycle<H> {
    /// Handles the bytes in `input`: the request head once complete (then
    /// the frames after it), frames (calling the handler), or bytes discarded
    /// while waiting for the peer's FIN. What is not consumed yet (a partial
    /// head or frame, or whole frames once the outbound queue is full: see
    /// [`Lifecycle::holds_input`]) stays in `input`: keep it and append the
    /// next bytes.
    pub(crate) fn handle_input(&mut self, input: &mut BytesMut, env: &Env<H>, now: Instant) {
        // Pipelined plain requests are taken one after the other.
        while self.receive_one(input, env, now) {}
    }

    /// [`Lifecycle::handle_input`], up to the end of one plain HTTP request on a
    /// connection kept alive: true if the next one is in `input` already.
    fn receive_one(&mut self, input: &mut BytesMut, env: &Env<H>, now: Instant) -> bool {
        if let Some(discarded) = self.ending.as_mut().and_then(|e| e.discarded.as_mut()) {
            *discarded += input.len();
            input.clear();
            return false;
        }
        let input_waits = self.input_waits(env);
        match &mut self.stage {
            Stage::Handshake(handshake) => {
                if handshake.refused || env.hub.is_shutting_down() {
                    // `poll` answers 503 to a shutdown; nothing more is read.
                    input.clear();
                    return false;
                }
                if input.len() < handshake.body_end
                    || (handshake.proxy_header && !proxied::take(handshake, input, &env.hub, now))
                {
                    return false;
                }
                // A handoff under way: the request waits, and moves.
                #[cfg(all(target_os = "linux", feature = "handoff"))]
                let Some(_handling) = env.hub.begin_request() else {
                    return false;
                };
                let (handler, hub) = (&*env.handler, &*env.hub);
                let out = &mut handshake.response;
                // A client's connections start upgraded: only a server's
                // read a request, and a server's `Env` has its hooks.
                let Some(hooks) = env.hooks else {
                    tracing::error!("a request reached a connection without a server's hooks");
                    refuse(handshake, hub, now);
                    input.clear();
                    return false;
                };
                let may_keep_alive = handshake.answered + 1 < KEEP_ALIVE_REQUESTS;
                let answer = upgrade::answer(
                    input,
                    handshake.seen,
                    handler,
                    hooks,
                    hub,
                    out,
                    upgrade::Carrier {
                        peer: handshake.peer,
                        may_keep_alive,
                    },
                );
                match answer {
                    Answer::Incomplete => handshake.seen = input.len(),
                    Answer::Answered { consumed } => {
                        // The next request, on the same connection, within
                        // the handshake timeout again (the idle bound).
                        input.advance(consumed);
                        handshake.answered += 1;
                        handshake.seen = 0;
                        handshake.body_end = 0;
                        let timeout = hub.config.handshake_timeout;
                        handshake.deadline = deadline_from(now, timeout);
                        // Pipelined: the next one may be here already.
                        return !input.is_empty();
                    }
                    Answer::Body { end } => {
                        // Parsed again, from the start, once it is all here.
                        handshake.body_end = end;
                        handshake.seen = 0;
                    }
                    Answer::Refused => {
                        refuse(handshake, hub, now);
                        input.clear();
                    }
                    Answer::Accepted {
                        state,
                        head_len,
                        deflate,
                        settings,
                        client,
                    } => {
                        input.advance(head_len);
                        handshake.peer = client.unwrap_or(handshake.peer);
                        let upgraded = Upgraded {
                            settings,
                            ..Upgraded::server(state, deflate)
                        };
                        self.open(upgraded, env);
                        if !input.is_empty() {
                            // Frames that came with the request.
                            self.handle_input(input, env, now);
                        }
                    }
                }
            }
            // A handoff is under way: the input waits, and moves.
            Stage::Open(_) if input_waits => {
                self.held = false;
                self.frozen = !input.is_empty();
            }
            Stage::Open(open) => {
                (self.held, self.frozen) = (false, false);
                if !open.dispatch.is_closed() {
                    match open.dispatch.input(input) {
                        Input::Done => {}
                        Input::QueueFull => {
                            self.held = true;
                            self.queue_paused = true;
                        }
                        // The application's pause is not the queue's
                        // hysteresis: it ends when the application says.
                        Input::ReadingPaused => self.held = true,
                    }
                }
                if open.dispatch.is_closed() {
                    // Nothing after the close (or a failure) is read.
                    input.clear();
                }
            }
            Stage::Done => input.clear(),
        }
        false
    }

    /// The peer ended its side of TCP.
    pub(crate) fn handle_eof(&mut self) {
        self.read_closed = true;
    }

    /// Reading failed: the connection is over.
    pub(crate) fn handle_read_error(&mut self, error: &io::Error) {
        self.read_closed = true;
        self.fail(|| format!("read failed: {error}"));
    }

    /// Bytes arrived while reading is paused and the driver keeps them for
    /// later (see [`Lifecycle::holds_input`]): the peer is alive, though not
    /// reading.
    pub(crate) fn handle_held_input(&mut self) {
        self.held = true;
        self.heard_from_peer();
    }

    /// The queued `101` goes first, then `on_open`; the handshake's box goes.
    fn open(&mut self, upgraded: Upgraded<H::State>, env: &Env<H>) {
        let Stage::Handshake(handshake) = std::mem::replace(&mut self.stage, Stage::Done) else {
            unreachable!("opened from the handshake");
        };
        let Handshake {
            peer,
            wake,
            response,
            ..
        } = *handshake;
        self.stage = Stage::Open(Open::upgrade(peer, wake, response, upgraded, env));
    }

    fn fail(&mut self, failure: impl FnOnce() -> String) {
        let ending = self.ending.get_or_insert_with(Box::default);
        ending.failure.get_or_insert_with(failure);
    }
}

/// Writing.
impl<H: Handler> Lifecycle<H> {
    /// Writes what is queued through `write`, a non-blocking vectored write
    /// (`WouldBlock` when the socket takes nothing more), until the queue is
    /// empty or `write` would block. True once everything is written; after a
    /// failure the next [`Lifecycle::poll_action`] ends the connection.
    pub(crate) fn write_in_place(
        &mut self,
        pool: &BufferPool,
        write: impl FnMut(&[io::IoSlice<'_>]) -> io::Result<usize>,
    ) -> bool {
        let written = match &mut self.stage {
            Stage::Handshake(handshake) => {
                let written = handshake.response.write_with(write);
                if let Some(buf) = handshake.response.take_buffer() {
                    pool.give(buf);
                }
                written
            }
            Stage::Open(open) => open.dispatch.write_with(pool, write),
            Stage::Done => return true,
        };
        match written {
            Ok(written) => {
                if written.bytes > 0 && self.queue_paused {
                    self.heard_from_peer();
                }
                written.all
            }
            Err(error) => {
                self.fail(|| format!("write failed: {error}"));
                false
            }
        }
    }

    /// Moves what is queued into `into`, for a write that owns its buffers
    /// until it completes (io_uring). Report with [`Lifecycle::handle_sent`], then
    /// [`Lifecycle::handle_write_finished`]; nothing more is taken until then.
    pub(crate) fn take_queue(&mut self, into: &mut WriteQueue) {
        debug_assert!(into.is_empty(), "taken into an empty queue");
        match &mut self.stage {
            Stage::Handshake(handshake) => std::mem::swap(&mut handshake.response, into),
            Stage::Open(open) => open.dispatch.take_for_send(into),
            Stage::Done => return,
        }
        self.writing = !into.is_empty();
    }

    /// `n` bytes of what was taken were written.
    pub(crate) fn handle_sent(&mut self, n: usize) {
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.no_longer_sending(n);
        }
        if self.queue_paused {
            // The write had to wait for room: the peer made it by reading.
            // (One that completes at once proves nothing: the kernel takes
            // bytes for a peer that reads nothing, until its buffers fill.)
            self.heard_from_peer();
        }
    }

    /// The driver is done with what it took; `unsent` bytes of it were never
    /// written (after a failure).
    pub(crate) fn handle_write_finished(&mut self, unsent: usize) {
        self.writing = false;
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.no_longer_sending(unsent);
        }
    }

    /// The driver is done with what it took, and gives back `unsent`, the
    /// part it did not write (a handoff stopped the write): it goes out
    /// first, next time, or moves with the connection. Only for an open
    /// connection (a handshake's response is never stopped).
    #[cfg(all(target_os = "linux", feature = "handoff", feature = "uring"))]
    pub(crate) fn give_back(&mut self, unsent: &mut WriteQueue, pool: &crate::pool::BufferPool) {
        self.writing = false;
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.give_back(unsent, pool);
        }
    }

    /// Writing failed: the connection is over.
    pub(crate) fn handle_write_error(&mut self, error: &io::Error) {
        self.fail(|| format!("write failed: {error}"));
    }

    fn heard_from_peer(&mut self) {
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.heard_from_peer();
        }
    }
}

/// Output: what to do next.
impl<H: Handler> Lifecycle<H> {
    /// Acts on everything that happened (a request to close, an abort, a
    /// deadline at `now`, a queue written out) and says what the driver does
    /// next. Call after every input, and again after doing what it said,
    /// until it says [`Action::Wait`] or [`Action::End`].
    pub(crate) fn poll_action(&mut self, env: &Env<H>, now: Instant) -> Action {
        match self.stage {
            Stage::Handshake(_) => self.poll_handshake(env, now),
            Stage::Open(_) => self.poll_open(env, now),
            Stage::Done => Action::End,
        }
    }

    fn poll_handshake(&mut self, env: &Env<H>, now: Instant) -> Action {
        let Stage::Handshake(handshake) = &mut self.stage else {
            unreachable!("polled in the handshake stage");
        };
        let failed = self.ending.as_ref().is_some_and(|e| e.failure.is_some());
        // An answer to a plain request on a connection kept alive is
        // written out (below, as a refusal is) before anything else is
        // decided.
        let answering = self.writing || !handshake.response.is_empty();
        if !handshake.refused && !answering {
            let meters = env.hub.meters();
            let refusal = if env.hub.is_shutting_down() {
                meters.rejected("shutting_down");
                (503, "server shutting down")
            } else if failed || (self.read_closed && handshake.seen == 0) {
                // Connected and left (a port check), or broke: no answer.
                return self.close();
            } else if self.read_closed {
                let e = HandshakeError::Incomplete;
                meters.rejected(rejection_reason(&e));
                (e.status(), e.reason())
            } else if now >= handshake.deadline && env.hub.requests_frozen() {
                // A request that waits for a handoff is not late: looked
                // at again in a second, or moved.
                handshake.deadline = deadline_from(now, std::time::Duration::from_secs(1));
                return Action::Wait;
            } else if now >= handshake.deadline
                && ((handshake.answered > 0 && handshake.seen == 0 && handshake.body_end == 0)
                    || handshake.proxy_header)
            {
                // Kept alive and idle, nothing of a next request: closed
                // quietly, as HTTP servers close idle connections (and a
                // connection whose PROXY header did not come, as proxies do).
                return self.close();
            } else if now >= handshake.deadline {
                let e = HandshakeError::TimedOut;
                meters.rejected(rejection_reason(&e));
                (e.status(), e.reason())
            } else {
                return Action::Wait;
            };
            write_error(&mut handshake.response, refusal.0, refusal.1);
            refuse(handshake, &env.hub, now);
        }
        let expired = now >= handshake.deadline;
        if failed {
            return self.close();
        }
        if let Some(discarded) = self.ending.as_ref().and_then(|e| e.discarded) {
            let over = self.read_closed || discarded >= LINGER_LIMIT || expired;
            return if over { self.close() } else { Action::Wait };
        }
        if self.writing || !handshake.response.is_empty() {
            return match (expired, self.writing) {
                (true, _) => self.close(),
                (false, true) => Action::Wait,
                (false, false) => Action::Write,
            };
        }
        // The error response is out: FIN, then wait for the peer's, so that
        // unread bytes do not turn the close into a reset that could destroy
        // the response in flight.
        handshake.deadline = deadline_from(now, env.hub.config.close_timeout);
        self.ending.get_or_insert_with(Box::default).discarded = Some(0);
        Action::ShutDown
    }

    fn poll_open(&mut self, env: &Env<H>, now: Instant) -> Action {
        let close_timeout = env.hub.config.close_timeout;
        loop {
            let Stage::Open(open) = &mut self.stage else {
                unreachable!("polled in the open stage");
            };
            let dispatch = &mut open.dispatch;
            if dispatch.conn().shared().take_attention() {
                dispatch.attend();
            }
            if dispatch.is_aborted() {
                return self.close();
            }
            let ending = self.ending.as_deref();
            let deadline = ending.and_then(|ending| ending.deadline);
            let expired = deadline.is_some_and(|at| now >= at);
            if let Some(discarded) = ending.and_then(|ending| ending.discarded) {
                let over = self.read_closed || discarded >= LINGER_LIMIT || expired;
                return if over { self.close() } else { Action::Wait };
            }
            if let Some(failure) = ending.and_then(|ending| ending.failure.as_deref()) {
                dispatch.abnormal(failure);
                return self.close();
            }
            // (The peer's FIN after its close frame is no failure: our reply
            // may still wait for the handler, and the peer reads until it.)
            if self.read_closed
                && !dispatch.is_closed()
                && !dispatch.peer_closed()
                && !self.held
                && !self.frozen
            {
                dispatch.abnormal("connection closed without a close frame");
                return self.close();
            }
            if !dispatch.is_open() && deadline.is_none() {
                let ending = self.ending.get_or_insert_with(Box::default);
                ending.deadline = Some(deadline_from(now, close_timeout));
                continue;
            }
            if expired && dispatch.holds_close() {
                // The handler did not catch up in time: the held close (a
                // failure's, or our reply) goes now, with a close timeout of
                // its own.
                dispatch.release_close("protocol error");
                if let Some(ending) = self.ending.as_deref_mut() {
                    ending.deadline = None;
                }
                continue;
            }
            let outbound = dispatch.conn().shared().outbound();
            let (max, low_water) = (outbound.max_bytes, outbound.low_water());
            let QueueState {
                flushed,
                has_queued: queued,
                bytes,
                wanted_drain,
            } = dispatch.queue_state(outbound.producer_wake());
            // Hysteresis: paused at the bound, going again at half of it.
            if bytes >= max {
                self.queue_paused = true;
            } else if bytes <= low_water {
                self.queue_paused = false;
            }
            if !flushed {
                if expired {
                    dispatch.abnormal("write failed: close timeout passed");
                    return self.close();
                }
                return if queued && !self.writing {
                    Action::Write
                } else {
                    Action::Wait
                };
            }
            // `on_drain` may have sent, or another task (whose send woke us,
            // or will): look again before waiting.
            if dispatch.flushed(wanted_drain) && dispatch.conn().shared().has_pending_work() {
                continue;
            }
            if dispatch.is_closed() {
                if dispatch.peer_closed() && dispatch.role() == Role::Server {
                    // Both close frames are through and ours is written: the
                    // peer may send nothing more, so the socket is closed at
                    // once (the server closes TCP first, RFC 6455 §7.1.1).
                    // Waiting for its FIN would cost a shutdown, a read and a
                    // wake-up per connection.
                    return self.close();
                }
                let client_done = dispatch.peer_closed();
                self.linger(deadline_from(now, close_timeout));
                if client_done {
                    // A client waits for the server to close TCP first (RFC
                    // 6455 §7.1.1), then closes too (at once if its FIN has
                    // come already: the loop's linger check says).
                    continue;
                }
                // A failure, or our close unanswered: FIN first (see
                // `poll_handshake`).
                return Action::ShutDown;
            }
            if expired {
                dispatch.abnormal("close handshake timed out");
                return self.close();
            }
            return Action::Wait;
        }
    }

    /// From now on, bytes that arrive are read and dropped until the peer's
    /// FIN, at most until the close deadline (`deadline`, unless one is set).
    fn linger(&mut self, deadline: Instant) {
        let ending = self.ending.get_or_insert_with(Box::default);
        ending.discarded = Some(0);
        ending.deadline.get_or_insert(deadline);
        self.held = false;
    }

    /// Drops the protocol state (running `on_close` if it has not run) and
    /// says so.
    fn close(&mut self) -> Action {
        self.stage = Stage::Done;
        Action::End
    }

    /// Whether the driver should read: the request is still coming, the
    /// connection is open and not paused, or we wait for the peer's FIN.
    pub(crate) fn wants_read(&self) -> bool {
        if self.read_closed {
            return false;
        }
        let lingering = self.ending.as_ref().is_some_and(|e| e.discarded.is_some());
        match &self.stage {
            _ if lingering => !self.is_done(),
            Stage::Handshake(handshake) => !handshake.refused,
            Stage::Open(open) => {
                !self.is_paused() && !open.dispatch.is_closed() && !open.dispatch.holds_close()
            }
            Stage::Done => false,
        }
    }

    /// [`Lifecycle::wants_read`], unless a handoff froze what this
    /// connection would read (a request, or an open connection's input):
    /// what a driver asks before it reads.
    pub(crate) fn reads_now(&self, env: &Env<H>) -> bool {
        let frozen = match self.stage {
            Stage::Handshake(_) => env.hub.requests_frozen(),
            Stage::Open(_) => self.input_waits(env),
            Stage::Done => false,
        };
        !frozen && self.wants_read()
    }

    /// Reading is paused: the outbound queue reached `max_outbound_bytes`
    /// and is not written down to half of that yet, or the application paused
    /// it (`Conn::pause_reading`) and the connection is still open.
    pub(crate) fn is_paused(&self) -> bool {
        self.queue_paused || self.app_paused()
    }

    fn app_paused(&self) -> bool {
        matches!(&self.stage, Stage::Open(open) if open.dispatch.is_reading_paused())
    }

    /// A handoff froze input and this connection is not closing (one that
    /// is reads and handles the peer's close reply): its input waits.
    fn input_waits(&self, env: &Env<H>) -> bool {
        self.ending.is_none() && env.hub.input_frozen()
    }

    /// Bytes the driver kept (left by [`Lifecycle::handle_input`] while the queue
    /// was full or input was frozen, or arrived while paused) are due: call
    /// `receive` with them before reading more.
    pub(crate) fn holds_input(&self, env: &Env<H>) -> bool {
        let Stage::Open(_) = self.stage else {
            return false;
        };
        (self.held && !self.is_paused()) || (self.frozen && !self.input_waits(env))
    }

    /// How many bytes, counted from the start of the read buffer, the next
    /// read is for: the request head (up to its limit, plus one to see it
    /// pass), or the frame in progress (see `Session::bytes_wanted`).
    pub(crate) fn bytes_wanted(&self, env: &Env<H>) -> usize {
        match &self.stage {
            Stage::Handshake(handshake) => {
                (env.hub.config.max_handshake_size + 1).max(handshake.body_end)
            }
            Stage::Open(open) => open.dispatch.bytes_wanted(),
            Stage::Done => 0,
        }
    }

    /// When to poll again if nothing else happens: the handshake timeout,
    /// or, once closing, the close deadline. An open connection has none.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.stage {
            Stage::Handshake(handshake) => Some(handshake.deadline),
            Stage::Open(_) => self.ending.as_ref().and_then(|e| e.deadline),
            Stage::Done => None,
        }
    }
}

/// For the server loop.
impl<H: Handler> Lifecycle<H> {
    /// One keepalive sweep, if the connection is open (see `keepalive`).
    pub(crate) fn handle_sweep(&mut self, sweep: &Sweep) {
        if let Stage::Open(open) = &mut self.stage {
            open.dispatch.sweep(sweep);
        }
    }

    /// The connection's handle, once upgraded.
    pub(crate) fn conn(&self) -> Option<&Conn> {
        match &self.stage {
            Stage::Open(open) => Some(open.dispatch.conn()),
            _ => None,
        }
    }

    /// How it wakes its driver (the handshake's, then the `Conn`'s); none once done.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn wake(&self) -> Option<&ConnWake> {
        match &self.stage {
            Stage::Handshake(handshake) => Some(&handshake.wake),
            _ => self.conn().map(|conn| conn.shared().wake()),
        }
    }

    /// Ends the connection now, whatever its state (the server gives up on
    /// it): `on_close` runs with 1006 if it has not run.
    pub(crate) fn end(&mut self) {
        self.stage = Stage::Done;
    }

    /// True once over: the driver closes the socket.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }
}

/// Refuses the request whose error response is in `handshake.response`: the
/// rest (writing it, FIN, waiting for the peer's) is bounded by the close
/// timeout.
fn refuse(handshake: &mut Handshake, hub: &Hub, now: Instant) {
    handshake.refused = true;
    handshake.deadline = deadline_from(now, hub.config.close_timeout);
}

#[cfg(all(target_os = "linux", feature = "handoff"))]
mod handoff;
mod proxied;
#[cfg(test)]
mod tests;
