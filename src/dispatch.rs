//! Between the protocol and the handler: turns session events into callbacks.
//!
//! This is the part of a connection both backends share once the handshake is
//! done. A backend reads bytes and calls [`Dispatch::input`]; the session finds
//! the events, automatic replies go into the connection's outbound queue, and the
//! handler's callbacks run in order. Panics in callbacks are caught here and fail
//! only this connection, with 1011. The backend then writes the queue and asks
//! whether the connection is over.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use bytes::BytesMut;

use crate::conn::{Conn, Phase};
use crate::handler::Handler;
use crate::proto::{CloseCode, Event, Session};

/// One upgraded connection's protocol state, handler state and handle.
pub(crate) struct Dispatch<H: Handler> {
    handler: Arc<H>,
    session: Session,
    conn: Conn,
    state: H::State,
    /// `on_close` has been called.
    reported: bool,
    /// The server forced this connection down; drop it without closing politely.
    aborted: bool,
}

/// What the backend should do after [`Dispatch::attend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attention {
    Continue,
    /// The server forced this connection down: drop it without further ado.
    Abort,
}

impl<H: Handler> Dispatch<H> {
    /// Calls `on_open`. The `101` response should already be in the queue, so
    /// anything `on_open` sends follows it.
    pub(crate) fn open(handler: Arc<H>, session: Session, conn: Conn, state: H::State) -> Self {
        let mut dispatch = Dispatch {
            handler,
            session,
            conn,
            state,
            reported: false,
            aborted: false,
        };
        dispatch.conn.shared().lock().flush_scheduled = true;
        let Dispatch {
            handler,
            conn,
            state,
            ..
        } = &mut dispatch;
        if catch_unwind(AssertUnwindSafe(|| handler.on_open(conn, state))).is_err() {
            dispatch.fail_after_panic("on_open");
        } else {
            dispatch.attend();
        }
        dispatch
    }

    /// Handles every complete frame in `input`, leaving only a partial frame.
    pub(crate) fn input(&mut self, input: &mut BytesMut) {
        self.conn.shared().lock().flush_scheduled = true;
        loop {
            let event = {
                let mut outbox = self.conn.shared().lock();
                let event = self.session.read(input, &mut outbox.queue);
                if matches!(event, Err(_) | Ok(Some(Event::Closed { .. }))) {
                    // The close frame is in the queue: no data frame may follow
                    // it, so senders are turned away before the lock is released.
                    outbox.phase = Phase::Closed;
                }
                event
            };
            match event {
                Ok(None) => return,
                Ok(Some(Event::Message(message))) => {
                    let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        handler.on_message(conn, state, message)
                    }));
                    if outcome.is_err() {
                        self.fail_after_panic("on_message");
                        return;
                    }
                    if self.conn.shared().take_attention() && self.attend() == Attention::Abort {
                        return;
                    }
                }
                Ok(Some(Event::Ping(_) | Event::Pong(_))) => {}
                Ok(Some(Event::Closed { code, reason })) => {
                    report_close(
                        &mut self.reported,
                        &*self.handler,
                        &self.conn,
                        &mut self.state,
                        code,
                        reason,
                    );
                    return;
                }
                Err(error) => {
                    tracing::debug!(id = self.conn.id(), %error, "failing connection");
                    self.finish(error.code, error.reason);
                    return;
                }
            }
        }
    }

    /// Acts on a close request or abort signalled through the `Conn`. Call when
    /// the task was woken, or after `take_attention` returned true.
    pub(crate) fn attend(&mut self) -> Attention {
        let mut outbox = self.conn.shared().lock();
        if outbox.abort {
            drop(outbox);
            self.aborted = true;
            self.finish(CloseCode::ABNORMAL, "connection aborted by server shutdown");
            return Attention::Abort;
        }
        if let Some((code, reason)) = outbox.close_request.take() {
            self.session.close(code, &reason, &mut outbox.queue);
        }
        Attention::Continue
    }

    /// Call once the queue has been written out completely: runs `on_drain` if a
    /// send had been refused as full.
    pub(crate) fn flushed(&mut self) {
        let wanted = std::mem::take(&mut self.conn.shared().lock().wants_drain);
        if wanted && !self.reported {
            let (handler, conn, state) = (&self.handler, &self.conn, &mut self.state);
            if catch_unwind(AssertUnwindSafe(|| handler.on_drain(conn, state))).is_err() {
                self.fail_after_panic("on_drain");
            }
        }
    }

    /// The connection ended without a close handshake (TCP closed or broke, or
    /// the close handshake timed out): report 1006.
    pub(crate) fn abnormal(&mut self, reason: &str) {
        self.finish(CloseCode::ABNORMAL, reason);
    }

    /// True once nothing more is to be read: the close handshake is complete, or
    /// the connection failed. Write the queue out, then end TCP.
    pub(crate) fn is_closed(&self) -> bool {
        self.session.is_closed() || self.reported
    }

    /// True until a close frame was sent or received, or the connection ended.
    pub(crate) fn is_open(&self) -> bool {
        self.session.is_open() && !self.reported
    }

    /// True if the server forced this connection down: drop it at once.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// How many bytes the frame being received still needs, to size reads.
    pub(crate) fn bytes_wanted(&self) -> usize {
        self.session.bytes_wanted()
    }

    fn fail_after_panic(&mut self, callback: &'static str) {
        tracing::error!(
            id = self.conn.id(),
            callback,
            "handler panicked; closing with 1011"
        );
        {
            let mut outbox = self.conn.shared().lock();
            self.session.fail(
                CloseCode::INTERNAL_ERROR,
                "handler panicked",
                &mut outbox.queue,
            );
        }
        self.finish(CloseCode::INTERNAL_ERROR, "handler panicked");
    }

    /// Ends the connection: no more sends, the session is closed (a close frame,
    /// if one is due, was queued by the session already), and `on_close` runs once.
    fn finish(&mut self, code: CloseCode, reason: &str) {
        if !self.session.is_closed() {
            self.session.abandon();
        }
        self.conn.shared().lock().phase = Phase::Closed;
        report_close(
            &mut self.reported,
            &*self.handler,
            &self.conn,
            &mut self.state,
            code,
            reason,
        );
    }
}

impl<H: Handler> Drop for Dispatch<H> {
    /// Whatever ends the connection (even a runtime dropping its task), later
    /// sends fail, buffers go back to the pool, and `on_close` has run once.
    fn drop(&mut self) {
        {
            let shared = self.conn.shared();
            let mut outbox = shared.lock();
            outbox.phase = Phase::Closed;
            outbox.close_request = None;
            let written_or_not = outbox.queue.len();
            outbox.queue.advance(written_or_not);
            if let Some(buf) = outbox.queue.take_buffer() {
                shared.pool().give(buf);
            }
        }
        report_close(
            &mut self.reported,
            &*self.handler,
            &self.conn,
            &mut self.state,
            CloseCode::ABNORMAL,
            "connection dropped",
        );
    }
}

/// Calls `on_close` unless it already ran; a panic in it is logged and ignored.
fn report_close<H: Handler>(
    reported: &mut bool,
    handler: &H,
    conn: &Conn,
    state: &mut H::State,
    code: CloseCode,
    reason: &str,
) {
    if std::mem::replace(reported, true) {
        return;
    }
    if catch_unwind(AssertUnwindSafe(|| {
        handler.on_close(conn, state, code, reason)
    }))
    .is_err()
    {
        tracing::error!(id = conn.id(), "on_close panicked");
    }
}
