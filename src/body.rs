//! Streamed response bodies (feature `http-body`): the outcome of a call is
//! recorded when its body ends, fails, or is dropped.
//!
//! A breaker whose classifier can defer to the end of the body (its
//! [`Eos`](crate::classify::Classify::Eos) is a [`ClassifyEos`], as for
//! [`StreamingHttp`](crate::classify::StreamingHttp) and
//! [`GrpcClassifier`](crate::classify::GrpcClassifier)) answers with
//! `http::Response<BreakerBody<B, _>>`, whether it is one breaker or a
//! keyed one. When the classifier defers (a server-sent event stream, a
//! gRPC call whose status comes in the trailers), the body carries the
//! call's pending verdict and records:
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
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::classify::{ClassifyEos, Outcome, Verdict};
use crate::future::{Finish, Obligation};

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
/// pending otherwise (dropped, the obligation counts the call as cancelled).
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

impl<B: Body, Eos: ClassifyEos> Finish<Response<B>> for Eos {
    type Response = Response<BreakerBody<B, Eos>>;

    #[allow(private_interfaces)]
    fn finish(response: Response<B>, later: Option<(Eos, Obligation)>) -> Self::Response {
        response.map(|body| BreakerBody::new(body, later))
    }
}
