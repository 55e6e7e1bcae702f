//! The benchmark runner: starts every server in turn (pinned to CPU 0), drives
//! it with `rapidws-load` (pinned to CPU 1), and writes BENCHMARKS.md, the
//! chart and the raw per-round results. Use `benches/harness/run.sh`, which
//! builds everything first.

mod chart;
mod client;
mod report;
mod rounds;
mod runs;
mod scenarios;
mod servers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser;
use scenarios::{Measurement, SCENARIOS, Settings};

#[derive(Parser, Debug)]
#[command(about = "Runs the load harness scenarios and writes BENCHMARKS.md")]
struct Args {
    /// Rounds; every server runs every scenario once per round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Only these servers (comma-separated names), default all.
    #[arg(long, value_delimiter = ',')]
    servers: Vec<String>,
    /// Only these scenarios (comma-separated numbers 1-11), default all.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<u8>,
    /// Warm-up seconds before each measured window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Do not run anything: rebuild the report from the saved results.
    #[arg(long)]
    report_only: bool,
    /// Keep the saved results of the scenarios not run now, and replace the
    /// tables of those run, whole: each table comes from one run, which the
    /// report names under it (with `--servers`, the other servers' rows of a
    /// scenario run now are dropped).
    #[arg(long)]
    merge: bool,
    /// The repository root (default: found from this crate's location).
    #[arg(long)]
    repo: Option<PathBuf>,
    /// Also run the rapidws servers built in this other checkout (its
    /// `target/release/examples`), as `rapidws-tokio@before`,
    /// `rapidws-uring-wss@before` and so on (each named in `--servers`; the
    /// fan-out server too if that checkout's harness was built): before/after
    /// figures from one run.
    #[arg(long, value_name = "REPO")]
    compare: Option<PathBuf>,
    /// The command line to print in the report (default: `run.sh`, or with
    /// `--report-only` the last report's).
    #[arg(long)]
    command: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    rapidws_load::raise_fd_limit();
    let repo = args
        .repo
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.."));
    let harness = repo.join("benches/harness");
    let results_path = harness.join("results/results.json");
    let saved = if args.report_only {
        match load_results(&results_path) {
            Ok(saved) => saved,
            Err(error) => {
                eprintln!("error: cannot read {}: {error}", results_path.display());
                return ExitCode::FAILURE;
            }
        }
    } else {
        run(&args, &repo, &results_path)
    };
    let measurements = &saved.measurements;
    let summaries = report::summarize(measurements);
    // Re-rendered, the report keeps the machine, time and command of the
    // last run (each table's own are in the results).
    let last = std::fs::read_to_string(repo.join("BENCHMARKS.md")).unwrap_or_default();
    let machine = if args.report_only {
        measured_on(&last).unwrap_or_else(|| format!("{}; report written {}.", machine(), now()))
    } else {
        format!("{}; report written {}.", machine(), now())
    };
    let command = match &args.command {
        Some(command) => command.clone(),
        None if args.report_only => last_command(&last).unwrap_or_else(|| RUN.into()),
        None => invoked(),
    };
    let settings = format!(
        "Each measured window is {} s after {} s of warm-up, unless a table says otherwise.",
        saved.duration, saved.warmup
    );
    let context = report::Context {
        machine: &machine,
        command: &command,
        window: (saved.warmup, saved.duration),
        tables: &saved.tables,
        settings: &settings,
        notes: std::fs::read_to_string(harness.join("notes.md")).ok(),
        chart_path: "benches/harness/results/chart.svg",
    };
    let written = std::fs::write(
        repo.join("BENCHMARKS.md"),
        report::markdown(&summaries, measurements, &context),
    )
    .and_then(|()| std::fs::write(harness.join("results/chart.svg"), report::chart(&summaries)));
    if let Err(error) = written {
        eprintln!("error: cannot write the report: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote BENCHMARKS.md and benches/harness/results/chart.svg");
    ExitCode::SUCCESS
}

fn run(args: &Args, repo: &Path, results_path: &Path) -> Saved {
    let bin = repo.join("benches/harness/target/release");
    let tls_dir = repo.join("benches/harness/target/tls");
    match servers::tls_identity(&tls_dir) {
        Ok(identity) => {
            let _ = servers::TLS_IDENTITY.set(identity);
        }
        Err(error) => eprintln!("warning: no TLS certificate, wss servers will fail: {error}"),
    }
    let mut all = servers::all(repo, &bin, &repo.join("benches/harness/target/go"));
    if let Some(before) = &args.compare {
        all.extend(servers::compared(before));
    }
    let servers: Vec<_> = all
        .into_iter()
        .filter(|s| args.servers.is_empty() || args.servers.iter().any(|n| n == s.name))
        .collect();
    let settings = Settings {
        load: client::Load {
            bin: bin.join("rapidws-load"),
            go_stream: repo.join("benches/harness/target/go/streamclient"),
        },
        warmup: args.warmup,
        duration: args.duration,
    };
    let mut saved = Saved {
        warmup: args.warmup,
        duration: args.duration,
        measurements: Vec::new(),
        tables: BTreeMap::new(),
    };
    let running = |scenario: u8| args.scenarios.is_empty() || args.scenarios.contains(&scenario);
    if args.merge {
        match load_results(results_path) {
            Ok(previous) => {
                saved.measurements.extend(
                    previous
                        .measurements
                        .into_iter()
                        .filter(|m| !running(m.scenario)),
                );
                saved.tables = previous.tables;
            }
            Err(error) => eprintln!("note: nothing to merge with ({error})"),
        }
    }
    let this_run = runs::Run {
        when: now(),
        machine: format!("{}.", machine()),
        command: args.command.clone().unwrap_or_else(invoked),
        warmup: args.warmup,
        duration: args.duration,
    };
    for scenario in SCENARIOS.iter().filter(|s| running(s.number)) {
        saved.tables.insert(scenario.number, this_run.clone());
    }
    for round in 0..args.rounds {
        for scenario in SCENARIOS
            .iter()
            .filter(|s| args.scenarios.is_empty() || args.scenarios.contains(&s.number))
        {
            // Rotate the order each round so no server always runs first:
            // among the servers this scenario runs (rotating the whole list
            // by one would keep a scenario's few servers in one order).
            let taking: Vec<_> = servers.iter().filter(|s| scenario.applies_to(s)).collect();
            let count = taking.len();
            for i in 0..count {
                let server = taking[(i + round) % count];
                for measurement in scenario.run(server, round, &settings) {
                    let headline = measurement.headline();
                    eprintln!(
                        "round {} scenario {} {:>18} {:<16} {}",
                        round + 1,
                        scenario.number,
                        server.name,
                        measurement.variant,
                        match (&measurement.error, headline) {
                            (Some(error), _) => format!("FAILED: {error}"),
                            (None, Some(value)) => report::num(value),
                            (None, None) => "ok".into(),
                        }
                    );
                    saved.measurements.push(measurement);
                }
                save_results(results_path, &saved);
            }
        }
    }
    saved
}

/// The saved results: the window of the last run, every measurement, and
/// the run each scenario's table came from.
struct Saved {
    warmup: f64,
    duration: f64,
    measurements: Vec<Measurement>,
    tables: BTreeMap<u8, runs::Run>,
}

fn save_results(path: &Path, saved: &Saved) {
    let values: Vec<_> = saved
        .measurements
        .iter()
        .map(Measurement::to_json)
        .collect();
    let document = serde_json::json!({
        "warmup": saved.warmup,
        "duration": saved.duration,
        "measurements": values,
        "tables": runs::to_json(&saved.tables),
    });
    let text = serde_json::to_string_pretty(&document).expect("serializable");
    if let Err(error) = std::fs::write(path, text) {
        eprintln!(
            "warning: cannot save results to {}: {error}",
            path.display()
        );
    }
}

fn load_results(path: &Path) -> std::io::Result<Saved> {
    let text = std::fs::read_to_string(path)?;
    let document: serde_json::Value = serde_json::from_str(&text).map_err(std::io::Error::other)?;
    let measurements = document["measurements"].as_array().ok_or_else(|| {
        std::io::Error::other("no \"measurements\" list (written by an older runner?)")
    })?;
    Ok(Saved {
        warmup: document["warmup"].as_f64().unwrap_or(f64::NAN),
        duration: document["duration"].as_f64().unwrap_or(f64::NAN),
        measurements: measurements
            .iter()
            .filter_map(Measurement::from_json)
            .collect(),
        tables: runs::from_json(&document["tables"]),
    })
}

/// The command a report prints when none is given.
const RUN: &str = "benches/harness/run.sh";

/// The machine line of a report, if it has one.
fn measured_on(report: &str) -> Option<String> {
    let line = report.lines().find(|line| line.starts_with("Machine: "))?;
    Some(line.to_owned())
}

/// The command a report printed (its first `text` block), if any.
fn last_command(report: &str) -> Option<String> {
    let block = report.split("```text\n").nth(1)?;
    Some(block.split("\n```").next()?.to_owned())
}

/// What `program args` prints, trimmed; `?` if it cannot run.
fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// The time now, as the report prints it.
fn now() -> String {
    output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
}

/// How this run was started: `run.sh` and the arguments it passed on
/// (without `--repo`, which run.sh adds).
fn invoked() -> String {
    let mut words = vec![RUN.to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--repo" {
            args.next();
        } else if !arg.starts_with("--repo=") {
            words.push(arg);
        }
    }
    words.join(" ")
}

/// What the report says about the machine, read from the machine itself.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "?".into());
    format!(
        "Machine: {} CPUs ({cpu}), Linux {}, {}; {}",
        output("nproc", &[]),
        output("uname", &["-r"]),
        output("rustc", &["-V"]),
        output("go", &["version"]),
    )
}
