//! The other breaker crates, the adapters that make two of them tower
//! services, and their rows: closed and forced open, in front of the same
//! inner services as this crate's rows.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use failsafe::backoff::{self, Exponential};
use failsafe::failure_policy::{self as failsafe_policy, ConsecutiveFailures as FailsafeStreak};
use recloser::AsyncRecloser;
use tower::{Layer, Service};
use tower_resilience_circuitbreaker::{
    CircuitBreakerError, CircuitBreakerHandle, CircuitBreakerLayer as ResilienceLayer, CircuitState,
};

use crate::scenario::{Caller, Scenario};
use crate::services::{
    expect_refused, expect_served, failing, inner, trip, Refusal, COOLDOWN, HOUR,
};

impl<E: fmt::Debug> Refusal for CircuitBreakerError<E> {
    fn is_refusal(&self) -> bool {
        self.is_circuit_open()
    }
}

impl<E: fmt::Debug> Refusal for failsafe::Error<E> {
    fn is_refusal(&self) -> bool {
        matches!(self, failsafe::Error::Rejected)
    }
}

impl<E: fmt::Debug> Refusal for recloser::Error<E> {
    fn is_refusal(&self) -> bool {
        matches!(self, recloser::Error::Rejected)
    }
}

/// `failsafe` behind the thinnest tower adapter: `poll_ready` is the inner
/// service's, `call` hands the inner future to
/// `failsafe::futures::CircuitBreaker::call`, whose future asks the breaker
/// for admission when first polled and records the outcome when it
/// completes. Every clone shares the one `StateMachine` (an `Arc`).
pub struct Failsafe<S> {
    pub inner: S,
    pub breaker: FailsafeBreaker,
}

/// failsafe's breaker with consecutive failures and exponential backoff.
pub type FailsafeBreaker = failsafe::StateMachine<FailsafeStreak<Exponential>, ()>;

// By hand: a derived `Clone` would ask the policy to be `Clone`, which the
// shared state machine does not need.
impl<S: Clone> Clone for Failsafe<S> {
    fn clone(&self) -> Self {
        Failsafe {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
        }
    }
}

impl<S: Service<u64>> Service<u64> for Failsafe<S> {
    type Response = S::Response;
    type Error = failsafe::Error<S::Error>;
    type Future = failsafe::futures::ResponseFuture<
        S::Future,
        FailsafeStreak<Exponential>,
        (),
        failsafe::Any,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    fn call(&mut self, req: u64) -> Self::Future {
        failsafe::futures::CircuitBreaker::call(&self.breaker, self.inner.call(req))
    }
}

/// A failsafe breaker with this crate's default policy: `failures`
/// consecutive failures, then open for `open`, growing twofold per failed
/// probe up to five minutes (failsafe's exponential backoff).
pub fn failsafe_breaker(failures: u32, open: Duration) -> FailsafeBreaker {
    let backoff = backoff::exponential(open, open.max(Duration::from_secs(300)));
    failsafe::Config::new()
        .failure_policy(failsafe_policy::consecutive_failures(failures, backoff))
        .build()
}

/// A failsafe breaker over a time window: opens when fewer than half the
/// calls of the last 10 s succeeded (at least 20 calls), with the same
/// backoff; the counterpart of this crate's `TimeWindow`.
pub fn failsafe_time_window(
) -> failsafe::StateMachine<failsafe_policy::SuccessRateOverTimeWindow<Exponential>, ()> {
    let backoff = backoff::exponential(COOLDOWN, Duration::from_secs(300));
    failsafe::Config::new()
        .failure_policy(failsafe_policy::success_rate_over_time_window(
            0.5,
            20,
            Duration::from_secs(10),
            backoff,
        ))
        .build()
}

/// `recloser` behind the same thin adapter around `AsyncRecloser::call`;
/// every clone shares the one `Recloser` (an `Arc`).
#[derive(Clone)]
pub struct Recloser<S> {
    pub inner: S,
    pub breaker: AsyncRecloser,
}

impl<S: Service<u64>> Service<u64> for Recloser<S> {
    type Response = S::Response;
    type Error = recloser::Error<S::Error>;
    type Future = recloser::RecloserFuture<S::Future, recloser::AnyError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(recloser::Error::Inner)
    }

    fn call(&mut self, req: u64) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

/// recloser's default breaker: a failure rate of 50% over a ring of 100
/// calls, 30 s open (it has no consecutive-failures policy).
pub fn recloser_breaker() -> AsyncRecloser {
    AsyncRecloser::from(recloser::Recloser::default())
}

/// A tower-resilience layer whose services all share one circuit, and the
/// handle that reads its state: `failures` consecutive failures, open for
/// `open`, one call admitted while half-open.
pub fn resilience_layer(
    failures: usize,
    open: Duration,
) -> (ResilienceLayer, CircuitBreakerHandle) {
    ResilienceLayer::builder()
        .consecutive_failures(failures)
        .wait_duration_in_open(open)
        .permitted_calls_in_half_open(1)
        .build_with_handle()
        .expect("valid tower-resilience config")
}

/// A check that the tower-resilience circuit behind `handle` is in
/// `expected` state.
pub fn resilience_in(
    name: &str,
    handle: CircuitBreakerHandle,
    expected: CircuitState,
) -> impl FnMut(&str) + Send + 'static {
    let name = name.to_string();
    move |when| {
        let state = handle.state();
        assert_eq!(state, expected, "{name}: circuit is {state:?} {when} a run");
    }
}

/// A check that one call through (a clone of) a peer's service is served:
/// failsafe and recloser expose no state to read, so their state is
/// checked by its effect. A served call records one more success, which
/// leaves a closed breaker closed.
pub fn serves<S>(name: &str, mut svc: S) -> impl FnMut(&str) + Send + 'static
where
    S: Service<u64, Response = u64> + Send + 'static,
    S::Error: fmt::Debug,
{
    let name = name.to_string();
    move |when| expect_served(&format!("{name} ({when} a run)"), &mut svc)
}

/// A check that one call through (a clone of) a peer's service is refused;
/// a refused call records nothing.
pub fn refuses<S>(name: &str, mut svc: S) -> impl FnMut(&str) + Send + 'static
where
    S: Service<u64, Response = u64> + Send + 'static,
    S::Error: Refusal,
{
    let name = name.to_string();
    move |when| expect_refused(&format!("{name} ({when} a run)"), &mut svc)
}

/// The peers, closed, in front of `inner()`, as rows `family/<peer>`
/// measured over `baseline` and compared with `versus` (this crate's row).
pub fn closed<S>(
    caller: Caller,
    family: &str,
    inner: impl Fn() -> S,
    baseline: &str,
    versus: &str,
) -> Vec<Scenario>
where
    S: Service<u64, Response = u64> + Clone + Send + 'static,
    S::Error: fmt::Debug + Send + 'static,
    S::Future: Send + 'static,
{
    let prefixed = |peer: &str| format!("{}{family}/{peer}", caller.prefix());

    let name = prefixed("tower-resilience");
    let (layer, handle) = resilience_layer(5, COOLDOWN);
    let mut resilience = layer.layer(inner());
    expect_served(&name, &mut resilience);
    let resilience_check = resilience_in(&name, handle, CircuitState::Closed);

    let name = prefixed("failsafe");
    let mut failsafe = Failsafe {
        inner: inner(),
        breaker: failsafe_breaker(5, COOLDOWN),
    };
    expect_served(&name, &mut failsafe);
    let failsafe_check = serves(&name, failsafe.clone());

    // recloser's only policy is a failure rate over a ring of calls.
    let name = prefixed("recloser");
    let mut recloser = Recloser {
        inner: inner(),
        breaker: recloser_breaker(),
    };
    expect_served(&name, &mut recloser);
    let recloser_check = serves(&name, recloser.clone());

    let row = |peer: &str| format!("{family}/{peer}");
    vec![
        Scenario::new(
            caller,
            &row("tower-resilience"),
            resilience,
            resilience_check,
        ),
        Scenario::new(caller, &row("failsafe"), failsafe, failsafe_check),
        Scenario::new(caller, &row("recloser"), recloser, recloser_check),
    ]
    .into_iter()
    .map(|row| row.over(baseline).versus(versus))
    .collect()
}

/// The peers, forced open (one failure trips them, for an hour), in front
/// of the typed inner service: every call is refused.
pub fn rejected(caller: Caller, family: &str, baseline: &str, versus: &str) -> Vec<Scenario> {
    let prefixed = |peer: &str| format!("{}{family}/{peer}", caller.prefix());

    let name = prefixed("tower-resilience");
    let (layer, handle) = resilience_layer(1, HOUR);
    trip(&name, &mut layer.layer(failing()));
    let mut resilience = layer.layer(inner());
    expect_refused(&name, &mut resilience);
    let resilience_check = resilience_in(&name, handle, CircuitState::Open);

    let name = prefixed("failsafe");
    let breaker = failsafe_breaker(1, HOUR);
    trip(
        &name,
        &mut Failsafe {
            inner: failing(),
            breaker: breaker.clone(),
        },
    );
    let mut failsafe = Failsafe {
        inner: inner(),
        breaker,
    };
    expect_refused(&name, &mut failsafe);
    let failsafe_check = refuses(&name, failsafe.clone());

    let name = prefixed("recloser");
    let breaker = AsyncRecloser::from(
        recloser::Recloser::custom()
            .closed_len(1)
            .open_wait(HOUR)
            .build(),
    );
    let mut tripper = Recloser {
        inner: failing(),
        breaker: breaker.clone(),
    };
    // recloser judges a full ring only, and the ring fills on the outcome
    // after the first: a ring of one trips on the second failure.
    trip(&name, &mut tripper);
    trip(&name, &mut tripper);
    let mut recloser = Recloser {
        inner: inner(),
        breaker,
    };
    expect_refused(&name, &mut recloser);
    let recloser_check = refuses(&name, recloser.clone());

    let row = |peer: &str| format!("{family}/{peer}");
    vec![
        Scenario::new(
            caller,
            &row("tower-resilience"),
            resilience,
            resilience_check,
        ),
        Scenario::new(caller, &row("failsafe"), failsafe, failsafe_check),
        Scenario::new(caller, &row("recloser"), recloser, recloser_check),
    ]
    .into_iter()
    .map(|row| row.over(baseline).versus(versus))
    .collect()
}
