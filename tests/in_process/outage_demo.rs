//! The outage demo's scenario (`examples/outage/src/scenario.rs`, the same code
//! `cargo run -p outage-demo` runs over HTTP), here with in-process
//! upstreams on paused time, and its headline checked.
//!
//! The headline, exactly: without the breaker, every conversation waits out
//! the timeout once per timeout-length of outage, so the waits grow with the
//! number of conversations *and* with the outage's length. With the breaker,
//! a conversation waits out the timeout at most once, while the breaker is
//! still learning (every conversation in flight when the primary degraded
//! is caught; the breaker cannot know before the first `threshold` of them
//! time out), plus up to `threshold - 1` second requests sent before it
//! trips; after it opens, only its probes wait, and their number depends on
//! the outage's length and the cooldown, not on the number of conversations.

#[path = "../../examples/outage/src/scenario.rs"]
mod scenario;

use std::io;
use std::sync::Arc;

use tower::util::BoxCloneService;
use tower::{service_fn, BoxError};

use scenario::{Provider, Report, Served, Timing, Upstream};

/// A provider reached in process: the same `answer` the HTTP server runs.
fn in_process(provider: Arc<Provider>) -> io::Result<Upstream> {
    Ok(BoxCloneService::new(service_fn(move |prompt| {
        let provider = provider.clone();
        async move { Ok::<_, BoxError>(provider.answer(prompt).await) }
    })))
}

async fn run(conversations: usize) -> Report {
    let report = scenario::run(Timing::scaled(), conversations, in_process)
        .await
        .expect("in-process upstreams cannot fail to connect");
    println!("{}", scenario::table(&report));
    report
}

#[tokio::test(start_paused = true)]
async fn with_the_breaker_each_conversation_waits_once_and_then_only_probes_wait() {
    let timing = Timing::scaled();
    let (few, many) = (10, 40);
    let small = run(few).await;
    let large = run(many).await;

    for report in [&small, &large] {
        let (with, n) = (&report.with, report.conversations);
        let probes = with.probes().expect("the breaker run has a breaker") as usize;
        // Discovery: one wait per conversation in flight when the primary
        // degraded, plus at most `threshold - 1` second requests sent before
        // the trip (each needs a recorded failure, and the trip comes at the
        // `threshold`th); then the failed probes.
        let bound = n + timing.threshold as usize - 1 + probes;
        assert!(
            with.waited() <= bound,
            "{n} conversations: {} waits > {bound}",
            with.waited()
        );
        assert!(with.waited_after_open() <= probes);
        assert!(
            with.waited_after_open() >= 1,
            "the outage outlasts a cooldown"
        );
        // Nobody is left without an answer, with or without the breaker.
        assert_eq!(with.success_rate(), 1.0);
        assert_eq!(report.without.success_rate(), 1.0);
        assert!(with.samples.iter().any(|s| s.served == Served::Primary));
    }
    // After the breaker opened, the cost does not depend on the traffic.
    assert_eq!(
        small.with.waited_after_open(),
        large.with.waited_after_open()
    );
    assert_eq!(small.with.probes(), large.with.probes());
}

#[tokio::test(start_paused = true)]
async fn without_the_breaker_waits_grow_with_conversations() {
    let timing = Timing::scaled();
    let small = run(10).await;
    let large = run(40).await;

    // Each conversation waits out the timeout on every request during the
    // outage: at least outage / (timeout + fallback + longest pause) times.
    let cycle = timing.timeout + timing.secondary_latency + timing.think.1;
    let per_conversation = (timing.outage.as_secs_f64() / cycle.as_secs_f64()).floor() as usize;
    for report in [&small, &large] {
        let n = report.conversations;
        assert!(report.without.waited() >= per_conversation * n);
        // Every one of those calls reached the degraded primary and held it.
        assert!(report.without.primary_degraded_calls as usize >= report.without.waited());
        // With the breaker, several times fewer.
        assert!(report.with.waited() * 3 < report.without.waited());
    }
    assert!(large.without.waited() >= 4 * small.without.waited() * 9 / 10);
}
