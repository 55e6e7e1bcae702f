//! Who may publish and subscribe on the notify_bus example:
//! `--publish-token` (401 with a `Bearer` challenge without the
//! token or with another) and `--jwt-secret` (HS256 tokens naming topics and
//! an expiry, in the query or a first message): each refusal with its
//! reason, on both backends, while an authorized subscriber goes on
//! receiving. Clients: raw HTTP and tokio-tungstenite; tokens made with
//! the jsonwebtoken crate.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use futures_util::StreamExt as _;
use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const PUBLISH_TOKEN: &str = "publish-token-0123456789";
const SECRET: &str = "jwt-secret-0123456789abcdef";

/// A token for `topics`, expiring `secs` from now (negative: expired),
/// signed with `secret`.
fn token(secret: &str, topics: &[&str], secs: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let claims = json!({ "exp": now + secs, "topics": topics, "sub": "test" });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// A token with these claims and header, signed with `SECRET`.
fn token_with(header: &Header, claims: &serde_json::Value) -> String {
    encode(header, claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `GET path` with extra header lines; the whole response.
async fn get(addr: SocketAddr, path: &str, extra: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n{extra}\r\n");
    http_exchange(addr, &head).await
}

/// `POST path` with `body` and extra header lines; the whole response.
async fn post(addr: SocketAddr, path: &str, extra: &str, body: &str) -> String {
    http_exchange(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n{extra}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

/// The `delivered` count of a whole publish response.
fn delivered_in(response: &str) -> u64 {
    delivered(response.split_once("\r\n\r\n").expect("a whole response").1)
}

async fn connect(addr: SocketAddr, query: &str) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{addr}/ws{query}"))
        .await
        .expect("upgraded")
        .0
}

async fn text(client: &mut Client) -> String {
    match next(client).await {
        WsMessage::Text(text) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// The upgrade's refusal: status line and body.
async fn refused_upgrade(addr: SocketAddr, query: &str) -> String {
    let head = upgrade_head(
        "GET",
        &format!("/ws{query}"),
        "HTTP/1.1",
        "Sec-WebSocket-Version: 13\r\n",
    );
    http_exchange(addr, &head).await
}

async fn publishing_needs_the_token(backend: &str) {
    let (_bus, addr) = start_example(
        "notify_bus",
        &["--backend", backend, "--publish-token", PUBLISH_TOKEN],
    )
    .await;
    let mut subscriber = connect(addr, "?topics=news").await;
    let bearer = format!("Authorization: Bearer {PUBLISH_TOKEN}\r\n");
    for (extra, challenge, reason) in [
        (
            "",
            "WWW-Authenticate: Bearer realm=\"bus\"\r\n",
            "needs Authorization: Bearer",
        ),
        (
            "Authorization: Bearer guess\r\n",
            "error=\"invalid_token\"",
            "not the bus's publish token",
        ),
        (
            "Authorization: Basic dXNlcjpwYXNz\r\n",
            "WWW-Authenticate: Bearer",
            "needs Authorization",
        ),
    ] {
        for path in ["/publish/news", "/publish"] {
            let response = post(addr, path, extra, "{\"topic\":\"news\",\"data\":\"x\"}").await;
            assert!(
                response.starts_with("HTTP/1.1 401"),
                "{backend} {path} {extra:?}: {response}"
            );
            assert!(response.contains(challenge), "{backend}: {response}");
            assert!(response.contains(reason), "{backend}: {response}");
        }
    }
    let response = post(addr, "/publish/news", &bearer, "with the token").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(delivered_in(&response), 1);
    let response = post(
        addr,
        "/publish",
        &bearer,
        "{\"topic\":\"news\",\"data\":\"a line\"}\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // Only what came with the token reached the subscriber.
    assert_eq!(text(&mut subscriber).await, "with the token");
    assert_eq!(text(&mut subscriber).await, "a line");
    // The counters, topics and metrics need the token too.
    for path in ["/stats", "/topics/news", "/metrics"] {
        let refused = get(addr, path, "").await;
        assert!(refused.starts_with("HTTP/1.1 401"), "{path}: {refused}");
        assert!(refused.contains("needs Authorization: Bearer"), "{refused}");
        let guessed = get(addr, path, "Authorization: Bearer guess\r\n").await;
        assert!(guessed.starts_with("HTTP/1.1 401"), "{path}: {guessed}");
    }
    let stats = get(addr, "/stats", &bearer).await;
    assert!(stats.contains("\"published\":2"), "{stats}");
    let topic = get(addr, "/topics/news", &bearer).await;
    assert!(topic.contains("\"subscribers\":1"), "{topic}");
}

/// `--open-stats` opens the counters to anyone though tokens are on;
/// with only `--jwt-secret` (no publish token to show) they are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_are_closed_with_tokens_unless_opened() {
    let args = ["--publish-token", PUBLISH_TOKEN, "--open-stats"];
    let (_bus, addr) = start_example("notify_bus", &args).await;
    for path in ["/stats", "/topics/news"] {
        let open = get(addr, path, "").await;
        assert!(open.starts_with("HTTP/1.1 200"), "{path}: {open}");
    }
    let (_bus, addr) = start_example("notify_bus", &["--jwt-secret", SECRET]).await;
    for path in ["/stats", "/topics/news"] {
        let closed = get(addr, path, "").await;
        assert!(closed.starts_with("HTTP/1.1 403"), "{path}: {closed}");
        assert!(closed.contains("--open-stats"), "{closed}");
    }
    let (_bus, addr) = start_example("notify_bus", &[]).await;
    let open = get(addr, "/stats", "").await;
    assert!(
        open.starts_with("HTTP/1.1 200"),
        "no tokens, no gate: {open}"
    );
}

/// Runs notify_bus with `env` and `args`, which it must refuse at start
/// (within 10 s); its stderr.
fn refused_at_start(env: &[(&str, &str)], args: &[&str]) -> String {
    let mut child = std::process::Command::new(example("notify_bus"))
        .args(["--addr", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            use std::io::Read as _;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            assert!(!status.success(), "{env:?} {args:?} exited 0: {stderr}");
            return stderr;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("notify_bus {env:?} {args:?} started instead of refusing");
}

/// The secrets may come from the environment, where `ps` does not show
/// them; `--help` says so and how long they must be; one too short is
/// refused naming its flag and variable, never echoed; and
/// `--redis-secret` without Redis is refused for that before its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_come_from_the_environment_too() {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _bus = Child(
        std::process::Command::new(example("notify_bus"))
            .args(["--addr", &addr.to_string()])
            .env("NOTIFY_BUS_PUBLISH_TOKEN", PUBLISH_TOKEN)
            .spawn()
            .unwrap(),
    );
    wait_listening("notify_bus", addr).await;
    let refused = post(addr, "/publish/news", "", "x").await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let bearer = format!("Authorization: Bearer {PUBLISH_TOKEN}\r\n");
    let published = post(addr, "/publish/news", &bearer, "x").await;
    assert!(published.starts_with("HTTP/1.1 200"), "{published}");

    let help = std::process::Command::new(example("notify_bus"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for name in [
        "NOTIFY_BUS_PUBLISH_TOKEN",
        "NOTIFY_BUS_JWT_SECRET",
        "NOTIFY_BUS_REDIS_SECRET",
    ] {
        assert!(help.contains(name), "--help does not name {name}: {help}");
    }
    assert!(help.contains("At least 16 characters"), "{help}");

    let stderr = refused_at_start(&[("NOTIFY_BUS_JWT_SECRET", "short-secret")], &[]);
    assert!(
        stderr.contains("--jwt-secret (or NOTIFY_BUS_JWT_SECRET)"),
        "{stderr}"
    );
    assert!(stderr.contains("at least 16 characters"), "{stderr}");
    assert!(
        !stderr.contains("short-secret"),
        "the secret was echoed: {stderr}"
    );
    let stderr = refused_at_start(&[], &["--publish-token", "T"]);
    assert!(stderr.contains("--publish-token"), "{stderr}");
    assert!(stderr.contains("openssl rand -hex 16"), "{stderr}");
    let stderr = refused_at_start(&[], &["--redis-secret", "short"]);
    assert!(
        stderr.contains("needs --redis or --redis-cluster"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_needs_the_bearer_token_on_both_backends() {
    publishing_needs_the_token("tokio").await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    publishing_needs_the_token("uring").await;
}

async fn subscribing_needs_a_token(backend: &str) {
    let (_bus, addr) = start_example(
        "notify_bus",
        &["--backend", backend, "--jwt-secret", SECRET, "--open-stats"],
    )
    .await;
    let publish = |topic: &'static str, body: &'static str| async move {
        let response = post(addr, &format!("/publish/{topic}"), "", body).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        delivered_in(&response)
    };
    // An authorized subscriber, there through everything below.
    let good = token(SECRET, &["news", "scores.*"], 3600);
    let mut steady = connect(addr, &format!("?topics=news&token={good}")).await;

    // Refused at the upgrade, each with its reason.
    for (query, status, reason) in [
        ("?topics=news".to_owned(), 401, "subscribing needs a token"),
        (
            format!(
                "?topics=news&token={}",
                token("another-secret-0123456789", &["news"], 3600)
            ),
            401,
            "not signed with this server's key",
        ),
        (
            format!("?topics=news&token={}", token(SECRET, &["news"], -5)),
            401,
            "token expired",
        ),
        (format!("?topics=weather&token={good}"), 403, "not allowed"),
        (
            "?topics=news&token=not.a.jwt".to_owned(),
            401,
            "token not valid",
        ),
        // Not valid before a time still to come.
        (
            format!(
                "?topics=news&token={}",
                token_with(
                    &Header::default(),
                    &json!({"exp": now() + 3600, "nbf": now() + 600, "topics": ["news"]})
                )
            ),
            401,
            "not valid yet",
        ),
        // A critical extension this server does not know.
        (
            format!(
                "?topics=news&token={}",
                token_with(
                    &Header {
                        crit: Some(vec!["exp".to_owned()]),
                        ..Header::default()
                    },
                    &json!({"exp": now() + 3600, "topics": ["news"]})
                )
            ),
            401,
            "crit",
        ),
        // Never expiring, or expiring at no time a number of seconds names.
        (
            format!(
                "?topics=news&token={}",
                token_with(
                    &Header::default(),
                    &json!({"exp": u64::MAX, "topics": ["news"]})
                )
            ),
            401,
            "more than a year away",
        ),
        (
            format!(
                "?topics=news&token={}",
                token_with(
                    &Header::default(),
                    &json!({"exp": 1e30, "topics": ["news"]})
                )
            ),
            401,
            "not a whole number of seconds",
        ),
        (
            format!(
                "?topics=news&token={}",
                token_with(&Header::default(), &json!({"exp": -5, "topics": ["news"]}))
            ),
            401,
            "not a whole number of seconds",
        ),
        (
            format!(
                "?topics=news&token={}",
                token_with(&Header::default(), &json!({"topics": ["news"]}))
            ),
            401,
            "no \"exp\" claim",
        ),
    ] {
        let response = refused_upgrade(addr, &query).await;
        assert!(
            response.starts_with(&format!("HTTP/1.1 {status}")),
            "{backend} {query}: {response}"
        );
        assert!(response.contains(reason), "{backend} {query}: {response}");
    }

    // A token's topics, and no other.
    let mut client = connect(addr, &format!("?token={good}")).await;
    send_text(&mut client, "subscribe:weather").await;
    assert_eq!(text(&mut client).await, "error: not allowed");
    send_text(&mut client, "subscribe:scores.football").await;
    send_text(&mut client, "sync").await;
    assert!(
        text(&mut client)
            .await
            .starts_with("error: unknown command")
    );
    assert_eq!(publish("scores.football", "2:1").await, 1);
    assert_eq!(text(&mut client).await, "2:1");
    assert_eq!(publish("weather", "rain").await, 0);

    // The token as the first message; before it, nothing may be joined.
    let mut late = connect(addr, "").await;
    send_text(&mut late, "subscribe:news").await;
    assert_eq!(text(&mut late).await, "error: not allowed");
    send_text(&mut late, &format!("token:{good}")).await;
    send_text(&mut late, "subscribe:news").await;
    send_text(&mut late, "sync").await;
    assert!(text(&mut late).await.starts_with("error: unknown command"));

    // A token message signed with another key closes with 1008 and why.
    let mut forged = connect(addr, "").await;
    let other = token("another-secret-0123456789", &["*"], 3600);
    send_text(&mut forged, &format!("token:{other}")).await;
    let (code, reason) = expect_close(&mut forged).await;
    assert_eq!(code, 1008);
    assert!(
        reason.contains("not signed with this server's key"),
        "{reason}"
    );

    // An unsigned token ("alg":"none"): refused with a reason that fits a
    // close frame (the library's own words for it run past 123 bytes).
    let mut unsigned = connect(addr, "").await;
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJleHAiOjk5OTk5OTk5OTksInRvcGljcyI6WyIqIl19.";
    send_text(&mut unsigned, &format!("token:{none}")).await;
    let (code, reason) = expect_close(&mut unsigned).await;
    assert_eq!(code, 1008);
    assert!(reason.starts_with("token not valid"), "{reason}");

    // A token that expires closes its connection with 1008 when it does.
    let short = token(SECRET, &["news"], 2);
    let mut brief = connect(addr, &format!("?topics=news&token={short}")).await;
    let opened = std::time::Instant::now();
    assert_eq!(publish("news", "first").await, 3, "steady, late and brief");
    assert_eq!(text(&mut brief).await, "first");
    let (code, reason) = expect_close(&mut brief).await;
    assert_eq!((code, reason.as_str()), (1008, "token expired"));
    // Our close reply goes out as the stream is read on to its end.
    while let Some(Ok(_)) = brief.next().await {}
    let lived = opened.elapsed();
    assert!(
        lived > Duration::from_millis(900) && lived < Duration::from_secs(5),
        "closed after {lived:?} for a token of 2 s"
    );

    // Nothing else was disturbed.
    assert_eq!(text(&mut steady).await, "first");
    assert_eq!(text(&mut late).await, "first");
    // The closed one leaves the topic once its close handshake is done.
    let topic = || async {
        http_exchange(
            addr,
            "GET /topics/news HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\r\n",
        )
        .await
    };
    for _ in 0..100 {
        if topic().await.contains("\"subscribers\":2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(publish("news", "second").await, 2);
    assert_eq!(text(&mut steady).await, "second");
    assert_eq!(text(&mut late).await, "second");
    steady.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_need_a_token_naming_their_topics_on_both_backends() {
    subscribing_needs_a_token("tokio").await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    subscribing_needs_a_token("uring").await;
}
