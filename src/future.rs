//! The response future: records the call's outcome when it completes.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::breaker::admission::{Admission, Record};
use crate::breaker::shared::Shared;
use crate::classify::{Classified, Classify, Outcome, Verdict};
use crate::config::LatencyTo;
use crate::error::CircuitOpen;
use crate::local::Loan;

/// How a response future reaches its breaker and classifier until the
/// outcome is in.
pub(crate) enum Via<C> {
    /// A loan of the calling service clone's own handle: one atomic
    /// operation per call, on a line no other clone writes (a clone that
    /// makes more than one call).
    Loaned(Loan<C>),
    /// A reference to the breaker and a copy of the classifier (a clone
    /// serving a single request, which makes no handle of its own).
    Direct { shared: Arc<Shared>, classifier: C },
}

impl<C> Via<C> {
    #[inline(always)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        match self {
            Via::Loaned(loan) => &loan.shared,
            Via::Direct { shared, .. } => shared,
        }
    }

    #[inline(always)]
    pub(crate) fn classifier(&self) -> &C {
        match self {
            Via::Loaned(loan) => &loan.classifier,
            Via::Direct { classifier, .. } => classifier,
        }
    }
}

/// An admitted call whose outcome is not recorded yet: the breaker it was
/// admitted by, its [`Admission`], and when it started if its latency
/// counts. Dropped unrecorded, it counts as cancelled (or, once it has
/// waited the config's `cancelled_failure_after`, as a failure), and a
/// probe's permit goes back.
///
/// Made of whole words and an instant, as a [`CircuitOpen`] is, so that
/// moving a response future that may hold either copies it word by word.
#[repr(C)]
pub(crate) struct Call<C> {
    // Dropped by hand in `drop`, as the permit is taken there: a call
    // that completed drops in one inline step within the response future's
    // drop, with no drop glue per field for the optimiser to leave out of
    // line (the response future's drop as a whole may still be a call).
    via: ManuallyDrop<Via<C>>,
    start: Option<Instant>,
    // Never dropped: `drop` cancels it, which takes its permit, and what
    // is left is a word. Should `Admission` gain a field that needs
    // dropping, `drop` must drop it here.
    admission: ManuallyDrop<Admission>,
}

impl<C> Call<C> {
    #[inline(always)]
    pub(crate) fn new(via: Via<C>, admission: Admission, start: Option<Instant>) -> Self {
        Call {
            via: ManuallyDrop::new(via),
            start,
            admission: ManuallyDrop::new(admission),
        }
    }

    /// Whether a verdict is still wanted (not disabled, not yet recorded).
    #[inline(always)]
    fn is_recording(&self) -> bool {
        self.admission.feeds() != Record::Nothing
    }

    /// Records `verdict`, once.
    #[inline(always)]
    fn record(&mut self, verdict: Verdict) {
        self.admission
            .record(self.via.shared(), verdict, self.start);
    }

    /// Hands the recording on: the returned obligation records later, and
    /// counts the call as cancelled if dropped before it does.
    fn defer(&mut self) -> Option<Obligation> {
        let admission = self.admission.hand_on()?;
        Some(Obligation::one(Pending::new(
            Arc::clone(self.via.shared()),
            false,
            admission,
            self.start,
        )))
    }
}

impl<C> Drop for Call<C> {
    #[inline(always)]
    fn drop(&mut self) {
        // Recorded (every call that completed): nothing to do here.
        self.admission.cancel(self.via.shared(), self.start);
        // The permit, if there was one, went with the cancellation above:
        // nothing is left in the admission to drop.
        debug_assert!(!self.admission.holds_permit());
        // SAFETY: `via` is dropped here, once, as its `Call` goes, and
        // nothing reads it after.
        unsafe { ManuallyDrop::drop(&mut self.via) }
    }
}

/// A [`Call`] that records a failure if dropped, which happens only while
/// a panic unwinds through the poll that made it: every other path disarms
/// it.
struct FailOnUnwind<'a, C>(&'a mut Call<C>);

impl<C> FailOnUnwind<'_, C> {
    #[inline(always)]
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl<C> Drop for FailOnUnwind<'_, C> {
    #[cold]
    fn drop(&mut self) {
        self.0.record(Verdict::new(Outcome::Failure));
    }
}

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker).
    ///
    /// Resolves to the inner service's result (its body wrapped in a
    /// [`BreakerBody`](crate::body::BreakerBody) when the classifier defers
    /// to the body's end), or at once to a [`CircuitOpen`] error when the
    /// breaker refused the call. Dropping it
    /// before it completes gives back a probe permit and counts the call as
    /// cancelled ([`Counts::cancelled`](crate::Counts::cancelled)), neither
    /// a success nor a failure.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            future: F,
            call: Call<C>,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    /// The response future of `call`, admitted, whose inner future is
    /// `future`.
    #[inline(always)]
    pub(crate) fn called(future: F, call: Call<C>) -> Self {
        ResponseFuture {
            kind: Kind::Called { future, call },
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
    C::Eos: Finish<T>,
{
    type Output = Result<<C::Eos as Finish<T>>::Response, E>;

    // The output is taken apart at once and each half classified by
    // reference where it lies; a classifier that never defers
    // (`Eos = Infallible`) hands it on as it is (`Finish` is the identity
    // then, and compiles away).
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(E::from(error))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Called { future, call } => {
                // A panic in the inner future or the classifier is a failure,
                // recorded as the unwind passes this guard.
                let guard = FailOnUnwind(call);
                let output = match future.poll(cx) {
                    Poll::Pending => {
                        guard.disarm();
                        return Poll::Pending;
                    }
                    Poll::Ready(output) => output,
                };
                let call = &mut *guard.0;
                let output = match output {
                    Ok(response) => {
                        if call.is_recording() {
                            match call.via.classifier().classify(Ok(&response)) {
                                Classified::Ready(verdict) => call.record(verdict),
                                Classified::AtEndOfStream(eos) => {
                                    let obligation = call.defer();
                                    guard.disarm();
                                    return Poll::Ready(Ok(eos.defer(response, obligation)));
                                }
                            }
                        }
                        Ok(<C::Eos as Finish<T>>::finish(response))
                    }
                    Err(error) => {
                        if call.is_recording() {
                            let verdict = match call.via.classifier().classify(Err(&error)) {
                                Classified::Ready(verdict) => verdict,
                                // An error has no body to wait for: a
                                // deferral there is a failure.
                                Classified::AtEndOfStream(_) => Verdict::new(Outcome::Failure),
                            };
                            call.record(verdict);
                        }
                        Err(error)
                    }
                };
                guard.disarm();
                Poll::Ready(output)
            }
        }
    }
}

/// What a caller receives for a response `T` once its head is judged: `T`
/// itself when nothing is left to judge, or, for an `http::Response` whose
/// verdict waits for the end of its body, the response with its body
/// wrapped in a [`BreakerBody`](crate::body::BreakerBody) that records it.
///
/// Implemented for [`Infallible`] (the [`Eos`](Classify::Eos) of a
/// classifier that never defers: every `T`) and, with the `http-body`
/// feature, for every [`ClassifyEos`](crate::classify::ClassifyEos) over
/// `http::Response<B>`. It names the response type of a breaker service in
/// generic code (`<C::Eos as Finish<S::Response>>::Response`); it cannot be
/// implemented outside this crate.
pub trait Finish<T>: Sized {
    /// What the caller receives.
    type Response;

    /// Hands `response` on with nothing left to judge.
    #[doc(hidden)]
    fn finish(response: T) -> Self::Response;

    /// Hands `response` on with its verdict still to come at the end of
    /// its stream, judged by `self`, for `obligation` (none when no
    /// breaker wants the verdict).
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn defer(self, response: T, obligation: Option<Obligation>) -> Self::Response;
}

impl<T> Finish<T> for Infallible {
    type Response = T;

    #[inline(always)]
    fn finish(response: T) -> T {
        response
    }

    #[inline(always)]
    #[allow(private_interfaces)]
    fn defer(self, _: T, _: Option<Obligation>) -> T {
        match self {}
    }
}

/// A call whose verdict is not known yet (a streamed response body): for
/// each breaker it went through (a key's and its parent's), the call's
/// generation and probe permit, until it is settled. Dropped unsettled,
/// the call counts as cancelled in each and their permits go back.
pub(crate) struct Obligation {
    /// The key's breaker (or, when it records nothing, its parent's).
    first: Pending,
    /// Its parent's, when both record.
    second: Option<Pending>,
}

/// The obligation at one breaker.
pub(crate) struct Pending {
    pub(crate) shared: Arc<Shared>,
    /// Whether `shared` is a keeper's handle, taken for the call alone by
    /// a keyed service (one the registry's eviction does not count as a
    /// user's, so that calls in flight never hold breakers in a full
    /// registry; see [`Shared::keeper_handles`]).
    pub(crate) kept: bool,
    pub(crate) admission: Admission,
    pub(crate) start: Option<Instant>,
    /// The call's latency, once taken where its breaker's `latency_to`
    /// says (the head, the first data frame); `None` runs it to the end.
    latency: Option<Duration>,
}

impl Pending {
    /// The obligation of a call admitted as `admission` says and started
    /// at `start`, its head just in: a latency that runs to the head is
    /// taken now.
    pub(crate) fn new(
        shared: Arc<Shared>,
        kept: bool,
        admission: Admission,
        start: Option<Instant>,
    ) -> Self {
        let mut pending = Pending {
            shared,
            kept,
            admission,
            start,
            latency: None,
        };
        pending.measure_if(LatencyTo::Head);
        pending
    }

    /// A timed call at a breaker whose latency stops at `to`: its latency
    /// is taken now.
    fn measure_if(&mut self, to: LatencyTo) {
        if let (Some(start), None) = (self.start, self.latency) {
            if self.shared.latency_to() == to {
                self.latency = Some(start.elapsed());
            }
        }
    }

    /// Whether the latency still waits for a first data frame.
    fn awaits_first_frame(&self) -> bool {
        self.start.is_some()
            && self.latency.is_none()
            && self.shared.latency_to() == LatencyTo::FirstFrame
    }

    fn settle(&mut self, verdict: Verdict) {
        if self.admission.feeds() == Record::Nothing {
            return;
        }
        // A latency taken earlier stands: the call is recorded now with
        // it, as if it had started that long ago.
        let start = match self.latency {
            Some(latency) => Instant::now().checked_sub(latency).or(self.start),
            None => self.start,
        };
        self.admission.record(&self.shared, verdict, start);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // The caller walked away before the end (unless it was recorded):
        // a cancellation, which says nothing of the upstream's health, or
        // a failure once the call waited `cancelled_failure_after`; a
        // probe's permit goes with it.
        self.admission.cancel(&self.shared, self.start);
        if self.kept {
            self.shared.note_keeper_handle(false);
        }
    }
}

impl Obligation {
    pub(crate) fn one(first: Pending) -> Self {
        Obligation {
            first,
            second: None,
        }
    }

    /// The obligation of a call admitted at a key's breaker and its
    /// parent's, at each that still wants the verdict (a disabled child
    /// wants none, its parent may): `None` if neither does.
    pub(crate) fn of_legs(child: Option<Pending>, parent: Option<Pending>) -> Option<Self> {
        match (child, parent) {
            (Some(first), second) => Some(Obligation { first, second }),
            (None, Some(first)) => Some(Obligation::one(first)),
            (None, None) => None,
        }
    }

    /// Whether a breaker's latency waits for the body's first data frame.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn awaits_first_frame(&self) -> bool {
        self.first.awaits_first_frame()
            || self
                .second
                .as_ref()
                .is_some_and(Pending::awaits_first_frame)
    }

    /// The body's first data frame came: latencies that run to it are
    /// taken.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn first_frame(&mut self) {
        self.first.measure_if(LatencyTo::FirstFrame);
        if let Some(second) = &mut self.second {
            second.measure_if(LatencyTo::FirstFrame);
        }
    }

    /// The breaker whose settings a streamed body follows (the key's, or
    /// its parent's when the key's records nothing).
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn breaker(&self) -> &Shared {
        &self.first.shared
    }

    /// Records the verdict, in each breaker.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn settle(mut self, verdict: Verdict) {
        self.first.settle(verdict);
        if let Some(second) = &mut self.second {
            second.settle(verdict);
        }
    }
}

impl fmt::Debug for Obligation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let second = self.second.as_ref().map(|leg| &**leg.shared.name());
        f.debug_struct("Obligation")
            .field("breaker", self.first.shared.name())
            .field("parent", &second)
            .finish_non_exhaustive()
    }
}
