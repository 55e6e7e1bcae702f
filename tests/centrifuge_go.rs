//! Centrifugo's own Go SDK (`github.com/centrifugal/centrifuge-go`
//! v0.12.1, from the Go module proxy, pinned by tests/centrifuge/go/go.sum)
//! against the centrifugo_compat example, in JSON and in Protobuf. The SDK
//! runs in tests/centrifuge/go (`sdkpeer`, built once per test binary),
//! which prints what it saw as JSON:
//!
//! - publications sent through the server HTTP API, each with its offset;
//!   the channel's history and RPC (`echo` and an unknown method) through
//!   the SDK, on both backends;
//! - the SDK behind a proxy that cuts its connection 25 times or more
//!   (some of them between its connect and its resubscribe) while a
//!   numbered sequence of 600 or more is published: every publication
//!   arrives once and in order, and every resubscribe recovers;
//! - held away while more is published than the history keeps: the
//!   resubscribe says it did not recover, and live publications follow;
//! - connection tokens refreshed through the SDK's `GetToken` over a
//!   ping every second, presence and presence stats of two users (and one
//!   after the other leaves), an expired token replaced at connect, a
//!   forged one and none at all refused with 3500.
//!
//! With `SDKPEER_TRACE=1`, a failure shows the SDK's trace: every frame
//! it sent and got, and when the cuts came.
#![cfg(feature = "centrifuge")]

mod common;

use std::net::SocketAddr;

use common::cut_proxy::CutProxy;
use common::*;
use serde_json::{Value, json};

const KEY: &str = "sekret";

/// The second backend: io_uring where it is built, tokio otherwise.
#[cfg(all(target_os = "linux", feature = "uring"))]
const OTHER: &str = "uring";
#[cfg(not(all(target_os = "linux", feature = "uring")))]
const OTHER: &str = "tokio";

fn ws(addr: SocketAddr) -> String {
    format!("ws://{addr}/connection/websocket")
}

fn api(addr: SocketAddr) -> String {
    format!("http://{addr}/api/")
}

/// Runs sdkpeer's `scenario` against `url` in `format` with `args`; what
/// it printed.
async fn sdkpeer(scenario: &str, url: &str, format: &str, args: &[&str]) -> Value {
    let program = tokio::task::spawn_blocking(|| {
        go_build(
            "tests/centrifuge/go",
            ".",
            "sdkpeer",
            &["-mod=mod", "-buildvcs=false"],
        )
    })
    .await
    .unwrap();
    let out = tokio::process::Command::new(program)
        .args(["-scenario", scenario, "-url", url, "-format", format])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("sdkpeer runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // Why it stopped first, on a line of its own: a long report after
        // it may be cut short where the failure is shown.
        let report: Option<Value> = serde_json::from_str(&stdout).ok();
        let why = report.as_ref().and_then(|r| r["failure"].as_str());
        panic!(
            "sdkpeer {scenario} {format} failed: {}\n{stdout}{}",
            why.unwrap_or("(no report)"),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `{"n":n}` at offset `n`, as the SDK reports a publication.
fn numbered(n: u64) -> Value {
    json!({"data": format!("{{\"n\":{n}}}"), "offset": n})
}

fn subscribed(was: bool, recovered: bool, offset: u64, epoch: &Value) -> Value {
    json!({"wasRecovering": was, "recovered": recovered, "recoverable": true,
           "positioned": true, "offset": offset, "epoch": epoch})
}

async fn basic(backend: &str, format: &str) {
    let args = ["--backend", backend, "--history", "10", "--api-key", KEY];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let api = api(addr);
    let args = ["-api", api.as_str(), "-key", KEY, "-count", "20"];
    let seen = sdkpeer("basic", &ws(addr), format, &args).await;
    let peer = &seen["peer"];

    // Each publish answered with its position, in one epoch, the one the
    // subscribe reply gave.
    let answers = seen["apiAnswers"].as_array().unwrap();
    let epoch = &answers[0]["epoch"];
    assert!(epoch.as_str().is_some_and(|e| e.len() == 16), "{seen}");
    let expected: Vec<Value> = (1..=20)
        .map(|n| json!({"offset": n, "epoch": epoch}))
        .collect();
    assert_eq!(answers, &expected, "{seen}");
    assert_eq!(
        peer["subscribed"],
        json!([subscribed(false, false, 0, epoch)]),
        "{seen}"
    );
    let publications: Vec<Value> = (1..=20).map(numbered).collect();
    assert_eq!(peer["publications"], json!(publications), "{seen}");
    // The SDK's history: the last ten.
    let kept: Vec<Value> = (11..=20).map(numbered).collect();
    assert_eq!(
        seen["history"],
        json!({"publications": kept, "offset": 20, "epoch": epoch}),
        "{seen}"
    );
    // RPC: echo gives back what was sent, byte for byte; another method
    // is not found.
    assert_eq!(seen["echo"], json!({"data": seen["sent"]}), "{seen}");
    assert_eq!(
        seen["unknown"],
        json!({"error": {"code": 104, "message": "method not found", "temporary": false}}),
        "{seen}"
    );
    assert_eq!(
        peer["states"].as_array().unwrap()[..2],
        [json!("connecting 0"), json!("connected")],
        "{seen}"
    );
    assert_eq!(peer["errors"], json!([]), "{seen}");
}

#[tokio::test]
async fn json_on_tokio() {
    basic("tokio", "json").await;
}

#[tokio::test]
async fn protobuf_on_tokio() {
    basic("tokio", "protobuf").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn json_on_uring() {
    basic("uring", "json").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn protobuf_on_uring() {
    basic("uring", "protobuf").await;
}

async fn cut_again_and_again(backend: &str, format: &str) {
    let args = ["--backend", backend, "--history", "1000", "--api-key", KEY];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let proxy = CutProxy::start(addr).await;
    let (api, control) = (api(addr), format!("http://{}", proxy.control));
    let args = [
        "-api",
        api.as_str(),
        "-key",
        KEY,
        "-control",
        control.as_str(),
        "-count",
        "600",
        "-cuts",
        "25",
    ];
    let seen = sdkpeer("cut", &ws(proxy.addr), format, &args).await;
    let peer = &seen["peer"];

    let published = seen["published"].as_u64().unwrap();
    assert!(published >= 600, "{seen}");
    let offsets: Vec<u64> = (1..=published).collect();
    assert_eq!(seen["apiOffsets"], json!(offsets), "{seen}");
    assert_eq!(seen["apiEpochs"].as_array().unwrap().len(), 1, "{seen}");
    // Every publication once, in order, each with its offset.
    let publications = peer["publications"].as_array().unwrap();
    let expected: Vec<Value> = (1..=published).map(numbered).collect();
    if publications != &expected {
        let first = publications
            .iter()
            .zip(&expected)
            .position(|(got, want)| got != want);
        panic!(
            "{} publications for {published}, the first difference at {first:?}: {seen}",
            publications.len()
        );
    }
    // The cuts took (each cut at least one connection: the SDK's), and
    // every resubscribe after one recovered.
    let cuts = seen["cuts"].as_array().unwrap();
    let landed = cuts.iter().filter(|n| n.as_u64() != Some(0)).count();
    assert!(landed >= 25, "{seen}");
    let cut_total: u64 = cuts.iter().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(cut_total, proxy.cut_so_far(), "{seen}");
    let subscribed = peer["subscribed"].as_array().unwrap();
    assert_eq!(subscribed[0]["wasRecovering"], false, "{seen}");
    let resubscribes = &subscribed[1..];
    assert!(resubscribes.len() >= 20, "{seen}");
    for again in resubscribes {
        assert_eq!(again["wasRecovering"], true, "{seen}");
        assert_eq!(again["recovered"], true, "{seen}");
    }
    // Published while it was away (between a cut and the resubscribe
    // after it): what the recoveries brought.
    let away: Vec<u64> = seen["away"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let missed: u64 = away.iter().sum();
    assert!(missed > 0, "{seen}");
    let states = peer["states"].as_array().unwrap();
    let connects = states.iter().filter(|s| *s == "connected").count();
    // Cut, never closed by the server: reconnecting, not disconnected.
    let disconnects = states
        .iter()
        .filter(|s| s.as_str().unwrap().starts_with("disconnected"));
    assert!(disconnects.count() <= 1, "{seen}");
    // A subscription's only errors: a subscribe cut short by a cut.
    let errors = peer["errors"].as_array().unwrap();
    let refused = errors.iter().map(|e| e.as_str().unwrap());
    let refused = refused.filter(|e| e.starts_with("sub:") && !e.ends_with("client disconnected"));
    assert_eq!(refused.count(), 0, "{seen}");
    eprintln!(
        "{format} on {backend}: {published} published and delivered once each, in order; \
         {landed} cuts ({cut_total} connections), {connects} connects, {} resubscribes, \
         all recovered; {missed} published while it was away (at most {} at once)",
        resubscribes.len(),
        away.iter().max().unwrap()
    );
}

#[tokio::test]
async fn json_recovers_after_every_cut_on_tokio() {
    cut_again_and_again("tokio", "json").await;
}

#[tokio::test]
async fn protobuf_recovers_after_every_cut() {
    cut_again_and_again(OTHER, "protobuf").await;
}

async fn history_exceeded(backend: &str, format: &str) {
    let args = ["--backend", backend, "--history", "5", "--api-key", KEY];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let proxy = CutProxy::start(addr).await;
    let (api, control) = (api(addr), format!("http://{}", proxy.control));
    let args = [
        "-api",
        api.as_str(),
        "-key",
        KEY,
        "-control",
        control.as_str(),
        "-count",
        "10",
    ];
    let seen = sdkpeer("gap", &ws(proxy.addr), format, &args).await;
    let peer = &seen["peer"];
    assert_eq!(seen["held"], 1, "{seen}");
    // Away while 4..13 were published, five kept: not recovered, at the
    // top (13); then 14..16 live.
    let epoch = &peer["subscribed"][0]["epoch"];
    assert_eq!(
        peer["subscribed"],
        json!([
            subscribed(false, false, 0, epoch),
            subscribed(true, false, 13, epoch)
        ]),
        "{seen}"
    );
    let publications: Vec<Value> = [1, 2, 3, 14, 15, 16].into_iter().map(numbered).collect();
    assert_eq!(peer["publications"], json!(publications), "{seen}");
}

#[tokio::test]
async fn json_history_exceeded_on_tokio() {
    history_exceeded("tokio", "json").await;
}

#[tokio::test]
async fn protobuf_history_exceeded() {
    history_exceeded(OTHER, "protobuf").await;
}

async fn tokens_and_presence(backend: &str, format: &str) {
    let args = [
        "--backend",
        backend,
        "--jwt-secret",
        "s3cr3t",
        "--presence",
        "--ping-secs",
        "1",
        "--expired-grace-secs",
        "2",
    ];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let seen = sdkpeer("tokens", &ws(addr), format, &["-secret", "s3cr3t"]).await;

    // Alice's 2 s tokens, refreshed through GetToken for 5 s: never
    // dropped (nor for a missed pong).
    let alice = &seen["alice"];
    assert_eq!(
        alice["states"],
        json!(["connecting 0", "connected"]),
        "{seen}"
    );
    assert_eq!(alice["final"], "connected", "{seen}");
    assert!(alice["tokens"].as_u64().unwrap() >= 2, "{seen}");
    assert_eq!(alice["errors"], json!([]), "{seen}");
    // Presence lists both clients with their users; once Bob has gone,
    // Alice alone.
    let (a, b) = (&alice["client"], &seen["bob"]["client"]);
    assert!(
        a.as_str().is_some_and(|a| !a.is_empty()) && a != b,
        "{seen}"
    );
    assert_eq!(
        seen["presence"],
        json!({"clients": [{"client": a, "user": "alice"}, {"client": b, "user": "bob"}],
               "stats": {"clients": 2, "users": 2}}),
        "{seen}"
    );
    assert_eq!(
        seen["presenceAfter"],
        json!({"clients": [{"client": a, "user": "alice"}], "stats": {"clients": 1, "users": 1}}),
        "{seen}"
    );
    // Expired at connect: answered with 109, the SDK asks for another.
    let expired = &seen["expired"];
    assert_eq!(expired["tokens"], 1, "{seen}");
    assert_eq!(
        expired["errors"],
        json!(["connect error: 109: token expired"]),
        "{seen}"
    );
    assert!(
        expired["states"]
            .as_array()
            .unwrap()
            .contains(&json!("connected")),
        "{seen}"
    );
    // Forged, or none: closed with 3500, and the SDK does not come back.
    for refused in ["forged", "anonymous"] {
        assert_eq!(
            seen[refused]["states"],
            json!(["connecting 0", "disconnected 3500 invalid token"]),
            "{seen}"
        );
    }
}

#[tokio::test]
async fn json_tokens_and_presence_on_tokio() {
    tokens_and_presence("tokio", "json").await;
}

#[tokio::test]
async fn protobuf_tokens_and_presence() {
    tokens_and_presence(OTHER, "protobuf").await;
}
