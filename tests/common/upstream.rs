//! The fake upstream the tests put behind a breaker: it succeeds or fails
//! on command (or as each request says), answers at once or after a delay
//! on tokio's clock, can hold its readiness back, and counts what reaches
//! it.
//!
//! One type, [`Upstream<R>`], for every kind of request a test sends; `R`
//! says what the requests are and what they are answered with ([`Ask`]):
//!
//! * `u32` (the default) is echoed; request `0` counts as a probe;
//! * `()` is answered with `()`;
//! * a [`Call`] says itself what the upstream does with it, whatever the
//!   switch says, and is answered with `()`;
//! * an `http::Request<B>` is answered with its method.
//!
//! Every failure is an [`InnerFailure`], so a test tells it from a
//! breaker's refusal (`super::is_inner_failure`).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tower::{BoxError, Service};

use super::panics::SCRIPTED_PANIC;

/// The error the upstream fails with, so a test can tell an inner failure
/// from a breaker rejection.
#[derive(Debug)]
pub struct InnerFailure;

impl fmt::Display for InnerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("inner service failed")
    }
}

impl Error for InnerFailure {}

/// What the upstream does with a call: what a [`Call`] request asks, or,
/// for any other request, what [`Upstream::set`] last said.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// Answer `Ok` at once.
    Ok,
    /// Answer `Err(InnerFailure)` at once.
    Fail,
    /// Sleep (on tokio's clock), then answer `Ok`.
    SlowOk(Duration),
    /// Sleep (on tokio's clock), then answer `Err(InnerFailure)`.
    SlowFail(Duration),
    /// Panic when the call's future is first polled (with the message
    /// `panics::quiet_scripted_panics` keeps out of the output).
    Panic,
}

impl Call {
    async fn run(self) -> Result<(), BoxError> {
        match self {
            Call::Ok => Ok(()),
            Call::Fail => Err(InnerFailure.into()),
            Call::SlowOk(delay) => {
                tokio::time::sleep(delay).await;
                Ok(())
            }
            Call::SlowFail(delay) => {
                tokio::time::sleep(delay).await;
                Err(InnerFailure.into())
            }
            Call::Panic => panic!("{}", SCRIPTED_PANIC),
        }
    }
}

/// A request the upstream takes: what it is answered with, and whether it
/// says itself what the upstream does or is a probe.
pub trait Ask: Send + 'static {
    type Answer: Send + 'static;

    /// What the upstream does with this request, if the request says so;
    /// `None` leaves it to the upstream's switch.
    fn script(&self) -> Option<Call> {
        None
    }

    /// Whether the upstream counts this request as a probe.
    fn is_probe(&self) -> bool {
        false
    }

    /// The answer to this request, when the call succeeds.
    fn answer(self) -> Self::Answer;
}

/// Echoed; `0` is a probe.
impl Ask for u32 {
    type Answer = u32;

    fn is_probe(&self) -> bool {
        *self == 0
    }

    fn answer(self) -> u32 {
        self
    }
}

impl Ask for () {
    type Answer = ();

    fn answer(self) {}
}

/// Does what it says.
impl Ask for Call {
    type Answer = ();

    fn script(&self) -> Option<Call> {
        Some(*self)
    }

    fn answer(self) {}
}

/// Answered with its method, so a test can tell which request got through.
impl<B: Send + 'static> Ask for http::Request<B> {
    type Answer = http::Method;

    fn answer(self) -> http::Method {
        self.method().clone()
    }
}

/// What every clone of one upstream shares.
struct Shared {
    /// What a request that does not say it itself gets.
    next: Mutex<Call>,
    ready: AtomicBool,
    /// The tasks `poll_ready` left pending, woken when it is ready again.
    waiting: Mutex<Vec<Waker>>,
    polls: AtomicUsize,
    calls: AtomicUsize,
    probes: AtomicUsize,
    /// When each call reached it (tokio's clock: paused time in paused
    /// tests, real time otherwise).
    arrivals: Mutex<Vec<Instant>>,
}

/// The fake upstream: clones share its switch, readiness and counters.
///
/// It starts succeeding and ready. [`fail`](Upstream::fail),
/// [`recover`](Upstream::recover) and [`set`](Upstream::set) say what later
/// calls do (a [`Call`] request says it itself);
/// [`set_ready`](Upstream::set_ready) holds `poll_ready` back (`Pending`,
/// waking the waiting tasks once ready again). The outcome of a call is
/// settled when it is made, its delay runs on tokio's clock.
pub struct Upstream<R = u32> {
    shared: Arc<Shared>,
    requests: PhantomData<fn(R)>,
}

impl<R> Clone for Upstream<R> {
    fn clone(&self) -> Self {
        Upstream {
            shared: Arc::clone(&self.shared),
            requests: PhantomData,
        }
    }
}

impl<R> Default for Upstream<R> {
    fn default() -> Self {
        Upstream {
            shared: Arc::new(Shared {
                next: Mutex::new(Call::Ok),
                ready: AtomicBool::new(true),
                waiting: Mutex::default(),
                polls: AtomicUsize::new(0),
                calls: AtomicUsize::new(0),
                probes: AtomicUsize::new(0),
                arrivals: Mutex::default(),
            }),
            requests: PhantomData,
        }
    }
}

impl<R> fmt::Debug for Upstream<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("next", &*lock(&self.shared.next))
            .field("ready", &self.shared.ready.load(Ordering::SeqCst))
            .field("polls", &self.polls())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// The lock, even if a panicking test poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<R> Upstream<R> {
    /// An upstream whose calls fail until it recovers.
    pub fn failing() -> Self {
        let upstream = Upstream::default();
        upstream.fail();
        upstream
    }

    /// From now on every call fails at once.
    pub fn fail(&self) {
        self.set(Call::Fail);
    }

    /// From now on every call succeeds at once.
    pub fn recover(&self) {
        self.set(Call::Ok);
    }

    /// From now on every call does `call` (a [`Call`] request still does
    /// what it says).
    pub fn set(&self, call: Call) {
        *lock(&self.shared.next) = call;
    }

    /// Holds `poll_ready` back (`false`: `Pending`) or lets it through
    /// (`true`: ready, waking the tasks it left pending).
    pub fn set_ready(&self, ready: bool) {
        self.shared.ready.store(ready, Ordering::SeqCst);
        if ready {
            for waker in std::mem::take(&mut *lock(&self.shared.waiting)) {
                waker.wake();
            }
        }
    }

    /// How often `poll_ready` ran.
    pub fn polls(&self) -> usize {
        self.shared.polls.load(Ordering::SeqCst)
    }

    /// How many calls reached it.
    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    /// How many of those were probes (request `0` of a `u32` upstream).
    pub fn probes(&self) -> usize {
        self.shared.probes.load(Ordering::SeqCst)
    }

    /// How many calls were not probes.
    pub fn users(&self) -> usize {
        self.calls() - self.probes()
    }

    /// When each call reached it, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        lock(&self.shared.arrivals).clone()
    }
}

impl<R: Ask> Service<R> for Upstream<R> {
    type Response = R::Answer;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<R::Answer, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let shared = &self.shared;
        shared.polls.fetch_add(1, Ordering::SeqCst);
        if shared.ready.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        let mut waiting = lock(&shared.waiting);
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        drop(waiting);
        // Made ready while the waker was being registered.
        if shared.ready.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    fn call(&mut self, request: R) -> Self::Future {
        let shared = &self.shared;
        shared.calls.fetch_add(1, Ordering::SeqCst);
        if request.is_probe() {
            shared.probes.fetch_add(1, Ordering::SeqCst);
        }
        lock(&shared.arrivals).push(Instant::now());
        let call = request.script().unwrap_or_else(|| *lock(&shared.next));
        let answer = request.answer();
        Box::pin(async move { call.run().await.map(|()| answer) })
    }
}
