//! The adaptive policy's tests.

use super::detector::*;
use super::model::*;
use super::*;

fn outcome(failure: bool) -> Sample {
    Sample {
        failure,
        class: None,
        elapsed: None,
    }
}

/// A detector that learned `outcomes`, one failure every `every` calls
/// (none if 0), none of which tripped it.
fn warmed(policy: &Adaptive, outcomes: u64, every: u64) -> Detector {
    let mut detector = Detector::new(policy);
    for i in 0..outcomes {
        let failure = every > 0 && i % every == 0;
        assert!(detector.record(outcome(failure), 0).is_none());
    }
    detector
}

/// A detector whose long-run rate is `rate` over a million outcomes, its
/// states showing nothing of their own.
fn learned_at(policy: &Adaptive, rate: f64) -> Detector {
    let mut detector = Detector::new(policy);
    detector.model.learned.rate = rate;
    detector.model.learned.outcomes = 1_000_000;
    detector.retune();
    detector
}

/// Failures in a row until it trips, from no evidence, after a success.
fn failures_to_trip(detector: &mut Detector) -> Option<u32> {
    detector.reset();
    assert!(detector.record(outcome(false), 0).is_none());
    (1..=10_000).find(|_| detector.record(outcome(true), 0).is_some())
}

#[test]
fn the_worked_example_holds() {
    let detector = learned_at(&Adaptive::new(), 0.02);
    let tuned = &detector.model.tuned;
    assert!((detector.normal_rate() - 0.02028).abs() < 1e-5);
    let state = gap_state(10);
    let expect = [
        (1.780, -0.108, 12.23),
        (3.015, -0.513, 13.64),
        (3.898, f64::NEG_INFINITY, 17.73),
    ];
    for (test, (failure, success, threshold)) in expect.into_iter().enumerate() {
        assert!(
            (tuned.on_failure[test][state] - failure).abs() < 1e-3,
            "{test}"
        );
        assert!(
            (tuned.on_success[test] - success).abs() < 1e-3 || tuned.on_success[test] == success,
            "{test}"
        );
        assert!((tuned.threshold[test] - threshold).abs() < 1e-2, "{test}");
    }
    // Independent failures: every state takes the rate over all calls.
    assert!(tuned.on_failure[0]
        .iter()
        .all(|&step| (step - 1.780).abs() < 1e-3));
}

#[test]
fn the_examples_of_failures_in_a_row_hold() {
    let policy = Adaptive::new();
    for (rate, failures) in [(0.0, 2), (0.02, 5), (0.1, 8)] {
        let mut detector = learned_at(&policy, rate);
        assert_eq!(failures_to_trip(&mut detector), Some(failures), "{rate}");
    }
}

#[test]
fn each_test_spends_its_share_by_the_stated_bound() {
    let settings = Settings::new(&Adaptive::new());
    for level in [1e-6, 0.02, 0.1, 0.4] {
        for (test, added) in settings.added(level).into_iter().enumerate() {
            let h = settings.threshold(test, added);
            let bound = added / (h.exp_m1() + added);
            let share = 1e-6 * SHARES[test];
            assert!((bound - share).abs() < 1e-15, "{level} {test}: {bound}");
        }
    }
    assert!((SHARES.iter().sum::<f64>() - 1.0).abs() < 1e-12);
}

#[test]
fn outcomes_are_learned_192_to_255_calls_late() {
    let mut held = Held::default();
    let learned: Vec<usize> = (0..1024)
        .filter_map(|i| {
            let filled = held.push(i < 64)?;
            assert_eq!(filled.failures, if i == 63 { 64 } else { 0 });
            filled.oldest.map(|word| (i, word))
        })
        .map(|(i, word)| {
            assert_eq!(word, if i == 255 { u64::MAX } else { 0 });
            i
        })
        .collect();
    assert_eq!(
        learned,
        vec![255, 319, 383, 447, 511, 575, 639, 703, 767, 831, 895, 959, 1023]
    );
}

#[test]
fn a_word_is_counted_in_the_states_its_outcomes_were_made_in() {
    let mut learned = Learned::new();
    // Three successes, two failures, a success, then 58 failures.
    let word = (u64::MAX << 6) | (0b11 << 3);
    learned.learn(word, 64, 1e6, 1.0);
    assert_eq!(learned.outcomes, 64);
    // Nothing was known before the first outcome: it is not counted.
    assert_eq!(learned.seen.iter().sum::<f64>(), 63.0);
    let at = |state: usize| (learned.seen[state], learned.failed[state]);
    assert_eq!(at(gap_state(1)), (2.0, 1.0));
    assert_eq!(at(gap_state(2)), (1.0, 0.0));
    assert_eq!(at(gap_state(3)), (1.0, 1.0));
    assert_eq!(at(run_state(1)), (2.0, 2.0));
    assert_eq!(at(run_state(2)), (2.0, 1.0));
    for run in 3..=32 {
        assert_eq!(at(run_state(run)), (1.0, 1.0), "{run}");
    }
    // Made after 33 to 57 failures in a row: one state.
    assert_eq!(at(run_state(40)), (25.0, 25.0));
    // A word of successes goes on from the streak of failures: the
    // first ends the run, the others are made after 1 to 63 successes.
    learned.learn(0, 64, 1e6, 1.0);
    let at = |state: usize| (learned.seen[state], learned.failed[state]);
    assert_eq!(at(run_state(58)), (26.0, 25.0));
    assert_eq!(at(gap_state(1)), (3.0, 1.0));
    // Made after 3 or 4 successes: the failure earlier, two successes.
    assert_eq!(at(gap_state(4)), (3.0, 1.0));
    assert_eq!(at(gap_state(20)), (16.0, 0.0));
    assert_eq!(at(gap_state(63)), (31.0, 0.0));
    assert_eq!(learned.streak.successes, 64);
}

#[test]
fn runs_of_failures_are_learned_as_normal() {
    // Runs of exactly four failures, one run in every 200 calls.
    let policy = Adaptive::new().warm_up(0);
    let mut detector = Detector::new(&policy);
    for i in 0..400_000u64 {
        let failure = i % 200 < 4;
        assert!(detector.record(outcome(failure), 0).is_none(), "call {i}");
    }
    let chances = detector
        .model
        .learned
        .chances(detector.normal_rate(), detector.settings.max_baseline);
    assert!(chances[run_state(1)] > 0.99, "{chances:?}");
    assert!(chances[run_state(3)] > 0.99, "{chances:?}");
    assert!(chances[run_state(4)] < 0.01, "{chances:?}");
    assert!(chances[run_state(9)] < 0.01, "{chances:?}");
    assert!(chances[gap_state(100)] < 0.01, "{chances:?}");
    // A fifth failure in a row is another matter: it trips within
    // three more.
    let trip = (0..10).find_map(|_| detector.record(outcome(true), 0));
    match trip {
        Some(TripReason::Policy(PolicyFigures::Adaptive(AdaptiveFigures { failures, .. }))) => {
            assert!(failures <= 7, "{trip:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_trip_forgets_the_outcomes_held_back_but_not_the_baseline() {
    let policy = Adaptive::new().warm_up(0);
    let mut detector = warmed(&policy, 30_000, 50);
    let (rate, learned) = (detector.model.learned.rate, detector.model.learned.outcomes);
    assert!((rate - 0.02).abs() < 0.002, "{rate}");
    let trip = (0..100).find_map(|_| detector.record(outcome(true), 0));
    assert!(
        matches!(trip, Some(TripReason::Policy(PolicyFigures::Adaptive(_)))),
        "{trip:?}"
    );
    detector.reset();
    let after = &detector.model.learned;
    assert_eq!((after.rate, after.outcomes), (rate, learned));
    assert_eq!(detector.held.full, 0);
    assert!(detector.evidence.iter().all(|e| e.statistic == 0.0));
}

#[test]
fn a_trip_while_still_learning_is_learned() {
    let policy = Adaptive::new().warm_up(0);
    let mut detector = warmed(&policy, 5_000, 50);
    let learned = detector.model.learned.outcomes;
    let trip = (0..100).find_map(|_| detector.record(outcome(true), 0));
    assert!(trip.is_some());
    detector.reset();
    assert!(detector.model.learned.outcomes > learned + 192);
    assert_eq!(detector.held.full, 0);
}

#[test]
fn trips_of_the_fallback_during_the_warm_up_forget_nothing() {
    let policy = Adaptive::new().warm_up(1_000);
    let mut detector = Detector::new(&policy);
    for i in 0..200 {
        if detector.record(outcome(i % 10 < 5), 0).is_some() {
            detector.reset();
        }
    }
    let (_, bits) = detector.held.partial();
    let held = detector.held.full as u64 * u64::from(BATCH) + u64::from(bits);
    assert_eq!(detector.model.learned.outcomes + held, 200);
    assert!(detector.warming_up());
}

#[test]
fn the_baseline_never_rises_above_the_ceiling_less_the_degradation() {
    let policy = Adaptive::new().warm_up(0).baseline_horizon(1_000);
    let mut detector = Detector::new(&policy);
    // No trip is acted on here (nothing resets the tests), so the
    // baseline learns every outcome.
    for _ in 0..100_000 {
        detector.record(outcome(true), 0);
    }
    assert_eq!(detector.model.learned.rate, 0.4);
    assert_eq!(detector.normal_rate(), 0.4);
    assert!(!detector.risen);
}

#[test]
fn the_fallback_judges_until_the_warm_up_is_over() {
    let policy = Adaptive::new().warm_up(1_000);
    let mut detector = Detector::new(&policy);
    let trip = (0..10).find_map(|_| detector.record(outcome(true), 0));
    assert_eq!(
        trip,
        Some(TripReason::Policy(PolicyFigures::ConsecutiveFailures(
            crate::policy::ConsecutiveFailuresFigures {
                failures: 5,
                threshold: 5
            }
        )))
    );
    let mut detector = warmed(&policy, 1_300, 0);
    assert!(!detector.warming_up());
    let trip = (0..10).find_map(|_| detector.record(outcome(true), 0));
    match trip {
        Some(TripReason::Policy(PolicyFigures::Adaptive(AdaptiveFigures {
            failures, calls, ..
        }))) => assert!(failures == calls && calls <= 5, "{trip:?}"),
        _ => panic!("{trip:?}"),
    }
}

#[test]
fn max_failures_to_trip_is_met_with_every_chance_at_the_cap() {
    for policy in [Adaptive::new(), Adaptive::new().ceiling(1.0)] {
        let bound = policy.max_failures_to_trip().unwrap_or(0);
        // Below the cap, so that the learned chances count.
        let mut detector = learned_at(&policy, 0.3);
        // Learned: in every state, the next call fails. The light and
        // heavy tests then see nothing in a failure, and the run test
        // takes the chance at its cap.
        let learned = &mut detector.model.learned;
        learned.seen = [1e6; STATES];
        learned.failed = [1e6; STATES];
        detector.retune();
        assert_eq!(failures_to_trip(&mut detector), Some(bound));
    }
}

#[test]
fn invalid_parameters_give_no_bound() {
    assert_eq!(
        Adaptive::new().ceiling(f64::NAN).max_failures_to_trip(),
        None
    );
    assert_eq!(
        Adaptive::new()
            .false_trips_per_million(0.0)
            .max_failures_to_trip(),
        None
    );
}

#[test]
fn a_rise_smaller_than_the_degradation_is_learned_and_a_larger_one_is_not() {
    let policy = Adaptive::new().warm_up(0);
    for (rate, learned) in [(0.08, true), (0.16, false)] {
        let mut detector = learned_at(&policy, 0.02);
        // The recent rate sees the new rate; trips are not acted on.
        for i in 0..20_000u64 {
            detector.record(outcome(i % 100 < (rate * 100.0) as u64), 0);
        }
        detector.retune();
        assert_eq!(detector.risen, learned, "{rate}");
        let baseline = detector.baseline();
        let expected = if learned { rate } else { 0.02 };
        assert!((baseline - expected).abs() < 0.01, "{rate}: {baseline}");
    }
}
