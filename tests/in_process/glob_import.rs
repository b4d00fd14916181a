//! One glob import of the crate, with every feature on, beside the crates
//! its integrations are named after: no module of the crate takes their
//! names (`axum`, `tonic`, `serde`, `metrics`, `redis`).
#![cfg(all(
    feature = "axum",
    feature = "tonic",
    feature = "serde",
    feature = "metrics",
    feature = "redis",
    feature = "http-body",
    feature = "tower-http"
))]

use axum::response::IntoResponse;
use metrics::counter;
use serde::Deserialize;
use tonic::Status;
use tower::ServiceExt;
use tower_circuit_breaker::*;

#[derive(Deserialize)]
struct Settings {
    breaker: Config,
}

#[tokio::test(start_paused = true)]
async fn a_glob_import_sits_beside_the_integrated_crates() {
    let settings: Settings =
        serde_json::from_str(r#"{ "breaker": { "name": "search", "cooldown": "5s" } }"#)
            .expect("a valid config");
    let breaker = Breaker::new(settings.breaker);
    breaker.force_open(None);
    let rpc = CircuitBreaker::new(
        tower::service_fn(|_: ()| async { Ok::<_, Status>(()) }),
        &breaker,
    );
    let status = rpc
        .oneshot(())
        .await
        .expect_err("refused while forced open");
    let open = CircuitOpen::take(Box::new(status)).expect("the status holds the refusal");
    assert_eq!(
        open.into_response().status(),
        http::StatusCode::SERVICE_UNAVAILABLE
    );
    counter!("glob_import_checked").increment(1);
    assert_eq!(metrics_facade::state_label(State::Open), "open");
    assert!(serialization::parse_duration("5s").is_ok());
    let _ = classify::TonicClassifier::new();
    let _ = store::redis::RedisStore::builder("redis://127.0.0.1:1");
}
