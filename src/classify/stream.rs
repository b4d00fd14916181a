//! Classification at the end of a stream (feature `http-body`): for
//! responses whose outcome is only known once the body has been read
//! through, such as server-sent events and gRPC.

use http::{HeaderMap, Response};

use super::{HttpClassifier, Outcome, Verdict};

/// Decides about an `http::Response` when its head arrives: now, or at the
/// end of its body. In the spirit of `tower-http`'s `ClassifyResponse`.
pub trait ClassifyResponse<B, E> {
    /// Decides at the end of the body.
    type Eos: ClassifyEos;

    /// Classifies the head, or the error in place of a response.
    fn classify_response(&self, result: Result<&Response<B>, &E>) -> Classified<Self::Eos>;
}

/// What [`ClassifyResponse`] decided about a response head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classified<Eos> {
    /// The verdict is known now (a 503, a refused connection, a
    /// trailers-only gRPC error).
    Ready(Verdict),
    /// It depends on how the body ends.
    AtEndOfStream(Eos),
}

/// Decides about a streamed body when it ends.
///
/// A body that ends (all data read, trailers included) is judged by
/// [`classify_eos`](ClassifyEos::classify_eos); one that fails midway by
/// [`classify_body_error`](ClassifyEos::classify_body_error) (a failure by
/// default). A body dropped before its end (the caller walked away) counts
/// as ignored. A panic here, or in the body, counts as a failure and is
/// resumed to the body's reader.
pub trait ClassifyEos: Send + 'static {
    /// The body ended; `trailers` are its trailers, if any.
    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Verdict;

    /// The body failed before its end.
    fn classify_body_error(self) -> Verdict
    where
        Self: Sized,
    {
        Verdict::new(Outcome::Failure)
    }
}

/// HTTP with streamed bodies (server-sent events, chunked completions):
/// statuses are judged as [`HttpClassifier`] does, at once; a response that
/// looks successful succeeds only if its body ends without an error.
///
/// ```
/// use tower_circuit_breaker::{classify::StreamingHttp, CircuitBreakerLayer, Config};
///
/// let layer = CircuitBreakerLayer::new(Config::default()).streaming(StreamingHttp::new());
/// // Or, for an upstream whose `Retry-After` is not to be trusted:
/// let layer = CircuitBreakerLayer::new(Config::default())
///     .streaming(StreamingHttp::new().ignore_retry_after());
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

    /// Never reads `Retry-After`, as
    /// [`HttpClassifier::ignore_retry_after`].
    pub const fn ignore_retry_after(mut self) -> Self {
        self.head = self.head.ignore_retry_after();
        self
    }
}

/// End of stream for [`StreamingHttp`]: the body ended, so the call
/// succeeded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodyEnds;

impl ClassifyEos for BodyEnds {
    fn classify_eos(self, _: Option<&HeaderMap>) -> Verdict {
        Verdict::new(Outcome::Success)
    }
}

impl<B, E> ClassifyResponse<B, E> for StreamingHttp {
    type Eos = BodyEnds;

    fn classify_response(&self, result: Result<&Response<B>, &E>) -> Classified<BodyEnds> {
        let verdict = super::Classify::classify(&self.head, result);
        match verdict.outcome() {
            Outcome::Success => Classified::AtEndOfStream(BodyEnds),
            _ => Classified::Ready(verdict),
        }
    }
}
