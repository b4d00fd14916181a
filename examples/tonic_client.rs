//! A tonic client whose channel sits behind the breaker, against a local
//! gRPC server that a `HealthReporter` switches on and off.
//!
//! `cargo run --example tonic_client --features tonic` (under a second).
//!
//! The breaker wraps the `tonic::transport::Channel` itself
//! (`CircuitBreakerLayer::classify(GrpcClassifier::new())`), so it guards
//! every RPC of every generated client on that channel and judges each by
//! its `grpc-status`: at once for a trailers-only error, at the end of the
//! stream otherwise. The channel's transport errors are mapped to
//! `tonic::Status`, which is also what the breaker's refusal becomes:
//! UNAVAILABLE with `grpc-retry-pushback-ms`.
//!
//! The server is `tonic-health`'s `grpc.health.v1.Health`, no protoc
//! needed. Its `Check` reports NOT_SERVING as a *successful* RPC, so a
//! small server-side layer turns "not serving" into the UNAVAILABLE status
//! an unavailable server answers with (see `tonic_client/app.rs`). Two
//! UNAVAILABLE answers open the breaker; it then refuses without sending
//! (the server's RPC count stops); once the server serves again and the
//! cooldown has passed, one probe closes it.
//!
//! The wiring is `tonic_client/app.rs`, which `tests/loopback/tonic_client.rs`
//! runs too.

#[path = "tonic_client/app.rs"]
mod app;
#[path = "common/demo.rs"]
mod demo;

use tower::BoxError;

use app::Answer;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    demo::print_breaker_events();

    let upstream = app::Upstream::start().await?;
    let breaker = app::breaker()?;
    println!(
        "gRPC health server on {}; the breaker opens after {} failures in a row, cooldown {:?}",
        upstream.addr,
        app::THRESHOLD,
        app::COOLDOWN
    );
    app::run(&upstream, &breaker, |step| {
        let answer = match &step.answer {
            Answer::Serving(status) => format!("OK, {}", status.as_str_name()),
            Answer::Status(code, message) => format!("{code:?}: {message}"),
            Answer::Refused(pushback) => format!(
                "refused without sending (Unavailable, pushback {} ms)",
                pushback.as_deref().unwrap_or("?")
            ),
        };
        println!(
            "[server received {}, {}] Check -> {answer}; breaker {:?}",
            step.received,
            if step.serving {
                "serving"
            } else {
                "not serving"
            },
            step.state
        );
    })
    .await?;
    Ok(())
}
