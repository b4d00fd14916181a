//! HTTP with streamed bodies (feature `http-body`): responses whose outcome
//! is only known once the body has been read through, such as server-sent
//! events.

use http::Response;

use super::{Classified, Classify, HttpClassifier, Outcome, Verdict};

/// HTTP with streamed bodies (server-sent events, chunked completions):
/// statuses are judged as [`HttpClassifier`] does, at once; a response that
/// looks successful succeeds only if its body ends without an error.
///
/// ```
/// use tower_circuit_breaker::{classify::StreamingHttp, CircuitBreakerLayer, Config};
///
/// let layer = CircuitBreakerLayer::new(Config::default()).classify(StreamingHttp::new());
/// // Or, for an upstream whose `Retry-After` is not to be trusted:
/// let layer = CircuitBreakerLayer::new(Config::default())
///     .classify(StreamingHttp::new().ignore_retry_after());
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamingHttp {
    head: HttpClassifier,
}

impl StreamingHttp {
    /// Judges heads as [`HttpClassifier::new`] does, `Retry-After`
    /// included.
    pub const fn new() -> Self {
        StreamingHttp {
            head: HttpClassifier::new(),
        }
    }

    /// Never reads `Retry-After` nor `retry-after-ms`, as
    /// [`HttpClassifier::ignore_retry_after`].
    pub const fn ignore_retry_after(mut self) -> Self {
        self.head = self.head.ignore_retry_after();
        self
    }

    /// Never reads the providers' rate-limit reset headers, as
    /// [`HttpClassifier::ignore_reset_headers`].
    pub const fn ignore_reset_headers(mut self) -> Self {
        self.head = self.head.ignore_reset_headers();
        self
    }
}

impl<B, E> Classify<Response<B>, E> for StreamingHttp {
    /// A success, given when the body ends well.
    type Eos = Verdict;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<Verdict> {
        let verdict = Classify::<Response<B>, E>::classify(&self.head, result).at_head();
        match verdict.outcome() {
            Outcome::Success => Classified::AtEndOfStream(verdict),
            _ => Classified::Ready(verdict),
        }
    }
}
