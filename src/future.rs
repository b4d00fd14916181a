//! The response future: records the call's outcome when it completes.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::breaker::admission::Permit;
use crate::classify::{Classify, Outcome, Verdict};
use crate::error::CircuitOpen;
use crate::service::Local;

/// How a call was admitted; consumed when its outcome is recorded.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Closed, in this generation.
    Closed(u32),
    /// A half-open probe holding its permit.
    Probe(Permit),
}

impl Admission {
    fn record<C>(self, local: &Local<C>, verdict: Verdict, start: Option<Instant>) {
        match self {
            Admission::Closed(generation) => local.shared.record_closed(
                generation,
                verdict.outcome(),
                verdict.retry_after(),
                start.map(|s| s.elapsed()),
            ),
            Admission::Probe(permit) => match verdict.outcome() {
                Outcome::Success => permit.succeed(),
                Outcome::Failure => permit.fail(verdict.retry_after()),
                Outcome::Ignore => {
                    local.shared.record_closed(0, Outcome::Ignore, None, None);
                    drop(permit);
                }
            },
        }
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
            local: Arc<Local<C>>,
            admission: Option<Admission>,
            start: Option<Instant>,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(
        future: F,
        local: Arc<Local<C>>,
        admission: Admission,
        start: Option<Instant>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                local,
                admission: Some(admission),
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(E::from(error))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Called {
                future,
                local,
                admission,
                start,
            } => {
                // A panic in the inner future or the classifier is a failure:
                // record it (returning a probe permit), then let it go on.
                let output = match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        if let Some(admission) = admission.take() {
                            admission.record(local, Verdict::new(Outcome::Failure), *start);
                        }
                        resume_unwind(panic)
                    }
                };
                if let Some(admission) = admission.take() {
                    let verdict = match catch_unwind(AssertUnwindSafe(|| {
                        local.classifier.classify(output.as_ref())
                    })) {
                        Ok(verdict) => verdict,
                        Err(panic) => {
                            admission.record(local, Verdict::new(Outcome::Failure), *start);
                            resume_unwind(panic)
                        }
                    };
                    admission.record(local, verdict, *start);
                }
                Poll::Ready(output)
            }
        }
    }
}
