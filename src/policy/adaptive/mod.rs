//! Adaptive: trip when recent outcomes are significantly worse than the
//! dependency's own normal behaviour, learned as it runs. The model of
//! failures it assumes, its tests, their false-trip bound and worked
//! examples are documented on [`Adaptive`] (their text is `adaptive.md`
//! beside this file). `model` holds what is learned and the tests tuned to
//! it, `detector` the running state fed one outcome at a time.

use std::fmt;

#[cfg(feature = "serde")]
use super::{Figure, FromFile, Written};
use super::time_window::validate_rate;
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripPolicy, TripReason};
use crate::error::ConfigError;

mod detector;
mod model;
#[cfg(test)]
mod tests;

pub(crate) use detector::Detector;
use model::*;

/// Trips when recent outcomes are significantly worse than the dependency's
/// learned normal behaviour: sequential (CUSUM) tests with a stated
/// false-trip rate, not a hand-picked percentage.
///
/// A fixed threshold trades detection speed against false trips, and the
/// right trade depends on how often, and how, the dependency fails when it
/// is healthy. This policy learns that and tests recent outcomes against it.
///
/// The parameters are the ones an operator can reason about:
///
/// | parameter | default | meaning |
/// | --- | --- | --- |
/// | [`false_trips_per_million`](Self::false_trips_per_million) | 1 | the most false trips per million healthy calls, for failures that fit the model below |
/// | [`min_degradation`](Self::min_degradation) | 0.1 | the smallest rise of the failure rate worth catching (0.1: ten points, such as 2% to 12%); a lasting rise smaller than this is learned |
/// | [`warm_up`](Self::warm_up) | 0 | outcomes learned before the tests judge (0: they judge from the first call) |
/// | [`fallback`](Self::fallback) | 5 consecutive failures | the policy that judges during a warm-up, if one is set |
/// | [`ceiling`](Self::ceiling) | 0.5 | a failure rate that always trips, whatever the baseline |
/// | [`baseline_horizon`](Self::baseline_horizon) | 1,000,000 | outcomes the long-run baseline averages over |
///
/// It needs every outcome, successes included (they teach the baseline), so
/// each call takes the breaker's lock to record; the work per call is a few
/// additions (none for a success while no test holds evidence), with a
/// pass over each word of 64 outcomes as it is learned and at most about
/// 150 logarithms every 1,024 calls, and no allocation.
/// Combine it with a fixed rule for the fastest trip on a hard outage,
/// where the dependency's failures do not normally come five in a row:
///
/// ```
/// use tower_circuit_breaker::policy::{Adaptive, CountWindow, TripPolicy};
/// use tower_circuit_breaker::Config;
///
/// let config = Config::builder()
///     .trip(TripPolicy::any_of([
///         Adaptive::new()
///             .false_trips_per_million(1.0)
///             .min_degradation(0.1)
///             .warm_up(1_000)
///             .into(),
///         CountWindow::new(5, 5).into(), // every one of the last 5 failed
///     ]))
///     .build()?;
///
/// // Parameters outside their range are config errors, naming the field.
/// let err = Config::builder()
///     .trip(Adaptive::new().min_degradation(0.6))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "trip.adaptive.min_degradation");
/// # let _ = config;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
///
#[doc = include_str!("adaptive.md")]
///
/// [`false_trips_per_million`]: Self::false_trips_per_million
/// [`baseline_horizon`]: Self::baseline_horizon
/// [`fallback`]: Self::fallback
/// [`max_failures_to_trip`]: Self::max_failures_to_trip
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    false_trips_per_million: f64,
    min_degradation: f64,
    warm_up: u32,
    ceiling: f64,
    baseline_horizon: u32,
    fallback: Box<TripPolicy>,
}

impl Adaptive {
    /// An adaptive policy with the defaults above.
    pub fn new() -> Self {
        Adaptive {
            false_trips_per_million: 1.0,
            min_degradation: 0.1,
            warm_up: 0,
            ceiling: 0.5,
            baseline_horizon: 1_000_000,
            fallback: Box::new(TripPolicy::default()),
        }
    }

    /// The most false trips per million calls to a healthy dependency,
    /// between 0.000001 and 100,000 (default 1).
    pub fn false_trips_per_million(mut self, rate: f64) -> Self {
        self.false_trips_per_million = rate;
        self
    }

    /// The smallest rise of the failure rate worth catching, as an absolute
    /// share of calls: 0.1 means ten points (2% to 12%, 10% to 20%). At
    /// least 0.0001, and below the [`ceiling`](Self::ceiling) (default 0.1).
    /// A sudden smaller rise trips it too, the more often the closer it is
    /// to this; a lasting one is learned as the dependency's new normal
    /// (see [the baseline](Self#the-baseline)).
    pub fn min_degradation(mut self, rise: f64) -> Self {
        self.min_degradation = rise;
        self
    }

    /// Outcomes the baseline learns before the tests judge (default 0: they
    /// judge from the first call); until then the
    /// [`fallback`](Self::fallback) policy does. The tests are conservative
    /// while the baseline has learned little and sharpen as it learns more
    /// (see [the learning phase](Self#the-learning-phase)); a warm-up trades
    /// that for the fallback's own false trips, which no budget bounds.
    /// Five consecutive failures, for one, trip on every normal run of five
    /// failures.
    pub fn warm_up(mut self, outcomes: u32) -> Self {
        self.warm_up = outcomes;
        self
    }

    /// A failure rate, in (`min_degradation`, 1], that always trips: the
    /// baseline never rises above `ceiling − min_degradation` (default 0.5).
    pub fn ceiling(mut self, rate: f64) -> Self {
        self.ceiling = rate;
        self
    }

    /// Outcomes the long-run baseline averages over once it has learned
    /// that many (at least 1; default 1,000,000): a longer horizon knows the
    /// baseline more precisely and follows drift more slowly. (A lasting
    /// rise smaller than [`min_degradation`](Self::min_degradation) is
    /// followed sooner, through the recent failure rate.)
    pub fn baseline_horizon(mut self, outcomes: u32) -> Self {
        self.baseline_horizon = outcomes;
        self
    }

    /// The policy that judges during the warm-up (default: 5 consecutive
    /// failures).
    pub fn fallback(mut self, policy: impl Into<TripPolicy>) -> Self {
        self.fallback = Box::new(policy.into());
        self
    }

    /// The false-trip budget, per million calls.
    pub fn false_trip_budget(&self) -> f64 {
        self.false_trips_per_million
    }

    /// The smallest rise of the failure rate worth catching.
    pub fn degradation(&self) -> f64 {
        self.min_degradation
    }

    /// Outcomes learned before the test judges.
    pub fn warm_up_outcomes(&self) -> u32 {
        self.warm_up
    }

    /// The failure rate that always trips.
    pub fn failure_ceiling(&self) -> f64 {
        self.ceiling
    }

    /// Outcomes the baseline averages over.
    pub fn horizon(&self) -> u32 {
        self.baseline_horizon
    }

    /// The policy that judges during the warm-up.
    pub fn fallback_policy(&self) -> &TripPolicy {
        &self.fallback
    }

    /// Once warmed up, the most failures in a row it takes to trip,
    /// whatever it learned; `None` if a parameter is invalid. During the
    /// warm-up the fallback's own threshold applies instead.
    ///
    /// The worst case is a dependency whose failures it learned to come in
    /// long runs: the run test then takes a failure to follow a failure at
    /// most 70% of the time (or the baseline's cap, `ceiling −
    /// min_degradation`, if higher). A dependency whose failures it learned
    /// to be independent takes far fewer: five at 2%, eight at 10%, two at
    /// 0% (see the worked examples above).
    ///
    /// ```
    /// use tower_circuit_breaker::policy::Adaptive;
    ///
    /// assert_eq!(Adaptive::new().max_failures_to_trip(), Some(50));
    /// // A larger budget trips sooner on a hard outage, as on anything else.
    /// assert_eq!(
    ///     Adaptive::new().false_trips_per_million(100.0).max_failures_to_trip(),
    ///     Some(37)
    /// );
    /// ```
    pub fn max_failures_to_trip(&self) -> Option<u32> {
        self.validate("adaptive").ok()?;
        let settings = Settings::new(self);
        let per_failure = -settings.run_chance_cap().ln();
        let failures = (settings.threshold(TESTS - 1, 1.0) / per_failure).ceil();
        // At least 1; a valid config keeps it far below u32::MAX, but a
        // float is never trusted to convert by itself.
        Some(if failures >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            (failures as u32).max(1)
        })
    }
}

/// [`Adaptive`]'s figures: the learned baseline, and the test nearest to
/// tripping (the one that tripped, in a [`TripReason`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveFigures {
    /// The baseline failure rate learned, in [0, 1].
    pub baseline: f64,
    /// Outcomes the baseline has learned.
    pub learned: u64,
    /// The test's evidence (a log-likelihood ratio)...
    pub statistic: f64,
    /// ...and the evidence that trips it.
    pub threshold: f64,
    /// Failures since the test's evidence last stood at zero...
    pub failures: u32,
    /// ...and calls.
    pub calls: u32,
    /// Still in its learning phase: it learns from its own trips, and
    /// may trip on normal runs of failures it has not seen yet (see
    /// [`Adaptive`]'s learning phase for how often).
    pub learning: bool,
    /// While warming up, the figures of the fallback policy, which
    /// judges until then.
    pub fallback: Option<Box<PolicyFigures>>,
}

impl Figures for AdaptiveFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failures in the last {} calls, significantly above the baseline failure rate of {:.2}%",
            self.failures,
            self.calls,
            self.baseline * 100.0
        )
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("baseline", Figure::Number(self.baseline)),
            ("learned", Figure::Count(self.learned)),
            ("statistic", Figure::Number(self.statistic)),
            ("threshold", Figure::Number(self.threshold)),
            ("failures", Figure::Count(self.failures.into())),
            ("calls", Figure::Count(self.calls.into())),
            ("learning", Figure::Flag(self.learning)),
            ("fallback", Figure::Figures(self.fallback.as_deref())),
        ]
    }
}

#[cfg(feature = "serde")]
impl FromFile for Adaptive {
    const FIELDS: &'static [&'static str] = &[
        "false_trips_per_million",
        "min_degradation",
        "warm_up",
        "ceiling",
        "baseline_horizon",
        "fallback",
    ];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let mut policy = Adaptive::new();
        if let Some(rate) = written.number("false_trips_per_million")? {
            policy = policy.false_trips_per_million(rate);
        }
        if let Some(degradation) = written.number("min_degradation")? {
            policy = policy.min_degradation(degradation);
        }
        if let Some(outcomes) = written.count("warm_up")? {
            policy = policy.warm_up(outcomes);
        }
        if let Some(ceiling) = written.number("ceiling")? {
            policy = policy.ceiling(ceiling);
        }
        if let Some(horizon) = written.count("baseline_horizon")? {
            policy = policy.baseline_horizon(horizon);
        }
        if let Some(fallback) = written.policy("fallback")? {
            policy = policy.fallback(fallback);
        }
        Ok(policy)
    }
}

impl Policy for Adaptive {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let f = self.false_trips_per_million;
        if !(MIN_BUDGET..=MAX_BUDGET).contains(&f) {
            return Err(ConfigError::new(
                format!("{path}.false_trips_per_million"),
                format!("must be between {MIN_BUDGET} and {MAX_BUDGET}, got {f}"),
            ));
        }
        let d = self.min_degradation;
        if !(MIN_DEGRADATION..1.0).contains(&d) {
            return Err(ConfigError::new(
                format!("{path}.min_degradation"),
                format!("must be at least {MIN_DEGRADATION} and below 1, got {d}"),
            ));
        }
        validate_rate(path, "ceiling", self.ceiling)?;
        if d >= self.ceiling {
            return Err(ConfigError::new(
                format!("{path}.min_degradation"),
                format!("must be below the ceiling ({}), got {d}", self.ceiling),
            ));
        }
        if self.baseline_horizon == 0 {
            return Err(ConfigError::new(
                format!("{path}.baseline_horizon"),
                "must be at least 1",
            ));
        }
        self.fallback.validate(&format!("{path}.fallback"))
    }

    /// Whether recording needs the time: only for the fallback's sake.
    fn needs_clock(&self) -> bool {
        self.fallback.needs_clock()
    }

    /// Whether calls must be timed: only for the fallback's sake.
    fn needs_latency(&self) -> bool {
        self.fallback.needs_latency()
    }

    /// The fallback's: it judges slow calls while the policy warms up.
    fn slow_threshold(&self) -> Option<std::time::Duration> {
        self.fallback.slow_threshold()
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(Detector::new(self)))
    }
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive::new()
    }
}

/// What the running state needs of a validated [`Adaptive`].
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// The false-trip budget, per call.
    budget: f64,
    min_degradation: f64,
    max_baseline: f64,
}

impl Settings {
    fn new(policy: &Adaptive) -> Self {
        Settings {
            budget: policy.false_trips_per_million * 1e-6,
            min_degradation: policy.min_degradation,
            // Positive: validation keeps the degradation below the ceiling.
            max_baseline: policy.ceiling - policy.min_degradation,
        }
    }

    /// The most the run test takes a failure to follow a failure.
    fn run_chance_cap(&self) -> f64 {
        RUN_CHANCE_CAP.max(self.max_baseline)
    }

    /// The chance of a failure each test adds to every call, over a
    /// baseline failure rate `level`: light, heavy, run.
    fn added(&self, level: f64) -> [f64; TESTS] {
        let light = (level + self.min_degradation).min(MAX_DEGRADED);
        let heavy = (light + (1.0 - light) * HEAVY).min(MAX_DEGRADED);
        [
            (light - level) / (1.0 - level),
            (heavy - level) / (1.0 - level),
            1.0,
        ]
    }

    /// The threshold at which test `test`, adding `added`, trips falsely at
    /// most its share of the budget: `e / (e^h − 1 + e) = α`.
    fn threshold(&self, test: usize, added: f64) -> f64 {
        let share = self.budget * SHARES[test];
        if added >= 1.0 {
            -share.ln()
        } else {
            (added * (1.0 / share - 1.0)).ln_1p()
        }
    }
}
