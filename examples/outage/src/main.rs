//! The outage demo: many conversations through one provider outage, without
//! and with the breaker, over real HTTP.
//!
//! `cargo run --release -p outage-demo` (about 25 seconds, once built).
//!
//! Two local HTTP upstreams play model providers: a primary that turns
//! degraded for a while (it accepts each request and holds it past the
//! client's timeout, the way an overloaded provider does) and a healthy,
//! slightly slower secondary. Fifty conversations send requests in a loop,
//! twice over, at the same time, against separate copies of the upstreams:
//!
//! * **without the breaker**: client → timeout → primary, and only after the
//!   timeout, the secondary;
//! * **with it**: a [`Failover`] over `[breaker(primary), breaker(secondary)]`,
//!   the timeout inside each breaker.
//!
//! Times are scaled down (1 s for about 15 s of a real provider) so that the
//! whole demo takes seconds. It prints the breaker's state changes as they
//! happen, then a table side by side, and writes a chart to
//! `target/outage.svg`. The scenario itself is `src/scenario.rs`, which the
//! crate's `tests/in_process/outage_demo.rs` runs on paused time with
//! in-process upstreams.
//!
//! A package of its own, with only the dependencies the demo needs, so that
//! it builds in a few minutes from cold rather than with every
//! dev-dependency of the crate (benchmarks, property tests, gRPC).
//!
//! [`Failover`]: tower_circuit_breaker::Failover

mod chart;
mod scenario;
mod upstream;

use std::path::Path;
use std::time::Instant as WallClock;

use tower::BoxError;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::{format::Writer, time::FormatTime};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use scenario::{human, Timing};

const CONVERSATIONS: usize = 50;

/// Log lines start with the seconds since the demo started.
struct SinceStart(WallClock);

impl FormatTime for SinceStart {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        write!(w, "[{:>5.1}s]", self.0.elapsed().as_secs_f64())
    }
}

// The runtime is built by hand rather than with `#[tokio::main]`, and the
// log filter is tracing-subscriber's `Targets` rather than its `EnvFilter`:
// neither proc macros nor a regex engine are then compiled, which keeps the
// demo's cold build short.
fn main() -> Result<(), BoxError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(demo())
}

async fn demo() -> Result<(), BoxError> {
    // The breaker's own transition events (WARN on open, INFO otherwise) and
    // the scenario's milestones. RUST_LOG overrides with targets and levels,
    // for example `RUST_LOG=info` to see every fallback the failover makes.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse::<Targets>().ok())
        .unwrap_or_else(|| {
            Targets::new()
                .with_default(tracing::Level::WARN)
                .with_target("outage", tracing::Level::INFO)
                .with_target("tower_circuit_breaker::events", tracing::Level::INFO)
        });
    tracing_subscriber::fmt()
        .with_timer(SinceStart(WallClock::now()))
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .finish()
        .with(filter)
        .init();

    let timing = Timing::scaled();
    println!(
        "Outage demo: {CONVERSATIONS} conversations, run twice at once (without and with the \
         breaker) against local HTTP upstreams.\nTimes are scaled: 1 s here stands for about 15 s \
         of a real provider. Client timeout {}, breaker opens after {} consecutive failures, \
         cooldown {}.\nHealthy for {}, primary degraded for {}, healthy again for {}.\n",
        human(timing.timeout),
        timing.threshold,
        human(timing.cooldown),
        human(timing.warmup),
        human(timing.outage),
        human(timing.tail),
    );

    let client = upstream::client();
    let connect = |provider| Ok(upstream::connect(&client, upstream::serve(provider)?));
    let report = scenario::run(timing, CONVERSATIONS, connect).await?;

    println!();
    print!("{}", scenario::table(&report));
    let (without, with) = (&report.without, &report.with);
    println!(
        "\nWithout the breaker, every request sent during the outage held its conversation for the \
         full timeout:\n{:.1} waits per conversation, one per {} of outage, {} in all, and more \
         with every added conversation.\nWith it, each conversation in flight when the primary \
         degraded waited once, while the breaker\nlearned ({} failures open it); after it opened, \
         only its {} failed probes waited, whatever the traffic.\nThe failover sent everyone else \
         to the secondary at once.",
        without.waited() as f64 / CONVERSATIONS as f64,
        human(timing.timeout),
        without.waited(),
        timing.threshold,
        with.waited_after_open(),
    );

    // The workspace's `target`, two levels up from this package.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2);
    let path = root.unwrap_or(Path::new(".")).join("target/outage.svg");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, chart::svg(&report, &timing))?;
    println!("\nChart: {}", path.display());
    Ok(())
}
