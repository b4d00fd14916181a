//! The tower [`Service`]: admission in `poll_ready`, rejection in `call`.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::breaker::admission::{settle, Admission, CountIn, Decision, Permit, Refused};
use crate::breaker::shared::Shared;
use crate::breaker::state::{Tag, Word};
use crate::breaker::Breaker;
use crate::classify::{Classify, ErrorsAsFailures};
use crate::eligible::{AnyRequest, ProbeEligibility};
use crate::error::{CircuitOpen, HoldsCircuitOpen, Name, Since};
use crate::future::{Call, Finish, ResponseFuture, Via};
use crate::local::Owner;
use crate::State;

/// How a breaker that will not admit a call answers `poll_ready`.
///
/// | mode | open (or half-open with every permit taken) | choose it when |
/// | --- | --- | --- |
/// | [`FailFast`](Readiness::FailFast) (default) | `Ready(Ok)` at once; `call` returns [`CircuitOpen`] | callers want an answer now: to fail over, to return a 503, to show an error |
/// | [`Gate`](Readiness::Gate) | `Pending`, woken exactly when a probe becomes possible or the breaker changes | a balancer (`tower::balance`, a `ReadyCache`) should route around the endpoint, or callers should wait rather than fail |
///
/// In gate mode the waiting clone costs no CPU: it is woken by the breaker's
/// transitions, by a probe permit being given back, and by one timer set to
/// the end of the open period (or, half-open, to the in-flight probes'
/// deadline). `poll_ready` never returns `Err` because a circuit is open in
/// either mode, and a permit reserved by `poll_ready` is never refused by
/// `call`.
///
/// Gate mode needs a tokio runtime with its timer enabled (as
/// `#[tokio::main]` and `#[tokio::test]` provide). Under `tower::buffer`
/// callers queue (up to the buffer's bound) until the breaker admits them,
/// and the buffer is never poisoned. Two of tower's layers do not do what
/// their names suggest outside a gated breaker:
///
/// * **`tower::timeout` does not bound the wait.** It times `call`, and a
///   gated breaker holds callers in `poll_ready`, before any call: a caller
///   waits out the whole open period (or longer, while probes fail),
///   whatever the timeout. Bound the wait where readiness is awaited
///   (`tokio::time::timeout(limit, service.ready())`), or choose fail-fast
///   mode, whose refusal comes at once. The timeout that turns a hang into a
///   failure belongs inside the breaker either way.
/// * **`tower::load_shed` turns the wait into `Overloaded`**, at once, and
///   the refusal's `retry_after` is lost: the caller cannot tell an open
///   breaker from a busy service, nor when to come back. To refuse at once
///   with the [`CircuitOpen`] (and its `retry_after`), choose fail-fast
///   mode: `load_shed` outside it passes the refusal through untouched.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, ServiceBuilder};
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config, Readiness};
///
/// let endpoint = ServiceBuilder::new()
///     .layer(CircuitBreakerLayer::new(Config::default()).readiness(Readiness::Gate))
///     .timeout(Duration::from_secs(30))
///     .service(service_fn(|req: u32| async move { Ok::<_, BoxError>(req) }));
/// # let _ = endpoint;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Readiness {
    /// Ready at once; `call` refuses with [`CircuitOpen`].
    #[default]
    FailFast,
    /// Not ready until the breaker would admit a call.
    Gate,
}

/// What the last `poll_ready` found; consumed by the next `call`.
enum Reservation {
    /// Nothing reserved: no `poll_ready` since the last `call`, or closed.
    Unchecked,
    /// Half-open: this clone holds a probe permit (a reservation).
    Probe(Permit),
    /// Open: `call` will refuse with this, unless the state word has moved.
    Refuse {
        word: u64,
        retry_at: Instant,
        state: State,
    },
}

/// A service guarded by a circuit breaker. Built by [`CircuitBreakerLayer`].
///
/// * **Closed**: `poll_ready` polls the inner service; `call` calls it; the
///   response future records the outcome through the classifier.
/// * **Open**: `poll_ready` returns `Ready(Ok(()))` at once **without polling
///   the inner service**, and `call` returns [`CircuitOpen`] **without calling
///   it**. `poll_ready` never fails because the circuit is open: tower treats
///   an error from `poll_ready` as a dead service (`Buffer` would fail for
///   good, a balancer would evict the endpoint).
/// * **Half-open**: `poll_ready` reserves one of the `probes` permits before
///   polling the inner service; `call` moves it into the response future,
///   which gives it back when it completes, is dropped, or panics. A clone
///   dropped while holding a reservation gives it back too.
///
/// Its error type is the inner service's, which must be able to hold a
/// [`CircuitOpen`] (`From<CircuitOpen>`, see [`HoldsCircuitOpen`]): tower's
/// `BoxError` can, so stacks with `tower::timeout` inside work as they
/// are, and inner errors pass through untouched.
///
/// [`HoldsCircuitOpen`]: crate::HoldsCircuitOpen
///
/// Cloning costs a reference count and a copy of the classifier: a clone
/// made for one request (as axum makes them) allocates nothing. A clone
/// that makes a second call makes a small handle of its own (one
/// allocation), through which its later calls keep their counts and
/// reference counts on memory no other clone writes, so that clones on
/// many threads do not contend.
///
/// ```
/// use tower::{service_fn, Service, ServiceExt, BoxError};
/// use tower_circuit_breaker::{policy::ConsecutiveFailures, Breaker, CircuitBreaker, CircuitOpen, Config, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let breaker = Breaker::new(Config::builder().trip(ConsecutiveFailures::new(1)).build()?);
/// let mut svc = CircuitBreaker::new(
///     service_fn(|fail: bool| async move { if fail { Err(BoxError::from("down")) } else { Ok(()) } }),
///     &breaker,
/// );
///
/// assert!(svc.ready().await?.call(true).await.is_err()); // a failure trips it
/// assert_eq!(breaker.state(), State::Open);
/// let err = svc.ready().await?.call(false).await.unwrap_err(); // refused, not sent
/// assert!(CircuitOpen::find(err.as_ref()).is_some());
/// # Ok(())
/// # }
/// ```
///
/// With a probe predicate ([`probe_when`](Self::probe_when)), only the
/// requests it accepts may be a half-open probe; see [`eligible`](crate::eligible).
///
/// [`CircuitBreakerLayer`]: crate::CircuitBreakerLayer
pub struct CircuitBreaker<S, C = ErrorsAsFailures, P = AnyRequest> {
    inner: S,
    handle: Handle<C>,
    ready: Reservation,
    mode: Readiness,
    /// Gate mode's one timer: the end of the period it waits for.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Which requests may probe: asked only off the closed path.
    eligible: P,
}

impl<S> CircuitBreaker<S> {
    /// Guards `inner` with `breaker`, classifying every `Err` as a failure.
    pub fn new(inner: S, breaker: &Breaker) -> Self {
        Self::with_classifier(inner, breaker, ErrorsAsFailures)
    }
}

impl<S, C: Clone> CircuitBreaker<S, C> {
    /// Guards `inner` with `breaker` and a classifier.
    pub fn with_classifier(inner: S, breaker: &Breaker, classifier: C) -> Self {
        CircuitBreaker {
            inner,
            handle: Handle::new(Arc::clone(&breaker.shared), classifier),
            ready: Reservation::Unchecked,
            mode: Readiness::FailFast,
            sleep: None,
            eligible: AnyRequest,
        }
    }
}

impl<S, C, P> CircuitBreaker<S, C, P> {
    /// Sets how `poll_ready` answers while the breaker will not admit a call
    /// (default [`Readiness::FailFast`]).
    pub fn readiness(mut self, mode: Readiness) -> Self {
        self.mode = mode;
        self
    }

    /// Lets only the requests `predicate` accepts be a half-open probe
    /// (default: any request). While a probe is due, another request is
    /// refused with [`CircuitOpen`] and takes no permit; closed, every
    /// request passes. See [`eligible`](crate::eligible), whose
    /// [`idempotent_methods`](crate::eligible::idempotent_methods) and
    /// [`marked`](crate::eligible::marked) are predicates for
    /// `http::Request`s.
    ///
    /// ```
    /// use http::Request;
    /// use tower::{service_fn, BoxError};
    /// use tower_circuit_breaker::{eligible, Breaker, CircuitBreaker, Config};
    ///
    /// let breaker = Breaker::new(Config::default());
    /// let svc = CircuitBreaker::new(
    ///     service_fn(|_req: Request<()>| async { Ok::<_, BoxError>(()) }),
    ///     &breaker,
    /// )
    /// .probe_when(eligible::idempotent_methods::<()>);
    /// # let _ = svc;
    /// ```
    pub fn probe_when<P2>(self, predicate: P2) -> CircuitBreaker<S, C, P2> {
        CircuitBreaker {
            inner: self.inner,
            handle: self.handle,
            ready: self.ready,
            mode: self.mode,
            sleep: self.sleep,
            eligible: predicate,
        }
    }

    /// A handle to the breaker.
    pub fn breaker(&self) -> Breaker {
        Breaker {
            shared: Arc::clone(&self.handle.shared),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the breaker service, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// How one service clone reaches its breaker: the shared state and its
/// own classifier, and, from its second call on, a handle of its own.
struct Handle<C> {
    shared: Arc<Shared>,
    classifier: C,
    /// Made at the clone's second call (one that serves a single request
    /// never makes it): the clone's own counts, and the reference count its
    /// response futures take, on memory no other clone writes.
    own: Option<Owner<C>>,
    /// The open state word this clone last refused on, and the end of its
    /// period as an instant and as a refusal carries it, worked out once
    /// per period: a refusal then reads the clock and compares.
    open: Option<(u64, Instant, Since)>,
    /// Whether the clone has made a call without `own`.
    called: bool,
}

impl<C> Handle<C> {
    fn new(shared: Arc<Shared>, classifier: C) -> Self {
        Handle {
            shared,
            classifier,
            own: None,
            open: None,
            called: false,
        }
    }

    /// Where this clone counts a call.
    #[inline]
    fn counts(&self) -> CountIn<'_> {
        match &self.own {
            Some(owner) => CountIn::Clone(&owner.counts),
            None => CountIn::Breaker,
        }
    }

    /// The clone's own handle, made if need be.
    fn own(&mut self) -> &mut Owner<C>
    where
        C: Clone,
    {
        self.own
            .get_or_insert_with(|| Owner::new(Arc::clone(&self.shared), self.classifier.clone()))
    }

    /// Notes a call: the clone's second or later, with no handle of its
    /// own yet, makes one.
    #[inline(always)]
    fn note_call(&mut self)
    where
        C: Clone,
    {
        if self.own.is_none() && std::mem::replace(&mut self.called, true) {
            self.own();
        }
    }

    /// Counts a call admitted, and holds the breaker for its response future.
    #[inline(always)]
    fn admitted(&mut self) -> Via<C>
    where
        C: Clone,
    {
        self.note_call();
        match &mut self.own {
            Some(owner) => {
                owner.counts.admitted();
                Via::Loaned(owner.loan())
            }
            None => {
                self.shared.count_call(true);
                Via::Direct {
                    shared: Arc::clone(&self.shared),
                    classifier: self.classifier.clone(),
                }
            }
        }
    }

    /// When open word `word`'s period ends, if it is open and shadow mode
    /// is off (see [`Shared::open_period_end`]).
    #[inline]
    fn open_period_end(&mut self, word: Word) -> Option<Instant> {
        match self.open {
            Some((seen, end, _)) if seen == word.0 && !self.shared.is_shadow() => Some(end),
            _ => {
                let end = self.shared.open_period_end(word)?;
                self.open = Some((word.0, end, Since::of(end)));
                Some(end)
            }
        }
    }

    /// Counts a refusal, and makes it: inline, so that the refusal is
    /// built where the response future holds it.
    #[inline(always)]
    fn refused(&mut self, retry_at: Instant, state: State) -> CircuitOpen
    where
        C: Clone,
    {
        self.note_call();
        let name = match &self.own {
            Some(owner) => {
                owner.counts.rejected();
                owner.name.clone()
            }
            None => {
                self.shared.count_call(false);
                Name::new(self.shared.name())
            }
        };
        // The end of the period this clone refuses in, as worked out when
        // it began: no arithmetic on time per refusal.
        let retry_at = match self.open {
            Some((_, end, since)) if end == retry_at => since,
            _ => Since::of(retry_at),
        };
        CircuitOpen::refusal(name, retry_at, state)
    }
}

impl<S, C, P, Req> Service<Req> for CircuitBreaker<S, C, P>
where
    S: Service<Req>,
    S::Error: HoldsCircuitOpen,
    C: Classify<S::Response, S::Error> + Clone,
    C::Eos: Finish<S::Response>,
    P: ProbeEligibility<Req>,
{
    type Response = <C::Eos as Finish<S::Response>>::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C>;

    #[inline(always)]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.admit_ready(cx)
    }

    #[inline(always)]
    fn call(&mut self, req: Req) -> Self::Future {
        self.admit_call(req)
    }
}

impl<S, C: Clone, P> CircuitBreaker<S, C, P> {
    /// `poll_ready`, whatever the classifier: admission does not depend on
    /// how outcomes are judged.
    #[inline(always)]
    pub(crate) fn admit_ready<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
        P: ProbeEligibility<Req>,
    {
        let word = self.handle.shared.load();
        if word.tag() == Tag::Closed {
            // Closed needs no reservation; a permit left from an earlier
            // half-open generation is stale, and goes back.
            if !matches!(self.ready, Reservation::Unchecked) {
                self.ready = Reservation::Unchecked;
            }
            return self.inner.poll_ready(cx);
        }
        if self.refuse_at_once(word) {
            return Poll::Ready(Ok(()));
        }
        self.poll_ready_not_closed(cx)
    }

    /// `poll_ready` past a closed breaker (any other state): when the
    /// mode is fail-fast, no probe is reserved and the breaker is open with
    /// its period not over (and not in shadow mode), reserves the refusal
    /// without a decision and returns true; otherwise returns false and
    /// leaves the reservation as it was, for `poll_ready_not_closed`. Out
    /// of line, so that what inlines into the caller's `ready()` is the
    /// closed check and this call, whose answer comes back in a register.
    #[inline(never)]
    fn refuse_at_once(&mut self, word: Word) -> bool {
        if self.mode == Readiness::FailFast && !matches!(self.ready, Reservation::Probe(_)) {
            if let Some(end) = self.handle.open_period_end(word) {
                if Instant::now() < end {
                    self.ready = Reservation::Refuse {
                        word: word.0,
                        retry_at: end,
                        state: State::Open,
                    };
                    return true;
                }
            }
        }
        false
    }

    /// `call`, whatever the classifier.
    #[inline(always)]
    pub(crate) fn admit_call<Req>(&mut self, req: Req) -> ResponseFuture<S::Future, C>
    where
        S: Service<Req>,
        P: ProbeEligibility<Req>,
    {
        let word = self.handle.shared.load();
        let settled = if word.tag() == Tag::Closed && matches!(self.ready, Reservation::Unchecked) {
            Ok(Admission::closed(word.generation()))
        } else {
            self.settle_call(&req, word)
        };
        match settled {
            Ok(admission) => self.call_admitted(req, admission),
            Err(Refused { retry_at, state }) => {
                ResponseFuture::rejected(self.handle.refused(retry_at, state))
            }
        }
    }

    /// `call` past a closed breaker with nothing reserved: a reservation to
    /// consume, a refusal, or a decision.
    #[inline(always)]
    fn settle_call<Req>(&mut self, req: &Req, word: Word) -> Result<Admission, Refused>
    where
        P: ProbeEligibility<Req>,
    {
        if word.tag() == Tag::Closed {
            // Readiness counts once: the next call needs a new `poll_ready`.
            // `poll_ready` refused without polling the inner service, so it
            // must not be called, even though the breaker has closed since:
            // refuse this once; the next `poll_ready` sees closed.
            if let Reservation::Refuse { state, .. } = self.ready {
                self.ready = Reservation::Unchecked;
                return Err(Refused {
                    retry_at: Instant::now(),
                    state,
                });
            }
            self.ready = Reservation::Unchecked;
            return Ok(Admission::closed(word.generation()));
        }
        // The refusal `poll_ready` promised, on a word that has not moved:
        // the common case while open, decided here without a call.
        if let Reservation::Refuse {
            word: seen,
            retry_at,
            state,
        } = self.ready
        {
            if seen == word.0 {
                self.ready = Reservation::Unchecked;
                return Err(Refused { retry_at, state });
            }
        }
        self.settle_not_closed(req, word)
    }
}

impl<S, C: Clone, P> CircuitBreaker<S, C, P> {
    /// `poll_ready` past a closed breaker and a refusal made at once: a
    /// probe's reservation, a fail-fast refusal the breaker decides, a
    /// gate's wait, or the inner service's readiness.
    fn poll_ready_not_closed<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
        P: ProbeEligibility<Req>,
    {
        // Each turn either returns or follows a change of state or the end
        // of a period; the bound only guards against a clock that disagrees
        // with the timer, by yielding instead of spinning.
        for _ in 0..8 {
            // A permit reserved by an earlier poll that returned `Pending` is
            // kept while it belongs to the current half-open generation.
            let keep = matches!(&self.ready, Reservation::Probe(permit) if permit.is_current());
            if !keep {
                // With a predicate, readiness cannot see the request: it
                // reserves nothing, and `call` takes the permit for a
                // request that may probe.
                let decision = if P::ANY_REQUEST {
                    self.handle.shared.admit()
                } else {
                    self.handle.shared.admit_without_probe()
                };
                self.ready = match decision {
                    Decision::Closed(_) | Decision::Bypass { .. } | Decision::ProbeDue { .. } => {
                        Reservation::Unchecked
                    }
                    Decision::Probe(permit) => Reservation::Probe(permit),
                    Decision::Refuse {
                        retry_at,
                        state,
                        word,
                        until_ms,
                    } => {
                        if self.mode == Readiness::FailFast {
                            // Ready at once, without polling the inner
                            // service; `call` refuses. Never `Err`: tower
                            // would discard us.
                            self.ready = Reservation::Refuse {
                                word: word.0,
                                retry_at,
                                state,
                            };
                            return Poll::Ready(Ok(()));
                        }
                        self.ready = Reservation::Unchecked;
                        if self.gate_wait(cx, word, until_ms) {
                            continue;
                        }
                        return Poll::Pending;
                    }
                };
            }
            return match self.inner.poll_ready(cx) {
                Poll::Ready(Err(e)) => {
                    // The inner service is broken; a reserved permit goes back.
                    self.ready = Reservation::Unchecked;
                    Poll::Ready(Err(e))
                }
                other => other,
            };
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Gate mode, refused: arrange to be woken when the breaker changes
    /// (any transition, a permit given back) or when a probe becomes
    /// possible (`until_ms`). Returns true when that has already happened.
    fn gate_wait(&mut self, cx: &mut Context<'_>, seen: Word, until_ms: Option<u64>) -> bool {
        // A clone that waits is kept: it registers through a handle of its own.
        let slot = self.handle.own().slot();
        let shared = &self.handle.shared;
        shared.clones().wait(slot, cx.waker());
        // A change made before the waker was in place woke nobody: look again.
        if shared.load() != seen {
            return true;
        }
        if let Some(until_ms) = until_ms {
            let deadline = shared.instant_at(until_ms);
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_ready() {
                return true;
            }
        }
        false
    }

    /// `call` past the closed state: the call's admission, or its refusal.
    /// Out of line and returning a value, not the response future, so that
    /// the future is built in one place, inline, where the caller's
    /// optimiser can keep it in registers.
    #[cold]
    fn settle_not_closed<Req>(&mut self, req: &Req, word: Word) -> Result<Admission, Refused>
    where
        P: ProbeEligibility<Req>,
    {
        // Read a refusal field by field: moving the whole readiness out right
        // after `poll_ready` wrote it would stall on store forwarding.
        if let Reservation::Refuse {
            word: seen,
            retry_at,
            state,
        } = self.ready
        {
            // The inner service was not polled: refuse whatever the state is
            // now; if it has moved on, the next `poll_ready` will see it.
            self.ready = Reservation::Unchecked;
            let retry_at = if seen == word.0 {
                retry_at
            } else {
                Instant::now()
            };
            return Err(Refused { retry_at, state });
        }
        // `begin` confirms a reserved permit still holds and starts its
        // deadline: the probe's time runs from the call, not the reservation.
        match mem::replace(&mut self.ready, Reservation::Unchecked) {
            Reservation::Probe(permit) if permit.begin() => Ok(Admission::probe(permit)),
            // The breaker left closed since `poll_ready` (or there was
            // none), or the reservation lapsed, or a predicate left the
            // permit to `call`: decide again, so a breaker that opened in
            // between refuses without calling, and a request that may not
            // probe takes no permit.
            _ => settle(
                if P::ANY_REQUEST || self.eligible.may_probe(req) {
                    self.handle.shared.admit()
                } else {
                    self.handle.shared.admit_without_probe()
                },
                &self.handle.shared,
                self.handle.counts(),
            ),
        }
    }

    /// Calls the inner service for an admitted call and builds its response
    /// future, in place.
    #[inline(always)]
    fn call_admitted<Req>(&mut self, req: Req, admission: Admission) -> ResponseFuture<S::Future, C>
    where
        S: Service<Req>,
    {
        let via = self.handle.admitted();
        let start = self.handle.shared.needs_latency().then(Instant::now);
        // If `call` panics, the permit is dropped while unwinding and goes back.
        let future = self.inner.call(req);
        let call = Call::new(via, admission, start);
        ResponseFuture::called(future, call)
    }
}

impl<S: Clone, C: Clone, P: Clone> Clone for CircuitBreaker<S, C, P> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            // No handle of its own until it makes a second call, and no
            // readiness: a reservation belongs to the clone that made it.
            handle: Handle::new(
                Arc::clone(&self.handle.shared),
                self.handle.classifier.clone(),
            ),
            ready: Reservation::Unchecked,
            mode: self.mode,
            // Timers are per clone: each waits on its own.
            sleep: None,
            eligible: self.eligible.clone(),
        }
    }
}

impl<S: fmt::Debug, C, P> fmt::Debug for CircuitBreaker<S, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", &self.handle.shared)
            .finish_non_exhaustive()
    }
}
