//! Centrifugo's own JS SDK (npm `centrifuge` 5.8.0 on `ws`, installed into
//! tests/centrifuge/node_modules by tests/centrifuge/setup_sdk.sh on first
//! use) against the centrifugo_compat example, in both formats, on both
//! backends: connect and subscribe in one frame, publications with their
//! offsets, a recovery after a disconnect (the missed publications, in
//! order, in the subscribe reply), pings answered over three intervals,
//! and a failed recovery that goes on live (tests/centrifuge/sdk_client.mjs);
//! with the publications sent through the server HTTP API, its answers and
//! its history too. Connection tokens (tests/centrifuge/sdk_tokens.mjs):
//! refreshed before they expire, an expired one answered so that the SDK
//! asks for another, a forged one and none at all refused with 3500, one
//! never refreshed closed with 3005; a subscription token for its channel
//! taken, one for another channel refused with 3500.

mod common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

fn run_sdk(url: &str, format: &str, api_key: Option<&str>) -> Value {
    let mut args = vec![url, format, "1"];
    args.extend(api_key);
    run_node("sdk_client.mjs", &args)
}

/// Runs `script` (in tests/centrifuge) with `args`; its JSON answer.
fn run_node(script: &str, args: &[&str]) -> Value {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/centrifuge");
    let setup = Command::new("bash")
        .arg(format!("{dir}/setup_sdk.sh"))
        .output()
        .expect("bash runs");
    assert!(
        setup.status.success(),
        "setup_sdk.sh: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let out = Command::new("node")
        .current_dir(dir)
        .arg(script)
        .args(args)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn the_sdk_connects_subscribes_recovers_and_pongs(backend: &str, format: &str, api: bool) {
    let mut args = vec!["--backend", backend, "--history", "10", "--ping-secs", "1"];
    if api {
        args.extend(["--api-key", "sekret"]);
    } else {
        args.push("--client-publish");
    }
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let url = format!("ws://{addr}/connection/websocket");
    let format = format.to_owned();
    let key = api.then_some("sekret");
    let seen = tokio::task::spawn_blocking(move || run_sdk(&url, &format, key))
        .await
        .unwrap();

    let subscribed = |was: bool, recovered: bool, offset: u64| {
        json!({"wasRecovering": was, "recovered": recovered, "recoverable": true,
               "positioned": true, "offset": offset, "epochSet": true})
    };
    // First a fresh subscribe; then a recovery from offset 3 (the reply
    // names the client's own position, the publications move it on); then
    // one from past what history keeps: not recovered, at the top.
    assert_eq!(
        seen["subscribed"],
        json!([
            subscribed(false, false, 0),
            subscribed(true, true, 3),
            subscribed(true, false, 20)
        ]),
        "{seen}"
    );
    let publications: Vec<Value> = (1..=7)
        .chain([21])
        .map(|n| json!({"data": {"n": n}, "offset": n}))
        .collect();
    assert_eq!(seen["publications"], json!(publications), "{seen}");
    // Only the disconnects the client asked for: no 3012 (no pong), no
    // 3501 (bad request).
    let states = seen["states"].as_array().unwrap();
    for state in states {
        assert!(state[1] == json!(0) || state[0] == "connected", "{seen}");
    }
    assert_eq!(
        states.iter().filter(|s| s[0] == "connected").count(),
        3,
        "{seen}"
    );
    assert_eq!(seen["finalState"], "connected", "{seen}");
    assert_eq!(seen["errors"], json!([]), "{seen}");
    if api {
        // Each publish answered with its position, one epoch throughout;
        // the history holds the last ten; a wrong key is refused.
        let answers = seen["apiAnswers"].as_array().unwrap();
        let epoch = &answers[0]["result"]["epoch"];
        assert!(epoch.as_str().is_some_and(|e| !e.is_empty()), "{seen}");
        let expected: Vec<Value> = (1..=21)
            .map(|n| json!({"result": {"offset": n, "epoch": epoch}}))
            .collect();
        assert_eq!(answers, &expected, "{seen}");
        let kept: Vec<Value> = (12..=21)
            .map(|n| json!({"data": {"n": n}, "offset": n}))
            .collect();
        assert_eq!(
            seen["history"],
            json!({"result": {"publications": kept, "epoch": epoch, "offset": 21}})
        );
        assert_eq!(seen["wrongKey"], 401);
    }
}

#[tokio::test]
async fn json_on_tokio() {
    the_sdk_connects_subscribes_recovers_and_pongs("tokio", "json", false).await;
}

#[tokio::test]
async fn json_through_the_http_api_on_tokio() {
    the_sdk_connects_subscribes_recovers_and_pongs("tokio", "json", true).await;
}

#[tokio::test]
async fn protobuf_on_tokio() {
    the_sdk_connects_subscribes_recovers_and_pongs("tokio", "protobuf", false).await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn json_on_uring() {
    the_sdk_connects_subscribes_recovers_and_pongs("uring", "json", false).await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn protobuf_on_uring() {
    the_sdk_connects_subscribes_recovers_and_pongs("uring", "protobuf", false).await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn protobuf_through_the_http_api_on_uring() {
    the_sdk_connects_subscribes_recovers_and_pongs("uring", "protobuf", true).await;
}

async fn tokens(backend: &str, format: &str) {
    let args = [
        "--backend",
        backend,
        "--ping-secs",
        "1",
        "--jwt-secret",
        "s3cr3t",
        "--expired-grace-secs",
        "1",
    ];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let url = format!("ws://{addr}/connection/websocket");
    let format = format.to_owned();
    let seen = tokio::task::spawn_blocking(move || {
        run_node("sdk_tokens.mjs", &[url.as_str(), format.as_str(), "s3cr3t"])
    })
    .await
    .unwrap();
    // Refreshed twice in 5.5 s (2 s tokens, closed 1 s past expiry
    // otherwise), never dropped.
    let connected = json!(["connecting 0", "connected", "disconnected 0"]);
    assert_eq!(seen["refreshed"]["states"], connected, "{seen}");
    assert!(seen["refreshed"]["tokens"].as_u64().unwrap() >= 2, "{seen}");
    assert_eq!(seen["expired"]["states"], connected, "{seen}");
    assert_eq!(seen["expired"]["tokens"], 1, "{seen}");
    for refused in ["forged", "anonymous"] {
        assert_eq!(
            seen[refused]["states"],
            json!(["connecting 0", "disconnected 3500"]),
            "{seen}"
        );
    }
    let unrefreshed = &seen["unrefreshed"];
    assert_eq!(unrefreshed["replies"][0]["expires"], true, "{seen}");
    assert!(
        unrefreshed["replies"][0]["ttl"].as_u64().unwrap() <= 1,
        "{seen}"
    );
    assert_eq!(
        unrefreshed["close"],
        json!([3005, "connection expired"]),
        "{seen}"
    );
}

#[tokio::test]
async fn tokens_json_on_tokio() {
    tokens("tokio", "json").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test]
async fn tokens_protobuf_on_uring() {
    tokens("uring", "protobuf").await;
}
