//! A hyper-util client behind the breaker, against a flaky local upstream.
//!
//! `cargo run --example hyper_client` (about a second).
//!
//! The stack is breaker → `tower::timeout` → hyper-util's legacy client:
//! the timeout sits inside the breaker, so a hanging upstream becomes a
//! failure the breaker records. The upstream (a hyper server on a free port
//! of 127.0.0.1) answers 200, then 503, then hangs; after three failures in
//! a row the breaker opens and refuses without sending (the upstream's
//! request count stops), and once the upstream has recovered and the
//! cooldown has passed, one probe closes it. The breaker's transitions are
//! printed as they happen (its `tracing` events).
//!
//! The wiring is `hyper_client/app.rs`, which `tests/loopback/hyper_client.rs`
//! runs too.

#[path = "hyper_client/app.rs"]
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
        "upstream on {}; timeout {:?}, opens after {} failures in a row, cooldown {:?}",
        upstream.addr(),
        app::TIMEOUT,
        app::THRESHOLD,
        app::COOLDOWN
    );
    app::run(&upstream, &breaker, |step| {
        let answer = match &step.answer {
            Answer::Status(status) => format!("{status}"),
            Answer::TimedOut => "timed out".to_string(),
            Answer::Refused(retry_after) => {
                format!("refused without sending, retry after {retry_after:?}")
            }
            Answer::Failed(err) => format!("failed: {err}"),
        };
        println!(
            "upstream {:<8} GET -> {answer:<46} breaker {:?}, upstream received {}",
            format!("{:?}", step.mode),
            step.state,
            step.received
        );
    })
    .await;
    let counts = breaker.snapshot().counts;
    println!(
        "breaker counts: {} calls sent, {} refused, {} failures, opened {} time(s)",
        counts.calls, counts.rejected, counts.failures, counts.opened
    );
    Ok(())
}
