//! Trip policies: pure decisions that take outcomes in and say when to open.
//!
//! A policy sees only closed-state outcomes of the current generation; the
//! breaker resets it whenever it opens. Choose one, or combine several with
//! [`TripPolicy::any_of`]:
//!
//! | policy | trips when | choose it when |
//! | --- | --- | --- |
//! | [`ConsecutiveFailures`] | `k` failures in a row | a dependency is either up or down (the default, `k = 5`) |
//! | [`CountWindow`] | `k` of the last `N` outcomes failed | failures interleave with successes; traffic is bursty |
//! | [`TimeWindow`] | failure share over a time window reaches a rate | traffic is steady and a rate means something |
//! | [`SlowCalls`] | share of slow calls reaches a rate | the dependency degrades by slowing down before it fails |
//! | [`Adaptive`] | recent outcomes are significantly worse than the dependency's learned baseline, by a sequential test with a stated false-trip rate | the normal failure rate is not zero, differs between dependencies, or drifts |
//! | [`TripPolicy::any_of`] | any member trips | you want a fast trip on a hard outage and a rate for partial ones |
//! | [`PerClass`] | the policy of one failure class trips (each counts its class's failures apart) | kinds of failure weigh differently: 3 timeouts, but 20 rate limits |

mod adaptive;
mod consecutive;
mod count_window;
mod per_class;
mod slow_calls;
mod time_window;

use std::fmt;
use std::time::Duration;

pub use adaptive::Adaptive;
pub use consecutive::ConsecutiveFailures;
pub use count_window::CountWindow;
pub use per_class::PerClass;
pub use slow_calls::{SlowCalls, Window};
pub use time_window::TimeWindow;

use crate::error::ConfigError;
use crate::outcome::FailureClass;

/// The rule that decides when a closed breaker opens.
///
/// Build one from a policy type (`ConsecutiveFailures::new(5).into()`) or
/// pass the policy type straight to [`ConfigBuilder::trip`].
///
/// [`ConfigBuilder::trip`]: crate::ConfigBuilder::trip
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TripPolicy {
    /// See [`ConsecutiveFailures`].
    ConsecutiveFailures(ConsecutiveFailures),
    /// See [`CountWindow`].
    CountWindow(CountWindow),
    /// See [`TimeWindow`].
    TimeWindow(TimeWindow),
    /// See [`SlowCalls`].
    SlowCalls(SlowCalls),
    /// See [`Adaptive`].
    Adaptive(Adaptive),
    /// Trips when any member trips; the first member (in order) that trips
    /// is the one the transition names.
    AnyOf(Vec<TripPolicy>),
    /// See [`PerClass`].
    PerClass(PerClass),
}

impl TripPolicy {
    /// Combine policies: the breaker opens as soon as any of them trips.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::policy::{ConsecutiveFailures, TimeWindow, TripPolicy};
    ///
    /// let policy = TripPolicy::any_of([
    ///     TripPolicy::from(ConsecutiveFailures::new(5)),
    ///     TimeWindow::new(Duration::from_secs(60)).failure_rate(0.3).into(),
    /// ]);
    /// ```
    pub fn any_of(policies: impl IntoIterator<Item = TripPolicy>) -> Self {
        TripPolicy::AnyOf(policies.into_iter().collect())
    }

    pub(crate) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        match self {
            TripPolicy::ConsecutiveFailures(p) => {
                p.validate(&format!("{path}.consecutive_failures"))
            }
            TripPolicy::CountWindow(p) => p.validate(&format!("{path}.count_window")),
            TripPolicy::TimeWindow(p) => p.validate(&format!("{path}.time_window")),
            TripPolicy::SlowCalls(p) => p.validate(&format!("{path}.slow_calls")),
            TripPolicy::Adaptive(p) => p.validate(&format!("{path}.adaptive")),
            TripPolicy::PerClass(p) => p.validate(&format!("{path}.per_class")),
            TripPolicy::AnyOf(list) => {
                if list.is_empty() {
                    return Err(ConfigError::new(
                        format!("{path}.any_of"),
                        "must hold at least one policy",
                    ));
                }
                list.iter()
                    .enumerate()
                    .try_for_each(|(i, p)| p.validate(&format!("{path}.any_of[{i}]")))
            }
        }
    }

    /// Whether recording a success needs the time: time windows do; streaks
    /// and count windows only need it for failures; an adaptive policy only
    /// for its fallback.
    pub(crate) fn needs_clock(&self) -> bool {
        match self {
            TripPolicy::ConsecutiveFailures(_) | TripPolicy::CountWindow(_) => false,
            TripPolicy::TimeWindow(_) | TripPolicy::SlowCalls(_) => true,
            TripPolicy::Adaptive(p) => p.needs_clock(),
            TripPolicy::AnyOf(list) => list.iter().any(TripPolicy::needs_clock),
            TripPolicy::PerClass(p) => p.members().any(TripPolicy::needs_clock),
        }
    }

    /// Whether calls must be timed.
    pub(crate) fn needs_latency(&self) -> bool {
        match self {
            TripPolicy::SlowCalls(_) => true,
            TripPolicy::Adaptive(p) => p.needs_latency(),
            TripPolicy::AnyOf(list) => list.iter().any(TripPolicy::needs_latency),
            TripPolicy::PerClass(p) => p.members().any(TripPolicy::needs_latency),
            _ => false,
        }
    }

    /// The lowest slow-call threshold: a success slower than it may be a
    /// slow call and is always recorded.
    pub(crate) fn slow_threshold(&self) -> Option<Duration> {
        match self {
            TripPolicy::SlowCalls(p) => Some(p.threshold()),
            TripPolicy::Adaptive(p) => p.fallback_policy().slow_threshold(),
            TripPolicy::AnyOf(list) => list.iter().filter_map(TripPolicy::slow_threshold).min(),
            TripPolicy::PerClass(p) => p.members().filter_map(TripPolicy::slow_threshold).min(),
            _ => None,
        }
    }
}

impl Default for TripPolicy {
    fn default() -> Self {
        ConsecutiveFailures::default().into()
    }
}

macro_rules! from_policy {
    ($($ty:ident),*) => {$(
        impl From<$ty> for TripPolicy {
            fn from(policy: $ty) -> Self {
                TripPolicy::$ty(policy)
            }
        }
    )*};
}
from_policy!(
    ConsecutiveFailures,
    CountWindow,
    TimeWindow,
    SlowCalls,
    Adaptive,
    PerClass
);

/// Why a breaker opened: the policy that tripped and its figures, or a
/// failed probe.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TripReason {
    /// [`ConsecutiveFailures`] tripped after `failures` in a row.
    ConsecutiveFailures {
        /// Failures in a row.
        failures: u32,
    },
    /// [`CountWindow`] tripped with `failures` of the last `window` outcomes.
    CountWindow {
        /// Failures counted in the window.
        failures: u32,
        /// Size of the window.
        window: u32,
    },
    /// [`TimeWindow`] tripped with `failures` of `calls` in the window.
    FailureRate {
        /// Failures in the window.
        failures: u32,
        /// Calls in the window.
        calls: u32,
    },
    /// [`SlowCalls`] tripped with `slow` of `calls` in the window.
    SlowCallRate {
        /// Slow calls in the window.
        slow: u32,
        /// Calls in the window.
        calls: u32,
    },
    /// [`Adaptive`] tripped with `failures` in the last `calls`, significantly
    /// more than its learned `baseline` failure rate gives.
    Adaptive {
        /// Failures since the test's evidence last stood at zero.
        failures: u32,
        /// Calls since the test's evidence last stood at zero.
        calls: u32,
        /// The baseline failure rate learned, in [0, 1].
        baseline: f64,
    },
    /// A [`PerClass`] member tripped: the class whose failures it counts,
    /// and its own reason.
    PerClass {
        /// The failures' class.
        class: crate::outcome::FailureClass,
        /// Why that class's policy tripped.
        reason: Box<TripReason>,
    },
    /// A half-open probe failed.
    ProbeFailed,
    /// A half-open probe was still running after the probe timeout.
    ProbeTimedOut,
    /// A half-open probe's caller dropped it before its outcome: the
    /// breaker opens again for the period it just had.
    ProbeCancelled,
    /// An operator changed the state (force open or closed, disable,
    /// restore, reset).
    Manual,
    /// The upstream announced a retry-after (a failing status's `Retry-After` or rate-limit reset, gRPC
    /// pushback) and the config trips at once on one
    /// ([`ConfigBuilder::trip_on_pushback`](crate::ConfigBuilder::trip_on_pushback)).
    Pushback {
        /// The announced delay, capped by `max_open`.
        retry_after: std::time::Duration,
    },
    /// The fleet decided, through shared state: another instance opened the
    /// breaker (or it was open when this instance joined), or the fleet
    /// closed it.
    Shared,
    /// Code outside the breaker's calls saw the dependency struggle (a load
    /// shedder, a health check, a quota alarm) and said so with
    /// [`Breaker::open_on_signal`](crate::Breaker::open_on_signal).
    Signal {
        /// What the code that tripped it said.
        reason: std::sync::Arc<str>,
    },
}

impl TripReason {
    /// A short name for the policy or event behind this reason, for logs and
    /// metric labels.
    pub fn policy(&self) -> &'static str {
        match self {
            TripReason::ConsecutiveFailures { .. } => "consecutive_failures",
            TripReason::CountWindow { .. } => "count_window",
            TripReason::FailureRate { .. } => "time_window",
            TripReason::SlowCallRate { .. } => "slow_calls",
            TripReason::Adaptive { .. } => "adaptive",
            TripReason::PerClass { reason, .. } => reason.policy(),
            TripReason::ProbeFailed => "probe_failed",
            TripReason::ProbeTimedOut => "probe_timed_out",
            TripReason::ProbeCancelled => "probe_cancelled",
            TripReason::Manual => "manual",
            TripReason::Pushback { .. } => "pushback",
            TripReason::Shared => "shared",
            TripReason::Signal { .. } => "signal",
        }
    }
}

impl fmt::Display for TripReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TripReason::ConsecutiveFailures { failures } => {
                write!(f, "{failures} consecutive failures")
            }
            TripReason::CountWindow { failures, window } => {
                write!(f, "{failures} failures in the last {window} calls")
            }
            TripReason::FailureRate { failures, calls } => {
                write!(
                    f,
                    "{failures} failures in {calls} calls within the time window"
                )
            }
            TripReason::SlowCallRate { slow, calls } => {
                write!(f, "{slow} slow calls in {calls} calls")
            }
            TripReason::Adaptive {
                failures,
                calls,
                baseline,
            } => write!(
                f,
                "{failures} failures in the last {calls} calls, significantly above the baseline failure rate of {:.2}%",
                baseline * 100.0
            ),
            TripReason::PerClass { class, reason } => write!(f, "{reason} of class {class}"),
            TripReason::ProbeFailed => f.write_str("half-open probe failed"),
            TripReason::ProbeTimedOut => f.write_str("half-open probe timed out"),
            TripReason::ProbeCancelled => f.write_str("half-open probe cancelled by its caller"),
            TripReason::Manual => f.write_str("set by an operator"),
            TripReason::Pushback { retry_after } => write!(
                f,
                "the upstream asked to come back in {} ms",
                retry_after.as_millis()
            ),
            TripReason::Shared => f.write_str("decided by the fleet through shared state"),
            TripReason::Signal { reason } => write!(f, "tripped from outside its calls: {reason}"),
        }
    }
}

/// A policy's current figures, as shown by a [`Snapshot`](crate::Snapshot).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyFigures {
    /// Failures in a row so far, and the threshold.
    ConsecutiveFailures {
        /// Failures in a row.
        failures: u32,
        /// Threshold that trips.
        threshold: u32,
    },
    /// Failures inside the window (by count and age), the failures that trip,
    /// and the window size.
    CountWindow {
        /// Failures in the window.
        failures: u32,
        /// Failures that trip.
        threshold: u32,
        /// Size of the window.
        window: u32,
    },
    /// Calls and failures inside the time window.
    TimeWindow {
        /// Calls in the window.
        calls: u32,
        /// Failures in the window.
        failures: u32,
    },
    /// Calls and slow calls inside the window.
    SlowCalls {
        /// Calls in the window.
        calls: u32,
        /// Slow calls in the window.
        slow: u32,
    },
    /// The learned baseline and the test against it.
    Adaptive {
        /// The baseline failure rate learned, in [0, 1].
        baseline: f64,
        /// Outcomes the baseline has learned.
        learned: u64,
        /// The evidence (log-likelihood ratio) of the test nearest to
        /// tripping...
        statistic: f64,
        /// ...and the evidence that trips it.
        threshold: f64,
        /// Still in its learning phase: it learns from its own trips, and
        /// may trip on normal runs of failures it has not seen yet (see
        /// [`Adaptive`]'s learning phase for how often).
        learning: bool,
        /// While warming up, the figures of the fallback policy, which
        /// judges until then.
        fallback: Option<Box<PolicyFigures>>,
    },
    /// Figures of each member, in order.
    AnyOf(Vec<PolicyFigures>),
    /// The figures of a [`PerClass`]: its rest's, and each class's.
    PerClass {
        /// The policy of the failures of classes not named.
        rest: Box<PolicyFigures>,
        /// Each class named, with its policy's figures.
        classes: Vec<(crate::outcome::FailureClass, PolicyFigures)>,
    },
}

/// One recorded closed-state outcome.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) failure: bool,
    /// A failure's class, if its classifier said.
    pub(crate) class: Option<FailureClass>,
    /// The call's latency, when a policy times calls.
    pub(crate) elapsed: Option<Duration>,
}

/// The running state of a [`TripPolicy`].
#[derive(Debug)]
pub(crate) enum PolicyState {
    Consecutive(consecutive::Streak),
    // The larger states boxed: the enum, held by every breaker, stays the
    // size of a streak and a pointer, whatever the policy.
    CountWindow(Box<count_window::Ring>),
    TimeWindow(Box<time_window::FailureRate>),
    SlowCalls(Box<slow_calls::SlowRate>),
    Adaptive(Box<adaptive::Detector>),
    AnyOf(Vec<PolicyState>),
    PerClass(Box<per_class::Split>),
}

impl PolicyState {
    pub(crate) fn new(policy: &TripPolicy) -> Self {
        match policy {
            TripPolicy::ConsecutiveFailures(p) => {
                PolicyState::Consecutive(consecutive::Streak::new(p))
            }
            TripPolicy::CountWindow(p) => {
                PolicyState::CountWindow(Box::new(count_window::Ring::new(p)))
            }
            TripPolicy::TimeWindow(p) => {
                PolicyState::TimeWindow(Box::new(time_window::FailureRate::new(p)))
            }
            TripPolicy::SlowCalls(p) => {
                PolicyState::SlowCalls(Box::new(slow_calls::SlowRate::new(p)))
            }
            TripPolicy::Adaptive(p) => PolicyState::Adaptive(Box::new(adaptive::Detector::new(p))),
            TripPolicy::AnyOf(list) => {
                PolicyState::AnyOf(list.iter().map(PolicyState::new).collect())
            }
            TripPolicy::PerClass(p) => PolicyState::PerClass(Box::new(per_class::Split::new(p))),
        }
    }

    /// Records one outcome; returns the reason to trip, if any. In an any-of,
    /// every member records the outcome and the first that trips is named.
    pub(crate) fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        match self {
            PolicyState::Consecutive(p) => p.record(sample),
            PolicyState::CountWindow(p) => p.record(sample, now_ms),
            PolicyState::TimeWindow(p) => p.record(sample, now_ms),
            PolicyState::SlowCalls(p) => p.record(sample, now_ms),
            PolicyState::Adaptive(p) => p.record(sample, now_ms),
            PolicyState::AnyOf(list) => list
                .iter_mut()
                .map(|p| p.record(sample, now_ms))
                .fold(None, |first, trip| first.or(trip)),
            PolicyState::PerClass(p) => p.record(sample, now_ms),
        }
    }

    /// Whether a success (no slower than any slow-call threshold) must be
    /// recorded at once, under the breaker's lock. When it need not, the
    /// breaker skips it, or, for policies that count calls in time, adds it
    /// to a tally of successes folded in later (see [`Self::tally_end`]).
    /// An adaptive policy learns from every success.
    pub(crate) fn success_matters(&self) -> bool {
        match self {
            PolicyState::Consecutive(p) => p.success_matters(),
            PolicyState::CountWindow(p) => p.success_matters(),
            PolicyState::TimeWindow(p) => p.success_matters(),
            PolicyState::SlowCalls(p) => p.success_matters(),
            PolicyState::Adaptive(_) => true,
            PolicyState::AnyOf(list) => list.iter().any(PolicyState::success_matters),
            PolicyState::PerClass(p) => p.members().any(PolicyState::success_matters),
        }
    }

    /// Whether a member records every success under the lock, whatever
    /// the figures (an adaptive policy): successes are then never tallied.
    pub(crate) fn records_every_success(&self) -> bool {
        match self {
            PolicyState::Adaptive(_) => true,
            PolicyState::AnyOf(list) => list.iter().any(PolicyState::records_every_success),
            PolicyState::PerClass(p) => p.members().any(PolicyState::records_every_success),
            _ => false,
        }
    }

    /// For policies that count calls in buckets of time: until when a
    /// success made at `now_ms` falls in the same bucket of every such
    /// policy, so that successes made before then may be counted together.
    /// `None` when no policy counts calls in time (an adaptive policy
    /// records every success itself).
    pub(crate) fn tally_end(&mut self, now_ms: u64) -> Option<u64> {
        let mut end: Option<u64> = None;
        self.each_buckets(&mut |buckets| {
            let bucket_end = buckets.bucket_end(now_ms);
            end = Some(end.map_or(bucket_end, |end| end.min(bucket_end)));
        });
        end
    }

    /// Counts `count` successes made at `at_ms` that were tallied rather
    /// than recorded: calls that are not hits, in every policy that counts
    /// calls in time. (The others skip such successes, as they are only
    /// tallied while no success matters.)
    pub(crate) fn add_successes(&mut self, count: u32, at_ms: u64) {
        self.each_buckets(&mut |buckets| buckets.add_calls(count, at_ms));
    }

    fn each_buckets(&mut self, f: &mut impl FnMut(&mut time_window::Buckets)) {
        match self {
            PolicyState::TimeWindow(p) => f(p.buckets()),
            PolicyState::SlowCalls(p) => {
                if let Some(buckets) = p.buckets() {
                    f(buckets);
                }
            }
            PolicyState::AnyOf(list) => list.iter_mut().for_each(|p| p.each_buckets(f)),
            PolicyState::PerClass(p) => p.members_mut().for_each(|p| p.each_buckets(f)),
            PolicyState::Consecutive(_)
            | PolicyState::CountWindow(_)
            | PolicyState::Adaptive(_) => {}
        }
    }

    /// Called whenever the breaker opens, and on a manual reset. An adaptive
    /// policy clears its test and keeps its baseline.
    pub(crate) fn reset(&mut self) {
        match self {
            PolicyState::Consecutive(p) => p.reset(),
            PolicyState::CountWindow(p) => p.reset(),
            PolicyState::TimeWindow(p) => p.reset(),
            PolicyState::SlowCalls(p) => p.reset(),
            PolicyState::Adaptive(p) => p.reset(),
            PolicyState::AnyOf(list) => list.iter_mut().for_each(PolicyState::reset),
            PolicyState::PerClass(p) => p.members_mut().for_each(PolicyState::reset),
        }
    }

    pub(crate) fn figures(&self, now_ms: u64) -> PolicyFigures {
        match self {
            PolicyState::Consecutive(p) => PolicyFigures::ConsecutiveFailures {
                failures: p.failures(),
                threshold: p.threshold(),
            },
            PolicyState::CountWindow(p) => {
                let (threshold, window) = p.limits();
                PolicyFigures::CountWindow {
                    failures: p.counted(now_ms),
                    threshold,
                    window,
                }
            }
            PolicyState::TimeWindow(p) => {
                let (calls, failures) = p.totals(now_ms);
                PolicyFigures::TimeWindow { calls, failures }
            }
            PolicyState::SlowCalls(p) => {
                let (calls, slow) = p.totals(now_ms);
                PolicyFigures::SlowCalls { calls, slow }
            }
            PolicyState::Adaptive(p) => p.figures(now_ms),
            PolicyState::AnyOf(list) => {
                PolicyFigures::AnyOf(list.iter().map(|p| p.figures(now_ms)).collect())
            }
            PolicyState::PerClass(p) => p.figures(now_ms),
        }
    }
}
