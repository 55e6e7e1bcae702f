//! A connection's PROXY protocol header, read before its request when its
//! listener asks for one (`Config::proxy_protocol`): the client's address
//! becomes the connection's, or the connection is closed without a word.

use std::time::Instant;

use bytes::BytesMut;

use super::{Env, Handshake, Lifecycle, Stage, refuse};
use crate::connection::handler::Handler;
use crate::connection::hub::Hub;
use crate::connection::proxied::{Header, read_header};

impl<H: Handler> Lifecycle<H> {
    /// A connection just accepted on a listener with the PROXY protocol:
    /// its header comes first (before TLS, if the listener has TLS). One
    /// from a source the listener does not list is refused at once. (A
    /// driver that read the header itself, before TLS, does not call
    /// this.)
    pub(crate) fn expect_proxy_header(&mut self, env: &Env<H>, now: Instant) {
        let Some(protocol) = &env.hub.config.proxy_protocol else {
            return;
        };
        let Stage::Handshake(handshake) = &mut self.stage else {
            return;
        };
        // Set when refused too: what such a peer sends is never read as
        // a request, or under TLS as a handshake.
        handshake.proxy_header = true;
        if !protocol.admits(handshake.peer.ip()) {
            tracing::debug!(peer = %handshake.peer, "not a listed PROXY protocol source; connection closed");
            env.hub.meters().rejected("proxy_source");
            refuse(handshake, &env.hub, now);
        }
    }

    /// Whether the PROXY header is still to come. A driver with TLS reads
    /// it off the raw bytes, before TLS, with
    /// [`Lifecycle::handle_proxy_header`].
    pub(crate) fn awaits_proxy_header(&self) -> bool {
        matches!(&self.stage, Stage::Handshake(handshake) if handshake.proxy_header)
    }

    /// The PROXY header off the front of `raw`, the bytes before TLS,
    /// once it is all there: true once it was read (what follows it is
    /// left in `raw`, the TLS handshake's). A header that does not read
    /// refuses the connection, closed at the next `poll_action`.
    pub(crate) fn handle_proxy_header(
        &mut self,
        raw: &mut BytesMut,
        env: &Env<H>,
        now: Instant,
    ) -> bool {
        let Stage::Handshake(handshake) = &mut self.stage else {
            return false;
        };
        if handshake.refused {
            // Refused already (a source not listed, a header that did not
            // read): what comes is dropped, once, not read again.
            raw.clear();
            return false;
        }
        if handshake.proxy_header {
            take(handshake, raw, &env.hub, now);
        }
        !handshake.proxy_header && !handshake.refused
    }

    /// Whether the connection was refused before its request was read (a
    /// PROXY protocol source not listed): the driver gives it a turn at
    /// once, which closes it.
    pub(crate) fn is_refused(&self) -> bool {
        matches!(&self.stage, Stage::Handshake(handshake) if handshake.refused)
    }
}

/// Reads the header off `input` once it is all there: true if the request
/// may be read next (what follows the header is left in `input`).
pub(super) fn take(
    handshake: &mut Handshake,
    input: &mut BytesMut,
    hub: &Hub,
    now: Instant,
) -> bool {
    match read_header(input, &mut handshake.peer) {
        Header::Waiting => false,
        Header::Read => {
            handshake.proxy_header = false;
            !input.is_empty()
        }
        Header::Refused(why) => {
            tracing::debug!(peer = %handshake.peer, why, "connection closed");
            hub.meters().rejected("proxy_header");
            refuse(handshake, hub, now);
            input.clear();
            false
        }
    }
}
