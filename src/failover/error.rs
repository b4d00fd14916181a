//! The error a failover returns when no candidate answered.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::BoxError;

use crate::State;

/// Every candidate of a [`Failover`](super::Failover) was open, failed, or
/// was not tried because the attempt bound was reached.
///
/// It carries one [`Unavailable`] per candidate, in the chain's order, and
/// the smallest retry-after among the open ones: when to try again. It
/// reaches the caller inside tower's `BoxError`; find it with
/// [`Exhausted::find`].
///
/// ```
/// use std::time::Duration;
/// use tower::BoxError;
/// use tower_circuit_breaker::failover::Exhausted;
///
/// fn when_to_retry(err: &BoxError) -> Option<Duration> {
///     Exhausted::find(err.as_ref()).and_then(Exhausted::retry_after)
/// }
/// ```
#[derive(Debug)]
pub struct Exhausted {
    candidates: Vec<Unavailable>,
}

impl Exhausted {
    /// The answer of a chain whose every candidate gave none, one
    /// [`Unavailable`] per candidate in the chain's order: what a
    /// [`Failover`](super::Failover) returns, for a chain a user walks
    /// without one (and answers with as the `axum` and `tonic` features
    /// do: 503 with `Retry-After`, `UNAVAILABLE` with a pushback, both the
    /// smallest retry-after among the open candidates).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::{Exhausted, Reason, Unavailable};
    /// use tower_circuit_breaker::State;
    ///
    /// let exhausted = Exhausted::new([
    ///     Unavailable::new(0, "openai", Reason::open(State::Open, Some(Duration::from_secs(20)))),
    ///     Unavailable::new(1, "anthropic", Reason::open(State::Open, Some(Duration::from_secs(5)))),
    ///     Unavailable::new(2, "local", Reason::failed(Some("connection refused".into()), None)),
    /// ]);
    /// assert_eq!(exhausted.retry_after(), Some(Duration::from_secs(5)));
    /// assert_eq!(exhausted.candidates()[2].name(), "local");
    /// ```
    pub fn new(candidates: impl IntoIterator<Item = Unavailable>) -> Self {
        Exhausted {
            candidates: candidates.into_iter().collect(),
        }
    }

    /// Why each candidate gave no answer, in the chain's order.
    pub fn candidates(&self) -> &[Unavailable] {
        &self.candidates
    }

    /// The smallest retry-after among the open candidates: the earliest a
    /// breaker in the chain may admit a call again. `None` when no candidate
    /// was open with a known end (all failed, or held open by an operator).
    pub fn retry_after(&self) -> Option<Duration> {
        self.candidates
            .iter()
            .filter_map(|c| match c.reason {
                Reason::Open { retry_after, .. } => retry_after,
                _ => None,
            })
            .min()
    }

    /// The chain's answer as an HTTP response, for a gateway without the
    /// `axum` feature: `503 Service Unavailable` with `Retry-After` set to
    /// the smallest retry-after among the open candidates (whole seconds,
    /// rounded up, at least 1), or none when no open candidate has a known
    /// end, and an empty body (`B::default()`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::{Exhausted, Reason, Unavailable};
    /// use tower_circuit_breaker::State;
    ///
    /// let exhausted = Exhausted::new([
    ///     Unavailable::new(0, "alpha/large", Reason::open(State::Open, Some(Duration::from_millis(1_200)))),
    ///     Unavailable::new(1, "beta/large", Reason::open(State::Open, Some(Duration::from_secs(30)))),
    /// ]);
    /// let response: http::Response<()> = exhausted.to_http_response();
    /// assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    /// assert_eq!(response.headers()[http::header::RETRY_AFTER], "2");
    /// ```
    pub fn to_http_response<B: Default>(&self) -> http::Response<B> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        if let Some(after) = self.retry_after() {
            let seconds = crate::error::retry_after_seconds(after);
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
        }
        response
    }

    /// Takes the `Exhausted` out of a failover's error, to answer with it
    /// (with the `axum` feature, `exhausted.into_response()`: 503 with the
    /// smallest `Retry-After`); any other error comes back as it was: a
    /// candidate's own answer, passed through.
    ///
    /// ```
    /// use tower::BoxError;
    /// use tower_circuit_breaker::failover::{Exhausted, Reason, Unavailable};
    ///
    /// let err: BoxError = Exhausted::new([Unavailable::new(0, "a", Reason::NotTried)]).into();
    /// let exhausted = Exhausted::take(err).expect("an exhausted chain");
    /// assert_eq!(exhausted.candidates().len(), 1);
    /// assert!(Exhausted::take("a 400 from the provider".into()).is_err());
    /// ```
    pub fn take(err: BoxError) -> Result<Exhausted, BoxError> {
        err.downcast::<Exhausted>().map(|exhausted| *exhausted)
    }

    /// Finds an `Exhausted` in an error or anywhere in its source chain.
    pub fn find<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a Exhausted> {
        let mut current = Some(err);
        while let Some(e) = current {
            if let Some(exhausted) = e.downcast_ref::<Exhausted>() {
                return Some(exhausted);
            }
            current = e.source();
        }
        None
    }
}

impl fmt::Display for Exhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("every failover candidate is unavailable")?;
        for (n, candidate) in self.candidates.iter().enumerate() {
            f.write_str(if n == 0 { ": " } else { "; " })?;
            write!(f, "{candidate}")?;
        }
        Ok(())
    }
}

impl Error for Exhausted {
    /// The last failure's error, if a call failed with one.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.candidates.iter().rev().find_map(|c| match &c.reason {
            Reason::Failed {
                error: Some(error), ..
            } => Some(error.as_ref() as &(dyn Error + 'static)),
            _ => None,
        })
    }
}

/// One candidate that gave no answer, and why.
#[derive(Debug)]
pub struct Unavailable {
    index: usize,
    name: Arc<str>,
    reason: Reason,
}

impl Unavailable {
    /// Candidate `index` of a chain (from zero), whose breaker is named
    /// `name`, gave no answer for `reason`.
    pub fn new(index: usize, name: impl Into<Arc<str>>, reason: Reason) -> Self {
        Unavailable {
            index,
            name: name.into(),
            reason,
        }
    }

    /// The candidate's place in the chain, from zero.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The name of the candidate's breaker.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why it gave no answer.
    pub fn reason(&self) -> &Reason {
        &self.reason
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} `{}` {}", self.index, self.name, self.reason)
    }
}

/// Why a candidate gave no answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reason {
    /// Its breaker would not admit a call: skipped without calling it (open,
    /// or held open by an operator), or refused with
    /// [`CircuitOpen`](crate::CircuitOpen) (half-open with every probe in
    /// flight).
    #[non_exhaustive]
    Open {
        /// The breaker's state when it was skipped or refused.
        state: State,
        /// How long until it may admit a call; `None` while an operator
        /// holds it open with no end.
        retry_after: Option<Duration>,
    },
    /// It was called and the classifier counted the result as a failure.
    #[non_exhaustive]
    Failed {
        /// The error it failed with; `None` when it answered with a response
        /// the classifier counted as a failure (a 503, say), which is dropped.
        error: Option<BoxError>,
        /// A retry-after hint the classifier read from the result.
        retry_after: Option<Duration>,
    },
    /// Not asked: the failover's attempt bound was reached first.
    NotTried,
}

impl Reason {
    /// The candidate's breaker would not admit a call: it was in `state`,
    /// and may admit one after `retry_after` (`None`: no known end).
    pub fn open(state: State, retry_after: Option<Duration>) -> Self {
        Reason::Open { state, retry_after }
    }

    /// The candidate was called and the result counted as a failure: with
    /// `error`, or a response counted as one (`None`); `retry_after` is a
    /// hint read from it.
    pub fn failed(error: Option<BoxError>, retry_after: Option<Duration>) -> Self {
        Reason::Failed { error, retry_after }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Open { state, retry_after } => {
                f.write_str(match state {
                    State::HalfOpen => "half-open with every probe in flight",
                    State::ForcedOpen => "held open by an operator",
                    _ => "open",
                })?;
                match retry_after {
                    Some(after) => write!(f, ", retry after {} ms", after.as_millis()),
                    None => f.write_str(", with no end"),
                }
            }
            Reason::Failed {
                error: Some(error), ..
            } => write!(f, "failed: {error}"),
            Reason::Failed { error: None, .. } => {
                f.write_str("failed: the response counted as a failure")
            }
            Reason::NotTried => f.write_str("not tried: attempt bound reached"),
        }
    }
}
