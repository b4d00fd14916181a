//! Any of several policies: trip as soon as one member trips.

use std::fmt;
use std::time::Duration;

use super::time_window::Buckets;
#[cfg(feature = "serde")]
use super::Figure;
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripPolicy, TripReason};
use crate::error::ConfigError;

/// The members of [`TripPolicy::AnyOf`], in order.
impl Policy for Vec<TripPolicy> {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.is_empty() {
            return Err(ConfigError::new(path, "must hold at least one policy"));
        }
        self.iter()
            .enumerate()
            .try_for_each(|(i, p)| p.validate(&format!("{path}[{i}]")))
    }

    fn needs_clock(&self) -> bool {
        self.iter().any(TripPolicy::needs_clock)
    }

    fn needs_latency(&self) -> bool {
        self.iter().any(TripPolicy::needs_latency)
    }

    fn slow_threshold(&self) -> Option<Duration> {
        self.iter().filter_map(TripPolicy::slow_threshold).min()
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(Members(
            self.iter().map(PolicyState::new).collect(),
        )))
    }
}

/// The running state of an any-of: each member's.
#[derive(Debug)]
struct Members(Vec<PolicyState>);

impl Rule for Members {
    /// Every member records the outcome; the first that trips is named.
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        self.0
            .iter_mut()
            .map(|p| p.record(sample, now_ms))
            .fold(None, |first, trip| first.or(trip))
    }

    fn success_matters(&self) -> bool {
        self.0.iter().any(PolicyState::success_matters)
    }

    fn records_every_success(&self) -> bool {
        self.0.iter().any(PolicyState::records_every_success)
    }

    fn each_buckets(&mut self, f: &mut dyn FnMut(&mut Buckets)) {
        self.0.iter_mut().for_each(|member| member.each_buckets(f));
    }

    fn reset(&mut self) {
        self.0.iter_mut().for_each(PolicyState::reset);
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        PolicyFigures::AnyOf(self.0.iter().map(|p| p.figures(now_ms)).collect())
    }
}

/// The figures of [`PolicyFigures::AnyOf`]'s members, in order. (A member
/// that trips is named by its own figures.)
impl Figures for Vec<PolicyFigures> {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, member) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            member.shown().tripped(f)?;
        }
        Ok(())
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![("members", Figure::Members(self))]
    }
}
