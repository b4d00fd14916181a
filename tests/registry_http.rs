//! The registry demo's server on a loopback port, asked over real HTTP:
//! `/metrics` and `/snapshot` show the breakers the traffic went through.
//! The wiring is the example's own (`examples/registry_http/app.rs`). In a
//! test binary of its own: it installs the global metrics recorder.
#![cfg(all(feature = "serde", feature = "metrics"))]

#[path = "../examples/registry_http/app.rs"]
mod app;

use std::net::SocketAddr;

use http::{Method, StatusCode};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::BoxError;
use tower_circuit_breaker::registry::Registry;
use tower_circuit_breaker::State;

/// A running server, stopped when dropped or by [`Server::stop`].
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(registry: &Registry<String>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let app = app::App {
            registry: registry.clone(),
            prometheus: app::prometheus(),
        };
        let task = tokio::spawn(app::serve(listener, app, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        app::send(self.addr, Method::GET, path).await.unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        (&mut self.task).await.unwrap().unwrap();
    }
}

/// The value of the series `name{labels}` in a Prometheus text page,
/// whatever the order of the labels.
fn series(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    wanted.sort();
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (line_name, rest) = series.split_once('{').unwrap_or((series, "}"));
            let mut got: Vec<String> = rest
                .strip_suffix('}')?
                .split(',')
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            got.sort();
            (line_name == name && got == wanted).then(|| value.parse().ok())?
        })
}

#[tokio::test]
async fn metrics_and_snapshot_serve_the_breakers_the_traffic_tripped() -> Result<(), BoxError> {
    let configs = app::load(app::providers_path())?;
    let registry = app::registry(&configs);
    let server = Server::start(&registry).await;

    let traffic = app::drive_traffic(&registry).await?;

    // The model that is down tripped its own breaker (three in a row, per
    // providers.toml) and every later request was refused by it.
    let gpt_x = "openai/gpt-x";
    let tally = traffic.by_model[gpt_x];
    assert_eq!(tally.answered, 3);
    assert_eq!(tally.refused, app::ROUNDS as u64 - 3);
    assert_eq!(traffic.refused_by[gpt_x], tally.refused);
    // The local model tripped its provider too, which refused first.
    assert_eq!(traffic.refused_by["local"], app::ROUNDS as u64 - 3);
    assert_eq!(registry.get(&"local".to_string())?.state(), State::Open);
    // Healthy and flaky models never tripped.
    for key in [
        "openai",
        "openai/gpt-x-mini",
        "anthropic",
        "anthropic/claude-z",
    ] {
        assert_eq!(
            registry.get(&key.to_string())?.state(),
            State::Closed,
            "{key}"
        );
    }

    // GET /snapshot: the tripped key is open, with a retry-after and the
    // refusals the request path counted.
    let (status, body) = server.get("/snapshot").await;
    assert_eq!(status, StatusCode::OK);
    let snapshot: Value = serde_json::from_str(&body)?;
    let json = &snapshot[gpt_x];
    assert_eq!(json["name"], gpt_x);
    assert_eq!(json["state"], "open");
    let retry_after_ms = json["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        retry_after_ms > 0 && retry_after_ms <= 33_000,
        "{retry_after_ms} ms, under a 30 s cooldown lengthened by up to 10% jitter"
    );
    assert_eq!(json["counts"]["rejected"], tally.refused);
    assert_eq!(json["counts"]["calls"], tally.answered);
    assert_eq!(json["counts"]["failures"], 3);
    assert_eq!(json["counts"]["opened"], 1);
    assert_eq!(json["last_trip"]["policy"], "consecutive_failures");
    assert_eq!(
        json["policy"]["policy"], "any_of",
        "the config from the file"
    );
    assert_eq!(snapshot["local"]["state"], "open");
    assert_eq!(
        snapshot["local"]["counts"]["rejected"],
        traffic.refused_by["local"]
    );
    // The page reads the same breakers the registry holds.
    let breaker = registry.get(&gpt_x.to_string())?;
    assert_eq!(breaker.snapshot().counts.rejected, tally.refused);
    assert_eq!(
        snapshot.as_object().map(|o| o.len()),
        Some(registry.len()),
        "one entry per breaker"
    );
    // Ignored 400s are counted as ignored, not as failures.
    let mini = &snapshot["openai/gpt-x-mini"]["counts"];
    assert_eq!(mini["failures"], 0);
    assert_eq!(
        mini["ignored"],
        traffic.statuses[&("openai/gpt-x-mini".to_string(), 400)]
    );

    // GET /metrics: one-hot state series and the admitted and refused counts
    // of the same breakers.
    let (status, page) = server.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let state = |breaker: &str, state: &str| {
        series(
            &page,
            "circuit_breaker_state",
            &[("breaker", breaker), ("state", state)],
        )
    };
    for name in [
        "closed",
        "half_open",
        "forced_open",
        "forced_closed",
        "disabled",
    ] {
        assert_eq!(state(gpt_x, name), Some(0.0), "{name}");
    }
    assert_eq!(state(gpt_x, "open"), Some(1.0));
    assert_eq!(state("openai/gpt-x-mini", "closed"), Some(1.0));
    assert_eq!(state("openai/gpt-x-mini", "open"), Some(0.0));
    let calls = |breaker: &str, outcome: &str| {
        series(
            &page,
            "circuit_breaker_calls_total",
            &[("breaker", breaker), ("outcome", outcome)],
        )
    };
    assert_eq!(calls(gpt_x, "admitted"), Some(tally.answered as f64));
    assert_eq!(calls(gpt_x, "rejected"), Some(tally.refused as f64));
    assert_eq!(calls(gpt_x, "failure"), Some(3.0));
    assert_eq!(
        series(
            &page,
            "circuit_breaker_transitions_total",
            &[("breaker", gpt_x), ("from", "closed"), ("to", "open")]
        ),
        Some(1.0)
    );

    server.stop().await;
    Ok(())
}

#[tokio::test]
async fn other_paths_and_methods_are_refused() {
    // No traffic: this test makes no breaker and leaves the metrics alone.
    let registry = app::registry(&app::load(app::providers_path()).unwrap());
    let server = Server::start(&registry).await;

    assert_eq!(server.get("/nowhere").await.0, StatusCode::NOT_FOUND);
    let (status, _) = app::send(server.addr, Method::POST, "/snapshot")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = server.get("/snapshot").await;
    assert_eq!((status, body.trim()), (StatusCode::OK, "{}"));
    let (status, body) = server.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("/metrics") && body.contains("/snapshot"));

    server.stop().await;
}

#[test]
fn providers_file_parses_into_the_demo_registry() {
    let configs = app::load(app::providers_path()).unwrap();
    assert_eq!(configs.max_keys(), Some(1000));
    assert_eq!(app::provider_of("openai/gpt-x").as_deref(), Some("openai"));
    assert_eq!(app::provider_of("openai"), None);
    // Every model the traffic asks has a section of its own but one, which
    // takes the default.
    let own: Vec<&str> = configs.keys().iter().map(|(k, _)| k.as_str()).collect();
    for (model, _) in app::MODELS {
        assert_eq!(
            own.contains(&model),
            model != "anthropic/claude-z",
            "{model}"
        );
    }
}
