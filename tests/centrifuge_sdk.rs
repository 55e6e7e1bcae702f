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
//! taken, one for another channel refused with 3500; subscription tokens
//! of 2 s refreshed by the SDK (sub_refresh) with every publication
//! received, with its publisher's info, and one whose getToken fails
//! unsubscribed by the server (2501). Recovery across many
//! cuts (tests/centrifuge/sdk_cuts.mjs, through `CutProxy`): every
//! publication once and in order, every subscribe after a cut recovered;
//! and one away past the history, not recovered, going on live.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

fn run_sdk(url: &str, format: &str, api_key: Option<&str>) -> Value {
    let mut args = vec![url, format, "1"];
    args.extend(api_key);
    run_node("sdk_client.mjs", &args)
}

/// Runs `script` (in tests/centrifuge) with `args`; its JSON answer.
fn run_node(script: &str, args: &[&str]) -> Value {
    // Installed once for every test here: two installs at once into one
    // node_modules (a fresh checkout) break each other's node.
    let dir = centrifugo::sdk_dir();
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
        "--expired-sub-grace-secs",
        "1",
        "--client-publish",
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
    // Subscription tokens of 2 s: refreshed by the SDK itself, again and
    // again, and every publication received, each with its publisher.
    let refresh = &seen["subRefresh"];
    let ticking = &refresh["ticking"];
    assert!(ticking["tokens"].as_u64().unwrap() >= 3, "{refresh}");
    let published = refresh["published"].as_u64().unwrap();
    assert!(published >= 10, "{refresh}");
    let every: Vec<u64> = (1..=published).collect();
    assert_eq!(ticking["publications"], json!(every), "{refresh}");
    let events: Vec<&Value> = ticking["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| *e != "publication")
        .collect();
    // Subscribed once, until the client disconnects (1, transport closed).
    let once = json!(["subscribing 0", "subscribed", "subscribing 1"]);
    assert_eq!(json!(events), once, "{refresh}");
    let publisher = json!({
        "user": "frank",
        "client": true,
        "connInfo": {"name": "Frank"},
        "chanInfo": {"seat": "ticking"},
    });
    assert_eq!(ticking["info"], publisher, "{refresh}");
    // One whose getToken fails after its first: unsubscribed by the server
    // (2501) once its grace is up, and no publication after that.
    let cut = &refresh["cut"];
    let events: Vec<&str> = cut["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let expired = events.iter().position(|e| *e == "subscribing 2501");
    let expired = expired.unwrap_or_else(|| panic!("no 2501: {refresh}"));
    assert!(
        events[..expired].contains(&"error refreshToken"),
        "{refresh}"
    );
    assert!(!events[expired..].contains(&"publication"), "{refresh}");
    assert!(!events[expired..].contains(&"subscribed"), "{refresh}");
    assert!(
        cut["publications"].as_array().unwrap().len() >= 2,
        "{refresh}"
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

/// The SDK as a subscriber in a node process of its own
/// (tests/centrifuge/sdk_cuts.mjs), reporting what it sees one JSON object
/// a line, gathered here as the lines come.
struct Follower {
    lines: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<String>>,
    _node: Child,
}

impl Follower {
    /// Subscribes to `channel` at `url` in `format`, until a publication
    /// says it is the last; `dispatch` is `browser` (one message a task)
    /// or `node` (`ws`'s default).
    fn start(url: &str, channel: &str, dispatch: &str, format: &str) -> Follower {
        let mut node = Command::new("node")
            .current_dir(centrifugo::sdk_dir())
            .arg("sdk_cuts.mjs")
            .args([url, channel, dispatch, format])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node runs");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = node.stdout.take().unwrap();
        let gathered = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let value = serde_json::from_str(&line).unwrap_or(json!({ "not json": line }));
                gathered.lock().unwrap().push(value);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = node.stderr.take().unwrap();
        let written = stderr.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            written.lock().unwrap().push_str(&text);
        });
        Follower {
            lines,
            stderr,
            _node: Child(node),
        }
    }

    fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// The values of `key` in the lines that have one.
    fn all(&self, key: &str) -> Vec<Value> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|line| line.get(key).cloned())
            .collect()
    }

    fn count(&self, key: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|line| line.get(key).is_some()).count()
    }

    fn connects(&self) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|l| l["state"] == "connected").count()
    }

    /// The publications, as (n, offset).
    fn publications(&self) -> Vec<(u64, u64)> {
        self.all("pub")
            .iter()
            .map(|pair| (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap()))
            .collect()
    }

    /// Everything it said, for a failure's message: a run of publications
    /// numbered as their offsets, one after another, on one line.
    fn said(&self) -> String {
        let mut said = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        let end_run = |run: &mut Option<(u64, u64)>, said: &mut Vec<String>| {
            if let Some((first, last)) = run.take() {
                said.push(format!("publications {first}..={last}"));
            }
        };
        for line in self.lines() {
            if let Some(n) = line["pub"][0].as_u64()
                && line["pub"][1].as_u64() == Some(n)
            {
                match &mut run {
                    Some((_, last)) if *last + 1 == n => *last = n,
                    _ => {
                        end_run(&mut run, &mut said);
                        run = Some((n, n));
                    }
                }
                continue;
            }
            end_run(&mut run, &mut said);
            said.push(line.to_string());
        }
        end_run(&mut run, &mut said);
        said.push(format!("stderr: {}", self.stderr.lock().unwrap()));
        said.join("\n")
    }

    /// Waits until `done` holds (at most `within`).
    async fn wait(&self, what: &str, within: Duration, done: impl Fn(&Follower) -> bool) {
        if !eventually(within, || done(self)).await {
            panic!(
                "{what}: not within {within:?}; the SDK said:\n{}",
                self.said()
            );
        }
    }

    /// The SDK's own states were only those the cuts cause: each time it
    /// reconnected for its transport closing (code 1), never for a close
    /// from the server, and only its own disconnect at the end stopped it.
    fn assert_only_cuts(&self) {
        let said = self.said();
        let lines = self.lines();
        let disconnects: Vec<&Value> = lines
            .iter()
            .filter(|l| l["state"] == "disconnected")
            .collect();
        let asked = json!({"state": "disconnected", "code": 0, "reason": "disconnect called"});
        assert_eq!(disconnects, [&asked], "{said}");
        for line in &lines {
            if line["state"] == "connecting" && line["reason"] != "connect called" {
                assert_eq!(line["code"], 1, "{line}\n{said}");
            }
        }
    }
}

/// When a cut comes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Moment {
    /// Once the SDK has subscribed again since the last cut, within 40 ms
    /// of publications flowing live.
    Live,
    /// As soon as the SDK says it is connected again: its subscribe's
    /// reply, with the publications it recovers, may be on the wire.
    Reply,
    /// At any time within 40 ms: most often while the SDK reconnects, and
    /// then on the next connection the proxy takes, in its handshake.
    Any,
}

/// The SDK subscribes through a proxy that cuts every connection through
/// it 40 times at random moments (3 in 5 after publications flowed live, 1
/// as a recovering subscribe's reply is on its way, 1 at any time, often
/// in a handshake), while the test publishes through the server HTTP API,
/// one every 0–10 ms, at least 600 numbered publications and until the
/// last cut: the SDK delivers each exactly once, in order, and every
/// subscribe after the first says it recovered.
async fn recovers_across_cuts(backend: &str, format: &str, dispatch: &str) {
    const AT_LEAST: u64 = 600;
    const CUTS: usize = 40;
    let args = [
        "--backend",
        backend,
        "--history",
        "2000",
        "--api-key",
        "sekret",
    ];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let proxy = cut_proxy::CutProxy::start(addr).await;
    let url = format!("ws://{}/connection/websocket", proxy.addr);
    let follower = Follower::start(&url, "cuts", dispatch, format);
    follower
        .wait("the first subscribe", Duration::from_secs(20), |f| {
            f.count("subscribed") == 1
        })
        .await;

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut rng = StdRng::seed_from_u64(seed);
    let cutting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut api = centrifugo::ApiPublisher::connect(addr, "sekret").await;
    let mut publisher_rng = StdRng::seed_from_u64(seed ^ 1);
    let still_cutting = cutting.clone();
    let publishing = tokio::spawn(async move {
        let mut n = 0;
        loop {
            n += 1;
            let last = n >= AT_LEAST && !still_cutting.load(Ordering::Relaxed);
            let data = json!({"n": n, "last": last});
            assert_eq!(api.publish("cuts", &data).await, n, "the API's offset");
            if last {
                return n;
            }
            let pause = publisher_rng.random_range(0..=10);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    });

    // The cuts begin once the channel holds a publication: a channel with
    // history but no publications is forgotten with its epoch when its
    // last subscriber leaves (docs/delivery.md, history's bounds), and a
    // subscriber from an epoch forgotten is not recovered.
    follower
        .wait("the first publication", Duration::from_secs(10), |f| {
            f.count("pub") >= 1
        })
        .await;
    let mut moments: Vec<Moment> = (0..CUTS)
        .map(|k| match k % 5 {
            0..3 => Moment::Live,
            3 => Moment::Reply,
            _ => Moment::Any,
        })
        .collect();
    moments.shuffle(&mut rng);
    // What the SDK had said when the last cut came (none yet).
    let (mut subscribed_then, mut connected_then) = (0, 0);
    for &moment in &moments {
        match moment {
            Moment::Live => {
                follower
                    .wait("a subscribe after a cut", Duration::from_secs(20), |f| {
                        f.count("subscribed") > subscribed_then
                    })
                    .await;
            }
            Moment::Reply => {
                follower
                    .wait("a connect after a cut", Duration::from_secs(20), |f| {
                        f.connects() > connected_then
                    })
                    .await;
            }
            Moment::Any => {}
        }
        if moment != Moment::Reply {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=40))).await;
        }
        // Between two connections there is nothing to cut: the next one
        // is cut as soon as the proxy has it.
        let started = std::time::Instant::now();
        while proxy.cut() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no connection to cut; the SDK said:\n{}",
                follower.said()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        subscribed_then = follower.count("subscribed");
        connected_then = follower.connects();
    }
    cutting.store(false, Ordering::Relaxed);
    let total = publishing.await.unwrap();
    follower
        .wait("every publication", Duration::from_secs(30), |f| {
            f.count("done") == 1
        })
        .await;

    let said = follower.said();
    let expected: Vec<(u64, u64)> = (1..=total).map(|n| (n, n)).collect();
    assert_eq!(follower.publications(), expected, "{said}");
    let subscribed = follower.all("subscribed");
    assert_eq!(subscribed[0]["wasRecovering"], false, "{said}");
    let epoch = &subscribed[0]["epoch"];
    for again in &subscribed[1..] {
        assert_eq!(again["wasRecovering"], true, "{again}\n{said}");
        assert_eq!(again["recovered"], true, "{again}\n{said}");
        assert_eq!(&again["epoch"], epoch, "{said}");
    }
    // At least one subscribe since each cut that waited for one.
    let recovered = subscribed.len() - 1;
    assert!(recovered >= 23, "{recovered} recoveries\n{said}");
    assert!(proxy.cut_so_far() >= CUTS as u64, "{said}");
    follower.assert_only_cuts();
    eprintln!(
        "{format} on {backend}, {dispatch} dispatch: {total} publications delivered once and \
         in order across {CUTS} cuts, {recovered} subscribes recovered; seed {seed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_across_cuts_json_on_tokio() {
    recovers_across_cuts("tokio", "json", "browser").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_across_cuts_json_on_tokio_node_dispatch() {
    recovers_across_cuts("tokio", "json", "node").await;
}

#[cfg(all(target_os = "linux", feature = "uring"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_across_cuts_protobuf_on_uring() {
    recovers_across_cuts("uring", "protobuf", "browser").await;
}

/// Away for longer than the history keeps (5): the SDK is cut off (the
/// proxy refuses it meanwhile) while 20 are published, and when it is let
/// back its subscribe says it did not recover, at the top; it goes on
/// with the live publications, having missed those 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_past_the_history_goes_on_live() {
    let args = ["--history", "5", "--api-key", "sekret"];
    let (_server, addr) = start_example("centrifugo_compat", &args).await;
    let proxy = cut_proxy::CutProxy::start(addr).await;
    let url = format!("ws://{}/connection/websocket", proxy.addr);
    let follower = Follower::start(&url, "held", "browser", "json");
    follower
        .wait("the first subscribe", Duration::from_secs(20), |f| {
            f.count("subscribed") == 1
        })
        .await;
    let mut api = centrifugo::ApiPublisher::connect(addr, "sekret").await;
    let publish = async |api: &mut centrifugo::ApiPublisher, n: u64| {
        let data = json!({"n": n, "last": n == 30});
        assert_eq!(api.publish("held", &data).await, n);
    };
    for n in 1..=3 {
        publish(&mut api, n).await;
    }
    follower
        .wait("three publications", Duration::from_secs(10), |f| {
            f.count("pub") == 3
        })
        .await;
    assert_eq!(proxy.hold(), 1);
    // Refused at least once before the 20 are published.
    follower
        .wait("a refused reconnect", Duration::from_secs(10), |f| {
            f.all("error")
                .iter()
                .any(|e| e == "transport: transport closed")
        })
        .await;
    for n in 4..=23 {
        publish(&mut api, n).await;
    }
    proxy.release();
    follower
        .wait("a subscribe after the hold", Duration::from_secs(20), |f| {
            f.count("subscribed") == 2
        })
        .await;
    for n in 24..=30 {
        publish(&mut api, n).await;
    }
    follower
        .wait("the last publication", Duration::from_secs(20), |f| {
            f.count("done") == 1
        })
        .await;

    let said = follower.said();
    let subscribed = follower.all("subscribed");
    let epoch = &subscribed[0]["epoch"];
    assert_eq!(
        subscribed[1],
        json!({"wasRecovering": true, "recovered": false, "recoverable": true,
               "offset": 23, "epoch": epoch}),
        "{said}"
    );
    let expected: Vec<(u64, u64)> = (1..=3).chain(24..=30).map(|n| (n, n)).collect();
    assert_eq!(follower.publications(), expected, "{said}");
    follower.assert_only_cuts();
}
