//! WebTransport over HTTP/3 (draft-ietf-webtrans-http3), the bytes of it
//! that are not QUIC's: how a stream says which session it belongs to, the
//! capsules on a session's CONNECT stream, a datagram's session prefix,
//! and the stream error codes a session's application gives.
//!
//! Browsers speak the draft's second version with the settings of later
//! ones (Chromium sends `SETTINGS_ENABLE_WEBTRANSPORT` and HTTP datagrams,
//! and wants `sec-webtransport-http3-draft: draft02` in the answer); the
//! stream signals, capsules and datagram prefix below are the same in every
//! version since.
//!
//! A session is the extended CONNECT (`:protocol` webtransport) that opened
//! it; its id is that request stream's id. Everything here is a pure
//! function of whole byte slices, as the rest of `h3`.

use bytes::BufMut;

use super::{H3Error, varint};

/// `:protocol`'s value that opens a session.
pub const PROTOCOL: &str = "webtransport";

/// The first varint of a bidirectional stream of a session (a frame type
/// on a request stream: `WEBTRANSPORT_STREAM`), followed by the session id.
pub const BIDI_SIGNAL: u64 = 0x41;

/// The stream type of a unidirectional stream of a session, followed by
/// the session id.
pub const UNI_STREAM_TYPE: u64 = 0x54;

/// Capsule types on a session's CONNECT stream (RFC 9297's capsule
/// protocol, carried in DATA frames).
pub mod capsule {
    /// `WT_CLOSE_SESSION`: a 32-bit code and a UTF-8 reason.
    pub const CLOSE_SESSION: u64 = 0x2843;
    /// `WT_DRAIN_SESSION`: the sender will close soon.
    pub const DRAIN_SESSION: u64 = 0x78ae;
}

/// The longest close reason (bytes) a `WT_CLOSE_SESSION` may carry.
pub const MAX_CLOSE_REASON: usize = 1024;

/// HTTP/3 error codes of WebTransport.
pub mod code {
    /// A stream of a session that is gone (or never was): reset with this.
    pub const SESSION_GONE: u64 = 0x170d_7b68;
    /// A stream that came for a session not (yet) there, and was not kept.
    pub const BUFFERED_STREAM_REJECTED: u64 = 0x3994_bd84;
}

/// The first HTTP/3 code of the range applications' stream codes map to.
const APPLICATION_FIRST: u64 = 0x52e4_a40f_a8db;
/// The last one (`u32::MAX` mapped).
const APPLICATION_LAST: u64 = 0x52e5_ac98_3162;

/// The HTTP/3 error code that carries an application's stream error
/// `code` (a `RESET_STREAM` or `STOP_SENDING` of a session's stream): one
/// code in each 0x1f is skipped, being HTTP/3's reserved (grease) codes.
pub fn error_to_http3(code: u32) -> u64 {
    let code = u64::from(code);
    APPLICATION_FIRST + code + code / 0x1e
}

/// The application's code an HTTP/3 error code carries, or `None` for a
/// code outside the range (or a reserved one in it).
pub fn http3_to_error(h3: u64) -> Option<u32> {
    if !(APPLICATION_FIRST..=APPLICATION_LAST).contains(&h3) || (h3 - 0x21) % 0x1f == 0 {
        return None;
    }
    let shifted = h3 - APPLICATION_FIRST;
    u32::try_from(shifted - shifted / 0x1f).ok()
}

/// A capsule's type and length at the start of `input` and the bytes they
/// took, or `None` until both varints are there.
pub fn capsule_head(input: &[u8]) -> Option<(u64, u64, usize)> {
    let (kind, a) = varint::decode(input)?;
    let (length, b) = varint::decode(&input[a..])?;
    Some((kind, length, a + b))
}

/// A `WT_CLOSE_SESSION`'s payload: the code and the reason. Shorter than
/// the code, a reason over [`MAX_CLOSE_REASON`] bytes or not UTF-8 is a
/// malformed message (`H3_MESSAGE_ERROR` on the session's stream).
pub fn decode_close(payload: &[u8]) -> Result<(u32, &str), H3Error> {
    let Some((code, reason)) = payload.split_first_chunk::<4>() else {
        return Err(H3Error::Message("a WT_CLOSE_SESSION shorter than its code"));
    };
    if reason.len() > MAX_CLOSE_REASON {
        return Err(H3Error::Message(
            "a WT_CLOSE_SESSION reason over 1024 bytes",
        ));
    }
    let reason = std::str::from_utf8(reason)
        .map_err(|_| H3Error::Message("a WT_CLOSE_SESSION reason that is not UTF-8"))?;
    Ok((u32::from_be_bytes(*code), reason))
}

/// Appends a `WT_CLOSE_SESSION` capsule; a reason over
/// [`MAX_CLOSE_REASON`] bytes is cut at a character boundary.
pub fn put_close(code: u32, reason: &str, out: &mut impl BufMut) {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason.as_bytes()[..end];
    varint::encode(capsule::CLOSE_SESSION, out);
    varint::encode(4 + reason.len() as u64, out);
    out.put_u32(code);
    out.put_slice(reason);
}

/// Appends a `WT_DRAIN_SESSION` capsule.
pub fn put_drain(out: &mut impl BufMut) {
    varint::encode(capsule::DRAIN_SESSION, out);
    varint::encode(0, out);
}

/// The session a datagram belongs to (RFC 9297: its quarter stream id
/// first) and where its payload starts; `None` if the prefix is cut or
/// names no client-initiated bidirectional stream's id.
pub fn datagram_session(datagram: &[u8]) -> Option<(u64, usize)> {
    let (quarter, len) = varint::decode(datagram)?;
    let id = quarter.checked_mul(4).filter(|&id| id <= varint::MAX)?;
    Some((id, len))
}

/// Appends the prefix of a datagram of session `session` (a request
/// stream's id: a multiple of 4).
pub fn put_datagram_prefix(session: u64, out: &mut impl BufMut) {
    varint::encode(session / 4, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_codes_map_both_ways_and_skip_reserved_ones() {
        // The draft's bounds: 0 is the first, u32::MAX the last.
        assert_eq!(error_to_http3(0), APPLICATION_FIRST);
        assert_eq!(error_to_http3(u32::MAX), APPLICATION_LAST);
        for code in (0..2000u32).chain([0x1d, 0x1e, 0x1f, u32::MAX - 1, u32::MAX]) {
            let h3 = error_to_http3(code);
            assert_ne!((h3 - 0x21) % 0x1f, 0, "{code} mapped to a reserved code");
            assert_eq!(http3_to_error(h3), Some(code));
        }
        // Every code in the range is an application's or a reserved one.
        let mut seen = 0;
        for h3 in APPLICATION_FIRST..APPLICATION_FIRST + 3000 {
            match http3_to_error(h3) {
                Some(code) => {
                    assert_eq!(error_to_http3(code), h3);
                    seen += 1;
                }
                None => assert_eq!((h3 - 0x21) % 0x1f, 0),
            }
        }
        assert!(seen > 2800);
        assert_eq!(http3_to_error(APPLICATION_FIRST - 1), None);
        assert_eq!(http3_to_error(APPLICATION_LAST + 1), None);
        assert_eq!(http3_to_error(0x100), None);
    }

    #[test]
    fn close_capsules_round_trip_and_bad_ones_are_refused() {
        let mut out = Vec::new();
        put_close(4242, "bye ✓", &mut out);
        let (kind, length, len) = capsule_head(&out).unwrap();
        assert_eq!(kind, capsule::CLOSE_SESSION);
        assert_eq!(len + length as usize, out.len());
        assert_eq!(decode_close(&out[len..]), Ok((4242, "bye ✓")));
        for cut in 0..len {
            assert_eq!(capsule_head(&out[..cut]), None);
        }
        // A long reason is cut to 1024 bytes, not inside a character: 1023
        // here, the 1024th byte being a character's first.
        let mut long = Vec::new();
        put_close(1, &format!("a{}", "é".repeat(600)), &mut long);
        let (_, length, len) = capsule_head(&long).unwrap();
        let (_, reason) = decode_close(&long[len..len + length as usize]).unwrap();
        assert_eq!(reason.len(), 1023);
        assert!(decode_close(&[0, 0, 1]).is_err());
        assert!(decode_close(&[0, 0, 0, 1, 0xff]).is_err());
        assert!(decode_close(&[0; 4 + MAX_CLOSE_REASON + 1]).is_err());
        assert_eq!(decode_close(&[0, 0, 0, 7]), Ok((7, "")));
        let mut drain = Vec::new();
        put_drain(&mut drain);
        assert_eq!(
            capsule_head(&drain),
            Some((capsule::DRAIN_SESSION, 0, drain.len()))
        );
    }

    #[test]
    fn datagram_prefixes_name_their_session() {
        for session in [0u64, 4, 8, 400, 1 << 40] {
            let mut out = Vec::new();
            put_datagram_prefix(session, &mut out);
            let len = out.len();
            out.extend_from_slice(b"payload");
            assert_eq!(datagram_session(&out), Some((session, len)));
            assert_eq!(&out[len..], b"payload");
        }
        assert_eq!(datagram_session(&[]), None);
        assert_eq!(datagram_session(&[0x40]), None);
        // A quarter id whose stream id is past QUIC's largest.
        let mut out = Vec::new();
        varint::encode(varint::MAX, &mut out);
        assert_eq!(datagram_session(&out), None);
    }
}
