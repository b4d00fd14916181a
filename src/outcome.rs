//! What a call said about its dependency's health: an [`Outcome`], and a
//! [`Verdict`] that may carry a retry-after the dependency announced.
//!
//! Classifiers ([`crate::classify`]) make verdicts; the breaker records
//! them. Both name these types, which name nothing else.

use std::time::Duration;

/// How one call counts toward the breaker's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The dependency worked.
    Success,
    /// The dependency failed in a way that may pass: a timeout, a refused
    /// connection, a 5xx, a 429.
    Failure,
    /// The call says nothing about the dependency's health (a 400, a 401):
    /// it counts neither way and returns its probe permit.
    Ignore,
}

/// An [`Outcome`] and an optional retry-after hint read from the response.
///
/// A hint on a failure keeps the breaker open at least that long when it
/// opens (capped by [`Config::max_open`](crate::Config::max_open)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    outcome: Outcome,
    retry_after: Option<Duration>,
}

impl Verdict {
    /// A verdict without a hint.
    pub const fn new(outcome: Outcome) -> Self {
        Verdict {
            outcome,
            retry_after: None,
        }
    }

    /// Adds a retry-after hint.
    pub const fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// The outcome.
    pub const fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The hint, if the upstream gave one.
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl From<Outcome> for Verdict {
    fn from(outcome: Outcome) -> Self {
        Verdict::new(outcome)
    }
}
