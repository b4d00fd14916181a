//! A registry of breakers served over HTTP: `/metrics` for Prometheus and
//! `/snapshot` as JSON, read from the breakers the requests go through.
//!
//! `cargo run --example registry_http --all-features` (features `serde` and
//! `metrics`): loads `examples/providers.toml` (or the file after
//! `--config`), serves on a free port of 127.0.0.1, sends simulated traffic
//! to five models through a [`KeyedLayer`] (two of them down, so their
//! breakers trip), fetches its own pages and prints them, and stops after a
//! few seconds. With `--serve` it keeps serving until Ctrl-C, for `curl` or
//! a Prometheus scrape.
//!
//! The wiring is `registry_http/app.rs`, which `tests/registry_http.rs`
//! starts on a loopback port too.
//!
//! [`KeyedLayer`]: tower_circuit_breaker::registry::KeyedLayer

#[path = "registry_http/app.rs"]
mod app;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use http::Method;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tower::BoxError;

/// How long the demo serves before it stops by itself.
const SERVE_FOR: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let mut serve_until_ctrl_c = false;
    let mut config = app::providers_path().to_path_buf();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve" => serve_until_ctrl_c = true,
            "--config" => config = PathBuf::from(args.next().ok_or("--config needs a path")?),
            other => {
                return Err(
                    format!("unknown argument {other:?}; try --serve, --config PATH").into(),
                )
            }
        }
    }

    let configs = app::load(&config)?;
    println!(
        "loaded {}: a default and {} keys of their own",
        config.display(),
        configs.keys().len()
    );
    let registry = app::registry(&configs);
    let prometheus = app::prometheus();

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving http://{addr}/metrics and http://{addr}/snapshot");
    let (stop, stopped) = oneshot::channel::<()>();
    let app = app::App {
        registry: registry.clone(),
        prometheus,
    };
    let server = tokio::spawn(app::serve(listener, app, async {
        let _ = stopped.await;
    }));

    let traffic = app::drive_traffic(&registry).await?;
    println!(
        "\n{} rounds of traffic, one request per model each:",
        app::ROUNDS
    );
    println!("  {:<20} {:>8} {:>8}", "model", "answered", "refused");
    for (model, tally) in &traffic.by_model {
        println!("  {model:<20} {:>8} {:>8}", tally.answered, tally.refused);
    }
    for (breaker, refused) in &traffic.refused_by {
        println!("  refused by breaker {breaker:?}: {refused}");
    }

    let (_, snapshot) = app::send(addr, Method::GET, "/snapshot").await?;
    let snapshot: serde_json::Value = serde_json::from_str(&snapshot)?;
    println!("\nGET /snapshot, in short:");
    println!(
        "  {:<20} {:<10} {:>14} {:>6} {:>9} {:>8} {:>9}",
        "breaker", "state", "retry_after_ms", "calls", "failures", "ignored", "rejected"
    );
    for (key, s) in snapshot.as_object().into_iter().flatten() {
        let counts = &s["counts"];
        println!(
            "  {key:<20} {:<10} {:>14} {:>6} {:>9} {:>8} {:>9}",
            s["state"].as_str().unwrap_or("?"),
            s["retry_after_ms"].to_string(),
            counts["calls"].to_string(),
            counts["failures"].to_string(),
            counts["ignored"].to_string(),
            counts["rejected"].to_string(),
        );
    }
    if let Some(gpt_x) = snapshot.get("openai/gpt-x") {
        println!(
            "\nGET /snapshot, \"openai/gpt-x\":\n{}",
            serde_json::to_string_pretty(gpt_x)?
        );
    }

    let (_, metrics) = app::send(addr, Method::GET, "/metrics").await?;
    println!("\nGET /metrics, the series of \"openai/gpt-x\":");
    for line in metrics.lines() {
        if line.contains("breaker=\"openai/gpt-x\"") {
            println!("  {line}");
        }
    }

    if serve_until_ctrl_c {
        println!("\nserving http://{addr}/ until Ctrl-C");
        tokio::signal::ctrl_c().await?;
    } else {
        println!("\nserving for {SERVE_FOR:?} more (--serve to keep serving)");
        tokio::time::sleep(SERVE_FOR).await;
    }
    let _ = stop.send(());
    server.await??;
    println!("stopped");
    Ok(())
}
