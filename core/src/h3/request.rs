//! A request's head as HTTP/3 carries it, checked as RFC 9114 (section
//! 4.3.1) asks, and the extended CONNECT that opens a WebSocket (RFC
//! 9220, with RFC 8441's rules).

use std::ops::Range;

use super::{FieldSection, H3Error};
use crate::handshake::{HandshakeError, Request, check_extended_connect};

/// A request head whose fields are well formed: pseudo-fields known,
/// once each and first, names in lowercase, no connection-specific
/// fields, values without NUL, CR or LF, and the pseudo-fields its method
/// needs.
#[derive(Clone, Debug)]
pub struct RequestHead {
    section: FieldSection,
    /// The pseudo-fields' values, as ranges of `text`, in `PSEUDO`'s
    /// order.
    pseudo: [Option<Range<usize>>; 5],
    /// The pseudo-fields' values as `str` (checked once).
    text: String,
}

/// The pseudo-fields a request may have.
const PSEUDO: [&[u8]; 5] = [
    b":method",
    b":scheme",
    b":authority",
    b":path",
    b":protocol",
];

impl RequestHead {
    /// Checks `section` as a request's head.
    pub fn parse(section: FieldSection) -> Result<RequestHead, H3Error> {
        let mut slots: [Option<usize>; 5] = [None; 5];
        let mut regular = section.len();
        for (i, (name, value)) in section.iter().enumerate() {
            if value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
                return Err(H3Error::Message("a field value with NUL, CR or LF"));
            }
            if let Some(pseudo) = name.strip_prefix(b":") {
                if i > regular {
                    return Err(H3Error::Message("a pseudo-field after a regular field"));
                }
                let slot = PSEUDO
                    .iter()
                    .position(|known| &known[1..] == pseudo)
                    .ok_or(H3Error::Message("an unknown pseudo-field in a request"))?;
                if slots[slot].replace(i).is_some() {
                    return Err(H3Error::Message("a pseudo-field given twice"));
                }
                continue;
            }
            regular = regular.min(i);
            if name.is_empty() || !name.iter().all(|&b| is_lower_token(b)) {
                return Err(H3Error::Message(
                    "a field name that is not a lowercase token",
                ));
            }
            let connection_specific = [
                &b"connection"[..],
                b"keep-alive",
                b"proxy-connection",
                b"transfer-encoding",
                b"upgrade",
            ];
            if connection_specific.contains(&name) {
                return Err(H3Error::Message(
                    "a connection-specific field (HTTP/3 has no Connection, Upgrade or Transfer-Encoding)",
                ));
            }
            if name == b"te" && value != b"trailers" {
                return Err(H3Error::Message("TE other than trailers"));
            }
        }
        let [method, scheme, authority, path, protocol] = slots;
        let method = method.ok_or(H3Error::Message("no :method"))?;
        let values: Vec<&[u8]> = section.iter().map(|(_, value)| value).collect();
        let is_connect = values[method] == b"CONNECT";
        if protocol.is_some() {
            if !is_connect {
                return Err(H3Error::Message(":protocol on a method other than CONNECT"));
            }
            if scheme.is_none() || path.is_none() || authority.is_none() {
                return Err(H3Error::Message(
                    "an extended CONNECT needs :scheme, :path and :authority",
                ));
            }
        } else if is_connect {
            if scheme.is_some() || path.is_some() || authority.is_none() {
                return Err(H3Error::Message(
                    "a CONNECT has :authority and no :scheme or :path",
                ));
            }
        } else if scheme.is_none() || path.is_none() {
            return Err(H3Error::Message("a request needs :scheme and :path"));
        }
        if path.is_some_and(|path| values[path].is_empty()) {
            return Err(H3Error::Message("an empty :path"));
        }
        if let Some(authority) = authority {
            let authority = values[authority];
            if authority.is_empty() {
                return Err(H3Error::Message("an empty :authority"));
            }
            // RFC 9114, 4.3.1: both present, the same value.
            let host = section.iter().find(|(name, _)| *name == b"host");
            if host.is_some_and(|(_, host)| host != authority) {
                return Err(H3Error::Message(":authority and Host differ"));
            }
        }
        // The pseudo-fields as text, once: they must be UTF-8 (they are
        // compared, logged and handed out as `str`).
        let mut text = String::new();
        let mut pseudo: [Option<Range<usize>>; 5] = Default::default();
        for (range, slot) in pseudo.iter_mut().zip(slots) {
            if let Some(i) = slot {
                let value = std::str::from_utf8(values[i])
                    .map_err(|_| H3Error::Message("a pseudo-field that is not UTF-8"))?;
                let start = text.len();
                text.push_str(value);
                *range = Some(start..text.len());
            }
        }
        Ok(RequestHead {
            section,
            pseudo,
            text,
        })
    }

    fn pseudo(&self, slot: usize) -> Option<&str> {
        self.pseudo[slot].clone().map(|range| &self.text[range])
    }

    /// `:method`.
    pub fn method(&self) -> &str {
        self.pseudo(0).unwrap_or_default()
    }

    /// `:scheme`, absent on a plain CONNECT.
    pub fn scheme(&self) -> Option<&str> {
        self.pseudo(1)
    }

    /// `:authority`.
    pub fn authority(&self) -> Option<&str> {
        self.pseudo(2)
    }

    /// `:path` (with the query), absent on a plain CONNECT.
    pub fn path(&self) -> Option<&str> {
        self.pseudo(3)
    }

    /// `:protocol`: what an extended CONNECT asks for.
    pub fn protocol(&self) -> Option<&str> {
        self.pseudo(4)
    }

    /// The regular fields (not the pseudo-fields), as the upgrade checks
    /// and a handler's hook read them.
    pub fn headers(&self) -> Vec<httparse::Header<'_>> {
        self.section
            .iter()
            .filter(|(name, _)| !name.starts_with(b":"))
            .map(|(name, value)| httparse::Header {
                // Checked to be a lowercase token in `parse`.
                name: std::str::from_utf8(name).unwrap_or_default(),
                value,
            })
            .collect()
    }

    /// The WebSocket upgrade this head asks for (RFC 9220): an extended
    /// CONNECT with `:protocol` websocket and `sec-websocket-version` 13,
    /// checked by the same code as HTTP/2's, so the answers are the same
    /// (400, 426). `headers` is [`headers`](RequestHead::headers)' result.
    pub fn websocket<'a>(
        &'a self,
        headers: &'a [httparse::Header<'a>],
    ) -> Result<Request<'a>, HandshakeError> {
        check_extended_connect(
            self.method(),
            self.protocol(),
            self.path().unwrap_or_default(),
            headers,
        )
    }
}

impl RequestHead {
    /// Whether this head asks for a WebTransport session: an extended
    /// CONNECT with `:protocol` webtransport. `Err` names what is missing
    /// from one that asks (a 400's reason): `:scheme` https, `:path` and
    /// `:authority` (RFC 9220's extended CONNECT, draft-ietf-webtrans-http3
    /// section 3.2).
    pub fn webtransport(&self) -> Option<Result<(), &'static str>> {
        if self.method() != "CONNECT" || self.protocol() != Some(super::webtransport::PROTOCOL) {
            return None;
        }
        Some(if self.scheme() != Some("https") {
            Err("a WebTransport session needs :scheme https")
        } else if self.path().is_none_or(str::is_empty) {
            Err("a WebTransport session needs a :path")
        } else if self.authority().is_none() {
            Err("a WebTransport session needs an :authority")
        } else {
            Ok(())
        })
    }
}

/// A byte of a field name: RFC 9110's token characters, no uppercase.
fn is_lower_token(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9') || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h3::qpack;

    fn head(fields: &[(&str, &str)]) -> Result<RequestHead, H3Error> {
        let mut out = Vec::new();
        qpack::encode(
            fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
            &mut out,
        );
        RequestHead::parse(qpack::decode(&out, 64 * 1024).unwrap())
    }

    const CONNECT: [(&str, &str); 6] = [
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":authority", "localhost:9443"),
        (":path", "/ws?x=1"),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn an_extended_connect_is_a_websocket_upgrade() {
        let head = head(&CONNECT).unwrap();
        assert_eq!(head.method(), "CONNECT");
        assert_eq!(head.protocol(), Some("websocket"));
        assert_eq!(head.scheme(), Some("https"));
        assert_eq!(head.authority(), Some("localhost:9443"));
        assert_eq!(head.path(), Some("/ws?x=1"));
        let headers = head.headers();
        assert_eq!(headers.len(), 1);
        let request = head.websocket(&headers).unwrap();
        assert_eq!(request.path(), "/ws");
        assert_eq!(request.query(), Some("x=1"));
        assert_eq!(request.header_str("sec-websocket-version"), Some("13"));
    }

    #[test]
    fn the_upgrade_checks_answer_as_over_http2() {
        let mut fields = CONNECT.to_vec();
        fields[5].1 = "8";
        let parsed = head(&fields).unwrap();
        let headers = parsed.headers();
        assert_eq!(
            parsed.websocket(&headers).unwrap_err(),
            HandshakeError::UnsupportedVersion
        );
        let mut fields = CONNECT.to_vec();
        fields[1].1 = "webtransport";
        let parsed = head(&fields).unwrap();
        let headers = parsed.headers();
        assert_eq!(
            parsed.websocket(&headers).unwrap_err(),
            HandshakeError::NotExtendedConnect
        );
        let get = head_ok(&[(":method", "GET"), (":scheme", "https"), (":path", "/ws")]);
        let headers = get.headers();
        assert_eq!(
            get.websocket(&headers).unwrap_err(),
            HandshakeError::NotExtendedConnect
        );
    }

    #[test]
    fn webtransport_sessions_are_recognised_and_checked() {
        let session = [
            (":method", "CONNECT"),
            (":protocol", "webtransport"),
            (":scheme", "https"),
            (":authority", "localhost:9443"),
            (":path", "/wt"),
            ("origin", "https://localhost:9443"),
        ];
        assert_eq!(head_ok(&session).webtransport(), Some(Ok(())));
        assert_eq!(head_ok(&CONNECT).webtransport(), None);
        let get = head_ok(&[(":method", "GET"), (":scheme", "https"), (":path", "/wt")]);
        assert_eq!(get.webtransport(), None);
        let mut http = session;
        http[2].1 = "http";
        assert!(matches!(head_ok(&http).webtransport(), Some(Err(_))));
        // Without an :authority it is not a well-formed extended CONNECT.
        let no_authority: Vec<_> = session
            .into_iter()
            .filter(|f| f.0 != ":authority")
            .collect();
        assert!(head(&no_authority).is_err());
    }

    fn head_ok(fields: &[(&str, &str)]) -> RequestHead {
        head(fields).unwrap()
    }

    #[test]
    fn plain_requests_and_plain_connects_parse() {
        let get = head_ok(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/"),
            ("accept", "*/*"),
        ]);
        assert_eq!(
            (get.method(), get.path(), get.protocol()),
            ("GET", Some("/"), None)
        );
        let connect = head_ok(&[(":method", "CONNECT"), (":authority", "example.com:443")]);
        assert_eq!(
            (connect.path(), connect.authority()),
            (None, Some("example.com:443"))
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        let cases: [&[(&str, &str)]; 14] = [
            &[(":scheme", "https"), (":path", "/")],
            &[(":method", "GET"), (":path", "/")],
            &[(":method", "GET"), (":scheme", "https")],
            &[(":method", "GET"), (":scheme", "https"), (":path", "")],
            &[
                (":method", "GET"),
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                ("a", "b"),
                (":path", "/"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                (":status", "200"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("Host", "x"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("connection", "upgrade"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("upgrade", "websocket"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("te", "gzip"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("x", "a\r\nb: c"),
            ],
            &[
                (":method", "GET"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", "/"),
                (":authority", "a"),
            ],
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", "/"),
            ],
        ];
        for fields in cases {
            assert!(
                matches!(head(fields), Err(H3Error::Message(_))),
                "{fields:?}"
            );
        }
        // A plain CONNECT with a path.
        assert!(head(&[(":method", "CONNECT"), (":authority", "a"), (":path", "/")]).is_err());
        // :authority empty, or not Host's value.
        let mut fields = CONNECT.to_vec();
        fields[3].1 = "";
        assert!(matches!(head(&fields), Err(H3Error::Message(_))));
        let mut fields = CONNECT.to_vec();
        fields.push(("host", "elsewhere:1"));
        assert!(matches!(head(&fields), Err(H3Error::Message(_))));
        let mut fields = CONNECT.to_vec();
        fields.push(("host", "localhost:9443"));
        assert!(head(&fields).is_ok());
        // TE: trailers is allowed.
        assert!(
            head(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
                ("te", "trailers")
            ])
            .is_ok()
        );
    }
}
