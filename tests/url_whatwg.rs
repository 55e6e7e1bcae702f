//! The client's URL parser against a browser's: Node's `URL` (the WHATWG URL
//! standard, as browsers implement it) parses the same inputs, and where
//! both accept one, host and port agree. rapidws may refuse what a browser
//! accepts (percent-escapes or non-ASCII in a host, an empty port: it says
//! why), but never connects somewhere else than a browser's reading of the
//! URL says, which an application that checks URLs with a browser's parser
//! (or with rapidws's own) relies on.

#![cfg(feature = "client")]

use std::io::Write;
use std::process::{Command, Stdio};

use rand::{RngExt, SeedableRng};
use rapidws::client::url::{Host, Url};

/// Node's reading of each input: `Some((host, port))`, `None` if invalid.
fn browser(inputs: &[String]) -> Vec<Option<(String, u16)>> {
    let script = r#"
const lines = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
const defaults = { "ws:": 80, "wss:": 443, "http:": 80, "https:": 443 };
for (const line of lines) {
  let answer = null;
  try {
    const url = new URL(JSON.parse(line));
    const port = url.port === "" ? defaults[url.protocol] : Number(url.port);
    answer = [url.hostname, port];
  } catch (e) {}
  console.log(JSON.stringify(answer));
}
"#;
    let mut node = Command::new("node")
        .args(["-e", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node runs (it is installed on the CI machine)");
    let mut stdin = node.stdin.take().unwrap();
    for input in inputs {
        writeln!(stdin, "{}", serde_json::to_string(input).unwrap()).unwrap();
    }
    drop(stdin);
    let output = node.wait_with_output().unwrap();
    assert!(output.status.success());
    let answers: Vec<Option<(String, u16)>> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), inputs.len());
    answers
}

/// rapidws's reading: host as the browser writes it, and port.
fn ours(input: &str) -> Result<(String, u16), &'static str> {
    let url = Url::parse(input).map_err(|e| e.reason())?;
    let default = if matches!(url.scheme.as_str(), "wss" | "https") {
        443
    } else {
        80
    };
    let host = match &url.host {
        Host::Name(name) => name.clone(),
        other => other.to_string(),
    };
    Ok((host, url.port_or(default)))
}

/// The cases, each of which a browser reads one way and a
/// naive parser another.
#[test]
fn the_steering_cases_read_as_a_browser_reads_them() {
    let inputs: Vec<String> = [
        "ws://127.0.0.2:1\\@127.0.0.1:41103/",
        "wss://good.example\\@evil.example/",
        "ws://2130706433/",
        "ws://0x7f.1/",
        "ws://0x7f.0.0.1:9001/",
        "ws://0177.0.0.1/",
        "ws://127.1/",
        "ws://017700000001/",
        "ws://1.2.3.4./",
        "ws://user:pass@127.0.0.1:8080/x",
        "ws://a@b@127.0.0.1/",
    ]
    .map(String::from)
    .to_vec();
    for (input, browser) in inputs.iter().zip(browser(&inputs)) {
        let browser = browser.unwrap_or_else(|| panic!("{input}: the browser refuses it"));
        assert_eq!(ours(input), Ok(browser), "{input}");
    }
}

/// Random URLs from the characters that matter to where a URL goes:
/// whenever both parsers accept one, they agree; whenever the browser
/// refuses one, so does rapidws.
#[test]
fn random_urls_agree_with_the_browser_or_are_refused() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    let pieces = [
        "ws://", "wss://", "1", "0", "7", "9", "255", "256", "0x", "0X", "7f", "f", "g", ".", "..",
        ":", ":80", ":443", ":65536", "@", "\\", "/", "?", "a", "ex", "-", "_", "[::1]", "[", "]",
        "%", "%41", "%+A", "x:y@", " ",
    ];
    let inputs: Vec<String> = (0..3000)
        .map(|_| {
            let mut url = if rng.random_bool(0.5) {
                "ws://"
            } else {
                "wss://"
            }
            .to_owned();
            for _ in 0..rng.random_range(1..9) {
                url.push_str(pieces[rng.random_range(0..pieces.len())]);
            }
            url
        })
        .collect();
    let (mut agreed, mut refused_by_us) = (0, 0);
    for (input, browser) in inputs.iter().zip(browser(&inputs)) {
        match (ours(input), browser) {
            (Ok(ours), Some(browser)) => {
                assert_eq!(ours, browser, "{input:?}");
                agreed += 1;
            }
            (Ok(ours), None) => panic!("{input:?}: the browser refuses it, rapidws reads {ours:?}"),
            (Err(_), Some(_)) => refused_by_us += 1,
            (Err(_), None) => {}
        }
    }
    // The comparison is not empty.
    assert!(agreed > 300, "agreed on {agreed}, refused {refused_by_us}");
}
