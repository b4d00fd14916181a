//! The model router: three OpenAI-compatible providers on loopback, two
//! models each, a breaker per (provider, model) under one per provider,
//! server-sent events streamed through a hyper gateway to its clients, and
//! failover in the providers' order. The same outages run twice at once,
//! against separate copies of everything: with every breaker disabled (the
//! same pipeline, the breakers out of it), and with them.
//!
//! `cargo run --release -p model-router` (about 8 seconds, once built).
//!
//! Times are scaled: the 500 ms timeout stands for a provider's 30 s. The
//! wiring is `src/gateway.rs`, which the README shows as its gateway
//! section; `tests/loopback/model_router.rs` runs this scenario.

mod chart;
mod gateway;
mod providers;
mod scenario;

use std::path::Path;

use scenario::{Answer, Run, PHASE, PHASES};

const CONVERSATIONS: usize = 24;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Built by hand rather than with `#[tokio::main]`: no proc macros to
    // compile, which keeps the cold build short.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "Model router: {CONVERSATIONS} conversations through a gateway over providers \
         {:?}, models {:?}, run twice at once (breakers disabled, and enabled).\n\
         Each phase lasts {:.1} s; the timeout inside each breaker is {} ms (a provider's 30 s, scaled).\n",
        scenario::PROVIDERS,
        scenario::MODELS,
        PHASE.as_secs_f64(),
        gateway::TIMEOUT.as_millis(),
    );
    println!("[ 0.0s] {}", PHASES[0]);
    let (without, with) = runtime.block_on(scenario::run(CONVERSATIONS));
    println!();
    print!("{}", table(&without, &with));

    // The workspace's `target`, two levels up from this package.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2);
    let path = root
        .unwrap_or(Path::new("."))
        .join("target/model-router.svg");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, chart::svg(&without, &with))?;
    println!("\nChart: {}", path.display());
    Ok(())
}

/// A table row: its label, and its figure for a run.
type Row = (&'static str, fn(&Run) -> String);

/// The two runs side by side, as a Markdown table.
pub fn table(without: &Run, with: &Run) -> String {
    let rows: [Row; 8] = [
        ("requests answered with a whole stream", |r| {
            r.count(Answer::Streamed).to_string()
        }),
        ("requests that waited out the timeout", |r| {
            r.waited().to_string()
        }),
        ("calls the sick provider (alpha) received", |r| {
            r.sick_received.to_string()
        }),
        ("probes", |r| r.probes.to_string()),
        ("503 when every provider was out", |r| {
            r.count(Answer::AllOut).to_string()
        }),
        ("streams held until their client gave up", |r| {
            r.given_up().to_string()
        }),
        ("failed or broken-off streams", |r| {
            r.count(Answer::Failed).to_string()
        }),
        ("p50 time to a whole stream during the outages", |r| {
            format!("{} ms", r.p50_during_outage().as_millis())
        }),
    ];
    let mut out = String::from("| | breakers disabled | breakers |\n| --- | ---: | ---: |\n");
    for (label, figure) in rows {
        out.push_str(&format!(
            "| {label} | {} | {} |\n",
            figure(without),
            figure(with)
        ));
    }
    out
}
