//! What a call said about its dependency's health: an [`Outcome`], and a
//! [`Verdict`] that may carry a retry-after the dependency announced.
//!
//! Classifiers ([`crate::classify`]) make verdicts; the breaker records
//! them. Both name these types, which name nothing else.
//!
//! A failure may say what kind it was ([`FailureClass`]): a trip policy
//! can then count kinds apart (open after 3 timeouts, only after 20 rate
//! limits; see `policy::PerClass`).

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

/// What kind of failure a call was, as its classifier tells it.
///
/// The shipped classifiers say, where the result shows it:
///
/// | class | HTTP | gRPC | other |
/// | --- | --- | --- | --- |
/// | `RateLimited` | 429 | RESOURCE_EXHAUSTED | |
/// | `Overloaded` | 503, 529 | UNAVAILABLE | |
/// | `Timeout` | 408, 504 | DEADLINE_EXCEEDED | a call its caller dropped after `cancelled_failure_after` |
/// | `ServerError` | any other 5xx | INTERNAL, UNKNOWN, DATA_LOSS... | |
/// | `Stream` | | | a body past its stream limits, failing midway, or carrying an error event |
/// | `Other` | | | an error in the response's place (a refused connection, `tower::timeout`'s `Elapsed`) |
///
/// The shipped classifiers are generic over the error, so they cannot look
/// inside it: a classifier that tells timeouts apart is a closure over the
/// concrete error type, with [`is_timeout`](crate::classify::is_timeout):
///
/// ```
/// use http::Response;
/// use tower::BoxError;
/// use tower_circuit_breaker::classify::{is_timeout, Classify, FailureClass, HttpClassifier, Verdict};
///
/// let classify = |result: Result<&Response<()>, &BoxError>| match result {
///     Err(err) if is_timeout(err.as_ref()) => Verdict::failure(FailureClass::Timeout),
///     other => HttpClassifier::new().classify(other).at_head(),
/// };
/// let elapsed: BoxError = tower::timeout::error::Elapsed::new().into();
/// assert_eq!(classify.classify(Err(&elapsed)).at_head().class(), Some(FailureClass::Timeout));
/// ```
///
/// ```
/// use tower_circuit_breaker::classify::{FailureClass, Outcome, Verdict};
///
/// let verdict = Verdict::new(Outcome::Failure).with_class(FailureClass::RateLimited);
/// assert_eq!(verdict.class(), Some(FailureClass::RateLimited));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureClass {
    /// The upstream refused for a rate limit or a spent quota.
    RateLimited,
    /// The upstream said it is overloaded or unavailable for now.
    Overloaded,
    /// The call took too long: a timeout, or a caller that gave up.
    Timeout,
    /// The upstream failed with an error of its own.
    ServerError,
    /// A streamed body failed after its head looked well: it froze, broke
    /// off, or carried an error event.
    Stream,
    /// Anything else: a refused connection, an error the classifier does
    /// not tell apart.
    Other,
}

impl FailureClass {
    /// Every class, in order.
    pub const ALL: [FailureClass; 6] = [
        FailureClass::RateLimited,
        FailureClass::Overloaded,
        FailureClass::Timeout,
        FailureClass::ServerError,
        FailureClass::Stream,
        FailureClass::Other,
    ];

    /// Its name in configs, logs and metric labels: `rate_limited`,
    /// `overloaded`, `timeout`, `server_error`, `stream`, `other`.
    pub const fn name(self) -> &'static str {
        match self {
            FailureClass::RateLimited => "rate_limited",
            FailureClass::Overloaded => "overloaded",
            FailureClass::Timeout => "timeout",
            FailureClass::ServerError => "server_error",
            FailureClass::Stream => "stream",
            FailureClass::Other => "other",
        }
    }

    /// The class of that name, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        FailureClass::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An [`Outcome`], an optional retry-after hint read from the response, and
/// for a failure, optionally its [`FailureClass`].
///
/// A hint on a failure keeps the breaker open at least that long when it
/// opens (capped by [`Config::max_open`](crate::Config::max_open)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    outcome: Outcome,
    class: Option<FailureClass>,
    retry_after: Option<Duration>,
}

impl Verdict {
    /// A verdict without a hint.
    pub const fn new(outcome: Outcome) -> Self {
        Verdict {
            outcome,
            class: None,
            retry_after: None,
        }
    }

    /// A failure of class `class`.
    pub const fn failure(class: FailureClass) -> Self {
        Verdict::new(Outcome::Failure).with_class(class)
    }

    /// Says what kind of failure it was (meaningless on a success or an
    /// ignored call, which keep it but count no class).
    pub const fn with_class(mut self, class: FailureClass) -> Self {
        self.class = Some(class);
        self
    }

    /// The failure's class, if its classifier said.
    pub const fn class(&self) -> Option<FailureClass> {
        self.class
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
