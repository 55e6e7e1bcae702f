//! The servers under test, and starting, sampling and stopping one of them.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One server of the comparison.
#[derive(Clone, Debug)]
pub struct Server {
    pub name: &'static str,
    /// Echo binary; takes `--addr`.
    echo: PathBuf,
    /// Arguments the echo and push binaries need besides their own.
    args: &'static [&'static str],
    /// The arguments instead of `args` when permessage-deflate should be
    /// accepted (scenario 7); `None` if the server cannot do it here.
    deflate_args: Option<&'static [&'static str]>,
    /// Push binary for the stream scenario; takes `--addr --push-size --push-every-us`.
    push: Option<PathBuf>,
    /// The path WebSocket clients ask for (`/` for most servers; the axum
    /// apps serve their socket at `/ws`).
    pub path: &'static str,
    /// Raw TCP: no upgrade; the load generator gets `--raw`.
    pub raw: bool,
    /// wss: started with `--tls-cert`/`--tls-key` (the harness's own
    /// certificate, `tls_identity`), and the load generator with `--tls-ca`.
    /// Only scenarios 1 and 4 run such servers.
    pub tls: bool,
    /// The fan-out binary (scenario 9) and its arguments besides `--addr`,
    /// for the servers that take part: topics at `/?topics=`, publishes as
    /// text messages `<topic>\n<payload>`.
    pub fanout: Option<(PathBuf, &'static [&'static str])>,
    /// smux over the WebSocket (`mux_echo`): only the stream scenario (6)
    /// runs it, its load generator with `--mux`: pushes and requests as
    /// two streams of one session.
    pub mux: bool,
    /// WebSockets over HTTP/3 in this dialect (`rapidws-load --h3`):
    /// started as a `tls` server is, on UDP at its address. Only scenarios
    /// 1 and 4 run such servers.
    pub h3: Option<&'static str>,
    /// Scenario 11's servers: HTTP publishes fanned out to WebSocket
    /// subscribers, in the bus's protocol or Centrifugo's. They take part
    /// in that scenario only.
    pub bus: Option<Bus>,
}

/// How a server of scenario 11 is started, and what its subscribers speak.
#[derive(Clone, Debug)]
pub struct Bus {
    pub bin: PathBuf,
    /// Its arguments besides `--addr` (Centrifugo takes none: its config).
    pub args: &'static [&'static str],
    /// `rapidws-load fanout --protocol`: `plain` (the bus's `?topics=` and
    /// `POST /publish/<topic>`) or `centrifuge` (Centrifugo's client
    /// protocol, JSON, and `POST /api/publish`).
    pub protocol: &'static str,
    /// Centrifugo itself: its config written to a file of its own
    /// (`centrifugo_config`), run with `GOMAXPROCS=1`.
    pub centrifugo: bool,
}

/// The HTTP API key scenario 11's servers are given, and its publishers send.
pub const API_KEY: &str = "api-key";

/// The Centrifugo `run.sh` builds (from the Go module proxy, with the
/// version stamped as its release builds do); checked before each start.
pub const CENTRIFUGO_VERSION: &str = "v6.9.1";

/// Centrifugo's configuration for scenario 11: on `addr`, anonymous
/// connections let in and allowed to subscribe to any channel (no
/// namespaces, no history), the HTTP API with [`API_KEY`], logs at error.
/// Matches what `centrifugo_compat` serves with `--api-key`.
pub fn centrifugo_config(addr: SocketAddr) -> String {
    serde_json::json!({
        "http_server": {"address": addr.ip().to_string(), "port": addr.port()},
        "log": {"level": "error"},
        "client": {
            "allow_anonymous_connect_without_token": true,
            "allowed_origins": ["*"],
        },
        "http_api": {"key": API_KEY},
        "channel": {"without_namespace": {
            "allow_subscribe_for_anonymous": true,
            "allow_subscribe_for_client": true,
        }},
    })
    .to_string()
}

/// An error unless `bin` is Centrifugo [`CENTRIFUGO_VERSION`] (as its
/// `version` command prints).
fn check_centrifugo(bin: &Path) -> io::Result<()> {
    let output = Command::new(bin)
        .arg("version")
        .output()
        .map_err(|e| io::Error::other(format!("{}: {e} (run.sh builds it)", bin.display())))?;
    let said = String::from_utf8_lossy(&output.stdout);
    if said.starts_with(&format!("Centrifugo {CENTRIFUGO_VERSION} ")) {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{} says {:?}, not Centrifugo {CENTRIFUGO_VERSION} (run.sh builds it)",
            bin.display(),
            said.trim()
        )))
    }
}

impl Server {
    pub fn supports_stream(&self) -> bool {
        self.push.is_some()
    }

    pub fn supports_fanout(&self) -> bool {
        self.fanout.is_some()
    }

    pub fn supports_deflate(&self) -> bool {
        self.deflate_args.is_some()
    }

    /// This server started with permessage-deflate on, if it supports it.
    /// Only scenario 7 uses it: the other scenarios measure the servers as
    /// they are by default, without compression.
    pub fn with_deflate(&self) -> Option<Server> {
        Some(Server {
            args: self.deflate_args?,
            ..self.clone()
        })
    }
}

/// The certificate and key (PEM files) every wss server of the harness
/// serves: self-signed for `localhost`, made once per run in `dir`.
pub fn tls_identity(dir: &Path) -> io::Result<(PathBuf, PathBuf)> {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .map_err(io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem())?;
    std::fs::write(&key, made.signing_key.serialize_pem())?;
    Ok((cert, key))
}

/// The same servers built from another checkout of rapidws (`--compare`),
/// named `NAME@before`, for before/after figures from one run.
pub fn compared(repo: &Path) -> Vec<Server> {
    let examples = repo.join("target/release/examples");
    // Its fan-out server too, if that checkout's harness was built.
    let bin = repo.join("benches/harness/target/release");
    let fanout = bin.join("rapidws-fanout").exists().then_some(bin.as_path());
    rapidws(&examples, fanout)
        .into_iter()
        .map(|server| Server {
            name: Box::leak(format!("{}@before", server.name).into_boxed_str()),
            ..server
        })
        .collect()
}

fn rapidws(examples: &Path, harness_bin: Option<&Path>) -> Vec<Server> {
    let fanout =
        |args: &'static [&'static str]| harness_bin.map(|bin| (bin.join("rapidws-fanout"), args));
    vec![
        Server {
            name: "rapidws-tokio",
            echo: examples.join("echo"),
            args: &[],
            deflate_args: Some(&["--deflate"]),
            push: Some(examples.join("stream")),
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: fanout(&["--backend", "tokio"]),
            bus: None,
        },
        Server {
            name: "rapidws-uring",
            echo: examples.join("echo"),
            args: &["--backend", "uring"],
            deflate_args: Some(&["--backend", "uring", "--deflate"]),
            push: Some(examples.join("stream")),
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: fanout(&["--backend", "uring"]),
            bus: None,
        },
        // The same servers behind a `rapidws::route::Router` on the port
        // (`--route`): each connection sniffed, then handed with its first
        // bytes to the server's `Entrance`. What routing costs.
        Server {
            name: "rapidws-tokio-routed",
            echo: examples.join("echo"),
            args: &["--route"],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
        Server {
            name: "rapidws-uring-routed",
            echo: examples.join("echo"),
            args: &["--backend", "uring", "--route"],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
        // Scenario 6 with pushes and requests as two smux streams over
        // one WebSocket: `mux_echo --push-size`.
        Server {
            name: "rapidws-tokio-mux",
            echo: examples.join("mux_echo"),
            args: &[],
            deflate_args: None,
            push: Some(examples.join("mux_echo")),
            path: "/mux",
            raw: false,
            tls: false,
            mux: true,
            h3: None,
            fanout: None,
            bus: None,
        },
        Server {
            name: "rapidws-uring-mux",
            echo: examples.join("mux_echo"),
            // The mux and its streams on the reactor's thread.
            args: &["--backend", "uring", "--on-server-loop"],
            deflate_args: None,
            push: Some(examples.join("mux_echo")),
            path: "/mux",
            raw: false,
            tls: false,
            mux: true,
            h3: None,
            fanout: None,
            bus: None,
        },
        // Pub/sub with history on (1,000 publications per topic, 300 s):
        // what keeping history costs the fan-out scenario.
        Server {
            name: "rapidws-tokio-history",
            echo: examples.join("echo"),
            args: &[],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: fanout(&["--backend", "tokio", "--history", "1000"]),
            bus: None,
        },
        Server {
            name: "rapidws-uring-history",
            echo: examples.join("echo"),
            args: &["--backend", "uring"],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: fanout(&["--backend", "uring", "--history", "1000"]),
            bus: None,
        },
        Server {
            name: "rapidws-axum",
            echo: examples.join("axum_echo"),
            args: &[],
            deflate_args: Some(&["--deflate"]),
            push: None,
            path: "/ws",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
        Server {
            name: "rapidws-axum-wss",
            echo: examples.join("axum_echo"),
            args: &[],
            deflate_args: None,
            push: None,
            path: "/ws",
            raw: false,
            tls: true,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
        Server {
            name: "rapidws-uring-wss",
            echo: examples.join("echo"),
            args: &["--backend", "uring"],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: true,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
        Server {
            name: "rapidws-tokio-wss",
            echo: examples.join("echo"),
            args: &[],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: true,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        },
    ]
}

/// Every server the harness knows, given where the binaries were built.
pub fn all(repo: &Path, harness_bin: &Path, go_bin: &Path) -> Vec<Server> {
    let examples = repo.join("target/release/examples");
    let mut servers = rapidws(&examples, Some(harness_bin));
    servers.extend([Server {
        name: "raw-tcp-echo",
        echo: harness_bin.join("raw-tcp-echo"),
        args: &[],
        deflate_args: None,
        push: None,
        path: "/",
        raw: true,
        tls: false,
        mux: false,
        h3: None,
        fanout: None,
        bus: None,
    }]);
    // gws, quickws and gorilla accept permessage-deflate with `-deflate`
    // (settings in each one's main.go): they are the compression peers. The
    // other baselines are not set up for it and sit out scenario 7.
    let go_deflate: Option<&'static [&'static str]> = Some(&["--deflate"]);
    for (name, bin, deflate_args) in [
        ("fastwebsockets", harness_bin.join("fastwebsockets"), None),
        (
            "tokio-websockets",
            harness_bin.join("tokio-websockets"),
            None,
        ),
        ("tokio-tungstenite", harness_bin.join("tungstenite"), None),
        ("gws", go_bin.join("gws"), go_deflate),
        ("quickws", go_bin.join("quickws"), go_deflate),
        ("nbio", go_bin.join("nbio"), None),
        ("gorilla", go_bin.join("gorilla"), go_deflate),
        ("gobwas", go_bin.join("gobwas"), None),
    ] {
        servers.push(Server {
            name,
            echo: bin.clone(),
            args: &[],
            deflate_args,
            push: Some(bin),
            path: "/",
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        });
    }
    // Scenario 9's Go peers: gws's Broadcaster (frames a message once for
    // all receivers), and nbio, which has no pub/sub: a loop over the
    // topic's connections.
    for server in servers.iter_mut() {
        match server.name {
            "gws" => server.fanout = Some((go_bin.join("gws-fanout"), &[])),
            "nbio" => server.fanout = Some((go_bin.join("nbio-fanout"), &[])),
            _ => {}
        }
    }
    // The axum peers: axum's own ws (tokio-tungstenite
    // underneath) and sockudo-ws's axum integration, at `/ws` of an
    // `axum::serve` app like rapidws-axum's.
    for (name, bin) in [
        ("axum-ws", harness_bin.join("axum-ws")),
        ("sockudo-axum", harness_bin.join("sockudo-axum")),
    ] {
        servers.push(Server {
            name,
            echo: bin.clone(),
            args: &[],
            deflate_args: None,
            push: Some(bin),
            path: "/ws",
            raw: false,
            tls: false,
            // sockudo-ws's `PubSub` is scenario 9's Rust peer.
            mux: false,
            h3: None,
            fanout: (name == "sockudo-axum")
                .then(|| (harness_bin.join("sockudo-fanout"), &[] as &[&str])),
            bus: None,
        });
    }
    // WebSockets over HTTP/3: rapidws's h3_echo (RFC 9220) and
    // sockudo-ws's HTTP/3 server, which takes only its own dialect.
    for (name, bin, dialect) in [
        ("rapidws-h3", examples.join("h3_echo"), "rfc9220"),
        ("sockudo-h3", harness_bin.join("sockudo-h3"), "sockudo"),
    ] {
        servers.push(Server {
            name,
            echo: bin,
            args: &[],
            deflate_args: None,
            push: None,
            path: "/ws",
            raw: false,
            tls: true,
            mux: false,
            h3: Some(dialect),
            fanout: None,
            bus: None,
        });
    }
    // The wss peers: tokio-websockets over tokio-rustls, gws over Go's
    // crypto/tls (`--tls-cert`/`--tls-key`).
    for (name, bin) in [
        ("tokio-websockets-wss", harness_bin.join("tokio-websockets")),
        ("gws-wss", go_bin.join("gws")),
    ] {
        servers.push(Server {
            name,
            echo: bin,
            args: &[],
            deflate_args: None,
            push: None,
            path: "/",
            raw: false,
            tls: true,
            mux: false,
            h3: None,
            fanout: None,
            bus: None,
        });
    }
    // Scenario 11: the bus (`notify_bus`), Centrifugo's client protocol on
    // rapidws (`centrifugo_compat`) and Centrifugo itself, each publishing
    // what comes over HTTP to its WebSocket subscribers.
    for (name, bin, args, path, protocol) in [
        (
            "notify_bus",
            examples.join("notify_bus"),
            &[] as &'static [&'static str],
            "/ws",
            "plain",
        ),
        (
            "centrifugo_compat",
            examples.join("centrifugo_compat"),
            &["--api-key", API_KEY],
            "/connection/websocket",
            "centrifuge",
        ),
        (
            "centrifugo",
            go_bin.join("centrifugo"),
            &[],
            "/connection/websocket",
            "centrifuge",
        ),
    ] {
        servers.push(Server {
            name,
            echo: bin.clone(),
            args: &[],
            deflate_args: None,
            push: None,
            path,
            raw: false,
            tls: false,
            mux: false,
            h3: None,
            fanout: None,
            bus: Some(Bus {
                bin,
                args,
                protocol,
                centrifugo: name == "centrifugo",
            }),
        });
    }
    servers
}

/// How the server should run: plain echo, or echo plus pushes.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    Echo,
    Push {
        size: usize,
        every_us: u64,
        /// On CPU 0 as every server is, or free to run on any CPU (the
        /// stream scenario's unpinned variant).
        pinned: bool,
    },
    /// The fan-out binary (scenario 9).
    Fanout,
    /// The bus, or Centrifugo (scenario 11).
    Bus,
}

/// A started server process, pinned to CPU 0 (unless its role says otherwise).
pub struct Running {
    child: Child,
    pub addr: SocketAddr,
    /// The server's WebSocket path.
    pub path: &'static str,
    /// wss: the certificate the load generator trusts (`--tls-ca`).
    pub tls_ca: Option<PathBuf>,
    /// Over HTTP/3: the dialect the load generator speaks (`--h3`).
    pub h3: Option<&'static str>,
    /// A directory of the runner's own for this server's files (Centrifugo's
    /// config), removed when the server stops.
    scratch: Option<PathBuf>,
}

/// The harness's certificate and key, set once by the runner before any wss
/// server starts.
pub static TLS_IDENTITY: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();

impl Running {
    pub fn start(server: &Server, role: Role) -> io::Result<Running> {
        let addr = rapidws_load::ports::free_addr()?;
        let mut command = Command::new("taskset");
        let pinned = !matches!(role, Role::Push { pinned: false, .. });
        command
            .arg("-c")
            .arg(if pinned { "0".into() } else { all_cpus() });
        let mut tls_ca = None;
        let mut scratch = None;
        match role {
            Role::Echo => {
                command
                    .arg(&server.echo)
                    .args(server.args)
                    .arg("--addr")
                    .arg(addr.to_string());
                // The baselines share one binary for echo and push; pushing is off at 0.
                if server.push.as_ref() == Some(&server.echo) {
                    command.args(["--push-size", "0"]);
                }
                if server.tls {
                    let (cert, key) = TLS_IDENTITY
                        .get()
                        .ok_or_else(|| io::Error::other("no TLS identity made"))?;
                    command
                        .arg("--tls-cert")
                        .arg(cert)
                        .arg("--tls-key")
                        .arg(key);
                    tls_ca = Some(cert.clone());
                }
            }
            Role::Fanout => {
                let (bin, args) = server
                    .fanout
                    .as_ref()
                    .ok_or_else(|| io::Error::other("no fan-out mode"))?;
                command.arg(bin).args(*args);
                command.arg("--addr").arg(addr.to_string());
            }
            Role::Bus => {
                let bus = server
                    .bus
                    .as_ref()
                    .ok_or_else(|| io::Error::other("not a bus"))?;
                if bus.centrifugo {
                    check_centrifugo(&bus.bin)?;
                    let dir = std::env::temp_dir().join(format!(
                        "rapidws-bench-{}-{}",
                        std::process::id(),
                        addr.port()
                    ));
                    std::fs::create_dir_all(&dir)?;
                    let config = dir.join("config.json");
                    std::fs::write(&config, centrifugo_config(addr))?;
                    scratch = Some(dir);
                    command.arg(&bus.bin).arg("--config").arg(&config);
                    // One core's worth of Go, as every server here has one.
                    command.env("GOMAXPROCS", "1");
                } else {
                    command.arg(&bus.bin).args(bus.args);
                    command.arg("--addr").arg(addr.to_string());
                }
            }
            Role::Push { size, every_us, .. } => {
                let push = server
                    .push
                    .as_ref()
                    .ok_or_else(|| io::Error::other("no push mode"))?;
                command.arg(push).args(server.args);
                command.arg("--addr").arg(addr.to_string());
                command.arg("--push-size").arg(size.to_string());
                command.arg("--push-every-us").arg(every_us.to_string());
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        command.env("RUST_LOG", "warn");
        let child = command.spawn().map_err(|e| {
            if let Some(dir) = &scratch {
                let _ = std::fs::remove_dir_all(dir);
            }
            io::Error::other(format!("{}: {e}", server.name))
        })?;
        let mut running = Running {
            child,
            addr,
            path: server.path,
            tls_ca,
            h3: server.h3,
            scratch,
        };
        running.wait_ready()?;
        Ok(running)
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "server exited at start: {status}"
                )));
            }
            // A UDP port answers no probe: an HTTP/3 server is ready once
            // its socket is bound (as /proc/net/udp shows).
            if self.h3.is_some() {
                if udp_bound(self.addr) {
                    std::thread::sleep(Duration::from_millis(300));
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                // Let the server settle after the probe connection.
                std::thread::sleep(Duration::from_millis(300));
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other("server did not listen within 10 s"))
    }

    /// User plus system CPU seconds of all threads so far.
    pub fn cpu_secs(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
        (ticks(11) + ticks(12)) as f64 / clock_ticks_per_sec()
    }

    /// `VmRSS` and `VmHWM` (peak) in bytes.
    pub fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Every CPU (`0-N`), for a process that must not be pinned.
pub fn all_cpus() -> String {
    let count = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("0-{}", count - 1)
}

/// Whether a UDP socket is bound to `addr` (IPv4), from /proc/net/udp.
fn udp_bound(addr: SocketAddr) -> bool {
    let SocketAddr::V4(v4) = addr else {
        return false;
    };
    // The local address as the kernel prints it: the IPv4 address's bytes
    // as one little-endian hex word, then the port.
    let wanted = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|table| {
        table
            .lines()
            .skip(1)
            .any(|line| line.split_whitespace().nth(1) == Some(wanted.as_str()))
    })
}
