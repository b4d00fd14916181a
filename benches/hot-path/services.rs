//! The inner services every row wraps, the error types they answer with,
//! and the checks that a service is in the state a row measures.

use std::error::Error;
use std::fmt;
use std::future::{pending, ready, Future, Pending, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::util::ServiceFn;
use tower::{service_fn, BoxError, Service};
use tower_circuit_breaker::policy::TripPolicy;
use tower_circuit_breaker::registry::{Registry, RegistryFull};
use tower_circuit_breaker::{CircuitOpen, Config};

use crate::driver::{call_once, noop_waker};

/// How long a forced-open breaker stays open: longer than any run.
pub const HOUR: Duration = Duration::from_secs(3600);

/// This crate's default first open period, given to every peer too.
pub const COOLDOWN: Duration = Duration::from_secs(30);

/// A typed error that holds a rejection by value: with it, refusing a call
/// needs no allocation, which isolates the breaker's own cost from boxing.
#[derive(Debug)]
pub enum BenchError {
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
pub trait Refusal: fmt::Debug {
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

/// The inner service of every typed-error row: answers at once.
pub fn inner() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BenchError>> + Clone> {
    service_fn(|x: u64| ready(Ok::<u64, BenchError>(x)))
}

/// The inner service of the `boxed/*` rows: answers at once, with tower's
/// `BoxError` as its error type.
pub fn inner_boxed() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BoxError>> + Clone> {
    service_fn(|x: u64| ready(Ok::<u64, BoxError>(x)))
}

/// The inner service that always fails: trips a breaker.
pub fn failing() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, BenchError>> + Clone> {
    service_fn(|_: u64| ready(Err::<u64, BenchError>(BenchError::Failed)))
}

/// The inner service that never answers: a probe that stays in flight.
pub fn hanging() -> ServiceFn<impl Fn(u64) -> Pending<Result<u64, BenchError>> + Clone> {
    service_fn(|_: u64| pending::<Result<u64, BenchError>>())
}

/// The inner service with one uncontended reference-count round trip per
/// call: its response future holds a clone of an `Arc` and drops it.
#[derive(Clone)]
pub struct ArcRoundTrip {
    pub shared: std::sync::Arc<u64>,
}

/// Response future of [`ArcRoundTrip`].
pub struct ArcFuture {
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

/// Checks that one call through `svc` is served and returns its request.
// Kept here rather than in the shared driver (as `benches/fleet.rs` could
// use it): moved there, it shifted every row of this bench by 1 to 15 ns,
// measured, through where the compiler placed the measured loops.
pub fn expect_served<S, E>(name: &str, svc: &mut S)
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
pub fn expect_refused<S, E>(name: &str, svc: &mut S)
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

/// Makes one call through `tripper` that must fail (not be refused): the
/// failure that opens a breaker with a one-failure threshold.
pub fn trip<S: Service<u64>>(name: &str, tripper: &mut S)
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
pub fn config(name: &str, policy: impl Into<TripPolicy>) -> Config {
    Config::builder()
        .name(name)
        .trip(policy)
        .build()
        .expect("valid benchmark config")
}

/// A registry of the keys `0..keys`, full, each key's breaker made (under
/// the default config) before any row calls it.
pub fn registry_of(keys: u64) -> Registry<u64> {
    let registry = Registry::<u64>::builder()
        .default_config(Config::default())
        .max_keys(keys as usize)
        .build();
    for key in 0..keys {
        registry.get(&key).expect("room for every key");
    }
    registry
}
