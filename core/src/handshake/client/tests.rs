use super::*;
use crate::handshake::{negotiate, parse_request, write_accept};

/// The RFC 6455 §1.3 example key, and the accept value it calls for.
const KEY: [u8; 24] = *b"dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

fn drain(out: &mut WriteQueue) -> Vec<u8> {
    let mut bytes = Vec::new();
    out.move_into(&mut bytes);
    bytes
}

/// A handshake as if `request` had been written with the RFC's key.
fn with_known_key(request: ClientRequest<'_>) -> ClientHandshake<'_> {
    ClientHandshake { request, key: KEY }
}

/// A valid `101` for [`KEY`] with `extra` header lines (each ending CRLF).
fn switching(extra: &str) -> String {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {ACCEPT}\r\n{extra}\r\n"
    )
}

fn check(
    request: ClientRequest<'static>,
    response: &str,
) -> Result<Option<Agreed<'static>>, ClientHandshakeError> {
    with_known_key(request).read_response(response.as_bytes(), 8192)
}

const PLAIN: ClientRequest<'static> = ClientRequest {
    host: "example.com",
    target: "/chat",
    protocols: &[],
    headers: &[],
    deflate: None,
};

fn with_deflate(config: DeflateConfig) -> ClientRequest<'static> {
    PLAIN.permessage_deflate(config)
}

// ------------------------------------------------------------ the request

#[test]
fn the_request_is_one_our_server_accepts_with_everything_offered() {
    let extra = [("Origin", "https://example.com"), ("X-Token", "a\tb c")];
    let request = ClientRequest::new("[::1]:9001", "/chat?room=42&x=1")
        .protocols(&["chat", "superchat"])
        .headers(&extra)
        .permessage_deflate(
            DeflateConfig::default()
                .server_max_window_bits(10)
                .client_max_window_bits(12),
        );
    let mut out = WriteQueue::new();
    let handshake = request.write(&mut out).unwrap();
    let bytes = drain(&mut out);
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.starts_with("GET /chat?room=42&x=1 HTTP/1.1\r\nHost: [::1]:9001\r\n"));
    assert!(text.contains(
        "\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
         client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=12\r\n"
    ));
    assert!(text.ends_with("\r\nOrigin: https://example.com\r\nX-Token: a\tb c\r\n\r\n"));

    let mut headers = header_buffer();
    let (parsed, head_len) = parse_request(&bytes, &mut headers, 8192).unwrap().unwrap();
    assert_eq!(head_len, bytes.len());
    assert_eq!(parsed.path(), "/chat");
    assert_eq!(parsed.query(), Some("room=42&x=1"));
    assert_eq!(parsed.key(), handshake.key());
    assert_eq!(
        parsed.protocols().collect::<Vec<_>>(),
        ["chat", "superchat"]
    );
    assert_eq!(parsed.header_str("x-token"), Some("a\tb c"));
}

#[test]
fn every_request_gets_a_fresh_key() {
    let mut out = WriteQueue::new();
    let first = PLAIN.write(&mut out).unwrap();
    let second = PLAIN.write(&mut out).unwrap();
    assert_ne!(first.key(), second.key());
    for key in [first.key(), second.key()] {
        let mut nonce = [0u8; 18];
        let n = base64::engine::general_purpose::STANDARD
            .decode_slice(key, &mut nonce)
            .unwrap();
        assert_eq!(n, 16);
    }
}

#[test]
fn the_default_offer_is_what_a_browser_asks_plus_no_context_takeover() {
    let mut line = Vec::new();
    Offer::from_config(&DeflateConfig::default()).write(|piece| line.extend_from_slice(piece));
    assert_eq!(
        line,
        b"permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
          client_max_window_bits"
    );
    let keep = DeflateConfig::default()
        .server_context_takeover(true)
        .client_context_takeover(true);
    let mut line = Vec::new();
    Offer::from_config(&keep).write(|piece| line.extend_from_slice(piece));
    assert_eq!(line, b"permessage-deflate; client_max_window_bits");
}

#[test]
fn requests_that_would_break_are_refused_before_anything_is_written() {
    let bad: [(ClientRequest<'_>, ClientRequestError); 14] = [
        (ClientRequest::new("", "/"), ClientRequestError::InvalidHost),
        (
            ClientRequest::new("a b", "/"),
            ClientRequestError::InvalidHost,
        ),
        (
            ClientRequest::new("a\r\nX: y", "/"),
            ClientRequestError::InvalidHost,
        ),
        (
            ClientRequest::new("h", "chat"),
            ClientRequestError::InvalidTarget,
        ),
        (
            ClientRequest::new("h", "/a b"),
            ClientRequestError::InvalidTarget,
        ),
        (
            ClientRequest::new("h", "/a#frag"),
            ClientRequestError::InvalidTarget,
        ),
        (
            ClientRequest::new("h", "/é"),
            ClientRequestError::InvalidTarget,
        ),
        (
            PLAIN.protocols(&["a b"]),
            ClientRequestError::InvalidProtocol,
        ),
        (PLAIN.protocols(&[""]), ClientRequestError::InvalidProtocol),
        (
            PLAIN.protocols(&["chat", "chat"]),
            ClientRequestError::InvalidProtocol,
        ),
        (
            PLAIN.headers(&[("X-A", "1\r\nX-B: 2")]),
            ClientRequestError::InvalidHeader,
        ),
        (
            PLAIN.headers(&[("X A", "1")]),
            ClientRequestError::InvalidHeader,
        ),
        (
            PLAIN.headers(&[("sec-websocket-key", "x")]),
            ClientRequestError::ReservedHeader,
        ),
        (
            PLAIN.headers(&[("Content-Length", "5")]),
            ClientRequestError::ReservedHeader,
        ),
    ];
    for (request, expected) in bad {
        let mut out = WriteQueue::new();
        assert_eq!(
            request.write(&mut out).unwrap_err(),
            expected,
            "{request:?}"
        );
        assert!(out.is_empty());
        assert!(!expected.to_string().is_empty());
    }
    for owned in OWNED_HEADERS {
        let headers = [(owned, "x")];
        let mut out = WriteQueue::new();
        assert_eq!(
            PLAIN.headers(&headers).write(&mut out).unwrap_err(),
            ClientRequestError::ReservedHeader
        );
    }
}

// ------------------------------------------------------- against our server

/// Client offers and server settings, every combination: the client's
/// check of our server's `101` yields parameters compatible with what the
/// server agreed.
#[test]
fn round_trips_with_our_server_for_every_offer_and_config() {
    let mut client_configs = Vec::new();
    for server_keeps in [false, true] {
        for client_keeps in [false, true] {
            for bits in [9, 12, 15] {
                client_configs.push(
                    DeflateConfig::default()
                        .server_context_takeover(server_keeps)
                        .client_context_takeover(client_keeps)
                        .server_max_window_bits(bits)
                        .client_max_window_bits(24 - bits),
                );
            }
        }
    }
    let mut server_configs = client_configs.clone();
    server_configs.push(DeflateConfig::default().server_max_window_bits(11));
    let protocol_sets: [&[&str]; 3] = [&[], &["chat"], &["v2.chat", "chat"]];
    for offered in protocol_sets {
        for client in client_configs.iter().map(Some).chain([None]) {
            for server in &server_configs {
                let mut request = PLAIN.protocols(offered);
                if let Some(config) = client {
                    request = request.permessage_deflate(*config);
                }
                let mut out = WriteQueue::new();
                let handshake = request.write(&mut out).unwrap();
                let request_bytes = drain(&mut out);
                let mut headers = header_buffer();
                let (parsed, _) = parse_request(&request_bytes, &mut headers, 8192)
                    .unwrap()
                    .unwrap();
                let agreed = negotiate(parsed.extension_offers(), server);
                // The server picks the last protocol offered, if any.
                let protocol = parsed.protocols().last();
                write_accept(&mut out, parsed.key(), protocol, agreed.as_ref());
                let mut response = drain(&mut out);
                let head = response.len();
                response.extend_from_slice(b"\x81\x02hi");

                let accepted = handshake
                    .read_response(&response, 8192)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&response)))
                    .expect("a whole head");
                assert_eq!(accepted.head_len, head);
                assert_eq!(accepted.protocol, offered.last().copied());
                assert_eq!(accepted.deflate.is_some(), client.is_some());
                let (Some(theirs), Some(ours), Some(config)) = (agreed, accepted.deflate, client)
                else {
                    continue;
                };
                assert_eq!(
                    ours.server_no_context_takeover,
                    theirs.server_no_context_takeover
                );
                assert!(ours.server_no_context_takeover || config.server_context_takeover);
                // The client may drop its context when the server would
                // keep its window, never the other way round.
                assert!(ours.client_no_context_takeover || !theirs.client_no_context_takeover);
                assert_eq!(
                    ours.client_no_context_takeover,
                    theirs.client_no_context_takeover || !config.client_context_takeover
                );
                assert!(theirs.server_max_window_bits <= ours.server_max_window_bits);
                assert!(ours.server_max_window_bits <= config.server_max_window_bits);
                assert_eq!(ours.client_max_window_bits, config.client_max_window_bits);
                assert!(ours.client_max_window_bits <= theirs.client_max_window_bits);
            }
        }
    }
}

#[test]
fn every_prefix_of_a_response_is_incomplete() {
    let response = switching("Sec-WebSocket-Protocol: chat\r\n");
    let handshake = with_known_key(PLAIN.protocols(&["chat"]));
    for cut in 0..response.len() {
        assert_eq!(
            handshake.read_response(&response.as_bytes()[..cut], 8192),
            Ok(None),
            "{cut}"
        );
    }
    let accepted = handshake.read_response(response.as_bytes(), 8192);
    assert_eq!(
        accepted,
        Ok(Some(Agreed {
            head_len: response.len(),
            protocol: Some("chat"),
            deflate: None
        }))
    );
}

// ------------------------------------------------------------- failures

#[test]
fn a_refusal_keeps_its_status_and_its_headers_stay_readable() {
    let response = "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(
        check(PLAIN, response),
        Err(ClientHandshakeError::NotSwitching { status: 302 })
    );
    let mut headers = header_buffer();
    let (parsed, _) = parse_response(response.as_bytes(), &mut headers, 8192)
        .unwrap()
        .unwrap();
    assert_eq!(parsed.status(), 302);
    assert_eq!(parsed.header("location"), Some(&b"/elsewhere"[..]));
    assert_eq!(parsed.headers().count(), 2);
    let error = with_known_key(PLAIN).check(&parsed).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the server did not switch protocols (status 302)"
    );
}

#[test]
fn each_broken_response_fails_with_its_own_error() {
    use ClientHandshakeError::*;
    let good = switching("");
    let cases: Vec<(String, ClientHandshakeError)> = vec![
        (
            "HTTP/1.1 200 OK\r\n\r\n".into(),
            NotSwitching { status: 200 },
        ),
        (good.replace("HTTP/1.1", "HTTP/1.0"), NotHttp11),
        (good.replace("Upgrade: websocket\r\n", ""), MissingUpgrade),
        (
            good.replace("Upgrade: websocket", "Upgrade: h2c"),
            MissingUpgrade,
        ),
        (
            good.replace("Connection: Upgrade\r\n", ""),
            MissingConnectionUpgrade,
        ),
        (
            good.replace("Connection: Upgrade", "Connection: close"),
            MissingConnectionUpgrade,
        ),
        (
            good.replace(ACCEPT, "s3pPLMBiTxaQ9kYGzzhZRbK+xOp="),
            BadAccept,
        ),
        (
            good.replace(&format!("Sec-WebSocket-Accept: {ACCEPT}\r\n"), ""),
            BadAccept,
        ),
        (
            switching(&format!("Sec-WebSocket-Accept: {ACCEPT}\r\n")),
            BadAccept,
        ),
        (
            switching("Sec-WebSocket-Protocol: chat\r\n"),
            UnofferedProtocol,
        ),
        (
            switching("Sec-WebSocket-Extensions: permessage-deflate\r\n"),
            UnofferedExtension,
        ),
        ("HTTP/1.1 101\r\nbad header\r\n\r\n".into(), Malformed),
        ("NOT HTTP\r\n\r\n".into(), Malformed),
    ];
    for (response, expected) in cases {
        assert_eq!(check(PLAIN, &response), Err(expected), "{response:?}");
    }
    // Case and lists are fine.
    let relaxed = good
        .replace("Upgrade: websocket", "UPGRADE: WebSocket")
        .replace("Connection: Upgrade", "connection: keep-alive, upgrade");
    assert!(check(PLAIN, &relaxed).unwrap().is_some());
}

#[test]
fn a_tls_answer_is_told_apart_from_a_malformed_one() {
    use ClientHandshakeError::{Malformed, TlsAnswer};
    // rustls's alert to a plain request (a TLS 1.2 record header, as every
    // version writes it), a handshake record, and each cut short.
    for answer in [
        &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32][..],
        &[0x16, 0x03, 0x01, 0x00, 0x05],
        &[0x15],
        &[0x16, 0x03],
    ] {
        let read = with_known_key(PLAIN).read_response(answer, 8192);
        assert_eq!(read, Err(TlsAnswer), "{answer:?}");
    }
    // Not TLS: a byte like it, then no version 3.
    let read = with_known_key(PLAIN).read_response(&[0x16, 0x20, b'x', b'\r', b'\n'], 8192);
    assert_eq!(read, Err(Malformed));
    assert!(TlsAnswer.to_string().contains("wss://"));
}

#[test]
fn a_protocol_must_be_one_offered_and_only_one() {
    let offered = PLAIN.protocols(&["chat", "superchat"]);
    let ok = check(offered, &switching("Sec-WebSocket-Protocol: superchat\r\n"));
    assert_eq!(ok.unwrap().unwrap().protocol, Some("superchat"));
    assert_eq!(
        check(offered, &switching("")).unwrap().unwrap().protocol,
        None
    );
    for answer in [
        "Sec-WebSocket-Protocol: other\r\n",
        "Sec-WebSocket-Protocol: Chat\r\n",
        "Sec-WebSocket-Protocol: chat, superchat\r\n",
        "Sec-WebSocket-Protocol: chat\r\nSec-WebSocket-Protocol: chat\r\n",
        "Sec-WebSocket-Protocol: \r\n",
    ] {
        assert_eq!(
            check(offered, &switching(answer)),
            Err(ClientHandshakeError::UnofferedProtocol),
            "{answer}"
        );
    }
}

#[test]
fn permessage_deflate_answers_are_held_to_rfc_7692() {
    use ClientHandshakeError::*;
    // Offers server_no_context_takeover, server_max_window_bits=12 and
    // client_max_window_bits=13.
    let request = with_deflate(
        DeflateConfig::default()
            .server_max_window_bits(12)
            .client_max_window_bits(13)
            .client_context_takeover(true),
    );
    let answer = |params: &str| {
        check(
            request,
            &switching(&format!(
                "Sec-WebSocket-Extensions: permessage-deflate{params}\r\n"
            )),
        )
    };
    let confirmed = "; server_no_context_takeover; server_max_window_bits=12";
    let params = answer(confirmed).unwrap().unwrap().deflate.unwrap();
    assert_eq!(
        (
            params.server_no_context_takeover,
            params.client_no_context_takeover,
            params.server_max_window_bits,
            params.client_max_window_bits
        ),
        (true, false, 12, 13)
    );
    let params = answer(&format!(
        "{confirmed}; client_no_context_takeover; client_max_window_bits=9"
    ))
    .unwrap()
    .unwrap()
    .deflate
    .unwrap();
    assert!(params.client_no_context_takeover);
    assert_eq!(params.client_max_window_bits, 9);
    let params = answer("; server_max_window_bits=10; server_no_context_takeover")
        .unwrap()
        .unwrap()
        .deflate
        .unwrap();
    assert_eq!(params.server_max_window_bits, 10);

    for (params, expected) in [
        ("", BadExtension),
        ("; server_max_window_bits=12", BadExtension),
        ("; server_no_context_takeover", BadExtension),
        (
            "; server_no_context_takeover; server_max_window_bits=13",
            BadExtension,
        ),
        (
            "; server_no_context_takeover; server_max_window_bits=16",
            BadExtension,
        ),
        (
            "; server_no_context_takeover; server_max_window_bits=7",
            BadExtension,
        ),
        (
            "; server_no_context_takeover; server_max_window_bits",
            BadExtension,
        ),
        (
            &format!("{confirmed}; server_no_context_takeover"),
            BadExtension,
        ),
        (&format!("{confirmed}; x_unknown"), BadExtension),
        (
            &format!("{confirmed}; client_max_window_bits"),
            BadExtension,
        ),
        (
            &format!("{confirmed}; client_max_window_bits=14"),
            BadExtension,
        ),
        (
            &format!("{confirmed}; client_max_window_bits=8"),
            UnsupportedClientWindow,
        ),
        (
            &format!("{confirmed}; client_no_context_takeover=1"),
            BadExtension,
        ),
        (&format!("{confirmed};;"), BadExtension),
        (&format!("{confirmed}, permessage-deflate"), BadExtension),
        (
            &format!("{confirmed}, x-webkit-deflate-frame"),
            UnofferedExtension,
        ),
    ] {
        assert_eq!(answer(params), Err(expected), "{params}");
    }
    let response = switching(&format!(
        "Sec-WebSocket-Extensions: permessage-deflate{confirmed}\r\n\
         Sec-WebSocket-Extensions: permessage-deflate{confirmed}\r\n"
    ));
    assert_eq!(check(request, &response), Err(BadExtension));
    let not_utf8 = switching("Sec-WebSocket-Extensions: permessage-deflate\u{ff}\r\n");
    assert_eq!(check(request, &not_utf8), Err(BadExtension));
    // Declining is allowed: no header, or an empty one.
    for declined in ["", "Sec-WebSocket-Extensions: \r\n"] {
        let accepted = check(request, &switching(declined)).unwrap().unwrap();
        assert_eq!(accepted.deflate, None);
    }
}

#[test]
fn a_client_window_is_checked_only_against_what_was_offered() {
    let mut offer = Offer::from_config(&DeflateConfig::default());
    let value: &[u8] = b"permessage-deflate; server_no_context_takeover; client_max_window_bits=9";
    let params = deflate::check_answer([value], Some(&offer))
        .unwrap()
        .unwrap();
    assert_eq!(params.client_max_window_bits, 9);
    offer.client_max_window_bits = None;
    assert_eq!(
        deflate::check_answer([value], Some(&offer)),
        Err(ClientHandshakeError::BadExtension)
    );
}

#[test]
fn oversized_and_crowded_heads_are_refused() {
    let long = switching(&format!("X-Padding: {}\r\n", "p".repeat(9000)));
    assert_eq!(check(PLAIN, &long), Err(ClientHandshakeError::HeadTooLarge));
    let handshake = with_known_key(PLAIN);
    assert_eq!(
        handshake.read_response(&long.as_bytes()[..8192], 8192),
        Err(ClientHandshakeError::HeadTooLarge),
        "an unfinished head at the limit"
    );
    assert_eq!(
        handshake.read_response(&long.as_bytes()[..8191], 8192),
        Ok(None)
    );
    let crowded = switching(&"X-A: 1\r\n".repeat(MAX_HEADERS_IN_TEST));
    assert_eq!(
        check(PLAIN, &crowded),
        Err(ClientHandshakeError::TooManyHeaders)
    );
}

const MAX_HEADERS_IN_TEST: usize = crate::handshake::MAX_HEADERS;

#[test]
fn errors_say_what_went_wrong() {
    use ClientHandshakeError::*;
    for error in [
        HeadTooLarge,
        TooManyHeaders,
        Malformed,
        NotHttp11,
        NotSwitching { status: 403 },
        MissingUpgrade,
        MissingConnectionUpgrade,
        BadAccept,
        UnofferedProtocol,
        UnofferedExtension,
        BadExtension,
        UnsupportedClientWindow,
    ] {
        let error: Box<dyn std::error::Error> = Box::new(error);
        assert!(!error.to_string().is_empty());
    }
}

#[test]
fn an_extended_connect_round_trips_with_our_server() {
    use crate::handshake::{check_extended_connect, write_response_value};
    let headers_asked = [("Origin", "https://example.com")];
    for offered in [&[][..], &["v2.chat", "chat"][..]] {
        for deflate in [None, Some(DeflateConfig::default())] {
            let mut request = PLAIN.protocols(offered).headers(&headers_asked);
            if let Some(config) = deflate {
                request = request.permessage_deflate(config);
            }
            let (handshake, fields) = request.extended_connect().unwrap();
            // Every name lowercase, the version there, no key.
            assert!(fields.iter().all(|(n, _)| *n == n.to_ascii_lowercase()));
            assert!(
                fields
                    .iter()
                    .any(|(n, v)| n == "sec-websocket-version" && v == b"13")
            );
            assert!(fields.iter().all(|(n, _)| n != "sec-websocket-key"));
            assert!(fields.iter().any(|(n, _)| n == "origin"));
            let headers: Vec<httparse::Header<'_>> = fields
                .iter()
                .map(|(name, value)| httparse::Header { name, value })
                .collect();
            let parsed = check_extended_connect("CONNECT", Some("websocket"), "/chat", &headers)
                .expect("our server takes it");
            let agreed = negotiate(parsed.extension_offers(), &DeflateConfig::default());
            assert_eq!(agreed.is_some(), deflate.is_some());
            let protocol = parsed.protocols().last();
            let mut answer = Vec::new();
            if let Some(params) = &agreed {
                write_response_value(params, |piece| answer.extend_from_slice(piece));
            }
            let mut response = Vec::new();
            if let Some(protocol) = protocol {
                response.push(httparse::Header {
                    name: "sec-websocket-protocol",
                    value: protocol.as_bytes(),
                });
            }
            if agreed.is_some() {
                response.push(httparse::Header {
                    name: "sec-websocket-extensions",
                    value: &answer,
                });
            }
            let accepted = handshake.check(200, &response).unwrap();
            assert_eq!(accepted.protocol, offered.last().copied());
            assert_eq!(accepted.deflate.is_some(), deflate.is_some());
            assert_eq!(
                handshake.check(404, &response),
                Err(ClientHandshakeError::NotSwitching { status: 404 })
            );
        }
    }
    // A subprotocol that was not offered, and a bad request, are refused.
    let (handshake, _) = PLAIN.extended_connect().unwrap();
    let chosen = [httparse::Header {
        name: "sec-websocket-protocol",
        value: b"chat",
    }];
    assert_eq!(
        handshake.check(200, &chosen),
        Err(ClientHandshakeError::UnofferedProtocol)
    );
    let bad = PLAIN.headers(&[("Sec-WebSocket-Key", "x")]);
    assert_eq!(
        bad.extended_connect().unwrap_err(),
        ClientRequestError::ReservedHeader
    );
}
