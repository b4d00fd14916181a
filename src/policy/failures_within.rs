//! Failures within a period: trip when `failures` failures fall within
//! `period` of each other, whatever the successes between them.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;
use crate::millis::millis;

/// The most failures it may require; bounds the memory it keeps (8 bytes
/// per failure).
const MAX_FAILURES: u32 = 100_000;

/// Trips when `failures` failures happen within `period`, counted from the
/// oldest of them to the newest; successes neither count nor reset it. The
/// rule of nginx's `max_fails` and `fail_timeout`.
///
/// A success never matters to it, so under this policy a success writes
/// nothing and reads no clock, as under the default policy while it holds
/// no failure; a failure reads the clock, as under every policy. Choose it
/// when a dependency that fails a few times in quick succession is down
/// however many calls succeed between the failures (a host that drops
/// one connection in ten under load): [`ConsecutiveFailures`] would never
/// trip on it, and a rate needs steady traffic to mean something.
///
/// [`ConsecutiveFailures`]: super::ConsecutiveFailures
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::FailuresWithin, Config};
///
/// // Three failures within ten seconds open the breaker.
/// let config = Config::builder()
///     .trip(FailuresWithin::new(3, Duration::from_secs(10)))
///     .build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailuresWithin {
    failures: u32,
    period: Duration,
}

impl FailuresWithin {
    /// Trip when `failures` failures (at least 1) happen within `period`
    /// (longer than zero, and at least a millisecond).
    pub fn new(failures: u32, period: Duration) -> Self {
        FailuresWithin { failures, period }
    }

    /// The number of failures that trips the breaker.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The period they must fall within.
    pub fn period(&self) -> Duration {
        self.period
    }
}

#[cfg(feature = "serde")]
impl FromFile for FailuresWithin {
    const FIELDS: &'static [&'static str] = &["failures", "period"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let failures = required(written, "failures", |w, f| w.count(f))?;
        let period = required(written, "period", |w, f| w.duration(f))?;
        Ok(FailuresWithin::new(failures, period))
    }
}

impl Policy for FailuresWithin {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.failures == 0 || self.failures > MAX_FAILURES {
            return Err(ConfigError::new(
                format!("{path}.failures"),
                format!("must be between 1 and {MAX_FAILURES}"),
            ));
        }
        if self.period < Duration::from_millis(1) {
            return Err(ConfigError::new(
                format!("{path}.period"),
                "must be at least one millisecond",
            ));
        }
        Ok(())
    }

    fn needs_clock(&self) -> bool {
        false
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(Latest {
            failures: self.failures,
            period: self.period,
            period_ms: millis(self.period),
            at_ms: VecDeque::new(),
        }))
    }
}

/// The times of the latest failures, at most `failures` of them.
#[derive(Debug)]
struct Latest {
    failures: u32,
    period: Duration,
    period_ms: u64,
    at_ms: VecDeque<u64>,
}

impl Latest {
    /// The failures held that are still within the period of `now_ms`.
    fn within(&self, now_ms: u64) -> u32 {
        let fresh = |at: &&u64| now_ms.saturating_sub(**at) < self.period_ms;
        self.at_ms.iter().filter(fresh).count() as u32
    }
}

impl Rule for Latest {
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        if !sample.failure {
            return None;
        }
        if self.at_ms.len() == self.failures as usize {
            self.at_ms.pop_front();
        }
        self.at_ms.push_back(now_ms);
        let within = self.within(now_ms);
        (within >= self.failures).then(|| TripReason::Policy(self.figures_with(within)))
    }

    /// A success neither counts nor resets: it never needs recording.
    fn success_matters(&self) -> bool {
        false
    }

    fn reset(&mut self) {
        self.at_ms.clear();
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        self.figures_with(self.within(now_ms))
    }
}

impl Latest {
    /// Its figures, `failures` of them within the period.
    fn figures_with(&self, failures: u32) -> PolicyFigures {
        PolicyFigures::FailuresWithin(FailuresWithinFigures {
            failures,
            threshold: self.failures,
            period: self.period,
        })
    }
}

/// [`FailuresWithin`]'s figures: failures within the period now, the
/// failures that trip, and the period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailuresWithinFigures {
    /// Failures within the period.
    pub failures: u32,
    /// Failures that trip.
    pub threshold: u32,
    /// The period.
    pub period: Duration,
}

impl Figures for FailuresWithinFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failures within {:?}", self.failures, self.period)
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("failures", Figure::Count(self.failures.into())),
            ("threshold", Figure::Count(self.threshold.into())),
            ("period_ms", Figure::Duration(self.period)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(failure: bool) -> Sample {
        Sample {
            failure,
            class: None,
            elapsed: None,
        }
    }

    fn recent(failures: u32, period_ms: u64) -> PolicyState {
        FailuresWithin::new(failures, Duration::from_millis(period_ms)).start()
    }

    #[test]
    fn trips_on_the_kth_failure_within_the_period_whatever_the_successes() {
        let mut p = recent(3, 1_000);
        assert_eq!(p.record(sample(true), 0), None);
        for _ in 0..1_000 {
            assert_eq!(p.record(sample(false), 100), None);
        }
        assert_eq!(p.record(sample(true), 500), None);
        assert_eq!(
            p.record(sample(true), 999),
            Some(TripReason::Policy(PolicyFigures::FailuresWithin(
                FailuresWithinFigures {
                    failures: 3,
                    threshold: 3,
                    period: Duration::from_secs(1),
                }
            )))
        );
    }

    #[test]
    fn failures_spread_wider_than_the_period_never_trip() {
        let mut p = recent(3, 1_000);
        for i in 0..100 {
            assert_eq!(p.record(sample(true), i * 500), None, "failure {i}");
        }
        assert_eq!(
            p.figures(99 * 500),
            PolicyFigures::FailuresWithin(FailuresWithinFigures {
                failures: 2,
                threshold: 3,
                period: Duration::from_secs(1),
            })
        );
    }

    #[test]
    fn a_reset_forgets_the_failures_held() {
        let mut p = recent(2, 1_000);
        assert_eq!(p.record(sample(true), 0), None);
        p.reset();
        assert_eq!(p.record(sample(true), 1), None);
        assert!(p.record(sample(true), 2).is_some());
    }

    #[test]
    fn no_success_is_ever_recorded() {
        let mut p = recent(1, 1_000);
        assert!(!p.success_matters());
        assert!(!p.records_every_success());
        assert_eq!(p.tally_end(0), None, "successes are skipped, not tallied");
        assert!(p.record(sample(true), 0).is_some());
        assert!(!p.success_matters());
    }

    #[test]
    fn settings_out_of_range_are_refused_naming_the_field() {
        let err = |p: FailuresWithin| p.validate("trip.failures_within").unwrap_err();
        assert!(err(FailuresWithin::new(0, Duration::from_secs(1)))
            .to_string()
            .contains("trip.failures_within.failures"));
        assert!(err(FailuresWithin::new(
            MAX_FAILURES + 1,
            Duration::from_secs(1)
        ))
        .to_string()
        .contains("trip.failures_within.failures"));
        assert!(err(FailuresWithin::new(3, Duration::from_micros(999)))
            .to_string()
            .contains("trip.failures_within.period"));
        assert!(FailuresWithin::new(3, Duration::from_millis(1))
            .validate("trip.failures_within")
            .is_ok());
    }
}
