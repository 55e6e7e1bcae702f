use super::*;

/// What Chrome sends, give or take a cookie.
pub(crate) const CHROME: &str = "GET /chat?room=42&x=1 HTTP/1.1\r\n\
Host: 127.0.0.1:9001\r\n\
Connection: Upgrade\r\n\
Pragma: no-cache\r\n\
Cache-Control: no-cache\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\n\
Upgrade: websocket\r\n\
Origin: http://127.0.0.1:8080\r\n\
Sec-WebSocket-Version: 13\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Accept-Language: en-US,en;q=0.9\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
Sec-WebSocket-Protocol: chat, superchat\r\n\
\r\n";

fn parse(raw: &str) -> Result<Option<usize>, HandshakeError> {
    let mut headers = header_buffer();
    parse_request(raw.as_bytes(), &mut headers, 8192).map(|r| r.map(|(_, n)| n))
}

/// The Chrome request with header `name` replaced by `line` (or removed if empty).
fn with_header(name: &str, line: &str) -> String {
    let mut out = String::new();
    for l in CHROME.split_inclusive("\r\n") {
        if l.to_ascii_lowercase()
            .starts_with(&format!("{}:", name.to_ascii_lowercase()))
        {
            if !line.is_empty() {
                out.push_str(line);
                out.push_str("\r\n");
            }
        } else {
            out.push_str(l);
        }
    }
    out
}

#[test]
fn parses_a_browser_request() {
    let mut raw = CHROME.as_bytes().to_vec();
    raw.extend_from_slice(b"\x81\x85first frame bytes");
    let mut headers = header_buffer();
    let (req, n) = parse_request(&raw, &mut headers, 8192).unwrap().unwrap();
    assert_eq!(n, CHROME.len(), "bytes after the head are not part of it");
    assert_eq!(req.method(), "GET");
    assert_eq!(req.path(), "/chat");
    assert_eq!(req.query(), Some("room=42&x=1"));
    assert_eq!(req.header("origin"), Some(&b"http://127.0.0.1:8080"[..]));
    assert_eq!(req.header_str("HOST"), Some("127.0.0.1:9001"));
    assert_eq!(req.key(), b"dGhlIHNhbXBsZSBub25jZQ==");
    assert_eq!(req.protocols().collect::<Vec<_>>(), ["chat", "superchat"]);
    assert_eq!(req.headers().count(), 13);
}

#[test]
fn extension_offers_are_every_extensions_header_whole_and_in_order() {
    let raw = with_header(
        "sec-websocket-extensions",
        "Sec-WebSocket-Extensions: a; p=\"x,y\", b\r\nsec-websocket-extensions: permessage-deflate",
    );
    let mut headers = header_buffer();
    let (req, _) = parse_request(raw.as_bytes(), &mut headers, 8192)
        .unwrap()
        .unwrap();
    let offers: Vec<&[u8]> = req.extension_offers().collect();
    assert_eq!(offers, [&b"a; p=\"x,y\", b"[..], b"permessage-deflate"]);
}

#[test]
fn every_prefix_is_incomplete() {
    for cut in 0..CHROME.len() {
        assert_eq!(parse(&CHROME[..cut]), Ok(None), "cut at {cut}");
    }
}

#[test]
fn accepts_case_insensitive_and_listed_tokens() {
    for (name, line) in [
        ("upgrade", "UPGRADE: WebSocket"),
        ("upgrade", "Upgrade: foo/2, websocket"),
        ("connection", "connection: keep-alive, UpGrade"),
        ("sec-websocket-version", "Sec-WebSocket-Version:  13 "),
    ] {
        assert!(parse(&with_header(name, line)).unwrap().is_some(), "{line}");
    }
    // Tokens may also come in separate header lines.
    let split = with_header(
        "connection",
        "Connection: keep-alive\r\nConnection: upgrade",
    );
    assert!(parse(&split).unwrap().is_some());
}

#[test]
fn rejects_bad_upgrades_with_the_right_status() {
    let cases: Vec<(String, HandshakeError)> = vec![
        (
            CHROME.replacen("GET", "POST", 1),
            HandshakeError::MethodNotAllowed,
        ),
        (
            CHROME.replacen("HTTP/1.1", "HTTP/1.0", 1),
            HandshakeError::NotHttp11,
        ),
        (
            with_header("upgrade", ""),
            HandshakeError::NotWebSocketUpgrade,
        ),
        (
            with_header("upgrade", "Upgrade: h2c"),
            HandshakeError::NotWebSocketUpgrade,
        ),
        (
            with_header("connection", "Connection: keep-alive"),
            HandshakeError::MissingConnectionUpgrade,
        ),
        (
            with_header("connection", ""),
            HandshakeError::MissingConnectionUpgrade,
        ),
        (
            with_header("sec-websocket-version", "Sec-WebSocket-Version: 8"),
            HandshakeError::UnsupportedVersion,
        ),
        (
            with_header("sec-websocket-version", ""),
            HandshakeError::UnsupportedVersion,
        ),
        (
            with_header("sec-websocket-key", ""),
            HandshakeError::MissingKey,
        ),
        (
            with_header("sec-websocket-key", "Sec-WebSocket-Key: c2hvcnQ="),
            HandshakeError::InvalidKey,
        ),
        (
            with_header(
                "sec-websocket-key",
                "Sec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==",
            ),
            HandshakeError::InvalidKey,
        ),
        (
            with_header(
                "sec-websocket-key",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            ),
            HandshakeError::InvalidKey,
        ),
        (with_header("host", ""), HandshakeError::MissingHost),
        (
            "NOT HTTP AT ALL\r\n\r\n".to_owned(),
            HandshakeError::Malformed,
        ),
        (
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n".to_owned(),
            HandshakeError::Malformed,
        ),
    ];
    for (raw, expected) in cases {
        assert_eq!(parse(&raw), Err(expected), "{raw:?}");
    }
    assert_eq!(HandshakeError::MethodNotAllowed.status(), 405);
    assert_eq!(HandshakeError::UnsupportedVersion.status(), 426);
    assert_eq!(HandshakeError::InvalidKey.status(), 400);
    assert_eq!(HandshakeError::MissingKey.status(), 400);
    assert!(
        HandshakeError::MissingKey
            .reason()
            .starts_with("missing Sec-WebSocket-Key")
    );
}

#[test]
fn oversized_heads_get_431() {
    let padding = format!("X-Padding: {}\r\n", "a".repeat(9000));
    let big = CHROME.replacen("\r\n\r\n", &format!("\r\n{padding}\r\n"), 1);
    assert_eq!(parse(&big), Err(HandshakeError::HeadTooLarge));
    // Incomplete but already past the limit: no point waiting for the rest.
    assert_eq!(parse(&big[..8200]), Err(HandshakeError::HeadTooLarge));
    assert_eq!(HandshakeError::HeadTooLarge.status(), 431);

    let many: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    let crowded = CHROME.replacen("\r\n\r\n", &format!("\r\n{many}\r\n"), 1);
    assert_eq!(parse(&crowded), Err(HandshakeError::TooManyHeaders));
    assert_eq!(HandshakeError::TooManyHeaders.status(), 431);
}

#[test]
fn a_request_without_query_has_none() {
    let raw = CHROME.replacen("/chat?room=42&x=1", "/", 1);
    let mut headers = header_buffer();
    let (req, _) = parse_request(raw.as_bytes(), &mut headers, 8192)
        .unwrap()
        .unwrap();
    assert_eq!(req.path(), "/");
    assert_eq!(req.query(), None);
}

#[test]
fn a_head_without_upgrade_websocket_is_plain_http() {
    let plain = b"POST /healthz?x=1 HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n";
    let mut headers = header_buffer();
    let (head, len) = parse_head(plain, &mut headers, 8192).unwrap().unwrap();
    assert_eq!(len, plain.len());
    assert!(!head.wants_websocket());
    let request = head.as_request(b"");
    assert_eq!((request.method(), request.path()), ("POST", "/healthz"));
    assert_eq!((request.query(), request.key()), (Some("x=1"), &b""[..]));
    assert_eq!(head.check().unwrap_err(), HandshakeError::MethodNotAllowed);
    let upgrade = b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: keep, WebSocket\r\n\r\n";
    let mut headers = header_buffer();
    let (head, _) = parse_head(upgrade, &mut headers, 8192).unwrap().unwrap();
    assert!(head.wants_websocket());
}

#[test]
fn an_extended_connect_is_checked_as_rfc_8441_asks() {
    let version = [httparse::Header {
        name: "sec-websocket-version",
        value: b"13",
    }];
    let ok = check_extended_connect("CONNECT", Some("websocket"), "/chat?room=1", &version)
        .expect("a valid extended CONNECT");
    assert_eq!(
        (ok.method(), ok.path(), ok.query()),
        ("CONNECT", "/chat", Some("room=1"))
    );
    assert_eq!(ok.key(), b"");
    for (method, protocol) in [
        ("CONNECT", None),
        ("CONNECT", Some("h2c")),
        ("GET", Some("websocket")),
    ] {
        assert_eq!(
            check_extended_connect(method, protocol, "/", &version).map(|_| ()),
            Err(HandshakeError::NotExtendedConnect),
            "{method} {protocol:?}"
        );
    }
    assert_eq!(HandshakeError::NotExtendedConnect.status(), 400);
    let old = [httparse::Header {
        name: "sec-websocket-version",
        value: b"8",
    }];
    assert_eq!(
        check_extended_connect("CONNECT", Some("websocket"), "/", &old).map(|_| ()),
        Err(HandshakeError::UnsupportedVersion)
    );
    assert_eq!(
        check_extended_connect("CONNECT", Some("websocket"), "/", &[]).map(|_| ()),
        Err(HandshakeError::UnsupportedVersion)
    );
}

#[test]
fn a_plain_requests_body_length_comes_from_content_length_only() {
    let length_of = |extra: &str| {
        let head = format!("POST /publish/a HTTP/1.1\r\nHost: a\r\n{extra}\r\n");
        let mut headers = header_buffer();
        let (head, _) = parse_head(head.as_bytes(), &mut headers, 8192)
            .unwrap()
            .unwrap();
        head.body_len()
    };
    assert_eq!(length_of(""), Ok(0));
    assert_eq!(length_of("Content-Length: 12\r\n"), Ok(12));
    assert_eq!(length_of("Content-Length:  7 \r\n"), Ok(7));
    // Repeated, equal: one length (RFC 9112 §6.3); different: refused.
    assert_eq!(length_of("Content-Length: 5, 5\r\n"), Ok(5));
    assert_eq!(
        length_of("Content-Length: 5\r\nContent-Length: 5\r\n"),
        Ok(5)
    );
    for bad in [
        "Content-Length: 5, 6\r\n",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: -1\r\n",
        "Content-Length: +1\r\n",
        "Content-Length: 0x10\r\n",
        "Content-Length: \r\n",
        "Content-Length: 12345678901234567890123\r\n",
    ] {
        assert_eq!(
            length_of(bad),
            Err(HandshakeError::BadContentLength),
            "{bad}"
        );
    }
    assert_eq!(
        length_of("Transfer-Encoding: chunked\r\n"),
        Err(HandshakeError::LengthRequired)
    );
    assert_eq!(HandshakeError::LengthRequired.status(), 411);
    assert_eq!(HandshakeError::BodyTooLarge.status(), 413);
    // Over usize on no target, but larger than any limit.
    assert_eq!(
        length_of("Content-Length: 99999999999999999\r\n"),
        Ok(99_999_999_999_999_999)
    );
}

#[test]
fn keep_alive_is_http_1_1_unless_closed_and_http_1_0_only_when_asked() {
    for (raw, keeps) in [
        ("GET / HTTP/1.1\r\nHost: a\r\n\r\n", true),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, Close\r\n\r\n",
            false,
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
            true,
        ),
        ("GET / HTTP/1.0\r\n\r\n", false),
        ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true),
    ] {
        let mut headers = header_buffer();
        let (head, _) = parse_head(raw.as_bytes(), &mut headers, 8192)
            .unwrap()
            .unwrap();
        assert_eq!(head.keeps_alive(), keeps, "{raw:?}");
    }
}

#[test]
fn host_is_required_once_in_http_1_1_and_never_twice() {
    let parse_head_of = |raw: &str| {
        let mut headers = header_buffer();
        parse_head(raw.as_bytes(), &mut headers, 8192).map(|head| head.map(|(_, n)| n))
    };
    let one = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_eq!(parse_head_of(one), Ok(Some(one.len())));
    assert_eq!(
        parse_head_of("GET / HTTP/1.1\r\nX: y\r\n\r\n"),
        Err(HandshakeError::MissingHost)
    );
    assert_eq!(
        parse_head_of("POST / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
        Err(HandshakeError::DuplicateHost)
    );
    // HTTP/1.0 may leave it out, but not give two.
    assert!(parse_head_of("GET / HTTP/1.0\r\n\r\n").is_ok());
    assert_eq!(
        parse_head_of("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n"),
        Err(HandshakeError::DuplicateHost)
    );
    // An upgrade checked elsewhere (hyper's head) counts them too.
    let twice = CHROME.replace("Host: 127.0.0.1:9001\r\n", "Host: a\r\nHost: b\r\n");
    assert_eq!(parse(&twice), Err(HandshakeError::DuplicateHost));
    let mut headers = header_buffer();
    let mut request = httparse::Request::new(&mut headers);
    request.parse(twice.as_bytes()).unwrap();
    let checked = check_request("GET", "/", 1, request.headers).unwrap_err();
    assert_eq!(checked, HandshakeError::DuplicateHost);
}

#[test]
fn a_bare_lf_anywhere_in_the_head_is_refused() {
    for raw in [
        "GET / HTTP/1.1\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n\n",
        "GET / HTTP/1.1\nHost: a\n\n",
    ] {
        let mut headers = header_buffer();
        let parsed = parse_head(raw.as_bytes(), &mut headers, 8192);
        assert_eq!(parsed.err(), Some(HandshakeError::BareLineFeed), "{raw:?}");
    }
    let crlf = CHROME.replace("\r\n", "\n");
    assert_eq!(parse(&crlf), Err(HandshakeError::BareLineFeed));
}

#[test]
fn expect_100_continue_is_seen_in_http_1_1_only() {
    for (raw, expects) in [
        (
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            true,
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nexpect: 100-Continue\r\n\r\n",
            true,
        ),
        ("POST / HTTP/1.1\r\nHost: a\r\n\r\n", false),
        ("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", false),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: something\r\n\r\n",
            false,
        ),
    ] {
        let mut headers = header_buffer();
        let (head, _) = parse_head(raw.as_bytes(), &mut headers, 8192)
            .unwrap()
            .unwrap();
        assert_eq!(head.expects_continue(), expects, "{raw:?}");
    }
}
