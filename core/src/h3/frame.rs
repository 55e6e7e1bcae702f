//! HTTP/3 frames (RFC 9114, section 7): a type and a length, both
//! varints, then the payload; and the SETTINGS a side opens its control
//! stream with.

use bytes::BufMut;

use super::{H3Error, varint};

/// The frame types this crate meets (RFC 9114, section 7.2).
pub mod kind {
    /// A request's or response's body: on a WebSocket's stream, its bytes.
    pub const DATA: u64 = 0x00;
    /// A field section (QPACK-encoded headers).
    pub const HEADERS: u64 = 0x01;
    /// Cancels a server push.
    pub const CANCEL_PUSH: u64 = 0x03;
    /// The control stream's first frame.
    pub const SETTINGS: u64 = 0x04;
    /// A server push's promise.
    pub const PUSH_PROMISE: u64 = 0x05;
    /// The connection is going away.
    pub const GOAWAY: u64 = 0x07;
    /// The client's push limit.
    pub const MAX_PUSH_ID: u64 = 0x0d;
}

/// A frame's type and payload length, and how many bytes they took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHead {
    /// The frame type (see [`kind`]); unknown types are to be skipped.
    pub kind: u64,
    /// The payload's length.
    pub length: u64,
    /// Bytes the type and length took.
    pub len: usize,
}

impl FrameHead {
    /// The head at the start of `input`, or `None` until it is all there.
    pub fn decode(input: &[u8]) -> Option<FrameHead> {
        let (kind, a) = varint::decode(input)?;
        let (length, b) = varint::decode(&input[a..])?;
        Some(FrameHead {
            kind,
            length,
            len: a + b,
        })
    }

    /// Whether the type is one HTTP/2 had and HTTP/3 reserves: receiving
    /// one is a connection error (`H3_FRAME_UNEXPECTED`, section 7.2.8).
    pub fn is_http2_only(&self) -> bool {
        matches!(self.kind, 0x02 | 0x06 | 0x08 | 0x09)
    }
}

/// Appends a frame head.
pub fn put_head(out: &mut impl BufMut, kind: u64, length: u64) {
    varint::encode(kind, out);
    varint::encode(length, out);
}

/// Setting identifiers (RFC 9114 section 7.2.4.1, RFC 9204, RFC 9220,
/// RFC 9297, and WebTransport over HTTP/3).
pub mod setting {
    /// QPACK's dynamic table capacity (RFC 9204).
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    /// The largest field section the sender accepts.
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    /// QPACK's blocked streams (RFC 9204).
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;
    /// Extended CONNECT (RFC 9220, as RFC 8441 for HTTP/2).
    pub const ENABLE_CONNECT_PROTOCOL: u64 = 0x08;
    /// HTTP datagrams (RFC 9297).
    pub const H3_DATAGRAM: u64 = 0x33;
    /// WebTransport sessions the sender accepts (draft-ietf-webtrans-http3,
    /// versions 13 and 14: what Safari looks for).
    pub const WT_MAX_SESSIONS: u64 = 0x14e9_cd29;
    /// The same, as versions 7 to 12 numbered it.
    pub const WEBTRANSPORT_MAX_SESSIONS: u64 = 0xc671_706a;
    /// The older drafts' switch, still sent by browsers.
    pub const ENABLE_WEBTRANSPORT: u64 = 0x2b60_3742;
}

/// What a SETTINGS frame says, the settings this crate acts on; others
/// are skipped, as the RFC asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// QPACK's dynamic table capacity: this crate sends 0 (its field
    /// sections are small and it keeps no table per connection).
    pub qpack_max_table_capacity: u64,
    /// Streams that may wait for QPACK's encoder: 0, as above.
    pub qpack_blocked_streams: u64,
    /// The largest field section the sender accepts; `None`: no limit.
    pub max_field_section_size: Option<u64>,
    /// Extended CONNECT is on (RFC 9220).
    pub enable_connect_protocol: bool,
    /// HTTP datagrams are on (RFC 9297).
    pub h3_datagram: bool,
    /// WebTransport sessions the sender accepts (0: none).
    pub webtransport_max_sessions: u64,
}

impl Settings {
    /// The settings in a SETTINGS frame's payload. A setting given twice,
    /// one of HTTP/2's (0x02 to 0x05), a boolean other than 0 or 1, or a
    /// payload cut inside a pair is `H3_SETTINGS_ERROR` or
    /// `H3_FRAME_ERROR`.
    pub fn decode(mut payload: &[u8]) -> Result<Settings, H3Error> {
        let mut settings = Settings::default();
        // Seen identifiers, for duplicates: the payload is bounded by the
        // caller, and a handful of settings is all any peer sends.
        let mut seen: Vec<u64> = Vec::new();
        // The older drafts' switch: at least one session, whatever order
        // the two WebTransport settings came in.
        let mut webtransport_on = false;
        while !payload.is_empty() {
            let (id, a) =
                varint::decode(payload).ok_or(H3Error::Frame("a SETTINGS pair is cut"))?;
            let (value, b) =
                varint::decode(&payload[a..]).ok_or(H3Error::Frame("a SETTINGS pair is cut"))?;
            payload = &payload[a + b..];
            if matches!(id, 0x02..=0x05) {
                return Err(H3Error::Settings("an HTTP/2 setting in HTTP/3's SETTINGS"));
            }
            if seen.contains(&id) {
                return Err(H3Error::Settings("a setting given twice"));
            }
            seen.push(id);
            let flag = || match value {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(H3Error::Settings("a boolean setting other than 0 or 1")),
            };
            match id {
                setting::QPACK_MAX_TABLE_CAPACITY => settings.qpack_max_table_capacity = value,
                setting::QPACK_BLOCKED_STREAMS => settings.qpack_blocked_streams = value,
                setting::MAX_FIELD_SECTION_SIZE => settings.max_field_section_size = Some(value),
                setting::ENABLE_CONNECT_PROTOCOL => settings.enable_connect_protocol = flag()?,
                setting::H3_DATAGRAM => settings.h3_datagram = flag()?,
                setting::WEBTRANSPORT_MAX_SESSIONS | setting::WT_MAX_SESSIONS => {
                    settings.webtransport_max_sessions =
                        settings.webtransport_max_sessions.max(value);
                }
                setting::ENABLE_WEBTRANSPORT => webtransport_on = flag()?,
                _ => {}
            }
        }
        if webtransport_on {
            settings.webtransport_max_sessions = settings.webtransport_max_sessions.max(1);
        }
        Ok(settings)
    }

    /// Appends a whole SETTINGS frame saying these settings (the defaults
    /// left out, as they need not be sent).
    pub fn encode(&self, out: &mut impl BufMut) {
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        if self.qpack_max_table_capacity != 0 {
            pairs.push((
                setting::QPACK_MAX_TABLE_CAPACITY,
                self.qpack_max_table_capacity,
            ));
        }
        if self.qpack_blocked_streams != 0 {
            pairs.push((setting::QPACK_BLOCKED_STREAMS, self.qpack_blocked_streams));
        }
        if let Some(size) = self.max_field_section_size {
            pairs.push((setting::MAX_FIELD_SECTION_SIZE, size));
        }
        if self.enable_connect_protocol {
            pairs.push((setting::ENABLE_CONNECT_PROTOCOL, 1));
        }
        if self.h3_datagram {
            pairs.push((setting::H3_DATAGRAM, 1));
        }
        if self.webtransport_max_sessions != 0 {
            // Every version's codepoint: browsers are at different ones.
            pairs.push((setting::WT_MAX_SESSIONS, self.webtransport_max_sessions));
            pairs.push((
                setting::WEBTRANSPORT_MAX_SESSIONS,
                self.webtransport_max_sessions,
            ));
            pairs.push((setting::ENABLE_WEBTRANSPORT, 1));
        }
        let length: usize = pairs
            .iter()
            .map(|&(id, value)| varint::len(id) + varint::len(value))
            .sum();
        put_head(out, kind::SETTINGS, length as u64);
        for (id, value) in pairs {
            varint::encode(id, out);
            varint::encode(value, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_decode_and_wait_for_their_bytes() {
        let mut out = Vec::new();
        put_head(&mut out, kind::HEADERS, 300);
        assert_eq!(
            FrameHead::decode(&out),
            Some(FrameHead {
                kind: kind::HEADERS,
                length: 300,
                len: 3
            })
        );
        for cut in 0..out.len() {
            assert_eq!(FrameHead::decode(&out[..cut]), None);
        }
        for http2 in [0x02, 0x06, 0x08, 0x09] {
            let head = FrameHead {
                kind: http2,
                length: 0,
                len: 2,
            };
            assert!(head.is_http2_only());
        }
        assert!(
            !FrameHead {
                kind: 0x21,
                length: 0,
                len: 2
            }
            .is_http2_only()
        );
    }

    #[test]
    fn settings_round_trip() {
        let settings = Settings {
            max_field_section_size: Some(16_384),
            enable_connect_protocol: true,
            h3_datagram: true,
            webtransport_max_sessions: 16,
            ..Settings::default()
        };
        let mut out = Vec::new();
        settings.encode(&mut out);
        let head = FrameHead::decode(&out).unwrap();
        assert_eq!(head.kind, kind::SETTINGS);
        assert_eq!(head.len + head.length as usize, out.len());
        assert_eq!(Settings::decode(&out[head.len..]), Ok(settings));
    }

    #[test]
    fn unknown_settings_are_skipped_and_bad_ones_refused() {
        let pairs = |pairs: &[(u64, u64)]| {
            let mut out = Vec::new();
            for &(id, value) in pairs {
                varint::encode(id, &mut out);
                varint::encode(value, &mut out);
            }
            out
        };
        // A reserved (greased) identifier and an unknown one.
        let ok = pairs(&[
            (0x1f * 3 + 0x21, 7),
            (0x4242, 1),
            (setting::ENABLE_CONNECT_PROTOCOL, 1),
        ]);
        assert!(Settings::decode(&ok).unwrap().enable_connect_protocol);
        assert_eq!(Settings::decode(&[]), Ok(Settings::default()));
        for bad in [
            pairs(&[(0x02, 0)]),
            pairs(&[(0x05, 100)]),
            pairs(&[(setting::H3_DATAGRAM, 1), (setting::H3_DATAGRAM, 1)]),
            pairs(&[(setting::ENABLE_CONNECT_PROTOCOL, 2)]),
        ] {
            assert!(
                matches!(Settings::decode(&bad), Err(H3Error::Settings(_))),
                "{bad:?}"
            );
        }
        let mut cut = pairs(&[(setting::MAX_FIELD_SECTION_SIZE, 20_000)]);
        cut.pop();
        assert!(matches!(Settings::decode(&cut), Err(H3Error::Frame(_))));
    }
}
