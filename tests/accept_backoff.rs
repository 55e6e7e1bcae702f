//! The accept loop survives running out of file descriptors (EMFILE): it logs,
//! pauses, and serves again once descriptors are free. This lowers the
//! process's descriptor limit, so it lives in its own test binary.

mod common;

use std::time::Duration;

use common::*;
use rapidws::Config;
use tokio_tungstenite::tungstenite::Message as Ws;

/// Descriptors a server opens to start, at most (two threads here).
const SERVER_STARTUP: u64 = 12;

/// One test for both backends, one after the other: the descriptor limit and
/// the log collector are the process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_emfile_at_accept() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .init();
    survives_emfile_on(Backend::Tokio, &log).await;
    #[cfg(all(target_os = "linux", feature = "uring"))]
    survives_emfile_on(Backend::Uring, &log).await;
}

async fn survives_emfile_on(backend: Backend, log: &Log) {
    log.0.lock().unwrap().clear();
    // Lowered before the server starts: io_uring's accept takes the limit
    // when it is armed, on the reactor thread some time after `start`
    // returns, and keeps it while armed. `SERVER_STARTUP` leaves room for what
    // starting opens (listeners, rings, eventfds, epolls), so about 20
    // descriptors stay free for connections.
    let original = set_soft_limit(Some(open_descriptors() + 20 + SERVER_STARTUP));
    let server = start(backend, Config::default()).await;

    // Another process connects 100 times, so the server (and not the client,
    // which shares this process's descriptors) runs out: its accepts fail with
    // EMFILE while connections wait in the listen backlog. It inherits the
    // lowered limit, so it raises its own first (or it could run out before
    // the server does).
    let mut holder = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import resource, socket, time\n\
             _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n\
             resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n\
             held = [socket.create_connection(('{}', {})) for _ in range(100)]\n\
             time.sleep(30)",
            server.addr.ip(),
            server.addr.port()
        ))
        .spawn()
        .expect("python3 runs");
    let failed = || String::from_utf8_lossy(&log.0.lock().unwrap()).contains("accept failed");
    eventually(Duration::from_secs(5), failed).await;
    let logged = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("accept failed"),
        "the {backend:?} server never hit EMFILE: {logged}"
    );
    assert!(logged.contains("Too many open files"), "{logged}");

    // Free the descriptors; the server must recover by itself.
    let _ = holder.kill();
    let _ = holder.wait();
    set_soft_limit(Some(original));
    assert!(!server.served.is_finished(), "serve must not give up");
    let mut client = tokio::time::timeout(Duration::from_secs(10), server.client())
        .await
        .expect("served again after descriptors were freed");
    send_text(&mut client, "back").await;
    assert_eq!(next(&mut client).await, Ws::text("back"));
}
