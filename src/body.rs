//! Streamed response bodies (feature `http-body`): the outcome of a call is
//! recorded when its body ends, fails, or is dropped.
//!
//! A breaker made by [`CircuitBreakerLayer::streaming`] answers with
//! `http::Response<BreakerBody<B, _>>`. When its classifier can only judge
//! at the end of the stream (a server-sent event stream, a gRPC call whose status comes in
//! the trailers), the body carries the call's pending verdict and records:
//!
//! * when the body ends (all data read, trailers included): the end-of-stream
//!   classifier decides, from the trailers;
//! * when the body fails midway: a failure;
//! * when the inner body or the end-of-stream classifier panics: a
//!   failure, and the panic goes on to the reader;
//! * when the body is dropped before its end (the caller walked away):
//!   cancelled ([`Counts::cancelled`](crate::Counts::cancelled)), counting
//!   neither way.
//!
//! A body has ended when its inner body returns `None` or its trailers, and
//! also as soon as the inner body reports
//! [`is_end_stream`](http_body::Body::is_end_stream): hyper's servers
//! (HTTP/1 and HTTP/2, and so axum's and tonic's) stop reading a body they
//! send there, and drop it without asking for its `None`. A gateway that
//! streams an upstream's answer to its own client therefore counts each
//! call as the end of its stream says, never as ignored.
//!
//! A half-open probe keeps its permit until then, so a stream that dies
//! halfway can never count as a successful probe.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_service::Service;

use tower_layer::Layer;

use crate::breaker::Breaker;
use crate::classify::{Classified, ClassifyEos, ClassifyResponse, Outcome, Verdict};
use crate::error::{CircuitOpen, HoldsCircuitOpen};
use crate::future::{Judgement, Obligation, ResponseFuture};
use crate::layer::CircuitBreakerLayer;
use crate::service::{CircuitBreaker, Readiness};

pin_project! {
    /// A response body that records its call's outcome when it ends.
    ///
    /// It has ended when its inner body returns `None` or its trailers, or
    /// reports [`is_end_stream`](Body::is_end_stream) (hyper's servers stop
    /// reading there, and drop the body without asking for the `None`):
    /// checked after each frame it returns, when it is made, and when it
    /// is dropped. Whichever comes first records, once.
    ///
    /// A panic in the inner body or in the end-of-stream classifier is a
    /// failure: recorded (a probe's permit goes back), then resumed to
    /// whoever was reading, or dropping, the body (unless it is dropped
    /// while its thread already unwinds: a second panic would abort).
    pub struct BreakerBody<B, Eos> {
        #[pin]
        inner: B,
        pending: Option<(Eos, Obligation)>,
        // `settle_if_ended::<B, Eos>`, kept here because `Drop` cannot ask
        // for `B: Body`, which it needs to tell an ended body from one
        // abandoned midway.
        on_drop: fn(&B, &mut Option<(Eos, Obligation)>) -> Result<(), Panic>,
    }

    impl<B, Eos> PinnedDrop for BreakerBody<B, Eos> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.pending.is_none() {
                return;
            }
            if let Err(panic) = (*this.on_drop)(this.inner.as_ref().get_ref(), this.pending) {
                // Already unwinding, a panic leaving `drop` would abort the
                // process; the failure is recorded either way.
                if !std::thread::panicking() {
                    resume_unwind(panic);
                }
            }
        }
    }
}

impl<B, Eos> BreakerBody<B, Eos> {
    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Whether the call's outcome is still to be recorded.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

/// A caught panic, to be resumed once the call is recorded.
type Panic = Box<dyn Any + Send>;

/// Records the end-of-stream verdict if `inner` reports its end; left
/// pending otherwise (dropped, the obligation counts the call as ignored).
fn settle_if_ended<B: Body, Eos: ClassifyEos>(
    inner: &B,
    pending: &mut Option<(Eos, Obligation)>,
) -> Result<(), Panic> {
    if pending.is_none() {
        return Ok(());
    }
    match catch_unwind(AssertUnwindSafe(|| inner.is_end_stream())) {
        Ok(true) => settle(pending, |eos| eos.classify_eos(None)),
        Ok(false) => Ok(()),
        Err(panic) => {
            fail(pending);
            Err(panic)
        }
    }
}

/// Records the verdict `judge` gives, once. A panic in `judge` records a
/// failure and is handed back, to be resumed.
fn settle<Eos: ClassifyEos>(
    pending: &mut Option<(Eos, Obligation)>,
    judge: impl FnOnce(Eos) -> Verdict,
) -> Result<(), Panic> {
    let Some((eos, obligation)) = pending.take() else {
        return Ok(());
    };
    match catch_unwind(AssertUnwindSafe(|| judge(eos))) {
        Ok(verdict) => {
            obligation.settle(verdict);
            Ok(())
        }
        Err(panic) => {
            obligation.settle(Verdict::new(Outcome::Failure));
            Err(panic)
        }
    }
}

/// Records a failure, if nothing is recorded yet.
fn fail<Eos>(pending: &mut Option<(Eos, Obligation)>) {
    if let Some((_, obligation)) = pending.take() {
        obligation.settle(Verdict::new(Outcome::Failure));
    }
}

impl<B: Body, Eos: ClassifyEos> BreakerBody<B, Eos> {
    fn new(inner: B, mut pending: Option<(Eos, Obligation)>) -> Self {
        // An empty body may never be polled: it has ended already.
        if let Err(panic) = settle_if_ended(&inner, &mut pending) {
            resume_unwind(panic);
        }
        BreakerBody {
            inner,
            pending,
            on_drop: settle_if_ended::<B, Eos>,
        }
    }
}

impl<B: Body, Eos: ClassifyEos> Body for BreakerBody<B, Eos> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if this.pending.is_none() {
            // Judged already: nothing left to record.
            return this.inner.poll_frame(cx);
        }
        let frame = match catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll_frame(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(frame)) => frame,
            Err(panic) => {
                fail(this.pending);
                resume_unwind(panic)
            }
        };
        let settled = match &frame {
            Some(Ok(frame)) => match frame.trailers_ref() {
                Some(trailers) => settle(this.pending, |eos| eos.classify_eos(Some(trailers))),
                // A reader may stop at the end the body reports, without
                // asking for the `None`: judge the call before handing
                // the last frame over.
                None => settle_if_ended(this.inner.as_ref().get_ref(), this.pending),
            },
            Some(Err(_)) => settle(this.pending, ClassifyEos::classify_body_error),
            None => settle(this.pending, |eos| eos.classify_eos(None)),
        };
        if let Err(panic) = settled {
            resume_unwind(panic);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: std::fmt::Debug, Eos> std::fmt::Debug for BreakerBody<B, Eos> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerBody")
            .field("inner", &self.inner)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

/// Wraps services in a [`StreamingBreaker`]: made by
/// [`CircuitBreakerLayer::streaming`]. Every service it wraps shares one
/// breaker.
///
/// ```
/// use tower_circuit_breaker::{classify::StreamingHttp, CircuitBreakerLayer, Config};
///
/// let layer = CircuitBreakerLayer::new(Config::default()).streaming(StreamingHttp::new());
/// let breaker = layer.breaker();
/// # let _ = breaker;
/// ```
#[derive(Clone, Debug)]
pub struct StreamingLayer<C> {
    breaker: Breaker,
    classifier: C,
    mode: Readiness,
}

impl CircuitBreakerLayer {
    /// A layer for services answering `http::Response`s whose outcome may
    /// be known only at the end of the body: `classifier` (a
    /// [`ClassifyResponse`], such as [`StreamingHttp`](crate::classify::StreamingHttp)
    /// or [`GrpcClassifier`](crate::classify::GrpcClassifier)) judges the
    /// head, and a [`BreakerBody`] records at the end of the stream.
    pub fn streaming<C>(self, classifier: C) -> StreamingLayer<C> {
        StreamingLayer {
            breaker: self.breaker(),
            classifier,
            mode: self.mode(),
        }
    }
}

impl<C> StreamingLayer<C> {
    /// Sets how wrapped services answer `poll_ready` while the breaker will
    /// not admit a call (see [`Readiness`]).
    pub fn readiness(mut self, mode: Readiness) -> Self {
        self.mode = mode;
        self
    }

    /// A handle to the breaker every wrapped service shares.
    pub fn breaker(&self) -> Breaker {
        self.breaker.clone()
    }
}

impl<S, C: Clone> Layer<S> for StreamingLayer<C> {
    type Service = StreamingBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamingBreaker {
            inner: CircuitBreaker::with_classifier(inner, &self.breaker, self.classifier.clone())
                .readiness(self.mode),
        }
    }
}

/// A circuit breaker for services answering `http::Response<B>`, recording
/// each call's outcome when its body ends (see the [module docs](self)).
/// Admission, readiness and refusals are [`CircuitBreaker`]'s.
pub struct StreamingBreaker<S, C> {
    inner: CircuitBreaker<S, C>,
}

impl<S, C> StreamingBreaker<S, C> {
    /// A handle to the breaker.
    pub fn breaker(&self) -> Breaker {
        self.inner.breaker()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }
}

impl<S: Clone, C: Clone> Clone for StreamingBreaker<S, C> {
    fn clone(&self) -> Self {
        StreamingBreaker {
            inner: self.inner.clone(),
        }
    }
}

impl<S: std::fmt::Debug, C> std::fmt::Debug for StreamingBreaker<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingBreaker")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, C, Req, B> Service<Req> for StreamingBreaker<S, C>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: HoldsCircuitOpen,
    C: ClassifyResponse<B, S::Error> + Clone,
    B: Body,
{
    type Response = Response<BreakerBody<B, C::Eos>>;
    type Error = S::Error;
    type Future = StreamingFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.admit_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        StreamingFuture {
            inner: self.inner.admit_call(req),
        }
    }
}

pin_project! {
    /// Response future of [`StreamingBreaker`].
    pub struct StreamingFuture<F, C> {
        #[pin]
        inner: ResponseFuture<F, C>,
    }
}

impl<F, C, B, E> Future for StreamingFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: From<CircuitOpen>,
    C: ClassifyResponse<B, E>,
    B: Body,
{
    type Output = Result<Response<BreakerBody<B, C::Eos>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll_with(
            cx,
            |classifier, result| match classifier.classify_response(result) {
                Classified::Ready(verdict) => Judgement::Now(verdict),
                Classified::AtEndOfStream(eos) => Judgement::Later(eos),
            },
            |output, pending| output.map(|response| response.map(|b| BreakerBody::new(b, pending))),
        )
    }
}
