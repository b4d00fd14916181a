//! Adaptive: trip when recent outcomes are significantly worse than the
//! dependency's own baseline, learned as it runs. The test, its false-trip
//! bound and a worked example are documented on [`Adaptive`].

use super::time_window::validate_rate;
use super::{PolicyFigures, PolicyState, Sample, TripPolicy, TripReason};
use crate::error::ConfigError;

/// Outcomes are learned this many at a time, from one word of bits.
const BATCH: u32 = 64;
/// Words of outcomes held back before they are learned: three full words
/// and the one being filled, so an outcome is learned 192 to 255 calls late.
const HELD_WORDS: usize = 4;
/// Standard errors added to the learned rate to give the rate tested
/// against (a one-sided confidence of about 97.7%).
const CONFIDENCE_Z: f64 = 2.0;
/// Where the heavy test's degraded rate lies, from the light test's rate
/// (0) to every call failing (1).
const HEAVY: f64 = 1.0 / 3.0;
/// Degraded rates stay below 1, so a success's ratio stays finite.
const MAX_DEGRADED: f64 = 1.0 - 1e-9;
/// The budget is shared equally between the two tests.
const TESTS: usize = 2;

/// The limits on [`Adaptive::false_trips_per_million`].
const MIN_BUDGET: f64 = 1e-6;
const MAX_BUDGET: f64 = 100_000.0;
/// The smallest [`Adaptive::min_degradation`]: a hundredth of a point.
const MIN_DEGRADATION: f64 = 1e-4;

/// Trips when recent outcomes are significantly worse than the dependency's
/// learned baseline failure rate: a CUSUM test with a stated false-trip rate,
/// not a hand-picked percentage.
///
/// A fixed threshold trades detection speed against false trips, and the
/// right trade depends on how often the dependency fails when it is healthy.
/// This policy learns that baseline and tests recent outcomes against it.
///
/// The parameters are the ones an operator can reason about:
///
/// | parameter | default | meaning |
/// | --- | --- | --- |
/// | [`false_trips_per_million`](Self::false_trips_per_million) | 1 | the most false trips per million healthy calls |
/// | [`min_degradation`](Self::min_degradation) | 0.1 | the smallest rise of the failure rate worth catching (0.1: ten points, such as 2% to 12%) |
/// | [`warm_up`](Self::warm_up) | 1,000 | outcomes the baseline learns before the test judges |
/// | [`fallback`](Self::fallback) | 5 consecutive failures | the policy that judges during the warm-up |
/// | [`ceiling`](Self::ceiling) | 0.5 | a failure rate that always trips, whatever the baseline |
/// | [`baseline_horizon`](Self::baseline_horizon) | 1,000,000 | outcomes the baseline averages over, and so how fast it follows drift |
///
/// It needs every outcome, successes included (they teach the baseline), so
/// each call takes the breaker's lock to record; the work per call is a few
/// additions, with a few logarithms every 64 calls, and no allocation.
/// Combine it with a fixed rule for the fastest trip on a hard outage:
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
/// # The test
///
/// Each closed-state outcome `x` (1 for a failure, 0 for a success) is a
/// Bernoulli draw. Against a baseline failure rate `p0` and a degraded rate
/// `p1 > p0`, its log-likelihood ratio is
///
/// ```text
/// llr(x) = x·ln(p1/p0) + (1 − x)·ln((1 − p1)/(1 − p0))
/// ```
///
/// and the CUSUM statistic `S ← max(0, S + llr(x))` (Page, 1954) trips when it
/// reaches a threshold `h`. Two such tests run side by side, each with half
/// of the false-trip budget: a *light* one at `p1 = p0 + d` (`d` is
/// [`min_degradation`](Self::min_degradation)), which sees a small rise,
/// and a *heavy* one a third of the way from there to every call failing,
/// which sees a large one in fewer calls.
///
/// # The false-trip bound
///
/// Write `a = ln(p1/p0)` for what a failure adds and `b = ln((1 − p1)/(1 −
/// p0))` for what a success adds. While the failure rate is `p0`,
/// `E[e^llr] = p1 + (1 − p1) = 1`: `e^S` is a fair bet. A run of `S` above
/// zero begins with a failure while `S = 0` (at most `p0` runs per call) and
/// ends at zero or at `h`. Wald's identity over a run gives
/// `1 ≥ q·e^(h − a) + (1 − q)·e^(b − a)`, where `q` is the chance the run
/// reaches `h`, so `q ≤ (e^a − e^b)/(e^h − e^b)`, and with `p0·e^a = p1`
/// each test trips falsely at most
///
/// ```text
/// p0·q ≤ (p1 − p0) / ((1 − p0)·(e^h − 1))     times per call
/// ```
///
/// (a reset by the other test only ends a run early). Each test's threshold
/// is therefore `h = ln(1 + (p1 − p0)/((1 − p0)·α/2))` for a budget `α` =
/// [`false_trips_per_million`](Self::false_trips_per_million) / 10⁶, and the
/// two together trip falsely at most `α` times per call. This is tighter
/// than Lorden's classic `e^−h` by about the factor `(p1 − p0)/(1 − p0)`.
///
/// The bound holds for a known `p0`. The test uses an upper confidence bound
/// on the learned rate (Wilson's, two standard errors, over the outcomes
/// learned, at most the horizon), so the dependency's true rate is nearly
/// always below the `p0` tested against; the bound leaves out the overshoot
/// past `h`, so measured false trips come out well within the budget (see
/// the outage bench and `tests/adaptive.rs`).
///
/// # The baseline
///
/// The baseline is a running mean of closed-state outcomes that becomes an
/// exponentially weighted one after [`baseline_horizon`] outcomes, so it
/// follows a drifting dependency over about that many calls. Outcomes are
/// learned 192 to 255 calls late, and once warmed up only if the breaker did
/// not open meanwhile: the calls that led to a trip never teach the baseline
/// that a degradation is normal. (During the warm-up the fallback's trips
/// forget nothing: a fixed policy may trip on the dependency's normal
/// failures, and the baseline must learn them.) Outcomes while open or
/// half-open never reach a trip policy. The breaker resets the test (never the baseline) whenever it
/// opens, so the baseline survives outages and manual resets; a new trip
/// policy (through [`Breaker::reconfigure`](crate::Breaker::reconfigure))
/// starts a new one. A lasting rise large enough to trip the test keeps
/// tripping it: the baseline learns only the outcomes between trips that
/// are old enough, so it follows such a rise slowly, if at all.
///
/// The baseline is capped at `ceiling − d`, so `p1 ≤ ceiling`: a failure rate
/// at or above [`ceiling`](Self::ceiling) always trips, however long the
/// dependency has been failing. Until the baseline has learned
/// [`warm_up`](Self::warm_up) outcomes, a fixed [`fallback`] policy
/// judges instead (the test keeps its evidence meanwhile).
///
/// # A worked example
///
/// With the defaults (`d` = 0.1, one false trip per million calls), a
/// provider that failed 2% of a million calls is tested against
/// `p0` = 2.03%:
///
/// | test | `p1` | a failure adds | a success subtracts | trips at `h` = |
/// | --- | ---: | ---: | ---: | ---: |
/// | light | 12.03% | 1.780 | 0.108 | 12.23 |
/// | heavy | 41.35% | 3.015 | 0.513 | 13.60 |
///
/// At the baseline a failure never builds up: the 49 successes that follow
/// it on average take 5.3 off the light test's 1.780. Five failures in a
/// row trip the heavy test (5 × 3.015 = 15.1). One failure in every four
/// calls (25%, failure first) adds 1.780 − 3 × 0.108 = 1.456 to the light
/// test per four calls and trips it at the 33rd call (8 × 1.456 + 1.780 =
/// 13.43). A provider that normally fails 10% is tested against 10.06%:
/// nine failures in a row trip it, a rise to 20% about 250 calls after it
/// began, on average. At 0% it takes two failures close together; with a
/// baseline at the cap (40% with the default ceiling of 0.5), 27 in a row:
/// the most a hard outage can take once warmed up
/// ([`max_failures_to_trip`]).
///
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
            warm_up: 1_000,
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
    /// Smaller rises trip it too if they last, the later the smaller they
    /// are; one too small for the test to tell from noise (over a baseline
    /// of a few percent, about a third of it or less) is learned as the new
    /// baseline.
    pub fn min_degradation(mut self, rise: f64) -> Self {
        self.min_degradation = rise;
        self
    }

    /// Outcomes the baseline learns before the test judges (default 1,000);
    /// until then the [`fallback`](Self::fallback) policy does. The test is
    /// conservative right after the warm-up and sharpens as the baseline
    /// learns more.
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

    /// Outcomes the baseline averages over once it has learned that many
    /// (at least 1; default 1,000,000): a longer horizon knows the baseline
    /// more precisely and follows drift more slowly.
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

    /// Once warmed up, the most failures in a row it takes to trip, whatever
    /// baseline it learned (the worst is a baseline at its cap,
    /// `ceiling − min_degradation`); `None` if a parameter is invalid.
    /// During the warm-up the fallback's own threshold applies instead.
    ///
    /// ```
    /// use tower_circuit_breaker::policy::Adaptive;
    ///
    /// assert_eq!(Adaptive::new().max_failures_to_trip(), Some(27));
    /// // A lower ceiling caps the baseline lower: a hard outage trips sooner.
    /// assert_eq!(Adaptive::new().ceiling(0.3).max_failures_to_trip(), Some(14));
    /// ```
    pub fn max_failures_to_trip(&self) -> Option<u32> {
        self.validate("adaptive").ok()?;
        let settings = Settings::new(self);
        settings
            .tests(settings.max_baseline)
            .into_iter()
            .filter_map(|mut test| (1..=u32::MAX).find(|_| test.record(true)))
            .min()
    }

    pub(crate) fn validate(&self, path: &str) -> Result<(), ConfigError> {
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
    pub(crate) fn needs_clock(&self) -> bool {
        self.fallback.needs_clock()
    }

    /// Whether calls must be timed: only for the fallback's sake.
    pub(crate) fn needs_latency(&self) -> bool {
        self.fallback.needs_latency()
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
    min_degradation: f64,
    max_baseline: f64,
    /// `2 / α`: each test's threshold is `ln(1 + (p1 − p0)/(1 − p0) · this)`.
    inverse_share: f64,
}

impl Settings {
    fn new(policy: &Adaptive) -> Self {
        let budget = policy.false_trips_per_million * 1e-6;
        Settings {
            min_degradation: policy.min_degradation,
            // Positive: validation keeps the degradation below the ceiling.
            max_baseline: policy.ceiling - policy.min_degradation,
            inverse_share: TESTS as f64 / budget,
        }
    }

    /// The light and heavy tests against baseline `p0`, with empty
    /// statistics.
    fn tests(&self, p0: f64) -> [Cusum; TESTS] {
        let light = (p0 + self.min_degradation).min(MAX_DEGRADED);
        let heavy = (light + (1.0 - light) * HEAVY).min(MAX_DEGRADED);
        [light, heavy].map(|p1| Cusum::new(p0, p1, self.inverse_share))
    }
}

/// One CUSUM test of `p0` against `p1`.
#[derive(Clone, Copy, Debug)]
struct Cusum {
    on_failure: f64,
    on_success: f64,
    threshold: f64,
    statistic: f64,
    /// Outcomes, and failures, since the statistic last stood at zero: the
    /// evidence a trip is named by.
    calls: u32,
    failures: u32,
}

impl Cusum {
    fn new(p0: f64, p1: f64, inverse_share: f64) -> Self {
        Cusum {
            on_failure: (p1 / p0).ln(),
            on_success: ((1.0 - p1) / (1.0 - p0)).ln(),
            threshold: ((p1 - p0) / (1.0 - p0) * inverse_share).ln_1p(),
            statistic: 0.0,
            calls: 0,
            failures: 0,
        }
    }

    /// Takes the new ratios and threshold, keeping the evidence so far.
    fn retune(&mut self, tuned: Cusum) {
        self.on_failure = tuned.on_failure;
        self.on_success = tuned.on_success;
        self.threshold = tuned.threshold;
    }

    /// Adds one outcome; whether the statistic reached its threshold.
    fn record(&mut self, failure: bool) -> bool {
        let step = if failure {
            self.on_failure
        } else {
            self.on_success
        };
        self.statistic += step;
        if self.statistic <= 0.0 {
            self.clear();
            return false;
        }
        self.calls = self.calls.saturating_add(1);
        self.failures = self.failures.saturating_add(u32::from(failure));
        self.statistic >= self.threshold
    }

    fn clear(&mut self) {
        self.statistic = 0.0;
        self.calls = 0;
        self.failures = 0;
    }
}

/// Outcomes not yet learned, one bit each (1 for a failure), in a ring of
/// words: the word being filled and up to three full ones before it.
#[derive(Clone, Debug, Default)]
struct Held {
    words: [u64; HELD_WORDS],
    /// The word being filled, and how many of its bits are.
    head: usize,
    bits: u32,
    /// Full words waiting.
    full: usize,
}

impl Held {
    /// Holds one outcome; returns the failures among the oldest word of
    /// outcomes when it leaves the ring, to be learned.
    fn push(&mut self, failure: bool) -> Option<u32> {
        self.words[self.head] |= u64::from(failure) << self.bits;
        self.bits += 1;
        if self.bits < BATCH {
            return None;
        }
        self.bits = 0;
        self.head = (self.head + 1) % HELD_WORDS;
        if self.full < HELD_WORDS - 1 {
            self.full += 1;
            return None;
        }
        // The new head is the oldest full word: learn it and reuse it.
        let failures = self.words[self.head].count_ones();
        self.words[self.head] = 0;
        Some(failures)
    }

    /// Forgets the outcomes held: the breaker opened on them.
    fn clear(&mut self) {
        *self = Held::default();
    }
}

/// The running state of an [`Adaptive`] policy.
#[derive(Debug)]
pub(crate) struct Detector {
    settings: Settings,
    warm_up: u64,
    horizon: f64,
    /// Outcomes learned, and the baseline failure rate learned from them.
    learned: u64,
    rate: f64,
    held: Held,
    tests: [Cusum; TESTS],
    fallback: Box<PolicyState>,
}

impl Detector {
    pub(crate) fn new(policy: &Adaptive) -> Self {
        let settings = Settings::new(policy);
        let mut detector = Detector {
            settings,
            warm_up: u64::from(policy.warm_up),
            horizon: f64::from(policy.baseline_horizon),
            learned: 0,
            rate: 0.0,
            held: Held::default(),
            tests: settings.tests(settings.max_baseline),
            fallback: Box::new(PolicyState::new(&policy.fallback)),
        };
        detector.retune();
        detector
    }

    fn warming_up(&self) -> bool {
        self.learned < self.warm_up
    }

    /// Records one outcome. While warming up, the fallback judges and the
    /// tests only gather evidence.
    pub(crate) fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        let failure = sample.failure;
        if let Some(failures) = self.held.push(failure) {
            self.learn(failures);
        }
        let mut tripped = None;
        for test in &mut self.tests {
            if test.record(failure) && tripped.is_none() {
                tripped = Some((test.failures, test.calls));
            }
        }
        if self.warming_up() {
            return self.fallback.record(sample, now_ms);
        }
        tripped.map(|(failures, calls)| TripReason::Adaptive {
            failures,
            calls,
            baseline: self.rate,
        })
    }

    /// Learns a word of outcomes: a running mean up to the horizon, then an
    /// exponentially weighted one; capped so it never accepts an outage.
    fn learn(&mut self, failures: u32) {
        let n = f64::from(BATCH);
        let weight = (self.learned as f64 + n).min(self.horizon.max(n));
        let rate = self.rate + (f64::from(failures) - n * self.rate) / weight;
        self.rate = rate.clamp(0.0, self.settings.max_baseline);
        self.learned = self.learned.saturating_add(u64::from(BATCH));
        self.retune();
    }

    /// The rate tested against: Wilson's upper confidence bound on the
    /// learned rate, over the outcomes it averages, at most the cap.
    fn tested_baseline(&self) -> f64 {
        let n = (self.learned as f64).min(self.horizon).max(1.0);
        let (p, z2) = (self.rate, CONFIDENCE_Z * CONFIDENCE_Z);
        let spread = CONFIDENCE_Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
        let upper = (p + z2 / (2.0 * n) + spread) / (1.0 + z2 / n);
        upper.min(self.settings.max_baseline)
    }

    fn retune(&mut self) {
        let tuned = self.settings.tests(self.tested_baseline());
        for (test, tuned) in self.tests.iter_mut().zip(tuned) {
            test.retune(tuned);
        }
    }

    /// The breaker opened (or was reset): the test starts again and the
    /// outcomes not yet learned are forgotten. The baseline stays.
    pub(crate) fn reset(&mut self) {
        self.tests.iter_mut().for_each(Cusum::clear);
        // The fallback knows nothing of the baseline and may trip on the
        // dependency's normal failures: forgetting what it tripped on would
        // keep the baseline from learning them, and the warm-up from ending.
        if !self.warming_up() {
            self.held.clear();
        }
        self.fallback.reset();
    }

    pub(crate) fn figures(&self, now_ms: u64) -> PolicyFigures {
        // The test nearest to its threshold.
        let nearest = self
            .tests
            .iter()
            .max_by(|a, b| (a.statistic / a.threshold).total_cmp(&(b.statistic / b.threshold)))
            .copied()
            .unwrap_or(self.tests[0]);
        PolicyFigures::Adaptive {
            baseline: self.rate,
            learned: self.learned,
            statistic: nearest.statistic,
            threshold: nearest.threshold,
            fallback: self
                .warming_up()
                .then(|| Box::new(self.fallback.figures(now_ms))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(failure: bool) -> Sample {
        Sample {
            failure,
            elapsed: None,
        }
    }

    fn warmed(policy: &Adaptive, outcomes: u64, every: u64) -> Detector {
        let mut detector = Detector::new(policy);
        for i in 0..outcomes {
            let failure = every > 0 && i % every == 0;
            assert!(detector.record(outcome(failure), 0).is_none());
        }
        detector
    }

    #[test]
    fn the_worked_example_holds() {
        let mut detector = Detector::new(&Adaptive::new());
        detector.rate = 0.02;
        detector.learned = 1_000_000;
        detector.retune();
        let [light, heavy] = detector.tests;
        assert!((detector.tested_baseline() - 0.02028).abs() < 1e-5);
        assert!((light.on_failure - 1.780).abs() < 1e-3);
        assert!((light.on_success + 0.108).abs() < 1e-3);
        assert!((light.threshold - 12.23).abs() < 1e-2);
        assert!((heavy.on_failure - 3.015).abs() < 1e-3);
        assert!((heavy.on_success + 0.513).abs() < 1e-3);
        assert!((heavy.threshold - 13.60).abs() < 1e-2);
    }

    #[test]
    fn each_test_spends_half_the_budget_by_the_stated_bound() {
        let detector = Detector::new(&Adaptive::new());
        for p0 in [1e-6, 0.02, 0.1, 0.4] {
            let tests = detector.settings.tests(p0);
            let p1s = [p0 + 0.1, p0 + 0.1 + (0.9 - p0) / 3.0];
            for (test, p1) in tests.iter().zip(p1s) {
                let bound = (p1 - p0) / ((1.0 - p0) * test.threshold.exp_m1());
                assert!((bound - 0.5e-6).abs() < 1e-12, "p0 {p0}: {bound}");
            }
        }
    }

    #[test]
    fn outcomes_are_learned_192_to_255_calls_late() {
        let mut held = Held::default();
        let learned: Vec<usize> = (0..1024)
            .filter_map(|i| held.push(i < 64).map(|f| (i, f)))
            .map(|(i, f)| {
                assert_eq!(f, if i == 255 { 64 } else { 0 });
                i
            })
            .collect();
        assert_eq!(
            learned,
            vec![255, 319, 383, 447, 511, 575, 639, 703, 767, 831, 895, 959, 1023]
        );
    }

    #[test]
    fn a_trip_forgets_the_outcomes_held_back_but_not_the_baseline() {
        let policy = Adaptive::new().warm_up(0);
        let mut detector = warmed(&policy, 10_000, 50);
        let (rate, learned) = (detector.rate, detector.learned);
        assert!((rate - 0.02).abs() < 0.002, "{rate}");
        let trip = (0..100).find_map(|_| detector.record(outcome(true), 0));
        assert!(
            matches!(trip, Some(TripReason::Adaptive { .. })),
            "{trip:?}"
        );
        detector.reset();
        assert_eq!((detector.rate, detector.learned), (rate, learned));
        assert_eq!(detector.held.full, 0);
        assert!(detector.tests.iter().all(|t| t.statistic == 0.0));
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
        assert_eq!(detector.held.full, 3, "{:?}", detector.held);
        assert!(detector.warming_up());
    }

    #[test]
    fn the_baseline_never_rises_above_the_ceiling_less_the_degradation() {
        let policy = Adaptive::new().warm_up(0).baseline_horizon(1_000);
        let mut detector = Detector::new(&policy);
        // No trip is acted on here (nothing resets the test), so the
        // baseline learns every outcome.
        for _ in 0..100_000 {
            detector.record(outcome(true), 0);
        }
        assert_eq!(detector.rate, 0.4);
        assert_eq!(detector.tested_baseline(), 0.4);
    }

    #[test]
    fn the_fallback_judges_until_the_warm_up_is_over() {
        let policy = Adaptive::new().warm_up(1_000);
        let mut detector = Detector::new(&policy);
        let trip = (0..10).find_map(|_| detector.record(outcome(true), 0));
        assert_eq!(trip, Some(TripReason::ConsecutiveFailures { failures: 5 }));
        let mut detector = warmed(&policy, 1_300, 0);
        assert!(!detector.warming_up());
        let trip = (0..10).find_map(|_| detector.record(outcome(true), 0));
        match trip {
            Some(TripReason::Adaptive {
                failures, calls, ..
            }) => assert!(failures == calls && calls <= 5, "{trip:?}"),
            _ => panic!("{trip:?}"),
        }
    }

    #[test]
    fn max_failures_to_trip_is_met_at_the_cap() {
        let policy = Adaptive::new().warm_up(0).baseline_horizon(1_000);
        let bound = policy.max_failures_to_trip().unwrap_or(0);
        let mut detector = Detector::new(&policy);
        detector.rate = 0.4;
        detector.learned = 1_000_000;
        detector.retune();
        let calls = (1..=1_000).find(|_| detector.record(outcome(true), 0).is_some());
        assert_eq!(calls, Some(bound));
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
}
