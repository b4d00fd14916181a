//! HTTP with streamed bodies (feature `http-body`): responses whose outcome
//! is only known once the body has been read through, such as server-sent
//! events.

use http::{header, HeaderMap, Response};

use super::scan::RetryDelayScan;
use super::{Classified, Classify, ClassifyEos, HttpClassifier, Outcome, Verdict};

/// The largest error body read for a `retryDelay`: a body of known length
/// (`content-length`) no longer than this.
const ERROR_BODY_LIMIT: u64 = 16 * 1024;

/// HTTP with streamed bodies (server-sent events, chunked completions):
/// statuses are judged as [`HttpClassifier`] does, at once; a response that
/// looks successful succeeds only if its body ends without an error.
///
/// On a failing status whose headers give no wait, a small JSON error body
/// is read as it passes for Google's `RetryInfo.retryDelay` (Gemini's
/// `"retryDelay": "52s"`): only a body of known length (`content-length`,
/// at most 16 KiB) whose `content-type` says JSON, never a stream. The
/// failure is recorded when that body ends (with the delay as its hint) or
/// is dropped (without one). [`ignore_retry_delay`](Self::ignore_retry_delay)
/// turns that off.
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
    ignore_retry_delay: bool,
}

impl StreamingHttp {
    /// Judges heads as [`HttpClassifier::new`] does, `Retry-After`
    /// included, and reads a small error body's `retryDelay`.
    pub const fn new() -> Self {
        StreamingHttp {
            head: HttpClassifier::new(),
            ignore_retry_delay: false,
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

    /// Never reads an error body's `retryDelay`: a failing status is
    /// recorded at once, with the headers' hint if any.
    pub const fn ignore_retry_delay(mut self) -> Self {
        self.ignore_retry_delay = true;
        self
    }

    /// Whether `response`'s body is a small JSON error body worth reading
    /// for a `retryDelay`.
    fn reads_error_body<B>(&self, response: &Response<B>, verdict: &Verdict) -> bool {
        if self.ignore_retry_delay
            || verdict.outcome() != Outcome::Failure
            || verdict.retry_after().is_some()
        {
            return false;
        }
        let headers = response.headers();
        let small = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .is_some_and(|len| len > 0 && len <= ERROR_BODY_LIMIT);
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("json"));
        small && json
    }
}

impl<B, E> Classify<Response<B>, E> for StreamingHttp {
    /// A success given when the body ends well, or a failure waiting for
    /// its error body's `retryDelay`.
    type Eos = HttpEos;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<HttpEos> {
        let verdict = self.head.verdict(result);
        match (verdict.outcome(), result) {
            (Outcome::Success, _) => Classified::AtEndOfStream(HttpEos {
                verdict,
                delay: None,
            }),
            (Outcome::Failure, Ok(response)) if self.reads_error_body(response, &verdict) => {
                Classified::AtEndOfStream(HttpEos {
                    verdict,
                    delay: Some(Box::default()),
                })
            }
            _ => Classified::Ready(verdict),
        }
    }

    /// A failing status is a failure at its head, whether or not its body
    /// is read for a hint.
    fn classify_head(&self, result: Result<&Response<B>, &E>) -> Verdict {
        self.head.verdict(result)
    }
}

/// How [`StreamingHttp`] judges a body at its end: a success when it ends
/// well; for a failing status's small JSON body, the failure, with the
/// body's `retryDelay` as its hint if it has one.
#[derive(Clone, Debug)]
pub struct HttpEos {
    verdict: Verdict,
    /// Reading an error body for its delay (boxed: rare, and the judge of
    /// every successful stream stays two words).
    delay: Option<Box<RetryDelayScan>>,
}

impl ClassifyEos for HttpEos {
    const READS_DATA: bool = true;

    #[inline]
    fn classify_data(&mut self, data: &[u8]) -> Option<Verdict> {
        if let Some(scan) = &mut self.delay {
            scan.feed(data);
        }
        None
    }

    fn classify_eos(self, _: Option<&HeaderMap>) -> Verdict {
        match self.delay.and_then(|scan| scan.delay()) {
            Some(delay) => self.verdict.with_retry_after(delay),
            None => self.verdict,
        }
    }

    fn classify_body_error(self) -> Verdict {
        match self.verdict.outcome() {
            Outcome::Failure => self.verdict,
            _ => Verdict::failure(super::FailureClass::Stream),
        }
    }

    fn classify_dropped(self) -> Option<Verdict> {
        // A failing status is a failure whether or not its body is read.
        (self.verdict.outcome() == Outcome::Failure).then_some(self.verdict)
    }
}
