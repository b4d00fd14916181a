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
//! let verdict = classify.classify(Err(&ApiError::BadRequest));
//! assert_eq!(verdict.outcome(), Outcome::Ignore);
//! ```

#[cfg(feature = "http-body")]
mod grpc;
mod http;
#[cfg(feature = "tower-http")]
mod interop;
#[cfg(feature = "http-body")]
mod stream;
#[cfg(feature = "tonic")]
pub(crate) mod tonic;

use std::error::Error;

pub use self::http::{parse_retry_after, HttpClassifier};
pub use crate::outcome::{Outcome, Verdict};
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub use grpc::{grpc_status, parse_pushback, GrpcClassifier, GrpcEos};
#[cfg(feature = "tower-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower-http")))]
pub use interop::{TowerHttp, TowerHttpEosOf};
#[cfg(feature = "http-body")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-body")))]
pub use stream::{BodyEnds, Classified, ClassifyEos, ClassifyResponse, StreamingHttp};
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use tonic::TonicClassifier;

/// Decides how a call's result counts. Implemented by closures
/// `Fn(Result<&T, &E>) -> impl Into<Verdict>`.
pub trait Classify<T, E> {
    /// Classifies one result.
    fn classify(&self, result: Result<&T, &E>) -> Verdict;
}

impl<F, T, E, V> Classify<T, E> for F
where
    F: Fn(Result<&T, &E>) -> V,
    V: Into<Verdict>,
{
    fn classify(&self, result: Result<&T, &E>) -> Verdict {
        self(result).into()
    }
}

/// The default classifier: every `Ok` is a success, every `Err` a failure.
///
/// ```
/// use tower_circuit_breaker::classify::{Classify, ErrorsAsFailures, Outcome};
///
/// let c = ErrorsAsFailures;
/// assert_eq!(Classify::<u8, ()>::classify(&c, Ok(&1)).outcome(), Outcome::Success);
/// assert_eq!(Classify::<u8, ()>::classify(&c, Err(&())).outcome(), Outcome::Failure);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorsAsFailures;

impl<T, E> Classify<T, E> for ErrorsAsFailures {
    fn classify(&self, result: Result<&T, &E>) -> Verdict {
        match result {
            Ok(_) => Verdict::new(Outcome::Success),
            Err(_) => Verdict::new(Outcome::Failure),
        }
    }
}

/// Whether `tower::timeout`'s `Elapsed` is this error or in its source chain.
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
