//! gRPC classification (feature `http-body`): the status comes in the
//! response headers (trailers-only responses) or in the trailers.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Response};

use super::{Classified, Classify, ClassifyEos, FailureClass, HttpClassifier, Outcome, Verdict};

/// Classifies gRPC responses by their `grpc-status`:
///
/// | status | outcome |
/// | --- | --- |
/// | OK | success |
/// | UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED | failure |
/// | CANCELLED with the message `Timeout expired`: tonic's answer when a deadline (`grpc-timeout`, a server's `timeout`) expires | failure, as DEADLINE_EXCEEDED; ignored with [`ignore_expired_deadlines`](GrpcClassifier::ignore_expired_deadlines) |
/// | CANCELLED otherwise | ignored: the caller gave up |
/// | INTERNAL, UNKNOWN (and a stream that ends without a status) | ignored, or failures with [`internal_is_failure`](GrpcClassifier::internal_is_failure) |
/// | INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED and every other code | ignored: the request, not the server, is at fault |
///
/// A non-200 HTTP status (a proxy's 503) is judged as [`HttpClassifier`]
/// does, and so is a transport error (a failure). On a failure,
/// `grpc-retry-pushback-ms` (or a proxy's `Retry-After`) becomes the
/// retry-after hint, unless [`ignore_pushback`](GrpcClassifier::ignore_pushback)
/// says not to trust the upstream's.
///
/// ```
/// use tower_circuit_breaker::{classify::GrpcClassifier, CircuitBreakerLayer, Config};
///
/// let layer = CircuitBreakerLayer::new(Config::default())
///     .classify(GrpcClassifier::new().internal_is_failure(true));
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcClassifier {
    internal_is_failure: bool,
    ignore_pushback: bool,
    ignore_expired_deadlines: bool,
}

/// The message tonic gives the CANCELLED status of an expired deadline,
/// as written in `grpc-message` (percent-encoded) and as said.
const TIMEOUT_EXPIRED: [&[u8]; 2] = [b"Timeout%20expired", b"Timeout expired"];

impl GrpcClassifier {
    /// The default: INTERNAL and UNKNOWN are ignored, pushbacks are hints.
    pub fn new() -> Self {
        GrpcClassifier::default()
    }

    /// Whether INTERNAL and UNKNOWN count as failures.
    pub fn internal_is_failure(mut self, on: bool) -> Self {
        self.internal_is_failure = on;
        self
    }

    /// Never reads `grpc-retry-pushback-ms`, nor the `Retry-After` of a
    /// non-gRPC answer: the breaker's own open period alone decides when
    /// to probe again. For upstreams whose pushback cannot be trusted.
    pub fn ignore_pushback(mut self) -> Self {
        self.ignore_pushback = true;
        self
    }

    /// Counts a CANCELLED status that says a deadline expired (tonic's
    /// `Timeout expired`, from a client's `Request::set_timeout` or a
    /// server's `timeout`) as ignored, as any other CANCELLED, rather than
    /// as the DEADLINE_EXCEEDED failure it is. A call its own caller
    /// dropped is a cancellation either way.
    pub fn ignore_expired_deadlines(mut self) -> Self {
        self.ignore_expired_deadlines = true;
        self
    }

    /// The code to judge: CANCELLED for an expired deadline (said by
    /// `message`) is DEADLINE_EXCEEDED, unless so turned off.
    pub(crate) fn deadline_code(&self, code: Option<u32>, message: Option<&[u8]>) -> Option<u32> {
        match (code, message) {
            (Some(1), Some(message))
                if !self.ignore_expired_deadlines && TIMEOUT_EXPIRED.contains(&message) =>
            {
                Some(4)
            }
            _ => code,
        }
    }

    /// The verdict for a status code and its `grpc-message` and pushback
    /// header's values, as they came in a head or trailers.
    fn verdict_of(&self, headers: &HeaderMap) -> Verdict {
        let message = headers.get("grpc-message").map(HeaderValue::as_bytes);
        let code = self.deadline_code(grpc_status(headers), message);
        self.verdict(code, headers.get("grpc-retry-pushback-ms"))
    }

    /// The verdict for a status code (and a pushback header's value).
    pub fn verdict(&self, code: Option<u32>, pushback: Option<&HeaderValue>) -> Verdict {
        let outcome = match code {
            Some(0) => Outcome::Success,
            // UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED
            Some(14 | 4 | 8) => Outcome::Failure,
            // UNKNOWN, INTERNAL, or no status at all
            Some(2 | 13) | None if self.internal_is_failure => Outcome::Failure,
            _ => Outcome::Ignore,
        };
        let mut verdict = Verdict::new(outcome);
        if outcome == Outcome::Failure {
            verdict = verdict.with_class(match code {
                Some(8) => FailureClass::RateLimited,
                Some(14) => FailureClass::Overloaded,
                Some(4) => FailureClass::Timeout,
                _ => FailureClass::ServerError,
            });
        }
        if self.ignore_pushback || outcome != Outcome::Failure {
            return verdict;
        }
        match pushback.and_then(parse_pushback) {
            Some(hint) => verdict.with_retry_after(hint),
            None => verdict,
        }
    }
}

/// Reads `grpc-status` from headers or trailers; `None` when absent or not
/// a number.
pub fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Parses `grpc-retry-pushback-ms`: a non-negative number of milliseconds.
/// A negative value means "do not retry" and, like garbage, gives `None`.
pub fn parse_pushback(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_millis(text.parse().unwrap_or(u64::MAX)))
}

/// The end of a gRPC stream, judged by the classifier that deferred to
/// it: the status in the trailers decides.
impl ClassifyEos for GrpcClassifier {
    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Verdict {
        match trailers {
            Some(trailers) => self.verdict_of(trailers),
            None => self.verdict(None, None),
        }
    }
}

impl<B, E> Classify<Response<B>, E> for GrpcClassifier {
    /// Itself: it judges the trailers too.
    type Eos = GrpcClassifier;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<GrpcClassifier> {
        let response = match result {
            Ok(response) if response.status() == http::StatusCode::OK => response,
            other => {
                let http = if self.ignore_pushback {
                    HttpClassifier::new().ignore_retry_after()
                } else {
                    HttpClassifier::new()
                };
                return Classify::<Response<B>, E>::classify(&http, other)
                    .at_head()
                    .into();
            }
        };
        match grpc_status(response.headers()) {
            // Trailers-only: the status is in the head.
            Some(_) => Classified::Ready(self.verdict_of(response.headers())),
            None => Classified::AtEndOfStream(*self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_outcomes() {
        let c = GrpcClassifier::new();
        assert_eq!(c.verdict(Some(0), None).outcome(), Outcome::Success);
        for failing in [14, 4, 8] {
            assert_eq!(c.verdict(Some(failing), None).outcome(), Outcome::Failure);
        }
        for ignored in [3, 5, 7, 16, 2, 13, 99] {
            assert_eq!(c.verdict(Some(ignored), None).outcome(), Outcome::Ignore);
        }
        let strict = c.internal_is_failure(true);
        assert_eq!(strict.verdict(Some(13), None).outcome(), Outcome::Failure);
        assert_eq!(strict.verdict(None, None).outcome(), Outcome::Failure);
    }

    #[test]
    fn pushback_is_a_hint_on_failures_and_garbage_is_ignored() {
        let c = GrpcClassifier::new();
        let v = HeaderValue::from_static("1500");
        assert_eq!(
            c.verdict(Some(14), Some(&v)).retry_after(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(c.verdict(Some(0), Some(&v)).retry_after(), None);
        for bad in ["-1", "1.5", "", "soon", " "] {
            assert_eq!(
                parse_pushback(&HeaderValue::from_static(bad)),
                None,
                "{bad:?}"
            );
        }
        let ignoring = c.ignore_pushback();
        assert_eq!(ignoring.verdict(Some(14), Some(&v)).retry_after(), None);
        assert_eq!(
            ignoring.verdict(Some(14), Some(&v)).outcome(),
            Outcome::Failure
        );
        let huge = HeaderValue::from_static("99999999999999999999999");
        assert_eq!(parse_pushback(&huge), Some(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn an_expired_deadline_is_a_timeout_and_any_other_cancel_is_ignored() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("1"));
        let c = GrpcClassifier::new();
        assert_eq!(c.classify_eos(Some(&trailers)).outcome(), Outcome::Ignore);
        trailers.insert(
            "grpc-message",
            HeaderValue::from_static("Timeout%20expired"),
        );
        let verdict = c.classify_eos(Some(&trailers));
        assert_eq!(verdict.outcome(), Outcome::Failure);
        assert_eq!(verdict.class(), Some(FailureClass::Timeout));
        let ignoring = c.ignore_expired_deadlines();
        assert_eq!(
            ignoring.classify_eos(Some(&trailers)).outcome(),
            Outcome::Ignore
        );
    }
}
