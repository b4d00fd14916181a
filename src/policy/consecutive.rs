//! Consecutive failures: trip after `threshold` failures in a row.

use std::fmt;

#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;

/// Trips after `threshold` failures in a row; any success starts the count
/// again. The default policy (threshold 5).
///
/// Cheapest of the policies: a success only writes when it has a run of failures to
/// reset, and never reads the clock. It never catches a dependency that
/// fails a steady fraction of calls (40% failures rarely line up five in a
/// row); choose a window policy for that.
///
/// ```
/// use tower_circuit_breaker::{policy::ConsecutiveFailures, Config};
///
/// let config = Config::builder().trip(ConsecutiveFailures::new(3)).build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsecutiveFailures {
    threshold: u32,
}

impl ConsecutiveFailures {
    /// Trip after `threshold` failures in a row (at least 1).
    pub fn new(threshold: u32) -> Self {
        ConsecutiveFailures { threshold }
    }

    /// The number of failures in a row that trips the breaker.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }
}

#[cfg(feature = "serde")]
impl FromFile for ConsecutiveFailures {
    const FIELDS: &'static [&'static str] = &["threshold"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        Ok(ConsecutiveFailures::new(required(written, "threshold", |w, f| w.count(f))?))
    }
}

impl Policy for ConsecutiveFailures {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.threshold == 0 {
            return Err(ConfigError::new(
                format!("{path}.threshold"),
                "must be at least 1",
            ));
        }
        Ok(())
    }

    fn needs_clock(&self) -> bool {
        false
    }

    fn start(&self) -> PolicyState {
        PolicyState::InARow(InARow::new(self))
    }
}

impl Default for ConsecutiveFailures {
    fn default() -> Self {
        ConsecutiveFailures::new(5)
    }
}

#[derive(Debug)]
pub(crate) struct InARow {
    threshold: u32,
    failures: u32,
}

impl InARow {
    pub(crate) fn new(policy: &ConsecutiveFailures) -> Self {
        InARow {
            threshold: policy.threshold,
            failures: 0,
        }
    }
}

impl Rule for InARow {
    fn record(&mut self, sample: Sample, _now_ms: u64) -> Option<TripReason> {
        if !sample.failure {
            self.failures = 0;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        (self.failures >= self.threshold).then(|| TripReason::Policy(self.figures(0)))
    }

    fn success_matters(&self) -> bool {
        self.failures > 0
    }

    fn reset(&mut self) {
        self.failures = 0;
    }

    fn figures(&self, _now_ms: u64) -> PolicyFigures {
        PolicyFigures::ConsecutiveFailures(ConsecutiveFailuresFigures {
            failures: self.failures,
            threshold: self.threshold,
        })
    }
}

/// [`ConsecutiveFailures`]'s figures: failures in a row so far, and the
/// threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsecutiveFailuresFigures {
    /// Failures in a row.
    pub failures: u32,
    /// Threshold that trips.
    pub threshold: u32,
}

impl Figures for ConsecutiveFailuresFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} consecutive failures", self.failures)
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("failures", Figure::Count(self.failures.into())),
            ("threshold", Figure::Count(self.threshold.into())),
        ]
    }
}
