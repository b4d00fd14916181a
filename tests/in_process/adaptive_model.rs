//! The adaptive policy's model of failures, through a breaker on paused
//! time: failures that come in runs keep within the stated budget once
//! learned; a lasting rise smaller than `min_degradation` is learned,
//! whether it creeps in or comes at once; a rise of `min_degradation`
//! still trips at once, and one well above it keeps tripping.
//!
//! Every provider is a seeded failure process of the outage bench
//! (`benches/outage_support/failures.rs`), so each run is the same. The
//! bench measures the same promises over tens of millions of calls at the
//! default budget of one false trip per million; these tests take a
//! budget large enough to be measured in a few hundred thousand calls, or
//! a rise short enough to be watched in as many.

use crate::common;
use crate::common::failures;

use tokio::time::advance;
use tower_circuit_breaker::policy::{Adaptive, AdaptiveFigures, PolicyFigures, TripReason};
use tower_circuit_breaker::{Breaker, State};

use common::{Call, Harness};
use failures::{Failures, Provider};

/// Calls from `provider` until `judged` of them were made while closed;
/// the times the breaker opened on them. Whenever the breaker is open, time
/// moves on to its end, and the next call is a probe.
async fn trips(h: &mut Harness, provider: &mut Provider, judged: u64) -> u64 {
    let (mut done, mut trips) = (0, 0);
    while done < judged {
        if let Some(wait) = h.breaker.retry_after() {
            advance(wait).await;
        }
        let closed = h.state() == State::Closed;
        let call = if provider.fails() {
            Call::Fail
        } else {
            Call::Ok
        };
        let _ = h.call(call).await;
        if closed {
            done += 1;
            trips += u64::from(h.state() == State::Open);
        }
    }
    trips
}

/// Waits out the open periods, each probe a success, until closed.
async fn settle(h: &mut Harness) {
    while let Some(wait) = h.breaker.retry_after() {
        advance(wait).await;
        let _ = h.call(Call::Ok).await;
    }
}

/// The baseline the tests take as normal, from the snapshot.
fn baseline(breaker: &Breaker) -> f64 {
    match breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures { baseline, .. }) => baseline,
        other => panic!("not an adaptive policy: {other:?}"),
    }
}

/// A budget large enough to be measured in a test's worth of calls.
const TEST_BUDGET_PER_MILLION: f64 = 500.0;

#[tokio::test(start_paused = true)]
async fn false_trips_on_failures_in_runs_stay_within_twice_the_stated_rate() {
    const LEARN: u64 = 100_000;
    const JUDGED: u64 = 200_000;
    let allowed = 2.0 * TEST_BUDGET_PER_MILLION * 1e-6 * JUDGED as f64;
    for (rate, seed) in [(0.02, 1), (0.1, 2)] {
        let runs = Failures::Runs {
            rate,
            shortest: 3,
            longest: 5,
        };
        let mut h = Harness::new(Adaptive::new().false_trips_per_million(TEST_BUDGET_PER_MILLION));
        let mut provider = Provider::new(runs, seed);
        // Learning the runs, it trips on them at first: not counted.
        trips(&mut h, &mut provider, LEARN).await;
        let learned = baseline(&h.breaker);
        assert!(
            (learned - rate).abs() < rate / 5.0,
            "{rate}: learned {learned}"
        );
        let false_trips = trips(&mut h, &mut provider, JUDGED).await;
        assert!(
            false_trips as f64 <= allowed,
            "runs of 3-5 at {rate}: {false_trips} false trips in {JUDGED} calls, \
             twice the budget allows {allowed:.0}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_rise_below_the_smallest_degradation_spread_over_100_000_calls_is_learned() {
    // Two points over 2%: the default degradation is ten.
    let mut h = Harness::new(Adaptive::new());
    let drift = Failures::Drift {
        from: 0.02,
        to: 0.1,
        after: 300_000,
        over: 100_000,
    };
    let mut provider = Provider::new(drift, 3);
    assert_eq!(trips(&mut h, &mut provider, 300_000).await, 0);
    // The rise, and the first calls at 10%: a handful of trips at most.
    let rising = trips(&mut h, &mut provider, 300_000).await;
    assert!(rising <= 2, "{rising} trips while the rate rose");
    // Then none: the baseline tested against is the new rate.
    assert_eq!(trips(&mut h, &mut provider, 300_000).await, 0);
    let learned = baseline(&h.breaker);
    assert!((0.09..0.12).contains(&learned), "{learned}");
}

#[tokio::test(start_paused = true)]
async fn a_sudden_rise_below_the_smallest_degradation_trips_then_is_learned() {
    let mut h = Harness::new(Adaptive::new());
    let mut provider = Provider::new(Failures::Independent { rate: 0.02 }, 4);
    trips(&mut h, &mut provider, 300_000).await;
    provider.set(Failures::Independent { rate: 0.1 });
    let first = trips(&mut h, &mut provider, 100_000).await;
    assert!(first > 0, "a sudden rise of eight points went unnoticed");
    assert_eq!(trips(&mut h, &mut provider, 200_000).await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_rise_of_the_smallest_degradation_still_trips_at_once() {
    let mut h = Harness::new(Adaptive::new());
    let mut provider = Provider::new(Failures::Independent { rate: 0.1 }, 5);
    trips(&mut h, &mut provider, 200_000).await;
    settle(&mut h).await;
    for trial in 0..5 {
        // From 10% to 20%, ten points: at once, and again after each trip.
        let mut step = Provider::new(Failures::Independent { rate: 0.2 }, 50 + trial);
        let mut calls = 0;
        while h.state() == State::Closed {
            calls += 1;
            let call = if step.fails() { Call::Fail } else { Call::Ok };
            let _ = h.call(call).await;
            assert!(
                calls <= 2_000,
                "trial {trial}: still closed after {calls} calls"
            );
        }
        assert!(matches!(
            h.breaker.snapshot().last_trip,
            Some(TripReason::Policy(PolicyFigures::Adaptive(_)))
        ));
        settle(&mut h).await;
        trips(&mut h, &mut provider, 10_000).await;
        settle(&mut h).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_lasting_rise_well_above_the_smallest_degradation_keeps_tripping() {
    let mut h = Harness::new(Adaptive::new());
    let mut provider = Provider::new(Failures::Independent { rate: 0.1 }, 6);
    trips(&mut h, &mut provider, 200_000).await;
    // From 10% to 30%: twenty points.
    provider.set(Failures::Independent { rate: 0.3 });
    trips(&mut h, &mut provider, 200_000).await;
    let later = trips(&mut h, &mut provider, 100_000).await;
    assert!(
        later >= 100,
        "{later} trips in the last 100,000 calls at 30%"
    );
}
