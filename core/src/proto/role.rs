//! Which end of a connection this is: the two differ in masking (a client
//! masks every frame it sends, a server none), in which frames they refuse
//! (a server fails an unmasked frame, a client a masked one), and in which
//! permessage-deflate parameters govern their compressor and inflater.

use super::frame::DecodeRules;

/// The end of the connection this side plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Accepted the connection: receives masked frames, sends unmasked ones.
    Server,
    /// Opened the connection: receives unmasked frames, masks what it sends.
    Client,
}

impl Role {
    /// The header checks for frames this side receives (no extension bits).
    pub(crate) fn decode_rules(self) -> DecodeRules {
        match self {
            Role::Server => DecodeRules::SERVER,
            Role::Client => DecodeRules::CLIENT,
        }
    }
}
