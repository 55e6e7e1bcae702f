//! The examples as a new user meets them: bad flags are refused at start
//! with a message that names the cause and the fix, each example listens on
//! ports of its own (every example in `examples/`, read from its `--help`
//! and its top comment), `--addr` takes a host name, logs carry no colour
//! codes when they go to a file, and
//! `autobahn_client` pointed at an ordinary server says what it needs and
//! exits instead of waiting, and the client prints what arrives after its
//! close.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs an example that must refuse its arguments; returns its stderr.
fn refused(name: &str, args: &[&str]) -> String {
    let Output { status, stderr, .. } = Command::new(example(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    assert!(
        !status.success(),
        "{name} {args:?} started; stderr: {stderr}"
    );
    stderr
}

#[test]
fn threads_zero_is_refused_with_what_to_give_instead() {
    for example in ["echo", "stream", "gateway", "notify_bus"] {
        let mut args = vec!["--threads", "0"];
        if example == "gateway" {
            args.extend(["--upstream", "ws://127.0.0.1:9/"]);
        }
        let stderr = refused(example, &args);
        assert!(stderr.contains("--threads"), "{example}: {stderr}");
        assert!(stderr.contains("at least 1"), "{example}: {stderr}");
        assert!(stderr.contains("one per CPU"), "{example}: {stderr}");
        assert!(!stderr.contains("panicked"), "{example}: {stderr}");
    }
}

#[test]
fn a_gateway_upstream_that_is_not_a_websocket_url_is_refused_at_start() {
    let stderr = refused("gateway", &["--upstream", "http://127.0.0.1:9001/"]);
    assert!(stderr.contains("--upstream"), "{stderr}");
    assert!(
        stderr.contains("http:// is not a WebSocket URL"),
        "{stderr}"
    );
    assert!(stderr.contains("ws:// or wss://"), "{stderr}");

    let stderr = refused("gateway", &["--upstream", "127.0.0.1:9001"]);
    assert!(stderr.contains("no scheme"), "{stderr}");
    assert!(stderr.contains("ws://host/"), "{stderr}");
}

#[test]
fn a_bus_that_takes_no_message_is_refused() {
    let stderr = refused("notify_bus", &["--max-message-size", "0"]);
    assert!(stderr.contains("--max-message-size"), "{stderr}");
    assert!(stderr.contains("at least 1 byte"), "{stderr}");
}

/// The flags an example listens on.
const LISTEN_FLAGS: [&str; 4] = ["--addr", "--listen", "--ws-addr", "--tcp-addr"];

/// Every example in `examples/`: a file, or a folder with a `main.rs`.
fn all_examples() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut examples = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let (name, source) = if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, path)
        } else if path.join("main.rs").exists() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, path.join("main.rs"))
        } else {
            continue;
        };
        examples.push((name, std::fs::read_to_string(source).unwrap()));
    }
    examples.sort();
    examples
}

/// `args --help` of an example, and of each of its subcommands.
fn helps(example: &str, args: &[&str]) -> Vec<String> {
    let output = Command::new(common::example(example))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success(), "{example} {args:?} --help failed");
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut all = vec![help.clone()];
    if args.is_empty()
        && let Some(commands) = help.split("Commands:").nth(1)
    {
        let commands = commands.split("\n\n").next().unwrap_or("");
        for line in commands.lines() {
            match line.split_whitespace().next() {
                Some("help") | None => {}
                Some(command) => all.extend(helps(example, &[command])),
            }
        }
    }
    all
}

/// The port of `host:port`, if it ends in one.
fn port_of(addr: &str) -> Option<u16> {
    let addr = addr.trim_end_matches(|c: char| !c.is_ascii_digit());
    addr.rsplit_once(':')?.1.parse().ok()
}

/// The ports an example listens on by default (its `--help`) or in the
/// command lines of its top comment.
fn listening_ports(example: &str, source: &str) -> Vec<u16> {
    let mut ports = Vec::new();
    for help in helps(example, &[]) {
        // An option's line names it; its default follows, on that line
        // or below its description.
        let mut flag = None;
        for line in help.lines() {
            if line.trim_start().starts_with('-') {
                flag = line.split([' ', ',', '=']).find(|w| w.starts_with("--"));
            }
            let Some(default) = line.split("[default: ").nth(1) else {
                continue;
            };
            if flag.is_some_and(|flag| LISTEN_FLAGS.contains(&flag)) {
                ports.extend(default.split(']').next().and_then(port_of));
            }
        }
    }
    for line in source.lines().filter(|line| line.starts_with("//!")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if LISTEN_FLAGS.contains(&pair[0]) {
                ports.extend(port_of(pair[1]));
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Every example listens on ports of its own, by default and in the
/// commands its top comment gives, so any two run side by side without
/// flags (the gateway in front of echo, h2_bridge in front of axum_echo).
#[test]
fn each_example_has_its_own_default_ports() {
    let mut owners: Vec<(u16, String)> = Vec::new();
    let mut servers = 0;
    for (example, source) in all_examples() {
        let ports = listening_ports(&example, &source);
        servers += usize::from(!ports.is_empty());
        for port in ports {
            if let Some((_, other)) = owners.iter().find(|(p, _)| *p == port) {
                panic!("{example} and {other} both listen on port {port} by default");
            }
            owners.push((port, example.clone()));
        }
    }
    // echo, axum_echo, gateway, notify_bus, stream, mux_echo, mux_tunnel,
    // h2_bridge, h3_echo, h3_bridge: the test reads them all.
    assert!(
        servers >= 10,
        "only {servers} server examples found: {owners:?}"
    );
}

/// `--handoff-socket` and `--take-over` work on either backend, and their
/// help says so (it once said tokio only).
#[test]
fn the_handoff_flags_are_for_either_backend() {
    let help = helps("echo", &[]).remove(0);
    for flag in ["--handoff-socket", "--take-over"] {
        // From the option's own line to the next option's.
        let line = format!("\n      {flag} ");
        let at = help
            .find(&line)
            .unwrap_or_else(|| panic!("no {flag}: {help}"));
        let text = &help[at + 1..];
        let text = &text[..text.find("\n      -").unwrap_or(text.len())];
        assert!(text.contains("either backend"), "{flag}: {text}");
        assert!(!text.contains("--backend tokio"), "{flag}: {text}");
    }
}

/// `--addr` takes a name as well as an IP address, on the examples of the
/// shared options (echo) and on those with their own (axum_echo).
#[tokio::test]
async fn an_address_by_name_is_resolved() {
    for example_name in ["echo", "axum_echo"] {
        let port = free_port();
        let _server = Child(
            Command::new(example(example_name))
                .args(["--addr", &format!("localhost:{port}")])
                .spawn()
                .unwrap(),
        );
        let what = format!("{example_name} --addr localhost:{port}");
        wait_listening(&what, ([127, 0, 0, 1], port).into()).await;
    }
    for (addr, why) in [
        ("localhost", "no port"),
        ("localhost:http", "a port is 0 to 65535"),
    ] {
        let stderr = refused("echo", &["--addr", addr]);
        assert!(stderr.contains(why), "{addr}: {stderr}");
        assert!(stderr.contains("localhost:9001"), "{addr}: {stderr}");
    }
}

/// Logs written to a pipe (a file, a journal) are plain text.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::BufRead;
    let mut child = Command::new(example("echo"))
        .args(["--addr", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Killed when the test ends, however it ends.
    let child = Child(child);
    let (lines, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let line = got
        .recv_timeout(Duration::from_secs(10))
        .expect("echo logged nothing to stderr within 10 s");
    drop(child);
    assert!(line.contains("INFO"), "not a log line: {line:?}");
    assert!(line.contains("listening"), "{line:?}");
    assert!(!line.contains('\u{1b}'), "colour codes in: {line:?}");
}

/// Pointed at an echo server, which answers `/getCaseCount` with nothing,
/// the Autobahn client says it needs the fuzzing server, and exits.
#[tokio::test]
async fn autobahn_client_against_an_ordinary_server_says_what_it_needs() {
    let (_echo, addr) = start_example("echo", &[]).await;
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(common::example("autobahn_client"))
            .args(["--url", &format!("ws://{addr}")])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("getCaseCount"), "{stderr}");
    assert!(stderr.contains("fuzzing server"), "{stderr}");
    assert!(stderr.contains("wstest -m fuzzingserver"), "{stderr}");
    // Its own bound (10 s), not the test's.
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// A certificate and key given the other way round are named as swapped,
/// not reported as "no items found".
#[cfg(feature = "rustls")]
#[test]
fn swapped_certificate_and_key_are_named_as_swapped() {
    let identity = common::tls::identity();
    let stderr = refused(
        "echo",
        &[
            "--addr",
            "127.0.0.1:0",
            "--tls-cert",
            identity.key_pem.to_str().unwrap(),
            "--tls-key",
            identity.cert_pem.to_str().unwrap(),
        ],
    );
    assert!(stderr.contains("are swapped"), "{stderr}");
    assert!(
        stderr.contains("give the certificate chain to --tls-cert"),
        "{stderr}"
    );
}

/// A self-signed certificate as `openssl req -x509` makes it (CA:TRUE),
/// written to a fresh directory: (directory, certificate, key).
fn ca_flagged_self_signed(tag: &str) -> (std::path::PathBuf, String, String) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir = std::env::temp_dir().join(format!("rapidws-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let path = |p: std::path::PathBuf| p.to_str().unwrap().to_owned();
    (dir, path(cert_path), path(key_path))
}

/// `client --cafile` trusts a self-signed certificate given exactly, even
/// one marked CA:TRUE (which webpki alone refuses as "CaUsedAsEndEntity"),
/// as browsers and Python do.
#[tokio::test]
async fn client_cafile_trusts_a_ca_flagged_self_signed_certificate() {
    let (dir, cert, key) = ca_flagged_self_signed("cafile");
    let (_echo, addr) = start_example("echo", &["--tls-cert", &cert, "--tls-key", &key]).await;
    let url = format!("wss://localhost:{}/", addr.port());
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(example("client"))
            .args([url.as_str(), "--cafile", cert.as_str()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"hello over tls\n").unwrap();
        // The echo comes back before the client closes at the end of input.
        std::thread::sleep(Duration::from_millis(500));
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("hello over tls"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("CaUsedAsEndEntity"), "{stderr}");
}

/// `printf 'hello\nworld\n' | client ws://...` against the echo example:
/// the client closes at the end of its input, right after sending both
/// lines, so the echoes arrive after its close frame left; they are the
/// server's answers to what it sent, and are printed.
#[tokio::test]
async fn the_client_prints_echoes_that_arrive_after_its_close() {
    let (_echo, addr) = start_example("echo", &[]).await;
    let url = format!("ws://{addr}/");
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(example("client"))
            .arg(url.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // All the input at once, then its end: no waiting for the echoes.
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"hello\nworld\n")
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["hello", "world"], "stderr: {stderr}");
}

/// The gateway's `--upstream-cafile` does the same for a wss upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_upstream_cafile_trusts_the_upstreams_certificate() {
    use futures_util::{SinkExt, StreamExt};
    let (dir, cert, key) = ca_flagged_self_signed("upstream");
    let (_echo, upstream) = start_example("echo", &["--tls-cert", &cert, "--tls-key", &key]).await;
    let upstream = format!("wss://localhost:{}/", upstream.port());
    let (_gateway, addr) = start_example(
        "gateway",
        &["--upstream", &upstream, "--upstream-cafile", &cert],
    )
    .await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::text("through"))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("no answer through the gateway")
        .unwrap()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(answer.into_text().unwrap().as_str(), "through");
}

/// A page of another origin is refused (403) unless `--allow-origin` names
/// it (or says `*`); a value that is no origin is refused at start.
#[tokio::test]
async fn allow_origin_lets_a_named_page_in() {
    let foreign = "Sec-WebSocket-Version: 13\r\nOrigin: https://app.example\r\n";
    for (example, args) in [
        ("echo", &[][..]),
        ("echo", &["--allow-origin", "https://app.example"][..]),
        ("echo", &["--allow-origin", "*"][..]),
        ("axum_echo", &[][..]),
        ("axum_echo", &["--allow-origin", "https://APP.example"][..]),
    ] {
        let (_child, addr) = start_example(example, args).await;
        let path = if example == "axum_echo" { "/ws" } else { "/" };
        let answer = http_exchange(addr, &upgrade_head("GET", path, "HTTP/1.1", foreign)).await;
        let status = answer.split(' ').nth(1).unwrap_or_default().to_owned();
        let expected = if args.is_empty() { "403" } else { "101" };
        assert_eq!(status, expected, "{example} {args:?}: {answer}");
    }
    let stderr = refused("echo", &["--allow-origin", "app.example"]);
    assert!(stderr.contains("scheme://host[:port]"), "{stderr}");
}
