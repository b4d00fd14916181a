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
//!
//! # Limits
//!
//! A provider may answer `200` and then freeze, or take a minute to its
//! first token. A breaker's
//! [`first_frame_timeout`](crate::ConfigBuilder::first_frame_timeout) (from
//! the head to the first data frame) and
//! [`frame_idle_timeout`](crate::ConfigBuilder::frame_idle_timeout)
//! (between data frames) bound that: past either, the body ends for its
//! reader with a [`StreamTimeout`] (as its `BoxError`; nothing more is read
//! from it) and the call counts as a failure. The limits cost one timer per
//! body, made when the body is, reset (never remade) on each data frame; a
//! breaker without limits makes none. They need tokio's timer, as gate mode
//! does, and hold while the call is still to be recorded (not for a body
//! already judged, nor through a disabled breaker).

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::BoxError;

use crate::classify::{ClassifyEos, FailureClass, Verdict};
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
        // The stream's limits while its call is to be recorded: made once
        // per body, reset (not remade) on each data frame.
        limits: Option<Box<Limits>>,
        // Ended for its reader by a limit: nothing more is read.
        timed_out: bool,
        // A breaker's latency runs to the first data frame, still to come.
        awaits_first_frame: bool,
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

/// A streamed body's limits: one timer, to the first data frame or to the
/// end of the current silence.
struct Limits {
    sleep: Pin<Box<Sleep>>,
    first_frame: Option<Duration>,
    idle: Option<Duration>,
    seen_data: bool,
    breaker: Arc<str>,
}

impl Limits {
    /// The limits `obligation`'s breaker sets, if any.
    fn of(obligation: &Obligation) -> Option<Box<Limits>> {
        let shared = obligation.breaker();
        let (first_frame, idle) = shared.stream_limits();
        let first = first_frame.or(idle)?;
        Some(Box::new(Limits {
            sleep: Box::pin(tokio::time::sleep(first)),
            first_frame,
            idle,
            seen_data: false,
            breaker: Arc::clone(shared.name()),
        }))
    }

    /// A data frame came: the silence starts again, or, without an idle
    /// limit, the limits are done with.
    fn data(limits: &mut Option<Box<Limits>>) {
        if let Some(l) = limits {
            match l.idle {
                Some(idle) => {
                    l.seen_data = true;
                    l.sleep.as_mut().reset(Instant::now() + idle);
                }
                None => *limits = None,
            }
        }
    }

    /// The error the reader gets when the limit passed.
    fn expired(&self) -> StreamTimeout {
        let (first_frame, limit) = match (self.seen_data, self.first_frame) {
            (false, Some(first)) => (true, first),
            _ => (!self.seen_data, self.idle.unwrap_or_default()),
        };
        StreamTimeout {
            breaker: Arc::clone(&self.breaker),
            first_frame,
            limit,
        }
    }
}

/// A streamed body went past one of its breaker's limits
/// ([`first_frame_timeout`](crate::ConfigBuilder::first_frame_timeout),
/// [`frame_idle_timeout`](crate::ConfigBuilder::frame_idle_timeout)): it
/// ends for its reader with this error (inside the body's `BoxError`), and
/// its call counts as a failure.
///
/// ```
/// use std::time::Duration;
/// use tower::BoxError;
/// use tower_circuit_breaker::body::StreamTimeout;
///
/// fn frozen(err: &BoxError) -> Option<Duration> {
///     err.downcast_ref::<StreamTimeout>().map(StreamTimeout::limit)
/// }
/// # let _ = frozen;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamTimeout {
    breaker: Arc<str>,
    first_frame: bool,
    limit: Duration,
}

impl StreamTimeout {
    /// The breaker whose limit it was.
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// Whether no data frame had come yet (the first-frame limit), rather
    /// than a silence between two.
    pub fn is_first_frame(&self) -> bool {
        self.first_frame
    }

    /// The limit that passed.
    pub fn limit(&self) -> Duration {
        self.limit
    }
}

impl std::fmt::Display for StreamTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.first_frame {
            "sent no data frame"
        } else {
            "stalled between data frames"
        };
        write!(
            f,
            "the stream through circuit breaker `{}` {what} for {:?}",
            self.breaker, self.limit
        )
    }
}

impl std::error::Error for StreamTimeout {}

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

/// On drop: records the end-of-stream verdict if `inner` reports its end,
/// else what the judge says of a body left midway (by default nothing: the
/// obligation, dropped, counts the call as cancelled).
fn settle_on_drop<B: Body, Eos: ClassifyEos>(
    inner: &B,
    pending: &mut Option<(Eos, Obligation)>,
) -> Result<(), Panic> {
    settle_if_ended(inner, pending)?;
    let Some((eos, obligation)) = pending.take() else {
        return Ok(());
    };
    match catch_unwind(AssertUnwindSafe(|| eos.classify_dropped())) {
        Ok(Some(verdict)) => {
            obligation.settle(verdict);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(panic) => {
            obligation.settle(Verdict::failure(FailureClass::Stream));
            Err(panic)
        }
    }
}

/// Shows a data frame to a judge that reads data, piece by contiguous
/// piece, in order: the verdict it gives, if any. Nothing is copied; a
/// buffer split into more than [`PIECES`] pieces shows its first ones.
fn judge_data<D: Buf, Eos: ClassifyEos>(data: &D, eos: &mut Eos) -> Option<Verdict> {
    let chunk = data.chunk();
    if chunk.len() == data.remaining() {
        // One piece: every body hyper, axum or tonic hands on (`Bytes`).
        return eos.classify_data(chunk);
    }
    let mut pieces = [std::io::IoSlice::new(&[]); PIECES];
    let filled = data.chunks_vectored(&mut pieces);
    pieces[..filled]
        .iter()
        .find_map(|piece| eos.classify_data(piece))
}

/// The most pieces of one split data frame shown to a judge.
const PIECES: usize = 64;

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
            obligation.settle(Verdict::failure(FailureClass::Stream));
            Err(panic)
        }
    }
}

/// Shows `data` to the pending judge; a verdict it gives is recorded now.
fn judge<D: Buf, Eos: ClassifyEos>(
    pending: &mut Option<(Eos, Obligation)>,
    data: &D,
) -> Result<(), Panic> {
    let Some((eos, _)) = pending.as_mut() else {
        return Ok(());
    };
    match catch_unwind(AssertUnwindSafe(|| judge_data(data, eos))) {
        Ok(None) => Ok(()),
        Ok(Some(verdict)) => settle(pending, |_| verdict),
        Err(panic) => {
            fail(pending);
            Err(panic)
        }
    }
}

/// Records a failure, if nothing is recorded yet.
fn fail<Eos>(pending: &mut Option<(Eos, Obligation)>) {
    if let Some((_, obligation)) = pending.take() {
        obligation.settle(Verdict::failure(FailureClass::Stream));
    }
}

impl<B: Body, Eos: ClassifyEos> BreakerBody<B, Eos> {
    fn new(inner: B, mut pending: Option<(Eos, Obligation)>) -> Self {
        // An empty body may never be polled: it has ended already.
        if let Err(panic) = settle_if_ended(&inner, &mut pending) {
            resume_unwind(panic);
        }
        let limits = pending.as_ref().and_then(|(_, o)| Limits::of(o));
        let awaits_first_frame = pending
            .as_ref()
            .is_some_and(|(_, o)| o.awaits_first_frame());
        BreakerBody {
            inner,
            pending,
            limits,
            timed_out: false,
            awaits_first_frame,
            on_drop: settle_on_drop::<B, Eos>,
        }
    }
}

impl<B, Eos> Body for BreakerBody<B, Eos>
where
    B: Body,
    B::Error: Into<BoxError>,
    Eos: ClassifyEos,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.timed_out {
            return Poll::Ready(None);
        }
        if this.pending.is_none() {
            // Judged already: nothing left to record.
            return this.inner.poll_frame(cx).map_err(Into::into);
        }
        let frame = match catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll_frame(cx))) {
            Ok(Poll::Pending) => {
                let Some(limits) = this.limits.as_mut() else {
                    return Poll::Pending;
                };
                if limits.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // Past its limit: a failure, and the end for its reader,
                // who is held no longer.
                let expired = limits.expired();
                *this.limits = None;
                *this.timed_out = true;
                fail(this.pending);
                return Poll::Ready(Some(Err(expired.into())));
            }
            Ok(Poll::Ready(frame)) => frame,
            Err(panic) => {
                fail(this.pending);
                resume_unwind(panic)
            }
        };
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            Limits::data(this.limits);
            if std::mem::take(this.awaits_first_frame) {
                if let Some((_, obligation)) = this.pending.as_mut() {
                    obligation.first_frame();
                }
            }
            // A judge of data frames sees this one before its reader does.
            if Eos::READS_DATA {
                if let Err(panic) = judge(this.pending, data) {
                    resume_unwind(panic);
                }
            }
        }
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
        if this.pending.is_none() {
            // Judged: the limits are done with.
            *this.limits = None;
        }
        Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
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

impl<B, Eos> Finish<Response<B>> for Eos
where
    B: Body,
    B::Error: Into<BoxError>,
    Eos: ClassifyEos,
{
    type Response = Response<BreakerBody<B, Eos>>;

    fn finish(response: Response<B>) -> Self::Response {
        response.map(|body| BreakerBody::new(body, None))
    }

    #[allow(private_interfaces)]
    fn defer(self, response: Response<B>, obligation: Option<Obligation>) -> Self::Response {
        let later = obligation.map(|obligation| (self, obligation));
        response.map(|body| BreakerBody::new(body, later))
    }
}
