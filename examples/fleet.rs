//! One breaker across a fleet: four instances of a service share one
//! breaker through Redis.
//!
//! `cargo run --example fleet --features redis` (about 10 seconds).
//!
//! Four instances run in this process, as four replicas of a service would
//! run on four machines: each has its own [`RedisStore`] (its own
//! connections, its own instance name, `i0` to `i3`) and its own breaker
//! named `llm-provider`, attached to its store. Each sends a request every
//! 50 ms to one simulated model provider, which is healthy for a second,
//! fails at once (as a 503 would) for four, then recovers. The demo prints,
//! as they happen:
//!
//! * the failures that open the breaker, and where they happened: three
//!   failures in a row *across the fleet* open it for every instance;
//! * every instance's transitions, with their reason, from
//!   [`Breaker::subscribe`](tower_circuit_breaker::Breaker::subscribe);
//! * each probe: which instance sent it (the one holding the fleet's probe
//!   lock), how it went, and what each instance refused and sent upstream
//!   during the open period it ended;
//!
//! then a table per instance and a summary.
//!
//! Redis: with `REDIS_URL` set, that server, under a key prefix unique to
//! the run; otherwise the demo starts `redis-server` on a free loopback port
//! (persisting nothing) and kills it when it ends, on errors and Ctrl-C too.
//! The scenario is `fleet/scenario.rs`, its bookkeeping `fleet/ledger.rs`,
//! its table and summary `fleet/report.rs`, and the Redis it starts
//! `fleet/local_redis.rs`; `tests/redis/fleet_example.rs` runs the same
//! scenario and checks its figures.

#[path = "fleet/ledger.rs"]
mod ledger;
#[path = "fleet/local_redis.rs"]
mod local_redis;
#[path = "fleet/report.rs"]
mod report;
#[path = "fleet/scenario.rs"]
mod scenario;

use std::process::ExitCode;

use local_redis::LocalRedis;
use report::{summary, table};
use scenario::{redacted, run, Timing, BREAKER};

fn main() -> ExitCode {
    // The breaker's own `tracing` events repeat what the demo prints;
    // RUST_LOG=info shows them.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();

    // Keys under a prefix of this run's own, in case REDIS_URL is shared.
    let prefix = format!("fleet-demo-{}", std::process::id());
    let (url, local) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => match LocalRedis::start() {
            Ok(server) => (server.url(), Some(server)),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };

    let timing = Timing::demo();
    let (from, to) = timing.outage();
    println!(
        "Fleet demo: {} instances, each with its own RedisStore and its own breaker `{BREAKER}`, \
         sharing state through Redis at {}{}.\nBreaker: {} failures in a row across the fleet \
         open it for everyone; open periods of {:.1} s (backoff 1.0); one probe at a time, \
         fleet-wide.\nProvider: healthy until {:.1} s, fails every call until {:.1} s, healthy \
         again after.\n",
        timing.instances,
        redacted(&url),
        if local.is_some() {
            " (started by the demo)"
        } else {
            ""
        },
        timing.threshold,
        timing.cooldown.as_secs_f64(),
        from.as_secs_f64(),
        to.as_secs_f64(),
    );
    let result = runtime.block_on(async {
        tokio::select! {
            report = run(&url, &prefix, timing) => report,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        }
    });
    // Stop the store tasks, then the server.
    drop(runtime);
    drop(local);
    match result {
        Ok(report) => {
            println!();
            print!("{}", table(&report));
            println!();
            print!("{}", summary(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
