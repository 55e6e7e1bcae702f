//! Choosing a permessage-deflate offer (RFC 7692 §5 and §7.1), and the
//! response's extension line.
//!
//! The client lists offers in order of preference, possibly over several
//! `Sec-WebSocket-Extensions` headers. The first acceptable one wins. An offer
//! is declined, and the next one tried, when it names a parameter twice, names
//! one RFC 7692 does not define, gives a value where none belongs, omits one
//! where one is required, or gives a window size outside 8..=15. A header that
//! is not valid extension syntax makes the server decline compression
//! altogether: which offers the client meant is then unknowable.

use crate::proto::deflate::{DeflateConfig, DeflateParams};

use super::extensions::{Param, parse_extensions};

/// The response's extension header line, `Sec-WebSocket-Extensions: ...`
/// with its CRLF, passed piece by piece to `put` (no allocation).
pub(crate) fn write_response_header(params: &DeflateParams, mut put: impl FnMut(&[u8])) {
    put(b"Sec-WebSocket-Extensions: ");
    write_response_value(params, &mut put);
    put(b"\r\n");
}

/// The value of the response's `Sec-WebSocket-Extensions` for `params`
/// (`permessage-deflate; ...`), piece by piece.
pub fn write_response_value(params: &DeflateParams, mut put: impl FnMut(&[u8])) {
    put(b"permessage-deflate");
    if params.server_no_context_takeover {
        put(b"; server_no_context_takeover");
    }
    if params.client_no_context_takeover {
        put(b"; client_no_context_takeover");
    }
    if params.announce_server_window {
        put(b"; server_max_window_bits=");
        let bits = params.server_max_window_bits;
        if bits >= 10 {
            put(b"1");
        }
        put(&[b'0' + bits % 10]);
    }
}

/// Picks the first acceptable permessage-deflate offer among the values of the
/// request's `Sec-WebSocket-Extensions` headers, in order. `None` means no
/// compression: nothing was offered, no offer was acceptable, or a header
/// value was malformed (or not UTF-8).
pub fn negotiate<'a>(
    header_values: impl IntoIterator<Item = &'a [u8]>,
    config: &DeflateConfig,
) -> Option<DeflateParams> {
    let mut chosen = None;
    for value in header_values {
        let Ok(value) = std::str::from_utf8(value) else {
            tracing::debug!("Sec-WebSocket-Extensions is not UTF-8; no compression");
            return None;
        };
        for offer in parse_extensions(value) {
            let Ok(offer) = offer else {
                tracing::debug!(value, "malformed Sec-WebSocket-Extensions; no compression");
                return None;
            };
            if chosen.is_none() && offer.name.eq_ignore_ascii_case("permessage-deflate") {
                chosen = accept(offer.params(), config);
            }
        }
    }
    chosen
}

/// Judges one offer; `None` declines it.
///
/// The client's own parameters need no answer: `client_no_context_takeover`
/// in an offer says the client could drop its context, and
/// `client_max_window_bits` that it could use a smaller window. The server
/// inflates with the largest window whatever the client uses, so it never
/// asks for a smaller one.
fn accept<'a>(
    params: impl Iterator<Item = Param<'a>>,
    config: &DeflateConfig,
) -> Option<DeflateParams> {
    let mut seen = [false; 4];
    let mut server_no_context_takeover = false;
    let mut offered_bits = None;
    for param in params {
        let name = known_param(param.name)?;
        if std::mem::replace(&mut seen[name as usize], true) {
            return None;
        }
        let bits = match &param.value {
            Some(value) => Some(window_bits(value)?),
            None => None,
        };
        match (name, bits) {
            (KnownParam::ServerNoContextTakeover, None) => server_no_context_takeover = true,
            (KnownParam::ServerMaxWindowBits, Some(bits)) => offered_bits = Some(bits),
            (KnownParam::ClientNoContextTakeover, None) | (KnownParam::ClientMaxWindowBits, _) => {}
            // A value where none belongs, or none where one is required.
            _ => return None,
        }
    }
    if offered_bits == Some(8) {
        // zlib cannot write a raw deflate stream with a 256-byte window, and
        // the RFC forbids answering with more than was offered.
        return None;
    }
    let bits = config.server_max_window_bits;
    Some(DeflateParams {
        server_max_window_bits: offered_bits.map_or(bits, |offered| offered.min(bits)),
        server_no_context_takeover: server_no_context_takeover || !config.server_context_takeover,
        client_no_context_takeover: !config.client_context_takeover,
        // The server never asks the client for a smaller window.
        client_max_window_bits: 15,
        announce_server_window: offered_bits.is_some(),
    })
}

#[derive(Clone, Copy)]
pub(super) enum KnownParam {
    ServerNoContextTakeover = 0,
    ClientNoContextTakeover,
    ServerMaxWindowBits,
    ClientMaxWindowBits,
}

/// The parameter `name` stands for, compared without regard to ASCII case;
/// `None` for a parameter RFC 7692 does not define.
pub(super) fn known_param(name: &str) -> Option<KnownParam> {
    [
        (
            "server_no_context_takeover",
            KnownParam::ServerNoContextTakeover,
        ),
        (
            "client_no_context_takeover",
            KnownParam::ClientNoContextTakeover,
        ),
        ("server_max_window_bits", KnownParam::ServerMaxWindowBits),
        ("client_max_window_bits", KnownParam::ClientMaxWindowBits),
    ]
    .into_iter()
    .find(|(known, _)| name.eq_ignore_ascii_case(known))
    .map(|(_, param)| param)
}

/// A window size as RFC 7692 §7.1.2 writes it: `8` to `15`, no leading zero.
pub(super) fn window_bits(value: &str) -> Option<u8> {
    let bits = match value.as_bytes() {
        [d @ b'8'..=b'9'] => d - b'0',
        [b'1', d @ b'0'..=b'5'] => 10 + d - b'0',
        _ => return None,
    };
    Some(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(headers: &[&str], config: DeflateConfig) -> Option<DeflateParams> {
        negotiate(headers.iter().map(|h| h.as_bytes()), &config)
    }

    fn response(params: &DeflateParams) -> String {
        let mut line = Vec::new();
        write_response_header(params, |piece| line.extend_from_slice(piece));
        String::from_utf8(line).unwrap()
    }

    fn answer(headers: &[&str], config: DeflateConfig) -> Option<String> {
        pick(headers, config).map(|p| response(&p))
    }

    const PREFIX: &str = "Sec-WebSocket-Extensions: permessage-deflate";

    #[test]
    fn a_plain_offer_gets_the_defaults() {
        let params = pick(&["permessage-deflate"], DeflateConfig::default()).unwrap();
        assert_eq!(params.server_max_window_bits, 15);
        assert!(params.server_no_context_takeover && params.client_no_context_takeover);
        assert_eq!(
            response(&params),
            format!("{PREFIX}; server_no_context_takeover; client_no_context_takeover\r\n")
        );
    }

    #[test]
    fn context_takeover_kept_when_configured_and_not_refused() {
        let keep = DeflateConfig::default()
            .server_context_takeover(true)
            .client_context_takeover(true);
        assert_eq!(
            answer(&["permessage-deflate"], keep).unwrap(),
            format!("{PREFIX}\r\n")
        );
        // The client may forbid the server's context takeover; its own
        // `client_no_context_takeover` is only a hint.
        assert_eq!(
            answer(
                &["permessage-deflate; server_no_context_takeover; client_no_context_takeover"],
                keep
            )
            .unwrap(),
            format!("{PREFIX}; server_no_context_takeover\r\n")
        );
    }

    #[test]
    fn server_window_is_the_smaller_of_offer_and_config_and_is_confirmed() {
        let config = DeflateConfig::default().server_max_window_bits(12);
        let p = pick(&["permessage-deflate; server_max_window_bits=10"], config).unwrap();
        assert_eq!(p.server_max_window_bits, 10);
        assert!(response(&p).ends_with("; server_max_window_bits=10\r\n"));
        let p = pick(&["permessage-deflate; server_max_window_bits=15"], config).unwrap();
        assert_eq!(p.server_max_window_bits, 12);
        assert!(response(&p).ends_with("; server_max_window_bits=12\r\n"));
        let p = pick(&["permessage-deflate; server_max_window_bits=9"], config).unwrap();
        assert!(response(&p).ends_with("; server_max_window_bits=9\r\n"));
        // Not offered: a smaller window is used without saying so, which any
        // inflater handles.
        let p = pick(&["permessage-deflate"], config).unwrap();
        assert_eq!(p.server_max_window_bits, 12);
        assert!(!response(&p).contains("server_max_window_bits"));
    }

    #[test]
    fn client_window_bits_is_never_answered() {
        for offer in [
            "permessage-deflate; client_max_window_bits",
            "permessage-deflate; client_max_window_bits=10",
            "permessage-deflate; client_max_window_bits=\"8\"",
        ] {
            let line = answer(&[offer], DeflateConfig::default()).expect(offer);
            assert!(!line.contains("client_max_window_bits"), "{offer}: {line}");
        }
    }

    #[test]
    fn window_8_declines_that_offer_and_the_next_is_tried() {
        assert_eq!(
            pick(
                &["permessage-deflate; server_max_window_bits=8"],
                DeflateConfig::default()
            ),
            None
        );
        let p = pick(
            &["permessage-deflate; server_max_window_bits=8, permessage-deflate; server_max_window_bits=9"],
            DeflateConfig::default(),
        )
        .unwrap();
        assert_eq!(p.server_max_window_bits, 9);
    }

    #[test]
    fn bad_offers_are_declined_and_the_next_one_wins() {
        let fallback = "permessage-deflate; server_no_context_takeover";
        for bad in [
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; client_max_window_bits; client_max_window_bits=9",
            "permessage-deflate; x_unknown",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits=09",
            "permessage-deflate; server_max_window_bits=1O",
            "permessage-deflate; client_max_window_bits=0",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover=\"x\"",
        ] {
            assert_eq!(pick(&[bad], DeflateConfig::default()), None, "{bad}");
            let both = format!("{bad}, {fallback}");
            let p = pick(
                &[&both],
                DeflateConfig::default().server_context_takeover(true),
            );
            assert!(p.unwrap().server_no_context_takeover, "{both}");
        }
    }

    #[test]
    fn offers_span_headers_and_other_extensions_are_skipped() {
        let p = pick(
            &[
                "x-webkit-deflate-frame",
                "foo; bar=1, permessage-deflate; server_max_window_bits=11",
                "permessage-deflate",
            ],
            DeflateConfig::default(),
        )
        .unwrap();
        assert_eq!(p.server_max_window_bits, 11);
        assert!(pick(&["x-webkit-deflate-frame"], DeflateConfig::default()).is_none());
        assert!(pick(&[], DeflateConfig::default()).is_none());
    }

    #[test]
    fn quoted_values_and_case_are_accepted() {
        let p = pick(
            &["Permessage-Deflate; Server_Max_Window_Bits=\"10\""],
            DeflateConfig::default(),
        )
        .unwrap();
        assert_eq!(p.server_max_window_bits, 10);
    }

    #[test]
    fn a_malformed_header_means_no_compression() {
        for bad in [
            "permessage-deflate; ",
            "permessage-deflate;; server_no_context_takeover",
            "permessage-deflate; server_max_window_bits=\"\"",
            "permessage-deflate, =",
        ] {
            assert_eq!(pick(&[bad], DeflateConfig::default()), None, "{bad}");
        }
        // Even when an earlier header held a good offer.
        assert_eq!(
            pick(&["permessage-deflate", "a;;"], DeflateConfig::default()),
            None
        );
        assert_eq!(
            negotiate([&b"permessage-deflate\xff"[..]], &DeflateConfig::default()),
            None
        );
    }
}
