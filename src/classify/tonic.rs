//! The classifier of `tonic::Status` errors (feature `tonic`), beside the
//! gRPC classifier of headers and trailers it agrees with.

use tonic::{Code, Status};

use std::convert::Infallible;

use super::{Classified, Classify, GrpcClassifier};

/// The metadata key of a gRPC retry pushback (gRFC A6).
pub(crate) const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Classifies `tonic::Status` errors by their code, as
/// [`GrpcClassifier`] classifies statuses in headers and trailers:
///
/// | result | outcome |
/// | --- | --- |
/// | `Ok`, or a status with code OK | success |
/// | UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED | failure |
/// | CANCELLED for an expired deadline (tonic's `Timeout expired`: a `Request::set_timeout`, `grpc-timeout` or a server's `timeout` that passed) | failure, as DEADLINE_EXCEEDED; ignored with [`ignore_expired_deadlines`](TonicClassifier::ignore_expired_deadlines) |
/// | CANCELLED otherwise | ignored: the caller gave up |
/// | INTERNAL, UNKNOWN | ignored, or failures with [`internal_is_failure`](TonicClassifier::internal_is_failure) |
/// | INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED and every other code | ignored: the request, not the server, is at fault |
///
/// A failing status's `grpc-retry-pushback-ms` metadata becomes the
/// verdict's retry-after hint (read by
/// [`parse_pushback`](super::parse_pushback); a negative or
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
/// use tower_circuit_breaker::classify::{Classify, Outcome, TonicClassifier};
/// ///
/// let mut overloaded = Status::resource_exhausted("slow down");
/// overloaded.metadata_mut().insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
///
/// let verdict = Classify::<(), _>::classify(&TonicClassifier::new(), Err(&overloaded)).at_head();
/// assert_eq!(verdict.outcome(), Outcome::Failure);
/// assert_eq!(verdict.retry_after(), Some(Duration::from_millis(1500)));
///
/// let bad_request = Status::invalid_argument("no such model");
/// let verdict = Classify::<(), _>::classify(&TonicClassifier::new(), Err(&bad_request)).at_head();
/// assert_eq!(verdict.outcome(), Outcome::Ignore);
/// ```
///
/// Around a service whose error is `tonic::Status` (a `service_fn` over one
/// generated client's method), classify with it through
/// [`CircuitBreakerLayer::classify`](crate::CircuitBreakerLayer::classify);
/// a refusal then reaches the caller as `UNAVAILABLE` with a pushback:
///
/// ```
/// use tonic::{Code, Status};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_circuit_breaker::classify::TonicClassifier;
/// use tower_circuit_breaker::{policy::ConsecutiveFailures, CircuitBreakerLayer, CircuitOpen, Config};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = CircuitBreakerLayer::new(Config::builder().name("search").trip(ConsecutiveFailures::new(1)).build()?)
///     .classify(TonicClassifier::new());
/// // Stands for a generated client's method.
/// let rpc = layer.layer(service_fn(|_: ()| async { Err::<(), _>(Status::unavailable("draining")) }));
///
/// let failed = rpc.clone().oneshot(()).await.unwrap_err(); // sent: the server is draining
/// assert_eq!(failed.message(), "draining");
/// let refused = rpc.oneshot(()).await.unwrap_err(); // not sent: the circuit is open
/// assert_eq!(refused.code(), Code::Unavailable);
/// assert!(refused.metadata().get("grpc-retry-pushback-ms").is_some());
/// assert!(CircuitOpen::find(&refused).is_some());
/// # Ok(())
/// # }
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

    /// Ignores a CANCELLED status for an expired deadline, as
    /// [`GrpcClassifier::ignore_expired_deadlines`].
    pub fn ignore_expired_deadlines(mut self) -> Self {
        self.codes = self.codes.ignore_expired_deadlines();
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
    type Eos = Infallible;

    fn classify(&self, result: Result<&T, &Status>) -> Classified<Infallible> {
        Classified::Ready(match result {
            Ok(_) => self.codes.verdict(Some(Code::Ok as u32), None),
            Err(status) => {
                // tonic's own deadline: CANCELLED, its source (or its
                // message) the `TimeoutExpired` of its timeout layer.
                let expired = status.code() == Code::Cancelled
                    && (status.message() == "Timeout expired" || timed_out(status));
                let message = expired.then_some(&b"Timeout expired"[..]);
                self.codes.verdict(
                    self.codes
                        .deadline_code(Some(status.code() as u32), message),
                    status.metadata().as_ref().get(PUSHBACK),
                )
            }
        })
    }
}

/// Whether `status` came from tonic's `TimeoutExpired`, anywhere in its
/// chain of sources.
fn timed_out(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}
