//! Echo server: sends every text and binary message back with the same opcode.
//!
//! ```text
//! cargo run --release --example echo -- --addr 127.0.0.1:9001 --backend tokio
//! ```
//! `--backend uring` serves with the io_uring backend (Linux 6.0 or later).
//! `--route` puts a `rapidws::route::Router` on the port, handing each
//! HTTP/1 connection to the server through its `Entrance` (the load
//! harness's `*-routed` rows: what routing costs).
//! Logging follows
//! `RUST_LOG` (default `info`). Ctrl-C closes every connection with 1001;
//! SIGTERM closes them with 1012 spread over `--spread-secs` (default 0: at
//! once), and the process exits 0 once they have ended.
//!
//! A deploy that keeps every connection (Linux): start the server with
//! `--handoff-socket /run/echo.sock`, then the new binary with the same
//! arguments and `--take-over /run/echo.sock`; the new process takes the
//! listening socket and every connection (each goes on mid-message if it
//! was), and the old one exits 0. Either `--backend` hands over to either.
//! What cannot move (wss) is closed as SIGTERM closes it.

use std::process::ExitCode;

use clap::Parser;
use rapidws::{HttpResponse, Request};

mod support;

use support::echo::Echo;

#[derive(Parser, Debug)]
#[command(about = "rapidws echo server")]
struct Args {
    #[command(flatten)]
    serve: support::ServeArgs,
    /// Answer requests that are not WebSocket upgrades on the same port: a
    /// demo page at `/` (it connects back and echoes), `ok` at `/healthz`,
    /// 404 elsewhere.
    #[arg(long)]
    http_fallback: bool,
}

/// The demo page: a socket to this server, a text box, the echoes.
const PAGE: &str = include_str!("assets/page.html");

/// The demo page, `/healthz` and 404 for requests that are not upgrades
/// (`--http-fallback`), after `/metrics`.
fn pages(request: &Request<'_>) -> Option<HttpResponse> {
    if let Some(page) = metrics(request) {
        return Some(page);
    }
    Some(match (request.method(), request.path()) {
        ("GET" | "HEAD", "/") => HttpResponse::html(PAGE),
        ("GET" | "HEAD", "/healthz") => HttpResponse::text(200, "ok\n"),
        _ => HttpResponse::text(404, "not found\n"),
    })
}

/// `/metrics` with `--metrics`; nothing else.
fn metrics(request: &Request<'_>) -> Option<HttpResponse> {
    support::metrics_page(request.method(), request.path())
}

fn main() -> ExitCode {
    support::log_to_stderr();
    let args = Args::parse();
    let http = if args.http_fallback { pages } else { metrics };
    support::serve("echo", &args.serve, |_| Echo {
        http,
        ..Echo::anywhere()
    })
}
