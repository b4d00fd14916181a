//! The fixed trip policies of studies 5 to 7, and a replica of their
//! rules fast enough to tune them over a wide grid on tens of millions of
//! calls.
//!
//! The replica drives a rule as the studies drive a breaker (see `Drive`
//! in `outage.rs`): every call made while closed is judged; after a trip
//! the rule starts afresh and the next calls are probes, drawn from the
//! same provider, until one succeeds. Consecutive failures and count
//! windows are replicated exactly (the bench checks it against the real
//! layer); a time window ignores the jump of the clock over an open
//! period, which only moves where its buckets begin, as it starts empty
//! after a trip anyway. The figures the tables show are measured through
//! the real layer; the replica only chooses which settings to measure.

use std::collections::VecDeque;
use std::time::Duration;

use tower_circuit_breaker::policy::{ConsecutiveFailures, CountWindow, TimeWindow, TripPolicy};

use crate::failures::Provider;
use crate::rng::SplitMix64;

/// Calls per second: what a time window sees.
pub const CALLS_PER_SECOND: u64 = 10;

/// Calls a time window must hold before it judges, in every setting.
pub const TIME_WINDOW_MIN_CALLS: u32 = 20;

/// One fixed setting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fixed {
    Consecutive(u32),
    Count { failures: u32, window: u32 },
    Time { seconds: u32, rate: f64 },
}

impl Fixed {
    pub fn family(&self) -> &'static str {
        match self {
            Fixed::Consecutive(_) => "consecutive",
            Fixed::Count { .. } => "count window",
            Fixed::Time { .. } => "time window",
        }
    }

    pub fn name(&self) -> String {
        match *self {
            Fixed::Consecutive(k) => format!("consecutive {k}"),
            Fixed::Count { failures, window } => format!("count window {failures} of {window}"),
            Fixed::Time { seconds, rate } => {
                format!("time window {seconds} s, {:.0}%", rate * 100.0)
            }
        }
    }

    /// The crate's policy for this setting.
    pub fn trip(&self) -> TripPolicy {
        match *self {
            Fixed::Consecutive(k) => ConsecutiveFailures::new(k).into(),
            Fixed::Count { failures, window } => CountWindow::new(failures, window).into(),
            Fixed::Time { seconds, rate } => {
                TimeWindow::new(Duration::from_secs(u64::from(seconds)))
                    .min_calls(TIME_WINDOW_MIN_CALLS)
                    .failure_rate(rate)
                    .into()
            }
        }
    }
}

/// The running state of a replica.
enum Rule {
    Consecutive {
        threshold: u32,
        streak: u32,
    },
    Count {
        failures: u32,
        window: u64,
        outcomes: u64,
        /// The outcome numbers of the latest failures, at most `failures`.
        recent: VecDeque<u64>,
    },
    Time {
        rate: f64,
        bucket_calls: u64,
        /// Calls and failures per bucket, the newest at `head`.
        slots: Vec<(u32, u32)>,
        head: usize,
        head_index: u64,
        calls: u32,
        failed: u32,
    },
}

impl Rule {
    fn new(fixed: Fixed) -> Self {
        match fixed {
            Fixed::Consecutive(threshold) => Rule::Consecutive {
                threshold,
                streak: 0,
            },
            Fixed::Count { failures, window } => Rule::Count {
                failures,
                window: u64::from(window),
                outcomes: 0,
                recent: VecDeque::new(),
            },
            Fixed::Time { seconds, rate } => Rule::Time {
                rate,
                // Ten buckets, as the crate's default.
                bucket_calls: u64::from(seconds) * CALLS_PER_SECOND / 10,
                slots: vec![(0, 0); 10],
                head: 0,
                head_index: 0,
                calls: 0,
                failed: 0,
            },
        }
    }

    /// Judges call number `call` (counted over every call, probes too,
    /// which is what the clock follows); whether it trips.
    fn record(&mut self, failure: bool, call: u64) -> bool {
        match self {
            Rule::Consecutive { threshold, streak } => {
                *streak = if failure { *streak + 1 } else { 0 };
                *streak >= *threshold
            }
            Rule::Count {
                failures,
                window,
                outcomes,
                recent,
            } => {
                *outcomes += 1;
                if failure {
                    recent.push_back(*outcomes);
                    if recent.len() > *failures as usize {
                        recent.pop_front();
                    }
                }
                while recent.front().is_some_and(|&n| n + *window <= *outcomes) {
                    recent.pop_front();
                }
                failure && recent.len() >= *failures as usize
            }
            Rule::Time {
                rate,
                bucket_calls,
                slots,
                head,
                head_index,
                calls,
                failed,
            } => {
                let index = call / (*bucket_calls).max(1);
                let steps = index.saturating_sub(*head_index);
                if steps >= slots.len() as u64 {
                    slots.fill((0, 0));
                    (*calls, *failed) = (0, 0);
                    *head = (index % slots.len() as u64) as usize;
                } else {
                    for _ in 0..steps {
                        *head = (*head + 1) % slots.len();
                        let gone = std::mem::take(&mut slots[*head]);
                        *calls -= gone.0;
                        *failed -= gone.1;
                    }
                }
                *head_index = index.max(*head_index);
                slots[*head].0 += 1;
                *calls += 1;
                if failure {
                    slots[*head].1 += 1;
                    *failed += 1;
                }
                *calls >= TIME_WINDOW_MIN_CALLS && f64::from(*failed) / f64::from(*calls) >= *rate
            }
        }
    }

    fn reset(&mut self) {
        match self {
            Rule::Consecutive { streak, .. } => *streak = 0,
            Rule::Count { recent, .. } => recent.clear(),
            Rule::Time {
                slots,
                calls,
                failed,
                ..
            } => {
                slots.fill((0, 0));
                (*calls, *failed) = (0, 0);
            }
        }
    }
}

/// A replica driven as the studies drive a breaker.
pub struct Replica {
    rule: Rule,
    /// Every call so far, probes included.
    calls: u64,
}

impl Replica {
    pub fn new(fixed: Fixed) -> Self {
        Replica {
            rule: Rule::new(fixed),
            calls: 0,
        }
    }

    /// Judges one call made while closed; on a trip, starts afresh and
    /// probes with calls from `provider` until one succeeds.
    fn judge(&mut self, failure: bool, provider: &mut Provider) -> bool {
        self.calls += 1;
        if !self.rule.record(failure, self.calls) {
            return false;
        }
        self.rule.reset();
        loop {
            self.calls += 1;
            if !provider.fails() {
                return true;
            }
        }
    }

    /// Healthy calls from `provider` until `judged` were made while closed;
    /// the trips among them.
    pub fn healthy(&mut self, provider: &mut Provider, judged: u64) -> u64 {
        let mut trips = 0;
        for _ in 0..judged {
            let failure = provider.fails();
            trips += u64::from(self.judge(failure, provider));
        }
        trips
    }

    /// A step to independent failures at `rate`, drawn from `step`, then
    /// probes from `provider`: the calls until it tripped, at most `cap`.
    pub fn step(
        &mut self,
        rate: f64,
        step: &mut SplitMix64,
        provider: &mut Provider,
        cap: u64,
    ) -> Option<u64> {
        for calls in 1..=cap {
            let failure = step.next_f64() < rate;
            if self.judge(failure, provider) {
                return Some(calls);
            }
        }
        None
    }
}

/// The grid each family is tuned over: for each shape (a count window's
/// size, a time window's length), the settings from most to least
/// sensitive.
pub fn grid() -> Vec<Vec<Fixed>> {
    let mut shapes = vec![(2..=10).map(Fixed::Consecutive).collect::<Vec<_>>()];
    for window in [10, 20, 30, 50, 75, 100, 150, 200, 300, 500] {
        shapes.push(
            (2..=window)
                .map(|failures| Fixed::Count { failures, window })
                .collect(),
        );
    }
    for seconds in [10, 30, 60, 120] {
        shapes.push(
            (1..=20)
                .map(|step| Fixed::Time {
                    seconds,
                    rate: f64::from(step) * 0.05,
                })
                .collect(),
        );
    }
    shapes
}

/// The most sensitive setting of `shape` (ordered from most to least
/// sensitive) whose false trips per million, as `measure` finds them, stay
/// within `budget`, by binary search (fewer false trips as the settings
/// grow less sensitive), with what `measure` found of it; or the least
/// sensitive, if none does, and `false`.
pub fn most_sensitive_within<M>(
    shape: &[Fixed],
    budget: f64,
    measure: impl Fn(Fixed) -> (f64, M),
) -> (Fixed, M, bool) {
    let last = shape.len() - 1;
    let (worst, found) = measure(shape[last]);
    if worst > budget {
        return (shape[last], found, false);
    }
    let (mut low, mut high, mut found) = (0, last, found);
    while low < high {
        let middle = (low + high) / 2;
        let (rate, measured) = measure(shape[middle]);
        if rate <= budget {
            (high, found) = (middle, measured);
        } else {
            low = middle + 1;
        }
    }
    (shape[high], found, true)
}
