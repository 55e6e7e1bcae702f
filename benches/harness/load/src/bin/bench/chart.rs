//! A small SVG bar chart, one panel per scenario, written without a plotting
//! library: a few rectangles and labels are all a reader needs at a glance.

use std::fmt::Write;

pub struct Panel {
    pub title: String,
    pub lower_is_better: bool,
    /// (server, value), any order; drawn best first.
    pub bars: Vec<(String, f64)>,
}

const WIDTH: f64 = 1200.0;
const COLUMNS: usize = 2;
const PANEL_WIDTH: f64 = WIDTH / COLUMNS as f64;
const LABEL: f64 = 140.0;
const BAR: f64 = 18.0;
const GAP: f64 = 6.0;
const HEAD: f64 = 34.0;

fn color(server: &str) -> &'static str {
    match server {
        s if s.starts_with("rapidws") => "#d9480f",
        "raw-tcp-echo" => "#868e96",
        "fastwebsockets" | "tokio-websockets" | "tokio-tungstenite" => "#1c7ed6",
        _ => "#2f9e44",
    }
}

fn format_value(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v >= 100.0 => format!("{v:.0}"),
        v => format!("{v:.2}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn svg(panels: &[Panel]) -> String {
    let panel_height = |panel: &Panel| HEAD + panel.bars.len() as f64 * (BAR + GAP) + 16.0;
    let rows: Vec<f64> = panels
        .chunks(COLUMNS)
        .map(|row| row.iter().map(panel_height).fold(0.0, f64::max))
        .collect();
    let height: f64 = rows.iter().sum::<f64>() + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let legend = [
        ("rapidws", "#d9480f"),
        ("Rust peers", "#1c7ed6"),
        ("Go peers", "#2f9e44"),
        ("raw TCP echo", "#868e96"),
    ];
    for (i, (name, fill)) in legend.iter().enumerate() {
        let x = 20.0 + i as f64 * 150.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="12" width="12" height="12" fill="{fill}"/><text x="{}" y="22">{name}</text>"#,
            x + 18.0
        );
    }
    let mut top = 40.0;
    for (row, row_height) in panels.chunks(COLUMNS).zip(&rows) {
        for (column, panel) in row.iter().enumerate() {
            draw_panel(&mut out, panel, column as f64 * PANEL_WIDTH, top);
        }
        top += row_height;
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, panel: &Panel, left: f64, top: f64) {
    let mut bars: Vec<&(String, f64)> = panel.bars.iter().filter(|(_, v)| v.is_finite()).collect();
    bars.sort_by(|a, b| {
        let order = a.1.total_cmp(&b.1);
        if panel.lower_is_better {
            order
        } else {
            order.reverse()
        }
    });
    let max = bars
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let better = if panel.lower_is_better {
        "lower is better"
    } else {
        "higher is better"
    };
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" font-weight="bold">{} <tspan font-weight="normal" fill="#666">({better})</tspan></text>"##,
        left + 10.0,
        top + 20.0,
        escape(&panel.title)
    );
    let span = PANEL_WIDTH - LABEL - 80.0;
    for (i, (server, value)) in bars.iter().enumerate() {
        let y = top + HEAD + i as f64 * (BAR + GAP);
        let width = (value / max * span).max(1.0);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><rect x="{}" y="{y}" width="{width:.1}" height="{BAR}" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            left + LABEL - 6.0,
            y + 13.0,
            escape(server),
            left + LABEL,
            color(server),
            left + LABEL + width + 4.0,
            y + 13.0,
            format_value(*value)
        );
    }
}
