//! The failover's response future: walks the chain, one candidate at a time.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use super::candidate::Candidate;
use super::error::{Exhausted, Reason, Unavailable};
use super::{Pool, Settings};
use crate::classify::{Classify, Outcome};
use crate::millis::millis;
use crate::{Breaker, CircuitOpen, State};

/// Where the walk down the chain is.
enum Step<T, I> {
    /// Look at the next candidate.
    Choose,
    /// Waiting for candidate `index`'s copy to be ready.
    Ready {
        index: usize,
        name: Arc<str>,
        copy: T,
    },
    /// Candidate `index` was called through its breaker `name`; `call`
    /// holds its response future.
    Called { index: usize, name: Arc<str> },
    /// Every candidate is open: waiting for the soonest one's (`index`)
    /// inner service.
    LastResortReady { index: usize, inner: I },
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
    pub struct ResponseFuture<T, C, Req>
    where
        T: Candidate<Req>,
    {
        pool: Arc<Pool<T>>,
        classifier: C,
        request: Req,
        settings: Settings,
        // The next candidate to look at, and the calls made so far.
        next: usize,
        attempts: usize,
        reasons: Vec<Unavailable>,
        step: Step<T, T::Inner>,
        #[pin]
        call: Option<T::Future>,
        #[pin]
        last_resort: Option<<T::Inner as Service<Req>>::Future>,
    }
}

impl<T, C, Req> ResponseFuture<T, C, Req>
where
    T: Candidate<Req>,
{
    pub(crate) fn new(pool: Arc<Pool<T>>, classifier: C, request: Req, settings: Settings) -> Self {
        ResponseFuture {
            reasons: Vec::new(),
            pool,
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

/// Why a request cannot go through `breakers` (a key's and its parent's),
/// if one of them is open: the state of the one that holds longest (an
/// operator's isolation, with no end, over any open period), and when both
/// will let it through.
fn closed_to(breakers: &[Option<Breaker>; 2]) -> Option<(State, Option<Duration>, String)> {
    let mut found: Option<(State, Option<Duration>, String)> = None;
    for breaker in breakers.iter().flatten() {
        if !breaker.refuses_calls() {
            continue;
        }
        let state = breaker.state();
        // Read after the state: if the period ended in between, there is
        // nothing left to wait.
        let retry_after = match state {
            State::Open => Some(breaker.retry_after().unwrap_or_default()),
            _ => None,
        };
        let holds_longer = match &found {
            None => true,
            Some((_, None, _)) => false,
            Some((_, Some(seen), _)) => retry_after.is_none_or(|after| after > *seen),
        };
        if holds_longer {
            found = Some((state, retry_after, breaker.name().to_string()));
        }
    }
    found
}

impl<T, C, Req> Future for ResponseFuture<T, C, Req>
where
    T: Candidate<Req>,
    T::Error: Into<BoxError>,
    C: Classify<T::Response, T::Error>,
    Req: Clone,
{
    type Output = Result<T::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.step {
                Step::Choose => {
                    let index = *this.next;
                    if index >= this.pool.len() {
                        // Every candidate has been looked at.
                        let chosen = last_resort(this.reasons, *this.settings);
                        if let Some((index, copy)) =
                            chosen.and_then(|index| Some((index, this.pool.take(index)?)))
                        {
                            // Around the breakers: the inner service, directly.
                            let inner = copy.inner().clone();
                            this.pool.give_back(index, copy);
                            *this.step = Step::LastResortReady { index, inner };
                            continue;
                        }
                        *this.step = Step::Done;
                        return Poll::Ready(Err(exhausted(this.reasons)));
                    }
                    *this.next += 1;
                    let Some(copy) = this.pool.take(index) else {
                        continue;
                    };
                    // Read, not made: a key without a breaker yet is closed.
                    let (name, breakers) = copy.breakers_for(this.request);
                    let name: Arc<str> = Arc::from(name);
                    if let Some((state, retry_after, by)) = closed_to(&breakers) {
                        this.pool.give_back(index, copy);
                        tracing::debug!(
                            candidate = index,
                            breaker = %name,
                            held_by = %by,
                            state = ?state,
                            retry_after_ms = retry_after.map(millis),
                            reason = "open",
                            "failover: skipping an open candidate without calling it"
                        );
                        let reason = Reason::Open { state, retry_after };
                        this.reasons.push(Unavailable::new(index, name, reason));
                        continue;
                    }
                    if *this.attempts >= this.settings.max_attempts {
                        this.pool.give_back(index, copy);
                        let reason = Reason::NotTried;
                        this.reasons.push(Unavailable::new(index, name, reason));
                        continue;
                    }
                    *this.step = Step::Ready { index, name, copy };
                }
                Step::Ready { index, copy, .. } => {
                    let index = *index;
                    match copy.poll_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) => {
                            let future = copy.call(this.request.clone());
                            this.call.set(Some(future));
                            // Called: the copy holds no reservation any more.
                            let step = mem::replace(this.step, Step::Choose);
                            if let Step::Ready { copy, name, .. } = step {
                                this.pool.give_back(index, copy);
                                *this.step = Step::Called { index, name };
                            }
                        }
                        Poll::Ready(Err(error)) => {
                            // A service whose `poll_ready` failed is done for:
                            // this copy is dropped, not given back.
                            let step = mem::replace(this.step, Step::Choose);
                            *this.attempts += 1;
                            let reason = Reason::Failed {
                                error: Some(error.into()),
                                retry_after: None,
                            };
                            if let Step::Ready { name, .. } = step {
                                let state = state_now(this.pool, index, this.request);
                                fall_back(this.reasons, index, name, state, reason);
                            }
                        }
                    }
                }
                Step::Called { index, .. } => {
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
                    let Step::Called { name, .. } = mem::replace(this.step, Step::Choose) else {
                        unreachable!("the step was just matched");
                    };
                    let verdict = this.classifier.classify_head(result.as_ref());
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
                                let state = state_now(this.pool, index, this.request);
                                fall_back(this.reasons, index, name, state, reason);
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
                        let state = state_now(this.pool, index, this.request);
                        fall_back(this.reasons, index, name, state, reason);
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
                        let isolated = this.pool.take(*index).is_none_or(|copy| {
                            let (_, breakers) = copy.breakers_for(this.request);
                            this.pool.give_back(*index, copy);
                            breakers
                                .iter()
                                .flatten()
                                .any(|b| b.state() == State::ForcedOpen)
                        });
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
                    return Poll::Ready(result.map(T::around).map_err(Into::into));
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

/// The state of the breaker `request` goes through at candidate `index`,
/// read again after a call (for the logs: a failure may have opened it).
fn state_now<T: Candidate<Req>, Req>(pool: &Pool<T>, index: usize, request: &Req) -> Option<State> {
    let copy = pool.take(index)?;
    let (_, [breaker, _]) = copy.breakers_for(request);
    pool.give_back(index, copy);
    breaker.map(|b| b.state())
}

/// Records why candidate `index` (whose breaker for the request is `name`,
/// in `state` now, if it has one) gave no answer, and says so.
fn fall_back(
    reasons: &mut Vec<Unavailable>,
    index: usize,
    name: Arc<str>,
    state: Option<State>,
    reason: Reason,
) {
    let state = state.unwrap_or(State::Closed);
    match &reason {
        Reason::Open { retry_after, .. } => tracing::debug!(
            candidate = index,
            breaker = %name,
            state = ?state,
            retry_after_ms = retry_after.map(millis),
            reason = %reason,
            "failover: candidate refused the call; moving on"
        ),
        _ => tracing::info!(
            candidate = index,
            breaker = %name,
            state = ?state,
            reason = %reason,
            "failover: candidate failed; moving on"
        ),
    }
    reasons.push(Unavailable::new(index, name, reason));
}

/// The candidate to call as a last resort, if it is enabled and every
/// candidate was open: the one whose retry-after ends soonest.
fn last_resort(reasons: &[Unavailable], settings: Settings) -> Option<usize> {
    if !settings.last_resort
        || reasons.is_empty()
        || !reasons
            .iter()
            .all(|r| matches!(r.reason(), Reason::Open { .. }))
    {
        return None;
    }
    let (index, name, retry_after) = reasons
        .iter()
        .filter_map(|r| match r.reason() {
            Reason::Open {
                retry_after: Some(after),
                ..
            } => Some((r.index(), r.name(), *after)),
            _ => None,
        })
        .min_by_key(|&(_, _, after)| after)?;
    tracing::warn!(
        candidate = index,
        breaker = %name,
        retry_after_ms = millis(retry_after),
        reason = "every candidate is open",
        "failover: last resort: calling the candidate that recovers soonest, around its breakers"
    );
    Some(index)
}
