//! Time window: trip on the failure rate over the last stretch of time.

use std::time::Duration;

use super::{Sample, TripReason};
use crate::error::ConfigError;

/// The most buckets a time window may have.
pub(crate) const MAX_BUCKETS: u32 = 10_000;

/// Trips when, over the last `window` of time, at least `min_calls` calls
/// were recorded and the share of failures is at least `failure_rate`
/// (`>=`, so a rate of 1.0 means "every call failed").
///
/// The window is split into `buckets` (default 10) that age out one at a
/// time. Defaults: 10 buckets, at least 10 calls, rate 0.5. Every outcome is
/// recorded and reads the clock: choose it when traffic is steady enough for
/// a rate to mean something.
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
            buckets: 10,
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

    pub(crate) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        validate_time(path, "window", self.window, self.buckets)?;
        validate_min_calls(path, self.min_calls)?;
        validate_rate(path, "failure_rate", self.failure_rate)
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

#[derive(Clone, Copy, Debug)]
struct Slot {
    index: u64,
    calls: u32,
    hits: u32,
}

const EMPTY: Slot = Slot {
    index: u64::MAX,
    calls: 0,
    hits: 0,
};

/// Calls and "hits" (failures, or slow calls) per bucket of time.
#[derive(Debug)]
pub(crate) struct Buckets {
    bucket_ms: u64,
    slots: Vec<Slot>,
}

impl Buckets {
    pub(crate) fn new(window: Duration, buckets: u32) -> Self {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        Buckets {
            bucket_ms: (window_ms / buckets as u64).max(1),
            slots: vec![EMPTY; buckets as usize],
        }
    }

    pub(crate) fn add(&mut self, hit: bool, now_ms: u64) {
        let index = now_ms / self.bucket_ms;
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(index % len) as usize];
        if slot.index != index {
            *slot = Slot {
                index,
                calls: 0,
                hits: 0,
            };
        }
        slot.calls = slot.calls.saturating_add(1);
        slot.hits = slot.hits.saturating_add(hit as u32);
    }

    /// (calls, hits) over the buckets still inside the window at `now_ms`.
    pub(crate) fn totals(&self, now_ms: u64) -> (u32, u32) {
        let current = now_ms / self.bucket_ms;
        let len = self.slots.len() as u64;
        self.slots
            .iter()
            .filter(|s| s.index != u64::MAX && s.index <= current && s.index + len > current)
            .fold((0u32, 0u32), |(c, h), s| {
                (c.saturating_add(s.calls), h.saturating_add(s.hits))
            })
    }

    pub(crate) fn reset(&mut self) {
        self.slots.fill(EMPTY);
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

    pub(crate) fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        self.buckets.add(sample.failure, now_ms);
        let (calls, failures) = self.buckets.totals(now_ms);
        trips(calls, failures, self.min_calls, self.rate)
            .then_some(TripReason::FailureRate { failures, calls })
    }

    pub(crate) fn totals(&self, now_ms: u64) -> (u32, u32) {
        self.buckets.totals(now_ms)
    }

    pub(crate) fn reset(&mut self) {
        self.buckets.reset();
    }
}

/// `hits / calls >= rate`, once `calls >= min_calls`. Divides rather than
/// multiplies: `0.28 * 25.0` rounds up past 7, while `7.0 / 25.0` rounds to
/// the same `f64` as `0.28`, so a rate exactly at the threshold trips.
pub(crate) fn trips(calls: u32, hits: u32, min_calls: u32, rate: f64) -> bool {
    calls >= min_calls && calls > 0 && hits as f64 / calls as f64 >= rate
}
