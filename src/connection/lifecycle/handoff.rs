//! A connection leaving for the next process, or arriving from the previous
//! one (the handoff, feature `handoff`): between two turns, whatever its
//! stage, its state becomes a [`Moved`] record and back. What cannot move
//! (a request being answered, a connection closing or failing, a write in
//! flight) stays, and the old process finishes it.

use std::time::Instant;

use bytes::BytesMut;

use super::{Env, Lifecycle, Open, Stage};
use crate::connection::dispatch::Dispatch;
use crate::connection::handler::Handler;
use crate::connection::hub::LiveGuard;
use crate::connection::record::{Arriving, ArrivingStage, Moved};
use crate::connection::wake::ConnWake;

impl<H: Handler> Lifecycle<H> {
    /// The connection as a record, with `input` (the driver's read buffer,
    /// emptied) in it. Then the lifecycle is over without a word (no
    /// `on_close`, no close frame, no FIN): drop the socket, whose
    /// descriptor the successor has. `Err` says why it stays, unchanged.
    pub(crate) fn hand_off(
        &mut self,
        input: &mut BytesMut,
        env: &Env<H>,
    ) -> Result<Moved, &'static str> {
        if self.ending.is_some() || self.read_closed {
            return Err("closing");
        }
        if self.writing {
            return Err("a write is in flight");
        }
        let moved = match &mut self.stage {
            Stage::Handshake(handshake) => {
                if handshake.refused || !handshake.response.is_empty() {
                    return Err("answering a request");
                }
                // (The successor would not know the header was still to come.)
                if handshake.proxy_header {
                    return Err("waiting for its PROXY protocol header");
                }
                Moved::Handshake {
                    input: input.split().to_vec(),
                }
            }
            Stage::Open(open) => {
                let ceiling = env.hub.config.limits;
                Moved::Open(Box::new(open.dispatch.hand_off(input, ceiling)?))
            }
            Stage::Done => return Err("over"),
        };
        self.stage = Stage::Done;
        Ok(moved)
    }

    /// Requests and input are handled again after a failed handoff (see
    /// `Hub::freeze_requests`, `freeze_input`): what waited in
    /// `input` (a whole request, frames) is handled now, with no new bytes
    /// to prompt it.
    pub(crate) fn thaw(&mut self, input: &mut BytesMut, env: &Env<H>) {
        let waiting = matches!(self.stage, Stage::Handshake(_) | Stage::Open(_));
        if waiting && !input.is_empty() {
            self.handle_input(input, env, Instant::now());
        }
    }

    /// A connection handed over by the previous process, as it was there:
    /// a request coming in, or open. Returns the bytes it had read and not
    /// handled: the driver's read buffer, to [`Lifecycle::handle_input`] before
    /// reading more. `Err` with bytes to write before closing the socket
    /// (what was queued and a close frame with 1012) if the handler
    /// refuses it.
    pub(crate) fn take_over(
        arriving: Arriving,
        live: LiveGuard,
        wake: ConnWake,
        env: &Env<H>,
        now: Instant,
    ) -> Result<(Self, BytesMut), Vec<u8>> {
        let Arriving { peer, stage } = arriving;
        match stage {
            ArrivingStage::Handshake(input) => {
                let life = Lifecycle::accept(peer, live, wake, env, now);
                Ok((life, BytesMut::from(&input[..])))
            }
            ArrivingStage::Open { session, record } => {
                let (hub, handler) = (&env.hub, &env.handler);
                let (dispatch, registration, input) =
                    Dispatch::take_over(hub, handler, peer, session, *record, wake)?;
                let open = Open {
                    dispatch,
                    _registration: registration,
                };
                Ok((Lifecycle::new(Stage::Open(open), live), input))
            }
        }
    }
}
