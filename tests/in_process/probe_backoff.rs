//! How the open period goes on after a probe its caller dropped, on paused
//! time, through the layer as a client calls it: the breaker opens again
//! for the same period, never handing its turn straight on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, ServiceExt};
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
