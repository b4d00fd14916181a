//! Slow calls: trip on the share of calls slower than a threshold.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "serde")]
use super::time_window::DEFAULT_BUCKETS;
#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::time_window::{trips, validate_min_calls, validate_rate, validate_time, Buckets};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;

/// The largest count window a slow-call policy may keep (one byte per call).
pub(crate) const MAX_CALLS: u32 = 1_000_000;

/// Which outcomes a rate is computed over.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Window {
    /// The last `n` recorded calls.
    Calls(u32),
    /// The last stretch of time, split into buckets that age out one by one.
    Time {
        /// Length of the window.
        length: Duration,
        /// Number of buckets.
        buckets: u32,
    },
}

/// Trips when the share of calls slower than `slower_than` reaches `rate`
/// over a window of calls or of time, once `min_calls` calls were recorded.
///
/// A call counts as slow whatever its outcome (a slow success is still a
/// sign of a struggling dependency); ignored outcomes count neither way.
/// Measuring latency reads the clock twice per call. Defaults: rate 0.5 over
/// the last 100 calls, at least 10 calls.
///
/// Slow calls and failures are recorded under the breaker's lock. A fast
/// success takes no lock once a window of calls is full of fast calls (it
/// would change nothing), and over time while it cannot trip the policy
/// (it is then tallied, as a [`TimeWindow`](super::TimeWindow)'s are).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::SlowCalls, Config};
///
/// let config = Config::builder()
///     .trip(SlowCalls::new(Duration::from_secs(10)).rate(0.8).over_calls(50))
///     .build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SlowCalls {
    slower_than: Duration,
    rate: f64,
    window: Window,
    min_calls: u32,
}

impl SlowCalls {
    /// Calls slower than `slower_than` count as slow.
    pub fn new(slower_than: Duration) -> Self {
        SlowCalls {
            slower_than,
            rate: 0.5,
            window: Window::Calls(100),
            min_calls: 10,
        }
    }

    /// Slow share, in (0, 1], at or above which the breaker trips.
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// Judge over the last `calls` calls.
    pub fn over_calls(mut self, calls: u32) -> Self {
        self.window = Window::Calls(calls);
        self
    }

    /// Judge over the last `length` of time, split into `buckets`.
    pub fn over_time(mut self, length: Duration, buckets: u32) -> Self {
        self.window = Window::Time { length, buckets };
        self
    }

    /// Calls the window must hold before it judges.
    pub fn min_calls(mut self, calls: u32) -> Self {
        self.min_calls = calls;
        self
    }

    /// The latency above which a call is slow.
    pub fn threshold(&self) -> Duration {
        self.slower_than
    }
}

#[cfg(feature = "serde")]
impl FromFile for SlowCalls {
    const FIELDS: &'static [&'static str] =
        &["slower_than", "rate", "over_calls", "over_time", "min_calls"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let mut policy = SlowCalls::new(required(written, "slower_than", |w, f| w.duration(f))?);
        if let Some(rate) = written.number("rate")? {
            policy = policy.rate(rate);
        }
        if written.has("over_calls") && written.has("over_time") {
            return Err(ConfigError::new(
                written.path("over_time"),
                "conflicts with `over_calls`: give one window",
            ));
        }
        if let Some(calls) = written.count("over_calls")? {
            policy = policy.over_calls(calls);
        }
        if let Some(time) = written.table("over_time", &["length", "buckets"])? {
            let length = required(&*time, "length", |w, f| w.duration(f))?;
            // As many buckets as a time window's when the file gives none.
            let buckets = time.count("buckets")?.unwrap_or(DEFAULT_BUCKETS);
            policy = policy.over_time(length, buckets);
        }
        if let Some(min_calls) = written.count("min_calls")? {
            policy = policy.min_calls(min_calls);
        }
        Ok(policy)
    }
}

impl Policy for SlowCalls {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.slower_than.is_zero() {
            return Err(ConfigError::new(
                format!("{path}.slower_than"),
                "must be longer than zero",
            ));
        }
        validate_rate(path, "rate", self.rate)?;
        validate_min_calls(path, self.min_calls)?;
        match self.window {
            Window::Calls(n) => {
                if n == 0 || n > MAX_CALLS {
                    return Err(ConfigError::new(
                        format!("{path}.window.calls"),
                        format!("must be between 1 and {MAX_CALLS}"),
                    ));
                }
                if self.min_calls > n {
                    return Err(ConfigError::new(
                        format!("{path}.min_calls"),
                        format!("must be at most the window ({n} calls)"),
                    ));
                }
                Ok(())
            }
            Window::Time { length, buckets } => {
                validate_time(&format!("{path}.window"), "length", length, buckets)
            }
        }
    }

    fn needs_clock(&self) -> bool {
        true
    }

    fn needs_latency(&self) -> bool {
        true
    }

    fn slow_threshold(&self) -> Option<Duration> {
        Some(self.slower_than)
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(SlowRate::new(self)))
    }
}

/// The last `n` calls as a ring of slow/not-slow flags.
#[derive(Debug)]
struct CallRing {
    slow: Vec<bool>,
    next: usize,
    filled: u32,
    hits: u32,
}

impl CallRing {
    fn add(&mut self, hit: bool) {
        let len = self.slow.len();
        if self.filled as usize == len {
            self.hits -= self.slow[self.next] as u32;
        } else {
            self.filled += 1;
        }
        self.slow[self.next] = hit;
        self.hits += hit as u32;
        self.next = (self.next + 1) % len;
    }
}

#[derive(Debug)]
enum Counter {
    Calls(CallRing),
    Time(Buckets),
}

/// Slow-call-rate verdict.
#[derive(Debug)]
pub(crate) struct SlowRate {
    slower_than: Duration,
    rate: f64,
    min_calls: u32,
    counter: Counter,
}

impl SlowRate {
    pub(crate) fn new(policy: &SlowCalls) -> Self {
        let counter = match policy.window {
            Window::Calls(n) => Counter::Calls(CallRing {
                slow: vec![false; n as usize],
                next: 0,
                filled: 0,
                hits: 0,
            }),
            Window::Time { length, buckets } => Counter::Time(Buckets::new(length, buckets)),
        };
        SlowRate {
            slower_than: policy.slower_than,
            rate: policy.rate,
            min_calls: policy.min_calls,
            counter,
        }
    }

    fn totals(&self, now_ms: u64) -> (u32, u32) {
        match &self.counter {
            Counter::Calls(ring) => (ring.filled, ring.hits),
            Counter::Time(buckets) => buckets.totals(now_ms),
        }
    }
}

impl Rule for SlowRate {
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        let slow = sample.elapsed.is_some_and(|e| e > self.slower_than);
        match &mut self.counter {
            Counter::Calls(ring) => ring.add(slow),
            Counter::Time(buckets) => buckets.add(slow, now_ms),
        }
        let (calls, slow) = self.totals(now_ms);
        trips(calls, slow, self.min_calls, self.rate).then_some(TripReason::Policy(
            PolicyFigures::SlowCalls(SlowCallsFigures { calls, slow }),
        ))
    }

    /// Whether a call no slower than the threshold must be recorded at
    /// once. Over calls: while the ring is filling or holds a slow call (a
    /// fast one then moves the window). Over time: only while it could
    /// trip, as for [`TimeWindow`](super::TimeWindow).
    fn success_matters(&self) -> bool {
        match &self.counter {
            Counter::Calls(ring) => ring.hits > 0 || (ring.filled as usize) < ring.slow.len(),
            Counter::Time(buckets) => buckets.call_could_trip(self.min_calls, self.rate),
        }
    }

    fn each_buckets(&mut self, f: &mut dyn FnMut(&mut Buckets)) {
        if let Counter::Time(buckets) = &mut self.counter {
            f(buckets);
        }
    }

    fn reset(&mut self) {
        match &mut self.counter {
            Counter::Calls(ring) => {
                ring.slow.fill(false);
                ring.next = 0;
                ring.filled = 0;
                ring.hits = 0;
            }
            Counter::Time(buckets) => buckets.reset(),
        }
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        let (calls, slow) = self.totals(now_ms);
        PolicyFigures::SlowCalls(SlowCallsFigures { calls, slow })
    }
}

/// [`SlowCalls`]'s figures: calls and slow calls inside the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowCallsFigures {
    /// Calls in the window.
    pub calls: u32,
    /// Slow calls in the window.
    pub slow: u32,
}

impl Figures for SlowCallsFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} slow calls in {} calls", self.slow, self.calls)
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("calls", Figure::Count(self.calls.into())),
            ("slow", Figure::Count(self.slow.into())),
        ]
    }
}
