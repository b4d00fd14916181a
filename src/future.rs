//! The response future: records the call's outcome when it completes.

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::breaker::admission::Permit;
use crate::breaker::shared::Shared;
use crate::classify::{Classify, Outcome, Verdict};
use crate::error::CircuitOpen;
use crate::local::Lease;

/// How a response future holds its breaker and classifier until the
/// outcome is in.
pub(crate) enum Hold<C> {
    /// A lease on the calling service clone's own handle: one atomic
    /// operation per call, on a line no other clone writes (a clone that
    /// makes more than one call).
    Leased(Lease<C>),
    /// A reference to the breaker and a copy of the classifier (a clone
    /// serving a single request, which makes no handle of its own).
    Direct { shared: Arc<Shared>, classifier: C },
}

impl<C> Hold<C> {
    #[inline]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        match self {
            Hold::Leased(lease) => &lease.shared,
            Hold::Direct { shared, .. } => shared,
        }
    }

    #[inline]
    pub(crate) fn classifier(&self) -> &C {
        match self {
            Hold::Leased(lease) => &lease.classifier,
            Hold::Direct { classifier, .. } => classifier,
        }
    }
}

/// What a call's outcome feeds, once it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// The trip policy (closed) or the probe's permit (half-open).
    Policy,
    /// Only the breaker's counts (held closed by an operator).
    CountOnly,
    /// Nothing: disabled, passed by shadow mode, or already recorded.
    Nothing,
}

impl Record {
    /// Takes what a verdict feeds, leaving `Nothing` for any later one:
    /// `None` if it feeds nothing, or whether it feeds only the counts.
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<bool> {
        if *self == Record::Nothing {
            return None;
        }
        let count_only = *self == Record::CountOnly;
        *self = Record::Nothing;
        Some(count_only)
    }
}

/// Records a call's verdict: in the closed generation that admitted it, or
/// as a probe through its permit.
#[inline]
pub(crate) fn record(
    shared: &Shared,
    generation: u32,
    permit: &mut Option<Box<Permit>>,
    verdict: Verdict,
    start: Option<Instant>,
    count_only: bool,
) {
    // The common case, decided here rather than behind a call: a
    // closed-state success that no policy needs (no time, no permit).
    if !count_only
        && start.is_none()
        && permit.is_none()
        && verdict.outcome() == Outcome::Success
        && shared.success_is_quiet()
    {
        return;
    }
    record_slow(shared, generation, permit, verdict, start, count_only);
}

/// [`record`] past its common case.
fn record_slow(
    shared: &Shared,
    generation: u32,
    permit: &mut Option<Box<Permit>>,
    verdict: Verdict,
    start: Option<Instant>,
    count_only: bool,
) {
    if count_only {
        shared.count_outcome(verdict.outcome());
        return;
    }
    match permit.take().map(|permit| *permit) {
        None => shared.record_closed(
            generation,
            verdict.outcome(),
            verdict.retry_after(),
            // One clock read gives both the latency and the time to record
            // it at.
            start.map(|start| {
                let end = Instant::now();
                (end.saturating_duration_since(start), end)
            }),
        ),
        Some(permit) => match verdict.outcome() {
            Outcome::Success => permit.succeed(),
            Outcome::Failure => permit.fail(verdict.retry_after()),
            Outcome::Ignore => {
                shared.record_closed(generation, Outcome::Ignore, None, None);
                drop(permit);
            }
        },
    }
}

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker).
    ///
    /// Resolves to the inner service's result, or at once to a
    /// [`CircuitOpen`] error when the breaker refused the call. Dropping it
    /// before it completes gives back a probe permit and counts the call as
    /// cancelled ([`Counts::cancelled`](crate::Counts::cancelled)), neither
    /// a success nor a failure.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }

    impl<F, C> PinnedDrop for ResponseFuture<F, C> {
        fn drop(this: Pin<&mut Self>) {
            if let KindProj::Called { hold, record, .. } = this.project().kind.project() {
                // Dropped before its outcome was known; the permit, if
                // any, goes back as the field drops.
                if *record != Record::Nothing {
                    hold.shared().count_cancelled();
                }
            }
        }
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            future: F,
            hold: Hold<C>,
            // The closed generation that admitted the call (probes: the
            // half-open one), and a probe's permit (boxed: probes are rare,
            // and every call moves this future). Each field is written
            // where it lives: building an enum and moving it here costs a
            // store-forwarding stall on the hot path.
            generation: u32,
            permit: Option<Box<Permit>>,
            record: Record,
            start: Option<Instant>,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    #[inline]
    pub(crate) fn called(
        future: F,
        hold: Hold<C>,
        generation: u32,
        permit: Option<Box<Permit>>,
        start: Option<Instant>,
        record: Record,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                hold,
                generation,
                permit,
                record,
                start,
            },
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: From<CircuitOpen>,
    C: Classify<T, E>,
{
    type Output = Result<T, E>;

    // Not `poll_with`: the closed-state hot path keeps the output where the
    // inner future left it and classifies it by reference, without the
    // moves a shaping step costs (measured: several nanoseconds per call).
    // Its first half repeats `poll_with`'s on purpose: sharing it through a
    // helper that hands the output on, by return or to a closure, measured
    // 1 to 2 ns slower per closed call.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(E::from(error))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Called {
                future,
                hold,
                generation,
                permit,
                record: what,
                start,
            } => {
                let polled = catch_unwind(AssertUnwindSafe(|| future.poll(cx)));
                let mut recorder = Recorder {
                    shared: hold.shared(),
                    generation: *generation,
                    permit,
                    what,
                    start: *start,
                };
                let output = match polled {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        recorder.record(Verdict::new(Outcome::Failure));
                        resume_unwind(panic)
                    }
                };
                if recorder.is_recording() {
                    let classifier = hold.classifier();
                    let verdict =
                        catch_unwind(AssertUnwindSafe(|| classifier.classify(output.as_ref())))
                            .unwrap_or_else(|panic| {
                                recorder.record(Verdict::new(Outcome::Failure));
                                resume_unwind(panic)
                            });
                    recorder.record(verdict);
                }
                Poll::Ready(output)
            }
        }
    }
}

/// What a classifier says about a completed call: the verdict, or that it
/// comes later (at the end of a streamed body) from `P`.
#[cfg_attr(not(feature = "http-body"), allow(dead_code))]
pub(crate) enum Judgement<P> {
    Now(Verdict),
    Later(P),
}

impl<F, C> ResponseFuture<F, C> {
    /// Polls the inner future, for classifiers that may judge later (the
    /// streaming ones). When it completes, `judge` looks at the
    /// output (by reference, where it lies) and its verdict is recorded, or,
    /// for a verdict that comes later, handed to `shape` with the obligation
    /// to record it; `shape` makes what the caller gets. A panic in the inner
    /// future or in `judge` is a failure: recorded (a probe permit goes
    /// back), then resumed.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn poll_with<T, E, P, O>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        judge: impl FnOnce(&C, Result<&T, &E>) -> Judgement<P>,
        shape: impl FnOnce(Result<T, E>, Option<(P, Obligation)>) -> Result<O, E>,
    ) -> Poll<Result<O, E>>
    where
        F: Future<Output = Result<T, E>>,
        E: From<CircuitOpen>,
    {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(E::from(error))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Called {
                future,
                hold,
                generation,
                permit,
                record: what,
                start,
            } => {
                let polled = catch_unwind(AssertUnwindSafe(|| future.poll(cx)));
                let mut recorder = Recorder {
                    shared: hold.shared(),
                    generation: *generation,
                    permit,
                    what,
                    start: *start,
                };
                let output = match polled {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        recorder.record(Verdict::new(Outcome::Failure));
                        resume_unwind(panic)
                    }
                };
                let mut later = None;
                if recorder.is_recording() {
                    let classifier = hold.classifier();
                    match catch_unwind(AssertUnwindSafe(|| judge(classifier, output.as_ref()))) {
                        Ok(Judgement::Now(verdict)) => recorder.record(verdict),
                        Ok(Judgement::Later(eos)) => later = recorder.defer().map(|o| (eos, o)),
                        Err(panic) => {
                            recorder.record(Verdict::new(Outcome::Failure));
                            resume_unwind(panic)
                        }
                    }
                }
                Poll::Ready(shape(output, later))
            }
        }
    }
}

/// Where a completed call's verdict goes: recorded at once, or handed on to
/// a response body as an [`Obligation`].
pub(crate) struct Recorder<'a> {
    shared: &'a Arc<Shared>,
    generation: u32,
    permit: &'a mut Option<Box<Permit>>,
    what: &'a mut Record,
    start: Option<Instant>,
}

impl Recorder<'_> {
    /// Whether a verdict is still wanted (not disabled, not yet recorded).
    #[inline]
    pub(crate) fn is_recording(&self) -> bool {
        *self.what != Record::Nothing
    }

    /// Records `verdict`, once.
    #[inline]
    pub(crate) fn record(&mut self, verdict: Verdict) {
        let Some(count_only) = self.what.take() else {
            return;
        };
        record(
            self.shared,
            self.generation,
            self.permit,
            verdict,
            self.start,
            count_only,
        );
    }

    /// Hands the recording on: the returned obligation records later, and
    /// counts the call as cancelled if dropped before it does.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn defer(&mut self) -> Option<Obligation> {
        if *self.what == Record::Nothing {
            return None;
        }
        let what = std::mem::replace(self.what, Record::Nothing);
        Some(Obligation {
            shared: Arc::clone(self.shared),
            generation: self.generation,
            permit: self.permit.take(),
            what,
            start: self.start,
        })
    }
}

/// A call whose verdict is not known yet (a streamed response body): it
/// holds the call's generation and probe permit until it is settled. Dropped
/// unsettled, the call counts as cancelled and its permit goes back.
pub(crate) struct Obligation {
    shared: Arc<Shared>,
    generation: u32,
    permit: Option<Box<Permit>>,
    what: Record,
    start: Option<Instant>,
}

impl Obligation {
    /// Records the verdict.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn settle(mut self, verdict: Verdict) {
        let Some(count_only) = self.what.take() else {
            return;
        };
        record(
            &self.shared,
            self.generation,
            &mut self.permit,
            verdict,
            self.start,
            count_only,
        );
    }
}

impl Drop for Obligation {
    fn drop(&mut self) {
        // The caller walked away before the end: says nothing of the
        // upstream's health. A cancellation; the permit goes back as the
        // field drops.
        if self.what != Record::Nothing {
            self.what = Record::Nothing;
            self.shared.count_cancelled();
        }
    }
}

impl fmt::Debug for Obligation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Obligation")
            .field("breaker", self.shared.name())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}
