//! The examples as a new user meets them: bad flags are refused at start
//! with a message that names the cause and the fix, each example has its own
//! default port, logs carry no colour codes when they go to a file, and
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

/// `--help` of each server example shows its own default address.
#[test]
fn each_server_example_has_its_own_default_port() {
    let mut seen = Vec::new();
    for example in ["echo", "axum_echo", "gateway", "notify_bus", "stream"] {
        let output = Command::new(common::example(example))
            .arg("--help")
            .output()
            .unwrap();
        assert!(output.status.success(), "{example} --help failed");
        let help = String::from_utf8_lossy(&output.stdout).into_owned();
        let default = help
            .split("[default: ")
            .skip(1)
            .map(|rest| rest.split(']').next().unwrap())
            .find(|value| value.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("{example} --help shows no default address: {help}"))
            .to_owned();
        assert!(
            !seen.iter().any(|(_, other)| *other == default),
            "{example} defaults to {default} like another: {seen:?}"
        );
        seen.push((example, default));
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
