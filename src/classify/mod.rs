//! Classification: what an inner service's result says about its health.
//!
//! A [`Classify`] looks at the `Result` of each call and returns a
//! [`Verdict`]: [`Success`](Outcome::Success), [`Failure`](Outcome::Failure)
//! or [`Ignore`](Outcome::Ignore), optionally with a retry-after hint the
//! upstream announced. Ignored outcomes count neither way and give back their
//! probe permit: a `400 Bad Request` says nothing about the provider's health,
//! so one bad client cannot open the circuit for everybody.
//!
//! Closures are classifiers:
//!
//! ```
//! use tower_circuit_breaker::classify::{Classify, Outcome};
//!
//! #[derive(Debug)]
//! enum ApiError { RateLimited, BadRequest, Down }
//!
//! let classify = |result: Result<&String, &ApiError>| match result {
//!     Ok(_) => Outcome::Success,
//!     Err(ApiError::BadRequest) => Outcome::Ignore,
//!     Err(_) => Outcome::Failure,
//! };
//! let verdict = classify.classify(Err(&ApiError::BadRequest)).at_head();
//! assert_eq!(verdict.outcome(), Outcome::Ignore);
//! ```
//!
//! # Every signal read, and how to turn it off
//!
//! What the shipped classifiers and a breaker's config read of an
//! upstream, beyond its status:
//!
//! | signal | read by | becomes | turned off by |
//! | --- | --- | --- | --- |
//! | `retry-after-ms`, `Retry-After` (seconds or HTTP date), on every failing status (429, 5xx, 529) | [`HttpClassifier`], `StreamingHttp` | the hint: open at least that long | `ignore_retry_after()` |
//! | OpenAI's `x-ratelimit-reset-requests` / `-tokens`, when `x-ratelimit-remaining-*` is 0 or on a 429 | [`HttpClassifier`], `StreamingHttp` | the hint | `ignore_reset_headers()` |
//! | Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339), likewise | [`HttpClassifier`], `StreamingHttp` | the hint | `ignore_reset_headers()` |
//! | Gemini's `RetryInfo.retryDelay` in a failing status's JSON body (known length, at most 16 KiB) | `StreamingHttp` | the hint, when the body ends | `StreamingHttp::ignore_retry_delay()` |
//! | `grpc-status` in headers or trailers; `grpc-retry-pushback-ms` | `GrpcClassifier`, `TonicClassifier` | the outcome; the hint | `ignore_pushback()` |
//! | an SSE `event: error`, or a `data:` JSON with a top-level `error`, inside a 200 | `SseErrors` (`StreamingHttp::new().sse_errors()`) | a failure of class [`Stream`](FailureClass::Stream), at once | leave the judge out |
//! | no first data frame within `first_frame_timeout`; silence past `frame_idle_timeout` | the config ([`ConfigBuilder`](crate::ConfigBuilder)), for bodies judged at their end | the body ends with `StreamTimeout`; a failure | the limit unset (the default) |
//! | a call its caller dropped after `cancelled_failure_after` | the config | a failure of class [`Timeout`](FailureClass::Timeout) | unset (the default) |
//! | the time to the head, first data frame or end | the config's `latency_to` | a slow-call policy's latency | [`LatencyTo`](crate::LatencyTo) |
//!
//! Hints are capped by the breaker's `max_open`, except that a hint beyond
//! it (a spent quota's reset) holds a breaker whose config sets
//! [`max_quota_hold`](crate::ConfigBuilder::max_quota_hold) open up to that
//! ceiling, probed every `quota_probe_interval`; a value that does not parse
//! is ignored, never a panic. Each failure says its [`FailureClass`] (see
//! there), which [`PerClass`](crate::policy::PerClass) counts apart.

#[cfg(feature = "http-body")]
mod grpc;
mod hints;
mod http;
#[cfg(feature = "tower-http")]
mod interop;
#[cfg(feature = "http-body")]
mod scan;
#[cfg(feature = "http-body")]
mod sse;
#[cfg(all(test, feature = "http-body"))]
mod sse_reference;
#[cfg(feature = "http-body")]
mod stream;
#[cfg(feature = "tonic")]
pub(crate) mod tonic;

use std::convert::Infallible;
use std::error::Error;

use ::http::HeaderMap;

pub use self::http::{parse_retry_after, HttpClassifier};
pub use crate::outcome::{FailureClass, Outcome, Verdict};
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub use grpc::{grpc_status, parse_pushback, GrpcClassifier};
#[cfg(feature = "tower-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower-http")))]
pub use interop::TowerHttp;
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub use sse::{SseErrors, SseJudge};
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub use stream::{HttpEos, StreamingHttp};
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use tonic::TonicClassifier;

/// Decides how a call's result counts: at once, or at the end of the
/// response's body.
///
/// Most classifiers judge the result as it arrives (a status, an error):
/// their [`Eos`](Classify::Eos) is [`Infallible`], and
/// [`classify`](Classify::classify) always answers
/// [`Classified::Ready`]. Closures `Fn(Result<&T, &E>) -> impl Into<Verdict>`
/// are such classifiers.
///
/// A classifier of `http::Response`s may instead defer to the end of the
/// body (a stream of server-sent events, a gRPC call whose status comes in
/// the trailers): it answers [`Classified::AtEndOfStream`] with its
/// [`ClassifyEos`], and the breaker hands the caller the response with its
/// body wrapped (feature `http-body`), recording the outcome when the body
/// ends. The classifier itself says which, as tower-http's `Trace` asks of
/// its classifiers: one breaker, whichever way its calls are judged.
///
/// ```
/// use std::convert::Infallible;
/// use tower_circuit_breaker::classify::{Classified, Classify, Outcome, Verdict};
///
/// /// Only timeouts count: the upstream is known to refuse loudly.
/// #[derive(Clone)]
/// struct TimeoutsOnly;
///
/// impl<T> Classify<T, tower::BoxError> for TimeoutsOnly {
///     type Eos = Infallible;
///
///     fn classify(&self, result: Result<&T, &tower::BoxError>) -> Classified<Infallible> {
///         match result {
///             Err(e) if tower_circuit_breaker::classify::is_timeout(e.as_ref()) => Outcome::Failure.into(),
///             Err(_) => Outcome::Ignore.into(),
///             Ok(_) => Verdict::new(Outcome::Success).into(),
///         }
///     }
/// }
/// let err: tower::BoxError = tower::timeout::error::Elapsed::new().into();
/// assert_eq!(Classify::<(), _>::classify(&TimeoutsOnly, Err(&err)).at_head().outcome(), Outcome::Failure);
/// ```
pub trait Classify<T, E> {
    /// Judges the end of the response's body when
    /// [`classify`](Classify::classify) defers to it: a [`ClassifyEos`];
    /// [`Infallible`] for a classifier whose verdict always comes with the
    /// result.
    type Eos;

    /// Classifies one result: the verdict, or the judge of its body's end.
    fn classify(&self, result: Result<&T, &E>) -> Classified<Self::Eos>;

    /// The verdict as far as the result alone tells, where nothing waits
    /// for a body (a failover choosing whether to try the next candidate, a
    /// retry deciding whether to retry). By default
    /// [`Classified::at_head`]: a call deferred to its body's end has
    /// succeeded so far. A classifier that defers a verdict it already
    /// knows (a failing status whose body only adds a hint) gives it here.
    fn classify_head(&self, result: Result<&T, &E>) -> Verdict {
        self.classify(result).at_head()
    }
}

impl<F, T, E, V> Classify<T, E> for F
where
    F: Fn(Result<&T, &E>) -> V,
    V: Into<Verdict>,
{
    type Eos = Infallible;

    #[inline]
    fn classify(&self, result: Result<&T, &E>) -> Classified<Infallible> {
        Classified::Ready(self(result).into())
    }
}

/// What a [`Classify`] decided about a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classified<Eos> {
    /// The verdict is known now (a 503, a refused connection, a
    /// trailers-only gRPC error, any result of a classifier that never
    /// defers).
    Ready(Verdict),
    /// It depends on how the response's body ends: `Eos` judges then.
    AtEndOfStream(Eos),
}

impl<Eos> Classified<Eos> {
    /// The verdict as far as the result alone tells: a call deferred to
    /// its body's end has succeeded so far.
    pub fn at_head(&self) -> Verdict {
        match self {
            Classified::Ready(verdict) => *verdict,
            Classified::AtEndOfStream(_) => Verdict::new(Outcome::Success),
        }
    }
}

impl<Eos> From<Verdict> for Classified<Eos> {
    fn from(verdict: Verdict) -> Self {
        Classified::Ready(verdict)
    }
}

impl<Eos> From<Outcome> for Classified<Eos> {
    fn from(outcome: Outcome) -> Self {
        Classified::Ready(Verdict::new(outcome))
    }
}

/// Judges a streamed body when it ends, for a [`Classify`] that deferred
/// to it, and, if it wants, its data frames as they pass.
///
/// A body that ends (all data read, trailers included) is judged by
/// [`classify_eos`](ClassifyEos::classify_eos); one that fails midway by
/// [`classify_body_error`](ClassifyEos::classify_body_error) (a failure of
/// class [`Stream`](FailureClass::Stream) by default). A body dropped before
/// its end (the caller walked away) counts as cancelled, neither way, unless
/// [`classify_dropped`](ClassifyEos::classify_dropped) says otherwise. A
/// panic here, or in the body, counts as a failure and is resumed to the
/// body's reader.
///
/// A judge that sets [`READS_DATA`](ClassifyEos::READS_DATA) sees each data
/// frame's bytes, by reference, before the reader gets the frame
/// ([`classify_data`](ClassifyEos::classify_data)): nothing is buffered or
/// copied for it, and a verdict it gives there is recorded at once (the
/// rest of the body then passes untouched). [`SseErrors`] is such a judge.
/// A judge that does not costs nothing per frame: the body never asks.
///
/// A [`Verdict`] is the simplest judge: the verdict it holds, given when
/// the body ends ([`StreamingHttp`] defers to a success that way).
pub trait ClassifyEos: Send + 'static {
    /// Whether [`classify_data`](ClassifyEos::classify_data) is to be
    /// called: false (the default) for judges that only look at the end.
    const READS_DATA: bool = false;

    /// A data frame passed, in order: `data` is one contiguous piece of it
    /// (a frame whose buffer is split comes in as many calls, in order).
    /// A verdict here decides the call now; `None` reads on. Only called
    /// when [`READS_DATA`](ClassifyEos::READS_DATA) is true.
    fn classify_data(&mut self, data: &[u8]) -> Option<Verdict> {
        let _ = data;
        None
    }

    /// The body ended; `trailers` are its trailers, if any.
    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Verdict;

    /// The body failed before its end.
    fn classify_body_error(self) -> Verdict
    where
        Self: Sized,
    {
        Verdict::failure(FailureClass::Stream)
    }

    /// The body was dropped before its end: `None` (the default) counts the
    /// call as cancelled; a judge whose verdict was known before the body
    /// (a failing status whose body only adds a hint) gives it here.
    fn classify_dropped(self) -> Option<Verdict>
    where
        Self: Sized,
    {
        None
    }
}

impl ClassifyEos for Verdict {
    /// The body ended well: the verdict deferred to it.
    fn classify_eos(self, _: Option<&HeaderMap>) -> Verdict {
        self
    }
}

/// The default classifier: every `Ok` is a success, every `Err` a failure.
///
/// An answer is an `Ok`, whatever it says: behind this classifier an HTTP
/// 503, or a gRPC failure inside a `200`, is a success, and the breaker
/// never opens on them. Give an HTTP client [`HttpClassifier`] (or
/// `StreamingHttp`) and a gRPC client `GrpcClassifier` or `TonicClassifier`.
///
/// ```
/// use tower_circuit_breaker::classify::{Classify, ErrorsAsFailures, Outcome};
///
/// let c = ErrorsAsFailures;
/// assert_eq!(Classify::<u8, ()>::classify(&c, Ok(&1)).at_head().outcome(), Outcome::Success);
/// assert_eq!(Classify::<u8, ()>::classify(&c, Err(&())).at_head().outcome(), Outcome::Failure);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorsAsFailures;

impl<T, E> Classify<T, E> for ErrorsAsFailures {
    type Eos = Infallible;

    #[inline]
    fn classify(&self, result: Result<&T, &E>) -> Classified<Infallible> {
        Classified::Ready(Verdict::new(match result {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }))
    }
}

/// Whether `tower::timeout`'s `Elapsed` is this error or in its source chain.
///
/// It looks for tower 0.5's `Elapsed`, the tower this crate is built on: a
/// timeout from another tower major in the same program is a different
/// type, and this says `false` for it (see [the versions this crate is tied
/// to](crate::guide::limits#versions-it-is-tied-to)).
///
/// ```
/// use tower::{timeout::error::Elapsed, BoxError};
/// use tower_circuit_breaker::classify::is_timeout;
///
/// let err: BoxError = Elapsed::new().into();
/// assert!(is_timeout(err.as_ref()));
/// ```
pub fn is_timeout(err: &(dyn Error + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if e.is::<tower::timeout::error::Elapsed>() {
            return true;
        }
        current = e.source();
    }
    false
}
