//! loom models of admission and transitions: every interleaving of the
//! breaker's atomics and locks between two threads is explored.
//!
//! Run with `RUSTFLAGS="--cfg tcb_loom" cargo test --release --test loom`
//! (`.ci/run` does). The cfg is the crate's own: tokio reads `cfg(loom)`.
#![cfg(tcb_loom)]

use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use tower::{service_fn, BoxError, Service};
use tower_circuit_breaker::classify::{Classified, Classify, Verdict};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TimeWindow};
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};

struct Noop;

impl Wake for Noop {
    fn wake(self: StdArc<Self>) {}
}

fn noop_waker() -> Waker {
    Waker::from(StdArc::new(Noop))
}

type Upstream = fn(bool) -> Ready<Result<(), BoxError>>;

fn upstream(fail: bool) -> Ready<Result<(), BoxError>> {
    ready(if fail { Err("down".into()) } else { Ok(()) })
}

fn config(threshold: u32, probes: u32) -> Config {
    Config::builder()
        .trip(ConsecutiveFailures::new(threshold))
        .probes(probes)
        .probe_timeout(Some(Duration::from_secs(60)))
        .build()
        .unwrap()
}

/// One call, to completion: the inner futures are ready at once.
fn call<S>(svc: &mut S, fail: bool) -> Option<Result<(), BoxError>>
where
    S: Service<bool, Response = (), Error = BoxError>,
{
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        _ => return None,
    }
    let mut future = pin!(svc.call(fail));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => Some(result),
        Poll::Pending => None,
    }
}

/// Runs `f` under loom with at most `PREEMPTIONS` preemptions per
/// execution (enough for every race between two threads here; `LOOM_MAX_PREEMPTIONS`
/// overrides it) and reports how many executions were explored.
fn model(name: &str, f: impl Fn() + Send + Sync + 'static) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTIONS);
    }
    let before = RUNS.load(std::sync::atomic::Ordering::SeqCst);
    builder.check(move || {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        f();
    });
    let runs = RUNS.load(std::sync::atomic::Ordering::SeqCst) - before;
    println!("{name}: {runs} interleavings explored");
}

const PREEMPTIONS: usize = 3;

/// A breaker whose open period has already ended: the next caller probes.
fn half_open(breaker: &Breaker) {
    breaker.force_open(Some(Duration::ZERO));
}

#[test]
fn two_clones_racing_in_half_open_reserve_exactly_the_one_permit() {
    model(
        "two_clones_racing_in_half_open_reserve_exactly_the_one_permit",
        || {
            let breaker = Breaker::new(config(1, 1));
            half_open(&breaker);
            let mut a = CircuitBreaker::new(service_fn(upstream as Upstream), &breaker);
            let mut b = a.clone();
            let other = thread::spawn(move || {
                let waker = noop_waker();
                let ready = b.poll_ready(&mut Context::from_waker(&waker)).is_ready();
                (b, ready)
            });
            let waker = noop_waker();
            assert!(a.poll_ready(&mut Context::from_waker(&waker)).is_ready());
            let (b, b_ready) = other.join().unwrap();
            assert!(b_ready, "fail-fast: ready either way");
            assert_eq!(breaker.snapshot().probes_in_flight, 1, "one reservation");
            drop(a);
            drop(b);
            assert_eq!(
                breaker.snapshot().probes_in_flight,
                0,
                "every reservation back"
            );
        },
    );
}

#[test]
fn concurrent_failures_trip_the_breaker_exactly_once() {
    model("concurrent_failures_trip_the_breaker_exactly_once", || {
        let breaker = Breaker::new(config(2, 1));
        let mut a = CircuitBreaker::new(service_fn(upstream as Upstream), &breaker);
        let mut b = a.clone();
        let other = thread::spawn(move || call(&mut b, true));
        let mine = call(&mut a, true);
        let theirs = other.join().unwrap();
        assert!(mine.unwrap().is_err() && theirs.unwrap().is_err());
        let snap = breaker.snapshot();
        assert_eq!(snap.state, State::Open);
        assert_eq!(snap.counts.opened, 1, "one transition");
        assert_eq!(snap.generation, 1);
        assert_eq!(snap.counts.failures, 2, "no outcome lost or counted twice");
    });
}

/// A time window tallies successes without the lock while none could trip
/// it. A success racing the failure that changes that must still be judged:
/// whichever comes first, two failures in four calls reach the rate.
#[test]
fn a_success_racing_the_failure_that_brings_the_window_near_its_rate_is_judged() {
    model(
        "a_success_racing_the_failure_that_brings_the_window_near_its_rate_is_judged",
        || {
            let config = Config::builder()
                .trip(
                    TimeWindow::new(Duration::from_secs(3_600))
                        .min_calls(4)
                        .failure_rate(0.5),
                )
                .build()
                .unwrap();
            let breaker = Breaker::new(config);
            let mut a = CircuitBreaker::new(service_fn(upstream as Upstream), &breaker);
            let mut b = a.clone();
            // One failure in two calls: no success could trip it yet.
            assert!(call(&mut a, false).unwrap().is_ok());
            assert!(call(&mut a, true).unwrap().is_err());
            let other = thread::spawn(move || call(&mut b, true));
            assert!(call(&mut a, false).unwrap().is_ok());
            assert!(other.join().unwrap().unwrap().is_err());
            let snap = breaker.snapshot();
            assert_eq!(snap.state, State::Open);
            assert_eq!(snap.counts.opened, 1);
        },
    );
}

#[test]
fn two_successful_probes_racing_close_the_breaker_exactly_once() {
    model(
        "two_successful_probes_racing_close_the_breaker_exactly_once",
        || {
            let breaker = Breaker::new(config(1, 2));
            half_open(&breaker);
            let mut a = CircuitBreaker::new(service_fn(upstream as Upstream), &breaker);
            let mut b = a.clone();
            let generation = breaker.snapshot().generation;
            let other = thread::spawn(move || call(&mut b, false));
            let mine = call(&mut a, false);
            let theirs = other.join().unwrap();
            assert!(mine.unwrap().is_ok() && theirs.unwrap().is_ok());
            let snap = breaker.snapshot();
            assert_eq!(snap.state, State::Closed);
            // Open -> half-open -> closed: two steps past the forced opening.
            assert_eq!(snap.generation, generation + 2, "closed once");
            assert_eq!(snap.probes_in_flight, 0);
        },
    );
}

/// A classifier that counts its live copies, to see the per-clone state
/// freed exactly once.
struct Tracked(Arc<AtomicUsize>);

impl Tracked {
    fn new(alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::SeqCst);
        Tracked(Arc::clone(alive))
    }
}

impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked::new(&self.0)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "freed twice");
    }
}

impl<T, E> Classify<T, E> for Tracked {
    type Eos = std::convert::Infallible;

    fn classify(&self, _: Result<&T, &E>) -> Classified<Self::Eos> {
        Verdict::new(tower_circuit_breaker::classify::Outcome::Success).into()
    }
}

#[test]
fn a_response_future_outliving_its_service_on_another_thread_frees_once() {
    model(
        "a_response_future_outliving_its_service_on_another_thread_frees_once",
        || {
            let alive = Arc::new(AtomicUsize::new(0));
            let breaker = Breaker::new(config(5, 1));
            let mut svc = CircuitBreaker::with_classifier(
                service_fn(upstream as Upstream),
                &breaker,
                Tracked::new(&alive),
            );
            let waker = noop_waker();
            assert!(svc.poll_ready(&mut Context::from_waker(&waker)).is_ready());
            let future = svc.call(false);
            let other = thread::spawn(move || {
                let mut future = pin!(future);
                let waker = noop_waker();
                assert!(future
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready());
            });
            drop(svc);
            other.join().unwrap();
            assert_eq!(alive.load(Ordering::SeqCst), 0, "freed, once");
        },
    );
}
