//! The cost of the breaker on the request path.
//!
//! Every scenario drives a service by hand, with the same loop ([`drive`]):
//! `poll_ready` (must be ready), `call`, one poll of the response future
//! pinned on the stack, with a no-op waker. The inner service answers at
//! once, so what is measured is the layer around it, not an executor.
//!
//! Scenarios:
//!
//! * `bare`: the inner service alone, the baseline.
//! * `closed/*`: the breaker, closed, in front of it, one per trip policy,
//!   and `closed/gate` in gate readiness mode; every call succeeds.
//! * `keyed/10k_keys`: a keyed service over a registry holding 10,000
//!   breakers, every call with the next key in turn, so that no key comes
//!   back while the service remembers it: the registry's lookup on every
//!   call, and the cache misses of 10,000 breakers.
//!   `keyed/10k_keys/4_hot`: the same registry, calls cycling over four
//!   keys, which the service remembers (a connection calling a handful of
//!   providers); compare with `closed/consecutive`.
//! * `rejected`: the breaker, open, refusing every call with `CircuitOpen`.
//! * `peer/*`: the other Rust breaker crates in front of the same inner
//!   service, closed and forced open, so that they are measured in the same
//!   run, by the same loop, on the same machine state (see [Peers](#peers)).
//! * `reference/*`: `tower::load_shed` and `tower::timeout` around the same
//!   inner service, for scale, and `reference/arc_round_trip`: the inner
//!   service plus one uncontended reference-count round trip per call (an
//!   `Arc` cloned into the response future and dropped with it), the price
//!   any response future that outlives its service pays. The last column of
//!   the summary gives every scenario's added cost in units of it, a ratio
//!   that holds from one machine to another where nanoseconds do not.
//!   `reference/clock_read`: the inner service plus one read of tokio's
//!   clock per call, what a policy that needs the time (a time window, slow
//!   calls) and every refusal (half-open comes from the clock) pay at least.
//! * `boxed/*`: the same with an inner service whose error is `BoxError`,
//!   where every rejection is boxed. Their added cost is over `boxed/bare`,
//!   that inner service alone.
//!
//! Then, on two OS threads sharing one breaker through clones (each thread
//! drives its own clone in a tight loop for a fixed number of calls):
//!
//! * `threads/*`: closed calls, one thread against two: calls per second
//!   and the two-over-one scaling factor (2.0 is perfect on two free cores),
//!   for this crate (default policy) and each peer, with `bare` (each thread
//!   its own inner service, nothing shared) as the ceiling. The clones are
//!   made on the main thread and moved to the threads, as an accept loop
//!   hands one to each connection; `threads/tower-circuit-breaker/thread-clone`
//!   has each thread make its own, so that memory two clones might share
//!   by being allocated side by side (false sharing) shows as a difference
//!   between the two rows.
//! * `threads/keyed/4_hot`: the same with a keyed service, each thread's
//!   clone calling the same four keys of a registry of 10,000 breakers
//!   (remembered by each clone: no lock and no count shared between them).
//! * `threads/time_window`: this crate with a time window, whose
//!   successes the two threads count without the lock, each in a tally
//!   word on a cache line of its own.
//! * `half_open/*`: both threads hammer a half-open breaker whose one probe
//!   permit is held by a probe in flight: every call is refused; nanoseconds
//!   per refused call. Only breakers with a probe limit take part.
//!
//! The threads use the same loop with one difference ([`drive_until_done`]):
//! a `Pending` (a peer's lock taken by the other thread) is polled again
//! until it resolves, after yielding the thread; the table counts those
//! `Pending` polls per call.
//!
//! # Peers
//!
//! Each peer is configured as close to this crate's default as it allows
//! (the `vs` column names the scenario of this crate it is compared with):
//!
//! | peer | how it is put in front of the inner service | closed config |
//! | --- | --- | --- |
//! | `tower-resilience-circuitbreaker` 0.14 | its own tower layer (`build_with_handle`, so that clones and the tripping service share one circuit) | 5 consecutive failures, 30 s open, 1 half-open call |
//! | `failsafe` 1.3 | [`Failsafe`], a tower `Service` written here: `poll_ready` is the inner service's, `call` wraps the inner future with `failsafe::futures::CircuitBreaker::call` | 5 consecutive failures, exponential backoff 30 s to 5 min |
//! | `recloser` 1.4 | [`Recloser`], the same adapter around `AsyncRecloser::call` | its default: failure rate 50% over a ring of 100 calls, 30 s open (it has no consecutive-failures policy) |
//!
//! The adapters are the thinnest a tower user could write: both crates
//! decide admission when their future is first polled, so the adapter adds
//! nothing but the call into them. "Forced open" means tripped by one
//! failure with a one-failure threshold and an hour-long open period, as
//! this crate's `rejected` is. Neither failsafe nor recloser limits calls
//! while half-open (both admit every call then), so they have no
//! `half_open/*` row.
//!
//! `cargo bench -p tower-circuit-breaker-hot-path` runs criterion on every single-thread
//! scenario, then prints two summary tables. The first gives nanoseconds
//! per call (the minimum over several rounds, timed here rather than read
//! back from criterion), nanoseconds added over `bare`, heap allocations
//! per call (counted by the global allocator below), and, for a peer, its
//! added cost divided by this crate's (`x ours`). The second gives the
//! two-thread figures (best of a few rounds), and a note when `bare` did
//! not scale (other work on the cores makes them unreliable). With
//! `HOT_PATH_QUICK=1` criterion is skipped and the tables come from fewer
//! rounds, in a few seconds. Run as a test (`cargo test -p tower-circuit-breaker-hot-path --benches`, or `cargo test --workspace --benches`), every scenario is only
//! checked, with a handful of calls, because an unoptimised build says
//! nothing about speed.

#[path = "../common/driver.rs"]
mod driver;

use driver::{call_once, drive, noop_waker, not_ready};

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::fmt;
use std::future::{pending, ready, Future, Pending, Ready};
use std::hint::black_box;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::Criterion;
use failsafe::backoff::{self, Exponential};
use failsafe::failure_policy::{self as failsafe_policy, ConsecutiveFailures as FailsafeStreak};
use recloser::AsyncRecloser;
use tower::load_shed::LoadShed;
use tower::timeout::Timeout;
use tower::util::ServiceFn;
use tower::{service_fn, BoxError, Layer, Service};
use tower_circuit_breaker::policy::{
    Adaptive, ConsecutiveFailures, CountWindow, SlowCalls, TimeWindow, TripPolicy,
};
use tower_circuit_breaker::registry::{KeyedLayer, Registry, RegistryFull};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, Readiness, State};
use tower_resilience_circuitbreaker::{
    CircuitBreakerError, CircuitBreakerHandle, CircuitBreakerLayer as ResilienceLayer, CircuitState,
};

/// Counts heap allocations (and reallocations) so that each scenario can
/// report how many a call costs; frees are not counted.
struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// A typed error that holds a rejection by value: with it, refusing a call
/// needs no allocation, which isolates the breaker's own cost from boxing.
#[derive(Debug)]
enum BenchError {
    /// The inner service failed; only used to trip a breaker.
    Failed,
    /// The breaker refused the call.
    Open(CircuitOpen),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Failed => f.write_str("inner service failed"),
            BenchError::Open(open) => fmt::Display::fmt(open, f),
        }
    }
}

impl Error for BenchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            BenchError::Failed => None,
            BenchError::Open(open) => Some(open),
        }
    }
}

impl From<CircuitOpen> for BenchError {
    fn from(open: CircuitOpen) -> Self {
        BenchError::Open(open)
    }
}

impl From<RegistryFull> for BenchError {
    fn from(_: RegistryFull) -> Self {
        BenchError::Failed
    }
}

/// An error that can say whether it is a breaker's refusal (this crate's
/// `CircuitOpen`, or a peer's own "rejected" variant).
trait Refusal: fmt::Debug {
    fn is_refusal(&self) -> bool;
}

impl Refusal for BenchError {
    fn is_refusal(&self) -> bool {
        matches!(self, BenchError::Open(_))
    }
}

impl Refusal for BoxError {
    fn is_refusal(&self) -> bool {
        CircuitOpen::find(self.as_ref()).is_some()
    }
}

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

/// The inner service of every typed-error scenario: answers at once.
fn inner() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BenchError>> + Clone> {
    service_fn(|x: u64| ready(Ok::<u64, BenchError>(x)))
}

/// The inner service of the `boxed/*` scenarios: answers at once, with
/// tower's `BoxError` as its error type.
fn inner_boxed() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BoxError>> + Clone> {
    service_fn(|x: u64| ready(Ok::<u64, BoxError>(x)))
}

/// A service under measurement, with the loop monomorphised for its type
/// and boxed, so that every scenario is run through the same entry point.
struct Scenario {
    name: &'static str,
    /// For a peer: the scenario of this crate it is compared with.
    versus: Option<&'static str>,
    run: Box<dyn FnMut(u64) -> Duration>,
}

impl Scenario {
    /// A scenario; with `breaker`, the breaker must be in the given state
    /// whenever it is measured. That is checked before and after every run,
    /// outside the timing, so that a `closed` figure cannot come from a
    /// breaker that opened, nor a `rejected` one from a breaker that closed.
    fn new<S>(name: &'static str, svc: S, breaker: Option<(Breaker, State)>) -> Self
    where
        S: Service<u64> + 'static,
    {
        Self::checked(name, svc, move |when| {
            if let Some((breaker, expected)) = &breaker {
                let state = breaker.state();
                assert_eq!(
                    state, *expected,
                    "{name}: breaker is {state:?} {when} a run"
                );
            }
        })
    }

    /// A scenario whose `check` runs before and after every run, outside
    /// the timing; it panics when the service is not in the state measured.
    fn checked<S>(name: &'static str, mut svc: S, mut check: impl FnMut(&str) + 'static) -> Self
    where
        S: Service<u64> + 'static,
    {
        let run = move |calls| {
            check("before");
            let elapsed = drive(&mut svc, calls);
            check("after");
            elapsed
        };
        Scenario {
            name,
            versus: None,
            run: Box::new(run),
        }
    }

    /// Compares this (a peer's) scenario with `ours` in the summary.
    fn versus(mut self, ours: &'static str) -> Self {
        self.versus = Some(ours);
        self
    }
}

/// Checks that one call through `svc` is served and returns its request.
// Kept here rather than in the shared driver (as `benches/fleet.rs` could
// use it): moved there, it shifted every row of this bench by 1 to 15 ns,
// measured, through where the compiler placed the measured loops.
fn expect_served<S, E>(name: &str, svc: &mut S)
where
    S: Service<u64, Response = u64, Error = E>,
    E: fmt::Debug,
{
    let mut cx = Context::from_waker(noop_waker());
    match call_once(svc, &mut cx, 7) {
        Poll::Ready(Ok(7)) => {}
        other => panic!("{name}: expected the call to be served, got {other:?}"),
    }
}

/// Checks that one call through `svc` is refused by its breaker.
fn expect_refused<S, E>(name: &str, svc: &mut S)
where
    S: Service<u64, Response = u64, Error = E>,
    E: Refusal,
{
    let mut cx = Context::from_waker(noop_waker());
    match call_once(svc, &mut cx, 7) {
        Poll::Ready(Err(err)) if err.is_refusal() => {}
        Poll::Ready(Err(err)) => panic!("{name}: expected a refusal, got {err:?}"),
        Poll::Ready(Ok(_)) => panic!("{name}: expected a refusal, the call was served"),
        Poll::Pending => panic!("{name}: expected a refusal, the call is pending"),
    }
}

/// How long a forced-open breaker stays open: longer than any run.
const HOUR: Duration = Duration::from_secs(3600);

/// This crate's default first open period, given to every peer too.
const COOLDOWN: Duration = Duration::from_secs(30);

/// Makes one call through `tripper` that must fail (not be refused): the
/// failure that opens a breaker with a one-failure threshold.
fn trip<S: Service<u64>>(name: &str, tripper: &mut S)
where
    S::Error: Refusal,
{
    let mut cx = Context::from_waker(noop_waker());
    match call_once(tripper, &mut cx, 0) {
        Poll::Ready(Err(err)) if !err.is_refusal() => {}
        Poll::Ready(Err(err)) => panic!("{name}: the tripping call was refused: {err:?}"),
        Poll::Ready(Ok(_)) => panic!("{name}: the tripping call succeeded"),
        Poll::Pending => panic!("{name}: the tripping call is pending"),
    }
}

/// A config with `policy` and every other setting at its default.
fn config(name: &str, policy: impl Into<TripPolicy>) -> Config {
    Config::builder()
        .name(name)
        .trip(policy)
        .build()
        .expect("valid benchmark config")
}

/// A breaker, closed, in front of `inner`, checked to serve a call.
fn closed<S, E>(name: &'static str, config: Config, inner: S) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + 'static,
    E: From<CircuitOpen> + fmt::Debug,
{
    let breaker = Breaker::new(config);
    let mut svc = CircuitBreaker::new(inner, &breaker);
    assert_eq!(breaker.state(), State::Closed, "{name}: a new breaker");
    expect_served(name, &mut svc);
    Scenario::new(name, svc, Some((breaker, State::Closed)))
}

/// Keyed breakers: a registry holding 10,000 keys, call `i` going through
/// the breaker of key `key_of(i)`. With every key in turn (`i % 10,000`)
/// no key comes back while the service still remembers it: each call pays
/// the registry's lookup (its hash, its shard lock) and the cache misses of
/// 10,000 breakers. With a few keys in turn
/// the service finds them among those it remembers, as a connection that
/// calls a handful of providers does.
fn keyed<S, E>(
    name: &'static str,
    registry: &Registry<u64>,
    inner: S,
    key_of: impl Fn(&u64) -> u64 + Clone + 'static,
) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + 'static,
    E: From<CircuitOpen> + From<RegistryFull> + fmt::Debug,
{
    let mut svc = KeyedLayer::new(registry.clone(), key_of).layer(inner);
    expect_served(name, &mut svc);
    Scenario::new(name, svc, None)
}

/// The registry both keyed scenarios share: 10,000 keys, each with its
/// breaker made.
fn ten_thousand_keys() -> Registry<u64> {
    const KEYS: u64 = 10_000;
    let registry = Registry::<u64>::builder()
        .default_config(Config::default())
        .max_keys(KEYS as usize)
        .build();
    for key in 0..KEYS {
        registry.get(&key).expect("room for every key");
    }
    registry
}

/// A breaker, open for an hour, in front of `inner`, checked to refuse a
/// call. It is tripped by one failure through a second service on the same
/// breaker, whose inner service always fails, so that the measured service
/// wraps exactly the inner service of the other scenarios.
fn rejected<S, E>(name: &'static str, inner: S, failure: fn() -> E) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + 'static,
    E: From<CircuitOpen> + Refusal + 'static,
{
    let config = Config::builder()
        .name(name)
        .trip(ConsecutiveFailures::new(1))
        .cooldown(HOUR)
        .max_open(HOUR)
        .build()
        .expect("valid benchmark config");
    let breaker = Breaker::new(config);
    trip(
        name,
        &mut CircuitBreaker::new(
            service_fn(move |_: u64| ready(Err::<u64, E>(failure()))),
            &breaker,
        ),
    );
    assert_eq!(breaker.state(), State::Open, "{name}: after one failure");

    let mut svc = CircuitBreaker::new(inner, &breaker);
    expect_refused(name, &mut svc);
    Scenario::new(name, svc, Some((breaker, State::Open)))
}

/// A closed breaker in gate readiness mode (default policy): its closed
/// path must cost what fail-fast's does.
fn closed_gate<S, E>(name: &'static str, config: Config, inner: S) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + 'static,
    E: From<CircuitOpen> + fmt::Debug,
{
    let breaker = Breaker::new(config);
    let mut svc = CircuitBreaker::new(inner, &breaker).readiness(Readiness::Gate);
    expect_served(name, &mut svc);
    Scenario::new(name, svc, Some((breaker, State::Closed)))
}

/// The inner service with one uncontended reference-count round trip per
/// call: its response future holds a clone of an `Arc` and drops it.
#[derive(Clone)]
struct ArcRoundTrip {
    shared: std::sync::Arc<u64>,
}

/// Response future of [`ArcRoundTrip`].
struct ArcFuture {
    value: u64,
    _shared: std::sync::Arc<u64>,
}

impl Future for ArcFuture {
    type Output = Result<u64, BenchError>;

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(self.value))
    }
}

impl Service<u64> for ArcRoundTrip {
    type Response = u64;
    type Error = BenchError;
    type Future = ArcFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BenchError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, value: u64) -> ArcFuture {
        ArcFuture {
            value,
            _shared: std::sync::Arc::clone(&self.shared),
        }
    }
}

// ---------------------------------------------------------------------
// Peers: the other breaker crates, and the adapters that make them tower
// services.
// ---------------------------------------------------------------------

/// The inner service that always fails: trips a breaker.
fn failing() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BenchError>> + Clone> {
    service_fn(|_: u64| ready(Err::<u64, BenchError>(BenchError::Failed)))
}

/// The inner service that never answers: a probe that stays in flight.
fn hanging() -> ServiceFn<impl Fn(u64) -> Pending<Result<u64, BenchError>> + Clone> {
    service_fn(|_: u64| pending::<Result<u64, BenchError>>())
}

/// `failsafe` behind the thinnest tower adapter: `poll_ready` is the inner
/// service's, `call` hands the inner future to
/// `failsafe::futures::CircuitBreaker::call`, whose future asks the breaker
/// for admission when first polled and records the outcome when it
/// completes. Every clone shares the one `StateMachine` (an `Arc`).
struct Failsafe<S> {
    inner: S,
    breaker: failsafe::StateMachine<FailsafeStreak<Exponential>, ()>,
}

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
fn failsafe_breaker(
    failures: u32,
    open: Duration,
) -> failsafe::StateMachine<FailsafeStreak<Exponential>, ()> {
    let backoff = backoff::exponential(open, open.max(Duration::from_secs(300)));
    failsafe::Config::new()
        .failure_policy(failsafe_policy::consecutive_failures(failures, backoff))
        .build()
}

/// `recloser` behind the same thin adapter around `AsyncRecloser::call`;
/// every clone shares the one `Recloser` (an `Arc`).
#[derive(Clone)]
struct Recloser<S> {
    inner: S,
    breaker: AsyncRecloser,
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

/// A tower-resilience layer whose services all share one circuit, and the
/// handle that reads its state: `failures` consecutive failures, open for
/// `open`, one call admitted while half-open.
fn resilience_layer(failures: usize, open: Duration) -> (ResilienceLayer, CircuitBreakerHandle) {
    ResilienceLayer::builder()
        .consecutive_failures(failures)
        .wait_duration_in_open(open)
        .permitted_calls_in_half_open(1)
        .build_with_handle()
        .expect("valid tower-resilience config")
}

/// A check that the tower-resilience circuit behind `handle` is in
/// `expected` state.
fn resilience_in(
    name: &'static str,
    handle: CircuitBreakerHandle,
    expected: CircuitState,
) -> impl FnMut(&str) + Send + 'static {
    move |when| {
        let state = handle.state();
        assert_eq!(state, expected, "{name}: circuit is {state:?} {when} a run");
    }
}

/// A check that one call through (a clone of) a peer's service is served:
/// failsafe and recloser expose no state to read, so their state is
/// checked by its effect. A served call records one more success, which
/// leaves a closed breaker closed.
fn serves<S>(name: &'static str, mut svc: S) -> impl FnMut(&str) + Send + 'static
where
    S: Service<u64, Response = u64> + Send + 'static,
    S::Error: fmt::Debug,
{
    move |when| expect_served(&format!("{name} ({when} a run)"), &mut svc)
}

/// A check that one call through (a clone of) a peer's service is refused;
/// a refused call records nothing.
fn refuses<S>(name: &'static str, mut svc: S) -> impl FnMut(&str) + Send + 'static
where
    S: Service<u64, Response = u64> + Send + 'static,
    S::Error: Refusal,
{
    move |when| expect_refused(&format!("{name} ({when} a run)"), &mut svc)
}

/// The peers, closed, in front of the inner service.
fn peers_closed() -> Vec<Scenario> {
    let (layer, handle) = resilience_layer(5, COOLDOWN);
    let mut resilience = layer.layer(inner());
    expect_served("peer/closed/tower-resilience", &mut resilience);

    let mut failsafe = Failsafe {
        inner: inner(),
        breaker: failsafe_breaker(5, COOLDOWN),
    };
    expect_served("peer/closed/failsafe", &mut failsafe);

    let mut recloser = Recloser {
        inner: inner(),
        breaker: AsyncRecloser::from(recloser::Recloser::default()),
    };
    expect_served("peer/closed/recloser", &mut recloser);

    vec![
        Scenario::checked(
            "peer/closed/tower-resilience",
            resilience,
            resilience_in("peer/closed/tower-resilience", handle, CircuitState::Closed),
        )
        .versus("closed/consecutive"),
        Scenario::checked(
            "peer/closed/failsafe",
            failsafe.clone(),
            serves("peer/closed/failsafe", failsafe),
        )
        .versus("closed/consecutive"),
        // recloser's only policy is a failure rate over a ring of calls.
        Scenario::checked(
            "peer/closed/recloser",
            recloser.clone(),
            serves("peer/closed/recloser", recloser),
        )
        .versus("closed/count_window"),
    ]
}

/// The peers, forced open (one failure trips them, for an hour), in front
/// of the inner service: every call is refused.
fn peers_rejected() -> Vec<Scenario> {
    let (layer, handle) = resilience_layer(1, HOUR);
    trip(
        "peer/rejected/tower-resilience",
        &mut layer.layer(failing()),
    );
    let mut resilience = layer.layer(inner());
    expect_refused("peer/rejected/tower-resilience", &mut resilience);

    let breaker = failsafe_breaker(1, HOUR);
    trip(
        "peer/rejected/failsafe",
        &mut Failsafe {
            inner: failing(),
            breaker: breaker.clone(),
        },
    );
    let mut failsafe = Failsafe {
        inner: inner(),
        breaker,
    };
    expect_refused("peer/rejected/failsafe", &mut failsafe);

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
    trip("peer/rejected/recloser", &mut tripper);
    trip("peer/rejected/recloser", &mut tripper);
    let mut recloser = Recloser {
        inner: inner(),
        breaker,
    };
    expect_refused("peer/rejected/recloser", &mut recloser);

    vec![
        Scenario::checked(
            "peer/rejected/tower-resilience",
            resilience,
            resilience_in("peer/rejected/tower-resilience", handle, CircuitState::Open),
        )
        .versus("rejected"),
        Scenario::checked(
            "peer/rejected/failsafe",
            failsafe.clone(),
            refuses("peer/rejected/failsafe", failsafe),
        )
        .versus("rejected"),
        Scenario::checked(
            "peer/rejected/recloser",
            recloser.clone(),
            refuses("peer/rejected/recloser", recloser),
        )
        .versus("rejected"),
    ]
}

/// Every scenario, `bare` first: the others are reported against it.
fn scenarios() -> Vec<Scenario> {
    let mut load_shed = LoadShed::new(inner());
    expect_served("reference/load_shed", &mut load_shed);
    let mut timeout = Timeout::new(inner(), Duration::from_secs(3600));
    expect_served("reference/timeout", &mut timeout);
    let mut bare = inner();
    expect_served("bare", &mut bare);
    let mut bare_boxed = inner_boxed();
    expect_served("boxed/bare", &mut bare_boxed);
    let keys = ten_thousand_keys();

    vec![
        Scenario::new("bare", bare, None),
        closed("closed/consecutive", Config::default(), inner()),
        closed_gate("closed/gate", Config::default(), inner()),
        // Keys by constant divisors, which compile to a multiplication and a
        // mask: the key function costs next to nothing.
        keyed("keyed/10k_keys", &keys, inner(), |req: &u64| req % 10_000),
        keyed("keyed/10k_keys/4_hot", &keys, inner(), |req: &u64| req % 4),
        closed(
            "closed/count_window",
            config("closed/count_window", CountWindow::new(5, 20)),
            inner(),
        ),
        closed(
            "closed/time_window",
            config(
                "closed/time_window",
                TimeWindow::new(Duration::from_secs(10)),
            ),
            inner(),
        ),
        closed(
            "closed/slow_calls",
            config("closed/slow_calls", SlowCalls::new(Duration::from_secs(1))),
            inner(),
        ),
        closed(
            "closed/adaptive",
            config("closed/adaptive", Adaptive::new()),
            inner(),
        ),
        rejected("rejected", inner(), || BenchError::Failed),
    ]
    .into_iter()
    .chain(peers_closed())
    .chain(peers_rejected())
    .chain([
        // Both accept any inner error that converts into `BoxError`, so they
        // wrap the very inner service the breaker scenarios use; their own
        // error type is `BoxError`, which matters only on failure.
        Scenario::new("reference/load_shed", load_shed, None),
        Scenario::new("reference/timeout", timeout, None),
        Scenario::new(
            "reference/arc_round_trip",
            ArcRoundTrip {
                shared: std::sync::Arc::new(0),
            },
            None,
        ),
        Scenario::new(
            "reference/clock_read",
            service_fn(|x: u64| {
                black_box(tokio::time::Instant::now());
                ready(Ok::<u64, BenchError>(x))
            }),
            None,
        ),
        Scenario::new("boxed/bare", bare_boxed, None),
        closed("boxed/closed/consecutive", Config::default(), inner_boxed()),
        closed_gate("boxed/closed/gate", Config::default(), inner_boxed()),
        rejected("boxed/rejected", inner_boxed(), || BoxError::from("down")),
    ])
    .collect()
}

/// Criterion, one group per scenario family (`closed`, `boxed`, ...), fed
/// by the same loop as the summary through `iter_custom`.
fn run_criterion(scenarios: &mut [Scenario]) {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    let mut i = 0;
    while i < scenarios.len() {
        let family = family_of(scenarios[i].name);
        let mut group = c.benchmark_group(family);
        while i < scenarios.len() && family_of(scenarios[i].name) == family {
            let scenario = &mut scenarios[i];
            let id = scenario
                .name
                .strip_prefix(family)
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or("call");
            group.bench_function(id, |b| b.iter_custom(|iters| (scenario.run)(iters)));
            i += 1;
        }
        group.finish();
    }
    c.final_summary();
}

/// The criterion group of a scenario: its name up to the first `/`.
fn family_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

// ---------------------------------------------------------------------
// Two threads sharing one breaker.
// ---------------------------------------------------------------------

/// How every call of a threaded scenario must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Served,
    Refused,
}

/// The loop of the threaded scenarios: [`drive`]'s, except that a
/// `Pending` (readiness, or the response future) is polled again, after
/// yielding the thread, until it resolves. With a no-op waker that is a
/// spinning executor: tower-resilience's tokio mutex, taken by the other
/// thread, is handed over to the waiting future, which sees it on its next
/// poll. Returns the calls served and the number of `Pending`s waited out.
fn drive_until_done<S: Service<u64>>(svc: &mut S, calls: u64) -> (u64, u64) {
    let mut cx = Context::from_waker(noop_waker());
    let mut served = 0;
    let mut waits = 0;
    for i in 0..calls {
        loop {
            match svc.poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => break,
                Poll::Ready(Err(_)) => not_ready(),
                Poll::Pending => {
                    waits += 1;
                    std::thread::yield_now();
                }
            }
        }
        let mut future = pin!(svc.call(black_box(i)));
        let output = loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                break output;
            }
            waits += 1;
            std::thread::yield_now();
        };
        served += u64::from(black_box(output).is_ok());
    }
    (served, waits)
}

/// One run of a threaded scenario.
#[derive(Clone, Copy)]
struct Run {
    threads: usize,
    calls_per_thread: u64,
    /// From the first thread's start to the last thread's end.
    wall: Duration,
    /// The threads' own times, added up.
    busy: Duration,
    waits: u64,
}

impl Run {
    fn calls(&self) -> f64 {
        (self.threads as u64 * self.calls_per_thread) as f64
    }

    /// Calls completed per second, all threads together.
    fn calls_per_sec(&self) -> f64 {
        self.calls() / self.wall.as_secs_f64()
    }

    /// Nanoseconds a thread spends per call.
    fn ns_per_call(&self) -> f64 {
        self.busy.as_nanos() as f64 / self.calls()
    }

    fn waits_per_call(&self) -> f64 {
        self.waits as f64 / self.calls()
    }
}

/// A service shared by threads through clones: each run clones it once per
/// thread (outside the timing), and each thread drives its own clone.
struct Threaded {
    name: &'static str,
    versus: Option<&'static str>,
    run: Box<dyn FnMut(usize, u64) -> Run>,
}

/// Where a threaded scenario's clones are made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CloneOn {
    /// On the main thread, then moved to the thread that drives it, as an
    /// accept loop hands a clone to each connection's task.
    Main,
    /// By the thread that drives it: its allocations (if any) come from
    /// that thread's allocator arena, away from the other clone's.
    Thread,
}

impl Threaded {
    /// A threaded scenario over `svc`, whose calls must all end as
    /// `expect` says; `check` runs before and after every run, outside the
    /// timing, and panics when the breaker is not in the state measured.
    /// The threads enter `runtime`, whose timer fires the sleeps a peer
    /// may set while the other thread holds its lock.
    fn new<S>(
        name: &'static str,
        svc: S,
        expect: Expect,
        check: impl FnMut(&str) + 'static,
        runtime: tokio::runtime::Handle,
    ) -> Self
    where
        S: Service<u64> + Clone + Send + Sync + 'static,
    {
        Self::cloned_on(name, svc, expect, check, runtime, CloneOn::Main)
    }

    /// As [`new`](Threaded::new), with the clones made `where` says.
    fn cloned_on<S>(
        name: &'static str,
        svc: S,
        expect: Expect,
        mut check: impl FnMut(&str) + 'static,
        runtime: tokio::runtime::Handle,
        clone_on: CloneOn,
    ) -> Self
    where
        S: Service<u64> + Clone + Send + Sync + 'static,
    {
        let run = move |threads: usize, calls: u64| {
            check("before");
            let clones: Vec<Option<S>> = (0..threads)
                .map(|_| (clone_on == CloneOn::Main).then(|| svc.clone()))
                .collect();
            let barrier = Barrier::new(threads);
            let running = AtomicUsize::new(0);
            let prototype = &svc;
            let runs: Vec<(Instant, Duration, u64, u64)> = std::thread::scope(|scope| {
                let handles: Vec<_> = clones
                    .into_iter()
                    .map(|clone| {
                        let (barrier, running, runtime) = (&barrier, &running, &runtime);
                        scope.spawn(move || {
                            let _context = runtime.enter();
                            let mut svc = clone.unwrap_or_else(|| prototype.clone());
                            barrier.wait();
                            // The clock starts once every thread runs: a
                            // thread woken by the barrier onto its waker's
                            // core would otherwise start only when that one
                            // ends, and two threads would measure as one.
                            running.fetch_add(1, Ordering::SeqCst);
                            while running.load(Ordering::SeqCst) < threads {
                                std::hint::spin_loop();
                            }
                            let start = Instant::now();
                            let (served, waits) = drive_until_done(&mut svc, calls);
                            (start, start.elapsed(), served, waits)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| handle.join().expect("a benchmark thread panicked"))
                    .collect()
            });
            check("after");
            let expected = match expect {
                Expect::Served => calls,
                Expect::Refused => 0,
            };
            for &(_, _, served, _) in &runs {
                assert_eq!(
                    served, expected,
                    "{name}: calls served by one thread, of {calls} ({expect:?} expected)"
                );
            }
            let first = runs.iter().map(|r| r.0).min().expect("one thread at least");
            let last = runs
                .iter()
                .map(|r| r.0 + r.1)
                .max()
                .expect("one thread at least");
            Run {
                threads,
                calls_per_thread: calls,
                wall: last - first,
                busy: runs.iter().map(|r| r.1).sum(),
                waits: runs.iter().map(|r| r.3).sum(),
            }
        };
        Threaded {
            name,
            versus: None,
            run: Box::new(run),
        }
    }

    /// Compares this (a peer's) scenario with `ours` in the summary.
    fn versus(mut self, ours: &'static str) -> Self {
        self.versus = Some(ours);
        self
    }
}

/// Closed calls from threads sharing one breaker: this crate (default
/// policy) and each peer (as configured in `peers_closed`), with `bare`
/// first.
fn threaded_closed(runtime: &tokio::runtime::Handle) -> Vec<Threaded> {
    const OURS: &str = "threads/tower-circuit-breaker";
    const OURS_APART: &str = "threads/tower-circuit-breaker/thread-clone";
    let breaker = Breaker::new(Config::default());
    let ours = CircuitBreaker::new(inner(), &breaker);
    let time_window = Breaker::new(config(
        "threads/time_window",
        TimeWindow::new(Duration::from_secs(10)),
    ));
    let (layer, handle) = resilience_layer(5, COOLDOWN);
    let failsafe = Failsafe {
        inner: inner(),
        breaker: failsafe_breaker(5, COOLDOWN),
    };
    let recloser = Recloser {
        inner: inner(),
        breaker: AsyncRecloser::from(recloser::Recloser::default()),
    };
    vec![
        Threaded::new(
            "threads/bare",
            inner(),
            Expect::Served,
            |_| {},
            runtime.clone(),
        ),
        Threaded::new(
            OURS,
            ours.clone(),
            Expect::Served,
            {
                let breaker = breaker.clone();
                move |when| assert_eq!(breaker.state(), State::Closed, "{OURS}: {when} a run")
            },
            runtime.clone(),
        ),
        // Keyed: each thread's clone calls four keys of a registry of
        // 10,000, which it remembers; the two threads share those four
        // breakers.
        Threaded::new(
            "threads/keyed/4_hot",
            KeyedLayer::new(ten_thousand_keys(), |req: &u64| req % 4).layer(inner()),
            Expect::Served,
            |_| {},
            runtime.clone(),
        )
        .versus(OURS),
        // A time window: each thread counts its successes in a tally word
        // of its own, so the threads share the breaker's lines read-only.
        Threaded::new(
            "threads/time_window",
            CircuitBreaker::new(inner(), &time_window),
            Expect::Served,
            move |when| {
                assert_eq!(
                    time_window.state(),
                    State::Closed,
                    "threads/time_window: {when} a run"
                )
            },
            runtime.clone(),
        )
        .versus(OURS),
        // The same, each clone made by its own thread: set against the row
        // above, it tells whether clones made one after the other share a
        // cache line (false sharing) that clones made apart do not.
        Threaded::cloned_on(
            OURS_APART,
            ours,
            Expect::Served,
            move |when| assert_eq!(breaker.state(), State::Closed, "{OURS_APART}: {when} a run"),
            runtime.clone(),
            CloneOn::Thread,
        )
        .versus(OURS),
        Threaded::new(
            "threads/tower-resilience",
            layer.layer(inner()),
            Expect::Served,
            resilience_in("threads/tower-resilience", handle, CircuitState::Closed),
            runtime.clone(),
        )
        .versus(OURS),
        Threaded::new(
            "threads/failsafe",
            failsafe.clone(),
            Expect::Served,
            serves("threads/failsafe", failsafe),
            runtime.clone(),
        )
        .versus(OURS),
        Threaded::new(
            "threads/recloser",
            recloser.clone(),
            Expect::Served,
            serves("threads/recloser", recloser),
            runtime.clone(),
        )
        .versus(OURS),
    ]
}

/// How long a half-open scenario's breaker is open before it reads
/// half-open, and how long setting it up waits for that.
const SHORT_OPEN: Duration = Duration::from_millis(1);
const PAST_SHORT_OPEN: Duration = Duration::from_millis(20);

/// Half-open breakers with one probe permit, held by a probe in flight
/// that never completes (kept alive by the scenario), so that every call
/// the threads make is refused: this crate, and tower-resilience, the one
/// peer that limits half-open calls.
fn threaded_half_open(runtime: &tokio::runtime::Handle) -> Vec<Threaded> {
    const OURS: &str = "half_open/tower-circuit-breaker";
    let config = Config::builder()
        .name("half_open")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(SHORT_OPEN)
        .probes(1)
        // The probe stays in flight for as long as the scenario lives.
        .probe_timeout(None)
        .build()
        .expect("valid benchmark config");
    let breaker = Breaker::new(config);
    trip(OURS, &mut CircuitBreaker::new(failing(), &breaker));
    std::thread::sleep(PAST_SHORT_OPEN);
    let mut prober = CircuitBreaker::new(hanging(), &breaker);
    let mut cx = Context::from_waker(noop_waker());
    if !matches!(prober.poll_ready(&mut cx), Poll::Ready(Ok(()))) {
        panic!("{OURS}: the probe is not admitted");
    }
    let mut probe = Box::pin(prober.call(0));
    assert!(probe.as_mut().poll(&mut cx).is_pending(), "{OURS}: probe");
    assert_eq!(breaker.state(), State::HalfOpen, "{OURS}: with a probe");
    let mut ours = CircuitBreaker::new(inner(), &breaker);
    expect_refused(OURS, &mut ours);
    let ours_check = move |when: &str| {
        // The probe holds the only permit for as long as the scenario lives.
        let _ = &probe;
        assert_eq!(breaker.state(), State::HalfOpen, "{OURS}: {when} a run");
    };

    const PEER: &str = "half_open/tower-resilience";
    let (layer, handle) = resilience_layer(1, SHORT_OPEN);
    trip(PEER, &mut layer.layer(failing()));
    std::thread::sleep(PAST_SHORT_OPEN);
    let mut prober = layer.layer(hanging());
    if !matches!(prober.poll_ready(&mut cx), Poll::Ready(Ok(()))) {
        panic!("{PEER}: the probe is not admitted");
    }
    let mut probe: Pin<Box<dyn Future<Output = _> + Send>> = prober.call(0);
    assert!(probe.as_mut().poll(&mut cx).is_pending(), "{PEER}: probe");
    assert_eq!(
        handle.state(),
        CircuitState::HalfOpen,
        "{PEER}: with a probe"
    );
    let mut resilience = layer.layer(inner());
    expect_refused(PEER, &mut resilience);
    let mut peer_state = resilience_in(PEER, handle, CircuitState::HalfOpen);
    let peer_check = move |when: &str| {
        let _ = &probe;
        peer_state(when);
    };

    vec![
        Threaded::new(OURS, ours, Expect::Refused, ours_check, runtime.clone()),
        Threaded::new(
            PEER,
            resilience,
            Expect::Refused,
            peer_check,
            runtime.clone(),
        )
        .versus(OURS),
    ]
}

/// How much work the summary does.
struct Effort {
    mode: &'static str,
    rounds: u32,
    calls: u64,
    alloc_calls: u64,
    /// Rounds and calls per thread of the threaded scenarios.
    thread_rounds: u32,
    thread_calls: u64,
}

/// `peer`'s added cost over `ours`': `-` when this crate's is too small
/// to divide by (under a tenth of a nanosecond).
fn times_ours(peer: f64, ours: Option<f64>) -> String {
    match ours {
        Some(ours) if ours >= 0.1 => format!("{:.1}x", peer / ours),
        Some(_) => "-".to_string(),
        None => String::new(),
    }
}

/// Times every scenario (the minimum over `rounds` rounds of `calls` calls,
/// the scenarios taking turns within each round so that a slow spell of the
/// machine is shared), counts its allocations, and prints the table.
fn summarize(scenarios: &mut [Scenario], effort: &Effort) {
    for scenario in scenarios.iter_mut() {
        (scenario.run)(effort.calls / 10 + 1);
    }
    let mut best = vec![Duration::MAX; scenarios.len()];
    for _ in 0..effort.rounds {
        for (scenario, best) in scenarios.iter_mut().zip(&mut best) {
            *best = (*best).min((scenario.run)(effort.calls));
        }
    }
    let allocs: Vec<f64> = scenarios
        .iter_mut()
        .map(|scenario| {
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            (scenario.run)(effort.alloc_calls);
            let after = ALLOCATIONS.load(Ordering::Relaxed);
            (after - before) as f64 / effort.alloc_calls as f64
        })
        .collect();

    let ns: Vec<f64> = best
        .iter()
        .map(|d| d.as_nanos() as f64 / effort.calls as f64)
        .collect();
    assert_eq!(scenarios[0].name, "bare", "the baseline comes first");
    let bare = ns[0];
    let round_trip = scenarios
        .iter()
        .position(|s| s.name == "reference/arc_round_trip")
        .map(|i| ns[i] - bare)
        .expect("the reference-count round trip is measured");
    println!();
    println!(
        "hot path summary ({}): min of {} rounds x {} calls; allocations over {} calls",
        effort.mode, effort.rounds, effort.calls, effort.alloc_calls
    );
    println!(
        "{:<32} {:>9} {:>12} {:>12} {:>13}  {:<20} {:>7}",
        "scenario", "ns/call", "+ns vs bare", "allocs/call", "+ns / arc rt", "vs", "x ours"
    );
    // A `boxed/*` row is measured over its own inner service.
    let boxed_bare = scenarios
        .iter()
        .position(|s| s.name == "boxed/bare")
        .map_or(bare, |i| ns[i]);
    let baseline = |name: &str| {
        if name.starts_with("boxed/") && name != "boxed/bare" {
            boxed_bare
        } else {
            bare
        }
    };
    let added = |name: &str| {
        scenarios
            .iter()
            .position(|s| s.name == name)
            .map(|i| ns[i] - baseline(name))
    };
    for ((scenario, ns), allocs) in scenarios.iter().zip(&ns).zip(&allocs) {
        let ours = scenario.versus.map(added);
        let plus = ns - baseline(scenario.name);
        println!(
            "{:<32} {:>9.2} {:>12.2} {:>12.2} {:>13.2}  {:<20} {:>7}",
            scenario.name,
            ns,
            plus,
            allocs,
            plus / round_trip,
            scenario.versus.unwrap_or(""),
            times_ours(plus, ours.flatten()),
        );
    }
}

/// Runs every threaded scenario on one thread and on two (the best of
/// `thread_rounds` rounds each, by wall time, scenarios taking turns), and
/// prints the table.
fn summarize_threads(scenarios: &mut [Threaded], effort: &Effort) {
    let calls = effort.thread_calls;
    let mut best: Vec<[Option<Run>; 2]> = vec![[None, None]; scenarios.len()];
    for _ in 0..effort.thread_rounds {
        for (scenario, best) in scenarios.iter_mut().zip(&mut best) {
            for (threads, best) in [1, 2].into_iter().zip(best.iter_mut()) {
                let run = (scenario.run)(threads, calls);
                if best.is_none_or(|b| run.wall < b.wall) {
                    *best = Some(run);
                }
            }
        }
    }
    let best: Vec<[Run; 2]> = best
        .into_iter()
        .map(|[one, two]| [one.expect("one round"), two.expect("one round")])
        .collect();
    let bare = scenarios
        .iter()
        .position(|s| s.name == "threads/bare")
        .map(|i| best[i][1].ns_per_call());
    let added = |i: usize| bare.map(|bare| best[i][1].ns_per_call() - bare);

    println!();
    println!(
        "two threads sharing one breaker through clones ({}): best of {} rounds x {} calls per thread",
        effort.mode, effort.thread_rounds, calls
    );
    println!(
        "closed: every call served; half_open: a probe in flight holds the only permit, every call refused"
    );
    println!(
        "M calls/s: all threads together; scaling: two threads over one; per call: each thread's time, two threads"
    );
    println!(
        "{:<44} {:>10} {:>10} {:>8} {:>9} {:>12} {:>12}  {:<31} {:>7}",
        "scenario",
        "1 thr M/s",
        "2 thr M/s",
        "scaling",
        "ns/call",
        "+ns vs bare",
        "pending/call",
        "vs",
        "x ours"
    );
    for (i, (scenario, [one, two])) in scenarios.iter().zip(&best).enumerate() {
        let ours = scenario
            .versus
            .and_then(|name| scenarios.iter().position(|s| s.name == name))
            .and_then(added);
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>8.2} {:>9.2} {:>12} {:>12.3}  {:<31} {:>7}",
            scenario.name,
            one.calls_per_sec() / 1e6,
            two.calls_per_sec() / 1e6,
            two.calls_per_sec() / one.calls_per_sec(),
            two.ns_per_call(),
            added(i).map_or(String::new(), |ns| format!("{ns:.2}")),
            two.waits_per_call(),
            scenario.versus.unwrap_or(""),
            added(i).map_or(String::new(), |ns| times_ours(ns, ours)),
        );
    }
    // Nothing is shared between the bare threads: unless something else
    // runs on the machine, two of them do twice the work of one. (A test
    // run's hundred calls are too few to tell.)
    let bare = scenarios.iter().position(|s| s.name == "threads/bare");
    if let Some(i) = bare.filter(|_| calls >= 10_000) {
        let [one, two] = best[i];
        let scaling = two.calls_per_sec() / one.calls_per_sec();
        if scaling < 1.6 {
            println!(
                "note: threads/bare scaled {scaling:.2}x, not about 2x: other work shares the cores, \
                 and the two-thread figures above are not reliable; run again on an idle machine"
            );
        }
    }
}

fn main() {
    // `tower::timeout` creates a tokio `Sleep` in every `call`, which needs a
    // runtime with a time driver in context. Nothing is ever spawned or
    // registered on it (the inner future is ready at the first poll, before
    // the sleep is polled), and tokio's clock reads the same inside a
    // context as outside while time is not paused, so it is entered once
    // for every scenario alike.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let _context = runtime.enter();

    let args: Vec<String> = std::env::args().collect();
    // As criterion does: without `--bench` (or with `--test`) this is
    // `cargo test`, an unoptimised build where only correctness means
    // anything.
    let test = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    let quick = std::env::var_os("HOT_PATH_QUICK").is_some_and(|v| v == "1");

    let mut scenarios = scenarios();
    // `HOT_PATH_ONLY=closed/consecutive` keeps one scenario (with its
    // baselines), for profiling it alone.
    if let Ok(only) = std::env::var("HOT_PATH_ONLY") {
        let boxed = only.starts_with("boxed/");
        scenarios.retain(|s| {
            s.name == "bare"
                || s.name == "reference/arc_round_trip"
                || (boxed && s.name == "boxed/bare")
                || s.name == only
        });
    }
    let effort = if test {
        Effort {
            mode: "test run, timings mean nothing",
            rounds: 1,
            calls: 100,
            alloc_calls: 100,
            thread_rounds: 1,
            thread_calls: 100,
        }
    } else if quick {
        Effort {
            mode: "quick",
            rounds: 3,
            calls: 200_000,
            alloc_calls: 100_000,
            thread_rounds: 2,
            thread_calls: 100_000,
        }
    } else {
        run_criterion(&mut scenarios);
        Effort {
            mode: "full",
            rounds: 7,
            calls: 2_000_000,
            alloc_calls: 100_000,
            thread_rounds: 3,
            thread_calls: 1_000_000,
        }
    };
    summarize(&mut scenarios, &effort);

    // The threads enter this runtime: its one worker, idle, drives the
    // timer that a peer's sleeps need (tower-resilience sleeps 1 ms when
    // the other thread holds its lock in `poll_ready`).
    let threads_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let mut threaded: Vec<Threaded> = threaded_closed(threads_runtime.handle())
        .into_iter()
        .chain(threaded_half_open(threads_runtime.handle()))
        .collect();
    if let Ok(only) = std::env::var("HOT_PATH_ONLY") {
        threaded.retain(|s| s.name == "threads/bare" || s.name == only);
    }
    summarize_threads(&mut threaded, &effort);
}
