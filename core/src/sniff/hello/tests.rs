use super::*;

// ClientHellos as real clients sent them (recorded once): OpenSSL's
// `s_client -servername example.com -alpn h2,http/1.1`, curl's `--http2`
// to `https://localhost`, and Python's `ssl` with ALPN `smux` and the
// name `one.port.test`.
const OPENSSL: &[u8] = include_bytes!("openssl.bin");
const CURL: &[u8] = include_bytes!("curl.bin");
const PYTHON: &[u8] = include_bytes!("python.bin");

fn complete(input: &[u8]) -> ClientHello {
    match read(input) {
        Ok(Read::Complete(hello)) => hello,
        other => panic!("{other:?}"),
    }
}

#[test]
fn real_clients_hellos_read_with_every_prefix_partial() {
    let openssl = complete(OPENSSL);
    assert_eq!(openssl.server_name.as_deref(), Some("example.com"));
    assert_eq!(openssl.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    assert!(openssl.offers(b"h2") && !openssl.offers(b"smux"));
    let curl = complete(CURL);
    assert_eq!(curl.server_name.as_deref(), Some("localhost"));
    assert!(curl.offers(b"h2") && curl.offers(b"http/1.1"));
    let python = complete(PYTHON);
    assert_eq!(python.server_name.as_deref(), Some("one.port.test"));
    assert_eq!(python.alpn, [b"smux".to_vec()]);
    for hello in [OPENSSL, CURL, PYTHON] {
        for n in 1..hello.len() {
            assert_eq!(read(&hello[..n]), Ok(Read::Partial), "prefix of {n}");
        }
        assert_eq!(sniff(hello), Some(true));
    }
}

/// A hello of our own making: `extensions` after a minimal body.
fn hello(extensions: &[u8]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(extensions);
    let mut message = vec![CLIENT_HELLO, 0];
    message.extend_from_slice(&(body.len() as u16).to_be_bytes());
    message.extend_from_slice(&body);
    message
}

/// `message` in records of at most `size` bytes each.
fn records(message: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in message.chunks(size) {
        out.extend_from_slice(&[HANDSHAKE, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut out = kind.to_be_bytes().to_vec();
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn sni(name: &[u8]) -> Vec<u8> {
    let mut entry = vec![0];
    entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
    entry.extend_from_slice(name);
    let mut list = (entry.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&entry);
    extension(SERVER_NAME, &list)
}

fn alpn(names: &[&[u8]]) -> Vec<u8> {
    let mut entries = Vec::new();
    for name in names {
        entries.push(name.len() as u8);
        entries.extend_from_slice(name);
    }
    let mut list = (entries.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&entries);
    extension(ALPN, &list)
}

#[test]
fn a_hello_across_records_of_any_size() {
    let mut extensions = sni(b"a.example");
    extensions.extend(extension(0x002b, &[2, 3, 4])); // another, skipped
    extensions.extend(alpn(&[b"smux", b"h2"]));
    let message = hello(&extensions);
    for size in [1, 2, 3, 5, 64, message.len()] {
        let input = records(&message, size);
        let read = complete(&input);
        assert_eq!(
            read.server_name.as_deref(),
            Some("a.example"),
            "records of {size}"
        );
        assert_eq!(read.alpn, [b"smux".to_vec(), b"h2".to_vec()]);
        assert_eq!(read_prefix_until_whole(&input), input.len());
    }
    // No extensions at all, and none of the two.
    assert_eq!(complete(&records(&hello(b""), 100)), ClientHello::default());
    let mut old = hello(b"");
    old.truncate(old.len() - 2); // not even the extensions' length
    old[3] -= 2;
    assert_eq!(complete(&records(&old, 100)), ClientHello::default());
}

/// The length at which the input first reads whole: every prefix before it
/// is `Partial`.
fn read_prefix_until_whole(input: &[u8]) -> usize {
    (1..=input.len())
        .find(|&n| read(&input[..n]) != Ok(Read::Partial))
        .unwrap()
}

#[test]
fn what_is_not_a_hello() {
    assert_eq!(read(b"GET / HTTP/1.1\r\n"), Err(Error::NotTls));
    assert_eq!(read(&[22, 2, 0]), Err(Error::NotTls));
    assert_eq!(read(&[22, 3, 9]), Err(Error::NotTls));
    assert_eq!(read(&[23, 3, 3, 0, 1, 0]), Err(Error::NotTls));
    assert_eq!(sniff(&[]), None);
    assert_eq!(sniff(&[22, 3]), None);
    assert_eq!(sniff(&[22, 3, 1]), Some(true));
    // A ServerHello, known at its first byte.
    assert_eq!(read(&[22, 3, 3, 0, 90, 2]), Err(Error::NotClientHello));
    // An empty record, or one longer than TLS allows.
    assert_eq!(read(&[22, 3, 1, 0, 0]), Err(Error::Malformed));
    assert_eq!(read(&[22, 3, 1, 0x40, 1]), Err(Error::Malformed));
    // A second record that is not a handshake's.
    let message = hello(&sni(b"x"));
    let mut input = records(&message[..10], 10);
    input.extend_from_slice(&[21, 3, 3, 0, 2, 2, 40]);
    assert_eq!(read(&input), Err(Error::NotTls));
}

#[test]
fn hostile_lengths_are_refused() {
    // A hello announcing more than the bound: refused once its head is in.
    let mut message = vec![CLIENT_HELLO, 0, 0x40, 1];
    message.extend_from_slice(&[0; 100]);
    assert_eq!(read(&records(&message, 200)), Err(Error::TooLong));
    // A bound's worth of one-byte records is refused too.
    let huge = records(&[CLIENT_HELLO, 0, 0x3f, 0xff].repeat(MAX_HELLO / 4), 1);
    assert_eq!(read(&huge), Err(Error::TooLong));
    // Each inner length one past its container.
    let good = hello(&[sni(b"a.example"), alpn(&[b"h2"])].concat());
    let cases: [(usize, &str); 3] = [
        (4 + 34, "session id"),
        (4 + 35, "cipher suites"),
        (4 + 35 + 4, "compression methods"),
    ];
    for (at, what) in cases {
        let mut bad = good.clone();
        bad[at + usize::from(what == "cipher suites")] += 0x60;
        assert_eq!(read(&records(&bad, 1000)), Err(Error::Malformed), "{what}");
    }
    let bad = |extensions: Vec<u8>| read(&records(&hello(&extensions), 1000));
    // An extension running past the list, a name past its list, an empty
    // protocol, two host names, an empty name, a repeated extension.
    let mut past = sni(b"a.example");
    past[3] += 1;
    assert_eq!(bad(past), Err(Error::Malformed));
    let mut name_past = sni(b"a.example");
    name_past[8] += 1;
    assert_eq!(bad(name_past), Err(Error::Malformed));
    assert_eq!(bad(alpn(&[b"h2", b""])), Err(Error::Malformed));
    let entries = [0, 0, 1, b'a', 0, 0, 1, b'b'];
    let two = extension(SERVER_NAME, &[&[0, 8][..], &entries].concat());
    assert_eq!(bad(two), Err(Error::Malformed));
    assert_eq!(bad(sni(b"")), Err(Error::Malformed));
    assert_eq!(bad(sni(b"a b")), Err(Error::Malformed));
    assert_eq!(
        bad([alpn(&[b"h2"]), alpn(&[b"h2"])].concat()),
        Err(Error::Malformed)
    );
}

/// Arbitrary damage to real hellos never panics; a hello read whole reads
/// the same with bytes after it.
#[test]
fn damaged_hellos_are_answered_without_panic() {
    use rand::RngExt;
    let mut rng = rand::rng();
    for _ in 0..crate::rounds(5_000) {
        let mut input = [OPENSSL, CURL, PYTHON][rng.random_range(0..3)].to_vec();
        for _ in 0..rng.random_range(1..6) {
            let at = rng.random_range(0..input.len());
            input[at] = rng.random();
        }
        input.truncate(rng.random_range(0..=input.len()));
        if let Ok(Read::Complete(hello)) = read(&input) {
            let mut more = input.clone();
            more.extend_from_slice(&[23, 3, 3, 0, 0]);
            assert_eq!(read(&more), Ok(Read::Complete(hello)));
        }
    }
}
