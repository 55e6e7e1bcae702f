//! What one connection agreed to for permessage-deflate, and which of it
//! applies to each side's compressor and inflater.

use crate::proto::Role;

/// The permessage-deflate parameters of one connection (RFC 7692 §7.1), as
/// agreed in the handshake. Every parameter the server's response carries is
/// one RFC 7692 allows in answer to the offer that was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateParams {
    /// The LZ77 window the server compresses with, as a power of two (9..=15).
    pub server_max_window_bits: u8,
    /// The server starts every message with an empty window.
    pub server_no_context_takeover: bool,
    /// The client starts every message with an empty window, so the server
    /// needs no inflate state between messages.
    pub client_no_context_takeover: bool,
    /// The LZ77 window the client compresses with (9..=15; 15 unless the
    /// server asked for less).
    pub client_max_window_bits: u8,
    /// The offer limited the server's window, so the response must confirm it.
    pub(crate) announce_server_window: bool,
}

impl DeflateParams {
    /// The window `role` compresses with.
    pub fn send_window_bits(&self, role: Role) -> u8 {
        match role {
            Role::Server => self.server_max_window_bits,
            Role::Client => self.client_max_window_bits,
        }
    }

    /// Whether `role` keeps its compression context from one message to the
    /// next.
    pub fn send_keeps_context(&self, role: Role) -> bool {
        match role {
            Role::Server => !self.server_no_context_takeover,
            Role::Client => !self.client_no_context_takeover,
        }
    }

    /// Whether the peer of `role` keeps its context, so that `role` must keep
    /// its inflate window between messages.
    pub fn receive_keeps_context(&self, role: Role) -> bool {
        match role {
            Role::Server => !self.client_no_context_takeover,
            Role::Client => !self.server_no_context_takeover,
        }
    }

    /// Parameters as a server without a window limit agrees them: both
    /// windows 15, and each side's context takeover as given. For tests and
    /// benchmarks that need parameters without a handshake.
    pub fn new(server_no_context_takeover: bool, client_no_context_takeover: bool) -> Self {
        DeflateParams {
            server_max_window_bits: 15,
            server_no_context_takeover,
            client_no_context_takeover,
            client_max_window_bits: 15,
            announce_server_window: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_reads_its_own_side_of_the_parameters() {
        let params = DeflateParams {
            server_max_window_bits: 10,
            server_no_context_takeover: true,
            client_no_context_takeover: false,
            client_max_window_bits: 12,
            announce_server_window: true,
        };
        assert_eq!(params.send_window_bits(Role::Server), 10);
        assert_eq!(params.send_window_bits(Role::Client), 12);
        assert!(!params.send_keeps_context(Role::Server));
        assert!(params.send_keeps_context(Role::Client));
        assert!(params.receive_keeps_context(Role::Server));
        assert!(!params.receive_keeps_context(Role::Client));
    }
}
