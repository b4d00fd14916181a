//! Active probes: the breaker's own probe every interval while open, users
//! refused meanwhile, closing after consecutive successes, and the task's
//! end.

use std::time::Duration;

use crate::common;

use tokio::time::sleep;
use tower::{BoxError, ServiceExt};
use tower_circuit_breaker::classify::ErrorsAsFailures;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, Readiness, State};

use common::Upstream;

/// The model-router preset, tripping on one failure for brevity: open at
/// least 10 s, a probe every 5 s, two successes close.
fn config() -> Config {
    Config::model_router()
        .name("provider")
        .trip(ConsecutiveFailures::new(1))
        .build()
        .unwrap()
}

/// A breaker on [`config`] probing actively, and a service through it.
fn setup() -> (Breaker, CircuitBreaker<Upstream>, Upstream) {
    let breaker = Breaker::new(config());
    let upstream = Upstream::default();
    assert!(breaker.probe_actively(upstream.clone(), || 0u32, ErrorsAsFailures));
    assert!(!breaker.probe_actively(upstream.clone(), || 0u32, ErrorsAsFailures));
    let svc = CircuitBreaker::new(upstream.clone(), &breaker);
    (breaker, svc, upstream)
}

/// `setup`, then a user call to the failing upstream, which trips the breaker.
async fn tripped() -> (Breaker, CircuitBreaker<Upstream>, Upstream) {
    let (breaker, svc, upstream) = setup();
    upstream.fail();
    let _ = user_call(&svc).await;
    (breaker, svc, upstream)
}

async fn user_call(svc: &CircuitBreaker<Upstream>) -> Result<u32, BoxError> {
    svc.clone().oneshot(7).await
}

#[tokio::test(start_paused = true)]
async fn sends_one_probe_per_interval_after_min_open_and_keeps_refusing_users() {
    let (breaker, svc, upstream) = setup();
    upstream.fail();
    assert!(user_call(&svc).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    upstream.fail();

    // Nothing before min_open (10 s), then one probe at 10, 15, 20... 60 s.
    sleep(Duration::from_millis(9_900)).await;
    assert_eq!(upstream.probes(), 0);
    sleep(Duration::from_millis(200)).await;
    for (i, second) in (10..=60).step_by(5).enumerate() {
        if i > 0 {
            sleep(Duration::from_secs(5)).await;
        }
        assert_eq!(upstream.probes(), i + 1, "one probe by {second} s");
        // A user meanwhile is refused, whether open or half-open.
        let err = user_call(&svc).await.unwrap_err();
        assert!(CircuitOpen::find(err.as_ref()).is_some());
    }
    assert_eq!(upstream.probes(), 11);
    assert_eq!(upstream.users(), 1, "only the call that tripped it");
    assert_ne!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn closes_after_consecutive_probe_successes_and_the_task_ends() {
    let (breaker, svc, upstream) = tripped().await;
    sleep(Duration::from_millis(10_100)).await; // first probe fails at 10 s
    assert_eq!(upstream.probes(), 1);
    upstream.recover();

    sleep(Duration::from_secs(5)).await; // 15 s: one success, still refusing
    assert_eq!(upstream.probes(), 2);
    assert_eq!(breaker.snapshot().probe_successes, 1);
    assert!(user_call(&svc).await.is_err(), "one success is not enough");

    sleep(Duration::from_secs(5)).await; // 20 s: the second success closes it
    assert_eq!(upstream.probes(), 3);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(user_call(&svc).await.unwrap(), 7);

    sleep(Duration::from_secs(120)).await;
    assert_eq!(upstream.probes(), 3, "no probe while closed");
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_after_a_success_starts_the_count_again() {
    let (breaker, _svc, upstream) = tripped().await;
    upstream.recover();
    sleep(Duration::from_millis(10_100)).await; // success 1
    upstream.fail();
    sleep(Duration::from_secs(5)).await; // fails: open again
    assert_eq!(breaker.state(), State::Open);
    upstream.recover();
    sleep(Duration::from_secs(5)).await; // success 1 again
    assert_ne!(breaker.state(), State::Closed);
    sleep(Duration::from_secs(5)).await; // success 2: closed
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(upstream.probes(), 4);
}

#[tokio::test(start_paused = true)]
async fn the_task_stops_when_the_breaker_is_dropped() {
    let (breaker, svc, upstream) = tripped().await;
    sleep(Duration::from_millis(10_100)).await;
    assert_eq!(upstream.probes(), 1);
    drop(svc);
    drop(breaker);
    sleep(Duration::from_secs(60)).await;
    assert_eq!(upstream.probes(), 1, "no probe once the breaker is gone");
}

/// The probe service handed to the task, with a token that tells whether
/// the task still holds it.
#[derive(Clone)]
struct Held {
    upstream: Upstream,
    _token: std::sync::Arc<()>,
}

impl tower::Service<u32> for Held {
    type Response = u32;
    type Error = BoxError;
    type Future = <Upstream as tower::Service<u32>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.upstream.poll_ready(cx)
    }

    fn call(&mut self, request: u32) -> Self::Future {
        self.upstream.call(request)
    }
}

#[tokio::test(start_paused = true)]
async fn the_task_lets_go_of_its_probe_service_when_the_breaker_is_dropped_mid_wait() {
    let breaker = Breaker::new(config());
    let upstream = Upstream::default();
    let token = std::sync::Arc::new(());
    let held = Held {
        upstream: upstream.clone(),
        _token: token.clone(),
    };
    assert!(breaker.probe_actively(held, || 0u32, ErrorsAsFailures));
    let svc = CircuitBreaker::new(upstream.clone(), &breaker);
    upstream.fail();
    let _ = user_call(&svc).await;
    assert_eq!(breaker.state(), State::Open);
    // The task now waits for the open period's end, at least 10 s away.
    sleep(Duration::from_secs(1)).await;
    // The breaker keeps its prober, and the task a clone of the service.
    assert_eq!(std::sync::Arc::strong_count(&token), 3);
    drop(svc);
    drop(breaker);
    // Long before the period would have ended, the task is gone, and with
    // it the user's probe service.
    sleep(Duration::from_millis(1)).await;
    assert_eq!(std::sync::Arc::strong_count(&token), 1);
    assert_eq!(upstream.probes(), 0);
}

#[tokio::test(start_paused = true)]
async fn gate_waiters_wake_when_the_probes_close_it() {
    let (breaker, svc, upstream) = tripped().await;
    upstream.recover();
    let gated = svc.clone().readiness(Readiness::Gate);
    let waiter = tokio::spawn(gated.oneshot(9));
    sleep(Duration::from_secs(30)).await;
    assert_eq!(waiter.await.unwrap().unwrap(), 9);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(upstream.probes(), 2, "the users waited for the probes");
}

/// A paused current-thread runtime: a breaker outlives several of them, as
/// it does a runtime per test, per worker thread, or a restart.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// After its prober's runtime is gone: the breaker probes passively (a
/// user's call after the open period goes through and closes it), and the
/// next opening starts a prober on the runtime it happens on.
fn probes_passively_then_actively_again(
    breaker: &Breaker,
    svc: &CircuitBreaker<Upstream>,
    upstream: &Upstream,
) {
    paused_runtime().block_on(async {
        let probes = upstream.probes();
        upstream.recover();
        sleep(Duration::from_secs(10)).await;
        assert_eq!(breaker.state(), State::HalfOpen);
        // Two successes close it (the preset): users' calls probe.
        for _ in 0..2 {
            assert_eq!(user_call(svc).await.unwrap(), 7, "a user's call probes");
        }
        assert_eq!(breaker.state(), State::Closed);
        assert_eq!(upstream.probes(), probes, "no task probed meanwhile");

        upstream.fail();
        assert!(user_call(svc).await.is_err());
        assert_eq!(breaker.state(), State::Open);
        sleep(Duration::from_millis(10_100)).await;
        assert_eq!(upstream.probes(), probes + 1, "probing actively again");
        let err = user_call(svc).await.unwrap_err();
        assert!(CircuitOpen::find(err.as_ref()).is_some(), "users refused");
    });
}

#[test]
fn a_prober_dropped_with_its_runtime_before_it_ran_falls_back_to_passive_probing() {
    let (breaker, svc, upstream) = setup();
    let first = paused_runtime();
    first.block_on(async {
        upstream.fail();
        assert!(user_call(&svc).await.is_err());
        assert_eq!(breaker.state(), State::Open);
    });
    drop(first); // the probe task, spawned but never polled, goes with it
    probes_passively_then_actively_again(&breaker, &svc, &upstream);
}

#[test]
fn a_prober_dropped_with_its_runtime_while_it_slept_falls_back_to_passive_probing() {
    let (breaker, svc, upstream) = setup();
    let first = paused_runtime();
    first.block_on(async {
        upstream.fail();
        assert!(user_call(&svc).await.is_err());
        // The task runs and sleeps until the end of the open period.
        sleep(Duration::from_secs(1)).await;
        assert_eq!(upstream.probes(), 0);
    });
    drop(first);
    probes_passively_then_actively_again(&breaker, &svc, &upstream);
}
