use super::*;

/// Loopback and 10.0.0.0/8 are the trusted proxies here.
fn trusted(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.octets()[0] == 10,
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

const PROXY: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn read<'a>(headers: &'a [(&'a str, &'a str)]) -> Result<Option<Forwarded<'a>>, ForwardedError> {
    let headers = headers.iter().map(|(n, v)| (*n, v.as_bytes()));
    forwarded(PROXY, headers, trusted)
}

fn client(headers: &[(&str, &str)]) -> Option<IpAddr> {
    read(headers).unwrap().unwrap().client
}

fn ip(text: &str) -> Option<IpAddr> {
    Some(text.parse().unwrap())
}

#[test]
fn nothing_is_read_from_an_untrusted_peer_or_without_headers() {
    let headers = [("X-Forwarded-For", "192.0.2.1".as_bytes())];
    let stranger: IpAddr = "203.0.113.5".parse().unwrap();
    assert_eq!(forwarded(stranger, headers, trusted), Ok(None));
    assert_eq!(read(&[("Host", "a.example")]), Ok(None));
}

#[test]
fn x_forwarded_for_from_its_right_end() {
    assert_eq!(
        client(&[("X-Forwarded-For", "203.0.113.9")]),
        ip("203.0.113.9")
    );
    // What the client wrote itself, left of what the proxy saw, is not
    // believed, nor even read.
    assert_eq!(
        client(&[("X-Forwarded-For", "1.1.1.1, 203.0.113.9")]),
        ip("203.0.113.9")
    );
    assert_eq!(
        client(&[("X-Forwarded-For", "garbage, 203.0.113.9")]),
        ip("203.0.113.9")
    );
    // Past a further trusted proxy.
    assert_eq!(
        client(&[("x-forwarded-for", "203.0.113.9, 10.0.0.2")]),
        ip("203.0.113.9")
    );
    // Lines of one header are one list.
    let two = [
        ("X-Forwarded-For", "203.0.113.9"),
        ("X-Forwarded-For", "10.1.1.1 , ,10.0.0.2"),
    ];
    assert_eq!(client(&two), ip("203.0.113.9"));
    // Trusted all the way: the farthest.
    assert_eq!(
        client(&[("X-Forwarded-For", "10.0.0.3, 10.0.0.2")]),
        ip("10.0.0.3")
    );
    // The forms proxies write.
    assert_eq!(
        client(&[("X-Forwarded-For", "2001:db8::1")]),
        ip("2001:db8::1")
    );
    assert_eq!(
        client(&[("X-Forwarded-For", "[2001:db8::1]:443")]),
        ip("2001:db8::1")
    );
    assert_eq!(
        client(&[("X-Forwarded-For", "192.0.2.1:8080")]),
        ip("192.0.2.1")
    );
    // What the nearest proxy saw must read; only empty items say nothing.
    for bad in ["203.0.113.9, garbage", "unknown", "192.0.2.1:99999", "[::1"] {
        let headers = [("X-Forwarded-For", bad)];
        assert_eq!(read(&headers), Err(ForwardedError::Malformed), "{bad:?}");
    }
    for empty in ["", " , "] {
        assert_eq!(read(&[("X-Forwarded-For", empty)]), Ok(None));
    }
    assert_eq!(
        read(&[("X-Forwarded-For", "203.0.113.9, garbage")]),
        Err(ForwardedError::Malformed)
    );
}

#[test]
fn proto_and_host_are_the_nearest_proxys() {
    let headers = [
        ("X-Forwarded-For", "203.0.113.9"),
        ("X-Forwarded-Proto", "http, https"),
        ("X-Forwarded-Host", "app.example"),
    ];
    let read = read(&headers).unwrap().unwrap();
    assert_eq!(read.proto.as_deref(), Some("https"));
    assert_eq!(read.host.as_deref(), Some("app.example"));
    assert_eq!(read.port, None);
}

#[test]
fn forwarded_elements_and_pairs() {
    let headers = [("Forwarded", "for=192.0.2.60;proto=http;by=203.0.113.43")];
    let read_one = read(&headers).unwrap().unwrap();
    assert_eq!(read_one.client, ip("192.0.2.60"));
    assert_eq!(read_one.proto.as_deref(), Some("http"));
    let headers = [(
        "forwarded",
        r#"For="[2001:db8:cafe::17]:4711";HOST="a.example:8443";Proto=https"#,
    )];
    let read_two = read(&headers).unwrap().unwrap();
    assert_eq!(
        (read_two.client, read_two.port),
        (ip("2001:db8:cafe::17"), Some(4711))
    );
    assert_eq!(read_two.host.as_deref(), Some("a.example:8443"));
    assert_eq!(read_two.proto.as_deref(), Some("https"));
    // Past trusted proxies, from the right; the client's own element's
    // host and proto.
    let chain = [
        ("Forwarded", "for=198.51.100.1;host=forged.example"),
        (
            "Forwarded",
            "for=203.0.113.9;host=app.example;proto=https, for=10.0.0.2;host=inner",
        ),
    ];
    let read_chain = read(&chain).unwrap().unwrap();
    assert_eq!(read_chain.client, ip("203.0.113.9"));
    assert_eq!(read_chain.host.as_deref(), Some("app.example"));
    // Unknown and hidden clients: no address.
    assert_eq!(client(&[("Forwarded", "for=unknown")]), None);
    assert_eq!(client(&[("Forwarded", r#"for="_hidden:_port""#)]), None);
    // An escape in a quoted value; a comma inside quotes.
    let headers = [("Forwarded", r#"for=192.0.2.1;host="a\"b,c""#)];
    assert_eq!(
        read(&headers).unwrap().unwrap().host.as_deref(),
        Some("a\"b,c")
    );
    // Forwarded wins over X-Forwarded-For.
    let both = [
        ("X-Forwarded-For", "192.0.2.1"),
        ("Forwarded", "for=192.0.2.2"),
    ];
    assert_eq!(client(&both), ip("192.0.2.2"));
}

#[test]
fn malformed_forwarded_is_refused() {
    for bad in [
        "for",
        "for=",
        "=192.0.2.1",
        "for=192.0.2.1;for=192.0.2.2",
        "for=\"192.0.2.1",
        "for=192.0.2.1 x",
        "fo r=192.0.2.1",
        "for=\"[2001:db8::1]:x\"",
        "for=300.1.1.1",
        "for=_hidden:_port", // a colon needs quotes
        "for=\"192.0.2.1\\",
    ] {
        assert_eq!(
            read(&[("Forwarded", bad)]),
            Err(ForwardedError::Malformed),
            "{bad:?}"
        );
    }
}

#[test]
fn a_chain_of_trusted_proxies_is_bounded() {
    let long = vec!["10.0.0.1"; MAX_HOPS + 1].join(", ");
    assert_eq!(
        read(&[("X-Forwarded-For", &long)]),
        Err(ForwardedError::TooManyHops)
    );
    let long = vec!["for=10.0.0.1"; MAX_HOPS + 1].join(", ");
    assert_eq!(
        read(&[("Forwarded", &long)]),
        Err(ForwardedError::TooManyHops)
    );
    let flood = vec!["1.1.1.1"; 1000].join(",");
    assert_eq!(
        read(&[("X-Forwarded-For", &flood)]),
        Err(ForwardedError::TooManyHops)
    );
}

/// Arbitrary values never panic.
#[test]
fn arbitrary_values() {
    use rand::RngExt;
    let mut rng = rand::rng();
    let alphabet = b"for=;,\"\\[]:._-0123456789abcdef unknown proto host";
    for _ in 0..crate::rounds(20_000) {
        let len = rng.random_range(0..40);
        let value: String = (0..len)
            .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
            .collect();
        let name = ["Forwarded", "X-Forwarded-For"][rng.random_range(0..2)];
        let _ = read(&[(name, &value)]);
    }
}
