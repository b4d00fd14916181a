//! How the open period grows after a probe, on paused time, through the
//! layer as a client calls it: a probe its caller dropped reopens the
//! breaker for the same period (never hands its turn straight on), and a
//! failed probe that said when to come back sets the next period to that,
//! while backoff grows only the periods the breaker chose itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
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
    breaker.trip("hung", None);
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

#[tokio::test(start_paused = true)]
async fn a_pushback_sets_the_next_period_and_does_not_double() {
    let breaker = breaker(SECOND);
    let pushback = Arc::new(AtomicUsize::new(1));
    let asks = pushback.clone();
    let service = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(service_fn(move |_: Request<()>| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            let secs = asks.load(Ordering::SeqCst);
            if secs > 0 {
                let value = secs.to_string().parse().unwrap();
                response.headers_mut().insert("retry-after", value);
            }
            async move { Ok::<_, BoxError>(response) }
        }));
    pushback.store(2, Ordering::SeqCst);
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.retry_after(), Some(2 * SECOND));
    // Each failed probe asks for 2 s again: 2 s each time, not 4, 8, 16.
    for _ in 0..3 {
        advance(2 * SECOND).await;
        let _ = service.clone().oneshot(Request::new(())).await;
        assert_eq!(breaker.retry_after(), Some(2 * SECOND));
    }
    // Without a pushback, the breaker's own periods grow from its cooldown.
    pushback.store(0, Ordering::SeqCst);
    advance(2 * SECOND).await;
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.retry_after(), Some(2 * SECOND));
    advance(2 * SECOND).await;
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.retry_after(), Some(4 * SECOND));
}
