//! Adaptive: trip when recent outcomes are significantly worse than the
//! dependency's own normal behaviour, learned as it runs. The model of
//! failures it assumes, its tests, their false-trip bound and worked
//! examples are documented on [`Adaptive`].

use super::time_window::validate_rate;
use super::{PolicyFigures, PolicyState, Sample, TripPolicy, TripReason};
use crate::error::ConfigError;

/// Outcomes are learned this many at a time, from one word of bits.
const BATCH: u32 = 64;
/// Words of outcomes held back before they are learned: three full words
/// and the one being filled, so an outcome is learned 192 to 255 calls late.
const HELD_WORDS: usize = 4;
/// Standard errors added to a learned rate to give the rate tested against
/// (a one-sided confidence of about 97.7%).
const CONFIDENCE_Z: f64 = 2.0;
/// Standard errors by which a state's own chance of a failure must differ
/// from the chance it would otherwise take before it counts: with 47 states,
/// one of them differs by two by chance more often than not.
const STATE_Z: f64 = 3.0;
/// Standard errors by which the recent failure rate must exceed the
/// long-run one before a rise is learned.
const RISE_Z: f64 = 3.0;
/// Where the heavy test's degraded rate lies, from the light test's rate
/// (0) to every call failing (1).
const HEAVY: f64 = 1.0 / 3.0;
/// Degraded rates and chances stay below 1, so a success's ratio stays
/// finite.
const MAX_DEGRADED: f64 = 1.0 - 1e-9;
/// Chances stay above 0, so a failure's ratio stays finite.
const MIN_CHANCE: f64 = 1e-12;
/// The run test never takes a failure to follow a failure more often than
/// this (or the baseline's cap, if higher): it bounds the failures in a row
/// a hard outage takes to trip, whatever runs the policy learned.
const RUN_CHANCE_CAP: f64 = 0.7;
/// The tests: light, heavy, run.
const TESTS: usize = 3;
/// The share of the false-trip budget each test spends. The run test needs
/// little: a run of failures adds to its evidence fast.
const SHARES: [f64; TESTS] = [0.5, 0.48, 0.02];
/// Outcomes the recent failure rate averages over: short enough to follow
/// a rise spread over a hundred thousand calls within about a point.
const RECENT_HORIZON: f64 = 4096.0;
/// Outcomes the recent failure rate must have seen before it is trusted.
const RECENT_MIN: f64 = 1024.0;
/// Until this many outcomes are learned (or the warm-up, if longer), the
/// outcomes that led to a trip are learned as well.
const LEARNING: u64 = 20_000;
/// Once past [`EAGER`] outcomes, the tests are retuned every this many
/// words learned: the model then moves slowly, and a retune takes up to
/// about 150 logarithms (three when every state takes the same chance).
const RETUNE_WORDS: u32 = 16;
/// Until this many outcomes are learned (or the warm-up and one word, if
/// longer), the tests are retuned at every word.
const EAGER: u64 = 65_536;

/// The limits on [`Adaptive::false_trips_per_million`].
const MIN_BUDGET: f64 = 1e-6;
const MAX_BUDGET: f64 = 100_000.0;
/// The smallest [`Adaptive::min_degradation`]: a hundredth of a point.
const MIN_DEGRADATION: f64 = 1e-4;

/// The states a call can be made in, by what the calls just before it did:
/// state 0 when nothing is known (at first, and after the breaker opened);
/// then the failure runs (the last `L` calls failed, `L` = 1 to 32 each a
/// state of its own, then 33-64, 65-128 and 129 or more); then the success
/// runs (the last `G` calls succeeded, by powers of two: 1, 2, 3-4, 5-8,
/// ..., 513 or more).
const RUN_STATES: usize = 35;
const GAP_STATES: usize = 11;
const STATES: usize = 1 + RUN_STATES + GAP_STATES;
const FIRST_RUN: usize = 1;
const FIRST_GAP: usize = FIRST_RUN + RUN_STATES;
const UNKNOWN: usize = 0;

/// The state after `run` failures in a row (at least 1).
fn run_state(run: u32) -> usize {
    if run <= 32 {
        run as usize
    } else {
        // 33-64, 65-128, 129 and more.
        33 + ((run - 1).ilog2() as usize - 5).min(2)
    }
}

/// The bin of `gap` successes in a row (at least 1): 0 for 1, 1 for 2,
/// 2 for 3-4, 3 for 5-8, and so on, the last bin open-ended.
fn gap_bin(gap: u64) -> usize {
    let bin = if gap <= 1 {
        0
    } else {
        (gap - 1).ilog2() as usize + 1
    };
    bin.min(GAP_STATES - 1)
}

/// The state after `gap` successes in a row (at least 1).
fn gap_state(gap: u64) -> usize {
    FIRST_GAP + gap_bin(gap)
}

/// The last gap of `gap`'s bin.
fn gap_bin_end(gap: u64) -> u64 {
    match gap_bin(gap) {
        bin if bin == GAP_STATES - 1 => u64::MAX,
        bin => 1 << bin,
    }
}

/// How many calls in a row failed, or succeeded, just before now; neither
/// when nothing is known.
#[derive(Clone, Copy, Debug, Default)]
struct Streak {
    failures: u32,
    successes: u64,
}

impl Streak {
    /// The state the next call is made in.
    fn state(&self) -> usize {
        if self.failures > 0 {
            run_state(self.failures)
        } else if self.successes > 0 {
            gap_state(self.successes)
        } else {
            UNKNOWN
        }
    }

    fn push(&mut self, failure: bool) {
        if failure {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        } else {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        }
    }
}

/// Wilson's confidence interval for a share of `hits` in `trials` (both
/// possibly fractional, as learned outcomes decay), `z` standard errors
/// wide on each side.
fn wilson(hits: f64, trials: f64, z: f64) -> (f64, f64) {
    if trials <= 0.0 {
        return (0.0, 1.0);
    }
    let p = (hits / trials).clamp(0.0, 1.0);
    let z2 = z * z;
    let spread = z * (p * (1.0 - p) / trials + z2 / (4.0 * trials * trials)).sqrt();
    let middle = p + z2 / (2.0 * trials);
    let scale = 1.0 + z2 / trials;
    (
        ((middle - spread) / scale).max(0.0),
        ((middle + spread) / scale).min(1.0),
    )
}

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
/// # The failure model
///
/// Failures of real dependencies are rarely independent coin flips: a
/// rate-limit window, a bad replica or a regional blip makes them come in
/// runs. The policy assumes that whether a call fails depends on the calls
/// before it only through *how many calls in a row just failed, or just
/// succeeded*: runs of failures and runs of successes alternate, and their
/// lengths follow distributions of the dependency's own. It learns, for
/// each such state, the chance that the next call fails:
///
/// - after `L` failures in a row (`L` = 1 to 32 each on its own, then 33-64,
///   65-128, 129 or more), the chance the run goes on;
/// - after `G` successes in a row (1, 2, 3-4, 5-8, ..., 513 or more), the
///   chance a failure comes next.
///
/// Independent failures at a rate `p` are the case where every state's
/// chance is `p`. Runs of 3 to 5 failures make the chance after one or two
/// failures near 1 and after five near 0; bad periods, in which a share of
/// calls fail, make the chance after a few successes higher than after
/// many. Whatever the model cannot tell apart, it takes from the simpler
/// one: a state's own chance counts only where its outcomes show, by three
/// standard errors, that it differs from the state before it (one failure
/// less, or fewer successes), the first of each kind from the failure rate
/// over all calls. So a dependency whose failures are independent is
/// tested exactly as if the policy assumed so, and beyond the longest runs
/// it has seen, a run is taken to go on as the longest did.
///
/// What this model does not capture (a dependence over long stretches, such
/// as a daily cycle) shows as a moving failure rate, which the baseline
/// follows (below), or as false trips beyond the budget. And what it takes
/// as normal, it is slow to call a degradation: with bad periods in which
/// half the calls fail, a lasting rise to 20% or 40% of calls failing at
/// random looks like a bad period that does not end, and takes hundreds of
/// calls to notice (study 6 of the outage bench).
///
/// # The tests
///
/// A degradation is the dependency's normal behaviour plus failures of its
/// own: each call also fails, independently, with a chance `e`. In a state
/// where the learned chance of a failure is `c0`, the degraded chance is
/// `c1 = c0 + (1 − c0)·e`, and an outcome `x` (1 for a failure) has the
/// log-likelihood ratio
///
/// ```text
/// llr = ln(c1/c0) for a failure,   ln(1 − e) for a success
/// ```
///
/// The CUSUM statistic `S ← max(0, S + llr)` (Page, 1954) trips when it
/// reaches a threshold `h`. Three such tests run side by side, each with a
/// share of the false-trip budget:
///
/// - *light* (half the budget): a rise of the failure rate by
///   [`min_degradation`](Self::min_degradation) `d`, `e = d / (1 − p0)` for
///   a baseline rate `p0`: sees a small rise;
/// - *heavy* (48%): a rise a third of the way from there to every call
///   failing: sees a large one in fewer calls;
/// - *run* (2%): every call failing, `e = 1`: a success ends its evidence,
///   and a run of failures trips it once the run is less likely than the
///   budget under the learned model (five failures in a row over a steady
///   2%, eight over 10%, where another test may need more).
///
/// # The false-trip bound
///
/// While the dependency behaves as learned, `E[e^llr] = c0·c1/c0 + (1 −
/// c0)·(1 − e) = 1` in every state: `e^S` is a fair bet. A stretch of `S`
/// above zero begins with a failure while `S = 0` (with chance `c0`) and
/// ends below zero, where `e^S > 1 − e`, or at `h`. Optional stopping over
/// the stretch gives `c1/c0 ≥ q·e^h + (1 − q)·(1 − e)`, where `q` is the
/// chance it reaches `h`, so each test trips falsely at most
///
/// ```text
/// c0·q ≤ e / (e^h − 1 + e)     times per call, in every state
/// ```
///
/// whatever the learned chances (a reset by another test only ends a
/// stretch early). Each test's threshold is therefore `h = ln(1 + e·(1/α −
/// 1))` for its share `α` of the budget [`false_trips_per_million`] / 10⁶
/// (`h = ln(1/α)` for the run test), and the three together trip falsely at
/// most the budget. The bound leaves out the overshoot past `h`, so measured
/// false trips come out within it with room (see the outage bench and
/// `tests/in_process/adaptive*.rs`).
///
/// The bound holds for the chances the dependency really has. The policy
/// tests against estimates: the failure rate over all calls is an upper
/// confidence bound (Wilson's, two standard errors); a state's own chance
/// counts as far as its outcomes show it differs from the one before it, no
/// further. Two limits trade a little of the bound for other promises: the
/// run test takes no chance above 0.7 that a failure follows a failure (so
/// a hard outage always trips within [`max_failures_to_trip`]; runs of about
/// twenty failures in a row are the longest it can learn as normal at a
/// budget of one per million), and while the recent failure rate has risen
/// (below) the learned chances are raised by the rise as independent
/// failures.
///
/// # The baseline
///
/// The chances and the failure rate over all calls are learned from
/// closed-state outcomes: a running mean that becomes an exponentially
/// weighted one after [`baseline_horizon`] outcomes. Outcomes are learned 192
/// to 255 calls late, and once the policy has learned 20,000 outcomes (or its
/// warm-up, if longer), only if the breaker did not open meanwhile: the calls
/// that led to a trip never teach the baseline that a degradation is
/// normal. Before that, they do: a young policy trips on the dependency's
/// normal runs of failures before it has seen them, and must learn them.
/// (During the warm-up, the fallback's trips likewise forget nothing.)
/// Outcomes while open or half-open never reach a trip policy. The breaker
/// resets the tests (never the baseline) whenever it opens, so the baseline
/// survives outages and manual resets; a new trip policy (through
/// [`Breaker::reconfigure`](crate::Breaker::reconfigure)) starts a new one.
///
/// A second, recent failure rate averages the last 4,096 closed-state
/// outcomes, trips or not, and learns a lasting rise smaller than `d`: once
/// it is above the long-run rate by three standard errors (widened by the
/// spread of failures over words of 64 calls, which runs make larger than
/// independent failures do), and below the long-run rate plus `d` by two,
/// the tests take its upper bound as the baseline rate, until the long-run
/// rate has caught up with it. Meanwhile the baseline tested against is
/// about a point above the recent rate (at 10%), so a further degradation
/// takes a little longer to be noticed. A rise spread over a hundred
/// thousand calls from 2% to 10% (eight points, with the default ten) is
/// followed without a trip in most runs of the outage bench; a sudden one
/// trips it about a hundred times before it is learned.
///
/// A rise that may be `d` or more is not learned this way: it keeps
/// tripping, while the long-run rate learns only the outcomes between trips
/// old enough, and so follows it slowly. Once the long-run rate has come
/// within `d` of the new rate, the rise is learned too: a rise from 10% to
/// 20% tripped it about 1,160 times over a million calls in the outage
/// bench, then about as rarely as a steady rate does. A rise well above `d`
/// keeps tripping it.
///
/// The baseline is capped at `ceiling − d`, so the light test's `p1` is at
/// most [`ceiling`](Self::ceiling); once the long-run rate reaches that
/// cap, the learned chances are set aside and the dependency is tested as
/// if its failures were independent at the cap: a failure rate at or above
/// the ceiling always trips, however long the dependency has been
/// failing. Until the baseline has learned [`warm_up`](Self::warm_up)
/// outcomes, a fixed [`fallback`] policy judges instead (the tests keep
/// their evidence meanwhile).
///
/// # The learning phase
///
/// The tests judge from the first call (with the default `warm_up` of 0).
/// What they test against starts as a cautious guess: the failure rate over
/// all calls is an upper confidence bound, high while few outcomes are in,
/// so a young policy needs more failures to trip. A hard outage from its
/// first call, or from its hundredth, trips it within about 20 calls, from
/// the five-hundredth within 5 to 10, and from about the two-thousandth as
/// soon as once the baseline is learned (five consecutive failures take 5 at
/// any age; to trip that
/// soon from the first call, combine the policy with
/// `CountWindow::new(5, 5)` in [`TripPolicy::any_of`], at the cost of that
/// rule's own trips on normal runs of five); a partial one (40% of calls failing) at the
/// five-hundredth within 13 to 72 calls at baselines of 0% to 10%, where
/// five consecutive failures take over a hundred (20 seeds each, through
/// the breaker). A failure run the policy has not seen yet is taken to be
/// as likely as independent failures, so a young policy trips on normal
/// runs of failures longer than a handful before it has seen a few, and
/// learns from each such trip (until 20,000 outcomes are learned, the
/// outcomes of a trip are learned too); `learning` in
/// [`PolicyFigures::Adaptive`](super::PolicyFigures::Adaptive) says when
/// this phase is over. Trips in the first million calls (study 6 of the
/// outage bench, one seed): none for runs of 3 to 5 failures at 2% and 10%
/// of calls; 5 for runs of 10 to 20, which look like an outage until
/// learned, all in the first few thousand calls; 2 to 3 for bad periods.
/// Past it the budget holds as stated (0 to 0.11 false trips per million
/// there, 0 to 0.22 in study 5).
///
/// # Worked examples
///
/// With the defaults (`d` = 0.1, one false trip per million calls), a
/// provider that failed 2% of a million calls, independently, is tested
/// against `p0` = 2.03% in every state:
///
/// | test | `e` | a failure adds | a success subtracts | trips at `h` = |
/// | --- | ---: | ---: | ---: | ---: |
/// | light | 0.1021 | 1.780 | 0.108 | 12.23 |
/// | heavy | 0.4014 | 3.015 | 0.513 | 13.64 |
/// | run | 1 | 3.898 | everything | 17.73 |
///
/// At the baseline a failure never builds up: the 49 successes that follow
/// it on average take 5.3 off the light test's 1.780. Five failures in a
/// row trip the heavy test (5 × 3.015 = 15.1) and the run test (5 × 3.898 =
/// 19.5). One failure in every four calls (25%, failure first) adds 1.780 −
/// 3 × 0.108 = 1.456 to the light test per four calls and trips it at the
/// 33rd call (8 × 1.456 + 1.780 = 13.43). A provider that normally fails 10%
/// of calls, independently, is tested against 10.06%: eight failures in a
/// row trip it, a rise to 20% about 260 calls after it began, on average.
/// At 0% it takes two failures close together.
///
/// A provider that fails 2% of calls in runs of 3 to 5 has, once learned, a
/// chance near 0.5% that a run starts after a success, near 1 that a run
/// of one or two goes on, and near 0 that a run of five does. A run's first
/// failure adds about 3 to the light test (ln(0.107/0.005)), its next ones
/// almost nothing, and the successes after it take the evidence away: no
/// single run trips it, where the same runs, taken for independent
/// failures, trip the heavy test at every run of five. A sixth failure in a
/// row is another matter: the run test takes the chance that a run of five
/// goes on from what it learned, near 0, and trips within a few more.
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

/// One test's evidence so far.
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    statistic: f64,
    /// Outcomes, and failures, since the statistic last stood at zero: the
    /// evidence a trip is named by.
    calls: u32,
    failures: u32,
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

/// A word of outcomes just filled: its failures, and the oldest word held,
/// which leaves the ring to be learned once the ring is full.
#[derive(Clone, Copy, Debug)]
struct Filled {
    failures: u32,
    oldest: Option<u64>,
}

impl Held {
    /// Holds one outcome.
    fn push(&mut self, failure: bool) -> Option<Filled> {
        self.words[self.head] |= u64::from(failure) << self.bits;
        self.bits += 1;
        if self.bits < BATCH {
            return None;
        }
        let failures = self.words[self.head].count_ones();
        self.bits = 0;
        self.head = (self.head + 1) % HELD_WORDS;
        if self.full < HELD_WORDS - 1 {
            self.full += 1;
            return Some(Filled {
                failures,
                oldest: None,
            });
        }
        // The new head is the oldest full word: learn it and reuse it.
        let oldest = std::mem::take(&mut self.words[self.head]);
        Some(Filled {
            failures,
            oldest: Some(oldest),
        })
    }

    /// The failures and outcomes in the word being filled.
    fn partial(&self) -> (u32, u32) {
        (self.words[self.head].count_ones(), self.bits)
    }

    /// Every word held, oldest first, with its number of outcomes; the ring
    /// is left empty.
    fn drain(&mut self) -> impl Iterator<Item = (u64, u32)> {
        let held = std::mem::take(self);
        (0..=held.full).map(move |k| {
            let index = (held.head + HELD_WORDS - held.full + k) % HELD_WORDS;
            let bits = if k == held.full { held.bits } else { BATCH };
            (held.words[index], bits)
        })
    }
}

/// The recent failure rate: every closed-state outcome, trips or not,
/// averaged over the last [`RECENT_HORIZON`], and the spread of failures
/// over words of 64 outcomes around it.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    rate: f64,
    outcomes: f64,
    /// The mean squared difference between a word's failures and the
    /// recent rate's, and the words it averages.
    spread: f64,
    words: f64,
}

impl Recent {
    fn learn(&mut self, failures: u32, calls: u32, horizon: f64) {
        if calls == 0 {
            return;
        }
        let n = f64::from(calls);
        if calls == BATCH && self.outcomes >= n {
            let deviation = f64::from(failures) - n * self.rate;
            let weight = (self.words + 1.0).min((horizon / n).max(1.0));
            self.spread += (deviation * deviation - self.spread) / weight;
            self.words += 1.0;
        }
        let weight = (self.outcomes + n).min(RECENT_HORIZON.max(n));
        self.rate = (self.rate + (f64::from(failures) - n * self.rate) / weight).clamp(0.0, 1.0);
        self.outcomes = (self.outcomes + n).min(RECENT_HORIZON);
    }

    /// How much more failures spread over words than independent ones
    /// would: 1 for independent failures, about the mean length of a run
    /// for failures in runs.
    fn dispersion(&self) -> f64 {
        let independent = f64::from(BATCH) * self.rate * (1.0 - self.rate);
        if self.words < 16.0 || independent <= 0.0 {
            return 1.0;
        }
        (self.spread / independent).max(1.0)
    }

    /// The standard error of the recent rate, widened by the dispersion.
    fn standard_error(&self) -> f64 {
        let variance = self.dispersion() * self.rate * (1.0 - self.rate);
        (variance / self.outcomes.max(1.0)).sqrt()
    }
}

/// What the policy learned of the dependency: the long-run failure rate,
/// and per state the outcomes made in it and the failures among them.
#[derive(Clone, Debug)]
struct Learned {
    outcomes: u64,
    rate: f64,
    seen: [f64; STATES],
    failed: [f64; STATES],
    /// The factor the tallies are still to be multiplied by, to forget the
    /// oldest outcomes at the rate the long-run rate does.
    decay: f64,
    /// The streak at the last outcome learned.
    streak: Streak,
}

impl Learned {
    fn new() -> Self {
        Learned {
            outcomes: 0,
            rate: 0.0,
            seen: [0.0; STATES],
            failed: [0.0; STATES],
            decay: 1.0,
            streak: Streak::default(),
        }
    }

    /// Learns the first `bits` outcomes of `word` (the others are zero): a
    /// running mean up to the horizon, then an exponentially weighted one;
    /// the rate capped so that it never accepts an outage.
    fn learn(&mut self, word: u64, bits: u32, horizon: f64, max_rate: f64) {
        if bits == 0 {
            return;
        }
        let n = f64::from(bits);
        let weight = (self.outcomes as f64 + n).min(horizon.max(n));
        let rate = self.rate + (f64::from(word.count_ones()) - n * self.rate) / weight;
        self.rate = rate.clamp(0.0, max_rate);
        if self.outcomes as f64 + n > horizon {
            self.decay *= 1.0 - n / horizon.max(n);
        }
        self.tally(word, bits);
        self.outcomes = self.outcomes.saturating_add(u64::from(bits));
    }

    /// Counts each outcome in the state it was made in, a run of equal
    /// outcomes at a time.
    fn tally(&mut self, word: u64, bits: u32) {
        let (mut rest, mut left) = (word, bits);
        while left > 0 {
            let successes = rest.trailing_zeros().min(left);
            if successes > 0 {
                self.tally_successes(successes);
                rest = rest.checked_shr(successes).unwrap_or(0);
                left -= successes;
            }
            let failures = (!rest).trailing_zeros().min(left);
            if failures > 0 {
                self.tally_failures(failures);
                rest = rest.checked_shr(failures).unwrap_or(0);
                left -= failures;
            }
        }
    }

    fn tally_successes(&mut self, count: u32) {
        self.add(self.streak.state(), false);
        // The others are made after 1, 2, ... successes in a row (more if
        // the streak was already one of successes), a bin at a time.
        let mut gap = self.streak.successes.saturating_add(1);
        let mut remaining = u64::from(count - 1);
        while remaining > 0 {
            let take = remaining.min(gap_bin_end(gap) - gap + 1);
            self.seen[gap_state(gap)] += take as f64;
            gap = gap.saturating_add(take);
            remaining -= take;
        }
        self.streak = Streak {
            failures: 0,
            successes: self.streak.successes.saturating_add(u64::from(count)),
        };
    }

    fn tally_failures(&mut self, count: u32) {
        self.add(self.streak.state(), true);
        let mut run = self.streak.failures;
        for _ in 1..count {
            run = run.saturating_add(1);
            self.add(run_state(run), true);
        }
        self.streak = Streak {
            failures: self.streak.failures.saturating_add(count),
            successes: 0,
        };
    }

    fn add(&mut self, state: usize, failure: bool) {
        if state != UNKNOWN {
            self.seen[state] += 1.0;
            self.failed[state] += f64::from(u8::from(failure));
        }
    }

    fn apply_decay(&mut self) {
        if self.decay < 1.0 {
            let decay = std::mem::replace(&mut self.decay, 1.0);
            self.seen.iter_mut().for_each(|n| *n *= decay);
            self.failed.iter_mut().for_each(|n| *n *= decay);
        }
    }

    /// The chance of a failure in each state: the first of each kind takes
    /// `normal` (the rate over all calls), the others the chance of the
    /// state before them, unless their own outcomes show, by [`STATE_Z`]
    /// standard errors, that it differs; then the nearest end of their own
    /// interval. State 0 (nothing known) takes `normal`, and so does every
    /// state once the long-run rate has reached `max_rate`.
    fn chances(&self, normal: f64, max_rate: f64) -> [f64; STATES] {
        let mut chances = [normal; STATES];
        // A dependency failing at the cap or more is tested as if its
        // failures were independent at the cap, whatever runs it learned:
        // so a failure rate at the ceiling always trips.
        if self.rate >= max_rate {
            return chances;
        }
        for kind in [FIRST_RUN..FIRST_GAP, FIRST_GAP..STATES] {
            let mut parent = normal;
            let learned = self.failed[kind.clone()]
                .iter()
                .zip(&self.seen[kind.clone()]);
            for (chance, (&failed, &seen)) in chances[kind].iter_mut().zip(learned) {
                let (low, high) = wilson(failed, seen, STATE_Z);
                // max then min rather than clamp: never a panic, whatever
                // the floats.
                parent = parent.max(low).min(high);
                *chance = parent;
            }
        }
        chances
    }
}

/// The tests' steps and thresholds, retuned as the model learns.
#[derive(Clone, Debug)]
struct Tuned {
    /// What a failure adds, per test and state.
    on_failure: [[f64; STATES]; TESTS],
    /// What a success adds (`ln(1 − e)`, the same in every state).
    on_success: [f64; TESTS],
    threshold: [f64; TESTS],
}

impl Tuned {
    /// Tests against `chances` raised by `extra` independent failures.
    fn new(settings: &Settings, chances: &[f64; STATES], extra: f64, level: f64) -> Self {
        let added = settings.added(level);
        let run_cap = settings.run_chance_cap();
        let mut tuned = Tuned {
            on_failure: [[0.0; STATES]; TESTS],
            on_success: [0.0; TESTS],
            threshold: [0.0; TESTS],
        };
        for (test, &added) in added.iter().enumerate() {
            tuned.threshold[test] = settings.threshold(test, added);
            tuned.on_success[test] = if added >= 1.0 {
                f64::NEG_INFINITY
            } else {
                (-added).ln_1p()
            };
        }
        let [light, heavy, run] = &mut tuned.on_failure;
        // Most states take the chance of the state before them (every one,
        // for independent failures): their steps are computed once.
        let mut previous: Option<(f64, [f64; TESTS])> = None;
        for (state, &chance) in chances.iter().enumerate() {
            let steps = match previous {
                Some((same, steps)) if same == chance => steps,
                _ => {
                    let normal = (chance + (1.0 - chance) * extra).clamp(MIN_CHANCE, MAX_DEGRADED);
                    let ln_normal = normal.ln();
                    let step = |added: f64| (normal + (1.0 - normal) * added).ln() - ln_normal;
                    [step(added[0]), step(added[1]), -normal.min(run_cap).ln()]
                }
            };
            [light[state], heavy[state], run[state]] = steps;
            previous = Some((chance, steps));
        }
        tuned
    }
}

/// The learned model and the tests tuned to it: the policy's large part,
/// kept behind one allocation made with the policy.
#[derive(Clone, Debug)]
struct Model {
    learned: Learned,
    tuned: Tuned,
}

/// The running state of an [`Adaptive`] policy.
#[derive(Debug)]
pub(crate) struct Detector {
    settings: Settings,
    warm_up: u64,
    horizon: f64,
    held: Held,
    words_since_retune: u32,
    recent: Recent,
    /// Whether the tests take the recent rate as the baseline.
    risen: bool,
    evidence: [Evidence; TESTS],
    /// Whether any test holds evidence: a success adds nothing otherwise.
    active: bool,
    /// The streak of the outcomes recorded: the state of the next call.
    live: Streak,
    model: Box<Model>,
    fallback: Box<PolicyState>,
}

impl Detector {
    pub(crate) fn new(policy: &Adaptive) -> Self {
        let settings = Settings::new(policy);
        let learned = Learned::new();
        let chances = learned.chances(settings.max_baseline, settings.max_baseline);
        let tuned = Tuned::new(&settings, &chances, 0.0, settings.max_baseline);
        let mut detector = Detector {
            settings,
            warm_up: u64::from(policy.warm_up),
            horizon: f64::from(policy.baseline_horizon),
            held: Held::default(),
            words_since_retune: 0,
            recent: Recent::default(),
            risen: false,
            evidence: [Evidence::default(); TESTS],
            active: false,
            live: Streak::default(),
            model: Box::new(Model { learned, tuned }),
            fallback: Box::new(PolicyState::new(&policy.fallback)),
        };
        detector.retune();
        detector
    }

    fn warming_up(&self) -> bool {
        self.model.learned.outcomes < self.warm_up
    }

    /// Whether the policy is still learning from its trips (see the
    /// learning phase on [`Adaptive`]).
    fn learning(&self) -> bool {
        self.model.learned.outcomes < LEARNING.max(self.warm_up)
    }

    /// Records one outcome. While warming up, the fallback judges and the
    /// tests only gather evidence.
    pub(crate) fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        let failure = sample.failure;
        if let Some(filled) = self.held.push(failure) {
            self.recent.learn(filled.failures, BATCH, self.horizon);
            if let Some(word) = filled.oldest {
                self.learn(word, BATCH);
            }
        }
        // A success adds nothing to tests that hold no evidence.
        let tripped = if failure || self.active {
            self.judge(failure)
        } else {
            None
        };
        self.live.push(failure);
        if self.warming_up() {
            return self.fallback.record(sample, now_ms);
        }
        tripped.map(|(failures, calls)| TripReason::Adaptive {
            failures,
            calls,
            baseline: self.baseline(),
        })
    }

    /// Adds one outcome to every test; the evidence of the first that
    /// reached its threshold.
    fn judge(&mut self, failure: bool) -> Option<(u32, u32)> {
        let state = self.live.state();
        let tuned = &self.model.tuned;
        let mut tripped = None;
        let mut active = false;
        for (test, evidence) in self.evidence.iter_mut().enumerate() {
            evidence.statistic += if failure {
                tuned.on_failure[test][state]
            } else {
                tuned.on_success[test]
            };
            if evidence.statistic <= 0.0 {
                *evidence = Evidence::default();
                continue;
            }
            active = true;
            evidence.calls = evidence.calls.saturating_add(1);
            evidence.failures = evidence.failures.saturating_add(u32::from(failure));
            if evidence.statistic >= tuned.threshold[test] && tripped.is_none() {
                tripped = Some((evidence.failures, evidence.calls));
            }
        }
        self.active = active;
        tripped
    }

    /// Learns a word of outcomes, and retunes the tests when due.
    fn learn(&mut self, word: u64, bits: u32) {
        let max_rate = self.settings.max_baseline;
        self.model.learned.learn(word, bits, self.horizon, max_rate);
        self.words_since_retune += 1;
        let eager = EAGER.max(self.warm_up.saturating_add(u64::from(BATCH)));
        if self.words_since_retune >= RETUNE_WORDS || self.model.learned.outcomes <= eager {
            self.retune();
        }
    }

    /// The long-run rate tested against: Wilson's upper confidence bound on
    /// the learned rate, over the outcomes it averages, at most the cap.
    fn normal_rate(&self) -> f64 {
        let learned = &self.model.learned;
        let n = (learned.outcomes as f64).min(self.horizon).max(1.0);
        let (_, upper) = wilson(learned.rate * n, n, CONFIDENCE_Z);
        upper.min(self.settings.max_baseline)
    }

    /// The baseline rate the tests take, from the long-run rate `normal`:
    /// the recent rate's upper bound while it has risen by less than the
    /// smallest degradation, `normal` otherwise.
    fn level(&mut self, normal: f64) -> f64 {
        let recent = self.recent;
        // Nothing can rise above the cap.
        if recent.outcomes < RECENT_MIN || normal >= self.settings.max_baseline {
            self.risen = false;
            return normal;
        }
        let error = recent.standard_error();
        let upper = recent.rate + CONFIDENCE_Z * error;
        // A rise that may be the smallest degradation or more is never
        // learned here: it trips, and keeps tripping.
        if upper >= self.model.learned.rate + self.settings.min_degradation {
            self.risen = false;
            return normal;
        }
        // Once risen, it stays so until the long-run rate has caught up,
        // so the baseline never falls back below the recent rate.
        self.risen = if self.risen {
            recent.rate > normal
        } else {
            recent.rate - RISE_Z * error > normal
        };
        if self.risen {
            upper.min(self.settings.max_baseline).max(normal)
        } else {
            normal
        }
    }

    fn retune(&mut self) {
        self.words_since_retune = 0;
        self.model.learned.apply_decay();
        let normal = self.normal_rate();
        let level = self.level(normal);
        // The rise, as independent failures added to the learned chances.
        let extra = (level - normal) / (1.0 - normal);
        let chances = self
            .model
            .learned
            .chances(normal, self.settings.max_baseline);
        self.model.tuned = Tuned::new(&self.settings, &chances, extra, level);
    }

    /// The baseline failure rate the tests take as normal.
    fn baseline(&self) -> f64 {
        if self.risen {
            self.recent.rate.min(self.settings.max_baseline)
        } else {
            self.model.learned.rate
        }
    }

    /// The breaker opened (or was reset): the tests start again, and the
    /// outcomes not yet learned are forgotten, unless the policy is still
    /// learning what is normal. The baseline stays.
    pub(crate) fn reset(&mut self) {
        self.evidence = [Evidence::default(); TESTS];
        self.active = false;
        let (failures, calls) = self.held.partial();
        self.recent.learn(failures, calls, self.horizon);
        if self.learning() {
            // A young policy (or the fallback, which knows nothing of the
            // baseline) trips on the dependency's normal failures before it
            // has seen them: forgetting what it tripped on would keep it
            // from ever learning them, and the warm-up from ending.
            let max_rate = self.settings.max_baseline;
            for (word, bits) in self.held.drain() {
                self.model.learned.learn(word, bits, self.horizon, max_rate);
            }
            self.retune();
        }
        self.held = Held::default();
        // The next outcome comes after an open period: nothing is known of
        // the calls just before it.
        self.model.learned.streak = Streak::default();
        self.live = Streak::default();
        self.fallback.reset();
    }

    pub(crate) fn figures(&self, now_ms: u64) -> PolicyFigures {
        // The test nearest to its threshold.
        let tuned = &self.model.tuned;
        let nearness = |test: usize| self.evidence[test].statistic / tuned.threshold[test];
        let nearest = (0..TESTS)
            .max_by(|&a, &b| nearness(a).total_cmp(&nearness(b)))
            .unwrap_or(0);
        PolicyFigures::Adaptive {
            baseline: self.baseline(),
            learned: self.model.learned.outcomes,
            statistic: self.evidence[nearest].statistic,
            threshold: tuned.threshold[nearest],
            learning: self.learning(),
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
                (tuned.on_success[test] - success).abs() < 1e-3
                    || tuned.on_success[test] == success,
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
            Some(TripReason::Adaptive { failures, .. }) => assert!(failures <= 7, "{trip:?}"),
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
            matches!(trip, Some(TripReason::Adaptive { .. })),
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
}
