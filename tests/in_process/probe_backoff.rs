//! How the open period goes on after a probe, on paused time, through the
//! layer as a client calls it: after a probe its caller dropped the breaker
//! opens again for the same period, never handing its turn straight on;
//! after a probe answered with a pushback, for the pushback, while backoff
//! grows only the periods the breaker chooses itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_circuit_breaker::classify::{Outcome, Verdict};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

const SECOND: Duration = Duration::from_secs(1);

fn breaker(cooldown: Duration) -> Breaker {
    Breaker::new(
        Config::builder()
            .name("upstream")
            .trip(ConsecutiveFailures::new(1))
            .cooldown(cooldown)
            .build()
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_probe_its_caller_dropped_reopens_for_the_same_period() {
    let breaker = breaker(10 * SECOND);
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // The upstream hangs: every call waits for ever.
    let service =
        CircuitBreakerLayer::from_breaker(breaker.clone()).layer(service_fn(move |_: ()| {
            seen.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<(), BoxError>>()
        }));
    breaker.open_on_signal("hung", None);
    for round in 0..3 {
        advance(10 * SECOND).await;
        assert_eq!(breaker.state(), State::HalfOpen, "round {round}");
        // The caller gives up on its probe after a second.
        let gave_up = tokio::time::timeout(SECOND, service.clone().oneshot(())).await;
        assert!(gave_up.is_err());
        assert_eq!(breaker.state(), State::Open, "round {round}");
        assert_eq!(
            breaker.snapshot().last_trip,
            Some(TripReason::ProbeCancelled)
        );
        // Open again for the same 10 s, not longer, and not at once.
        assert_eq!(breaker.retry_after(), Some(10 * SECOND));
        let refused = service.clone().oneshot(()).await.unwrap_err();
        assert!(CircuitOpen::find(refused.as_ref()).is_some());
        assert_eq!(calls.load(Ordering::SeqCst), round + 1);
    }
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

/// The upstream answers each call with the pushback (in seconds) the test
/// set, 0 for a success; `u64::MAX` for a failure without one.
fn pushing_back(
    breaker: &Breaker,
    pushback: Arc<std::sync::atomic::AtomicU64>,
) -> impl tower::Service<(), Response = u64, Error = BoxError> + Clone {
    let classify = |result: Result<&u64, &BoxError>| match result {
        Ok(0) => Verdict::new(Outcome::Success),
        Ok(&u64::MAX) | Err(_) => Verdict::new(Outcome::Failure),
        Ok(secs) => Verdict::new(Outcome::Failure).with_retry_after(Duration::from_secs(*secs)),
    };
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(classify)
        .layer(service_fn(move |()| {
            let answer = pushback.load(Ordering::SeqCst);
            async move { Ok::<_, BoxError>(answer) }
        }))
}

#[tokio::test(start_paused = true)]
async fn a_pushback_sets_the_period_and_backoff_grows_only_the_breakers_own() {
    // Own periods: 1, 2, 4, 8, 16 s, 32 s.
    let breaker = breaker(SECOND);
    let pushback = Arc::new(std::sync::atomic::AtomicU64::new(3));
    let service = pushing_back(&breaker, pushback.clone());
    service.clone().oneshot(()).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(3 * SECOND), "the trip");
    for round in 1..=4 {
        advance(breaker.retry_after().unwrap()).await;
        assert_eq!(breaker.state(), State::HalfOpen, "round {round}");
        service.clone().oneshot(()).await.unwrap();
        // Every round answered "come back in 3 s": 3 s each time, where
        // stacking would give 3, 4, 8, 16.
        assert_eq!(breaker.retry_after(), Some(3 * SECOND), "round {round}");
        assert_eq!(breaker.snapshot().failed_probe_rounds, round);
    }
    // The upstream stops saying when: the breaker's own period, grown by
    // the four failed rounds: 1 s * 2^5 after the fifth.
    pushback.store(u64::MAX, Ordering::SeqCst);
    advance(3 * SECOND).await;
    service.clone().oneshot(()).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(32 * SECOND));
    // A success closes it.
    pushback.store(0, Ordering::SeqCst);
    advance(32 * SECOND).await;
    service.clone().oneshot(()).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_pushback_shorter_than_the_cooldown_waits_the_cooldown() {
    let breaker = breaker(10 * SECOND);
    let pushback = Arc::new(std::sync::atomic::AtomicU64::new(2));
    let service = pushing_back(&breaker, pushback);
    service.clone().oneshot(()).await.unwrap();
    assert_eq!(breaker.retry_after(), Some(10 * SECOND), "the trip");
    advance(10 * SECOND).await;
    service.clone().oneshot(()).await.unwrap();
    // Floored by the first period, not grown to 20 s by backoff.
    assert_eq!(breaker.retry_after(), Some(10 * SECOND), "a failed probe");
}
