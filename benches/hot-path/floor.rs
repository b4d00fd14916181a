//! The floor: the least a tower circuit breaker that works must do on a
//! call, written here so that every crate's added cost can be read as a
//! distance from it (the `floor/*` rows).
//!
//! An `Arc` holds a count of consecutive failures and the end of the open
//! period (nanoseconds from a base `Instant`). `call` reads the clock only
//! once the count has reached the threshold, and refuses while the period
//! runs; the response future records the outcome: a failure adds one to the
//! count (at the threshold it opens the breaker for `open_for`), a success
//! stores 0, only if the count is not 0 already. Past the open period every
//! call is admitted (a half-open without a probe limit, as failsafe's and
//! recloser's), and the first success closes. A cancelled or panicking call
//! records nothing. Nothing is configurable, observable or shared across a
//! fleet: it is a floor, not a breaker to use.
//!
//! Its error is typed (the inner service's, or [`FloorError::Open`]), so a
//! refusal allocates nothing, as this crate's rows with `BenchError`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::Service;

use crate::scenario::{Caller, Scenario};
use crate::services::{
    expect_refused, expect_served, failing, inner, trip, Refusal, COOLDOWN, HOUR,
};

/// What every clone of one floor breaker shares.
pub struct Shared {
    failures: AtomicU32,
    /// Nanoseconds from `base` until which calls are refused; read only
    /// once `failures` has reached `threshold`.
    open_until: AtomicU64,
    base: Instant,
    threshold: u32,
    open_for: Duration,
}

impl Shared {
    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn refuses_now(&self) -> bool {
        self.failures.load(Relaxed) >= self.threshold && self.now() < self.open_until.load(Relaxed)
    }

    fn failure(&self) {
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        // A call that reads the count before this store sees the old open
        // period (or none) and is admitted: a race that lets one more call
        // through, never one that keeps the breaker open.
        if failures >= self.threshold {
            let until = self.now() + self.open_for.as_nanos() as u64;
            self.open_until.store(until, Relaxed);
        }
    }

    fn success(&self) {
        // Only a write when there is something to reset: a read is all a
        // healthy call pays, and the cache line stays shared between cores.
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
    }
}

/// The floor breaker in front of `inner`; clones share one circuit.
#[derive(Clone)]
pub struct Floor<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Floor<S> {
    /// A closed breaker in front of `inner`: `threshold` consecutive
    /// failures open it for `open_for`.
    pub fn new(inner: S, threshold: u32, open_for: Duration) -> Self {
        Floor {
            inner,
            shared: Arc::new(Shared {
                failures: AtomicU32::new(0),
                open_until: AtomicU64::new(0),
                base: Instant::now(),
                threshold,
                open_for,
            }),
        }
    }

    /// Another breaker in front of `inner`, on the same circuit.
    pub fn sharing<T>(&self, inner: T) -> Floor<T> {
        Floor {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }

    /// A check that the circuit refuses calls (`open`) or not, for a
    /// row's state check.
    pub fn check(&self, name: &str, open: bool) -> impl FnMut(&str) + 'static {
        let shared = Arc::clone(&self.shared);
        let name = name.to_string();
        move |when| {
            let refuses = shared.refuses_now();
            assert_eq!(
                refuses, open,
                "{name}: circuit refuses: {refuses} {when} a run"
            );
        }
    }
}

/// The floor's error: the inner service's, or a refusal.
#[derive(Debug)]
pub enum FloorError<E> {
    Inner(E),
    Open,
}

impl<E: fmt::Debug> Refusal for FloorError<E> {
    fn is_refusal(&self) -> bool {
        matches!(self, FloorError::Open)
    }
}

impl<S> Service<u64> for Floor<S>
where
    S: Service<u64>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = FloorError<S::Error>;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(FloorError::Inner)
    }

    fn call(&mut self, req: u64) -> Self::Future {
        FloorFuture::admit(Cow::Borrowed(&self.shared), || self.inner.call(req))
    }
}

/// The floor's response future: the inner future, recording its outcome,
/// or a refusal.
// The inner future must be `Unpin` (every inner service here answers with
// `Ready`): that spares a pin projection and a dependency the workspace
// lock does not list for this package; a projection would cost nothing at
// run time.
pub enum FloorFuture<F> {
    Called { inner: F, shared: Arc<Shared> },
    Refused,
}

impl<F> FloorFuture<F> {
    /// A call through the floor breaker `shared`: refused while it is open
    /// (the clock read only when the count says it may be), else `call`ed.
    /// A borrowed breaker is cloned for the future only once admitted; an
    /// owned one (a keyed lookup's) moves in, so that neither floor pays a
    /// reference count the other does not.
    fn admit(shared: Cow<'_, Arc<Shared>>, call: impl FnOnce() -> F) -> Self {
        if shared.refuses_now() {
            return FloorFuture::Refused;
        }
        FloorFuture::Called {
            inner: call(),
            shared: shared.into_owned(),
        }
    }
}

impl<F, T, E> Future for FloorFuture<F>
where
    F: Future<Output = Result<T, E>> + Unpin,
{
    type Output = Result<T, FloorError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            FloorFuture::Called { inner, shared } => match Pin::new(inner).poll(cx) {
                Poll::Ready(Ok(response)) => {
                    shared.success();
                    Poll::Ready(Ok(response))
                }
                Poll::Ready(Err(err)) => {
                    shared.failure();
                    Poll::Ready(Err(FloorError::Inner(err)))
                }
                Poll::Pending => Poll::Pending,
            },
            FloorFuture::Refused => Poll::Ready(Err(FloorError::Open)),
        }
    }
}

/// The floor's rows for `caller`: closed (5 consecutive failures, 30 s
/// open: this crate's default) and forced open (one failure, an hour),
/// in front of the typed inner service, measured over `bare` and compared
/// with this crate's `closed/consecutive` and `rejected`.
pub fn rows(caller: Caller) -> Vec<Scenario> {
    vec![
        closed(caller, "floor/closed").versus("closed/consecutive"),
        rejected(caller, "floor/rejected").versus("rejected"),
    ]
    .into_iter()
    .map(|row| row.over("bare"))
    .collect()
}

/// The floor, closed, in front of the typed inner service, checked to
/// serve a call, as the row `name`.
pub fn closed(caller: Caller, name: &str) -> Scenario {
    let full = format!("{}{name}", caller.prefix());
    let mut floor = Floor::new(inner(), 5, COOLDOWN);
    expect_served(&full, &mut floor);
    let check = floor.check(&full, false);
    Scenario::new(caller, name, floor, check)
}

/// The floor, open for an hour after one failure (through a second service
/// on the same circuit, whose inner service fails), checked to refuse a
/// call, as the row `name`.
fn rejected(caller: Caller, name: &str) -> Scenario {
    let full = format!("{}{name}", caller.prefix());
    let mut floor = Floor::new(inner(), 1, HOUR);
    trip(&full, &mut floor.sharing(failing()));
    expect_refused(&full, &mut floor);
    let check = floor.check(&full, true);
    Scenario::new(caller, name, floor, check)
}

/// The keyed floor: the least a keyed breaker must do on a call, for the
/// `floor/keyed/*` rows. A table of floor breakers by key, as a user would
/// write it (std's `HashMap` with its default hasher, behind an `RwLock`):
/// `call` hashes the key, reads the table under the lock, takes a reference
/// to the key's breaker and checks it; the response future records the
/// outcome there, as [`Floor`]'s does. Every breaker is made beforehand;
/// nothing is bounded, evicted, remembered between calls or shared with a
/// parent.
#[derive(Clone)]
pub struct KeyedFloor<S, F> {
    inner: S,
    table: Arc<RwLock<HashMap<u64, Arc<Shared>>>>,
    key_of: F,
}

impl<S, F> KeyedFloor<S, F> {
    /// A closed floor breaker for each of `keys` keys in front of `inner`,
    /// call `i` going to the breaker of `key_of(&i)`.
    pub fn new(inner: S, keys: u64, key_of: F) -> Self {
        let base = Instant::now();
        let table = (0..keys)
            .map(|key| {
                let shared = Shared {
                    failures: AtomicU32::new(0),
                    open_until: AtomicU64::new(0),
                    base,
                    threshold: 5,
                    open_for: COOLDOWN,
                };
                (key, Arc::new(shared))
            })
            .collect();
        KeyedFloor {
            inner,
            table: Arc::new(RwLock::new(table)),
            key_of,
        }
    }

    /// A check that the table holds `keys` breakers, and that the breakers
    /// of the first eight keys refuse nothing. Only eight: a walk over every
    /// breaker before each run would bring the whole table into the caches
    /// for the timed loop, as the keyed rows' check (the registry's length)
    /// does not for theirs, and the floor would be timed warm beside rows
    /// timed cold.
    pub fn check(&self, name: &str, keys: u64) -> impl FnMut(&str) + 'static {
        let table = Arc::clone(&self.table);
        let name = name.to_string();
        move |when| {
            let table = table.read().expect("the floor's table");
            assert_eq!(table.len() as u64, keys, "{name}: keys {when} a run");
            assert!(
                !(0..keys.min(8)).any(|key| table[&key].refuses_now()),
                "{name}: a breaker refuses {when} a run"
            );
        }
    }
}

impl<S, F> Service<u64> for KeyedFloor<S, F>
where
    S: Service<u64>,
    S::Future: Unpin,
    F: Fn(&u64) -> u64,
{
    type Response = S::Response;
    type Error = FloorError<S::Error>;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(FloorError::Inner)
    }

    fn call(&mut self, req: u64) -> Self::Future {
        let key = (self.key_of)(&req);
        let shared = {
            let table = self.table.read().unwrap_or_else(|p| p.into_inner());
            match table.get(&key) {
                Some(shared) => Arc::clone(shared),
                None => return FloorFuture::Refused,
            }
        };
        FloorFuture::admit(Cow::Owned(shared), || self.inner.call(req))
    }
}
