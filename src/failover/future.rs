//! The failover's response future: walks the chain, one candidate at a time.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use super::error::{Exhausted, Reason, Unavailable};
use super::{Settings, Shared};
use crate::classify::{Classify, Outcome};
use crate::millis::millis;
use crate::{CircuitBreaker, CircuitOpen, State};

/// Where the walk down the chain is.
enum Step<S, BC> {
    /// Look at the next candidate.
    Choose,
    /// Waiting for candidate `index`'s copy to be ready.
    Ready {
        index: usize,
        copy: CircuitBreaker<S, BC>,
    },
    /// Candidate `index` was called; `call` holds its response future.
    Called { index: usize },
    /// Every candidate is open: waiting for the soonest one's (`index`)
    /// inner service.
    LastResortReady { index: usize, inner: S },
    /// The last resort was called; `last_resort` holds its future.
    LastResortCalled,
    /// The output has been returned.
    Done,
}

pin_project! {
    /// Response future of [`Failover`](super::Failover).
    ///
    /// Dropping it cancels the attempt in flight; a probe permit that attempt
    /// holds goes back with it.
    pub struct ResponseFuture<S, BC, C, Req>
    where
        S: Service<Req>,
    {
        shared: Arc<Shared<S, BC>>,
        classifier: C,
        request: Req,
        settings: Settings,
        // The next candidate to look at, and the calls made so far.
        next: usize,
        attempts: usize,
        reasons: Vec<Unavailable>,
        step: Step<S, BC>,
        #[pin]
        call: Option<crate::future::ResponseFuture<S::Future, BC>>,
        #[pin]
        last_resort: Option<S::Future>,
    }
}

impl<S, BC, C, Req> ResponseFuture<S, BC, C, Req>
where
    S: Service<Req>,
{
    pub(crate) fn new(
        shared: Arc<Shared<S, BC>>,
        classifier: C,
        request: Req,
        settings: Settings,
    ) -> Self {
        ResponseFuture {
            reasons: Vec::new(),
            shared,
            classifier,
            request,
            settings,
            next: 0,
            attempts: 0,
            step: Step::Choose,
            call: None,
            last_resort: None,
        }
    }
}

impl<S, BC, C, Req> Future for ResponseFuture<S, BC, C, Req>
where
    S: Service<Req> + Clone,
    S::Error: From<CircuitOpen> + Into<BoxError>,
    BC: Classify<S::Response, S::Error> + Clone,
    C: Classify<S::Response, S::Error>,
    Req: Clone,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.step {
                Step::Choose => {
                    let index = *this.next;
                    let Some(candidate) = this.shared.candidates.get(index) else {
                        // Every candidate has been looked at.
                        let chosen = last_resort(this.shared, this.reasons, *this.settings);
                        if let Some((index, copy)) =
                            chosen.and_then(|index| Some((index, this.shared.take(index)?)))
                        {
                            // Around the breaker: its inner service, directly.
                            let inner = copy.get_ref().clone();
                            this.shared.give_back(index, copy);
                            *this.step = Step::LastResortReady { index, inner };
                            continue;
                        }
                        *this.step = Step::Done;
                        return Poll::Ready(Err(exhausted(this.reasons)));
                    };
                    *this.next += 1;
                    let breaker = &candidate.breaker;
                    let state = breaker.state();
                    // A breaker in shadow mode never refuses on its own, so
                    // it is called; an operator's isolation holds even then.
                    let open = match state {
                        State::Open => !breaker.is_shadow(),
                        State::ForcedOpen => true,
                        _ => false,
                    };
                    if open {
                        // Read after the state: if the period ended in
                        // between, there is nothing left to wait.
                        let retry_after = match state {
                            State::Open => Some(breaker.retry_after().unwrap_or_default()),
                            _ => None,
                        };
                        tracing::debug!(
                            candidate = index,
                            breaker = %candidate.name,
                            state = ?state,
                            retry_after_ms = retry_after.map(millis),
                            reason = "open",
                            "failover: skipping an open candidate without calling it"
                        );
                        let reason = Reason::Open { state, retry_after };
                        this.reasons
                            .push(Unavailable::new(index, candidate.name.clone(), reason));
                        continue;
                    }
                    if *this.attempts >= this.settings.max_attempts {
                        let reason = Reason::NotTried;
                        this.reasons
                            .push(Unavailable::new(index, candidate.name.clone(), reason));
                        continue;
                    }
                    match this.shared.take(index) {
                        Some(copy) => *this.step = Step::Ready { index, copy },
                        None => continue,
                    }
                }
                Step::Ready { index, copy } => {
                    let index = *index;
                    match copy.poll_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) => {
                            let future = copy.call(this.request.clone());
                            this.call.set(Some(future));
                            // Called: the copy holds no reservation any more.
                            if let Step::Ready { copy, .. } =
                                mem::replace(this.step, Step::Called { index })
                            {
                                this.shared.give_back(index, copy);
                            }
                        }
                        Poll::Ready(Err(error)) => {
                            // A service whose `poll_ready` failed is done for:
                            // this copy is dropped, not given back.
                            *this.step = Step::Choose;
                            *this.attempts += 1;
                            let reason = Reason::Failed {
                                error: Some(error.into()),
                                retry_after: None,
                            };
                            fall_back(this.shared, this.reasons, index, reason);
                        }
                    }
                }
                Step::Called { index } => {
                    let index = *index;
                    let Some(future) = this.call.as_mut().as_pin_mut() else {
                        *this.step = Step::Choose;
                        continue;
                    };
                    let result = match future.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(result) => result,
                    };
                    this.call.set(None);
                    *this.step = Step::Choose;
                    let verdict = this.classifier.classify(result.as_ref());
                    let response = match result {
                        Ok(response) => Ok(response),
                        Err(error) => {
                            let error: BoxError = error.into();
                            if let Some(open) = CircuitOpen::find(error.as_ref()) {
                                // Refused without a call: costs no attempt.
                                // Isolated by an operator since the look at
                                // its state: no end is known, as when skipped,
                                // so never a last resort.
                                let retry_after =
                                    (open.state() != State::ForcedOpen).then(|| open.retry_after());
                                let reason = Reason::Open {
                                    state: open.state(),
                                    retry_after,
                                };
                                fall_back(this.shared, this.reasons, index, reason);
                                continue;
                            }
                            Err(error)
                        }
                    };
                    *this.attempts += 1;
                    if verdict.outcome() == Outcome::Failure {
                        let reason = Reason::Failed {
                            error: response.err(),
                            retry_after: verdict.retry_after(),
                        };
                        fall_back(this.shared, this.reasons, index, reason);
                        continue;
                    }
                    // A success, or an ignored outcome (the request itself
                    // is at fault): the caller's answer, from this candidate.
                    *this.step = Step::Done;
                    return Poll::Ready(response);
                }
                Step::LastResortReady { index, inner } => match inner.poll_ready(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(())) => {
                        // An operator may have isolated it while it became
                        // ready: an isolated candidate is never called.
                        let isolated = this
                            .shared
                            .candidates
                            .get(*index)
                            .is_some_and(|c| c.breaker.state() == State::ForcedOpen);
                        if isolated {
                            *this.step = Step::Done;
                            return Poll::Ready(Err(exhausted(this.reasons)));
                        }
                        let future = inner.call(this.request.clone());
                        this.last_resort.set(Some(future));
                        *this.step = Step::LastResortCalled;
                    }
                    Poll::Ready(Err(error)) => {
                        *this.step = Step::Done;
                        return Poll::Ready(Err(error.into()));
                    }
                },
                Step::LastResortCalled => {
                    let Some(future) = this.last_resort.as_mut().as_pin_mut() else {
                        *this.step = Step::Done;
                        continue;
                    };
                    let result = match future.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(result) => result,
                    };
                    this.last_resort.set(None);
                    *this.step = Step::Done;
                    return Poll::Ready(result.map_err(Into::into));
                }
                Step::Done => panic!("failover ResponseFuture polled after completion"),
            }
        }
    }
}

/// No candidate answered: the error carrying every reason, said at `DEBUG`.
fn exhausted(reasons: &mut Vec<Unavailable>) -> BoxError {
    let exhausted = Exhausted::new(mem::take(reasons));
    tracing::debug!(
        candidates = exhausted.candidates().len(),
        retry_after_ms = exhausted.retry_after().map(millis),
        "failover: no candidate answered"
    );
    exhausted.into()
}

/// Records why candidate `index` gave no answer, and says so.
fn fall_back<S, BC>(
    shared: &Shared<S, BC>,
    reasons: &mut Vec<Unavailable>,
    index: usize,
    reason: Reason,
) {
    let Some(candidate) = shared.candidates.get(index) else {
        return;
    };
    let state = candidate.breaker.state();
    match &reason {
        Reason::Open { retry_after, .. } => tracing::debug!(
            candidate = index,
            breaker = %candidate.name,
            state = ?state,
            retry_after_ms = retry_after.map(millis),
            reason = %reason,
            "failover: candidate refused the call; moving on"
        ),
        _ => tracing::info!(
            candidate = index,
            breaker = %candidate.name,
            state = ?state,
            reason = %reason,
            "failover: candidate failed; moving on"
        ),
    }
    reasons.push(Unavailable::new(index, candidate.name.clone(), reason));
}

/// The candidate to call as a last resort, if it is enabled and every
/// candidate was open: the one whose retry-after ends soonest.
fn last_resort<S, BC>(
    shared: &Shared<S, BC>,
    reasons: &[Unavailable],
    settings: Settings,
) -> Option<usize> {
    if !settings.last_resort
        || reasons.is_empty()
        || !reasons
            .iter()
            .all(|r| matches!(r.reason(), Reason::Open { .. }))
    {
        return None;
    }
    let (index, retry_after) = reasons
        .iter()
        .filter_map(|r| match r.reason() {
            Reason::Open {
                retry_after: Some(after),
                ..
            } => Some((r.index(), *after)),
            _ => None,
        })
        .min_by_key(|&(_, after)| after)?;
    let candidate = shared.candidates.get(index)?;
    tracing::warn!(
        candidate = index,
        breaker = %candidate.name,
        state = ?candidate.breaker.state(),
        retry_after_ms = millis(retry_after),
        reason = "every candidate is open",
        "failover: last resort: calling the candidate that recovers soonest, around its breaker"
    );
    Some(index)
}
