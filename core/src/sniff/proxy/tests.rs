use super::*;

fn complete(input: &[u8]) -> (Proxied, usize) {
    match parse(input) {
        Ok(Parsed::Complete(proxied, taken)) => (proxied, taken),
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
    }
}

fn inet(source: &str, destination: &str, datagram: bool) -> Proxied {
    Proxied::Inet {
        source: source.parse().unwrap(),
        destination: destination.parse().unwrap(),
        datagram,
    }
}

/// Every strict prefix of a whole header is `Partial`, never an error.
fn partial_until_whole(header: &[u8]) {
    for n in 0..header.len() {
        assert_eq!(parse(&header[..n]), Ok(Parsed::Partial), "prefix of {n}");
    }
}

#[test]
fn v1_tcp4_and_tcp6_with_what_follows_left_alone() {
    let header = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n";
    let mut input = header.to_vec();
    input.extend_from_slice(b"GET / HTTP/1.1\r\n");
    let (proxied, taken) = complete(&input);
    assert_eq!(proxied, inet("192.0.2.7:56324", "198.51.100.1:443", false));
    assert_eq!(proxied.source(), Some("192.0.2.7:56324".parse().unwrap()));
    assert_eq!(taken, header.len());
    partial_until_whole(header);

    let header = b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n";
    let (proxied, taken) = complete(header);
    assert_eq!(proxied, inet("[2001:db8::1]:65535", "[::1]:0", false));
    assert_eq!(taken, header.len());
}

#[test]
fn v1_unknown_ignores_the_rest_of_its_line() {
    for header in [
        &b"PROXY UNKNOWN\r\n"[..],
        b"PROXY UNKNOWN ffff::1 ::1 1 2\r\n",
    ] {
        let (proxied, taken) = complete(header);
        assert_eq!((proxied.clone(), taken), (Proxied::Local, header.len()));
        assert_eq!(proxied.source(), None);
    }
}

#[test]
fn v1_at_its_longest_and_one_past() {
    // The specification's worst case: UNKNOWN with the longest addresses.
    let max = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
    let longest = format!("PROXY UNKNOWN {max} {max} 65535 65535\r\n");
    assert_eq!(longest.len(), MAX_V1);
    assert_eq!(complete(longest.as_bytes()), (Proxied::Local, MAX_V1));
    let tcp6 = format!("PROXY TCP6 {max} {max} 65535 65535\r\n");
    assert!(matches!(complete(tcp6.as_bytes()).0, Proxied::Inet { .. }));
    // No CRLF within 107 bytes: refused, however many more come.
    let endless = format!("PROXY UNKNOWN {}", "x".repeat(200));
    assert_eq!(
        parse(&endless.as_bytes()[..MAX_V1 - 1]),
        Ok(Parsed::Partial)
    );
    assert_eq!(parse(&endless.as_bytes()[..MAX_V1]), Err(Error::V1TooLong));
    assert_eq!(parse(endless.as_bytes()), Err(Error::V1TooLong));
}

#[test]
fn v1_lines_not_as_written_are_refused() {
    for line in [
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n\r\n",   // a bare LF inside
        "PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n",     // case matters
        "PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",    // two spaces
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n",    // a trailing space
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",   // a field too many
        "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",       // one too few
        "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",    // a leading zero
        "PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",    // a sign
        "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", // past 16 bits
        "PROXY TCP4 1.2.3.4 5.6.7.8 99999999999 2\r\n",
        "PROXY TCP4 ::1 5.6.7.8 1 2\r\n", // IPv6 under TCP4
        "PROXY TCP6 1.2.3.4 ::1 1 2\r\n", // IPv4 under TCP6
        "PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",
        "PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
        "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY \r\n",
    ] {
        assert_eq!(parse(line.as_bytes()), Err(Error::V1Malformed), "{line:?}");
    }
    let mut latin1 = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2".to_vec();
    latin1.extend_from_slice(&[0xe9, b'\r', b'\n']);
    assert_eq!(parse(&latin1), Err(Error::V1Malformed));
}

#[test]
fn neither_version_is_refused_at_the_first_wrong_byte() {
    assert_eq!(parse(b"G"), Err(Error::NotProxy));
    assert_eq!(parse(b"PROXX"), Err(Error::NotProxy));
    assert_eq!(parse(b"\r\n\r\n\0\r\nQUIX"), Err(Error::NotProxy));
    assert_eq!(parse(b"\x16\x03\x01"), Err(Error::NotProxy));
    assert_eq!(sniff(b""), None);
    assert_eq!(sniff(b"PRO"), None);
    assert_eq!(sniff(b"\r\n\r\n"), None);
    assert_eq!(sniff(b"PROXY "), Some(true));
    assert_eq!(sniff(&V2_SIGNATURE), Some(true));
    assert_eq!(sniff(b"GET "), Some(false));
}

/// A version 2 header: command, family and transport byte, then `body`
/// (addresses and TLVs).
fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut header = V2_SIGNATURE.to_vec();
    header.push(0x20 | command);
    header.push(family);
    header.extend_from_slice(&(body.len() as u16).to_be_bytes());
    header.extend_from_slice(body);
    header
}

fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(value.len() as u16).to_be_bytes());
    out.extend_from_slice(value);
    out
}

fn inet4_body() -> Vec<u8> {
    let mut body = vec![192, 0, 2, 7, 198, 51, 100, 1];
    body.extend_from_slice(&56324u16.to_be_bytes());
    body.extend_from_slice(&443u16.to_be_bytes());
    body
}

#[test]
fn v2_tcp4_with_tlvs_skipped() {
    let mut body = inet4_body();
    body.extend(tlv(0x01, b"h2")); // ALPN
    body.extend(tlv(0x02, b"example.com")); // authority
    body.extend(tlv(0x04, &[0; 7])); // NOOP padding
    body.extend(tlv(0xe0, b"")); // a custom one, empty
    let header = v2(1, 0x11, &body);
    let mut input = header.clone();
    input.extend_from_slice(b"\x16\x03\x01");
    assert_eq!(
        complete(&input),
        (
            inet("192.0.2.7:56324", "198.51.100.1:443", false),
            header.len()
        )
    );
    partial_until_whole(&header);
}

#[test]
fn v2_tcp6_udp_and_unix() {
    let mut body = Vec::new();
    body.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
    body.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    body.extend_from_slice(&[0xff, 0xff, 0, 80]);
    assert_eq!(
        complete(&v2(1, 0x21, &body)).0,
        inet("[2001:db8::7]:65535", "[::1]:80", false)
    );
    assert_eq!(
        complete(&v2(1, 0x22, &body)).0,
        inet("[2001:db8::7]:65535", "[::1]:80", true)
    );
    assert_eq!(
        complete(&v2(1, 0x12, &inet4_body())).0,
        inet("192.0.2.7:56324", "198.51.100.1:443", true)
    );

    let mut body = vec![0; 216];
    body[..5].copy_from_slice(b"/a/b\0");
    body[108..].fill(b'x'); // a path of all 108 bytes, no NUL
    let (proxied, _) = complete(&v2(1, 0x31, &body));
    assert_eq!(
        proxied,
        Proxied::Unix {
            source: b"/a/b".to_vec(),
            destination: vec![b'x'; 108]
        }
    );
    assert_eq!(proxied.source(), None);
}

#[test]
fn v2_local_and_unspec_keep_the_connections_own_addresses() {
    // LOCAL: whatever addresses follow are ignored.
    assert_eq!(complete(&v2(0, 0x11, &inet4_body())).0, Proxied::Local);
    assert_eq!(complete(&v2(0, 0x00, b"")).0, Proxied::Local);
    // UNSPEC under PROXY: the proxy knows no address either.
    assert_eq!(complete(&v2(1, 0x00, &tlv(0x04, b"pad"))).0, Proxied::Local);
}

#[test]
fn v2_hostile_headers_are_refused() {
    let good = v2(1, 0x11, &inet4_body());
    let mut bad = good.clone();
    bad[12] = 0x11; // version 1 in a binary header
    assert_eq!(parse(&bad), Err(Error::V2Version));
    bad[12] = 0x22; // command 2
    assert_eq!(parse(&bad), Err(Error::V2Command));
    for family in [0x41, 0x13, 0x10, 0x01, 0xff] {
        bad = good.clone();
        bad[13] = family;
        assert_eq!(parse(&bad), Err(Error::V2Family), "{family:#x}");
    }
    // Shorter than its addresses: refused from the fixed part alone.
    assert_eq!(parse(&v2(1, 0x11, &[0; 11])), Err(Error::V2Truncated));
    assert_eq!(parse(&v2(1, 0x21, &[0; 35])[..16]), Err(Error::V2Truncated));
    // A TLV running past the header's end, or cut inside its own head.
    let mut body = inet4_body();
    body.extend_from_slice(&[0x01, 0x00, 0x05, b'h', b'2']);
    assert_eq!(parse(&v2(1, 0x11, &body)), Err(Error::V2Truncated));
    let mut body = inet4_body();
    body.extend_from_slice(&[0x01, 0x00]);
    assert_eq!(parse(&v2(1, 0x11, &body)), Err(Error::V2Truncated));
    // A length past the bound: refused before the body is waited for.
    let mut long = v2(1, 0x11, &inet4_body());
    long[14..16].copy_from_slice(&((MAX_V2 - 15) as u16).to_be_bytes());
    assert_eq!(parse(&long[..16]), Err(Error::V2TooLong));
    long[14..16].copy_from_slice(&((MAX_V2 - 16) as u16).to_be_bytes());
    assert_eq!(parse(&long), Ok(Parsed::Partial));
}

/// Random bytes, and valid headers with random damage, never panic; what
/// is taken is never more than what came, and a shorter input never
/// completes where a longer one would not.
#[test]
fn arbitrary_input_is_answered_without_panic() {
    use rand::RngExt;
    let mut rng = rand::rng();
    let seeds = [
        b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n".to_vec(),
        b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n".to_vec(),
        v2(1, 0x11, &inet4_body()),
        v2(1, 0x31, &[0; 216]),
    ];
    for _ in 0..crate::rounds(20_000) {
        let mut input = if rng.random_bool(0.3) {
            (0..rng.random_range(0..300))
                .map(|_| rng.random())
                .collect()
        } else {
            seeds[rng.random_range(0..seeds.len())].clone()
        };
        for _ in 0..rng.random_range(0..4) {
            if !input.is_empty() {
                let at = rng.random_range(0..input.len());
                input[at] = rng.random();
            }
        }
        input.truncate(rng.random_range(0..=input.len()));
        if let Ok(Parsed::Complete(_, taken)) = parse(&input) {
            assert!(taken <= input.len());
            // The same header with more after it reads the same.
            let mut more = input.clone();
            more.extend_from_slice(b"more");
            assert_eq!(parse(&more), parse(&input));
        }
    }
}
