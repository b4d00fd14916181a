//! Time window: trip on the failure rate over the last stretch of time.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;
use crate::millis::millis;

/// The most buckets a time window may have.
pub(crate) const MAX_BUCKETS: u32 = 10_000;

/// The buckets of a time window unless it says otherwise (a slow-call
/// policy's window over time too, when a config file gives none).
pub(super) const DEFAULT_BUCKETS: u32 = 10;

/// Trips when, over the last `window` of time, at least `min_calls` calls
/// were recorded and the share of failures is at least `failure_rate`
/// (`>=`, so a rate of 1.0 means "every call failed").
///
/// The window is split into `buckets` (default 10) that age out one at a
/// time. Defaults: 10 buckets, at least 10 calls, rate 0.5. Every outcome
/// reads the clock: choose it when traffic is steady enough for a rate to
/// mean something.
///
/// A success that cannot trip it (while the failures held would stay under
/// the rate over `min_calls` calls) takes no lock: the thread adds it to a
/// tally (on a cache line of its own, for up to four threads started one
/// after another), folded into the bucket of the success's own time before
/// the next outcome recorded under the lock is judged, and before a
/// snapshot. Failures, the first success
/// of each bucket, and successes once the window is near its rate are
/// recorded under the breaker's lock.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::TimeWindow, Config};
///
/// let config = Config::builder()
///     .trip(
///         TimeWindow::new(Duration::from_secs(30))
///             .buckets(6)
///             .min_calls(20)
///             .failure_rate(0.5),
///     )
///     .build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TimeWindow {
    window: Duration,
    buckets: u32,
    min_calls: u32,
    failure_rate: f64,
}

impl TimeWindow {
    /// A window of the given length, with the defaults above.
    pub fn new(window: Duration) -> Self {
        TimeWindow {
            window,
            buckets: DEFAULT_BUCKETS,
            min_calls: 10,
            failure_rate: 0.5,
        }
    }

    /// Number of buckets the window is split into.
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// Calls the window must hold before it judges.
    pub fn min_calls(mut self, calls: u32) -> Self {
        self.min_calls = calls;
        self
    }

    /// Failure share, in (0, 1], at or above which the breaker trips.
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = rate;
        self
    }

    /// Length of the window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The configured failure share.
    pub fn rate(&self) -> f64 {
        self.failure_rate
    }

    /// The configured minimum number of calls.
    pub fn minimum_calls(&self) -> u32 {
        self.min_calls
    }
}

#[cfg(feature = "serde")]
impl FromFile for TimeWindow {
    const FIELDS: &'static [&'static str] = &["window", "buckets", "min_calls", "failure_rate"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let mut policy = TimeWindow::new(required(written, "window", |w, f| w.duration(f))?);
        if let Some(buckets) = written.count("buckets")? {
            policy = policy.buckets(buckets);
        }
        if let Some(min_calls) = written.count("min_calls")? {
            policy = policy.min_calls(min_calls);
        }
        if let Some(rate) = written.number("failure_rate")? {
            policy = policy.failure_rate(rate);
        }
        Ok(policy)
    }
}

impl Policy for TimeWindow {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        validate_time(path, "window", self.window, self.buckets)?;
        validate_min_calls(path, self.min_calls)?;
        validate_rate(path, "failure_rate", self.failure_rate)
    }

    fn needs_clock(&self) -> bool {
        true
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(FailureRate::new(self)))
    }
}

pub(crate) fn validate_time(
    path: &str,
    field: &str,
    window: Duration,
    buckets: u32,
) -> Result<(), ConfigError> {
    if buckets == 0 || buckets > MAX_BUCKETS {
        return Err(ConfigError::new(
            format!("{path}.buckets"),
            format!("must be between 1 and {MAX_BUCKETS}"),
        ));
    }
    if window.as_millis() < buckets as u128 {
        return Err(ConfigError::new(
            format!("{path}.{field}"),
            format!("must be at least one millisecond per bucket ({buckets} ms)"),
        ));
    }
    Ok(())
}

pub(crate) fn validate_min_calls(path: &str, min_calls: u32) -> Result<(), ConfigError> {
    if min_calls == 0 {
        return Err(ConfigError::new(
            format!("{path}.min_calls"),
            "must be at least 1",
        ));
    }
    Ok(())
}

pub(crate) fn validate_rate(path: &str, field: &str, rate: f64) -> Result<(), ConfigError> {
    if !(rate > 0.0 && rate <= 1.0) {
        return Err(ConfigError::new(
            format!("{path}.{field}"),
            format!("must be in (0, 1], got {rate}"),
        ));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    calls: u32,
    hits: u32,
}

/// Calls and "hits" (failures, or slow calls) per bucket of time, with
/// running totals over the window so that a verdict costs no scan, and the
/// current bucket's end kept so that staying in it costs no division.
#[derive(Debug)]
pub(crate) struct Buckets {
    bucket_ms: u64,
    slots: Vec<Slot>,
    /// Index (time / bucket length) of the newest bucket, and its slot.
    head_index: u64,
    head_slot: usize,
    /// End of the newest bucket, in milliseconds.
    head_end_ms: u64,
    calls: u32,
    hits: u32,
}

impl Buckets {
    pub(crate) fn new(window: Duration, buckets: u32) -> Self {
        let window_ms = millis(window);
        // Rounded up: the window covers at least the length asked for.
        let bucket_ms = window_ms.div_ceil(buckets as u64).max(1);
        Buckets {
            bucket_ms,
            slots: vec![Slot::default(); buckets as usize],
            head_index: 0,
            head_slot: 0,
            head_end_ms: bucket_ms,
            calls: 0,
            hits: 0,
        }
    }

    /// Moves the window forward to `now_ms`, dropping the buckets that fall
    /// out of it. A time at or before the newest bucket counts in it.
    fn advance(&mut self, now_ms: u64) {
        if now_ms < self.head_end_ms {
            return;
        }
        let index = now_ms / self.bucket_ms;
        let len = self.slots.len();
        let steps = index - self.head_index;
        if steps >= len as u64 {
            self.slots.fill(Slot::default());
            self.calls = 0;
            self.hits = 0;
            self.head_slot = (index % len as u64) as usize;
        } else {
            for _ in 0..steps {
                self.head_slot = (self.head_slot + 1) % len;
                let gone = std::mem::take(&mut self.slots[self.head_slot]);
                self.calls -= gone.calls;
                self.hits -= gone.hits;
            }
        }
        self.head_index = index;
        self.head_end_ms = index.saturating_add(1).saturating_mul(self.bucket_ms);
    }

    pub(crate) fn add(&mut self, hit: bool, now_ms: u64) {
        self.advance(now_ms);
        // Saturate the bucket and the totals together, so they stay equal
        // to the sum of the buckets.
        let slot = &mut self.slots[self.head_slot];
        if slot.calls < u32::MAX && self.calls < u32::MAX {
            slot.calls += 1;
            self.calls += 1;
            if hit {
                slot.hits += 1;
                self.hits += 1;
            }
        }
    }

    /// Adds `count` calls that were not hits at `at_ms`: into the bucket
    /// that time falls in while it is inside the window (dropped once it has
    /// left it), moving the window forward first if `at_ms` is past it.
    pub(crate) fn add_calls(&mut self, count: u32, at_ms: u64) {
        self.advance(at_ms);
        let index = at_ms / self.bucket_ms;
        let len = self.slots.len();
        // `advance` leaves `index <= head_index`: an older time is counted
        // where it belongs, a time in the newest bucket counts in it.
        let back = self.head_index.saturating_sub(index);
        if back >= len as u64 {
            return;
        }
        let slot = &mut self.slots[(self.head_slot + len - back as usize) % len];
        let count = count.min(u32::MAX - slot.calls).min(u32::MAX - self.calls);
        slot.calls += count;
        self.calls += count;
    }

    /// The end of the bucket that `now_ms` falls in: calls made before it
    /// may be counted together, at any time before it.
    pub(crate) fn bucket_end(&self, now_ms: u64) -> u64 {
        (now_ms / self.bucket_ms)
            .saturating_add(1)
            .saturating_mul(self.bucket_ms)
    }

    /// Whether a call that is not a hit could bring these buckets to trip
    /// at `rate` once they hold `min_calls` calls: only while the hits held
    /// would reach the rate over `min_calls` calls (more calls only lower
    /// the share, and time only drops hits). Otherwise such a call only adds
    /// a call, which may be counted later, in the bucket of its time.
    pub(crate) fn call_could_trip(&self, min_calls: u32, rate: f64) -> bool {
        trips(min_calls, self.hits, min_calls, rate)
    }

    /// (calls, hits) over the buckets still inside the window at `now_ms`.
    pub(crate) fn totals(&self, now_ms: u64) -> (u32, u32) {
        if now_ms < self.head_end_ms {
            return (self.calls, self.hits);
        }
        // Read-only view of what `advance` would drop.
        let index = now_ms / self.bucket_ms;
        let len = self.slots.len();
        let steps = index - self.head_index;
        if steps >= len as u64 {
            return (0, 0);
        }
        (1..=steps as usize).fold((self.calls, self.hits), |(c, h), step| {
            let gone = self.slots[(self.head_slot + step) % len];
            (c - gone.calls, h - gone.hits)
        })
    }

    pub(crate) fn reset(&mut self) {
        self.slots.fill(Slot::default());
        self.calls = 0;
        self.hits = 0;
    }
}

/// Failure-rate verdict over a time window.
#[derive(Debug)]
pub(crate) struct FailureRate {
    buckets: Buckets,
    min_calls: u32,
    rate: f64,
}

impl FailureRate {
    pub(crate) fn new(policy: &TimeWindow) -> Self {
        FailureRate {
            buckets: Buckets::new(policy.window, policy.buckets),
            min_calls: policy.min_calls,
            rate: policy.failure_rate,
        }
    }
}

impl Rule for FailureRate {
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        self.buckets.add(sample.failure, now_ms);
        let (calls, failures) = (self.buckets.calls, self.buckets.hits);
        trips(calls, failures, self.min_calls, self.rate).then_some(TripReason::Policy(
            PolicyFigures::TimeWindow(TimeWindowFigures { calls, failures }),
        ))
    }

    /// Whether a success could trip it, and so must be recorded at once.
    fn success_matters(&self) -> bool {
        self.buckets.call_could_trip(self.min_calls, self.rate)
    }

    fn each_buckets(&mut self, f: &mut dyn FnMut(&mut Buckets)) {
        f(&mut self.buckets);
    }

    fn reset(&mut self) {
        self.buckets.reset();
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        let (calls, failures) = self.buckets.totals(now_ms);
        PolicyFigures::TimeWindow(TimeWindowFigures { calls, failures })
    }
}

/// [`TimeWindow`]'s figures: calls and failures inside the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeWindowFigures {
    /// Calls in the window.
    pub calls: u32,
    /// Failures in the window.
    pub failures: u32,
}

impl Figures for TimeWindowFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failures in {} calls within the time window",
            self.failures, self.calls
        )
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("calls", Figure::Count(self.calls.into())),
            ("failures", Figure::Count(self.failures.into())),
        ]
    }
}

/// `hits / calls >= rate`, once `calls >= min_calls`. Divides rather than
/// multiplies: `0.28 * 25.0` rounds up past 7, while `7.0 / 25.0` rounds to
/// the same `f64` as `0.28`, so a rate exactly at the threshold trips.
pub(crate) fn trips(calls: u32, hits: u32, min_calls: u32, rate: f64) -> bool {
    calls >= min_calls && calls > 0 && hits as f64 / calls as f64 >= rate
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten buckets of 100 ms.
    fn buckets() -> Buckets {
        Buckets::new(Duration::from_secs(1), 10)
    }

    #[test]
    fn calls_added_late_count_in_the_bucket_of_their_time() {
        let mut b = buckets();
        // The window now covers 1,000 to 2,000 ms.
        b.add(true, 1_950);
        // Made at 1,120 ms: inside it, in the bucket of 1,100-1,200 ms.
        b.add_calls(5, 1_120);
        assert_eq!(b.totals(1_950), (6, 1));
        // At 2,150 ms the window starts at 1,200 ms: they have left it.
        assert_eq!(b.totals(2_150), (1, 1));
        // Made before the window: not counted at all.
        b.add_calls(3, 950);
        assert_eq!(b.totals(1_999), (6, 1));
    }

    #[test]
    fn calls_added_past_the_newest_bucket_move_the_window() {
        let mut b = buckets();
        b.add(true, 10);
        b.add_calls(4, 1_050);
        assert_eq!(b.totals(1_050), (4, 0), "the failure at 10 ms left");
        assert_eq!(b.bucket_end(1_050), 1_100);
    }
}
