//! Trip policies, edge by edge: for each policy the call that trips it and
//! the pattern that must not; and config validation naming the bad field.
//!
//! All timing runs on paused tokio time.

use crate::common;

use std::time::Duration;

use tokio::time::advance;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::policy::{
    ConsecutiveFailures, ConsecutiveFailuresFigures, CountWindow, CountWindowFigures,
    FailuresWithin, FailuresWithinFigures, PolicyFigures, SlowCalls, SlowCallsFigures, TimeWindow,
    TimeWindowFigures, TripPolicy, TripReason,
};
use tower_circuit_breaker::{Breaker, Config, ConfigBuilder, State};

use common::{assert_policy_rejected, assert_rejected, builder, Call, Harness};

const SEC: Duration = Duration::from_secs(1);

fn last_trip(h: &Harness) -> Option<TripReason> {
    h.breaker.snapshot().last_trip
}

/// The reason a count window of `window` calls trips with `failures` in it
/// (its threshold).
fn count_window_trip(failures: u32, window: u32) -> TripReason {
    let threshold = failures;
    TripReason::Policy(
        CountWindowFigures {
            failures,
            threshold,
            window,
        }
        .into(),
    )
}

/// The reason a streak trips at its threshold, `failures` in a row.
fn in_a_row_trip(failures: u32) -> TripReason {
    TripReason::Policy(
        ConsecutiveFailuresFigures {
            failures,
            threshold: failures,
        }
        .into(),
    )
}

/// The reason a time window trips with `failures` of `calls` failed.
fn failure_rate_trip(failures: u32, calls: u32) -> TripReason {
    TripReason::Policy(TimeWindowFigures { calls, failures }.into())
}

/// What a time window shows holding `calls` calls, `failures` of them failed.
fn time_window_figures(calls: u32, failures: u32) -> PolicyFigures {
    PolicyFigures::TimeWindow(TimeWindowFigures { calls, failures })
}

/// Asserts the breaker is open and that `reason` is what tripped it last.
#[track_caller]
fn assert_tripped(h: &Harness, reason: TripReason) {
    assert_eq!(h.state(), State::Open);
    assert_eq!(last_trip(h), Some(reason));
}

/// Asserts the breaker's policy shows `figures`.
#[track_caller]
fn assert_figures_of(breaker: &Breaker, figures: PolicyFigures) {
    assert_eq!(breaker.snapshot().policy, figures);
}

/// Asserts the harness's breaker's policy shows `figures`.
#[track_caller]
fn assert_figures(h: &Harness, figures: PolicyFigures) {
    assert_figures_of(&h.breaker, figures);
}

/// Asserts the breaker is closed and its policy shows `figures`.
#[track_caller]
fn assert_closed_with(h: &Harness, figures: PolicyFigures) {
    assert_eq!(h.state(), State::Closed);
    assert_figures(h, figures);
}

/// Asserts the breaker is still closed, then that `call` (reaching the inner
/// service) opens it.
async fn next_call_opens(h: &mut Harness, call: Call) {
    assert_eq!(h.state(), State::Closed);
    h.through(call).await;
    assert_eq!(h.state(), State::Open);
}

/// Asserts the breaker is still closed, then that `call` trips it for
/// `reason`.
async fn next_call_trips(h: &mut Harness, call: Call, reason: TripReason) {
    next_call_opens(h, call).await;
    assert_eq!(last_trip(h), Some(reason));
}

/// `rounds` times over: `failures` failures, then `successes` successes.
async fn fail_then_succeed_rounds(
    h: &mut Harness,
    rounds: usize,
    failures: usize,
    successes: usize,
) {
    for _ in 0..rounds {
        h.fail(failures).await;
        h.succeed(successes).await;
    }
}

// ---------------------------------------------------------------------------
// ConsecutiveFailures
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn consecutive_failures_interrupted_by_a_success_stay_closed() {
    let mut h = Harness::new(ConsecutiveFailures::new(3));
    h.fail(2).await;
    h.succeed(1).await;
    h.fail(2).await;

    assert_eq!(h.breaker.snapshot().counts.opened, 0);
    assert_closed_with(
        &h,
        PolicyFigures::ConsecutiveFailures(ConsecutiveFailuresFigures {
            failures: 2,
            threshold: 3,
        }),
    );
    h.through(Call::Ok).await;
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_trip_on_the_kth_failure_in_a_row_naming_the_count() {
    let mut h = Harness::new(ConsecutiveFailures::new(3));
    h.fail(2).await;
    let reason = in_a_row_trip(3);
    next_call_trips(&mut h, Call::Fail, reason).await;
    assert_eq!(h.breaker.snapshot().counts.opened, 1);
    h.refused().await;
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_of_one_trip_on_the_first_failure() {
    let mut h = Harness::new(ConsecutiveFailures::new(1));
    h.succeed(10).await;
    let reason = in_a_row_trip(1);
    next_call_trips(&mut h, Call::Fail, reason).await;
}

// ---------------------------------------------------------------------------
// FailuresWithin
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn failures_within_trip_on_the_kth_failure_in_the_period_whatever_the_successes() {
    let mut h = Harness::new(FailuresWithin::new(3, 10 * SEC));
    for _ in 0..2 {
        h.fail(1).await;
        h.succeed(100).await;
        advance(3 * SEC).await;
    }
    assert_closed_with(
        &h,
        PolicyFigures::FailuresWithin(FailuresWithinFigures {
            failures: 2,
            threshold: 3,
            period: 10 * SEC,
        }),
    );
    let reason = TripReason::Policy(
        FailuresWithinFigures {
            failures: 3,
            threshold: 3,
            period: 10 * SEC,
        }
        .into(),
    );
    next_call_trips(&mut h, Call::Fail, reason).await;
    h.refused().await;
}

#[tokio::test(start_paused = true)]
async fn failures_within_spread_wider_than_the_period_never_trip() {
    let mut h = Harness::new(FailuresWithin::new(3, 10 * SEC));
    for _ in 0..20 {
        h.fail(1).await;
        advance(6 * SEC).await;
    }
    assert_eq!(h.breaker.snapshot().counts.opened, 0);
    // The latest failure, 6 s ago, is the only one within the period.
    assert_closed_with(
        &h,
        PolicyFigures::FailuresWithin(FailuresWithinFigures {
            failures: 1,
            threshold: 3,
            period: 10 * SEC,
        }),
    );
    h.through(Call::Ok).await;
}

#[tokio::test(start_paused = true)]
async fn failures_within_count_afresh_after_the_breaker_closes_again() {
    let config = builder(FailuresWithin::new(2, 10 * SEC))
        .cooldown(SEC)
        .build()
        .unwrap();
    let mut h = Harness::with_config(config);
    h.fail(2).await;
    assert_eq!(h.state(), State::Open);
    advance(SEC).await;
    h.through(Call::Ok).await;
    assert_eq!(h.state(), State::Closed);
    // The failures before the opening are forgotten: one more does not trip.
    h.fail(1).await;
    assert_eq!(h.state(), State::Closed);
    h.fail(1).await;
    assert_eq!(h.state(), State::Open);
}

#[test]
fn failures_within_out_of_range_are_refused_naming_the_field() {
    assert_policy_rejected(FailuresWithin::new(0, SEC), "trip.failures_within.failures");
    assert_policy_rejected(
        FailuresWithin::new(3, Duration::ZERO),
        "trip.failures_within.period",
    );
}

// ---------------------------------------------------------------------------
// CountWindow
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn count_window_never_trips_with_two_failures_in_any_ten() {
    let mut h = Harness::new(CountWindow::new(3, 10));
    // F F S S S S S S S S, repeated: every run of ten holds exactly two.
    fail_then_succeed_rounds(&mut h, 50, 2, 8).await;
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.breaker.snapshot().counts.opened, 0);
    assert_eq!(h.breaker.snapshot().counts.failures, 100);
}

#[tokio::test(start_paused = true)]
async fn count_window_trips_on_third_failure_in_last_ten() {
    let mut h = Harness::new(CountWindow::new(3, 10));
    h.fail(1).await;
    h.succeed(7).await;
    h.fail(1).await;
    // Outcomes 1..=10: F, 7 x S, F, F.
    next_call_trips(&mut h, Call::Fail, count_window_trip(3, 10)).await;
    h.refused().await;
}

#[tokio::test(start_paused = true)]
async fn count_window_trips_on_third_failure_in_ten_after_thousand_successes() {
    let mut h = Harness::new(CountWindow::new(3, 10));
    h.succeed(1000).await;
    h.fail(1).await;
    h.succeed(2).await;
    h.fail(1).await;
    h.succeed(1).await;
    next_call_trips(&mut h, Call::Fail, count_window_trip(3, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn count_window_failures_spaced_n_outcomes_apart_never_trip() {
    // k = 2 of N = 5: a failure, four successes, a failure... each failure
    // has left the last five outcomes when the next one comes.
    let mut h = Harness::new(CountWindow::new(2, 5));
    fail_then_succeed_rounds(&mut h, 100, 1, 4).await;
    assert_eq!(h.state(), State::Closed);
    assert_eq!(h.breaker.snapshot().counts.opened, 0);
}

#[tokio::test(start_paused = true)]
async fn count_window_failures_just_inside_n_outcomes_trip() {
    // The non-trip edge above, one success fewer: F S S S F spans five.
    let mut h = Harness::new(CountWindow::new(2, 5));
    h.fail(1).await;
    h.succeed(3).await;
    h.fail(1).await;
    assert_tripped(&h, count_window_trip(2, 5));
}

/// A breaker whose count window forgets failures older than a minute, after
/// `before` failures, `wait` seconds, then `after` failures.
async fn stale_after_a_minute_failed(before: usize, wait: u64, after: usize) -> Harness {
    let mut h = Harness::new(CountWindow::new(3, 10).stale_after(Duration::from_secs(60)));
    h.fail(before).await;
    advance(Duration::from_secs(wait)).await;
    h.fail(after).await;
    h
}

#[tokio::test(start_paused = true)]
async fn count_window_failures_older_than_stale_after_do_not_count() {
    let mut h = stale_after_a_minute_failed(2, 61, 1).await;
    assert_closed_with(
        &h,
        PolicyFigures::CountWindow(CountWindowFigures {
            failures: 1,
            threshold: 3,
            window: 10,
        }),
    );
    advance(Duration::from_secs(61)).await;
    h.fail(2).await;
    assert_eq!(h.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn count_window_fresh_failures_within_stale_after_trip() {
    let h = stale_after_a_minute_failed(2, 59, 1).await;
    assert_tripped(&h, count_window_trip(3, 10));
}

#[tokio::test(start_paused = true)]
async fn count_window_stale_failure_is_replaced_by_fresh_ones_then_trips() {
    let mut h = stale_after_a_minute_failed(1, 61, 2).await;
    next_call_opens(&mut h, Call::Fail).await;
}

// ---------------------------------------------------------------------------
// TimeWindow
// ---------------------------------------------------------------------------

fn time_window(min_calls: u32, rate: f64) -> TimeWindow {
    TimeWindow::new(Duration::from_secs(10))
        .buckets(10)
        .min_calls(min_calls)
        .failure_rate(rate)
}

#[tokio::test(start_paused = true)]
async fn time_window_all_failures_below_min_calls_stay_closed() {
    let mut h = Harness::new(time_window(10, 0.5));
    h.fail(9).await;
    assert_closed_with(&h, time_window_figures(9, 9));
    // The tenth call reaches min_calls: now the 100% rate trips it.
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(10, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_trips_when_failure_rate_equals_threshold() {
    let mut h = Harness::new(time_window(4, 0.5));
    h.succeed(2).await;
    h.fail(1).await;
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(2, 4)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_failure_rate_just_below_threshold_stays_closed() {
    let mut h = Harness::new(time_window(4, 0.5));
    h.succeed(5).await;
    // 1/6, 2/7, 3/8, 4/9: all below one half.
    h.fail(4).await;
    assert_closed_with(&h, time_window_figures(9, 4));
    // 5/10 reaches it.
    next_call_opens(&mut h, Call::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_trips_at_exactly_seven_of_twenty_five_with_rate_0_28() {
    // 7 / 25 is exactly 28%: the threshold is `>=`, so this must trip, even
    // though 0.28 * 25.0 rounds to 7.000000000000001 in f64.
    let mut h = Harness::new(time_window(25, 0.28));
    h.succeed(18).await;
    h.fail(6).await;
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(7, 25)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_trips_at_exactly_fifty_five_of_a_hundred_with_rate_0_55() {
    let mut h = Harness::new(
        TimeWindow::new(Duration::from_secs(10))
            .min_calls(100)
            .failure_rate(0.55),
    );
    h.succeed(45).await;
    h.fail(54).await;
    next_call_opens(&mut h, Call::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_failures_aged_out_of_the_window_do_not_count() {
    let mut h = Harness::new(time_window(4, 0.5));
    h.fail(3).await;
    advance(Duration::from_secs(11)).await;
    assert_figures(&h, time_window_figures(0, 0));
    // Counting the three old failures would make 4 of 7.
    h.succeed(3).await;
    h.fail(1).await;
    assert_closed_with(&h, time_window_figures(4, 1));
}

#[tokio::test(start_paused = true)]
async fn time_window_failures_still_inside_the_window_count() {
    let mut h = Harness::new(time_window(4, 0.5));
    h.fail(3).await;
    advance(Duration::from_secs(5)).await;
    h.fail(1).await;
    assert_tripped(&h, failure_rate_trip(4, 4));
}

#[tokio::test(start_paused = true)]
async fn time_window_successes_count_in_the_bucket_of_their_own_time() {
    let mut h = Harness::new(time_window(10, 0.5));
    h.succeed(6).await;
    advance(Duration::from_secs(3)).await;
    h.succeed(4).await;
    // At 11.5 s the window holds the buckets from 2 s on: the four
    // successes made at 3 s count, the six made at 0 s no longer do.
    advance(Duration::from_millis(8_500)).await;
    h.fail(5).await;
    assert_eq!(h.state(), State::Closed, "5 failures in 9 calls");
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(6, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_successes_folded_in_by_a_failure_count_at_their_own_time() {
    let mut h = Harness::new(time_window(10, 0.5));
    h.succeed(4).await;
    advance(Duration::from_secs(2)).await;
    // Folded in by this failure, at 2 s: they must still count at 0 s.
    h.fail(1).await;
    // At 10.5 s the window starts at 1 s: only the failure is left in it.
    advance(Duration::from_millis(8_500)).await;
    h.fail(8).await;
    assert_eq!(h.state(), State::Closed, "9 failures in 9 calls");
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(10, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_reset_while_closed_forgets_tallied_successes() {
    let mut h = Harness::new(time_window(10, 0.5));
    h.succeed(5).await;
    h.breaker.reset();
    assert_closed_with(&h, time_window_figures(0, 0));
    h.fail(9).await;
    next_call_trips(&mut h, Call::Fail, failure_rate_trip(10, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_successes_tallied_before_a_forced_open_do_not_count_after_it() {
    let mut h = Harness::new(time_window(10, 0.5));
    h.succeed(5).await;
    h.breaker.force_open(None);
    h.breaker.restore();
    assert_closed_with(&h, time_window_figures(0, 0));
    h.succeed(2).await;
    assert_closed_with(&h, time_window_figures(2, 0));
}

#[tokio::test(start_paused = true)]
async fn successes_tallied_for_two_windows_of_different_buckets_count_in_each() {
    // A window of 3 s in buckets of 1 s, and one of 4 s in buckets of 2 s:
    // a tally counts up to the end of the shorter bucket.
    let policy = TripPolicy::any_of([
        TimeWindow::new(Duration::from_secs(3))
            .buckets(3)
            .min_calls(100)
            .into(),
        SlowCalls::new(SEC)
            .min_calls(100)
            .over_time(Duration::from_secs(4), 2)
            .into(),
    ]);
    let mut h = Harness::new(policy);
    h.succeed(3).await;
    // At 3.5 s the 1 s buckets hold 1 s on, so the successes made at 0 s
    // have left them; the 2 s buckets hold them all.
    advance(Duration::from_millis(3_500)).await;
    assert_closed_with(
        &h,
        PolicyFigures::AnyOf(vec![
            time_window_figures(0, 0),
            PolicyFigures::SlowCalls(SlowCallsFigures { calls: 3, slow: 0 }),
        ]),
    );
}

#[tokio::test(start_paused = true)]
async fn time_window_a_success_that_brings_the_calls_to_min_calls_at_the_rate_trips_it() {
    let mut h = Harness::new(time_window(4, 0.5));
    h.fail(2).await;
    h.succeed(1).await;
    // 2 failures in 4 calls: at the rate, with enough calls.
    next_call_trips(&mut h, Call::Ok, failure_rate_trip(2, 4)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_success_in_flight_when_it_trips_is_stale_and_not_counted() {
    let mut h = Harness::new(time_window(2, 0.5));
    h.succeed(3).await;
    let mut other = h.svc.clone();
    let in_flight = other.ready().await.unwrap().call(Call::SlowOk(SEC));
    // 2 failures in 5 calls, then 3 in 6: at the rate.
    h.fail(2).await;
    next_call_opens(&mut h, Call::Fail).await;
    assert!(in_flight.await.is_ok());
    let snapshot = h.breaker.snapshot();
    assert_eq!(snapshot.counts.stale, 1);
    assert_eq!(last_trip(&h), Some(failure_rate_trip(3, 6)));
}

/// Every success of clones on several threads counts, however many share a
/// tally's word, and past the most a word holds before it is folded in.
#[test]
fn time_window_counts_every_success_of_clones_on_several_threads() {
    let breaker = common::breaker(
        TimeWindow::new(Duration::from_secs(3_600))
            .min_calls(1_000_000)
            .failure_rate(0.5),
    );
    let calls = [70_000, 5_000, 5_000, 5_000, 5_000];
    std::thread::scope(|scope| {
        for n in calls {
            let breaker = &breaker;
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let mut h = Harness::with_breaker(breaker.clone());
                    h.succeed(n).await;
                });
            });
        }
    });
    // A window of an hour in buckets of six minutes: every call is inside.
    assert_figures_of(
        &breaker,
        time_window_figures(calls.iter().sum::<usize>() as u32, 0),
    );
}

// ---------------------------------------------------------------------------
// SlowCalls
// ---------------------------------------------------------------------------

const SLOW: Duration = Duration::from_secs(2);
const FAST: Duration = Duration::from_millis(500);

fn slow_calls(min_calls: u32, rate: f64) -> SlowCalls {
    SlowCalls::new(SEC)
        .rate(rate)
        .over_calls(10)
        .min_calls(min_calls)
}

#[tokio::test(start_paused = true)]
async fn slow_calls_count_as_slow_whatever_their_outcome() {
    let mut h = Harness::new(slow_calls(10, 0.5));
    h.through(Call::SlowOk(SLOW)).await;
    h.through(Call::SlowFail(SLOW)).await;
    h.through(Call::SlowOk(FAST)).await;
    h.through(Call::SlowFail(FAST)).await;
    h.through(Call::Ok).await;
    h.through(Call::Fail).await;
    assert_closed_with(
        &h,
        PolicyFigures::SlowCalls(SlowCallsFigures { calls: 6, slow: 2 }),
    );
}

#[tokio::test(start_paused = true)]
async fn slow_calls_fast_calls_and_fast_failures_never_trip() {
    let mut h = Harness::new(slow_calls(4, 0.5));
    for _ in 0..20 {
        h.through(Call::SlowOk(FAST)).await;
        h.through(Call::SlowFail(FAST)).await;
        h.through(Call::Fail).await;
    }
    assert_closed_with(
        &h,
        PolicyFigures::SlowCalls(SlowCallsFigures { calls: 10, slow: 0 }),
    );
}

#[tokio::test(start_paused = true)]
async fn slow_calls_exactly_at_the_threshold_are_not_slow() {
    let mut h = Harness::new(slow_calls(1, 0.5));
    h.through(Call::SlowOk(SEC)).await;
    assert_closed_with(
        &h,
        PolicyFigures::SlowCalls(SlowCallsFigures { calls: 1, slow: 0 }),
    );
}

#[tokio::test(start_paused = true)]
async fn slow_calls_below_min_calls_never_trip_even_all_slow() {
    let mut h = Harness::new(slow_calls(4, 0.5));
    h.repeat(3, Call::SlowOk(SLOW)).await;
    let reason = TripReason::Policy(SlowCallsFigures { calls: 4, slow: 4 }.into());
    next_call_trips(&mut h, Call::SlowOk(SLOW), reason).await;
}

#[tokio::test(start_paused = true)]
async fn slow_call_rate_trips_at_threshold_not_just_below() {
    let mut h = Harness::new(slow_calls(4, 0.5));
    h.repeat(3, Call::SlowOk(FAST)).await;
    h.through(Call::SlowOk(SLOW)).await; // 1 of 4
    h.through(Call::SlowOk(SLOW)).await; // 2 of 5
    let reason = TripReason::Policy(SlowCallsFigures { calls: 6, slow: 3 }.into()); // 3 of 6
    next_call_trips(&mut h, Call::SlowOk(SLOW), reason).await;
}

#[tokio::test(start_paused = true)]
async fn slow_call_window_trips_on_recent_slow_calls_after_many_fast_ones() {
    // Over the last 4 calls: 100 fast calls do not dilute two slow ones.
    let mut h = Harness::new(SlowCalls::new(SEC).rate(0.5).over_calls(4).min_calls(4));
    h.succeed(100).await;
    h.through(Call::SlowOk(SLOW)).await;
    let reason = TripReason::Policy(SlowCallsFigures { calls: 4, slow: 2 }.into());
    next_call_trips(&mut h, Call::SlowOk(SLOW), reason).await;
}

#[tokio::test(start_paused = true)]
async fn slow_calls_running_concurrently_all_count_as_slow() {
    let b = common::breaker(SlowCalls::new(SEC).rate(1.0).over_calls(10).min_calls(3));
    let inner = common::Upstream::<Call>::default();
    let svc = tower_circuit_breaker::CircuitBreaker::new(inner.clone(), &b);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            use tower::ServiceExt;
            svc.oneshot(Call::SlowOk(SLOW)).await
        }));
    }
    for task in tasks {
        assert!(task.await.unwrap().is_ok());
    }
    assert_eq!(inner.calls(), 3);
    assert_eq!(b.state(), State::Open);
    assert_eq!(
        b.snapshot().last_trip,
        Some(TripReason::Policy(
            SlowCallsFigures { calls: 3, slow: 3 }.into()
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn slow_call_rate_trips_at_exactly_seven_of_twenty_five_with_rate_0_28() {
    // 7 / 25 is exactly 28%: `>=` must trip, whatever f64 makes of 0.28 * 25.
    let mut h = Harness::new(SlowCalls::new(SEC).rate(0.28).over_calls(25).min_calls(25));
    h.succeed(18).await;
    h.repeat(6, Call::SlowOk(SLOW)).await;
    let reason = TripReason::Policy(SlowCallsFigures { calls: 25, slow: 7 }.into());
    next_call_trips(&mut h, Call::SlowOk(SLOW), reason).await;
}

fn slow_calls_over_time() -> SlowCalls {
    SlowCalls::new(SEC)
        .rate(0.5)
        .min_calls(4)
        .over_time(Duration::from_secs(10), 10)
}

#[tokio::test(start_paused = true)]
async fn slow_calls_over_time_trip_at_rate_within_the_window() {
    let mut h = Harness::new(slow_calls_over_time());
    h.through(Call::Ok).await;
    h.through(Call::Ok).await;
    h.through(Call::SlowOk(SLOW)).await;
    let reason = TripReason::Policy(SlowCallsFigures { calls: 4, slow: 2 }.into());
    next_call_trips(&mut h, Call::SlowFail(SLOW), reason).await;
}

#[tokio::test(start_paused = true)]
async fn slow_calls_over_time_aged_out_of_the_window_do_not_count() {
    let mut h = Harness::new(slow_calls_over_time());
    h.repeat(3, Call::SlowOk(SLOW)).await;
    assert_eq!(h.state(), State::Closed);
    advance(Duration::from_secs(11)).await;
    // Counting the three old slow calls would make 4 of 7.
    h.succeed(3).await;
    h.through(Call::SlowOk(SLOW)).await;
    assert_closed_with(
        &h,
        PolicyFigures::SlowCalls(SlowCallsFigures { calls: 4, slow: 1 }),
    );
}

// ---------------------------------------------------------------------------
// AnyOf
// ---------------------------------------------------------------------------

/// Three consecutive failures, or three in the last ten calls.
fn streak_or_count_window() -> TripPolicy {
    TripPolicy::any_of([
        ConsecutiveFailures::new(3).into(),
        CountWindow::new(3, 10).into(),
    ])
}

#[tokio::test(start_paused = true)]
async fn any_of_opens_on_count_window_and_names_it_when_consecutive_does_not_trip() {
    let mut h = Harness::new(streak_or_count_window());
    h.fail(1).await;
    h.succeed(1).await;
    h.fail(1).await;
    h.succeed(1).await;
    next_call_trips(&mut h, Call::Fail, count_window_trip(3, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn any_of_opens_on_consecutive_failures_and_names_it_when_the_window_does_not_trip() {
    let mut h = Harness::new(TripPolicy::any_of([
        CountWindow::new(5, 10).into(),
        ConsecutiveFailures::new(2).into(),
    ]));
    h.fail(1).await;
    let reason = in_a_row_trip(2);
    next_call_trips(&mut h, Call::Fail, reason).await;
}

#[tokio::test(start_paused = true)]
async fn any_of_names_the_first_member_in_order_when_two_trip_on_the_same_call() {
    let rate = || -> TripPolicy {
        TimeWindow::new(Duration::from_secs(60))
            .min_calls(3)
            .failure_rate(1.0)
            .into()
    };
    let streak = || -> TripPolicy { ConsecutiveFailures::new(3).into() };

    let mut h = Harness::new(TripPolicy::any_of([rate(), streak()]));
    h.fail(3).await;
    assert_eq!(last_trip(&h), Some(failure_rate_trip(3, 3)));

    let mut h = Harness::new(TripPolicy::any_of([streak(), rate()]));
    h.fail(3).await;
    assert_eq!(last_trip(&h), Some(in_a_row_trip(3)));
}

#[tokio::test(start_paused = true)]
async fn any_of_opens_on_slow_calls_and_names_them() {
    let mut h = Harness::new(TripPolicy::any_of([
        ConsecutiveFailures::new(5).into(),
        SlowCalls::new(SEC)
            .rate(1.0)
            .over_calls(10)
            .min_calls(2)
            .into(),
    ]));
    h.through(Call::SlowOk(SLOW)).await;
    let reason = TripReason::Policy(SlowCallsFigures { calls: 2, slow: 2 }.into());
    next_call_trips(&mut h, Call::SlowOk(SLOW), reason).await;
}

#[tokio::test(start_paused = true)]
async fn any_of_stays_closed_while_no_member_trips() {
    let mut h = Harness::new(streak_or_count_window());
    // F F S S S S S S S S, repeated: never three in a row, never three in ten.
    fail_then_succeed_rounds(&mut h, 20, 2, 8).await;
    assert_closed_with(
        &h,
        PolicyFigures::AnyOf(vec![
            PolicyFigures::ConsecutiveFailures(ConsecutiveFailuresFigures {
                failures: 0,
                threshold: 3,
            }),
            PolicyFigures::CountWindow(CountWindowFigures {
                failures: 2,
                threshold: 3,
                window: 10,
            }),
        ]),
    );
}

// ---------------------------------------------------------------------------
// After a close, every policy starts afresh
// ---------------------------------------------------------------------------

async fn trip_then_close(h: &mut Harness, trip: usize) {
    h.fail(trip).await;
    assert_eq!(h.state(), State::Open);
    advance(Duration::from_secs(30)).await; // default cooldown
    h.succeed(1).await; // the probe
    assert_eq!(h.state(), State::Closed);
}

/// Trips and closes a breaker over `policy` with three failures, then
/// checks that it takes three fresh failures, not one, to open it again.
async fn three_fresh_failures_open_after_a_close(policy: impl Into<TripPolicy>) {
    let mut h = Harness::new(policy);
    trip_then_close(&mut h, 3).await;
    h.fail(2).await;
    next_call_opens(&mut h, Call::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn count_window_starts_empty_after_the_breaker_closes_again() {
    three_fresh_failures_open_after_a_close(CountWindow::new(3, 10)).await;
}

#[tokio::test(start_paused = true)]
async fn time_window_starts_empty_after_the_breaker_closes_again() {
    // The close comes 30 s later, still inside a 60 s window.
    let mut h = Harness::new(
        TimeWindow::new(Duration::from_secs(60))
            .min_calls(4)
            .failure_rate(0.5),
    );
    trip_then_close(&mut h, 4).await;
    h.fail(3).await;
    assert_closed_with(&h, time_window_figures(3, 3));
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_start_from_zero_after_the_breaker_closes_again() {
    three_fresh_failures_open_after_a_close(ConsecutiveFailures::new(3)).await;
}

// ---------------------------------------------------------------------------
// Config validation
// ---------------------------------------------------------------------------

fn ok() -> ConfigBuilder {
    Config::builder()
}

/// Asserts that a config tripping on `policy` builds.
#[track_caller]
fn assert_policy_builds(policy: impl Into<TripPolicy>) {
    assert!(builder(policy).build().is_ok());
}

#[test]
fn zero_consecutive_failures_threshold_is_rejected() {
    let field = "trip.consecutive_failures.threshold";
    assert_policy_rejected(ConsecutiveFailures::new(0), field);
}

#[test]
fn count_window_with_zero_failures_is_rejected() {
    assert_policy_rejected(CountWindow::new(0, 10), "trip.count_window.failures");
}

#[test]
fn count_window_with_more_failures_than_its_window_is_rejected() {
    assert_policy_rejected(CountWindow::new(11, 10), "trip.count_window.failures");
    assert_policy_builds(CountWindow::new(10, 10));
}

#[test]
fn count_window_with_zero_stale_after_is_rejected() {
    let policy = CountWindow::new(3, 10).stale_after(Duration::ZERO);
    assert_policy_rejected(policy, "trip.count_window.stale_after");
}

#[test]
fn time_window_failure_rate_of_zero_above_one_or_nan_is_rejected() {
    let window = || TimeWindow::new(Duration::from_secs(10));
    for rate in [0.0, -0.5, 1.000_001, 2.0, f64::NAN, f64::INFINITY] {
        assert_policy_rejected(window().failure_rate(rate), "trip.time_window.failure_rate");
    }
    assert_policy_builds(window().failure_rate(1.0));
}

#[test]
fn slow_call_rate_of_zero_above_one_or_nan_is_rejected() {
    for rate in [0.0, -0.5, 1.5, f64::NAN, f64::NEG_INFINITY] {
        assert_policy_rejected(SlowCalls::new(SEC).rate(rate), "trip.slow_calls.rate");
    }
}

#[test]
fn time_window_with_zero_min_calls_is_rejected() {
    let policy = TimeWindow::new(Duration::from_secs(10)).min_calls(0);
    assert_policy_rejected(policy, "trip.time_window.min_calls");
}

#[test]
fn time_window_with_zero_buckets_is_rejected() {
    let policy = TimeWindow::new(Duration::from_secs(10)).buckets(0);
    assert_policy_rejected(policy, "trip.time_window.buckets");
}

#[test]
fn time_window_shorter_than_one_millisecond_per_bucket_is_rejected() {
    let window = |length, buckets| TimeWindow::new(length).buckets(buckets);
    let field = "trip.time_window.window";
    assert_policy_rejected(window(Duration::from_millis(9), 10), field);
    assert_policy_rejected(window(Duration::ZERO, 1), field);
    assert_policy_builds(window(Duration::from_millis(10), 10));
}

#[test]
fn slow_calls_with_zero_threshold_is_rejected() {
    assert_policy_rejected(
        SlowCalls::new(Duration::ZERO),
        "trip.slow_calls.slower_than",
    );
}

#[test]
fn slow_calls_over_zero_calls_is_rejected() {
    let policy = SlowCalls::new(SEC).over_calls(0);
    assert_policy_rejected(policy, "trip.slow_calls.window.calls");
}

#[test]
fn slow_calls_min_calls_above_its_call_window_is_rejected() {
    let policy = SlowCalls::new(SEC).over_calls(5).min_calls(6);
    assert_policy_rejected(policy, "trip.slow_calls.min_calls");
}

#[test]
fn slow_calls_over_time_shorter_than_one_millisecond_per_bucket_is_rejected() {
    let policy = SlowCalls::new(SEC).over_time(Duration::from_millis(5), 10);
    assert_policy_rejected(policy, "trip.slow_calls.window.length");
}

#[test]
fn zero_probes_is_rejected() {
    assert_rejected(ok().probes(0), "probes");
}

#[test]
fn zero_successes_to_close_is_rejected() {
    assert_rejected(ok().successes_to_close(0), "successes_to_close");
}

#[test]
fn min_open_above_max_open_is_rejected() {
    assert_rejected(
        ok().max_open(Duration::from_secs(60))
            .cooldown(Duration::from_secs(30))
            .min_open(Duration::from_secs(61)),
        "min_open",
    );
}

#[test]
fn cooldown_above_max_open_is_rejected() {
    assert_rejected(
        ok().max_open(Duration::from_secs(60))
            .cooldown(Duration::from_secs(61)),
        "cooldown",
    );
}

#[test]
fn zero_cooldown_is_rejected() {
    assert_rejected(ok().cooldown(Duration::ZERO), "cooldown");
}

#[test]
fn max_open_above_a_year_is_rejected() {
    assert_rejected(ok().max_open(Duration::MAX), "max_open");
}

#[test]
fn backoff_below_one_or_nan_is_rejected() {
    for backoff in [0.999, 0.0, -2.0, f64::NAN, f64::INFINITY] {
        assert_rejected(ok().backoff(backoff), "backoff");
    }
    assert!(ok().backoff(1.0).build().is_ok());
}

#[test]
fn jitter_of_one_or_more_negative_or_nan_is_rejected() {
    for jitter in [1.0, 1.5, -0.1, f64::NAN] {
        assert_rejected(ok().jitter(jitter), "jitter");
    }
    assert!(ok().jitter(0.0).build().is_ok());
    assert!(ok().jitter(0.999).build().is_ok());
}

#[test]
fn zero_probe_timeout_is_rejected() {
    assert_rejected(ok().probe_timeout(Some(Duration::ZERO)), "probe_timeout");
    assert!(ok().probe_timeout(None).build().is_ok());
}

#[test]
fn empty_any_of_is_rejected() {
    assert_policy_rejected(TripPolicy::any_of([]), "trip.any_of");
}

#[test]
fn invalid_member_of_any_of_is_named_by_its_index() {
    let policy = TripPolicy::any_of([
        ConsecutiveFailures::new(3).into(),
        CountWindow::new(0, 10).into(),
    ]);
    assert_policy_rejected(policy, "trip.any_of[1].count_window.failures");
}

#[test]
fn invalid_member_of_nested_any_of_is_named_by_its_path() {
    let streak = || -> TripPolicy { ConsecutiveFailures::new(3).into() };
    let bad_rate = TimeWindow::new(Duration::from_secs(10)).failure_rate(0.0);
    let nested = TripPolicy::any_of([streak(), bad_rate.into()]);
    let policy = TripPolicy::any_of([nested, CountWindow::new(3, 10).into()]);
    let field = "trip.any_of[0].any_of[1].time_window.failure_rate";
    assert_policy_rejected(policy, field);
    let policy = TripPolicy::any_of([streak(), TripPolicy::any_of([])]);
    assert_policy_rejected(policy, "trip.any_of[1].any_of");
}

#[test]
fn boundary_values_are_accepted() {
    let config = ok()
        .cooldown(Duration::from_secs(60))
        .max_open(Duration::from_secs(60))
        .min_open(Duration::from_secs(60))
        .backoff(1.0)
        .jitter(0.0)
        .probes(1)
        .successes_to_close(1)
        .trip(TripPolicy::any_of([
            ConsecutiveFailures::new(1).into(),
            CountWindow::new(1, 1).into(),
            TimeWindow::new(Duration::from_millis(1))
                .buckets(1)
                .min_calls(1)
                .failure_rate(1.0)
                .into(),
            SlowCalls::new(Duration::from_nanos(1))
                .rate(1.0)
                .over_calls(1)
                .min_calls(1)
                .into(),
        ]))
        .build();
    assert!(config.is_ok(), "{config:?}");
}

/// Every combination of extreme values either builds or returns an error:
/// nothing panics, neither building nor running a breaker with what built.
#[tokio::test(start_paused = true)]
async fn build_never_panics_on_extreme_values() {
    let durations = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_secs(300),
        Duration::from_secs(365 * 24 * 3600),
        Duration::MAX,
    ];
    let floats = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        f64::MIN_POSITIVE,
        0.5,
        1.0,
        1.0 + f64::EPSILON,
        1000.0,
        f64::MAX,
    ];
    let counts = [0u32, 1, 2, 1_000_000, u32::MAX];

    let mut policies: Vec<TripPolicy> = Vec::new();
    for &n in &counts {
        policies.push(ConsecutiveFailures::new(n).into());
        for &m in &counts {
            policies.push(CountWindow::new(n, m).into());
        }
        for &d in &durations {
            policies.push(CountWindow::new(1, n.max(1)).stale_after(d).into());
            for &rate in &floats {
                policies.push(
                    TimeWindow::new(d)
                        .buckets(n)
                        .min_calls(n)
                        .failure_rate(rate)
                        .into(),
                );
                policies.push(SlowCalls::new(d).rate(rate).over_calls(n).into());
                policies.push(SlowCalls::new(d).over_time(d, n).min_calls(n).into());
            }
        }
    }
    policies.push(TripPolicy::any_of(policies.clone()));

    let mut builders: Vec<ConfigBuilder> = Vec::new();
    for p in policies {
        builders.push(builder(p));
    }
    for &d in &durations {
        builders.push(ok().cooldown(d));
        builders.push(ok().min_open(d));
        builders.push(ok().max_open(d));
        builders.push(ok().probe_timeout(Some(d)));
        builders.push(ok().cooldown(d).max_open(d).min_open(d));
    }
    for &f in &floats {
        builders.push(ok().backoff(f));
        builders.push(ok().jitter(f));
        builders.push(
            ok().backoff(f)
                .jitter(0.99)
                .min_open(Duration::from_secs(1))
                .max_open(Duration::from_secs(365 * 24 * 3600)),
        );
    }
    for &n in &counts {
        builders.push(ok().probes(n));
        builders.push(ok().successes_to_close(n));
    }

    let (mut built, mut rejected) = (0, 0);
    for b in builders {
        match b.build() {
            Err(err) => {
                assert!(!err.field().is_empty());
                rejected += 1;
            }
            Ok(config) => {
                built += 1;
                // A valid config keeps its documented relations.
                assert!(config.cooldown() > Duration::ZERO);
                assert!(config.cooldown() <= config.max_open());
                assert!(config.min_open() <= config.max_open());
                assert!(config.backoff() >= 1.0);
                assert!((0.0..1.0).contains(&config.jitter()));
                assert!(config.probes() >= 1);
                assert!(config.successes_to_close() >= 1);
                // Running it does not panic either.
                let mut h = Harness::with_breaker(Breaker::new(config));
                let _ = h.call(Call::Fail).await;
                let _ = h.call(Call::Ok).await;
                let _ = h.breaker.snapshot();
            }
        }
    }
    assert!(
        built > 0 && rejected > 0,
        "built {built}, rejected {rejected}"
    );
}
