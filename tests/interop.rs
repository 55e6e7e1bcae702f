//! permessage-deflate against an independent implementation: the Python
//! `websockets` client (installed into tests/interop/.venv by
//! tests/interop/setup.sh on first use), on both backends.
//!
//! On the TLS backend the client connects with wss, an ssl context trusting
//! the test's certificate.
//!
//! The client (tests/interop/deflate_client.py) sends text and binary
//! messages from empty to 1 MiB, checks every echo, and reports what was
//! negotiated and how each echo arrived (RSV1, bytes on the wire). A second
//! one (tests/interop/push_client.py) reads compressed pushes slowly while
//! its requests' replies jump the server's queue, and checks every push
//! and reply. A third (tests/interop/last_word.py) sends one message and
//! closes at once, twenty times, against the async socket.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use rapidws::Config;
use rapidws_core::proto::deflate::DeflateConfig;
use serde_json::Value;

backend_tests!(
    the_default_offer_compresses_both_ways_without_context,
    context_takeover_when_the_server_keeps_it,
    small_windows_as_the_client_asks,
    window_8_is_declined_and_the_next_offer_taken,
    no_compression_unless_configured_and_allowed,
    replies_overtake_compressed_pushes_with_context_takeover_uncompressed,
    replies_are_compressed_when_each_message_stands_alone,
    a_python_client_that_says_its_last_word_and_leaves_gets_the_echo,
);

/// Runs the client against `path` on `server` with `offers` (see the
/// script) and returns its report; fails the test if an echo differed. A
/// wss server is reached directly, with an ssl context that trusts the
/// test's certificate.
async fn run_client(server: &TestServer, path: &str, offers: &[&str]) -> Value {
    run_script(server, "deflate_client.py", path, offers).await
}

/// Runs `script` (in tests/interop) against `path` on `server` with
/// `offers`, as [`run_client`] does.
async fn run_script(server: &TestServer, script: &str, path: &str, offers: &[&str]) -> Value {
    run_script_with(server, script, path, offers, async {}).await
}

/// [`run_script`], with a line written to the script's stdin once `go`
/// resolves.
async fn run_script_with(
    server: &TestServer,
    script: &str,
    path: &str,
    offers: &[&str],
    go: impl std::future::Future<Output = ()>,
) -> Value {
    let script = format!("{}/tests/interop/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(python());
    match server.tls_addr {
        #[cfg(feature = "rustls")]
        Some(addr) => {
            let url = format!("wss://localhost:{}{path}", addr.port());
            let ca = &tls::identity().cert_pem;
            command.arg(script).arg(url).arg("--cafile").arg(ca);
        }
        _ => {
            command.arg(script).arg(server.url(path));
        }
    }
    for offer in offers {
        command.arg("--offer").arg(offer);
    }
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("python runs");
    let mut stdin = child.stdin.take().unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    go.await;
    // The script may have ended already (a failure it reports below).
    let _ = std::io::Write::write_all(&mut stdin, b"go\n");
    drop(stdin);
    let out = out.await.unwrap();
    assert!(
        out.status.success(),
        "interop client failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

/// `push_client.py`, told to read once the server's push task has stopped
/// for room (its count of pushes still for 300 ms): the queue is full.
async fn run_push_client(server: &TestServer) -> Value {
    let pushed = || {
        server
            .recorder
            .pushed
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let queue_full = async {
        let mut last = usize::MAX;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = pushed();
            if now > 0 && now == last {
                return;
            }
            last = now;
        }
    };
    // Bounded: a script that failed early is reported by `run_script_with`.
    let go = async {
        let _ = tokio::time::timeout(Duration::from_secs(30), queue_full).await;
    };
    let offers = ["client_max_window_bits"];
    run_script_with(server, "push_client.py", "/", &offers, go).await
}

fn deflate_on(deflate: DeflateConfig) -> Config {
    Config::default().permessage_deflate(deflate)
}

/// (compressed, bytes on the wire) for each echo, in the order sent:
/// quote, the same quote, 6000 binary bytes, "", 1800 bytes of Greek text,
/// 2048 bytes that compress badly, 1 MiB of "x", "short".
fn frames(report: &Value) -> Vec<(bool, u64)> {
    report["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["rsv1"].as_bool().unwrap(),
                f["wire_len"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn the_default_offer_compresses_both_ways_without_context(backend: Backend) {
    let server = start(backend, deflate_on(DeflateConfig::default())).await;
    // websockets' default offer: `permessage-deflate; client_max_window_bits`.
    let report = run_client(&server, "/", &["client_max_window_bits"]).await;
    assert_eq!(
        report["response"],
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    let frames = frames(&report);
    assert_eq!(frames.len(), 8);
    // Everything of 64 bytes or more arrives compressed; "" and "short" not.
    let compressed: Vec<bool> = frames.iter().map(|f| f.0).collect();
    assert_eq!(
        compressed,
        [true, true, true, false, true, true, true, false]
    );
    assert_eq!(
        frames[0], frames[1],
        "no context: the same message, the same bytes"
    );
    assert!(
        frames[6].1 < (1 << 20) / 50,
        "1 MiB of x: {} bytes",
        frames[6].1
    );
}

async fn context_takeover_when_the_server_keeps_it(backend: Backend) {
    let keep = DeflateConfig::default()
        .server_context_takeover(true)
        .client_context_takeover(true);
    let server = start(backend, deflate_on(keep)).await;
    let report = run_client(&server, "/", &["client_max_window_bits"]).await;
    assert_eq!(report["response"], "permessage-deflate");
    assert_eq!(report["negotiated"]["client_no_context_takeover"], false);
    let frames = frames(&report);
    assert!(
        frames[1].1 * 4 < frames[0].1,
        "the repeated message refers back: {frames:?}"
    );
    // The client may still forbid the server's context.
    let report = run_client(&server, "/", &["server_no_context_takeover"]).await;
    assert_eq!(
        report["response"],
        "permessage-deflate; server_no_context_takeover"
    );
    let frames = self::frames(&report);
    assert_eq!(frames[0], frames[1]);
}

async fn small_windows_as_the_client_asks(backend: Backend) {
    let server = start(backend, deflate_on(DeflateConfig::default())).await;
    let report = run_client(
        &server,
        "/",
        &["server_max_window_bits=9,client_max_window_bits=9"],
    )
    .await;
    assert_eq!(
        report["response"],
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
         server_max_window_bits=9"
    );
    assert_eq!(report["negotiated"]["server_max_window_bits"], 9);
    assert!(frames(&report)[6].0, "compressed with a 512-byte window");

    // A server configured for a smaller window than offered uses its own.
    let server = start(
        backend,
        deflate_on(DeflateConfig::default().server_max_window_bits(11)),
    )
    .await;
    let report = run_client(&server, "/", &["server_max_window_bits=13"]).await;
    assert_eq!(report["negotiated"]["server_max_window_bits"], 11);
}

async fn window_8_is_declined_and_the_next_offer_taken(backend: Backend) {
    let server = start(backend, deflate_on(DeflateConfig::default())).await;
    let report = run_client(
        &server,
        "/",
        &["server_max_window_bits=8", "server_max_window_bits=10"],
    )
    .await;
    assert_eq!(report["negotiated"]["server_max_window_bits"], 10);
    // Offered alone, it leaves the connection uncompressed, and working.
    let report = run_client(&server, "/", &["server_max_window_bits=8"]).await;
    assert_eq!(report["response"], Value::Null);
    assert_eq!(report["frames"].as_array().unwrap().len(), 0);
}

async fn no_compression_unless_configured_and_allowed(backend: Backend) {
    let server = start(backend, Config::default()).await;
    let report = run_client(&server, "/", &["client_max_window_bits"]).await;
    assert_eq!(report["response"], Value::Null, "off by default");
    let server = start(backend, deflate_on(DeflateConfig::default())).await;
    let report = run_client(&server, "/no-deflate", &["client_max_window_bits"]).await;
    assert_eq!(
        report["response"],
        Value::Null,
        "refused by the upgrade hook"
    );
}

/// With context takeover, each compressed push depends on the ones before:
/// a reply that overtakes them goes uncompressed, and the independent
/// decoder reads every push, in order, exactly.
async fn replies_overtake_compressed_pushes_with_context_takeover_uncompressed(backend: Backend) {
    let keep = DeflateConfig::default().server_context_takeover(true);
    let config = deflate_on(keep).max_outbound_bytes(256 * 1024);
    let server = start(backend, config).await;
    let report = run_push_client(&server).await;
    let response = report["response"].as_str().unwrap();
    assert!(
        !response.contains("server_no_context_takeover"),
        "{response}"
    );
    assert_eq!(
        (report["pushes"].as_u64(), report["replies"].as_u64()),
        (Some(400), Some(40))
    );
    assert_eq!(report["pushes_compressed"], true);
    let replies = report["replies_compressed"].as_array().unwrap();
    assert!(replies.iter().all(|r| r == false), "{replies:?}");
    assert!(report["overtook"].as_u64().unwrap() > 0, "{report}");
}

/// Without context takeover every message stands alone: replies are
/// compressed too, and still overtake.
async fn replies_are_compressed_when_each_message_stands_alone(backend: Backend) {
    let config = deflate_on(DeflateConfig::default()).max_outbound_bytes(256 * 1024);
    let server = start(backend, config).await;
    let report = run_push_client(&server).await;
    assert!(
        report["response"]
            .as_str()
            .unwrap()
            .contains("server_no_context_takeover")
    );
    assert_eq!(
        (report["pushes"].as_u64(), report["replies"].as_u64()),
        (Some(400), Some(40))
    );
    assert_eq!(report["pushes_compressed"], true);
    let replies = report["replies_compressed"].as_array().unwrap();
    assert!(replies.iter().all(|r| r == true), "{replies:?}");
    assert!(report["overtook"].as_u64().unwrap() > 0, "{report}");
}

/// Python `websockets` sends a message and closes at once, twenty times;
/// the async socket's task answers a millisecond after taking the
/// message, once the close is in: every echo arrives before the close's
/// reply (1000).
async fn a_python_client_that_says_its_last_word_and_leaves_gets_the_echo(backend: Backend) {
    let handler = rapidws::socket::SocketHandler::new(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if socket.send(message).await.is_err() {
                break;
            }
        }
    });
    let server = common::serve(backend, handler, Config::default(), Default::default()).await;
    let report = run_script(&server, "last_word.py", "/", &[]).await;
    assert_eq!(report["answered"], 20, "{report}");
    assert_eq!(
        report["codes"],
        serde_json::json!(vec![1000; 20]),
        "{report}"
    );
}
