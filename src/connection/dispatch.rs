//! Between the protocol and the handler: turns session events into callbacks.
//!
//! This is the part of a connection every driver shares once the handshake is
//! done. A driver reads bytes and calls [`Dispatch::input`]; the session finds
//! the events, automatic replies go into the connection's outbound queue, and the
//! handler's callbacks run in order. Panics in callbacks are caught here and fail
//! only this connection, with 1011. The driver then writes the queue and asks
//! whether the connection is over.

use std::io;
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use bytes::BytesMut;

use crate::connection::conn::Conn;
use crate::connection::handler::Handler;
use crate::connection::hub::{Hub, Registration};
use crate::connection::keepalive::Sweep;
use crate::connection::outbox::wake_all;
use crate::connection::upgrade::Upgraded;
use crate::connection::wake::ConnWake;
use crate::pool::BufferPool;
use crate::proto::{CloseCode, Event, Message, Role, Session, WriteQueue, Written};

/// One upgraded connection: its protocol state and the application side.
///
/// The two are separate fields so that an event borrowing the session (a
/// message, a close reason) can be handed to the application's callbacks.
pub(crate) struct Dispatch<H: Handler> {
    session: Session,
    app: App<H>,
    /// The server forced this connection down; drop it without closing politely.
    aborted: bool,
    /// Keepalive sweeps since the peer last sent anything (see `keepalive`).
    quiet: u32,
}

/// The handler, this connection's handle and state, and the guarantees around
/// calling them: panics are caught, and `on_close` runs exactly once.
struct App<H: Handler> {
    handler: Arc<H>,
    conn: Conn,
    state: H::State,
    /// `on_close` has been called.
    closed: bool,
}

/// How far [`Dispatch::input`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Input {
    /// Everything but a partial frame was handled.
    Done,
    /// The outbound queue is full: whole frames are left, for later.
    QueueFull,
    /// The application paused reading (`Conn::pause_reading`, the async
    /// socket's full inbox): whole frames are left, for later.
    ReadingPaused,
}

/// A callback panicked.
struct Panicked(&'static str);

impl<H: Handler> App<H> {
    fn on_open(&mut self) -> Result<(), Panicked> {
        let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
        catch_unwind(AssertUnwindSafe(|| handler.on_open(conn, state)))
            .map_err(|_| Panicked("on_open"))
    }

    fn on_message(&mut self, message: Message<'_>) -> Result<(), Panicked> {
        let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
        catch_unwind(AssertUnwindSafe(|| {
            handler.on_message(conn, state, message)
        }))
        .map_err(|_| Panicked("on_message"))
    }

    /// The handler's answer; a panic counts as no.
    fn has_unhandled_messages(&self) -> bool {
        let (handler, state) = (&self.handler, &self.state);
        catch_unwind(AssertUnwindSafe(|| handler.has_unhandled_messages(state))).unwrap_or(false)
    }

    fn on_drain(&mut self) -> Result<(), Panicked> {
        if self.closed {
            return Ok(());
        }
        let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
        catch_unwind(AssertUnwindSafe(|| handler.on_drain(conn, state)))
            .map_err(|_| Panicked("on_drain"))
    }

    /// Calls `on_close` unless it already ran; a panic in it is logged and ignored.
    fn on_close(&mut self, code: CloseCode, reason: &str) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        self.conn.shared().outbound().meters.closed(code);
        let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
        if catch_unwind(AssertUnwindSafe(|| {
            handler.on_close(conn, state, code, reason)
        }))
        .is_err()
        {
            tracing::error!(id = conn.id(), "on_close panicked");
        }
    }
}

/// The outbound queue seen at once by [`Dispatch::queue_state`].
pub(crate) struct QueueState {
    /// Everything queued has been written.
    pub(crate) flushed: bool,
    /// Bytes wait to be written (and none is being written now, or more
    /// came since).
    pub(crate) has_queued: bool,
    /// Bytes queued, including any being written.
    pub(crate) bytes: usize,
    /// A send was refused as full since the last drain (pass it to
    /// [`Dispatch::flushed`]).
    pub(crate) wanted_drain: bool,
}

impl<H: Handler> Dispatch<H> {
    /// Opens a connection whose handshake was accepted: counts it as open,
    /// gives it `wake` to reach the driver by, moves the `101` from
    /// `response` to the head of its queue (so whatever `on_open` sends
    /// follows it in the same write), sets up permessage-deflate if it was
    /// agreed, and calls `on_open`. Frames that came with the request go to
    /// [`Dispatch::input`] next.
    /// (`upgraded`'s prefix and hand-out are the lifecycle's to take first.)
    pub(crate) fn upgrade(
        hub: &Arc<Hub>,
        handler: &Arc<H>,
        peer: SocketAddr,
        response: &mut WriteQueue,
        upgraded: Upgraded<H::State>,
        wake: ConnWake,
    ) -> (Self, Registration) {
        let Upgraded {
            state,
            deflate,
            settings,
            role,
            ..
        } = upgraded;
        let (limits, compression) = match settings.as_deref() {
            Some(settings) => (settings.limits, settings.deflate.as_ref()),
            None => (hub.config.limits, hub.config.deflate()),
        };
        let (conn, registration) = hub.open_connection(peer, wake, role);
        {
            let mut outbox = conn.shared().lock();
            outbox.begin_with(response);
            #[cfg(feature = "deflate")]
            if let (Some(params), Some(config)) = (&deflate, compression) {
                outbox.set_compressor(crate::proto::deflate::Compressor::new(role, params, config));
            }
        }
        #[cfg(not(feature = "deflate"))]
        let _ = compression;
        let session = Session::with_deflate(role, limits, hub.pool.clone(), deflate.as_ref());
        let dispatch = Dispatch::open(handler.clone(), session, conn, state);
        (dispatch, registration)
    }

    /// Calls `on_open`. The `101` response should already be in the queue, so
    /// anything `on_open` sends follows it.
    /// Failures the session finds are held, then answered at once unless
    /// the handler has messages to catch up on (see `input`).
    pub(crate) fn open(handler: Arc<H>, mut session: Session, conn: Conn, state: H::State) -> Self {
        session.hold_closes();
        conn.shared().lock().schedule_flush();
        let mut dispatch = Dispatch {
            session,
            app: App {
                handler,
                conn,
                state,
                closed: false,
            },
            aborted: false,
            quiet: 0,
        };
        match dispatch.app.on_open() {
            Err(panicked) => dispatch.fail_after_panic(panicked),
            Ok(()) => dispatch.attend(),
        }
        dispatch
    }

    /// Handles the complete frames in `input`, leaving only a partial frame;
    /// or stops early, leaving whole frames too, once the outbound queue
    /// holds `max_outbound_bytes`: then it returns [`Input::QueueFull`], and
    /// the rest is to be handed over again once the queue is written down (so a
    /// handler that answers every message never finds the queue full). Call
    /// whenever bytes arrive: that is what keeps the connection from
    /// counting as idle.
    pub(crate) fn input(&mut self, input: &mut BytesMut) -> Input {
        let mut messages = 0;
        let done = self.handle_input(input, &mut messages);
        self.app
            .conn
            .shared()
            .outbound()
            .meters
            .received(messages, 0);
        done
    }

    /// [`Dispatch::input`], counting the messages handed to the handler.
    fn handle_input(&mut self, input: &mut BytesMut, messages: &mut u64) -> Input {
        self.heard_from_peer();
        let max = self.app.conn.shared().outbound().max_bytes;
        let mut first = true;
        loop {
            let (event, waiting) = {
                let mut outbox = self.app.conn.shared().lock();
                if std::mem::take(&mut first) {
                    // The driver writes what handling this input queues:
                    // senders need not wake it meanwhile.
                    outbox.schedule_flush();
                }
                if self.session.has_unread(input) {
                    if outbox.queued() >= max {
                        return Input::QueueFull;
                    }
                    if self.is_reading_paused() {
                        return Input::ReadingPaused;
                    }
                }
                // The session holds closes (see `open`): the peer's close
                // finds its reply held if it comes while the session is open.
                let was_open = self.session.is_open();
                let event = self.session.poll_event(input, outbox.queue());
                let mut waiting = None;
                if matches!(event, Ok(Some(Event::Closed { .. }))) && !was_open {
                    // It answers our close: nothing more may be sent, so
                    // senders are turned away before the lock is released. (A
                    // held close is queued by `release_close`, which turns
                    // them away under the same lock.)
                    waiting = outbox.close_sends();
                }
                (event, waiting)
            };
            wake_all(waiting);
            match event {
                Ok(None) => return Input::Done,
                Ok(Some(Event::Message(message))) => {
                    *messages += 1;
                    if let Err(panicked) = self.app.on_message(message) {
                        self.fail_after_panic(panicked);
                        return Input::Done;
                    }
                    if self.app.conn.shared().take_attention() {
                        self.attend();
                        if self.aborted {
                            return Input::Done;
                        }
                    }
                }
                Ok(Some(Event::Ping(_) | Event::Pong(_))) => {}
                Ok(Some(Event::Closed { code, reason })) => {
                    // Out of the read buffer, which the session still borrows.
                    let reason = reason.to_owned();
                    if self.settle_held_close("") {
                        // Sends stay open for the replies to what came
                        // before the close; `attend` answers it when the
                        // handler closes, the close timeout at the latest.
                        tracing::debug!(
                            id = self.app.conn.id(),
                            "answering the peer's close once the handler has caught up"
                        );
                    }
                    self.app.on_close(code, &reason);
                    return Input::Done;
                }
                Err(error) => {
                    let id = self.app.conn.id();
                    if self.settle_held_close(error.reason) {
                        // Sends stay open for the replies; `attend`
                        // answers the failure when the handler closes.
                        tracing::debug!(id, %error, "failing connection once the handler has caught up");
                        self.app.on_close(error.code, error.reason);
                        return Input::Done;
                    }
                    tracing::debug!(id, %error, "failing connection");
                    self.finish(error.code, error.reason);
                    return Input::Done;
                }
            }
        }
    }

    /// Acts on a close request or abort signalled through the `Conn`. Call when
    /// the task was woken, or after `take_attention` returned true; after an
    /// abort, [`Dispatch::is_aborted`] is true.
    pub(crate) fn attend(&mut self) {
        let mut outbox = self.app.conn.shared().lock();
        if outbox.is_aborted() {
            drop(outbox);
            self.aborted = true;
            self.finish(CloseCode::ABNORMAL, "connection aborted by server shutdown");
            return;
        }
        if let Some((code, reason)) = outbox.take_close_request() {
            if self.session.release_close(&reason, outbox.queue()) {
                let waiting = outbox.close_sends();
                drop(outbox);
                wake_all(waiting);
            } else {
                self.session.close(code, &reason, outbox.queue());
            }
        }
    }

    /// Whether a close frame (a protocol failure's, or the reply to the
    /// peer's close) waits for the handler to catch up (see
    /// `Handler::has_unhandled_messages`): nothing is read meanwhile.
    pub(crate) fn holds_close(&self) -> bool {
        self.session.held_close().is_some()
    }

    /// Decides a close the session holds (the reply to the peer's close, or
    /// a protocol failure's close) as the connection's input ends in it: it
    /// stays held while the handler has messages it has not answered yet
    /// (`Handler::has_unhandled_messages`), and is queued now otherwise.
    /// Returns whether it stays held; false when none is held.
    fn settle_held_close(&mut self, reason: &str) -> bool {
        if !self.holds_close() {
            return false;
        }
        if self.app.has_unhandled_messages() {
            return true;
        }
        self.release_close(reason);
        false
    }

    /// Queues a held close now (the handler caught up, or the close timeout
    /// passed): its close frame is queued and sends are refused.
    pub(crate) fn release_close(&mut self, reason: &str) {
        let waiting = {
            let mut outbox = self.app.conn.shared().lock();
            self.session.release_close(reason, outbox.queue());
            outbox.close_sends()
        };
        wake_all(waiting);
    }

    /// The peer showed it is alive: bytes arrived (`input` calls this), a
    /// write that had to wait for room went through (the peer read), or bytes
    /// arrived that wait while reading is paused. The last two keep a peer
    /// that reads slowly, behind a long queue, from counting as idle.
    pub(crate) fn heard_from_peer(&mut self) {
        self.quiet = 0;
    }

    /// One keepalive sweep over this connection: pings it or closes it if its
    /// peer has been quiet long enough (see `keepalive`).
    pub(crate) fn sweep(&mut self, sweep: &Sweep) {
        if self.is_open() {
            sweep.visit(&mut self.quiet, &self.app.conn);
        }
    }

    /// Call once the queue has been written out completely, with whether a
    /// send had been refused as full since (`Outbox::take_wants_drain`,
    /// taken under the lock that saw the queue empty): runs `on_drain` if
    /// one had. True if it ran (it may have queued more).
    pub(crate) fn flushed(&mut self, wanted_drain: bool) -> bool {
        if !wanted_drain {
            return false;
        }
        if let Err(panicked) = self.app.on_drain() {
            self.fail_after_panic(panicked);
        }
        true
    }

    /// Writes what is queued through `write` (see `Outbox::write_with`);
    /// from here on a send wakes the driver again (at most the first one,
    /// while the write is blocked).
    pub(crate) fn write_with(
        &mut self,
        pool: &BufferPool,
        write: impl FnMut(&[io::IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<Written> {
        let shared = self.app.conn.shared();
        let mut outbox = shared.lock();
        outbox.unschedule_flush();
        let written = outbox.write_with(pool, write);
        let messages = outbox.take_messages();
        drop(outbox);
        shared.outbound().meters.sent(messages, 0);
        written
    }

    /// Moves what is queued into `into`, for a write that owns its buffers
    /// until it completes (io_uring).
    pub(crate) fn take_for_send(&mut self, into: &mut WriteQueue) {
        let shared = self.app.conn.shared();
        let messages = {
            let mut outbox = shared.lock();
            outbox.take_for_send(into);
            outbox.take_messages()
        };
        shared.outbound().meters.sent(messages, 0);
    }

    /// `n` bytes of what [`Dispatch::take_for_send`] took are no longer
    /// being sent (written, or never to be after a failure).
    pub(crate) fn no_longer_sending(&mut self, n: usize) {
        self.app.conn.shared().lock().no_longer_sending(n);
    }

    /// What a write took and did not write goes back to the head of the
    /// queue (a handoff stopped it: see `Outbox::put_back`).
    #[cfg(all(target_os = "linux", feature = "handoff", feature = "uring"))]
    pub(crate) fn give_back(&mut self, unsent: &mut WriteQueue, pool: &crate::pool::BufferPool) {
        self.app.conn.shared().lock().put_back(unsent, pool);
    }

    /// The outbound queue as the driver's next step needs it, under one
    /// lock: whether it is written out (then a send wakes the driver again,
    /// and whether a send was refused as full since is taken), and wakes
    /// the async senders waiting for room once it is below `producer_wake`.
    pub(crate) fn queue_state(&mut self, producer_wake: usize) -> QueueState {
        let mut outbox = self.app.conn.shared().lock();
        let flushed = outbox.is_flushed();
        let mut wanted_drain = false;
        if flushed {
            outbox.unschedule_flush();
            wanted_drain = outbox.take_wants_drain();
        }
        let waiting = outbox.take_waiting_if_room(producer_wake);
        let state = QueueState {
            flushed,
            has_queued: outbox.has_queued(),
            bytes: outbox.queued(),
            wanted_drain,
        };
        drop(outbox);
        wake_all(waiting);
        state
    }

    /// The connection ended without a close handshake (TCP closed or broke, or
    /// the close handshake timed out): report 1006.
    pub(crate) fn abnormal(&mut self, reason: &str) {
        self.finish(CloseCode::ABNORMAL, reason);
    }

    /// The connection's handle (the driver uses its outbox).
    pub(crate) fn conn(&self) -> &Conn {
        &self.app.conn
    }

    /// True once nothing more is to be read: the close handshake is complete, or
    /// the connection failed. Write the queue out, then end TCP.
    pub(crate) fn is_closed(&self) -> bool {
        (self.session.is_closed() || self.app.closed) && !self.holds_close()
    }

    /// True once the peer's close frame has arrived (see `Session::peer_closed`).
    pub(crate) fn peer_closed(&self) -> bool {
        self.session.peer_closed()
    }

    /// Which end of the connection this is.
    pub(crate) fn role(&self) -> Role {
        self.session.role()
    }

    /// The application paused reading (`Conn::pause_reading`). Only while
    /// open: once a close frame was sent or received no message is delivered
    /// any more, and the close handshake needs the peer's frames read.
    pub(crate) fn is_reading_paused(&self) -> bool {
        self.is_open() && self.app.conn.shared().is_reading_paused()
    }

    /// True until a close frame was sent or received, or the connection ended.
    pub(crate) fn is_open(&self) -> bool {
        self.session.is_open() && !self.app.closed
    }

    /// True if the server forced this connection down: drop it at once.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// How many bytes the frame being received still needs, to size reads.
    pub(crate) fn bytes_wanted(&self) -> usize {
        self.session.bytes_wanted()
    }

    fn fail_after_panic(&mut self, Panicked(callback): Panicked) {
        tracing::error!(
            id = self.app.conn.id(),
            callback,
            "handler panicked; closing with 1011"
        );
        let waiting = {
            let mut outbox = self.app.conn.shared().lock();
            self.session.fail(
                CloseCode::INTERNAL_ERROR,
                "handler panicked",
                outbox.queue(),
            );
            outbox.close_sends()
        };
        wake_all(waiting);
        self.finish(CloseCode::INTERNAL_ERROR, "handler panicked");
    }

    /// Ends the connection: no more sends, the session is closed (a close frame,
    /// if one is due, was queued by the session already), and `on_close` runs once.
    fn finish(&mut self, code: CloseCode, reason: &str) {
        if !self.session.is_closed() {
            self.session.abandon();
        }
        let waiting = self.app.conn.shared().lock().close_sends();
        wake_all(waiting);
        self.app.conn.leave_all();
        self.app.on_close(code, reason);
    }
}

/// The handoff (feature `handoff`): a connection leaving this process, or
/// arriving from the previous one.
#[cfg(all(target_os = "linux", feature = "handoff"))]
impl<H: Handler> Dispatch<H> {
    /// The connection as a record, or why it stays: it is closing, its
    /// queue cannot move (see `Outbox::hand_off`), its limits are above
    /// `ceiling` (the successor, with the same settings, would refuse
    /// them), its session cannot move (`Unmovable`), or the handler keeps
    /// it (`Handler::hand_off`). Once it returns a record, the connection
    /// is over here without a word: no `on_close`, sends fail.
    pub(crate) fn hand_off(
        &mut self,
        input: &mut BytesMut,
        ceiling: crate::proto::Limits,
    ) -> Result<super::record::OpenRecord, &'static str> {
        if self.aborted || !self.is_open() {
            return Err("closing");
        }
        // Everything that can keep it here is asked before the handler is:
        // a handler told its connection moves may let go of its state.
        self.session
            .movable()
            .map_err(crate::proto::Unmovable::reason)?;
        let limits = self.session.limits();
        if limits.max_frame_size > ceiling.max_frame_size
            || limits.max_message_size > ceiling.max_message_size
        {
            return Err("its limits are above the server's");
        }
        let shared = self.app.conn.shared();
        {
            let outbox = shared.lock();
            if !outbox.may_hand_off() {
                return Err("closing, writing, or its compressor keeps its context");
            }
            if outbox.queued().saturating_add(input.len()) > super::record::MAX_CARRIED {
                return Err("more queued and unread than a record carries");
            }
        }
        let (handler, conn, state) = (&self.app.handler, &self.app.conn, &mut self.app.state);
        let state = catch_unwind(AssertUnwindSafe(|| handler.hand_off(conn, state)))
            .map_err(|_| "the handler's hand_off panicked")?
            .ok_or("the handler keeps its connections")?;
        // From here on under the outbox's lock: no send slips in between
        // the queue leaving and the sends being refused. Only a close asked
        // for meanwhile (another thread's `Conn::close`) keeps it now.
        let mut outbox = shared.lock();
        if !outbox.may_hand_off() {
            return Err("closing");
        }
        let session = self
            .session
            .snapshot(input)
            .map_err(crate::proto::Unmovable::reason)?;
        let (output, compressor, waiting) = outbox.hand_off(shared.pool()).ok_or("closing")?;
        drop(outbox);
        wake_all(waiting);
        self.app.conn.leave_all();
        // It lives on elsewhere: the drop calls no `on_close`.
        self.app.closed = true;
        Ok(super::record::OpenRecord {
            session,
            input: input.split().to_vec(),
            output,
            compressor,
            quiet: self.quiet,
            reading_paused: shared.is_reading_paused(),
            state,
        })
    }

    /// A connection handed over by the previous process, with its `session`
    /// restored from `record`: counted as open, its queued bytes first in
    /// its queue, its state from `Handler::take_over` (no `on_open`: it ran
    /// there). Returns the bytes it had read and not handled, for
    /// [`Dispatch::input`] before anything new. `Err` with the bytes to
    /// write before closing (what was queued, then a close frame with
    /// 1012) if the handler refuses it.
    pub(crate) fn take_over(
        hub: &Arc<Hub>,
        handler: &Arc<H>,
        peer: SocketAddr,
        mut session: Session,
        record: super::record::OpenRecord,
        wake: ConnWake,
    ) -> Result<(Self, Registration, BytesMut), Vec<u8>> {
        let role = session.role();
        let (conn, registration) = hub.open_connection(peer, wake, role);
        let super::record::OpenRecord {
            input,
            output,
            compressor,
            quiet,
            reading_paused,
            state,
            ..
        } = record;
        // What it had queued goes first, before anything the handler or a
        // publisher sends it now.
        {
            let mut outbox = conn.shared().lock();
            outbox.take_over(&output, compressor);
            outbox.schedule_flush();
        }
        if reading_paused {
            conn.pause_reading();
        }
        let taken = catch_unwind(AssertUnwindSafe(|| handler.take_over(&conn, &state)));
        let Ok(Some(state)) = taken else {
            tracing::warn!(%peer, "the handler refused a connection handed over; closing it with 1012");
            let (mut bytes, waiting) = conn.shared().lock().give_up(&hub.pool);
            wake_all(waiting);
            conn.leave_all();
            let mut goodbye = WriteQueue::with_role(role);
            session.close(CloseCode::SERVICE_RESTART, "service restart", &mut goodbye);
            goodbye.move_into(&mut bytes);
            return Err(bytes);
        };
        let dispatch = Dispatch {
            session,
            app: App {
                handler: handler.clone(),
                conn,
                state,
                closed: false,
            },
            aborted: false,
            quiet,
        };
        Ok((dispatch, registration, BytesMut::from(&input[..])))
    }
}

impl<H: Handler> Drop for Dispatch<H> {
    /// Whatever ends the connection (even a runtime dropping its task), later
    /// sends fail, buffers go back to the pool, and `on_close` has run once.
    fn drop(&mut self) {
        let shared = self.app.conn.shared();
        let waiting = shared.lock().clear(shared.pool());
        wake_all(waiting);
        self.app.conn.leave_all();
        self.app.on_close(CloseCode::ABNORMAL, "connection dropped");
    }
}
