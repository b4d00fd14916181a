//! The adaptive policy through a breaker, on paused time: its false-trip
//! rate on a steady provider, its bound on a hard outage, a baseline that
//! does not learn while the breaker is open, combinations, figures, and
//! config errors.
//!
//! The property tests draw seeds, baselines and warm-ups with proptest and
//! simulate the provider with the seeded generator of
//! `tests/common/rng.rs`. `PROPTEST_CASES` sets the number of cases of each
//! (by default 24 of each simulation, 256 of the config check) and
//! `PROPTEST_RNG_SEED` the seed.

use crate::common;
use crate::common::failures;
use crate::common::paused;
use crate::common::rng;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tokio::time::advance;
use tower_circuit_breaker::policy::{
    Adaptive, AdaptiveFigures, ConsecutiveFailures, ConsecutiveFailuresFigures, CountWindow,
    CountWindowFigures, PolicyFigures, TripPolicy, TripReason,
};
use tower_circuit_breaker::{Breaker, Config, State};

use common::{assert_policy_rejected, assert_rejected, builder, Call, Harness};
use failures::Failures;
use paused::{paused_runtime, proptest_config};
use rng::SplitMix64;

/// What a provider does with each call.
trait Source {
    fn call(&mut self) -> Call;
}

/// A provider failing `rate` of its calls at random.
struct Provider {
    rng: SplitMix64,
    rate: f64,
}

impl Source for Provider {
    fn call(&mut self) -> Call {
        if self.rng.next_f64() < self.rate {
            Call::Fail
        } else {
            Call::Ok
        }
    }
}

impl Source for failures::Provider {
    fn call(&mut self) -> Call {
        if self.fails() {
            Call::Fail
        } else {
            Call::Ok
        }
    }
}

/// What a stretch of traffic found.
#[derive(Debug, Default)]
struct Tally {
    /// Calls made while closed: the ones the policy judged.
    judged: u64,
    /// Times the breaker opened from closed.
    trips: u64,
}

/// Sends calls from `provider` until `judged` of them were made while
/// closed. Whenever the breaker is open, time moves on to its end, and the
/// next call is a probe (which the provider may fail).
async fn traffic(h: &mut Harness, provider: &mut impl Source, judged: u64) -> Tally {
    let mut tally = Tally::default();
    while tally.judged < judged {
        if let Some(wait) = h.breaker.retry_after() {
            advance(wait).await;
        }
        let closed = h.state() == State::Closed;
        let _ = h.call(provider.call()).await;
        if closed {
            tally.judged += 1;
            if h.state() == State::Open {
                tally.trips += 1;
            }
        }
    }
    tally
}

/// Sends calls from `provider` until the breaker opens; the calls it took,
/// or `None` if it stayed closed for `most` calls.
async fn until_open(h: &mut Harness, provider: &mut impl Source, most: u64) -> Option<u64> {
    for calls in 1..=most {
        let _ = h.call(provider.call()).await;
        if h.state() != State::Closed {
            return Some(calls);
        }
    }
    None
}

/// Waits out the open periods, each probe a success, until closed.
async fn settle(h: &mut Harness) {
    while let Some(wait) = h.breaker.retry_after() {
        advance(wait).await;
        let _ = h.call(Call::Ok).await;
    }
}

/// Healthy traffic until the warm-up is over (the fallback no longer
/// judges); the tally of that stretch.
async fn warm_up(h: &mut Harness, provider: &mut impl Source) -> Tally {
    let mut tally = Tally::default();
    while matches!(
        h.breaker.snapshot().policy,
        PolicyFigures::Adaptive(AdaptiveFigures {
            fallback: Some(_),
            ..
        })
    ) {
        let chunk = traffic(h, provider, 100).await;
        tally.judged += chunk.judged;
        tally.trips += chunk.trips;
    }
    tally
}

/// The baseline and the outcomes learned, from the snapshot.
fn baseline(breaker: &Breaker) -> (f64, u64) {
    match breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures {
            baseline, learned, ..
        }) => (baseline, learned),
        other => panic!("not an adaptive policy: {other:?}"),
    }
}

fn run<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let mut runner = TestRunner::new(proptest_config(cases));
    if let Err(err) = runner.run(&strategy, test) {
        panic!("{err}");
    }
}

// ---------------------------------------------------------------------------
// False trips on a steady provider
// ---------------------------------------------------------------------------

/// A budget large enough to be measured in a test's worth of calls; the
/// bound does not depend on its size. The outage bench measures the default
/// budget (one per million) over millions of calls.
const TEST_BUDGET_PER_MILLION: f64 = 500.0;

#[test]
fn false_trips_on_a_steady_provider_stay_within_the_stated_rate() {
    const JUDGED: u64 = 100_000;
    let policy = Adaptive::new()
        .false_trips_per_million(TEST_BUDGET_PER_MILLION)
        .warm_up(500);
    let strategy = (
        any::<u64>(),
        prop::sample::select(vec![0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.4]),
    );
    let totals = std::sync::Mutex::new(Tally::default());
    run(24, strategy, |(seed, rate)| {
        paused_runtime().block_on(async {
            let mut h = Harness::new(policy.clone());
            let mut provider = Provider {
                rng: SplitMix64(seed),
                rate,
            };
            // The warm-up, judged by the fallback: not part of the bound.
            let warming = warm_up(&mut h, &mut provider).await;
            prop_assert!(warming.judged <= 1_000, "{warming:?}");
            let tally = traffic(&mut h, &mut provider, JUDGED).await;
            let allowed = TEST_BUDGET_PER_MILLION * 1e-6 * tally.judged as f64;
            prop_assert!(
                tally.trips as f64 <= allowed,
                "baseline {rate}, seed {seed}: {} false trips in {} calls, the bound allows {allowed:.0}",
                tally.trips,
                tally.judged
            );
            if let Ok(mut totals) = totals.lock() {
                totals.judged += tally.judged;
                totals.trips += tally.trips;
            }
            Ok(())
        })
    });
    let totals = totals.into_inner().unwrap_or_default();
    let per_million = totals.trips as f64 * 1e6 / totals.judged.max(1) as f64;
    eprintln!(
        "false trips: {} in {} calls at steady baselines, {per_million:.0} per million (budget {TEST_BUDGET_PER_MILLION})",
        totals.trips, totals.judged
    );
    assert!(per_million <= TEST_BUDGET_PER_MILLION);
}

// ---------------------------------------------------------------------------
// A hard outage
// ---------------------------------------------------------------------------

#[test]
fn a_step_to_every_call_failing_trips_within_the_bound_whatever_the_warm_up() {
    let strategy = (
        any::<u64>(),
        0.0..0.4f64,
        prop::sample::select(vec![0u32, 100, 1_000, 3_000]),
        0u64..5_000,
        prop::sample::select(vec![0.3, 0.5, 1.0]),
    );
    run(24, strategy, |(seed, rate, warm_up, healthy, ceiling)| {
        let policy = Adaptive::new()
            .warm_up(warm_up)
            .ceiling(ceiling)
            .fallback(ConsecutiveFailures::new(5));
        let bound = policy.max_failures_to_trip().expect("valid parameters");
        // Before the warm-up ends the fallback judges; the test gathers
        // evidence all along, so neither bound grows at the hand-over.
        let bound = u64::from(bound.max(5));
        paused_runtime().block_on(async {
            let mut h = Harness::new(policy);
            let mut provider = Provider {
                rng: SplitMix64(seed),
                rate,
            };
            traffic(&mut h, &mut provider, healthy).await;
            settle(&mut h).await;
            let mut failures = 0;
            while h.state() == State::Closed {
                failures += 1;
                h.through(Call::Fail).await;
                prop_assert!(
                    failures <= bound,
                    "baseline {rate}, warm-up {warm_up}, {healthy} healthy calls: still closed after {failures} failures"
                );
            }
            Ok(())
        })
    });
}

#[tokio::test(start_paused = true)]
async fn a_hard_outage_trips_within_the_bound_whatever_the_baseline_learned() {
    let policy = Adaptive::new().warm_up(0).baseline_horizon(1_000);
    let bound = policy.max_failures_to_trip().expect("valid parameters");
    assert_eq!(bound, 50);
    // A provider failing 45% of calls at random: the baseline learns at
    // most 40% (ceiling 0.5 less the smallest degradation, 0.1), and is then
    // tested as independent failures at 40%: twenty in a row trip the run
    // test (20 × ln(1/0.4) = 18.3 over a threshold of 17.7).
    let mut h = Harness::new(policy.clone());
    let mut provider = Provider {
        rng: SplitMix64(7),
        rate: 0.45,
    };
    traffic(&mut h, &mut provider, 5_000).await;
    let (learned, _) = baseline(&h.breaker);
    assert!((0.38..=0.4).contains(&learned), "{learned}");
    h.breaker.reset();
    let mut failures = 0;
    while h.state() == State::Closed {
        failures += 1;
        h.through(Call::Fail).await;
    }
    assert_eq!(failures, 20);

    // A provider whose failures come in runs of 10 to 20, 20% of calls:
    // runs that long are learned as normal, and a hard outage takes longer
    // to tell from one, never longer than the bound.
    let mut h = Harness::new(Adaptive::new().warm_up(0));
    let runs = Failures::Runs {
        rate: 0.2,
        shortest: 10,
        longest: 20,
    };
    let mut provider = failures::Provider::new(runs, 8);
    let mut longest = 0;
    for _ in 0..3 {
        // Trips while the runs are still being learned are not counted.
        traffic(&mut h, &mut provider, 10_000).await;
        settle(&mut h).await;
        let mut failures = 0;
        while h.state() == State::Closed {
            failures += 1;
            h.through(Call::Fail).await;
            assert!(failures <= bound, "still closed after {failures} failures");
        }
        longest = longest.max(failures);
        settle(&mut h).await;
    }
    assert!(longest > 20, "{longest}");
}

// ---------------------------------------------------------------------------
// The baseline while open and half-open
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_baseline_does_not_move_while_open_or_half_open() {
    let mut h = Harness::new(Adaptive::new().warm_up(1_000));
    let mut provider = Provider {
        rng: SplitMix64(11),
        rate: 0.02,
    };
    // Past the first 20,000 outcomes, while which a trip's are learned.
    traffic(&mut h, &mut provider, 25_000).await;
    let before = baseline(&h.breaker);
    assert!((before.0 - 0.02).abs() < 0.005, "{before:?}");

    // A hard outage opens it; refused calls, failed probes and the probe
    // that closes it teach the baseline nothing.
    while h.state() == State::Closed {
        h.through(Call::Fail).await;
    }
    assert!(matches!(
        h.breaker.snapshot().last_trip,
        Some(TripReason::Policy(PolicyFigures::Adaptive(_)))
    ));
    assert_eq!(baseline(&h.breaker), before);
    for _ in 0..100 {
        h.refused().await;
    }
    for _ in 0..3 {
        advance(h.breaker.retry_after().unwrap_or_default()).await;
        assert_eq!(h.state(), State::HalfOpen);
        assert_eq!(baseline(&h.breaker), before);
        h.through(Call::Fail).await;
        assert_eq!(h.state(), State::Open);
    }
    advance(h.breaker.retry_after().unwrap_or_default()).await;
    h.through(Call::Ok).await;
    assert_eq!(h.state(), State::Closed);
    assert_eq!(baseline(&h.breaker), before);

    // Back to normal: the failures that opened it were held back and are
    // never learned, so the baseline only learns the successes since.
    h.succeed(1_000).await;
    let after = baseline(&h.breaker);
    assert!(after.1 > before.1, "{after:?}");
    assert!(after.0 < before.0, "{before:?} then {after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_manual_reset_clears_the_test_and_keeps_the_baseline() {
    let mut h = Harness::new(Adaptive::new().warm_up(500));
    let mut provider = Provider {
        rng: SplitMix64(3),
        rate: 0.1,
    };
    // Past the first 20,000 outcomes, while which a reset learns the
    // outcomes held back rather than forget them.
    traffic(&mut h, &mut provider, 25_000).await;
    let learned = baseline(&h.breaker);
    h.fail(3).await;
    h.breaker.reset();
    assert_eq!(baseline(&h.breaker), learned);
    match h.breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures { statistic, .. }) => assert_eq!(statistic, 0.0),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn reconfiguring_keeps_the_baseline_unless_the_policy_changes() {
    let policy = Adaptive::new().warm_up(500);
    let mut h = Harness::new(policy.clone());
    h.succeed(2_000).await;
    let learned = baseline(&h.breaker);
    assert!(learned.1 >= 1_500, "{learned:?}");
    let same = builder(policy.clone()).cooldown(Duration::from_secs(5));
    h.breaker.reconfigure(same.build().expect("valid"));
    assert_eq!(baseline(&h.breaker), learned);
    h.breaker
        .reconfigure(builder(policy.min_degradation(0.2)).build().expect("valid"));
    assert_eq!(baseline(&h.breaker), (0.0, 0));
}

// ---------------------------------------------------------------------------
// Degradations, combinations, figures
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_rise_from_two_to_forty_percent_trips_it_and_is_named() {
    let mut h = Harness::new(Adaptive::new());
    let mut provider = Provider {
        rng: SplitMix64(5),
        rate: 0.02,
    };
    traffic(&mut h, &mut provider, 50_000).await;
    settle(&mut h).await;
    provider.rate = 0.4;
    let calls = until_open(&mut h, &mut provider, 200).await;
    assert!(calls.is_some(), "a 40% failure rate went unnoticed");
    match h.breaker.snapshot().last_trip {
        Some(TripReason::Policy(PolicyFigures::Adaptive(AdaptiveFigures {
            failures,
            calls,
            baseline,
            ..
        }))) => {
            assert!(failures <= calls && failures >= 2, "{failures} of {calls}");
            assert!((baseline - 0.02).abs() < 0.005, "{baseline}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn adaptive_or_five_failures_in_five_calls_trips_on_whichever_sees_it_first() {
    let policy = TripPolicy::any_of([
        Adaptive::new().warm_up(1_000).into(),
        CountWindow::new(5, 5).into(),
    ]);
    let mut h = Harness::new(policy);
    let mut provider = Provider {
        rng: SplitMix64(9),
        rate: 0.1,
    };
    traffic(&mut h, &mut provider, 20_000).await;
    settle(&mut h).await;
    // At a 10% baseline the adaptive test needs nine failures in a row; the
    // count window five.
    h.succeed(10).await;
    h.fail(5).await;
    assert_eq!(
        h.breaker.snapshot().last_trip,
        Some(TripReason::Policy(
            CountWindowFigures {
                failures: 5,
                threshold: 5,
                window: 5
            }
            .into()
        ))
    );
    advance(h.breaker.retry_after().unwrap_or_default()).await;
    h.through(Call::Ok).await;
    // A partial degradation is the adaptive test's.
    provider.rate = 0.45;
    assert!(until_open(&mut h, &mut provider, 2_000).await.is_some());
    let last = h.breaker.snapshot().last_trip;
    assert!(
        matches!(last, Some(TripReason::Policy(PolicyFigures::Adaptive(_)))),
        "{last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn figures_show_the_fallback_while_warming_up_then_the_baseline_and_the_test() {
    let mut h = Harness::new(Adaptive::new().warm_up(1_000));
    h.fail(2).await;
    match h.breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures {
            learned, fallback, ..
        }) => {
            assert_eq!(learned, 0);
            assert_eq!(
                fallback.as_deref(),
                Some(&PolicyFigures::ConsecutiveFailures(
                    ConsecutiveFailuresFigures {
                        failures: 2,
                        threshold: 5
                    }
                ))
            );
        }
        other => panic!("{other:?}"),
    }
    h.succeed(1_500).await;
    h.fail(1).await;
    match h.breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures {
            baseline,
            learned,
            statistic,
            threshold,
            learning,
            fallback,
            ..
        }) => {
            assert!(learned >= 1_000, "{learned}");
            assert!(learning, "20,000 outcomes are not learned yet");
            assert!(baseline < 0.01, "{baseline}");
            assert!(
                statistic > 0.0 && statistic < threshold,
                "{statistic} {threshold}"
            );
            assert_eq!(fallback, None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_fallback_judges_during_the_warm_up() {
    let mut h = Harness::new(
        Adaptive::new()
            .warm_up(1_000)
            .fallback(CountWindow::new(3, 10)),
    );
    h.succeed(100).await;
    h.fail(3).await;
    assert_eq!(
        h.breaker.snapshot().last_trip,
        Some(TripReason::Policy(
            CountWindowFigures {
                failures: 3,
                threshold: 3,
                window: 10
            }
            .into()
        ))
    );
}

/// With the defaults, the tests judge from the first call: normal runs of
/// three to five failures, which five consecutive failures (a warm-up's
/// fallback) trip on every fifth of, trip nothing while the policy learns
/// them.
#[test]
fn runs_of_three_to_five_failures_do_not_trip_it_while_it_learns() {
    const JUDGED: u64 = 50_000;
    for rate in [0.02, 0.1] {
        let failures = Failures::Runs {
            rate,
            shortest: 3,
            longest: 5,
        };
        for seed in [1, 2, 3] {
            let tally = paused_runtime().block_on(async {
                let mut h = Harness::new(Adaptive::new());
                let mut provider = failures::Provider::new(failures, seed);
                traffic(&mut h, &mut provider, JUDGED).await
            });
            assert_eq!(
                tally.trips,
                0,
                "{}, seed {seed}: {tally:?}",
                failures.describe()
            );
        }
    }
}

/// The same runs through a warm-up judged by five consecutive failures:
/// what the learning phase did before it was the tests' own.
#[test]
fn a_warm_up_judged_by_consecutive_failures_trips_on_normal_runs() {
    let failures = Failures::Runs {
        rate: 0.1,
        shortest: 3,
        longest: 5,
    };
    let trips: u64 = [1, 2, 3]
        .into_iter()
        .map(|seed| {
            paused_runtime().block_on(async {
                let mut h = Harness::new(Adaptive::new().warm_up(1_000));
                let mut provider = failures::Provider::new(failures, seed);
                traffic(&mut h, &mut provider, 1_000).await.trips
            })
        })
        .sum();
    assert!(trips >= 3, "{trips} trips in three warm-ups");
}

#[tokio::test(start_paused = true)]
async fn figures_say_when_the_learning_phase_is_over() {
    let learning = |h: &Harness| match h.breaker.snapshot().policy {
        PolicyFigures::Adaptive(AdaptiveFigures {
            learning, fallback, ..
        }) => {
            assert_eq!(fallback, None, "no warm-up by default");
            learning
        }
        other => panic!("{other:?}"),
    };
    let mut h = Harness::new(Adaptive::new());
    assert!(learning(&h));
    h.succeed(20_000).await;
    assert!(learning(&h), "outcomes are learned a few words late");
    h.succeed(300).await;
    assert!(!learning(&h));
}

// ---------------------------------------------------------------------------
// Config errors
// ---------------------------------------------------------------------------

#[test]
fn invalid_parameters_are_config_errors() {
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-7, 100_001.0] {
        assert_policy_rejected(
            Adaptive::new().false_trips_per_million(rate),
            "trip.adaptive.false_trips_per_million",
        );
    }
    for rise in [0.0, -0.1, 1.0, f64::NAN, 0.00001, 0.5, 0.7] {
        assert_policy_rejected(
            Adaptive::new().min_degradation(rise),
            "trip.adaptive.min_degradation",
        );
    }
    for ceiling in [0.0, 1.01, f64::NAN, -0.5] {
        assert_policy_rejected(Adaptive::new().ceiling(ceiling), "trip.adaptive.ceiling");
    }
    assert_policy_rejected(
        Adaptive::new().ceiling(0.05),
        "trip.adaptive.min_degradation",
    );
    assert_policy_rejected(
        Adaptive::new().baseline_horizon(0),
        "trip.adaptive.baseline_horizon",
    );
    assert_policy_rejected(
        Adaptive::new().fallback(ConsecutiveFailures::new(0)),
        "trip.adaptive.fallback.consecutive_failures.threshold",
    );
    assert_rejected(
        Config::builder().trip(TripPolicy::any_of([
            CountWindow::new(5, 5).into(),
            Adaptive::new().fallback(TripPolicy::any_of([])).into(),
        ])),
        "trip.any_of[1].adaptive.fallback.any_of",
    );
}

/// Any number: ordinary ones, edges, and raw bit patterns (NaN, infinities,
/// subnormals).
fn any_number() -> impl Strategy<Value = f64> {
    prop_oneof![
        -2.0..2.0f64,
        0.0..200_000.0f64,
        prop::sample::select(vec![
            0.0,
            1.0,
            1e-6,
            1e-4,
            100_000.0,
            f64::NAN,
            f64::INFINITY
        ]),
        any::<u64>().prop_map(f64::from_bits),
    ]
}

#[test]
fn any_parameters_build_or_give_a_config_error_never_a_panic() {
    let strategy = (
        any_number(),
        any_number(),
        any_number(),
        any::<u32>(),
        any::<u32>(),
    );
    run(
        256,
        strategy,
        |(budget, rise, ceiling, warm_up, horizon)| {
            let policy = Adaptive::new()
                .false_trips_per_million(budget)
                .min_degradation(rise)
                .ceiling(ceiling)
                .warm_up(warm_up)
                .baseline_horizon(horizon);
            let valid = (1e-6..=100_000.0).contains(&budget)
                && (1e-4..1.0).contains(&rise)
                && ceiling > rise
                && ceiling <= 1.0
                && horizon > 0;
            let built = builder(policy.clone()).build();
            prop_assert_eq!(built.is_ok(), valid, "{:?}", built);
            if let Err(err) = built {
                prop_assert!(err.field().starts_with("trip.adaptive."), "{}", err);
            }
            prop_assert_eq!(policy.max_failures_to_trip().is_some(), valid);
            Ok(())
        },
    );
}

#[tokio::test(start_paused = true)]
async fn extreme_valid_parameters_build_and_run() {
    let policies = [
        Adaptive::new()
            .false_trips_per_million(0.000001)
            .min_degradation(0.0001)
            .ceiling(1.0)
            .warm_up(u32::MAX)
            .baseline_horizon(u32::MAX),
        Adaptive::new()
            .false_trips_per_million(100_000.0)
            .min_degradation(0.9999)
            .ceiling(1.0)
            .warm_up(0)
            .baseline_horizon(1),
    ];
    for policy in policies {
        assert!(policy.max_failures_to_trip().is_some());
        let mut h = Harness::new(policy);
        let mut provider = Provider {
            rng: SplitMix64(1),
            rate: 0.3,
        };
        traffic(&mut h, &mut provider, 2_000).await;
        h.breaker.snapshot();
    }
}
