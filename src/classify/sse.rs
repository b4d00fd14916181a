//! Errors inside a `200`: a judge of server-sent events that reads each data
//! frame as it passes and fails the call at the first error event.

use http::{header, Response};

use super::scan::SseScan;
use super::{Classified, Classify, ClassifyEos, FailureClass, HeaderMap, StreamingHttp, Verdict};

/// A classifier of streamed responses that also fails a call whose
/// server-sent events carry an error: an `event: error` event (Anthropic's
/// `overloaded_error`, OpenAI's Responses API), or a `data:` line whose JSON
/// has a top-level `error` (OpenAI-compatible servers that fail midway:
/// `data: {"error": {...}}`), across frame boundaries (a line split over two
/// chunks). The call counts as a failure of class
/// [`Stream`](FailureClass::Stream) the moment the event passes; the reader
/// still gets every frame, the error event included, and the rest of the
/// body passes untouched.
///
/// It wraps the classifier that judges everything else
/// ([`StreamingHttp`] by default: statuses, hints, the end of the body), and
/// reads only bodies that classifier defers to their end whose
/// `content-type` is `text/event-stream` (or absent). It holds a few bytes
/// of state per body, never a frame: nothing is buffered or copied. A
/// breaker without it reads no frame.
///
/// ```
/// use tower_circuit_breaker::classify::{SseErrors, StreamingHttp};
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config};
///
/// let layer = CircuitBreakerLayer::new(Config::model_router().build()?)
///     .classify(StreamingHttp::new().sse_errors());
/// // The same: SseErrors::new(StreamingHttp::new()).
/// # let _ = layer;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SseErrors<C = StreamingHttp> {
    inner: C,
}

impl<C> SseErrors<C> {
    /// Reads the events of the bodies `inner` defers to their end.
    pub const fn new(inner: C) -> Self {
        SseErrors { inner }
    }

    /// The classifier it wraps.
    pub fn get_ref(&self) -> &C {
        &self.inner
    }
}

impl StreamingHttp {
    /// This classifier, with its server-sent events read for errors: see
    /// [`SseErrors`].
    pub const fn sse_errors(self) -> SseErrors<Self> {
        SseErrors::new(self)
    }
}

impl<B, E, C> Classify<Response<B>, E> for SseErrors<C>
where
    C: Classify<Response<B>, E>,
    C::Eos: ClassifyEos,
{
    type Eos = SseJudge<C::Eos>;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<Self::Eos> {
        match self.inner.classify(result) {
            Classified::Ready(verdict) => Classified::Ready(verdict),
            Classified::AtEndOfStream(inner) => {
                let events = result.is_ok_and(|response| {
                    response
                        .headers()
                        .get(header::CONTENT_TYPE)
                        .is_none_or(|v| v.as_bytes().starts_with(b"text/event-stream"))
                });
                Classified::AtEndOfStream(SseJudge {
                    inner,
                    scan: events.then(SseScan::default),
                })
            }
        }
    }

    fn classify_head(&self, result: Result<&Response<B>, &E>) -> Verdict {
        self.inner.classify_head(result)
    }
}

/// The judge [`SseErrors`] hands a streamed body: it reads the events as
/// they pass, and leaves the end to the judge it wraps.
#[derive(Clone, Debug)]
pub struct SseJudge<J> {
    inner: J,
    /// `None` for a body that is no event stream.
    scan: Option<SseScan>,
}

impl<J: ClassifyEos> ClassifyEos for SseJudge<J> {
    const READS_DATA: bool = true;

    #[inline]
    fn classify_data(&mut self, data: &[u8]) -> Option<Verdict> {
        if let Some(scan) = &mut self.scan {
            if scan.feed(data) {
                return Some(Verdict::failure(FailureClass::Stream));
            }
        }
        if J::READS_DATA {
            return self.inner.classify_data(data);
        }
        None
    }

    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Verdict {
        self.inner.classify_eos(trailers)
    }

    fn classify_body_error(self) -> Verdict {
        self.inner.classify_body_error()
    }

    fn classify_dropped(self) -> Option<Verdict> {
        self.inner.classify_dropped()
    }
}
