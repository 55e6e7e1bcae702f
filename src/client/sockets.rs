//! [`Inboxes`]: the handler behind a client that hands out
//! [`WebSocket`](crate::socket::WebSocket)s. Each connection's messages go
//! into the socket's bounded inbox, as with the server's `SocketHandler`;
//! there is no function to spawn, since the caller of `Client::connect`
//! gets the socket.

use std::sync::Arc;

use crate::connection::conn::Conn;
use crate::connection::handler::Handler;
use crate::proto::{CloseCode, Message};
use crate::socket::DEFAULT_INBOX_LIMIT;
use crate::socket::inbox::Inbox;

/// The handler of a [`Client`](super::Client) made with
/// [`Client::new`](super::Client::new): its connections are
/// [`WebSocket`](crate::socket::WebSocket)s.
#[derive(Clone, Debug)]
pub struct Inboxes {
    pub(super) inbox_limit: usize,
}

impl Default for Inboxes {
    fn default() -> Self {
        Inboxes {
            inbox_limit: DEFAULT_INBOX_LIMIT,
        }
    }
}

/// A [`Inboxes`] connection's state: its socket's inbox.
pub struct Slot {
    pub(super) inbox: Arc<Inbox>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

impl Handler for Inboxes {
    type State = Slot;

    fn on_message(&self, conn: &Conn, slot: &mut Slot, message: Message<'_>) {
        slot.inbox.push(message.into_owned(), conn);
    }

    /// As the server's `SocketHandler`: while the socket reads, the
    /// server's close (or a failure's) waits for `recv` to return the end.
    fn has_unhandled_messages(&self, slot: &Slot) -> bool {
        slot.inbox.is_read()
    }

    fn on_close(&self, _: &Conn, slot: &mut Slot, code: CloseCode, reason: &str) {
        slot.inbox.end(code, reason);
    }
}
