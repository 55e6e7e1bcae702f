//! Running the load generator (pinned to CPU 1) against a running server, and
//! reading its JSON lines with a timeout so a stuck run cannot hang the runner.

use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::servers::Running;

/// The load generator binary, and the Go Stream Benchmark client
/// (`go/cmd/streamclient`) for the stream scenario's unpinned variant.
#[derive(Clone, Debug)]
pub struct Load {
    pub bin: PathBuf,
    pub go_stream: PathBuf,
}

/// A load generator process and the JSON lines it prints.
pub struct LoadProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Load {
    pub fn spawn(
        &self,
        server: &Running,
        raw: bool,
        mode: &str,
        args: &[String],
    ) -> io::Result<LoadProcess> {
        let mut command = Command::new("taskset");
        command.args(["-c", "1"]).arg(&self.bin).arg(mode);
        command.arg("--addr").arg(server.addr.to_string());
        if raw {
            command.arg("--raw");
        }
        if server.path != "/" {
            command.arg("--path").arg(server.path);
        }
        if let Some(ca) = &server.tls_ca {
            command.arg("--tls-ca").arg(ca);
        }
        if let Some(dialect) = server.h3 {
            command.arg("--h3").arg(dialect);
        }
        command.args(args);
        start(command)
    }

    /// The Go Stream Benchmark client against `server`, not pinned (as that
    /// benchmark runs it: default GOMAXPROCS, any CPU).
    pub fn spawn_go_stream(&self, server: &Running, args: &[String]) -> io::Result<LoadProcess> {
        let mut command = Command::new(&self.go_stream);
        command
            .arg("-url")
            .arg(format!("ws://{}{}", server.addr, server.path));
        command.args(args);
        start(command)
    }
}

/// Starts a load process whose JSON lines come on stdout.
fn start(mut command: Command) -> io::Result<LoadProcess> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (send, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    Ok(LoadProcess {
        stdin: child.stdin.take(),
        child,
        lines,
    })
}

/// A timed run: the result line, plus the server's CPU time and wall time
/// between the start of the measured window and the result.
pub struct Timed {
    pub result: Value,
    pub server_cpu_secs: f64,
    pub wall_secs: f64,
}

impl LoadProcess {
    /// The next JSON line, or an error after `timeout` or if the process ended.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => serde_json::from_str(&line).map_err(io::Error::other),
            Err(RecvTimeoutError::Timeout) => Err(io::Error::other("load generator timed out")),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait()?;
                Err(io::Error::other(format!("load generator ended: {status}")))
            }
        }
    }

    /// Waits for the line whose `event` is `event`.
    pub fn expect(&mut self, event: &str, timeout: Duration) -> io::Result<Value> {
        let value = self.next(timeout)?;
        if value["event"] == event {
            Ok(value)
        } else {
            Err(io::Error::other(format!("expected {event}, got {value}")))
        }
    }

    /// Reads the "measure" line and the result, sampling the server at both.
    pub fn timed(mut self, server: &Running, timeout: Duration) -> io::Result<Timed> {
        self.expect("measure", timeout)?;
        let (cpu, started) = (server.cpu_secs(), Instant::now());
        let result = self.next(timeout)?;
        let server_cpu_secs = server.cpu_secs() - cpu;
        let wall_secs = started.elapsed().as_secs_f64();
        Ok(Timed {
            result,
            server_cpu_secs,
            wall_secs,
        })
    }

    /// Sends one command line to an `idle` process.
    pub fn command(&mut self, line: &str) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("stdin closed"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }
}

impl Drop for LoadProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
