//! The chart: every request's time to its answer over the run, one panel
//! per run, the phases as bands. Hand-written SVG.

use std::fmt::Write as _;

use crate::scenario::{Answer, Run, PHASE, PHASES};

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 60.0;
const PANEL: f64 = 200.0;
const TOP: f64 = 80.0;
const GAP: f64 = 60.0;
/// The slowest answer drawn, in seconds; slower ones sit on the top edge.
const CEILING: f64 = 1.0;

/// Both runs, as an SVG document.
pub fn svg(without: &Run, with: &Run) -> String {
    let height = TOP + 2.0 * PANEL + GAP + 50.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="28" font-size="16" font-weight="bold">Time to a whole streamed answer, every request (green: streamed, orange: 503 all out, red: failed)</text>"#
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="50" fill="#555">Phases: {}</text>"##,
        PHASES.join(" → ")
    );
    panel(&mut out, without, "breakers disabled", TOP);
    panel(&mut out, with, "breakers", TOP + PANEL + GAP);
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, run: &Run, title: &str, top: f64) {
    let span = PHASE.as_secs_f64() * PHASES.len() as f64;
    let width = WIDTH - LEFT - 20.0;
    let x = |seconds: f64| LEFT + seconds / span * width;
    let y = |seconds: f64| top + PANEL - seconds.min(CEILING) / CEILING * PANEL;
    for phase in [1.0, 3.0] {
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{PANEL}" fill="#f0f0f0"/>"##,
            x(PHASE.as_secs_f64() * phase),
            x(PHASE.as_secs_f64()) - LEFT
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{width}" height="{PANEL}" fill="none" stroke="#999"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{title}</text>"#,
        top - 8.0
    );
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" fill="#555" text-anchor="end">{CEILING} s</text>"##,
        LEFT - 5.0,
        top + 10.0
    );
    for sample in &run.samples {
        let colour = match sample.answer {
            Answer::Streamed => "#2ca02c",
            Answer::AllOut => "#ff7f0e",
            Answer::Failed => "#d62728",
        };
        let _ = writeln!(
            out,
            r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{colour}" fill-opacity="0.6"/>"#,
            x(sample.sent.as_secs_f64()),
            y(sample.took.as_secs_f64())
        );
    }
}
