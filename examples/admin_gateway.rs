//! A gateway that serves its breakers' admin page while it runs.
//!
//! `cargo run --example admin_gateway --features admin` (stops after two
//! minutes; `-- --for 30` stops after 30 seconds, `-- --for 0` runs until
//! Ctrl-C).
//!
//! The gateway forwards `POST /v1/models/{model}/complete` to a local
//! upstream through one breaker per model, under one per provider, and
//! serves the admin page of those breakers at the address it prints
//! (`http://127.0.0.1:PORT/admin`). Its own traffic asks each model for a
//! completion four times a second: `openai/gpt-x` goes down after a few
//! seconds and stays down (its breaker opens, probes every 20 seconds and
//! opens again), `anthropic/claude` fails for ten seconds out of every
//! thirty. Open the page to watch the rows change colour, the retry-after
//! count down and the transitions arrive as they happen.
//!
//! The wiring is `admin_gateway/app.rs`, which `tests/admin_browser.rs`
//! runs too.

#[path = "admin_gateway/app.rs"]
mod app;

use std::time::Duration;

use tower::BoxError;

/// How often the traffic asks each model.
const ROUND: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let run_for = run_for()?;
    let running = app::start().await?;
    println!("admin page: http://{}/admin", running.gateway);
    match run_for {
        Some(limit) => println!("stopping after {limit:?}"),
        None => println!("running until Ctrl-C"),
    }

    let traffic = traffic(running.gateway, running.upstream.clone());
    let stop = async {
        match run_for {
            Some(limit) => tokio::time::sleep(limit).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::select! {
        result = traffic => result?,
        () = stop => {}
    }
    let mut snapshots = running.registry.snapshot();
    snapshots.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, snapshot) in snapshots {
        println!(
            "{name}: {:?}, {} calls, {} failures, {} refused",
            snapshot.state,
            snapshot.counts.calls,
            snapshot.counts.failures,
            snapshot.counts.rejected
        );
    }
    Ok(())
}

/// Asks every model for a completion each round, the upstream failing
/// as [`app::failing_in`] says.
async fn traffic(gateway: std::net::SocketAddr, upstream: app::Upstream) -> Result<(), BoxError> {
    let mut tick = tokio::time::interval(ROUND);
    for round in 0.. {
        tick.tick().await;
        let failing = app::failing_in(round);
        for model in app::MODELS {
            upstream.set_failing(model, failing.contains(&model));
            app::complete_via(gateway, model).await?;
        }
    }
    Ok(())
}

/// `--for SECONDS` (0: until Ctrl-C); two minutes without it.
fn run_for() -> Result<Option<Duration>, BoxError> {
    let mut args = std::env::args().skip(1);
    let mut seconds = 120;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--for", Some(value)) => {
                seconds = value
                    .parse()
                    .map_err(|_| format!("--for takes whole seconds, not {value:?}"))?;
            }
            _ => return Err(format!("unknown argument {arg:?}; try --for SECONDS").into()),
        }
    }
    Ok((seconds > 0).then(|| Duration::from_secs(seconds)))
}
