//! Close codes and close frame payloads (RFC 6455 §5.5.1, §7.4).

use bytes::BufMut;

/// A close status code.
///
/// Every `u16` can be represented, because the handler is told the code the peer
/// sent; [`CloseCode::is_sendable`] says which ones may appear on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 1000: the purpose of the connection is fulfilled.
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// 1001: the server is going down, or a browser left the page.
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    /// 1002: the peer broke the protocol.
    pub const PROTOCOL_ERROR: CloseCode = CloseCode(1002);
    /// 1003: a message of a type this endpoint does not accept.
    pub const UNSUPPORTED_DATA: CloseCode = CloseCode(1003);
    /// 1005: reported locally when a close frame carried no code. Never sent.
    pub const NO_STATUS: CloseCode = CloseCode(1005);
    /// 1006: reported locally when the TCP connection ended without a close
    /// handshake. Never sent.
    pub const ABNORMAL: CloseCode = CloseCode(1006);
    /// 1007: a text message or close reason was not valid UTF-8.
    pub const INVALID_PAYLOAD: CloseCode = CloseCode(1007);
    /// 1008: a message violated the endpoint's policy.
    pub const POLICY_VIOLATION: CloseCode = CloseCode(1008);
    /// 1009: a frame or message exceeded the configured size limit.
    pub const MESSAGE_TOO_BIG: CloseCode = CloseCode(1009);
    /// 1010: the client wanted an extension the server did not negotiate.
    pub const MANDATORY_EXTENSION: CloseCode = CloseCode(1010);
    /// 1011: the server hit an unexpected condition (for example, a handler panic).
    pub const INTERNAL_ERROR: CloseCode = CloseCode(1011);
    /// 1012: the service is restarting.
    pub const SERVICE_RESTART: CloseCode = CloseCode(1012);
    /// 1013: try again later (temporary overload).
    pub const TRY_AGAIN_LATER: CloseCode = CloseCode(1013);
    /// 1014: a gateway got an invalid response upstream.
    pub const BAD_GATEWAY: CloseCode = CloseCode(1014);

    /// Whether this code may be sent in a close frame: 1000-1003, 1007-1014 and
    /// the ranges for libraries and applications, 3000-4999.
    pub fn is_sendable(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

impl From<u16> for CloseCode {
    fn from(code: u16) -> Self {
        CloseCode(code)
    }
}

impl From<CloseCode> for u16 {
    fn from(code: CloseCode) -> Self {
        code.0
    }
}

impl std::fmt::Display for CloseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The longest close reason: a control payload is at most 125 bytes, two of which
/// are the code.
pub const MAX_CLOSE_REASON: usize = 123;

/// A close frame payload the peer sent that we must reject, with the code to
/// reject it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadClose {
    /// A one-byte payload cannot hold a code (1002).
    Truncated,
    /// A code that must not appear on the wire (1002).
    InvalidCode(u16),
    /// The reason is not UTF-8 (1007).
    InvalidReason,
}

impl BadClose {
    /// The close code this failure is reported with.
    pub fn close_code(self) -> CloseCode {
        match self {
            BadClose::Truncated | BadClose::InvalidCode(_) => CloseCode::PROTOCOL_ERROR,
            BadClose::InvalidReason => CloseCode::INVALID_PAYLOAD,
        }
    }

    /// The close reason sent with it: a few words on what was wrong.
    pub fn reason(self) -> &'static str {
        match self {
            BadClose::Truncated => "close payload of one byte",
            BadClose::InvalidCode(_) => "invalid close code",
            BadClose::InvalidReason => "close reason is not valid UTF-8",
        }
    }
}

/// Parses a received close payload: `None` for an empty payload (no code), else
/// the code and the reason text.
pub fn parse_close_payload(payload: &[u8]) -> Result<Option<(CloseCode, &str)>, BadClose> {
    match payload {
        [] => Ok(None),
        [_] => Err(BadClose::Truncated),
        [hi, lo, reason @ ..] => {
            let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
            if !code.is_sendable() {
                return Err(BadClose::InvalidCode(code.0));
            }
            let reason = super::utf8::validate(reason).map_err(|_| BadClose::InvalidReason)?;
            Ok(Some((code, reason)))
        }
    }
}

/// Appends a close payload (code then reason) to `out`. The caller has checked
/// the code is sendable and the reason at most [`MAX_CLOSE_REASON`] bytes.
pub fn put_close_payload(out: &mut impl BufMut, code: CloseCode, reason: &str) {
    debug_assert!(code.is_sendable() && reason.len() <= MAX_CLOSE_REASON);
    out.put_u16(code.0);
    out.put_slice(reason.as_bytes());
}

/// Cuts `reason` to at most [`MAX_CLOSE_REASON`] bytes on a character boundary,
/// so a long error text never makes an invalid close frame.
pub fn truncate_reason(reason: &str) -> &str {
    if reason.len() <= MAX_CLOSE_REASON {
        return reason;
    }
    let mut end = MAX_CLOSE_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sendable_codes_are_exactly_the_rfc_ranges() {
        let sendable: Vec<u16> = (0..=u16::MAX)
            .filter(|&c| CloseCode(c).is_sendable())
            .collect();
        let mut expected: Vec<u16> = (1000..=1003).chain(1007..=1014).collect();
        expected.extend(3000..=4999);
        assert_eq!(sendable, expected);
    }

    #[test]
    fn parses_codes_and_reasons() {
        assert_eq!(parse_close_payload(&[]), Ok(None));
        assert_eq!(
            parse_close_payload(&[0x03, 0xE8]),
            Ok(Some((CloseCode::NORMAL, "")))
        );
        let mut p = vec![0x0B, 0xB8];
        p.extend_from_slice("bye κόσμε".as_bytes());
        assert_eq!(
            parse_close_payload(&p),
            Ok(Some((CloseCode(3000), "bye κόσμε")))
        );
    }

    #[test]
    fn rejects_bad_payloads_with_the_right_code() {
        assert_eq!(parse_close_payload(&[0x03]), Err(BadClose::Truncated));
        for code in [
            0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
        ] {
            let err = parse_close_payload(&code.to_be_bytes()).unwrap_err();
            assert_eq!(err, BadClose::InvalidCode(code));
            assert_eq!(err.close_code(), CloseCode::PROTOCOL_ERROR);
        }
        let err = parse_close_payload(&[0x03, 0xE8, 0xCE, 0xBA, 0xE1, 0xBD]).unwrap_err();
        assert_eq!(err, BadClose::InvalidReason);
        assert_eq!(err.close_code(), CloseCode::INVALID_PAYLOAD);
    }

    #[test]
    fn truncates_reasons_on_character_boundaries() {
        let long = "é".repeat(100); // 200 bytes
        let cut = truncate_reason(&long);
        assert!(cut.len() <= MAX_CLOSE_REASON);
        assert_eq!(cut.len(), 122);
        assert_eq!(truncate_reason("short"), "short");
    }

    #[test]
    fn writes_payloads_that_parse_back() {
        let mut out = Vec::new();
        put_close_payload(&mut out, CloseCode::GOING_AWAY, "restart");
        assert_eq!(
            parse_close_payload(&out),
            Ok(Some((CloseCode::GOING_AWAY, "restart")))
        );
    }
}
