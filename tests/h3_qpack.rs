//! QPACK interop with an independent implementation: aioquic's (pylsqpack,
//! on the ls-qpack C library), both ways. Random field sections, static
//! table names and values among them, every byte value in values; the
//! peer's encoder chooses Huffman code where it is shorter, so our
//! Huffman decoder meets another encoder's output.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use rand::RngExt;
use rapidws_core::h3::qpack;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn random_fields(rng: &mut impl rand::Rng) -> Fields {
    let names: [&[u8]; 8] = [
        b":method",
        b":path",
        b":authority",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"origin",
        b"user-agent",
        b"content-type",
    ];
    // At least one field: ls-qpack refuses an empty section (every HTTP
    // message has pseudo-fields).
    (0..rng.random_range(1..16))
        .map(|_| {
            let name = if rng.random_bool(0.5) {
                names[rng.random_range(0..names.len())].to_vec()
            } else {
                (0..rng.random_range(1..30))
                    .map(|_| rng.random_range(b'a'..=b'z'))
                    .collect()
            };
            let value = match rng.random_range(0..3) {
                0 => b"CONNECT".to_vec(),
                // Text: Huffman code is shorter.
                1 => (0..rng.random_range(0..100))
                    .map(|_| rng.random_range(b' '..=b'~'))
                    .collect(),
                // Any bytes but those a field value may not hold.
                _ => (0..rng.random_range(0..100))
                    .map(|_| rng.random_range(0x0e..=0xff))
                    .collect(),
            };
            (name, value)
        })
        .collect()
}

fn fields_of(answer: &serde_json::Value) -> Fields {
    answer["fields"]
        .as_array()
        .unwrap_or_else(|| panic!("no fields: {answer}"))
        .iter()
        .map(|pair| {
            (
                unhex(pair[0].as_str().unwrap()),
                unhex(pair[1].as_str().unwrap()),
            )
        })
        .collect()
}

#[test]
fn qpack_field_sections_interoperate_with_pylsqpack_both_ways() {
    let mut peer = Command::new(common::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/qpack_peer.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut to_peer = peer.stdin.take().unwrap();
    let mut from_peer = BufReader::new(peer.stdout.take().unwrap());
    let mut ask = |request: serde_json::Value| -> serde_json::Value {
        writeln!(to_peer, "{request}").unwrap();
        let mut line = String::new();
        from_peer.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let mut rng = rand::rng();
    let mut huffman_seen = 0;
    for round in 0..300 {
        let fields = random_fields(&mut rng);
        let as_hex: Vec<[String; 2]> = fields.iter().map(|(n, v)| [hex(n), hex(v)]).collect();

        // Theirs to ours.
        let answer = ask(serde_json::json!({ "encode": as_hex }));
        let block = unhex(answer["block"].as_str().unwrap());
        // A string literal with the H bit: 001H (name) or, after 01NT, 1
        // (value); counted loosely, to know Huffman strings were met.
        huffman_seen += usize::from(
            block
                .windows(2)
                .any(|w| w[0] & 0xf0 == 0x50 && w[1] & 0x80 != 0),
        );
        let section = qpack::decode(&block, 1 << 20)
            .unwrap_or_else(|e| panic!("round {round}: {e} decoding {}", hex(&block)));
        let got: Fields = section
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(got, fields, "round {round}: pylsqpack's {}", hex(&block));

        // Ours to theirs.
        let mut block = Vec::new();
        qpack::encode(fields.iter().map(|(n, v)| (&n[..], &v[..])), &mut block);
        let answer = ask(serde_json::json!({ "decode": hex(&block) }));
        assert!(
            answer.get("fields").is_some(),
            "round {round}: ours {} for {fields:?}: {answer}",
            hex(&block)
        );
        assert_eq!(
            fields_of(&answer),
            fields,
            "round {round}: ours {}",
            hex(&block)
        );
    }
    assert!(
        huffman_seen > 10,
        "pylsqpack sent Huffman strings in {huffman_seen} rounds"
    );
    drop(to_peer);
    let _ = peer.wait();
}
