//! Medians over rounds, the tables of BENCHMARKS.md, the target checks and the chart.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::chart::{self, Panel};
use crate::runs::Run;
use crate::scenarios::{
    BUS_VARIANTS, CLIENT_DEPTHS, CLIENT_LIBS, CLIENT_SERVER, DEFLATE_ECHO, DEFLATE_IDLE,
    DEFLATE_IDLE_STEPS, FANOUT_VARIANTS, Measurement, SCENARIOS, STREAM_SERVERS, STREAM_UNPINNED,
    STREAM_VARIANTS, bus_args, client_idle_variant, client_variant, count_label, slope_metric,
};
use crate::servers::{self, CENTRIFUGO_VERSION};

const US: &str = "rapidws-tokio";
/// The io_uring backend, compared with `US`.
const URING: &str = "rapidws-uring";
/// The compression peers, run with their compression on in scenario 7.
const DEFLATE_PEERS: [&str; 3] = ["gws", "quickws", "gorilla"];

/// Medians and spread of one (scenario, variant, server) over its rounds.
#[derive(Default, Debug)]
pub struct Summary {
    pub rounds: usize,
    pub failures: Vec<String>,
    values: BTreeMap<String, Vec<f64>>,
}

impl Summary {
    pub fn median(&self, metric: &str) -> f64 {
        let Some(values) = self.values.get(metric) else {
            return f64::NAN;
        };
        median(values.clone())
    }

    /// The largest value over the rounds (NaN if none).
    fn max(&self, metric: &str) -> f64 {
        let values = self
            .values
            .get(metric)
            .map(Vec::as_slice)
            .unwrap_or_default();
        values
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .reduce(f64::max)
            .unwrap_or(f64::NAN)
    }

    fn range(&self, metric: &str) -> String {
        let values = self
            .values
            .get(metric)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if values.is_empty() {
            "-".into()
        } else {
            format!("{}–{}", num(min), num(max))
        }
    }
}

/// The median of the finite values; NaN if there is none.
fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// `a ÷ b` for `metric` in each round where both servers were measured, in
/// round order. Two servers of one round ran a few seconds apart, under the
/// same background load; on a shared machine whose speed drifts between
/// rounds, the median of these ratios is steadier than the ratio of the
/// medians. (With `--merge`, pair only servers that were run together.)
fn paired_ratios(
    measurements: &[Measurement],
    (scenario, variant): (u8, &str),
    (a, b): (&str, &str),
    metric: &str,
) -> Vec<f64> {
    let value = |server: &str, round: usize| {
        measurements
            .iter()
            .find(|m| {
                m.scenario == scenario
                    && m.variant == variant
                    && m.server == server
                    && m.round == round
                    && m.error.is_none()
            })
            .and_then(|m| m.metrics.get(metric).copied())
    };
    let rounds = measurements
        .iter()
        .map(|m| m.round)
        .max()
        .map_or(0, |r| r + 1);
    (0..rounds)
        .filter_map(|round| Some(value(a, round)? / value(b, round)?))
        .collect()
}

pub type Summaries = BTreeMap<(u8, String, String), Summary>;

pub fn summarize(measurements: &[Measurement]) -> Summaries {
    let mut summaries = Summaries::new();
    for m in measurements {
        let summary = summaries
            .entry((m.scenario, m.variant.clone(), m.server.clone()))
            .or_default();
        summary.rounds += 1;
        match &m.error {
            Some(error) => summary
                .failures
                .push(format!("round {}: {error}", m.round + 1)),
            None => {
                for (metric, value) in &m.metrics {
                    summary
                        .values
                        .entry(metric.clone())
                        .or_default()
                        .push(*value);
                }
            }
        }
    }
    summaries
}

/// Human-readable number: thousands separated, few decimals.
pub fn num(value: f64) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    if value.abs() >= 1000.0 {
        let text = format!("{:.0}", value);
        let (sign, digits) = text
            .strip_prefix('-')
            .map_or(("", text.as_str()), |d| ("-", d));
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        format!("{sign}{grouped}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

fn rows<'a>(summaries: &'a Summaries, scenario: u8, variant: &str) -> Vec<(&'a str, &'a Summary)> {
    summaries
        .iter()
        .filter(|((s, v, _), _)| *s == scenario && v == variant)
        .map(|((_, _, server), summary)| (server.as_str(), summary))
        .collect()
}

fn sorted<'a>(
    mut rows: Vec<(&'a str, &'a Summary)>,
    metric: &str,
    lower_is_better: bool,
) -> Vec<(&'a str, &'a Summary)> {
    // Servers without a figure go last.
    let missing = if lower_is_better {
        f64::INFINITY
    } else {
        f64::NEG_INFINITY
    };
    let key = |summary: &Summary| {
        Some(summary.median(metric))
            .filter(|v| v.is_finite())
            .unwrap_or(missing)
    };
    rows.sort_by(|a, b| {
        let order = key(a.1).total_cmp(&key(b.1));
        if lower_is_better {
            order
        } else {
            order.reverse()
        }
    });
    rows
}

fn failures(out: &mut String, rows: &[(&str, &Summary)]) {
    for (server, summary) in rows {
        for failure in &summary.failures {
            let _ = writeln!(out, "- {server} failed in {failure}");
        }
    }
}

fn echo_table(out: &mut String, summaries: &Summaries, scenario: u8) {
    let rows = sorted(rows(summaries, scenario, ""), "per_sec", false);
    let ours = summaries
        .get(&(scenario, String::new(), US.into()))
        .map(|s| s.median("per_sec"));
    let _ = writeln!(
        out,
        "| server | msgs/s | range | rapidws ÷ this | p50 µs | p99 µs | p99.9 µs | server CPU % | server CPU µs/msg | peak RSS MiB |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (server, s) in &rows {
        let ratio = ours.map_or(f64::NAN, |o| o / s.median("per_sec"));
        let _ = writeln!(
            out,
            "| {server} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            num(s.median("per_sec")),
            s.range("per_sec"),
            format_ratio(ratio),
            num(s.median("p50_us")),
            num(s.median("p99_us")),
            num(s.median("p999_us")),
            num(s.median("server_cpu_pct")),
            num(s.median("cpu_us_per_msg")),
            num(s.median("peak_rss_mib")),
        );
    }
    failures(out, &rows);
}

fn format_ratio(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{ratio:.2}x")
    } else {
        "-".into()
    }
}

fn idle_table(out: &mut String, summaries: &Summaries) {
    let rows = sorted(rows(summaries, 4, ""), "bytes_per_conn_to_10k", true);
    let _ = writeln!(
        out,
        "| server | bytes/conn, 1k→10k (slope) | range | bytes/conn, 0→1k | RSS idle MiB | RSS 1k MiB | RSS 10k MiB | alive after ping |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for (server, s) in &rows {
        let _ = writeln!(
            out,
            "| {server} | {} | {} | {} | {} | {} | {} | {} / {} |",
            num(s.median("bytes_per_conn_to_10k")),
            s.range("bytes_per_conn_to_10k"),
            num(s.median("bytes_per_conn_to_1k")),
            num(s.median("rss_0_mib")),
            num(s.median("rss_1k_mib")),
            num(s.median("rss_10k_mib")),
            num(s.median("alive")),
            num(s.median("connected")),
        );
    }
    failures(out, &rows);
}

/// Scenario 10: every subscriber must be recovered, nothing missing or
/// doubled; the time is from the drop to the last one recovered.
fn storm_table(out: &mut String, summaries: &Summaries) {
    let rows = sorted(rows(summaries, 10, ""), "recover_all_secs", true);
    let _ = writeln!(
        out,
        "| server | recovered | not recovered / unanswered | missing / doubled | s to recover all | range | median s | peak RSS MiB |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for (server, s) in &rows {
        let _ = writeln!(
            out,
            "| {server} | {} | {} / {} | {} / {} | {} | {} | {} | {} |",
            num(s.median("recovered")),
            num(s.median("not_recovered")),
            num(s.median("unanswered")),
            num(s.median("missing")),
            num(s.median("doubled")),
            num(s.median("recover_all_secs")),
            s.range("recover_all_secs"),
            num(s.median("recover_p50_secs")),
            num(s.median("peak_rss_mib")),
        );
    }
    failures(out, &rows);
}

fn handshake_table(out: &mut String, summaries: &Summaries) {
    let rows = sorted(rows(summaries, 5, ""), "per_sec", false);
    let _ = writeln!(
        out,
        "| server | upgrades/s | range | p50 µs | p99 µs | server CPU % | errors |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for (server, s) in &rows {
        let _ = writeln!(
            out,
            "| {server} | {} | {} | {} | {} | {} | {} |",
            num(s.median("per_sec")),
            s.range("per_sec"),
            num(s.median("p50_us")),
            num(s.median("p99_us")),
            num(s.median("server_cpu_pct")),
            num(s.median("errors")),
        );
    }
    failures(out, &rows);
}

fn stream_table(out: &mut String, summaries: &Summaries) {
    let _ = writeln!(
        out,
        "| server | push | RTT avg µs | RTT p50 µs | RTT p99 µs | p99 range | p99 ÷ own no-push p99 | replies missing | pushes/s | push MB/s | server RSS growth MiB | server CPU % |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let base = sorted(rows(summaries, 6, STREAM_VARIANTS[2].0), "p99_us", true);
    for (server, _) in &base {
        let quiet = summaries
            .get(&(6, STREAM_VARIANTS[0].0.into(), server.to_string()))
            .map(|s| s.median("p99_us"));
        let variants = STREAM_VARIANTS.iter().map(|v| v.0).chain([STREAM_UNPINNED]);
        for variant in variants {
            let Some(s) = summaries.get(&(6, variant.into(), server.to_string())) else {
                continue;
            };
            let ratio = quiet.map_or(f64::NAN, |q| s.median("p99_us") / q);
            let _ = writeln!(
                out,
                "| {server} | {variant} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(s.median("avg_us")),
                num(s.median("p50_us")),
                num(s.median("p99_us")),
                s.range("p99_us"),
                format_ratio(ratio),
                num(s.max("missing")),
                num(s.median("pushes_per_sec")),
                num(s.median("push_mb_per_sec")),
                num(s.median("rss_growth_mib")),
                num(s.median("server_cpu_pct")),
            );
            for failure in &s.failures {
                let _ = writeln!(out, "\n- {server} ({variant}) failed in {failure}\n");
            }
        }
    }
}

/// Scenario 7: the deflate echo and, beside it, the same server's idle memory
/// with deflate negotiated; one row per server, fastest echo first.
fn deflate_table(out: &mut String, summaries: &Summaries) {
    let (first, last) = (DEFLATE_IDLE_STEPS[0], DEFLATE_IDLE_STEPS[1]);
    let slope = slope_metric(last);
    let mut servers = sorted(rows(summaries, 7, DEFLATE_ECHO), "per_sec", false);
    for (server, idle) in rows(summaries, 7, DEFLATE_IDLE) {
        if !servers.iter().any(|(s, _)| *s == server) {
            servers.push((server, idle));
        }
    }
    let ours = summaries
        .get(&(7, DEFLATE_ECHO.into(), US.into()))
        .map(|s| s.median("per_sec"));
    let _ = writeln!(
        out,
        "| server | msgs/s | range | rapidws ÷ this | p50 µs | p99 µs | server CPU % | server CPU µs/msg | peak RSS MiB | bytes/idle conn, {}→{} (slope) | range | alive after ping |",
        count_label(first),
        count_label(last)
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let empty = Summary::default();
    for (server, _) in &servers {
        let get = |variant: &str| {
            summaries
                .get(&(7, variant.into(), server.to_string()))
                .unwrap_or(&empty)
        };
        let (echo, idle) = (get(DEFLATE_ECHO), get(DEFLATE_IDLE));
        let ratio = ours.map_or(f64::NAN, |o| o / echo.median("per_sec"));
        let _ = writeln!(
            out,
            "| {server} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            num(echo.median("per_sec")),
            echo.range("per_sec"),
            format_ratio(ratio),
            num(echo.median("p50_us")),
            num(echo.median("p99_us")),
            num(echo.median("server_cpu_pct")),
            num(echo.median("cpu_us_per_msg")),
            num(echo.median("peak_rss_mib")),
            num(idle.median(&slope)),
            idle.range(&slope),
            num(idle.median("alive")),
            num(idle.median("connected")),
        );
    }
    for (server, _) in &servers {
        for variant in [DEFLATE_ECHO, DEFLATE_IDLE] {
            let Some(s) = summaries.get(&(7, variant.into(), server.to_string())) else {
                continue;
            };
            for failure in &s.failures {
                let _ = writeln!(out, "- {server} ({variant}) failed in {failure}");
            }
        }
    }
}

/// The issue-3 targets, checked against the medians.
fn targets(out: &mut String, summaries: &Summaries) {
    let get = |scenario: u8, variant: &str, server: &str, metric: &str| {
        summaries
            .get(&(scenario, variant.into(), server.into()))
            .map_or(f64::NAN, |s| s.median(metric))
    };
    let peers = |scenario: u8| -> Vec<String> {
        summaries
            .keys()
            .filter(|(s, v, server)| {
                *s == scenario
                    && v.is_empty()
                    && !server.starts_with("rapidws")
                    // wss and HTTP/3 rows are not peers for the plain targets.
                    && !server.ends_with("-wss")
                    && !server.ends_with("-h3")
                    && server != "raw-tcp-echo"
            })
            .map(|(_, _, server)| server.clone())
            .collect()
    };
    let best = |scenario: u8, metric: &str, lower: bool| -> (String, f64) {
        peers(scenario)
            .into_iter()
            .map(|p| {
                let v = get(scenario, "", &p, metric);
                (p, v)
            })
            .filter(|(_, v)| v.is_finite())
            .fold((String::from("-"), f64::NAN), |acc, (p, v)| {
                let better = acc.1.is_nan() || if lower { v < acc.1 } else { v > acc.1 };
                if better { (p, v) } else { acc }
            })
    };
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    let _ = writeln!(out, "| target | measured (medians) | |");
    let _ = writeln!(out, "|---|---|---|");
    let ours = get(1, "", US, "per_sec");
    let (peer, peer_rate) = best(1, "per_sec", false);
    let raw = get(1, "", "raw-tcp-echo", "per_sec");
    let _ = writeln!(
        out,
        "| 1: depth-8 echo ≥ 2x the best peer | {} vs {peer} {} = {:.2}x | {} |",
        num(ours),
        num(peer_rate),
        ours / peer_rate,
        verdict(ours / peer_rate >= 2.0)
    );
    let _ = writeln!(
        out,
        "| 1: depth-8 echo ≥ 0.6x raw TCP echo | {} vs {} = {:.2}x | {} |",
        num(ours),
        num(raw),
        ours / raw,
        verdict(ours / raw >= 0.6)
    );
    let ours = get(2, "", US, "cpu_us_per_msg");
    let (peer, peer_cpu) = best(2, "cpu_us_per_msg", true);
    let _ = writeln!(
        out,
        "| 2: server CPU per message ≤ 0.5x the best peer | {:.2} µs vs {peer} {:.2} µs = {:.2}x | {} |",
        ours,
        peer_cpu,
        ours / peer_cpu,
        verdict(ours / peer_cpu <= 0.5)
    );
    let ours = get(4, "", US, "bytes_per_conn_to_10k");
    let _ = writeln!(
        out,
        "| 4: ≤ 1 KiB per idle connection (slope 1k→10k) | {} bytes | {} |",
        num(ours),
        verdict(ours <= 1024.0)
    );
    let ours = get(5, "", US, "per_sec");
    let (peer, peer_rate) = best(5, "per_sec", false);
    let _ = writeln!(
        out,
        "| 5: upgrades/s ahead of every peer | {} vs {peer} {} = {:.2}x | {} |",
        num(ours),
        num(peer_rate),
        ours / peer_rate,
        verdict(ours > peer_rate)
    );
    let quiet = get(6, STREAM_VARIANTS[0].0, US, "p99_us");
    let pushed = get(6, STREAM_VARIANTS[1].0, US, "p99_us");
    let _ = writeln!(
        out,
        "| 6: p99 with 10 KiB pushes ≤ 2x p99 without | {} µs vs {} µs = {:.2}x | {} |",
        num(pushed),
        num(quiet),
        pushed / quiet,
        verdict(pushed / quiet <= 2.0)
    );
}

/// The issue-4 targets: the io_uring backend against the tokio backend. The
/// throughput target is judged on the paired per-round ratios.
fn uring_targets(out: &mut String, summaries: &Summaries, measurements: &[Measurement]) {
    let get = |scenario: u8, server: &str, metric: &str| {
        summaries
            .get(&(scenario, String::new(), server.into()))
            .map_or(f64::NAN, |s| s.median(metric))
    };
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    let _ = writeln!(out, "| target | measured (medians) | |");
    let _ = writeln!(out, "|---|---|---|");
    let (uring, tokio) = (get(1, URING, "per_sec"), get(1, US, "per_sec"));
    let listed = |ratios: &[f64]| {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        each.join(", ")
    };
    let speed = paired_ratios(measurements, (1, ""), (URING, US), "per_sec");
    let paired = median(speed.clone());
    let _ = writeln!(
        out,
        "| 1: depth-8 echo ≥ 1.2x the tokio backend | paired per round: median {paired:.2}x ({}); medians {} vs {} = {:.2}x | {} |",
        listed(&speed),
        num(uring),
        num(tokio),
        uring / tokio,
        verdict(paired >= 1.2)
    );
    let cpu = paired_ratios(measurements, (1, ""), (URING, US), "cpu_us_per_msg");
    let _ = writeln!(
        out,
        "| 1: server CPU per message (no target) | paired per round: median {:.2}x the tokio backend's ({}) | |",
        median(cpu.clone()),
        listed(&cpu)
    );
    let idle = get(4, URING, "bytes_per_conn_to_10k");
    let _ = writeln!(
        out,
        "| 4: ≤ 0.5 KiB per idle connection (slope 1k→10k) | {} bytes (tokio backend: {}) | {} |",
        num(idle),
        num(get(4, US, "bytes_per_conn_to_10k")),
        verdict(idle <= 512.0)
    );
}

/// The server with the highest finite value, or ("-", NaN) if none has one.
fn highest<'a>(values: impl Iterator<Item = (&'a str, f64)>) -> (&'a str, f64) {
    values
        .filter(|(_, v)| v.is_finite())
        .fold(("-", f64::NAN), |best, (p, v)| {
            if best.1.is_nan() || v > best.1 {
                (p, v)
            } else {
                best
            }
        })
}

/// The issue-5 target: each rapidws backend's deflate echo against the best
/// of gws, quickws and gorilla with their compression on, on the medians over
/// rounds; and, with no target, the memory of an idle connection with
/// deflate negotiated.
fn deflate_targets(out: &mut String, summaries: &Summaries) {
    let get = |variant: &str, server: &str, metric: &str| {
        summaries
            .get(&(7, variant.into(), server.into()))
            .map_or(f64::NAN, |s| s.median(metric))
    };
    let (peer, peer_rate) = highest(
        DEFLATE_PEERS
            .iter()
            .map(|&p| (p, get(DEFLATE_ECHO, p, "per_sec"))),
    );
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    let _ = writeln!(out, "| target | measured (medians) | |");
    let _ = writeln!(out, "|---|---|---|");
    for backend in [US, URING] {
        let ours = get(DEFLATE_ECHO, backend, "per_sec");
        let _ = writeln!(
            out,
            "| 7: deflate echo ≥ 1.5x the best of gws, quickws, gorilla ({backend}) | {} vs {peer} {} = {:.2}x | {} |",
            num(ours),
            num(peer_rate),
            ours / peer_rate,
            verdict(ours / peer_rate >= 1.5)
        );
    }
    let slope = slope_metric(DEFLATE_IDLE_STEPS[1]);
    let each = |servers: &[&str]| {
        let figures: Vec<String> = servers
            .iter()
            .map(|&s| format!("{s} {}", num(get(DEFLATE_IDLE, s, &slope))))
            .collect();
        figures.join(", ")
    };
    let _ = writeln!(
        out,
        "| 7: bytes per idle connection with deflate, slope {}→{} (no target) | {}; {} | |",
        count_label(DEFLATE_IDLE_STEPS[0]),
        count_label(DEFLATE_IDLE_STEPS[1]),
        each(&[US, URING]),
        each(&DEFLATE_PEERS)
    );
}

/// The issue-8 targets, at 1 MiB pushes every 500 µs: no reply missing, a
/// request p99 of at most 10 ms, at least the best peer's pushed bytes per
/// second (within 0.1%, see below), and server memory growth within the outbound queue's bound
/// (4 MiB, plus one message over it); at 10 KiB pushes, p99 within 2x of the
/// same server's p99 without pushes. Judged on the medians over rounds
/// (missing: the most in any round).
fn stream_targets(out: &mut String, summaries: &Summaries) {
    // Every server is offered the same pushes (2,000 a second, 2,097 MB/s),
    // and a reader that keeps up receives them all: rates measured over the
    // 10 s of requests then differ by a push or two with where the window
    // falls (0.01% each). Within 0.1% counts as delivering as much.
    const SAME_RATE: f64 = 0.999;
    let (quiet, light, heavy) = (
        STREAM_VARIANTS[0].0,
        STREAM_VARIANTS[1].0,
        STREAM_VARIANTS[2].0,
    );
    let stat = |variant: &str, server: &str, metric: &str, max: bool| {
        summaries
            .get(&(6, variant.into(), server.into()))
            .map_or(
                f64::NAN,
                |s| if max { s.max(metric) } else { s.median(metric) },
            )
    };
    let peers = STREAM_SERVERS.iter().filter(|s| !s.starts_with("rapidws"));
    let (peer, peer_rate) = highest(peers.map(|&p| (p, stat(heavy, p, "push_mb_per_sec", false))));
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    let _ = writeln!(out, "| target | measured | |");
    let _ = writeln!(out, "|---|---|---|");
    for backend in [US, URING] {
        let missing = stat(heavy, backend, "missing", true);
        let p99 = stat(heavy, backend, "p99_us", false);
        let rate = stat(heavy, backend, "push_mb_per_sec", false);
        let growth = stat(heavy, backend, "rss_growth_mib", false);
        let _ = writeln!(
            out,
            "| 6, 1 MiB / 500 µs ({backend}): no reply missing | {} missing (most in a round) | {} |",
            num(missing),
            verdict(missing == 0.0)
        );
        let _ = writeln!(
            out,
            "| 6, 1 MiB / 500 µs ({backend}): request p99 ≤ 10 ms | {} µs | {} |",
            num(p99),
            verdict(p99 <= 10_000.0)
        );
        let _ = writeln!(
            out,
            "| 6, 1 MiB / 500 µs ({backend}): pushed MB/s ≥ the best peer's (within {:.1}%) | {rate:.1} vs {peer} {peer_rate:.1} = {:.4}x | {} |",
            100.0 * (1.0 - SAME_RATE),
            rate / peer_rate,
            verdict(rate >= peer_rate * SAME_RATE)
        );
        let _ = writeln!(
            out,
            "| 6, 1 MiB / 500 µs ({backend}): server RSS growth ≤ the queue bound (4 MiB + one 1 MiB message) | {} MiB | {} |",
            num(growth),
            verdict(growth <= 5.0)
        );
        let (base, pushed) = (
            stat(quiet, backend, "p99_us", false),
            stat(light, backend, "p99_us", false),
        );
        let _ = writeln!(
            out,
            "| 6, 10 KiB / 500 µs ({backend}): p99 ≤ 2x the no-push p99 | {} µs vs {} µs = {:.2}x | {} |",
            num(pushed),
            num(base),
            pushed / base,
            verdict(pushed / base <= 2.0)
        );
        // Unpinned, the Go Stream Benchmark client, against
        // gorilla's push server (that benchmark's own server is on gorilla).
        let (ours, go) = (
            stat(STREAM_UNPINNED, backend, "p99_us", false),
            stat(STREAM_UNPINNED, GO_STREAM, "p99_us", false),
        );
        let _ = writeln!(
            out,
            "| 6, unpinned, Go client ({backend}): request p99 ≤ half {GO_STREAM}'s | {} µs vs {} µs = {:.2}x | {} |",
            num(ours),
            num(go),
            ours / go,
            verdict(ours <= go / 2.0)
        );
        let two = (
            stat(heavy, &format!("{backend}-mux"), "p99_us", false),
            stat(heavy, &format!("{backend}-mux"), "push_mb_per_sec", false),
            stat(heavy, &format!("{backend}-mux"), "missing", true),
        );
        let _ = writeln!(
            out,
            "| 6, 1 MiB / 500 µs, two smux streams ({backend}-mux): request p99 ≤ 1 ms, none missing, pushed MB/s as {backend}'s (within {:.1}%) | {} µs, {} missing, {:.1} vs {:.1} MB/s | {} |",
            100.0 * (1.0 - SAME_RATE),
            num(two.0),
            num(two.2),
            two.1,
            rate,
            verdict(two.0 <= 1000.0 && two.2 == 0.0 && two.1 >= rate * SAME_RATE)
        );
    }
}

/// The Go server the unpinned variant of scenario 6 is judged against.
const GO_STREAM: &str = "gorilla";

pub struct Context<'a> {
    pub machine: &'a str,
    pub command: &'a str,
    /// Seconds of warm-up and measured window of every run.
    pub window: (f64, f64),
    /// The run each scenario's table came from (none: not recorded).
    pub tables: &'a BTreeMap<u8, Run>,
    pub settings: &'a str,
    pub notes: Option<String>,
    pub chart_path: &'a str,
}

/// Scenario 8's table: one row per client library and depth, with the
/// client process's own CPU: how busy its core was, and its cost per message.
fn client_table(out: &mut String, summaries: &Summaries) {
    let _ = writeln!(
        out,
        "| client | depth | msgs/s | range | rapidws ÷ this | p50 µs | p99 µs | server CPU % | client CPU % | client CPU µs/msg |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &depth in &CLIENT_DEPTHS {
        let ours = client_metric(summaries, "rapidws", depth, "per_sec");
        for &lib in &CLIENT_LIBS {
            let variant = client_variant(lib, depth);
            let Some(s) = summaries.get(&(8, variant.clone(), CLIENT_SERVER.into())) else {
                continue;
            };
            let name = variant.split(',').next().unwrap_or(lib);
            let _ = writeln!(
                out,
                "| {name} | {depth} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(s.median("per_sec")),
                s.range("per_sec"),
                format_ratio(ours.unwrap_or(f64::NAN) / s.median("per_sec")),
                num(s.median("p50_us")),
                num(s.median("p99_us")),
                num(s.median("server_cpu_pct")),
                num(s.median("client_cpu_pct")),
                num(s.median("client_cpu_us_per_msg")),
            );
            failures(out, &[(name, s)]);
        }
    }
}

/// Scenario 9's servers, ours first, each variant's rows by rate.
fn fanout_rows<'a>(summaries: &'a Summaries, variant: &str) -> Vec<(&'a str, &'a Summary)> {
    let mut rows: Vec<_> = summaries
        .iter()
        .filter(|((scenario, v, _), _)| *scenario == 9 && v == variant)
        .map(|((_, _, server), summary)| (server.as_str(), summary))
        .collect();
    rows.sort_by(|a, b| b.1.median("per_sec").total_cmp(&a.1.median("per_sec")));
    rows
}

/// Scenario 9's table: one per variant, a row per server.
fn fanout_table(out: &mut String, summaries: &Summaries) {
    for variant in &FANOUT_VARIANTS {
        let rows = fanout_rows(summaries, variant.name);
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "**{}**\n", variant.name);
        let _ = writeln!(
            out,
            "| server | deliveries/s | range | offered/s | rapidws-tokio ÷ this | p50 µs | p99 µs | server CPU % | server CPU µs/delivery | peak RSS MiB | bytes per subscriber |"
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let ours = summaries
            .get(&(9, variant.name.to_string(), "rapidws-tokio".to_string()))
            .map(|s| s.median("per_sec"));
        for (server, s) in &rows {
            let _ = writeln!(
                out,
                "| {server} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(s.median("per_sec")),
                s.range("per_sec"),
                num(s.median("expected_per_sec")),
                format_ratio(ours.unwrap_or(f64::NAN) / s.median("per_sec")),
                num(s.median("p50_us")),
                num(s.median("p99_us")),
                num(s.median("server_cpu_pct")),
                num(s.median("server_cpu_us_per_delivery")),
                num(s.median("peak_rss_mib")),
                num(s.median("bytes_per_subscriber")),
            );
        }
        failures(out, &rows);
        let _ = writeln!(out);
    }
}

/// The fan-out target: in each shape, rapidws (the better backend) at least
/// 3x the best peer's deliveries/s.
fn fanout_targets(out: &mut String, summaries: &Summaries) {
    let _ = writeln!(out, "| target | measured | met |");
    let _ = writeln!(out, "|---|---|---|");
    for variant in &FANOUT_VARIANTS {
        let rows = fanout_rows(summaries, variant.name);
        let best = |ours: bool| {
            rows.iter()
                .filter(|(server, _)| server.starts_with("rapidws") == ours)
                .map(|(server, s)| (*server, s.median("per_sec")))
                .fold(
                    None,
                    |best: Option<(&str, f64)>, (server, rate)| match best {
                        Some((_, r)) if r >= rate => best,
                        _ => Some((server, rate)),
                    },
                )
        };
        let target = format!("{}: ≥ 3x the best peer's deliveries/s", variant.name);
        let (Some((ours, rate)), Some((peer, theirs))) = (best(true), best(false)) else {
            let _ = writeln!(out, "| {target} | not measured | – |");
            continue;
        };
        let ratio = rate / theirs;
        let _ = writeln!(
            out,
            "| {target} | {ours} {} vs {peer} {} = {} | {} |",
            num(rate),
            num(theirs),
            format_ratio(ratio),
            if ratio >= 3.0 { "yes" } else { "no" },
        );
    }
}

/// Scenario 11's servers as `servers::all` lists them (their binaries'
/// names, arguments, paths and protocols), in the table's order: ours,
/// then Centrifugo.
fn bus_servers() -> Vec<servers::Server> {
    let none = std::path::Path::new("");
    let mut all: Vec<_> = servers::all(none, none, none)
        .into_iter()
        .filter(|s| s.bus.is_some())
        .collect();
    all.sort_by_key(|s| (s.name == BUS_BASELINE, s.name != "centrifugo_compat"));
    all
}

/// The server scenario 11 compares with.
const BUS_BASELINE: &str = "centrifugo";

/// Scenario 11: what was run, then a table per shape with each server's
/// figures and its ratios to Centrifugo, then the command lines.
fn bus_section(
    out: &mut String,
    summaries: &Summaries,
    measurements: &[Measurement],
    (warmup, duration): (f64, f64),
) {
    let _ = writeln!(
        out,
        "{} WebSocket subscribers and {} kept-alive HTTP publishers, each publishing its share of the offered rate and waiting for each answer, so a server that answers slowly publishes less (\"publishes/s\"). `notify_bus` is the bus (subscribers at `/ws?topics=`, `POST /publish/<topic>`); `centrifugo_compat` is Centrifugo's client protocol on rapidws's pub/sub and Centrifugo {CENTRIFUGO_VERSION} the original (built from the Go module proxy by `run.sh`, run with `GOMAXPROCS=1`: one core, as every server here), both met by the same client (JSON: connect and subscribe in one frame, `POST /api/publish`). No history on any of them. Payloads are 64 bytes; latency is from the publish's send to the subscriber's read. Each \"÷ Centrifugo\" is the median of the per-round ratios to Centrifugo's figure (the servers of a round run a few seconds apart); \"client CPU\" is the load generator's own, near 100% when its core is the limit.\n",
        num(BUS_VARIANTS[0].shape.subscribers as f64),
        crate::scenarios::BUS_PUBLISHERS
    );
    let servers = bus_servers();
    for variant in &BUS_VARIANTS {
        let name = variant.shape.name;
        let rows: Vec<_> = servers
            .iter()
            .filter_map(|server| {
                let key = (11, name.to_string(), server.name.to_string());
                summaries.get(&key).map(|s| (server, s))
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "**{name}**: {}\n", variant.about);
        let _ = writeln!(
            out,
            "| server | protocol | deliveries/s | range | ÷ Centrifugo | publishes/s (of {}) | p50 ms | p99 ms | p99 ÷ Centrifugo | server CPU % | server CPU µs/delivery | peak RSS MiB | RSS ÷ Centrifugo | client CPU % |",
            num(variant.shape.rate as f64)
        );
        let _ = writeln!(
            out,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let ratio = |server: &str, metric: &str| {
            format_ratio(median(paired_ratios(
                measurements,
                (11, name),
                (server, BUS_BASELINE),
                metric,
            )))
        };
        for (server, s) in &rows {
            let protocol = server.bus.as_ref().map_or("-", |b| b.protocol);
            let _ = writeln!(
                out,
                "| {} | {protocol} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                server.name,
                num(s.median("per_sec")),
                s.range("per_sec"),
                ratio(server.name, "per_sec"),
                num(s.median("published_per_sec")),
                num(s.median("p50_us") / 1000.0),
                num(s.median("p99_us") / 1000.0),
                ratio(server.name, "p99_us"),
                num(s.median("server_cpu_pct")),
                num(s.median("server_cpu_us_per_delivery")),
                num(s.median("peak_rss_mib")),
                ratio(server.name, "peak_rss_mib"),
                num(s.median("client_cpu_pct")),
            );
        }
        let named: Vec<_> = rows.iter().map(|(server, s)| (server.name, *s)).collect();
        failures(out, &named);
        let _ = writeln!(out);
    }
    // The command lines, from the list the runner starts the servers from.
    let _ = writeln!(
        out,
        "Each run: a fresh server on a free loopback port (`A`), then the load generator; here the first shape's arguments (the second's: `--subscribers {} --topics {} --rate {}`).\n\n```text",
        BUS_VARIANTS[1].shape.subscribers, BUS_VARIANTS[1].shape.topics, BUS_VARIANTS[1].shape.rate,
    );
    let load = bus_args(&BUS_VARIANTS[0].shape).join(" ");
    for server in &servers {
        let Some(bus) = &server.bus else { continue };
        let bin = bus.bin.file_name().map_or_else(
            || server.name.into(),
            |name| name.to_string_lossy().into_owned(),
        );
        if bus.centrifugo {
            let _ = writeln!(
                out,
                "GOMAXPROCS=1 taskset -c 0 {bin} --config C    # C: the config below, with A's port"
            );
        } else {
            let args: String = bus.args.iter().map(|arg| format!(" {arg}")).collect();
            let _ = writeln!(out, "taskset -c 0 {bin}{args} --addr A");
        }
        let _ = writeln!(
            out,
            "taskset -c 1 rapidws-load fanout --addr A --path {} --protocol {} {load} --warmup {warmup} --duration {duration}",
            server.path, bus.protocol
        );
    }
    let example = std::net::SocketAddr::from(([127, 0, 0, 1], 8000));
    let _ = writeln!(
        out,
        "```\n\nCentrifugo's config (here with port 8000):\n\n```json\n{}\n```",
        servers::centrifugo_config(example)
    );
}

/// Scenario 8's idle memory: one row per client library.
fn client_idle_table(out: &mut String, summaries: &Summaries) {
    let _ = writeln!(out, "\n| client | bytes per idle connection | range |");
    let _ = writeln!(out, "|---|---:|---:|");
    for &lib in &CLIENT_LIBS {
        let variant = client_idle_variant(lib);
        let Some(s) = summaries.get(&(8, variant.clone(), CLIENT_SERVER.into())) else {
            continue;
        };
        let name = variant.split(',').next().unwrap_or(lib);
        let _ = writeln!(
            out,
            "| {name} | {} | {} |",
            num(s.median("client_bytes_per_conn")),
            s.range("client_bytes_per_conn"),
        );
        failures(out, &[(name, s)]);
    }
}

/// The median of `metric` for `lib`'s client at `depth` in scenario 8.
fn client_metric(summaries: &Summaries, lib: &str, depth: usize, metric: &str) -> Option<f64> {
    let key = (8, client_variant(lib, depth), CLIENT_SERVER.to_string());
    summaries.get(&key).map(|s| s.median(metric))
}

/// The clients' target: at each depth, the rapidws client at least 2x the
/// best other client.
fn client_targets(out: &mut String, summaries: &Summaries) {
    let _ = writeln!(out, "| target | measured | met |");
    let _ = writeln!(out, "|---|---|---|");
    for &depth in &CLIENT_DEPTHS {
        let ours = client_metric(summaries, "rapidws", depth, "per_sec");
        let others = CLIENT_LIBS[1..].iter().filter_map(|&lib| {
            client_metric(summaries, lib, depth, "per_sec").map(|rate| (lib, rate))
        });
        let best = others.fold(None, |best: Option<(&str, f64)>, (lib, rate)| match best {
            Some((_, r)) if r >= rate => best,
            _ => Some((lib, rate)),
        });
        let target = format!("client, depth {depth}: ≥ 2x the best other client");
        let (Some(ours), Some((lib, theirs))) = (ours, best) else {
            let _ = writeln!(out, "| {target} | not measured | – |");
            continue;
        };
        let ratio = ours / theirs;
        let _ = writeln!(
            out,
            "| {target} | {} vs {} ({}) = {} | {} |",
            num(ours),
            num(theirs),
            client_variant(lib, depth).split(',').next().unwrap_or(lib),
            format_ratio(ratio),
            if ratio >= 2.0 { "yes" } else { "no" },
        );
    }
}

pub fn markdown(summaries: &Summaries, measurements: &[Measurement], context: &Context) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Generated by the load harness in `benches/harness/` (see its README). Do not edit by hand: run the command below; notes come from `benches/harness/notes.md`.\n"
    );
    let _ = writeln!(out, "```text\n{}\n```\n", context.command);
    let _ = writeln!(out, "{}\n", context.machine);
    let _ = writeln!(
        out,
        "Method: each server is pinned to CPU 0 (`taskset -c 0`), the load generator to CPU 1. Servers are started fresh for every measurement and alternated within each round (order rotated per round). Figures are medians over a row's rounds; each table says how many, and which run measured it (a scenario run again replaces its whole table); \"range\" is min–max. Server CPU and RSS come from `/proc/<pid>/stat` and `/proc/<pid>/status`. {}\n",
        context.settings
    );
    let _ = writeln!(out, "![benchmark chart]({})\n", context.chart_path);
    let _ = writeln!(out, "## Targets (the echo server)\n");
    targets(&mut out, summaries);
    let _ = writeln!(out, "\n## Targets (the io_uring backend)\n");
    uring_targets(&mut out, summaries, measurements);
    let _ = writeln!(out, "\n## Targets (permessage-deflate)\n");
    deflate_targets(&mut out, summaries);
    let _ = writeln!(out, "\n## Targets (requests while the server pushes)\n");
    stream_targets(&mut out, summaries);
    let _ = writeln!(out, "\n## Targets (the client)\n");
    client_targets(&mut out, summaries);
    let _ = writeln!(out, "\n## Targets (pub/sub)\n");
    fanout_targets(&mut out, summaries);
    for scenario in &SCENARIOS {
        let _ = writeln!(out, "\n## {}. {}\n", scenario.number, scenario.title);
        let _ = writeln!(
            out,
            "{}\n",
            table_run(scenario.number, measurements, context)
        );
        match scenario.number {
            1..=3 => echo_table(&mut out, summaries, scenario.number),
            4 => idle_table(&mut out, summaries),
            5 => handshake_table(&mut out, summaries),
            6 => stream_table(&mut out, summaries),
            7 => deflate_table(&mut out, summaries),
            8 => {
                client_table(&mut out, summaries);
                client_idle_table(&mut out, summaries);
            }
            9 => fanout_table(&mut out, summaries),
            10 => storm_table(&mut out, summaries),
            number => {
                let window = context
                    .tables
                    .get(&number)
                    .map_or(context.window, |run| (run.warmup, run.duration));
                bus_section(&mut out, summaries, measurements, window);
            }
        }
    }
    if let Some(notes) = &context.notes {
        let _ = writeln!(out, "\n## Notes\n\n{}", notes.trim());
    }
    out
}

/// The line under a table's heading: the run that measured it and its rounds.
fn table_run(scenario: u8, measurements: &[Measurement], context: &Context) -> String {
    let rounds = crate::rounds::describe(measurements.iter().filter(|m| m.scenario == scenario));
    match context.tables.get(&scenario) {
        Some(run) => run.line(&rounds),
        None => crate::runs::undated(&rounds),
    }
}

pub fn chart(summaries: &Summaries) -> String {
    let panel =
        |scenario: u8, variant: &str, metric: &str, title: &str, lower_is_better: bool| Panel {
            title: title.into(),
            lower_is_better,
            bars: rows(summaries, scenario, variant)
                .into_iter()
                .map(|(server, s)| (server.to_string(), s.median(metric)))
                .collect(),
        };
    chart::svg(&[
        panel(
            1,
            "",
            "per_sec",
            "1. echo 100 x 1 KiB, depth 8: msgs/s",
            false,
        ),
        panel(
            2,
            "",
            "cpu_us_per_msg",
            "2. echo depth 1: server CPU µs/msg",
            true,
        ),
        panel(3, "", "per_sec", "3. echo 500 x 16 KiB: msgs/s", false),
        panel(
            4,
            "",
            "bytes_per_conn_to_10k",
            "4. idle: bytes per connection",
            true,
        ),
        panel(5, "", "per_sec", "5. upgrades/s", false),
        panel(
            6,
            STREAM_VARIANTS[1].0,
            "p99_us",
            "6. request p99 µs under 10 KiB pushes",
            true,
        ),
        panel(
            7,
            DEFLATE_ECHO,
            "per_sec",
            "7. deflate echo 100 x 1 KiB: msgs/s",
            false,
        ),
        panel(
            7,
            DEFLATE_IDLE,
            &slope_metric(DEFLATE_IDLE_STEPS[1]),
            "7. deflate idle: bytes per connection",
            true,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(server: &str, round: usize, per_sec: f64) -> Measurement {
        Measurement {
            scenario: 1,
            variant: String::new(),
            server: server.into(),
            round,
            metrics: BTreeMap::from([("per_sec".to_owned(), per_sec)]),
            error: None,
        }
    }

    #[test]
    fn ratios_pair_servers_round_by_round() {
        let measurements = [
            measured("a", 0, 100.0),
            measured("b", 0, 100.0),
            // A slow round for `b` only: the ratio of medians would be 1.5.
            measured("a", 1, 150.0),
            measured("b", 1, 50.0),
            measured("a", 2, 150.0),
            measured("b", 2, 140.0),
            // `b` missing in this round: no pair.
            measured("a", 3, 999.0),
        ];
        let ratios = paired_ratios(&measurements, (1, ""), ("a", "b"), "per_sec");
        assert_eq!(ratios.len(), 3);
        assert_eq!(ratios[0], 1.0);
        assert_eq!(ratios[1], 3.0);
        assert!((ratios[2] - 150.0 / 140.0).abs() < 1e-12);
        assert!((median(ratios) - 150.0 / 140.0).abs() < 1e-12);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn bus_section_pairs_each_server_with_centrifugo_round_by_round() {
        let name = BUS_VARIANTS[0].shape.name;
        let mut measurements = Vec::new();
        for (server, rates) in [
            ("centrifugo_compat", [300.0, 400.0, 200.0]),
            ("notify_bus", [500.0, 500.0, 500.0]),
            ("centrifugo", [100.0, 100.0, 50.0]),
        ] {
            for (round, rate) in rates.into_iter().enumerate() {
                measurements.push(Measurement {
                    scenario: 11,
                    variant: name.into(),
                    server: server.into(),
                    round,
                    metrics: BTreeMap::from([
                        ("per_sec".to_owned(), rate),
                        ("p99_us".to_owned(), 1e6 / rate),
                    ]),
                    error: None,
                });
            }
        }
        let mut out = String::new();
        bus_section(
            &mut out,
            &summarize(&measurements),
            &measurements,
            (1.0, 5.0),
        );
        // Ratios 3, 4, 4 (median 4), not the medians' 300 ÷ 100.
        assert!(
            out.contains("| centrifugo_compat | centrifuge | 300.0 | 200.0–400.0 | 4.00x |"),
            "{out}"
        );
        assert!(out.contains("| notify_bus | plain | 500.0 |"), "{out}");
        assert!(out.contains("| centrifugo | centrifuge | 100.0 |"), "{out}");
        // Rows in the table's order, Centrifugo last; the second shape
        // was not measured and has no table.
        let at = |row: &str| out.find(row).unwrap_or(usize::MAX);
        assert!(at("| centrifugo_compat |") < at("| notify_bus |"));
        assert!(at("| notify_bus |") < at("| centrifugo |"));
        assert!(!out.contains(BUS_VARIANTS[1].shape.name), "{out}");
        assert!(out.contains("--warmup 1 --duration 5"), "{out}");
        assert!(out.contains("\"port\":8000"), "{out}");
    }

    fn deflate(server: &str, round: usize, variant: &str, metric: &str, value: f64) -> Measurement {
        Measurement {
            scenario: 7,
            variant: variant.into(),
            server: server.into(),
            round,
            metrics: BTreeMap::from([(metric.to_owned(), value)]),
            error: None,
        }
    }

    #[test]
    fn deflate_target_compares_each_backend_with_the_best_peer_median() {
        let mut measurements = Vec::new();
        for (server, rates) in [
            (US, [300.0, 310.0, 290.0]),
            (URING, [200.0, 900.0, 100.0]),
            ("gws", [150.0, 100.0, 200.0]),
            ("quickws", [120.0, 180.0, 110.0]),
            ("gorilla", [90.0, 95.0, 99.0]),
            // Not a compression peer: never the one compared with.
            ("nbio", [999.0, 999.0, 999.0]),
        ] {
            for (round, rate) in rates.into_iter().enumerate() {
                measurements.push(deflate(server, round, DEFLATE_ECHO, "per_sec", rate));
            }
        }
        measurements.push(deflate(US, 0, DEFLATE_IDLE, "bytes_per_conn_to_5k", 700.0));
        let mut out = String::new();
        deflate_targets(&mut out, &summarize(&measurements));
        assert!(
            out.contains("(rapidws-tokio) | 300.0 vs gws 150.0 = 2.00x | **met** |"),
            "{out}"
        );
        assert!(
            out.contains("(rapidws-uring) | 200.0 vs gws 150.0 = 1.33x | **not met** |"),
            "{out}"
        );
        assert!(
            out.contains("rapidws-tokio 700.0, rapidws-uring -; gws -"),
            "{out}"
        );
        let mut table = String::new();
        deflate_table(&mut table, &summarize(&measurements));
        assert!(table.contains("bytes/idle conn, 1k→5k (slope)"), "{table}");
        assert!(table.contains("| rapidws-tokio | 300.0 |"), "{table}");
    }
}
