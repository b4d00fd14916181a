//! The response future: records the call's outcome when it completes.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::breaker::admission::Permit;
use crate::breaker::shared::Shared;
use crate::classify::{Classify, Outcome, Verdict};
use crate::error::CircuitOpen;
use crate::local::Lease;

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

/// Records a call's verdict: in the closed generation that admitted it, or
/// as a probe through its permit.
#[inline]
pub(crate) fn record(
    shared: &Shared,
    generation: u32,
    permit: &mut Option<Permit>,
    verdict: Verdict,
    start: Option<Instant>,
    count_only: bool,
) {
    if count_only {
        shared.count_outcome(verdict.outcome());
        return;
    }
    // Test before taking: `take` would read the whole option right after
    // `call` wrote only its tag, a store-forwarding stall on the hot path.
    let permit = if permit.is_some() {
        permit.take()
    } else {
        None
    };
    match permit {
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
    /// before it completes gives back a probe permit and records nothing.
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
            local: Lease<C>,
            // The closed generation that admitted the call (probes: the
            // half-open one), and a probe's permit. Each field is written
            // where it lives: building an enum and moving it here costs a
            // store-forwarding stall on the hot path.
            generation: u32,
            permit: Option<Permit>,
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
        local: Lease<C>,
        generation: u32,
        permit: Option<Permit>,
        start: Option<Instant>,
        record: Record,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                local,
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

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(E::from(error))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Called {
                future,
                local,
                generation,
                permit,
                record: what,
                start,
            } => {
                // A panic in the inner future or the classifier is a failure:
                // record it (returning a probe permit), then let it go on.
                let output = match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        if *what != Record::Nothing {
                            let count_only = *what == Record::CountOnly;
                            *what = Record::Nothing;
                            let failure = Verdict::new(Outcome::Failure);
                            record(
                                &local.shared,
                                *generation,
                                permit,
                                failure,
                                *start,
                                count_only,
                            );
                        }
                        resume_unwind(panic)
                    }
                };
                if *what != Record::Nothing {
                    let count_only = *what == Record::CountOnly;
                    *what = Record::Nothing;
                    let verdict = match catch_unwind(AssertUnwindSafe(|| {
                        local.classifier.classify(output.as_ref())
                    })) {
                        Ok(verdict) => verdict,
                        Err(panic) => {
                            let failure = Verdict::new(Outcome::Failure);
                            record(
                                &local.shared,
                                *generation,
                                permit,
                                failure,
                                *start,
                                count_only,
                            );
                            resume_unwind(panic)
                        }
                    };
                    record(
                        &local.shared,
                        *generation,
                        permit,
                        verdict,
                        *start,
                        count_only,
                    );
                }
                Poll::Ready(output)
            }
        }
    }
}
