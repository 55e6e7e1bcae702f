//! The numbers Centrifugo's clients act on: reply error codes, the codes
//! of the server's unsubscribe pushes, and the close codes that end a
//! connection (3000–3499 and 4000–4499 reconnect, 3500–3999 and 4500–4999
//! do not).

use super::messages::{Disconnect, Error, PushBody};

/// Reply error codes.
pub mod error {
    /// 100: internal.
    pub const INTERNAL: u32 = 100;
    /// 101: unauthorized.
    pub const UNAUTHORIZED: u32 = 101;
    /// 102: unknown channel.
    pub const UNKNOWN_CHANNEL: u32 = 102;
    /// 103: permission denied.
    pub const PERMISSION_DENIED: u32 = 103;
    /// 104: method not found.
    pub const METHOD_NOT_FOUND: u32 = 104;
    /// 105: already subscribed.
    pub const ALREADY_SUBSCRIBED: u32 = 105;
    /// 106: limit exceeded.
    pub const LIMIT_EXCEEDED: u32 = 106;
    /// 107: bad request.
    pub const BAD_REQUEST: u32 = 107;
    /// 108: not available.
    pub const NOT_AVAILABLE: u32 = 108;
    /// 109: token expired.
    pub const TOKEN_EXPIRED: u32 = 109;
    /// 110: expired.
    pub const EXPIRED: u32 = 110;
    /// 111: too many requests.
    pub const TOO_MANY_REQUESTS: u32 = 111;
    /// 112: unrecoverable position.
    pub const UNRECOVERABLE_POSITION: u32 = 112;
}

/// Codes of the unsubscribe pushes the server sends: from 2500 on, the
/// SDKs subscribe again (asking their application for a new subscription
/// token); below, they stay unsubscribed.
pub mod unsubscribe {
    /// 2000: server unsubscribe.
    pub const SERVER: u32 = 2000;
    /// 2500: insufficient state.
    pub const INSUFFICIENT_STATE: u32 = 2500;
    /// 2501: subscription expired (its token was not refreshed in time).
    pub const EXPIRED: u32 = 2501;
}

/// Close codes (with the reasons Centrifugo gives them).
pub mod disconnect {
    /// 3000: connection closed.
    pub const CONNECTION_CLOSED: u16 = 3000;
    /// 3001: shutdown.
    pub const SHUTDOWN: u16 = 3001;
    /// 3004: server error.
    pub const SERVER_ERROR: u16 = 3004;
    /// 3005: expired.
    pub const EXPIRED: u16 = 3005;
    /// 3006: sub expired.
    pub const SUB_EXPIRED: u16 = 3006;
    /// 3008: slow.
    pub const SLOW: u16 = 3008;
    /// 3009: write error.
    pub const WRITE_ERROR: u16 = 3009;
    /// 3010: insufficient state.
    pub const INSUFFICIENT_STATE: u16 = 3010;
    /// 3011: force reconnect.
    pub const FORCE_RECONNECT: u16 = 3011;
    /// 3012: no pong.
    pub const NO_PONG: u16 = 3012;
    /// 3500: invalid token.
    pub const INVALID_TOKEN: u16 = 3500;
    /// 3501: bad request.
    pub const BAD_REQUEST: u16 = 3501;
    /// 3502: stale.
    pub const STALE: u16 = 3502;
    /// 3503: force no reconnect.
    pub const FORCE_NO_RECONNECT: u16 = 3503;
    /// 3504: connection limit.
    pub const CONNECTION_LIMIT: u16 = 3504;
    /// 3505: channel limit.
    pub const CHANNEL_LIMIT: u16 = 3505;
}

impl Error {
    /// The error with its code's usual message (temporary only for an
    /// internal error, as Centrifugo marks it).
    pub fn new(code: u32) -> Error {
        let message = match code {
            error::INTERNAL => "internal server error",
            error::UNAUTHORIZED => "unauthorized",
            error::UNKNOWN_CHANNEL => "unknown channel",
            error::PERMISSION_DENIED => "permission denied",
            error::METHOD_NOT_FOUND => "method not found",
            error::ALREADY_SUBSCRIBED => "already subscribed",
            error::LIMIT_EXCEEDED => "limit exceeded",
            error::BAD_REQUEST => "bad request",
            error::NOT_AVAILABLE => "not available",
            error::TOKEN_EXPIRED => "token expired",
            error::EXPIRED => "expired",
            error::TOO_MANY_REQUESTS => "too many requests",
            error::UNRECOVERABLE_POSITION => "unrecoverable position",
            _ => "error",
        };
        Error {
            code,
            message: message.to_owned(),
            temporary: code == error::INTERNAL,
        }
    }
}

impl Disconnect {
    /// The disconnect with its code's usual reason; `reconnect` as the code
    /// range says.
    pub fn new(code: u16) -> Disconnect {
        let reason = match code {
            disconnect::CONNECTION_CLOSED => "connection closed",
            disconnect::SHUTDOWN => "shutdown",
            disconnect::SERVER_ERROR => "internal server error",
            disconnect::EXPIRED => "connection expired",
            disconnect::SUB_EXPIRED => "subscription expired",
            disconnect::SLOW => "slow",
            disconnect::WRITE_ERROR => "write error",
            disconnect::INSUFFICIENT_STATE => "insufficient state",
            disconnect::FORCE_RECONNECT => "force reconnect",
            disconnect::NO_PONG => "no pong",
            disconnect::INVALID_TOKEN => "invalid token",
            disconnect::BAD_REQUEST => "bad request",
            disconnect::STALE => "stale",
            disconnect::FORCE_NO_RECONNECT => "force disconnect",
            disconnect::CONNECTION_LIMIT => "connection limit",
            disconnect::CHANNEL_LIMIT => "channel limit",
            _ => "disconnect",
        };
        Disconnect {
            code: code.into(),
            reason: reason.to_owned(),
            reconnect: reconnects(code),
        }
    }
}

impl PushBody {
    /// An unsubscribe push with its code's usual reason.
    pub fn unsubscribe(code: u32) -> PushBody {
        let reason = match code {
            unsubscribe::SERVER => "server unsubscribe",
            unsubscribe::INSUFFICIENT_STATE => "insufficient state",
            unsubscribe::EXPIRED => "subscription expired",
            _ => "unsubscribe",
        };
        PushBody::Unsubscribe {
            code,
            reason: reason.to_owned(),
        }
    }
}

/// Whether a client reconnects after this close code.
pub fn reconnects(code: u16) -> bool {
    !(3500..4000).contains(&code) && !(4500..5000).contains(&code)
}
