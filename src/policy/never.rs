//! Never: count nothing, trip on nothing; the breaker opens only when
//! something other than its count says so.

use std::fmt;

#[cfg(feature = "serde")]
use super::{Figure, FromFile, Written};
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripReason};
use crate::error::ConfigError;

/// Never trips on the calls' outcomes: the breaker opens only when
/// something else says so: the upstream's own pushback (a failing status,
/// such as a `429`, with a retry-after, under
/// [`trip_on_pushback`](crate::ConfigBuilder::trip_on_pushback)), a
/// [signal](crate::Breaker::open_on_signal), an operator, or the fleet.
/// Once open, it probes and closes as any breaker does. Failures are still
/// counted ([`Counts::failures`](crate::Counts::failures)).
///
/// Choose it for a breaker that answers for a quota rather than for
/// health: a provider's key whose rate limit the upstream announces, while
/// its failures are judged elsewhere (the model's breaker, a failover). An
/// announced wait sets the open period but never shortens it below the
/// first one (`cooldown`): give such a breaker a short `cooldown`, so that
/// the upstream's reset decides. A success under it reads no clock and
/// writes nothing shared.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::Never, Config};
///
/// // Open for as long as the upstream asks, and for nothing else.
/// let config = Config::builder()
///     .trip(Never)
///     .trip_on_pushback(true)
///     .cooldown(Duration::from_secs(1))
///     .build()?;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Never;

#[cfg(feature = "serde")]
impl FromFile for Never {
    const FIELDS: &'static [&'static str] = &[];

    fn from_file(_: &dyn Written) -> Result<Self, ConfigError> {
        Ok(Never)
    }
}

impl Policy for Never {
    fn validate(&self, _: &str) -> Result<(), ConfigError> {
        Ok(())
    }

    fn needs_clock(&self) -> bool {
        false
    }

    fn start(&self) -> PolicyState {
        // Holds nothing: the box allocates nothing.
        PolicyState::Rule(Box::new(Nothing))
    }
}

/// The running state of [`Never`]: none.
#[derive(Debug)]
struct Nothing;

impl Rule for Nothing {
    fn record(&mut self, _: Sample, _: u64) -> Option<TripReason> {
        None
    }

    fn success_matters(&self) -> bool {
        false
    }

    fn reset(&mut self) {}

    fn figures(&self, _: u64) -> PolicyFigures {
        PolicyFigures::Never(NeverFigures)
    }
}

/// [`Never`]'s figures: it counts nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeverFigures;

impl Figures for NeverFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nothing counted (this policy never trips)")
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_outcome_ever_trips_it_or_needs_recording() {
        let mut state = Never.start();
        for i in 0..10_000u64 {
            let sample = Sample {
                failure: i % 7 != 0,
                class: None,
                elapsed: None,
            };
            assert_eq!(state.record(sample, i), None, "outcome {i}");
        }
        assert!(!state.success_matters());
        assert!(!state.records_every_success());
        assert_eq!(state.tally_end(0), None, "successes are skipped, not tallied");
        assert_eq!(state.figures(0), PolicyFigures::Never(NeverFigures));
        assert!(!Never.needs_clock() && !Never.needs_latency());
        assert!(Never.validate("trip.never").is_ok());
    }
}
