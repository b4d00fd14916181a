//! Manual control, shadow mode, groups, and transition subscriptions.

use std::task::Context;
use std::time::Duration;

use crate::common;

use tokio::sync::broadcast::error::TryRecvError;
use tokio::time::advance;
use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::events::Transition;
use tower_circuit_breaker::policy::{ConsecutiveFailures, ConsecutiveFailuresFigures, TripReason};
use tower_circuit_breaker::{
    Breaker, BreakerGroup, CircuitBreaker, CircuitOpen, Config, Readiness, State,
};

use common::{counting_waker, wakes, Upstream};

fn setup(threshold: u32) -> (Breaker, CircuitBreaker<Upstream>, Upstream) {
    let breaker = Breaker::new(
        Config::builder()
            .name("manual")
            .trip(ConsecutiveFailures::new(threshold))
            .cooldown(Duration::from_secs(10))
            .max_open(Duration::from_secs(300))
            .build()
            .unwrap(),
    );
    let upstream = Upstream::default();
    let svc = CircuitBreaker::new(upstream.clone(), &breaker);
    (breaker, svc, upstream)
}

async fn call(svc: &mut CircuitBreaker<Upstream>, req: u32) -> Result<u32, BoxError> {
    svc.ready().await?.call(req).await
}

/// Makes the upstream fail, then sends it `n` calls that must all fail.
async fn fail_calls(svc: &mut CircuitBreaker<Upstream>, upstream: &Upstream, n: usize) {
    upstream.fail();
    for _ in 0..n {
        assert!(call(svc, 1).await.is_err());
    }
}

fn refusal(result: Result<u32, BoxError>) -> CircuitOpen {
    let err = result.expect_err("expected a refusal");
    CircuitOpen::find(err.as_ref())
        .expect("CircuitOpen")
        .clone()
}

#[tokio::test(start_paused = true)]
async fn forced_open_without_an_end_refuses_whatever_the_clock_until_restored() {
    let (breaker, mut svc, upstream) = setup(5);
    assert!(breaker.force_open(None));
    assert!(!breaker.force_open(None), "already held open");
    advance(Duration::from_secs(3600)).await;
    assert_eq!(breaker.state(), State::ForcedOpen);
    let open = refusal(call(&mut svc, 1).await);
    assert_eq!(open.state(), State::ForcedOpen);
    assert_eq!(open.retry_after(), Duration::from_secs(300));
    assert_eq!(upstream.calls(), 0);

    assert!(breaker.restore());
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(call(&mut svc, 2).await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn forced_open_with_an_end_probes_when_it_ends() {
    let (breaker, mut svc, _) = setup(5);
    breaker.force_open(Some(Duration::from_secs(60)));
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(breaker.snapshot().last_trip, Some(TripReason::Manual));
    advance(Duration::from_secs(59)).await;
    assert_eq!(refusal(call(&mut svc, 1).await).state(), State::Open);
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        call(&mut svc, 2).await.unwrap(),
        2,
        "the probe goes through"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn forced_closed_counts_failures_but_never_opens_until_restored() {
    let (breaker, mut svc, upstream) = setup(2);
    breaker.force_closed();
    fail_calls(&mut svc, &upstream, 10).await;
    assert_eq!(breaker.state(), State::ForcedClosed);
    assert_eq!(upstream.calls(), 10);
    assert_eq!(breaker.snapshot().counts.failures, 10);

    breaker.restore();
    let _ = call(&mut svc, 1).await;
    let _ = call(&mut svc, 1).await;
    assert_eq!(
        breaker.state(),
        State::Open,
        "automatic again: two failures trip it"
    );
}

#[tokio::test(start_paused = true)]
async fn disabled_passes_everything_and_records_nothing() {
    let (breaker, mut svc, upstream) = setup(1);
    breaker.disable();
    fail_calls(&mut svc, &upstream, 10).await;
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Disabled);
    assert_eq!((snap.counts.failures, snap.counts.calls), (0, 10));
    assert_eq!(upstream.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn reset_closes_and_forgets_the_backoff() {
    let (breaker, mut svc, upstream) = setup(1);
    upstream.fail();
    let _ = call(&mut svc, 1).await;
    advance(Duration::from_secs(10)).await;
    let _ = call(&mut svc, 1).await; // failed probe: next period 20 s
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(20)));

    assert!(breaker.reset());
    assert_eq!(breaker.state(), State::Closed);
    let _ = call(&mut svc, 1).await;
    assert_eq!(
        breaker.retry_after(),
        Some(Duration::from_secs(10)),
        "backoff forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn outcome_admitted_before_a_manual_change_is_dropped() {
    let (breaker, svc, upstream) = setup(1);
    upstream.fail();
    let mut slow = svc.clone();
    let future = slow.ready().await.unwrap().call(1); // admitted while closed
    breaker.force_closed();
    breaker.restore();
    assert!(future.await.is_err());
    let snap = breaker.snapshot();
    assert_eq!(
        snap.state,
        State::Closed,
        "the late failure does not trip it"
    );
    assert_eq!(snap.counts.stale, 1);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_never_refuses_yet_reports_the_trip() {
    let (breaker, mut svc, upstream) = setup(2);
    breaker.set_shadow(true);
    let mut events = breaker.subscribe();
    fail_calls(&mut svc, &upstream, 2).await;
    let opened = events.try_recv().expect("a transition");
    assert_eq!(
        (opened.from, opened.to, opened.shadow),
        (State::Closed, State::Open, true)
    );
    assert_eq!(
        opened.reason,
        Some(TripReason::Policy(
            ConsecutiveFailuresFigures {
                failures: 2,
                threshold: 2
            }
            .into()
        ))
    );

    // A real breaker would refuse these five; shadow lets them through
    // and counts them as refusals, without recording their outcomes.
    upstream.recover();
    for i in 0..5 {
        assert_eq!(call(&mut svc, i).await.unwrap(), i);
    }
    let snap = breaker.snapshot();
    assert!(snap.shadow);
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.counts.rejected, 5);
    assert_eq!(upstream.calls(), 7);

    // It goes on deciding: half-open, a probe, closed.
    advance(Duration::from_secs(10)).await;
    call(&mut svc, 9).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
    let steps: Vec<(State, State)> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|t| (t.from, t.to))
        .collect();
    assert_eq!(
        steps,
        [
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn group_isolates_and_restores_every_member_in_one_call() {
    let breakers: Vec<Breaker> = (0..4).map(|_| setup(1).0).collect();
    let group = BreakerGroup::new(breakers.clone());
    assert_eq!(group.force_open(None), 4);
    assert!(breakers.iter().all(|b| b.state() == State::ForcedOpen));
    assert_eq!(group.restore(), 4);
    assert!(breakers.iter().all(|b| b.state() == State::Closed));
    assert_eq!(group.restore(), 0, "nothing left to restore");
    assert_eq!(group.snapshots().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn subscribers_see_each_transition_once_and_in_order() {
    let (breaker, svc, upstream) = setup(1);
    let mut events = breaker.subscribe();
    let config_probes = 1;
    upstream.fail();
    // Trip, then several half-open rounds raced by many clones.
    let _ = svc.clone().oneshot(0).await;
    for round in 0..4u64 {
        advance(Duration::from_secs(10 << round)).await;
        if round == 3 {
            upstream.recover();
        }
        let tasks: Vec<_> = (0..16)
            .map(|i| tokio::spawn(svc.clone().oneshot(i)))
            .collect();
        for task in tasks {
            let _ = task.await.unwrap();
        }
    }
    breaker.force_open(None);
    breaker.restore();

    let received: Vec<Transition> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(matches!(events.try_recv(), Err(TryRecvError::Empty)));
    let steps: Vec<(State, State)> = received.iter().map(|t| (t.from, t.to)).collect();
    let mut expected = vec![(State::Closed, State::Open)];
    for _ in 0..3 {
        expected.push((State::Open, State::HalfOpen));
        expected.push((State::HalfOpen, State::Open));
    }
    expected.push((State::Open, State::HalfOpen));
    expected.push((State::HalfOpen, State::Closed));
    expected.push((State::Closed, State::ForcedOpen));
    expected.push((State::ForcedOpen, State::Closed));
    assert_eq!(steps, expected);
    for pair in received.windows(2) {
        assert_eq!(
            pair[1].generation,
            pair[0].generation + 1,
            "one event per generation"
        );
    }
    assert_eq!(breaker.snapshot().counts.probes, 4 * config_probes);
}

#[tokio::test(start_paused = true)]
async fn manual_change_wakes_gate_waiters() {
    let (breaker, _, upstream) = setup(1);
    let mut gated = CircuitBreaker::new(upstream.clone(), &breaker).readiness(Readiness::Gate);
    breaker.force_open(None);
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(gated.poll_ready(&mut cx).is_pending());
    advance(Duration::from_secs(3600)).await;
    assert_eq!(wakes(&counter), 0, "isolated: no timer fires");

    breaker.restore();
    assert_eq!(wakes(&counter), 1);
    assert!(gated.poll_ready(&mut cx).is_ready());
}
