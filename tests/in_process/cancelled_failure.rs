//! A call its caller drops after waiting long enough counts as a failure
//! (opt-in, `cancelled_failure_after`), through a single breaker, a keyed
//! one, a streamed body and `Breaker::run`: a timeout outside the breaker
//! is then not invisible. A permit of the two-step form dropped unrecorded
//! stays a cancellation, however long it was held. Paused time.

use std::time::Duration;

use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, ConfigBuilder, State};

const SECOND: Duration = Duration::from_secs(1);

fn config() -> ConfigBuilder {
    crate::common::one_failure_opens("provider")
}

/// A config whose calls given up after `limit` count as failures.
fn failing_after(limit: Duration) -> Config {
    config()
        .cancelled_failure_after(Some(limit))
        .build()
        .unwrap()
}

/// A provider that holds every request.
async fn hold(_: u32) -> Result<u32, BoxError> {
    std::future::pending().await
}

/// One call through `breaker`, given up by its caller after `patience`.
async fn give_up_after(breaker: &Breaker, patience: Duration) {
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone()).layer(service_fn(hold));
    let gave_up = tokio::time::timeout(patience, svc.oneshot(1)).await;
    assert!(gave_up.is_err(), "the provider held the call");
}

#[tokio::test(start_paused = true)]
async fn a_call_given_up_after_the_limit_is_a_failure() {
    let breaker = Breaker::new(failing_after(3 * SECOND));
    give_up_after(&breaker, 5 * SECOND).await;
    let snap = breaker.snapshot();
    assert_eq!((snap.counts.failures, snap.counts.cancelled), (1, 0));
    assert_eq!(snap.state, State::Open, "one hang trips it");
}

#[tokio::test(start_paused = true)]
async fn a_call_given_up_sooner_is_a_cancellation() {
    let breaker = Breaker::new(failing_after(10 * SECOND));
    give_up_after(&breaker, 5 * SECOND).await;
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.counts.failures, snap.counts.cancelled, snap.state),
        (0, 1, State::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_a_call_given_up_is_a_cancellation_however_long_it_waited() {
    let breaker = Breaker::new(config().build().unwrap());
    give_up_after(&breaker, 60 * SECOND).await;
    let snap = breaker.snapshot();
    assert_eq!((snap.counts.failures, snap.counts.cancelled), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_probe_given_up_after_the_limit_is_a_failed_probe() {
    let breaker = Breaker::new(failing_after(3 * SECOND));
    breaker.force_open(Some(SECOND));
    tokio::time::advance(SECOND).await;
    give_up_after(&breaker, 5 * SECOND).await;
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight, snap.counts.failures),
        (State::Open, 0, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_call_given_up_after_the_limit_fails_in_its_key_and_parent() {
    let registry = Registry::<String>::builder()
        .default_config(failing_after(3 * SECOND))
        .parent(|key: &String| key.split_once('/').map(|(p, _)| p.to_string()))
        .build();
    let svc = KeyedLayer::new(registry.clone(), |_: &u32| "alpha/large".to_string())
        .layer(service_fn(hold));
    assert!(tokio::time::timeout(5 * SECOND, svc.oneshot(1))
        .await
        .is_err());
    for key in ["alpha/large", "alpha"] {
        let snap = registry.get(&key.to_string()).unwrap().snapshot();
        assert_eq!(
            (snap.counts.failures, snap.counts.cancelled),
            (1, 0),
            "{key}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_given_up_after_the_limit_is_a_failure() {
    let breaker = Breaker::new(failing_after(3 * SECOND));
    let run = breaker.run(|| hold(1));
    assert!(tokio::time::timeout(5 * SECOND, run).await.is_err());
    assert_eq!(breaker.snapshot().counts.failures, 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_permit_dropped_unrecorded_is_a_cancellation_however_long_it_was_held() {
    let breaker = Breaker::new(failing_after(3 * SECOND));
    let permit = breaker.try_acquire().expect("closed");
    tokio::time::advance(60 * SECOND).await;
    drop(permit);
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.counts.failures, snap.counts.cancelled, snap.state),
        (0, 1, State::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_permit_dropped_unrecorded_is_a_cancelled_probe_however_long_it_was_held() {
    let breaker = Breaker::new(failing_after(3 * SECOND));
    breaker.force_open(Some(SECOND));
    tokio::time::advance(SECOND).await;
    let probe = breaker.try_acquire().expect("half-open: a probe");
    // Past `cancelled_failure_after`, within the probe timeout (60 s).
    tokio::time::advance(10 * SECOND).await;
    drop(probe);
    let snap = breaker.snapshot();
    assert_eq!(
        (
            snap.state,
            snap.probes_in_flight,
            snap.counts.failures,
            snap.counts.cancelled
        ),
        (State::Open, 0, 0, 1),
        "a probe that said nothing is a cancelled probe, not a failed one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_permit_dropped_unrecorded_is_a_cancellation_however_long_it_was_held() {
    let registry = Registry::<String>::new(failing_after(3 * SECOND));
    let permit = registry.try_acquire(&"alpha".to_string()).expect("closed");
    tokio::time::advance(60 * SECOND).await;
    drop(permit);
    let snap = registry.get(&"alpha".to_string()).unwrap().snapshot();
    assert_eq!((snap.counts.failures, snap.counts.cancelled), (0, 1));
}

#[test]
fn a_zero_limit_is_a_config_error() {
    let err = config()
        .cancelled_failure_after(Some(Duration::ZERO))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "cancelled_failure_after");
}
