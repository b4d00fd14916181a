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
//! * `rejected`: the breaker, open, refusing every call with `CircuitOpen`.
//! * `reference/*`: `tower::load_shed` and `tower::timeout` around the same
//!   inner service, for scale, and `reference/arc_round_trip`: the inner
//!   service plus one uncontended reference-count round trip per call (an
//!   `Arc` cloned into the response future and dropped with it), the price
//!   any response future that outlives its service pays. The last column of
//!   the summary gives every scenario's added cost in units of it, a ratio
//!   that holds from one machine to another where nanoseconds do not.
//! * `boxed/*`: the same with an inner service whose error is `BoxError`,
//!   where every rejection is boxed.
//!
//! `cargo bench --bench hot_path` runs criterion on every scenario, then
//! prints a summary table: nanoseconds per call (the minimum over several
//! rounds, timed here rather than read back from criterion), nanoseconds
//! added over `bare`, and heap allocations per call (counted by the global
//! allocator below). With `HOT_PATH_QUICK=1` criterion is skipped and the
//! table comes from fewer rounds, in a few seconds. Run as a test
//! (`cargo test --benches`), every scenario is only checked, with a handful
//! of calls, because an unoptimised build says nothing about speed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::Criterion;
use tower::load_shed::LoadShed;
use tower::timeout::Timeout;
use tower::util::ServiceFn;
use tower::{service_fn, BoxError, Service};
use tower_circuit_breaker::policy::{
    ConsecutiveFailures, CountWindow, SlowCalls, TimeWindow, TripPolicy,
};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, Readiness, State};

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

/// An error that can say whether it is the breaker's refusal.
trait Refusal: fmt::Debug {
    fn circuit_open(&self) -> Option<&CircuitOpen>;
}

impl Refusal for BenchError {
    fn circuit_open(&self) -> Option<&CircuitOpen> {
        match self {
            BenchError::Failed => None,
            BenchError::Open(open) => Some(open),
        }
    }
}

impl Refusal for BoxError {
    fn circuit_open(&self) -> Option<&CircuitOpen> {
        CircuitOpen::find(self.as_ref())
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

/// A waker that does nothing: every service measured here is ready at once,
/// so nothing is ever woken.
// `Waker::noop` is newer than the library's minimum Rust version; this
// benchmark is a development target, built with a current toolchain, and
// nothing in the library depends on it.
#[allow(clippy::incompatible_msrv)]
fn noop_waker() -> &'static Waker {
    Waker::noop()
}

/// One call, as a caller without an executor makes it: readiness, call, and
/// one poll of the response future, pinned on the stack.
#[inline(always)]
fn call_once<S: Service<u64>>(
    svc: &mut S,
    cx: &mut Context<'_>,
    x: u64,
) -> Poll<Result<S::Response, S::Error>> {
    if !matches!(svc.poll_ready(cx), Poll::Ready(Ok(()))) {
        not_ready();
    }
    let future = pin!(svc.call(x));
    future.poll(cx)
}

#[cold]
#[inline(never)]
fn not_ready() -> ! {
    panic!("every benchmarked service must be ready at once")
}

/// The driving loop shared by criterion, the summary's timing and the
/// allocation count: `calls` calls, timed as a whole.
fn drive<S: Service<u64>>(svc: &mut S, calls: u64) -> Duration {
    let mut cx = Context::from_waker(noop_waker());
    let start = Instant::now();
    for i in 0..calls {
        let _ = black_box(call_once(svc, &mut cx, black_box(i)));
    }
    start.elapsed()
}

/// A service under measurement, with the loop monomorphised for its type
/// and boxed, so that every scenario is run through the same entry point.
struct Scenario {
    name: &'static str,
    run: Box<dyn FnMut(u64) -> Duration>,
}

impl Scenario {
    /// A scenario; with `breaker`, the breaker must be in the given state
    /// whenever it is measured. That is checked before and after every run,
    /// outside the timing, so that a `closed` figure cannot come from a
    /// breaker that opened, nor a `rejected` one from a breaker that closed.
    fn new<S>(name: &'static str, mut svc: S, breaker: Option<(Breaker, State)>) -> Self
    where
        S: Service<u64> + 'static,
    {
        let check = move |when: &str| {
            if let Some((breaker, expected)) = &breaker {
                let state = breaker.state();
                assert_eq!(
                    state, *expected,
                    "{name}: breaker is {state:?} {when} a run"
                );
            }
        };
        let run = move |calls| {
            check("before");
            let elapsed = drive(&mut svc, calls);
            check("after");
            elapsed
        };
        Scenario {
            name,
            run: Box::new(run),
        }
    }
}

/// Checks that one call through `svc` is served and returns its request.
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

/// Checks that one call through `svc` is refused with `CircuitOpen`.
fn expect_refused<S, E>(name: &str, svc: &mut S)
where
    S: Service<u64, Response = u64, Error = E>,
    E: Refusal,
{
    let mut cx = Context::from_waker(noop_waker());
    match call_once(svc, &mut cx, 7) {
        Poll::Ready(Err(err)) if err.circuit_open().is_some() => {}
        Poll::Ready(Err(err)) => panic!("{name}: expected CircuitOpen, got {err:?}"),
        Poll::Ready(Ok(_)) => panic!("{name}: expected a refusal, the call was served"),
        Poll::Pending => panic!("{name}: expected a refusal, the call is pending"),
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

/// A breaker, open for an hour, in front of `inner`, checked to refuse a
/// call. It is tripped by one failure through a second service on the same
/// breaker, whose inner service always fails, so that the measured service
/// wraps exactly the inner service of the other scenarios.
fn rejected<S, E>(name: &'static str, inner: S, failure: fn() -> E) -> Scenario
where
    S: Service<u64, Response = u64, Error = E> + 'static,
    E: From<CircuitOpen> + Refusal + 'static,
{
    const HOUR: Duration = Duration::from_secs(3600);
    let config = Config::builder()
        .name(name)
        .trip(ConsecutiveFailures::new(1))
        .cooldown(HOUR)
        .max_open(HOUR)
        .build()
        .expect("valid benchmark config");
    let breaker = Breaker::new(config);
    let mut tripper =
        CircuitBreaker::new(service_fn(move |_: u64| ready(Err(failure()))), &breaker);
    let mut cx = Context::from_waker(noop_waker());
    let tripped: Poll<Result<u64, E>> = call_once(&mut tripper, &mut cx, 0);
    assert!(
        matches!(tripped, Poll::Ready(Err(_))),
        "{name}: tripping call"
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

    vec![
        Scenario::new("bare", bare, None),
        closed("closed/consecutive", Config::default(), inner()),
        closed_gate("closed/gate", Config::default(), inner()),
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
        rejected("rejected", inner(), || BenchError::Failed),
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
        Scenario::new("boxed/bare", bare_boxed, None),
        closed("boxed/closed/consecutive", Config::default(), inner_boxed()),
        rejected("boxed/rejected", inner_boxed(), || BoxError::from("down")),
    ]
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

/// How much work the summary does.
struct Effort {
    mode: &'static str,
    rounds: u32,
    calls: u64,
    alloc_calls: u64,
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
        "{:<26} {:>9} {:>12} {:>12} {:>14}",
        "scenario", "ns/call", "+ns vs bare", "allocs/call", "+ns / arc rt"
    );
    for ((scenario, ns), allocs) in scenarios.iter().zip(&ns).zip(&allocs) {
        println!(
            "{:<26} {:>9.2} {:>12.2} {:>12.2} {:>14.2}",
            scenario.name,
            ns,
            ns - bare,
            allocs,
            (ns - bare) / round_trip
        );
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
    // `HOT_PATH_ONLY=closed/consecutive` keeps one scenario (with the two
    // baselines), for profiling it alone.
    if let Ok(only) = std::env::var("HOT_PATH_ONLY") {
        scenarios
            .retain(|s| s.name == "bare" || s.name == "reference/arc_round_trip" || s.name == only);
    }
    let effort = if test {
        Effort {
            mode: "test run, timings mean nothing",
            rounds: 1,
            calls: 100,
            alloc_calls: 100,
        }
    } else if quick {
        Effort {
            mode: "quick",
            rounds: 3,
            calls: 200_000,
            alloc_calls: 100_000,
        }
    } else {
        run_criterion(&mut scenarios);
        Effort {
            mode: "full",
            rounds: 7,
            calls: 2_000_000,
            alloc_calls: 100_000,
        }
    };
    summarize(&mut scenarios, &effort);
}
