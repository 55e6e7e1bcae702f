//! A server loop's part in a shutdown: each loop (a tokio group, an io_uring
//! reactor, a stream connection's task) reaches its own connections once per
//! step (close with 1001 or hand to the spread, then abort), since no shared
//! table lists them.

use crate::connection::conn::Conn;
use crate::connection::hub::Hub;

/// What one server loop (a tokio group, an io_uring reactor, a stream
/// connection's task) has acted on of the server's shutdown: each step
/// reaches its connections once.
#[derive(Default)]
pub(crate) struct ShutdownSeen {
    shutdown: bool,
    abort: bool,
}

impl ShutdownSeen {
    /// Acts on what is new: a shutdown asks each open connection to close
    /// with 1001 (or hands it to the spread shutdown), an abort makes each drop at once. `each` calls its
    /// argument on every open connection of the loop. Both are looked at
    /// every time: a loop first run after both flags were set must not spend
    /// the abort's wake-up on the shutdown. True if it acted (the loop then
    /// gives its connections a turn).
    pub(crate) fn act(&mut self, hub: &Hub, mut each: impl FnMut(&dyn Fn(&Conn))) -> bool {
        let mut acted = false;
        if !self.shutdown && hub.is_shutting_down() {
            self.shutdown = true;
            each(&|conn| hub.close_for_shutdown(conn));
            acted = true;
        }
        if !self.abort && hub.is_aborting() {
            self.abort = true;
            each(&|conn| conn.shared().abort());
            acted = true;
        }
        acted
    }

    /// Whether the loop has seen the shutdown.
    pub(crate) fn shutdown(&self) -> bool {
        self.shutdown
    }
}
