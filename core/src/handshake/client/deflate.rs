//! permessage-deflate from the client's side (RFC 7692 §5, §7.1): the offer
//! its request makes, and the check of the server's answer, which yields the
//! parameters the client's compressor and inflater follow.
//!
//! Both are derived from one [`Offer`], so what is checked is exactly what
//! was written.

use super::error::ClientHandshakeError;
use crate::handshake::extensions::{Param, parse_extensions};
use crate::handshake::negotiate::{KnownParam, known_param, window_bits};
use crate::proto::deflate::{DeflateConfig, DeflateParams};

/// What the request offers, from the client's `DeflateConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Offer {
    /// `server_no_context_takeover`: the server must confirm it.
    pub(super) server_no_context_takeover: bool,
    /// `client_no_context_takeover`: a promise; the client keeps it whatever
    /// the answer.
    pub(super) client_no_context_takeover: bool,
    /// `server_max_window_bits=N`, offered only below 15 (15 limits
    /// nothing); the server must confirm it with N or less.
    pub(super) server_max_window_bits: Option<u8>,
    /// `client_max_window_bits`: the largest window the client will use,
    /// which allows the server to ask for less. `None` when not offered, and
    /// then the answer must not name it.
    pub(super) client_max_window_bits: Option<u8>,
}

impl Offer {
    /// The offer a client makes for `config`. `client_max_window_bits` is
    /// always offered: the client can compress with any window from 9 up.
    pub(super) fn from_config(config: &DeflateConfig) -> Self {
        Offer {
            server_no_context_takeover: !config.server_context_takeover,
            client_no_context_takeover: !config.client_context_takeover,
            server_max_window_bits: (config.server_max_window_bits < 15)
                .then_some(config.server_max_window_bits),
            client_max_window_bits: Some(config.client_max_window_bits),
        }
    }

    /// The header value, `permessage-deflate; ...`, piece by piece.
    pub(super) fn write(&self, mut put: impl FnMut(&[u8])) {
        put(b"permessage-deflate");
        if self.server_no_context_takeover {
            put(b"; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            put(b"; client_no_context_takeover");
        }
        if let Some(bits) = self.server_max_window_bits {
            put(b"; server_max_window_bits=");
            put(decimal(bits));
        }
        match self.client_max_window_bits {
            None => {}
            // The bare form says "any window": what browsers send.
            Some(15) => put(b"; client_max_window_bits"),
            Some(bits) => {
                put(b"; client_max_window_bits=");
                put(decimal(bits));
            }
        }
    }
}

/// Window sizes as they are written (9 to 15; a client never offers 8).
fn decimal(bits: u8) -> &'static [u8] {
    match bits {
        9 => b"9",
        10 => b"10",
        11 => b"11",
        12 => b"12",
        13 => b"13",
        14 => b"14",
        _ => b"15",
    }
}

/// Checks the response's `Sec-WebSocket-Extensions` values against `offer`
/// (`None`: permessage-deflate was not offered). `Ok(None)` when the server
/// did not accept it, otherwise the parameters both sides now follow.
pub(super) fn check_answer<'h>(
    header_values: impl IntoIterator<Item = &'h [u8]>,
    offer: Option<&Offer>,
) -> Result<Option<DeflateParams>, ClientHandshakeError> {
    let mut agreed = None;
    for value in header_values {
        let value = std::str::from_utf8(value).map_err(|_| ClientHandshakeError::BadExtension)?;
        for extension in parse_extensions(value) {
            let extension = extension.map_err(|_| ClientHandshakeError::BadExtension)?;
            let Some(offer) = offer else {
                return Err(ClientHandshakeError::UnofferedExtension);
            };
            if !extension.name.eq_ignore_ascii_case("permessage-deflate") {
                return Err(ClientHandshakeError::UnofferedExtension);
            }
            if agreed.is_some() {
                // One offer was made; it can be accepted once.
                return Err(ClientHandshakeError::BadExtension);
            }
            agreed = Some(check_params(extension.params(), offer)?);
        }
    }
    Ok(agreed)
}

/// The answer's parameters, judged against the offer.
fn check_params<'a>(
    params: impl Iterator<Item = Param<'a>>,
    offer: &Offer,
) -> Result<DeflateParams, ClientHandshakeError> {
    let bad = ClientHandshakeError::BadExtension;
    let mut seen = [false; 4];
    let mut server_no_context_takeover = false;
    let mut client_no_context_takeover = false;
    let mut server_bits = None;
    let mut client_bits = None;
    for param in params {
        let name = known_param(param.name).ok_or(bad)?;
        if std::mem::replace(&mut seen[name as usize], true) {
            return Err(bad);
        }
        let bits = match &param.value {
            Some(value) => Some(window_bits(value).ok_or(bad)?),
            None => None,
        };
        match (name, bits) {
            (KnownParam::ServerNoContextTakeover, None) => server_no_context_takeover = true,
            (KnownParam::ClientNoContextTakeover, None) => client_no_context_takeover = true,
            (KnownParam::ServerMaxWindowBits, Some(bits)) => server_bits = Some(bits),
            // In an answer the client's window always has a value.
            (KnownParam::ClientMaxWindowBits, Some(bits)) => client_bits = Some(bits),
            _ => return Err(bad),
        }
    }
    // The server may add `server_no_context_takeover` unasked, but must
    // confirm it when asked (§7.1.1.1).
    if offer.server_no_context_takeover && !server_no_context_takeover {
        return Err(bad);
    }
    // It may name its window unasked; asked, it must, with no more (§7.1.2.1).
    match (offer.server_max_window_bits, server_bits) {
        (Some(_), None) => return Err(bad),
        (Some(offered), Some(bits)) if bits > offered => return Err(bad),
        _ => {}
    }
    // The client's window only if offered, and no more (§7.1.2.2).
    if let Some(bits) = client_bits {
        match offer.client_max_window_bits {
            Some(offered) if bits <= offered => {}
            Some(_) => return Err(bad),
            None => return Err(bad),
        }
        if bits == 8 {
            return Err(ClientHandshakeError::UnsupportedClientWindow);
        }
    }
    Ok(DeflateParams {
        // Unlimited unless named; the inflater handles any window anyway.
        server_max_window_bits: server_bits.unwrap_or(15),
        server_no_context_takeover,
        // A client that promised to drop its context keeps the promise even
        // if the server did not ask (it may always drop it).
        client_no_context_takeover: client_no_context_takeover || offer.client_no_context_takeover,
        client_max_window_bits: client_bits.or(offer.client_max_window_bits).unwrap_or(15),
        announce_server_window: server_bits.is_some(),
    })
}
