//! tonic integration (feature `tonic`): a refused call becomes a gRPC
//! `UNAVAILABLE` status with a pushback, and [`TonicClassifier`] judges
//! `tonic::Status` errors.
//!
//! # Guarding a `Channel`
//!
//! The wiring to start from: the breaker around the `Channel` (every RPC of
//! every generated client on it), **classifying at the end of each stream
//! with [`GrpcClassifier`]**, and the channel's transport errors mapped to
//! `tonic::Status`, the error type a refusal converts into:
//!
//! ```
//! use tonic::transport::{Channel, Endpoint};
//! use tonic::Status;
//! use tower::ServiceBuilder;
//! use tower_circuit_breaker::classify::GrpcClassifier;
//! use tower_circuit_breaker::{CircuitBreakerLayer, Config};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let channel: Channel = Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
//! let to_status: fn(tonic::transport::Error) -> Status = |err| Status::from_error(Box::new(err));
//! let guarded = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new(Config::builder().name("search").build()?).streaming(GrpcClassifier::new()))
//!     .map_err(to_status)
//!     .service(channel);
//! // let client = SearchClient::new(guarded); // any generated client
//! # let _ = guarded;
//! # Ok(())
//! # }
//! ```
//!
//! * **The classifier must see gRPC statuses.** A gRPC failure is an HTTP
//!   200 whose status is in `grpc-status`, often in the trailers: the
//!   default classifier (every `Err` a failure) and
//!   [`HttpClassifier`](crate::classify::HttpClassifier) count UNAVAILABLE
//!   as a success, and the breaker never opens. (`HttpClassifier` warns
//!   once, through `tracing`, when it sees a gRPC response.)
//!   [`GrpcClassifier`] reads the status from the head of a trailers-only
//!   answer or from the trailers at the end of the stream.
//! * **The error type is `tonic::Status`**: a refusal then reaches the
//!   generated client as the `UNAVAILABLE` status below, with
//!   `grpc-retry-pushback-ms`. With `BoxError` instead, tonic finds no
//!   status in the error and reports `UNKNOWN`.
//!
//! # Guarding one method
//!
//! Around a service whose error is `tonic::Status` (a `service_fn` over one
//! generated client method), classify with [`TonicClassifier`] through
//! [`CircuitBreakerLayer::classify`](crate::CircuitBreakerLayer::classify):
//!
//! ```
//! use tonic::{Code, Status};
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_circuit_breaker::tonic::TonicClassifier;
//! use tower_circuit_breaker::{policy::ConsecutiveFailures, CircuitBreakerLayer, CircuitOpen, Config};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = CircuitBreakerLayer::new(Config::builder().name("search").trip(ConsecutiveFailures::new(1)).build()?)
//!     .classify(TonicClassifier::new());
//! // Stands for a generated client's method.
//! let rpc = layer.layer(service_fn(|_: ()| async { Err::<(), _>(Status::unavailable("draining")) }));
//!
//! let failed = rpc.clone().oneshot(()).await.unwrap_err(); // sent: the server is draining
//! assert_eq!(failed.message(), "draining");
//! let refused = rpc.oneshot(()).await.unwrap_err(); // not sent: the circuit is open
//! assert_eq!(refused.code(), Code::Unavailable);
//! assert!(refused.metadata().get("grpc-retry-pushback-ms").is_some());
//! assert!(CircuitOpen::find(&refused).is_some());
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::classify::{Classify, GrpcClassifier, Verdict};
use crate::error::CircuitOpen;
use crate::millis::millis_up;

/// The metadata key of a gRPC retry pushback (gRFC A6).
const PUSHBACK: &str = "grpc-retry-pushback-ms";

impl From<CircuitOpen> for Status {
    /// `UNAVAILABLE`, with the retry delay in milliseconds as
    /// `grpc-retry-pushback-ms` metadata, and the `CircuitOpen` as the
    /// status's source (so [`CircuitOpen::find`] finds it).
    ///
    /// A zero delay (half-open with every probe in flight and no probe
    /// timeout: the breaker cannot tell) is sent as 1000 ms, the same
    /// one-second floor as the HTTP `Retry-After`
    /// ([`CircuitOpen::to_http_response`]): a pushback of zero tells a
    /// gRPC client to retry at once, into the same refusal.
    ///
    /// The message names the breaker, and a server that returns this
    /// status sends the name to its client: name breakers after what a
    /// client may know (a provider, a model), or map the error to a status
    /// of your own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic::{Code, Status};
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_circuit_breaker::{Breaker, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let breaker = Breaker::new(Config::builder().name("search").build()?);
    /// breaker.force_open(Some(Duration::from_millis(2_500)));
    /// let rpc = breaker.layer().layer(service_fn(|_: ()| async { Ok::<_, Status>(()) }));
    ///
    /// let status = rpc.oneshot(()).await.unwrap_err(); // From<CircuitOpen> made it
    /// assert_eq!(status.code(), Code::Unavailable);
    /// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "2500");
    /// # Ok(())
    /// # }
    /// ```
    fn from(open: CircuitOpen) -> Status {
        // Rounded up: a client told to come back never comes back early.
        let delay_ms = match millis_up(open.retry_after()) {
            0 => 1000,
            ms => ms,
        };
        let mut status = Status::unavailable(format!(
            "upstream `{}` is unavailable; retry after {delay_ms} ms",
            open.breaker()
        ));
        status
            .metadata_mut()
            .insert(PUSHBACK, MetadataValue::from(delay_ms));
        status.set_source(Arc::new(open));
        status
    }
}

/// Classifies `tonic::Status` errors by their code, as
/// [`GrpcClassifier`] classifies statuses in headers and trailers:
///
/// | result | outcome |
/// | --- | --- |
/// | `Ok`, or a status with code OK | success |
/// | UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED | failure |
/// | INTERNAL, UNKNOWN | ignored, or failures with [`internal_is_failure`](TonicClassifier::internal_is_failure) |
/// | INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED and every other code | ignored: the request, not the server, is at fault |
///
/// A failing status's `grpc-retry-pushback-ms` metadata becomes the
/// verdict's retry-after hint (read by
/// [`parse_pushback`](crate::classify::parse_pushback); a negative or
/// malformed value is ignored).
///
/// tonic reports transport errors (connection refused, reset) as
/// UNAVAILABLE or UNKNOWN statuses, so they count as failures, or with
/// [`internal_is_failure`](TonicClassifier::internal_is_failure) as well for
/// UNKNOWN.
///
/// ```
/// use std::time::Duration;
/// use tonic::Status;
/// use tower_circuit_breaker::classify::{Classify, Outcome};
/// use tower_circuit_breaker::tonic::TonicClassifier;
///
/// let mut overloaded = Status::resource_exhausted("slow down");
/// overloaded.metadata_mut().insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
///
/// let verdict = Classify::<(), _>::classify(&TonicClassifier::new(), Err(&overloaded));
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), Some(Duration::from_millis(1500)));
///
/// let bad_request = Status::invalid_argument("no such model");
/// let verdict = Classify::<(), _>::classify(&TonicClassifier::new(), Err(&bad_request));
/// assert_eq!(verdict.outcome(), Outcome::Ignore);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TonicClassifier {
    codes: GrpcClassifier,
}

impl TonicClassifier {
    /// The default: INTERNAL and UNKNOWN are ignored.
    pub fn new() -> Self {
        TonicClassifier::default()
    }

    /// Whether INTERNAL and UNKNOWN count as failures.
    pub fn internal_is_failure(mut self, on: bool) -> Self {
        self.codes = self.codes.internal_is_failure(on);
        self
    }

    /// Never reads `grpc-retry-pushback-ms`, as
    /// [`GrpcClassifier::ignore_pushback`].
    pub fn ignore_pushback(mut self) -> Self {
        self.codes = self.codes.ignore_pushback();
        self
    }
}

impl<T> Classify<T, Status> for TonicClassifier {
    fn classify(&self, result: Result<&T, &Status>) -> Verdict {
        match result {
            Ok(_) => self.codes.verdict(Some(Code::Ok as u32), None),
            Err(status) => self.codes.verdict(
                Some(status.code() as u32),
                status.metadata().as_ref().get(PUSHBACK),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::classify::Outcome;
    use crate::error::Name;
    use crate::State;

    fn refusal(retry_after_ms: u64) -> CircuitOpen {
        CircuitOpen::new(
            Name::new(&Arc::from("search")),
            tokio::time::Instant::now() + Duration::from_millis(retry_after_ms),
            State::Open,
        )
    }

    fn classify(classifier: TonicClassifier, status: &Status) -> Verdict {
        Classify::<(), _>::classify(&classifier, Err(status))
    }

    #[test]
    fn a_refusal_is_unavailable_with_its_delay_as_pushback() {
        let status = Status::from(refusal(2_345));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.metadata().get(PUSHBACK).unwrap(), "2345");
        assert_eq!(
            status.message(),
            "upstream `search` is unavailable; retry after 2345 ms"
        );
        let open = CircuitOpen::find(&status).expect("the refusal is the source");
        assert_eq!(open.breaker(), "search");
    }

    #[test]
    fn a_zero_delay_is_sent_as_one_second() {
        let status = Status::from(refusal(0));
        assert_eq!(status.metadata().get(PUSHBACK).unwrap(), "1000");
    }

    #[test]
    fn a_remote_breakers_refusal_is_a_failure_with_its_pushback() {
        // A server behind its own breaker refuses; the client's breaker reads it.
        let verdict = classify(TonicClassifier::new(), &Status::from(refusal(7_000)));
        assert_eq!(verdict.outcome(), Outcome::Failure);
        assert_eq!(verdict.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn codes_map_to_outcomes() {
        let default = TonicClassifier::new();
        let strict = TonicClassifier::new().internal_is_failure(true);
        let ok = Classify::<(), Status>::classify(&default, Ok(&()));
        assert_eq!(ok.outcome(), Outcome::Success);
        for (code, by_default, when_strict) in [
            (Code::Ok, Outcome::Success, Outcome::Success),
            (Code::Unavailable, Outcome::Failure, Outcome::Failure),
            (Code::DeadlineExceeded, Outcome::Failure, Outcome::Failure),
            (Code::ResourceExhausted, Outcome::Failure, Outcome::Failure),
            (Code::Internal, Outcome::Ignore, Outcome::Failure),
            (Code::Unknown, Outcome::Ignore, Outcome::Failure),
            (Code::InvalidArgument, Outcome::Ignore, Outcome::Ignore),
            (Code::NotFound, Outcome::Ignore, Outcome::Ignore),
            (Code::PermissionDenied, Outcome::Ignore, Outcome::Ignore),
            (Code::Unauthenticated, Outcome::Ignore, Outcome::Ignore),
            (Code::FailedPrecondition, Outcome::Ignore, Outcome::Ignore),
            (Code::Cancelled, Outcome::Ignore, Outcome::Ignore),
            (Code::Unimplemented, Outcome::Ignore, Outcome::Ignore),
        ] {
            let status = Status::new(code, "");
            assert_eq!(classify(default, &status).outcome(), by_default, "{code:?}");
            assert_eq!(classify(strict, &status).outcome(), when_strict, "{code:?}");
        }
    }

    #[test]
    fn pushback_is_a_hint_on_failures_only_and_garbage_is_ignored() {
        let with_pushback = |code: Code, value: &'static str| {
            let mut status = Status::new(code, "");
            status
                .metadata_mut()
                .insert(PUSHBACK, MetadataValue::from_static(value));
            status
        };
        let c = TonicClassifier::new();
        assert_eq!(
            classify(c, &with_pushback(Code::Unavailable, "1500")).retry_after(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            classify(c, &with_pushback(Code::InvalidArgument, "1500")).retry_after(),
            None,
            "ignored outcomes carry no hint"
        );
        let ignoring = c.ignore_pushback();
        let verdict = classify(ignoring, &with_pushback(Code::Unavailable, "1500"));
        assert_eq!(
            (verdict.outcome(), verdict.retry_after()),
            (Outcome::Failure, None)
        );
        for garbage in ["-1", "1.5", "soon", ""] {
            let verdict = classify(c, &with_pushback(Code::Unavailable, garbage));
            assert_eq!(verdict.outcome(), Outcome::Failure, "{garbage:?}");
            assert_eq!(verdict.retry_after(), None, "{garbage:?}");
        }
    }
}
