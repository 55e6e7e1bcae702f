//! A TCP proxy the test controls, between a client and a server: it cuts
//! every connection through it at once (both sides closed, what was in
//! flight lost), and it can refuse connections for a while (each accepted
//! and closed at once), as a network that went away would. Driven from the
//! test (`cut`, `hold`, `release`) or over a small HTTP endpoint of its
//! own (`POST /cut`, `/hold`, `/release`, answering `{"cut":N}`), for a
//! client in another process.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Default)]
struct State {
    /// The connections' relay tasks (finished ones are pruned on each cut).
    relays: Vec<AbortHandle>,
    held: bool,
    /// Connections cut so far, over every cut.
    cut: u64,
}

/// The proxy; it stops (with everything through it) when dropped.
pub struct CutProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The control endpoint (`http://{control}/cut`).
    pub control: SocketAddr,
    state: Arc<Mutex<State>>,
    tasks: Vec<AbortHandle>,
}

impl CutProxy {
    /// A proxy on a free loopback port to `upstream`, and its control
    /// endpoint on another.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = bind_low().await;
        let addr = listener.local_addr().unwrap();
        let relaying = tokio::spawn(relay_all(listener, upstream, state.clone()));
        let control = bind_low().await;
        let control_addr = control.local_addr().unwrap();
        let controlling = tokio::spawn(control_all(control, state.clone()));
        CutProxy {
            addr,
            control: control_addr,
            state,
            tasks: vec![relaying.abort_handle(), controlling.abort_handle()],
        }
    }

    /// Cuts every connection now; how many there were.
    pub fn cut(&self) -> u64 {
        cut(&self.state)
    }

    /// Cuts every connection and refuses new ones until `release`.
    pub fn hold(&self) -> u64 {
        self.state.lock().unwrap().held = true;
        cut(&self.state)
    }

    pub fn release(&self) {
        self.state.lock().unwrap().held = false;
    }

    /// Connections cut so far.
    pub fn cut_so_far(&self) -> u64 {
        self.state.lock().unwrap().cut
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        cut(&self.state);
    }
}

/// A listener on a free loopback port below 32768 (outside the range the
/// system hands out for outgoing connections).
async fn bind_low() -> TcpListener {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id();
    for attempt in 0..1000u32 {
        let port = 10_000 + (seed.wrapping_add(attempt.wrapping_mul(7919)) % 22_000) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return listener;
        }
    }
    panic!("no free loopback port below 32768");
}

fn cut(state: &Mutex<State>) -> u64 {
    let mut state = state.lock().unwrap();
    let relays = std::mem::take(&mut state.relays);
    let live = relays.iter().filter(|relay| !relay.is_finished()).count() as u64;
    // Aborting a relay drops both of its sockets: each side sees its
    // connection end, and nothing still in the proxy is passed on.
    for relay in relays {
        relay.abort();
    }
    state.cut += live;
    live
}

async fn relay_all(listener: TcpListener, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        // Under the lock: a cut either sees this relay or came before it.
        let mut state = state.lock().unwrap();
        if state.held {
            drop(client);
            continue;
        }
        let relay = tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        state.relays.retain(|relay| !relay.is_finished());
        state.relays.push(relay.abort_handle());
    }
}

/// The control endpoint: one request per connection, `POST /cut`,
/// `/hold` or `/release`.
async fn control_all(listener: TcpListener, state: Arc<Mutex<State>>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut chunk = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split(' ').nth(1).unwrap_or("");
            let (status, body) = match path {
                "/cut" => ("200 OK", format!("{{\"cut\":{}}}", cut(&state))),
                "/hold" => {
                    state.lock().unwrap().held = true;
                    ("200 OK", format!("{{\"cut\":{}}}", cut(&state)))
                }
                "/release" => {
                    state.lock().unwrap().held = false;
                    ("200 OK", "{\"cut\":0}".to_owned())
                }
                _ => (
                    "404 Not Found",
                    "{\"error\":\"POST /cut, /hold or /release\"}".into(),
                ),
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
