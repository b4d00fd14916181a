//! The chart: every request's latency over time, one panel per run, with the
//! outage and the breaker's states as coloured bands. Hand-written SVG.

use std::fmt::Write as _;
use std::time::Duration;

use tower_circuit_breaker::State;

use crate::scenario::{human, Report, Run, Served, Timing};

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 30.0;
const PANEL: f64 = 230.0;
const TOP: f64 = 115.0;
const GAP: f64 = 70.0;

/// The whole picture, as an SVG document.
pub fn svg(report: &Report, timing: &Timing) -> String {
    let height = TOP + 2.0 * PANEL + GAP + 60.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="28" font-size="17" font-weight="bold">Latency of every request while the primary provider is degraded ({} conversations)</text>"#,
        report.conversations
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="48" fill="#555">Times are scaled: 1 s here stands for about 15 s of a real provider (the {} timeout for 30 s).</text>"##,
        human(timing.timeout)
    );
    legend(&mut out, LEFT, 74.0);
    panel(&mut out, &report.without, timing, TOP);
    panel(&mut out, &report.with, timing, TOP + PANEL + GAP);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds since the start (scaled)</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        height - 15.0
    );
    out.push_str("</svg>\n");
    out
}

fn legend(out: &mut String, x: f64, y: f64) {
    let items = [
        ("dot", "#1f77b4", "answered by the primary"),
        ("dot", "#2ca02c", "answered by the secondary"),
        ("dot", "#d62728", "failed"),
        ("band", "#e4e4e4", "primary degraded"),
        ("band", "#f4b6b0", "breaker open"),
        ("band", "#fbe3a6", "breaker half-open (probing)"),
    ];
    let mut at = x;
    for (kind, colour, label) in items {
        if kind == "dot" {
            let _ = writeln!(
                out,
                r#"<circle cx="{}" cy="{}" r="4" fill="{colour}"/>"#,
                at + 5.0,
                y - 4.0
            );
        } else {
            let _ = writeln!(
                out,
                r#"<rect x="{at}" y="{}" width="10" height="10" fill="{colour}"/>"#,
                y - 9.0
            );
        }
        let _ = writeln!(out, r#"<text x="{}" y="{y}">{label}</text>"#, at + 14.0);
        at += 24.0 + 6.5 * label.len() as f64;
    }
}

fn panel(out: &mut String, run: &Run, timing: &Timing, top: f64) {
    let total = timing.total().as_secs_f64();
    let y_max = timing.timeout.as_secs_f64() * 1.25;
    let plot_width = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + plot_width * (t / total).clamp(0.0, 1.0);
    let y = |latency: f64| top + PANEL * (1.0 - (latency / y_max).clamp(0.0, 1.0));

    // Bands first, dots over them.
    let (from, to) = run.outage;
    band(
        out,
        x(from.as_secs_f64()),
        x(to.as_secs_f64()),
        top,
        "#e4e4e4",
    );
    let mut states = run.transitions.iter().peekable();
    while let Some(&(at, state)) = states.next() {
        let until = states.peek().map_or(timing.total(), |next| next.0);
        let colour = match state {
            State::Open | State::ForcedOpen => "#f4b6b0",
            State::HalfOpen => "#fbe3a6",
            _ => continue,
        };
        band(
            out,
            x(at.as_secs_f64()),
            x(until.as_secs_f64()),
            top,
            colour,
        );
    }

    // The outage's edges, visible through the breaker's bands.
    for (at, label) in [(from, "primary degraded"), (to, "primary recovered")] {
        let at = x(at.as_secs_f64());
        let _ = writeln!(
            out,
            r##"<line x1="{at}" y1="{top}" x2="{at}" y2="{}" stroke="#555" stroke-dasharray="3,3"/><text x="{}" y="{}" fill="#555">{label}</text>"##,
            top + PANEL,
            at + 4.0,
            top + 14.0
        );
    }

    // Axes, ticks and the timeout line.
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">{}: {} requests waited out the timeout</text>"#,
        top - 10.0,
        run.label,
        run.waited()
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PANEL}" fill="none" stroke="#888"/>"##
    );
    let mut second = 0.0;
    while second <= total {
        let _ = writeln!(
            out,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#888"/><text x="{0}" y="{3}" text-anchor="middle">{second}</text>"##,
            x(second),
            top + PANEL,
            top + PANEL + 5.0,
            top + PANEL + 18.0
        );
        second += 2.0;
    }
    let mut latency = 0.0;
    while latency <= y_max + 1e-9 {
        let _ = writeln!(
            out,
            r##"<line x1="{}" y1="{1}" x2="{LEFT}" y2="{1}" stroke="#888"/><text x="{2}" y="{3}" text-anchor="end">{4:.1} s</text>"##,
            LEFT - 5.0,
            y(latency),
            LEFT - 8.0,
            y(latency) + 4.0,
            latency
        );
        latency += 0.5;
    }
    let timeout = y(timing.timeout.as_secs_f64());
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{timeout}" x2="{}" y2="{timeout}" stroke="#d62728" stroke-dasharray="5,4"/><text x="{}" y="{}" fill="#d62728" text-anchor="end">client timeout</text>"##,
        LEFT + plot_width,
        LEFT + plot_width - 4.0,
        timeout - 4.0
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">latency</text>"#,
        top + PANEL / 2.0
    );

    // One dot per request, grouped by colour to keep the file small.
    for (served, colour) in [
        (Served::Primary, "#1f77b4"),
        (Served::Secondary, "#2ca02c"),
        (Served::Failed, "#d62728"),
    ] {
        let _ = writeln!(out, r#"<g fill="{colour}" fill-opacity="0.55">"#);
        for sample in run.samples.iter().filter(|s| s.served == served) {
            // A request that waited out the timeout is drawn larger.
            let radius = if sample.latency >= timing.timeout {
                3.5
            } else {
                1.8
            };
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{radius}"/>"#,
                x(sample.sent.as_secs_f64()),
                y(seconds(sample.latency))
            );
        }
        out.push_str("</g>\n");
    }
}

fn band(out: &mut String, from: f64, to: f64, top: f64, colour: &str) {
    let _ = writeln!(
        out,
        r#"<rect x="{from:.1}" y="{top}" width="{:.1}" height="{PANEL}" fill="{colour}"/>"#,
        (to - from).max(0.0)
    );
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
