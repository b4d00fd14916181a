//! The time-window policy against a reference model: random steps drive one
//! breaker on paused time (successes and failures, at once or after a delay,
//! time passing, snapshots, resets), and after every step the breaker must
//! agree with a model that keeps every outcome with its time and judges the
//! rule as documented: over the buckets still in the window, at least
//! `min_calls` calls and a failure share at or above the rate.
//!
//! The breaker counts most successes without its lock, in a tally folded in
//! later; the model records each one at once. They must agree on when the
//! breaker trips and on the figures of every snapshot, wherever the
//! snapshots fall.
//!
//! `PROPTEST_CASES` sets the number of cases (default 200) and
//! `PROPTEST_RNG_SEED` the seed.

use crate::common;
use crate::common::paused;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tokio::time::{advance, Instant};
use tower_circuit_breaker::policy::{PolicyFigures, TimeWindow, TimeWindowFigures, TripReason};
use tower_circuit_breaker::State;

use common::{Call, Harness};
use paused::{paused_runtime, proptest_config};

#[derive(Clone, Copy, Debug)]
struct Window {
    bucket_ms: u64,
    buckets: u64,
    min_calls: u32,
    rate: f64,
}

impl Window {
    fn policy(self) -> TimeWindow {
        TimeWindow::new(Duration::from_millis(self.bucket_ms * self.buckets))
            .buckets(self.buckets as u32)
            .min_calls(self.min_calls)
            .failure_rate(self.rate)
    }
}

/// Every outcome since the window was last emptied, by bucket index.
struct Model {
    window: Window,
    outcomes: Vec<(u64, bool)>,
    open: bool,
}

impl Model {
    /// (calls, failures) over the buckets inside the window at `now_ms`.
    fn totals(&self, now_ms: u64) -> (u32, u32) {
        let index = now_ms / self.window.bucket_ms;
        self.outcomes
            .iter()
            .filter(|(i, _)| i + self.window.buckets > index)
            .fold((0, 0), |(calls, failures), &(_, failure)| {
                (calls + 1, failures + u32::from(failure))
            })
    }

    /// Records an outcome at `now_ms`; the trip's (failures, calls) if it
    /// trips the breaker.
    fn record(&mut self, now_ms: u64, failure: bool) -> Option<(u32, u32)> {
        self.outcomes
            .push((now_ms / self.window.bucket_ms, failure));
        let (calls, failures) = self.totals(now_ms);
        let trips = calls >= self.window.min_calls
            && f64::from(failures) / f64::from(calls) >= self.window.rate;
        trips.then(|| {
            self.open = true;
            self.outcomes.clear();
            (failures, calls)
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Succeed(usize),
    Fail(usize),
    /// An outcome after this many milliseconds in flight.
    Slow(bool, u64),
    Advance(u64),
    Snapshot,
    Reset,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1..=12usize).prop_map(Step::Succeed),
        3 => (1..=3usize).prop_map(Step::Fail),
        2 => (any::<bool>(), 1..=1_500u64).prop_map(|(fail, ms)| Step::Slow(fail, ms)),
        4 => (0..=2_500u64).prop_map(Step::Advance),
        2 => Just(Step::Snapshot),
        1 => Just(Step::Reset),
    ]
}

fn window() -> impl Strategy<Value = Window> {
    (
        prop_oneof![Just(1u64), Just(7), Just(100), Just(250), Just(1_000)],
        1..=6u64,
        1..=20u32,
        prop_oneof![Just(0.1), Just(0.25), Just(0.5), Just(0.75), Just(1.0)],
    )
        .prop_map(|(bucket_ms, buckets, min_calls, rate)| Window {
            bucket_ms,
            buckets,
            min_calls,
            rate,
        })
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

async fn run_case(window: Window, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let start = Instant::now();
    let now_ms = || start.elapsed().as_millis() as u64;
    let mut h = Harness::new(window.policy());
    let mut model = Model {
        window,
        outcomes: Vec::new(),
        open: false,
    };
    for (n, step) in steps.into_iter().enumerate() {
        // While open, calls are refused and nothing is recorded: only time,
        // snapshots and resets go on.
        let calls: Vec<Call> = match step {
            Step::Succeed(k) => vec![Call::Ok; k],
            Step::Fail(k) => vec![Call::Fail; k],
            Step::Slow(false, ms) => vec![Call::SlowOk(Duration::from_millis(ms))],
            Step::Slow(true, ms) => vec![Call::SlowFail(Duration::from_millis(ms))],
            Step::Advance(ms) => {
                advance(Duration::from_millis(ms)).await;
                vec![]
            }
            Step::Snapshot => {
                if !model.open {
                    let (calls, failures) = model.totals(now_ms());
                    let figures = h.breaker.snapshot().policy;
                    check(
                        figures == PolicyFigures::TimeWindow(TimeWindowFigures { calls, failures }),
                        || format!("step {n}: snapshot {figures:?}, model ({calls}, {failures})"),
                    )?;
                }
                vec![]
            }
            Step::Reset => {
                h.breaker.reset();
                model.outcomes.clear();
                model.open = false;
                vec![]
            }
        };
        for call in calls {
            if model.open {
                break;
            }
            let failure = matches!(call, Call::Fail | Call::SlowFail(_));
            h.through(call).await;
            let tripped = model.record(now_ms(), failure);
            let state = h.state();
            match tripped {
                None => check(state == State::Closed, || {
                    format!("step {n} ({step:?}): breaker {state:?}, model closed")
                })?,
                Some((failures, calls)) => {
                    let last = h.breaker.snapshot().last_trip;
                    let expected = TripReason::Policy(TimeWindowFigures { calls, failures }.into());
                    check(
                        state == State::Open && last.as_ref() == Some(&expected),
                        || {
                            format!("step {n} ({step:?}): breaker {state:?} after {last:?}, model tripped on {expected:?}")
                        },
                    )?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn time_window_agrees_with_the_reference_model_at_every_step() {
    let mut runner = TestRunner::new(proptest_config(200));
    let strategy = (window(), prop::collection::vec(step(), 1..150));
    let result = runner.run(&strategy, |(window, steps)| {
        paused_runtime().block_on(run_case(window, steps))
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}
