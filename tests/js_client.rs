//! The JavaScript subscriber (`clients/js/rapidws-bus.mjs`) under Node's
//! test runner (`node --test clients/js/test/`), against the notify_bus
//! example behind a proxy this test controls (`common::cut_proxy`): a bus
//! with `--history 1000` whose connections are all cut at least 20 times
//! while publishing goes on (every publication arrives exactly once, in
//! order, with no discontinuity), and one with `--history 5` cut for
//! longer than that holds (a `discontinuity`, then live deliveries); and
//! the subscriber against a scripted server that sends it bad messages;
//! and the bus serving the module at `/rapidws-bus.mjs`.
//! `npm install` (the `ws` package, a devDependency) runs here once.
#![cfg(feature = "pubsub")]

mod common;

use std::path::Path;
use std::time::Duration;

use common::cut_proxy::CutProxy;
use common::start_example;

/// `clients/js`, with its devDependencies installed.
fn client_dir() -> &'static Path {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js"));
    let out = std::process::Command::new("npm")
        .args(["install", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .output()
        .expect("npm runs");
    assert!(
        out.status.success(),
        "npm install in clients/js failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_subscriber_resumes_across_cuts_exactly_once() {
    let dir = tokio::task::spawn_blocking(client_dir).await.unwrap();
    let (_bus, bus) = start_example("notify_bus", &["--history", "1000"]).await;
    let (_short_bus, short_bus) = start_example("notify_bus", &["--history", "5"]).await;
    let proxy = CutProxy::start(bus).await;
    let short_proxy = CutProxy::start(short_bus).await;
    let mut node = tokio::process::Command::new("node");
    node.args(["--test", "test/"])
        .current_dir(dir)
        .env("RAPIDWS_BUS_HTTP", format!("http://{bus}"))
        .env("RAPIDWS_BUS_WS", format!("ws://{}/ws", proxy.addr))
        .env("RAPIDWS_BUS_PROXY", format!("http://{}", proxy.control))
        .env("RAPIDWS_SHORT_BUS_HTTP", format!("http://{short_bus}"))
        .env(
            "RAPIDWS_SHORT_BUS_WS",
            format!("ws://{}/ws", short_proxy.addr),
        )
        .env(
            "RAPIDWS_SHORT_BUS_PROXY",
            format!("http://{}", short_proxy.control),
        )
        .kill_on_drop(true);
    let run = tokio::time::timeout(Duration::from_secs(300), node.output())
        .await
        .expect("node --test finished within 300 s")
        .expect("node runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    eprintln!("{stdout}\n{stderr}");
    assert!(
        run.status.success(),
        "node --test failed:\n{stdout}\n{stderr}"
    );
    // Node's tests ran, none skipped (they skip without the bus's URLs).
    assert!(stdout.contains("# fail 0"), "{stdout}");
    assert!(stdout.contains("# skipped 0"), "{stdout}");
    // The proxy's own count: the cuts happened, each with a connection.
    assert!(proxy.cut_so_far() >= 20, "{} cut", proxy.cut_so_far());
    assert!(short_proxy.cut_so_far() >= 1);
}

/// The bus serves the module itself, for pages on its origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_serves_the_module() {
    let (_bus, bus) = start_example("notify_bus", &[]).await;
    let head = "GET /rapidws-bus.mjs HTTP/1.1\r\nHost: bus\r\nConnection: close\r\n\r\n";
    let answer = common::http_exchange(bus, head).await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(
        head.lines()
            .any(|line| line.eq_ignore_ascii_case("content-type: text/javascript")),
        "{head}"
    );
    let module = include_str!("../clients/js/rapidws-bus.mjs");
    assert_eq!(body, module);
}
