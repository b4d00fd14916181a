//! Thresholds per failure class: a policy for each class a user names, and
//! one for every other failure.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "serde")]
use super::{required, Figure, FromFile, Written};
use super::time_window::Buckets;
use super::{Figures, Policy, PolicyFigures, PolicyState, Rule, Sample, TripPolicy, TripReason};
use crate::error::ConfigError;
use crate::outcome::FailureClass;

/// Counts failures of each named [`FailureClass`] apart, each class under a
/// policy of its own, and every other failure (of a class not named, or of
/// none) under the rest's: open after 3 timeouts, say, but only after 20
/// rate limits.
///
/// Each member sees every success and the failures of its own class, as if
/// the other failures had not happened: a rate limit neither counts toward
/// the timeouts' streak nor breaks it. The breaker opens when any member
/// trips; the reason names the class
/// ([`TripReason::PerClass`]). Classes come from the classifier
/// ([`Verdict::with_class`](crate::classify::Verdict::with_class); the
/// shipped ones say, see [`FailureClass`]).
///
/// ```
/// use tower_circuit_breaker::classify::FailureClass;
/// use tower_circuit_breaker::policy::{ConsecutiveFailures, PerClass};
/// use tower_circuit_breaker::Config;
///
/// let config = Config::builder()
///     .trip(
///         PerClass::new(ConsecutiveFailures::new(5))
///             .class(FailureClass::Timeout, ConsecutiveFailures::new(3))
///             .class(FailureClass::RateLimited, ConsecutiveFailures::new(20)),
///     )
///     .build()?;
/// # let _ = config;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PerClass {
    rest: Box<TripPolicy>,
    classes: Vec<(FailureClass, TripPolicy)>,
}

impl PerClass {
    /// Every failure under `rest`, until classes are named.
    pub fn new(rest: impl Into<TripPolicy>) -> Self {
        PerClass {
            rest: Box::new(rest.into()),
            classes: Vec::new(),
        }
    }

    /// Counts the failures of `class` under `policy` of their own. A class
    /// named twice is a config error.
    pub fn class(mut self, class: FailureClass, policy: impl Into<TripPolicy>) -> Self {
        self.classes.push((class, policy.into()));
        self
    }

    /// The policy of every failure of a class not named.
    pub fn rest(&self) -> &TripPolicy {
        &self.rest
    }

    /// The classes named, with their policies, in order.
    pub fn classes(&self) -> &[(FailureClass, TripPolicy)] {
        &self.classes
    }

    /// Every member: the rest first.
    fn members(&self) -> impl Iterator<Item = &TripPolicy> {
        std::iter::once(&*self.rest).chain(self.classes.iter().map(|(_, p)| p))
    }
}

#[cfg(feature = "serde")]
impl FromFile for PerClass {
    const FIELDS: &'static [&'static str] = &["rest", "classes"];

    fn from_file(written: &dyn Written) -> Result<Self, ConfigError> {
        let mut policy = PerClass::new(required(written, "rest", |w, f| w.policy(f))?);
        for (name, member) in written.policies("classes")? {
            let class = FailureClass::from_name(&name).ok_or_else(|| {
                let known: Vec<&str> = FailureClass::ALL.iter().map(|c| c.name()).collect();
                ConfigError::new(
                    written.path(&format!("classes.{name}")),
                    format!("is no failure class ({})", known.join(", ")),
                )
            })?;
            policy = policy.class(class, member);
        }
        Ok(policy)
    }
}

impl Policy for PerClass {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        self.rest.validate(&format!("{path}.rest"))?;
        for (i, (class, policy)) in self.classes.iter().enumerate() {
            if self.classes[..i].iter().any(|(c, _)| c == class) {
                return Err(ConfigError::new(
                    format!("{path}.classes.{class}"),
                    "names a class named before",
                ));
            }
            policy.validate(&format!("{path}.classes.{class}"))?;
        }
        Ok(())
    }

    fn needs_clock(&self) -> bool {
        self.members().any(TripPolicy::needs_clock)
    }

    fn needs_latency(&self) -> bool {
        self.members().any(TripPolicy::needs_latency)
    }

    fn slow_threshold(&self) -> Option<Duration> {
        self.members().filter_map(TripPolicy::slow_threshold).min()
    }

    fn start(&self) -> PolicyState {
        PolicyState::Rule(Box::new(Split::new(self)))
    }
}

/// The running state of a [`PerClass`]: the rest's, then each class's.
#[derive(Debug)]
pub(crate) struct Split {
    rest: PolicyState,
    classes: Vec<(FailureClass, PolicyState)>,
}

impl Split {
    pub(crate) fn new(policy: &PerClass) -> Self {
        Split {
            rest: PolicyState::new(&policy.rest),
            classes: policy
                .classes
                .iter()
                .map(|(class, p)| (*class, PolicyState::new(p)))
                .collect(),
        }
    }

    fn members(&self) -> impl Iterator<Item = &PolicyState> {
        std::iter::once(&self.rest).chain(self.classes.iter().map(|(_, p)| p))
    }

    fn members_mut(&mut self) -> impl Iterator<Item = &mut PolicyState> {
        std::iter::once(&mut self.rest).chain(self.classes.iter_mut().map(|(_, p)| p))
    }
}

impl Rule for Split {
    /// A failure goes to its class's member (or the rest's); a success to
    /// every member. The first that trips is named.
    fn record(&mut self, sample: Sample, now_ms: u64) -> Option<TripReason> {
        if sample.failure {
            let named = sample
                .class
                .and_then(|class| self.classes.iter_mut().find(|(c, _)| *c == class));
            return match named {
                Some((class, member)) => {
                    member
                        .record(sample, now_ms)
                        .map(|reason| TripReason::PerClass {
                            class: *class,
                            reason: Box::new(reason),
                        })
                }
                None => self.rest.record(sample, now_ms),
            };
        }
        let mut first = self.rest.record(sample, now_ms);
        for (class, member) in &mut self.classes {
            let trip = member.record(sample, now_ms);
            if first.is_none() {
                first = trip.map(|reason| TripReason::PerClass {
                    class: *class,
                    reason: Box::new(reason),
                });
            }
        }
        first
    }

    fn success_matters(&self) -> bool {
        self.members().any(PolicyState::success_matters)
    }

    fn records_every_success(&self) -> bool {
        self.members().any(PolicyState::records_every_success)
    }

    fn each_buckets(&mut self, f: &mut dyn FnMut(&mut Buckets)) {
        self.members_mut().for_each(|member| member.each_buckets(f));
    }

    fn reset(&mut self) {
        self.members_mut().for_each(PolicyState::reset);
    }

    fn figures(&self, now_ms: u64) -> PolicyFigures {
        PolicyFigures::PerClass(PerClassFigures {
            rest: Box::new(self.rest.figures(now_ms)),
            classes: self
                .classes
                .iter()
                .map(|(class, p)| (*class, p.figures(now_ms)))
                .collect(),
        })
    }
}

/// [`PerClass`]'s figures: its rest's, and each class's. (A member that
/// trips is named by [`TripReason::PerClass`], with its own figures.)
#[derive(Clone, Debug, PartialEq)]
pub struct PerClassFigures {
    /// The policy of the failures of classes not named.
    pub rest: Box<PolicyFigures>,
    /// Each class named, with its policy's figures.
    pub classes: Vec<(FailureClass, PolicyFigures)>,
}

impl Figures for PerClassFigures {
    fn tripped(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rest.shown().tripped(f)?;
        for (class, figures) in &self.classes {
            f.write_str("; ")?;
            figures.shown().tripped(f)?;
            write!(f, " of class {class}")?;
        }
        Ok(())
    }

    #[cfg(feature = "serde")]
    fn fields(&self) -> Vec<(&'static str, Figure<'_>)> {
        vec![
            ("rest", Figure::Figures(Some(&self.rest))),
            ("classes", Figure::Classes(&self.classes)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ConsecutiveFailures;

    fn failure(class: Option<FailureClass>) -> Sample {
        Sample {
            failure: true,
            class,
            elapsed: None,
        }
    }

    const SUCCESS: Sample = Sample {
        failure: false,
        class: None,
        elapsed: None,
    };

    fn in_a_row(failures: u32, threshold: u32) -> TripReason {
        TripReason::Policy(PolicyFigures::ConsecutiveFailures(
            crate::policy::ConsecutiveFailuresFigures {
                failures,
                threshold,
            },
        ))
    }

    fn split() -> Split {
        Split::new(
            &PerClass::new(ConsecutiveFailures::new(5))
                .class(FailureClass::Timeout, ConsecutiveFailures::new(3))
                .class(FailureClass::RateLimited, ConsecutiveFailures::new(20)),
        )
    }

    #[test]
    fn three_timeouts_trip_whatever_rate_limits_come_between() {
        let mut split = split();
        for _ in 0..2 {
            assert_eq!(split.record(failure(Some(FailureClass::Timeout)), 0), None);
            for _ in 0..9 {
                assert_eq!(
                    split.record(failure(Some(FailureClass::RateLimited)), 0),
                    None
                );
            }
        }
        assert_eq!(
            split.record(failure(Some(FailureClass::Timeout)), 0),
            Some(TripReason::PerClass {
                class: FailureClass::Timeout,
                reason: Box::new(in_a_row(3, 3)),
            })
        );
    }

    #[test]
    fn a_success_resets_every_member() {
        let mut split = split();
        for _ in 0..19 {
            split.record(failure(Some(FailureClass::RateLimited)), 0);
        }
        split.record(failure(Some(FailureClass::Timeout)), 0);
        split.record(SUCCESS, 0);
        assert_eq!(
            split.record(failure(Some(FailureClass::RateLimited)), 0),
            None
        );
        assert_eq!(split.record(failure(Some(FailureClass::Timeout)), 0), None);
    }

    #[test]
    fn failures_of_no_named_class_go_to_the_rest() {
        let mut split = split();
        for class in [
            None,
            Some(FailureClass::ServerError),
            None,
            Some(FailureClass::Overloaded),
        ] {
            assert_eq!(split.record(failure(class), 0), None);
        }
        assert_eq!(
            split.record(failure(Some(FailureClass::Stream)), 0),
            Some(in_a_row(5, 5))
        );
    }

    #[test]
    fn a_class_named_twice_is_a_config_error() {
        let policy = PerClass::new(ConsecutiveFailures::new(5))
            .class(FailureClass::Timeout, ConsecutiveFailures::new(3))
            .class(FailureClass::Timeout, ConsecutiveFailures::new(4));
        let err = policy.validate("trip").unwrap_err();
        assert_eq!(err.field(), "trip.classes.timeout");
        let bad = PerClass::new(ConsecutiveFailures::new(5))
            .class(FailureClass::Timeout, ConsecutiveFailures::new(0));
        assert!(bad.validate("trip").is_err());
    }
}
