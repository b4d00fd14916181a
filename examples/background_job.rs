//! A background job behind the breaker, without tower: a worker drains a
//! queue of items to a flaky local upstream, asking the breaker before each
//! (`breaker.try_acquire()`) and telling it how the call went (the permit's
//! `finish`). While the upstream fails, the breaker opens after three
//! failures in a row; the worker then stops sending, re-queues what the
//! breaker refuses and waits out its `retry_after`; once the upstream has
//! recovered, one probe closes the breaker and the queue drains.
//!
//! `cargo run --example background_job` (well under a second).
//!
//! The wiring is `background_job/app.rs`, which
//! `tests/loopback/outside_tower_examples.rs` runs too.

#[path = "background_job/app.rs"]
mod app;
#[path = "common/demo.rs"]
mod demo;
#[path = "common/flaky_upstream.rs"]
mod flaky_upstream;

use std::time::Duration;

use tower::BoxError;

use app::Attempt;
use flaky_upstream::FlakyUpstream;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    demo::print_breaker_events();
    let upstream = FlakyUpstream::start().await?;
    let breaker = app::breaker()?;
    upstream.fail(true);
    // The upstream recovers while the breaker is open.
    let recovering = upstream.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        recovering.fail(false);
    });
    let attempts = app::work(&upstream, &breaker, 10, |attempt| match attempt {
        Attempt::Done(item) => println!("item {item}: done"),
        Attempt::Failed(item) => println!("item {item}: the upstream failed; back on the queue"),
        Attempt::Refused(item, ms) => {
            println!("item {item}: refused without sending; waiting {ms} ms")
        }
    })
    .await;
    let counts = breaker.snapshot().counts;
    println!(
        "{} attempts for 10 items; the upstream received {} requests; the breaker refused {}",
        attempts.len(),
        upstream.received(),
        counts.rejected
    );
    Ok(())
}
