//! Who may reach a running server's handoff socket, and whom a successor
//! takes over from, with real users (these tests run as root and play the
//! others with `setpriv`; they skip, saying so, when not root):
//!
//! - the socket file is never connectable by another user, however often
//!   the server starts and whatever the umask: a process of uid 65534
//!   spins on connecting while servers bind and rebind the path;
//! - a process of another user that reaches the socket anyway (it may
//!   skip file permissions: `CAP_DAC_OVERRIDE`) is given nothing;
//! - a root successor refuses a server of another user (uid 65534), which
//!   serves on untouched, and a successor of that user takes over.
#![cfg(target_os = "linux")]

mod common;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use rapidws::Config;
use tokio_tungstenite::tungstenite::Message;

/// The user the tests play another user with.
const NOBODY: u32 = 65534;

/// The tests take turns: while one starts processes, a socket the binding
/// test just closed lives on in the forked child until it execs, and
/// would be taken for a server still listening.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether this process is root; if not, says why the test is skipped.
fn root_or_skip(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("{test}: skipped, it needs root (to run processes as another user)");
    false
}

/// `setpriv` arguments that run a command as `uid` (its own group, no
/// others).
fn as_user(uid: u32) -> Vec<String> {
    vec![
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
    ]
}

/// A directory of the test's own, mode `mode`, owned by `uid`.
fn directory(name: &str, uid: u32, mode: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rapidws-identity-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// Spins on connecting, as another user, to `path` and to every socket
/// in and one level under `dir` (where a server might bind before it
/// renames), until killed; prints `ready` once it spins, then each
/// connect that succeeded, and how many it tried when stdin closes.
const CONNECTOR: &str = r#"
import os, socket, sys, select
d, path = sys.argv[1], sys.argv[2]
tries = 0
print("ready", flush=True)
while True:
    if select.select([sys.stdin], [], [], 0)[0]:
        break
    targets = [path]
    try:
        for name in os.listdir(d):
            inner = os.path.join(d, name)
            targets += [inner, os.path.join(inner, "s")]
    except OSError:
        pass
    for target in targets:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(target)
            print("connected", target, flush=True)
        except OSError:
            pass
        finally:
            s.close()
        tries += 1
print("tries", tries, flush=True)
"#;

/// The socket file is never connectable by another user: with umask 0
/// (the whole test process's), servers on both backends bind the path a
/// thousand times each, fresh or over the socket the last one left,
/// while uid 65534 spins on connecting to it and to whatever appears
/// beside it. Not one connect succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handoff_socket_is_never_connectable_by_another_user() {
    if !root_or_skip("the_handoff_socket_is_never_connectable_by_another_user") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    // (Only this test changes the umask; the others set their modes.)
    rustix::process::umask(rustix::fs::Mode::empty());
    let dir = directory("race", 0, 0o755);
    let path = dir.join("h.sock");
    let mut connector = Child(
        Command::new("setpriv")
            .args(as_user(NOBODY))
            .args(["/usr/bin/python3", "-c", CONNECTOR])
            .arg(&dir)
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(connector.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    const STARTS: usize = 1000;
    for start in 0..STARTS {
        if start % 3 == 0 {
            // A first start; the others find the last one's socket.
            let _ = std::fs::remove_file(&path);
        }
        let handler = Echo { page: None };
        if start % 2 == 0 {
            let server = rapidws::uring::Server::bind("127.0.0.1:0", handler, Config::default())
                .unwrap()
                .handoff_socket(&path)
                .unwrap();
            drop(server);
        } else {
            let server = rapidws::tokio::Server::bind("127.0.0.1:0", handler, Config::default())
                .await
                .unwrap()
                .handoff_socket(&path)
                .unwrap();
            drop(server);
        }
        let mode = std::fs::symlink_metadata(&path).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600, "start {start}");
    }
    drop(connector.0.stdin.take());
    let mut report = String::new();
    std::io::Read::read_to_string(&mut out, &mut report).unwrap();
    let _ = connector.0.wait();
    assert!(
        !report.contains("connected"),
        "uid {NOBODY} connected: {report}"
    );
    let tries: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("tries "))
        .expect("the connector's count")
        .parse()
        .unwrap();
    eprintln!("{STARTS} starts; uid {NOBODY} tried {tries} connects, none got in");
    assert!(tries > STARTS as u64, "the connector hardly ran: {tries}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A process of another user that passes the socket file's mode
/// (uid 65533 with `CAP_DAC_OVERRIDE`) connects to a root server's
/// handoff socket: the server sends it nothing (not even its greeting)
/// and ends the connection, and serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_of_another_user_at_the_socket_is_given_nothing() {
    if !root_or_skip("a_process_of_another_user_at_the_socket_is_given_nothing") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    for backend in ["tokio", "uring"] {
        let dir = directory(&format!("dac-{backend}"), 0, 0o755);
        let path = dir.join("h.sock");
        let args = [
            "--handoff-socket",
            path.to_str().unwrap(),
            "--backend",
            backend,
        ];
        let (mut server, addr) = start_example("echo", &args).await;
        let url = format!("ws://{addr}/");
        let (mut client, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        let script = "import socket, sys\n\
            s = socket.socket(socket.AF_UNIX)\n\
            s.settimeout(10)\n\
            s.connect(sys.argv[1])\n\
            print('connected', flush=True)\n\
            print('read', len(s.recv(100)), flush=True)\n";
        let out = Command::new("setpriv")
            .args(as_user(65533))
            .args(["--inh-caps=+dac_override", "--ambient-caps=+dac_override"])
            .args(["/usr/bin/python3", "-c", script])
            .arg(&path)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        // It got in (the mode does not stop it), and was given 0 bytes.
        assert_eq!(out, "connected\nread 0\n", "{backend}");
        client.send(Message::text("still")).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::text("still")
        );
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "{backend}: it exited"
        );
        drop(server.0.kill());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A server run by uid 65534 (in a directory of that user's) and a root
/// successor told to take it over: the successor refuses, naming both
/// users, before it reads anything; the server keeps everything (its
/// clients talk on, new ones are answered, its socket file stays its
/// own), and a successor of its own user then takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_successor_refuses_a_server_of_another_user() {
    if !root_or_skip("a_root_successor_refuses_a_server_of_another_user") {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    for backend in ["tokio", "uring"] {
        refuses_another_users_server(backend).await;
    }
}

async fn refuses_another_users_server(backend: &str) {
    let dir = directory(&format!("other-{backend}"), NOBODY, 0o700);
    let path = dir.join("h.sock");
    let socket = path.to_str().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let echo = example("echo");
    let run_as_nobody = |extra: &[&str]| {
        Child(
            Command::new("setpriv")
                .args(as_user(NOBODY))
                .arg(&echo)
                .args(["--addr", &addr.to_string(), "--backend", backend])
                .args(extra)
                .spawn()
                .unwrap(),
        )
    };
    let mut old = run_as_nobody(&["--handoff-socket", socket]);
    wait_listening("echo as uid 65534", addr).await;
    let url = format!("ws://{addr}/");
    let (mut client, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let owner = |path: &Path| std::fs::symlink_metadata(path).unwrap().uid();
    assert_eq!(owner(&path), NOBODY);

    let mut root = Child(
        Command::new(&echo)
            .args(["--addr", &addr.to_string(), "--backend", backend])
            .args(["--take-over", socket])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut waited = Duration::ZERO;
    let status = loop {
        if let Some(status) = root.0.try_wait().unwrap() {
            break status;
        }
        // One that took over serves on, and does not end.
        assert!(
            waited < Duration::from_secs(10),
            "{backend}: root took over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    };
    assert!(!status.success(), "{backend}: root took over");
    let mut said = String::new();
    std::io::Read::read_to_string(&mut root.0.stderr.take().unwrap(), &mut said).unwrap();
    assert!(
        said.contains("uid 65534") && said.contains("uid 0"),
        "{backend}: {said}"
    );

    // Nothing changed for the server.
    assert!(old.0.try_wait().unwrap().is_none(), "{backend}: it exited");
    client.send(Message::text("on")).await.unwrap();
    assert_eq!(client.next().await.unwrap().unwrap(), Message::text("on"));
    for n in 0..20 {
        let (mut fresh, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap();
        fresh.send(Message::text(format!("{n}"))).await.unwrap();
        assert_eq!(
            fresh.next().await.unwrap().unwrap(),
            Message::text(format!("{n}"))
        );
    }
    assert_eq!(owner(&path), NOBODY);

    // Its own user takes over: the client talks on, to the new process.
    let _new = run_as_nobody(&["--take-over", socket]);
    assert!(
        exits_zero(&mut old, Duration::from_secs(30)).await,
        "{backend}"
    );
    client.send(Message::text("moved")).await.unwrap();
    assert_eq!(
        client.next().await.unwrap().unwrap(),
        Message::text("moved")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
