//! An axum gateway in front of an upstream, through the breaker.
//!
//! `cargo run --example axum_gateway --features axum` (under a second).
//!
//! The gateway forwards `POST /v1/complete` to a local upstream (another
//! axum app on a free port of 127.0.0.1) through breaker → timeout →
//! hyper client. When the upstream starts failing, its first 503s are
//! forwarded as they are; after three in a row the breaker opens and the
//! gateway answers by itself: the breaker's `CircuitOpen` is returned from
//! the handler and its `IntoResponse` gives `503 Service Unavailable` with
//! `Retry-After` (whole seconds, rounded up) and a short body. The upstream
//! receives nothing more.
//!
//! The wiring is `axum_gateway/app.rs`, which `tests/loopback/axum_gateway.rs`
//! runs too.

#[path = "axum_gateway/app.rs"]
mod app;
#[path = "common/demo.rs"]
mod demo;

use tower::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    demo::print_breaker_events();

    let upstream = app::Upstream::default();
    let breaker = app::breaker()?;
    let (gateway_addr, upstream_addr) = app::start_both(&upstream, &breaker).await?;
    println!(
        "gateway on {gateway_addr} -> upstream on {upstream_addr}; opens after {} failures in a \
         row, cooldown {:?}",
        app::THRESHOLD,
        app::COOLDOWN
    );

    app::run(gateway_addr, &upstream, |step| {
        let retry_after = step
            .answer
            .retry_after
            .as_deref()
            .map(|s| format!(" (Retry-After: {s})"))
            .unwrap_or_default();
        println!(
            "[upstream received {}, {}] POST /v1/complete -> {}{retry_after} {:?}",
            step.received,
            if step.failing { "failing" } else { "healthy" },
            step.answer.status,
            step.answer.body.trim_end(),
        );
    })
    .await?;
    Ok(())
}
