//! Two threads sharing one breaker through clones, each driving its own
//! clone in a tight loop for a fixed number of calls: calls per second on
//! one thread and on two, for this crate and each peer, and half-open
//! refusals under contention.

use std::future::Future;
use std::hint::black_box;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::{Layer, Service};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TimeWindow};
use tower_circuit_breaker::registry::KeyedLayer;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, State};
use tower_resilience_circuitbreaker::CircuitState;

use crate::cores;
use crate::driver::{noop_waker, not_ready};
use crate::peers::{
    failsafe_breaker, recloser_breaker, resilience_in, resilience_layer, serves, Failsafe, Recloser,
};
use crate::scenario::ratio;
use crate::services::{
    config, expect_refused, failing, hanging, inner, registry_of, trip, COOLDOWN,
};

/// Rounds and calls per thread.
pub struct ThreadRounds {
    pub mode: &'static str,
    pub rounds: u32,
    pub calls: u64,
}

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

/// What one thread of a run did.
struct ThreadRun {
    start: Instant,
    time: Duration,
    served: u64,
    waits: u64,
    /// Pinned to the core it was given.
    pinned: bool,
}

/// One run of a threaded scenario.
#[derive(Clone, Copy)]
struct Run {
    threads: usize,
    /// Every thread ran pinned to the core it was given.
    pinned: bool,
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
    run: RunOn,
}

/// The core a thread is pinned to, if any.
type Placement = Option<usize>;

/// A threaded scenario's runs: a thread per placement, pinned to the core
/// it names (`None`: left to the scheduler), each making the number of
/// calls given.
type RunOn = Box<dyn FnMut(&[Placement], u64) -> Run>;

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
        let run = move |placements: &[Placement], calls: u64| {
            let threads = placements.len();
            check("before");
            let clones: Vec<Option<S>> = (0..threads)
                .map(|_| (clone_on == CloneOn::Main).then(|| svc.clone()))
                .collect();
            let barrier = Barrier::new(threads);
            let running = AtomicUsize::new(0);
            let prototype = &svc;
            let runs: Vec<ThreadRun> = std::thread::scope(|scope| {
                let handles: Vec<_> = clones
                    .into_iter()
                    .zip(placements.iter().copied())
                    .map(|(clone, core)| {
                        let (barrier, running, runtime) = (&barrier, &running, &runtime);
                        scope.spawn(move || {
                            let pinned = core.is_some_and(cores::pin);
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
                            ThreadRun {
                                start,
                                time: start.elapsed(),
                                served,
                                waits,
                                pinned,
                            }
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
            for &ThreadRun { served, .. } in &runs {
                assert_eq!(
                    served, expected,
                    "{name}: calls served by one thread, of {calls} ({expect:?} expected)"
                );
            }
            let first = runs
                .iter()
                .map(|r| r.start)
                .min()
                .expect("one thread at least");
            let last = runs
                .iter()
                .map(|r| r.start + r.time)
                .max()
                .expect("one thread at least");
            Run {
                threads,
                pinned: runs.iter().all(|r| r.pinned),
                calls_per_thread: calls,
                wall: last - first,
                busy: runs.iter().map(|r| r.time).sum(),
                waits: runs.iter().map(|r| r.waits).sum(),
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
        breaker: recloser_breaker(),
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
            KeyedLayer::new(registry_of(10_000), |req: &u64| req % 4).layer(inner()),
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

/// Every threaded scenario (when `only` is given, `threads/bare` and the
/// scenario it names, or every one for `threads`), its threads entering
/// `runtime`, measured and printed.
pub fn run(runtime: &tokio::runtime::Handle, only: Option<&str>, rounds: &ThreadRounds) {
    let mut threaded: Vec<Threaded> = threaded_closed(runtime)
        .into_iter()
        .chain(threaded_half_open(runtime))
        .collect();
    if let Some(only) = only.filter(|&only| only != "threads") {
        threaded.retain(|s| s.name == "threads/bare" || s.name == only);
    }
    summarize_threads(&mut threaded, rounds);
}

/// A threaded scenario's median round: its one thread on the slower core
/// (or wherever the scheduler put it, unpinned), its one thread on the
/// faster core when threads are pinned, and its two threads.
///
/// A round's scaling is its two threads over its one thread on the slower
/// core. With as many calls on each thread, two threads take as long as
/// the slower core does, so two threads that share nothing do twice what it
/// does alone, whatever the other core's speed; and a round runs its
/// placements back to back, so that the ratio compares runs that met the
/// same load on the machine. The median round is the one with the median
/// scaling: every figure of the table's row comes from that one round.
struct Measured {
    slower: Run,
    faster: Option<Run>,
    two: Run,
}

impl Measured {
    /// From each round's runs, in the order of the placements (the
    /// one-thread ones, then the two-thread one).
    fn of(rounds: Vec<Vec<Run>>) -> Self {
        let mut rounds: Vec<Measured> = rounds
            .into_iter()
            .map(|mut runs| {
                let two = runs.pop().expect("a two-thread placement");
                runs.sort_by(|x, y| x.calls_per_sec().total_cmp(&y.calls_per_sec()));
                Measured {
                    slower: runs[0],
                    faster: runs.get(1).copied(),
                    two,
                }
            })
            .collect();
        rounds.sort_by(|x, y| x.scaling().total_cmp(&y.scaling()));
        let median = rounds.len() / 2;
        rounds.swap_remove(median)
    }

    fn scaling(&self) -> f64 {
        self.two.calls_per_sec() / self.slower.calls_per_sec()
    }
}

/// Runs every threaded scenario on one thread and on two (`rounds.rounds`
/// rounds, scenarios taking turns), and prints the table. Where threads
/// can be pinned (see the `cores` module), one thread runs on each of two
/// cores in turn, and the two threads one on each of them.
fn summarize_threads(scenarios: &mut [Threaded], rounds: &ThreadRounds) {
    let calls = rounds.calls;
    let cores = cores::two();
    // The one-thread placements, then the two-thread one.
    let placements: Vec<Vec<Placement>> = match cores {
        Some([a, b]) => vec![vec![Some(a)], vec![Some(b)], vec![Some(a), Some(b)]],
        None => vec![vec![None], vec![None, None]],
    };
    // Per scenario, per round, a run per placement.
    let mut runs: Vec<Vec<Vec<Run>>> = vec![Vec::new(); scenarios.len()];
    for _ in 0..rounds.rounds {
        for (scenario, runs) in scenarios.iter_mut().zip(&mut runs) {
            runs.push(
                placements
                    .iter()
                    .map(|placement| (scenario.run)(placement, calls))
                    .collect(),
            );
        }
    }
    let median: Vec<Measured> = runs.into_iter().map(Measured::of).collect();
    let pinned = cores.is_some()
        && median
            .iter()
            .all(|m| m.two.pinned && m.slower.pinned && m.faster.is_some_and(|f| f.pinned));
    let bare = scenarios.iter().position(|s| s.name == "threads/bare");
    let added =
        |i: usize| bare.map(|bare| median[i].two.ns_per_call() - median[bare].two.ns_per_call());

    println!();
    println!(
        "two threads sharing one breaker through clones ({}): the median of {} rounds x {} calls per thread",
        rounds.mode, rounds.rounds, calls
    );
    println!(
        "closed: every call served; half_open: a probe in flight holds the only permit, every call refused"
    );
    match cores {
        Some([a, b]) if pinned => println!(
            "one thread timed on core {a} and on core {b}, two threads one on each: 1 thr, the slower \
             core's M calls/s; other, the faster's; scaling: two threads over one on the slower core; \
             the median round: the one with the median scaling"
        ),
        _ => println!(
            "threads not pinned to cores (this machine or system does not allow it): scaling: two \
             threads over one; the median round: the one with the median scaling"
        ),
    }
    println!("M calls/s: all threads together; per call: each thread's time, two threads");
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>8} {:>9} {:>12} {:>12}  {:<31} {:>7}",
        "scenario",
        "1 thr M/s",
        "other M/s",
        "2 thr M/s",
        "scaling",
        "ns/call",
        "+ns vs bare",
        "pending/call",
        "vs",
        "x vs"
    );
    for (i, (scenario, measured)) in scenarios.iter().zip(&median).enumerate() {
        let ours = scenario
            .versus
            .and_then(|name| scenarios.iter().position(|s| s.name == name))
            .and_then(added);
        println!(
            "{:<44} {:>10.2} {:>10} {:>10.2} {:>8.2} {:>9.2} {:>12} {:>12.3}  {:<31} {:>7}",
            scenario.name,
            measured.slower.calls_per_sec() / 1e6,
            measured.faster.map_or("-".to_string(), |f| format!(
                "{:.2}",
                f.calls_per_sec() / 1e6
            )),
            measured.two.calls_per_sec() / 1e6,
            measured.scaling(),
            measured.two.ns_per_call(),
            added(i).map_or(String::new(), |ns| format!("{ns:.2}")),
            measured.two.waits_per_call(),
            scenario.versus.unwrap_or(""),
            added(i).map_or(String::new(), |ns| ratio(ns, ours)),
        );
    }
    // Nothing is shared between the bare threads: unless something else
    // runs on the machine, two of them do twice the work of one on the
    // slower core. (A test run's hundred calls are too few to tell.)
    if let Some(i) = bare.filter(|_| calls >= 10_000) {
        let scaling = median[i].scaling();
        if scaling < 1.6 {
            println!(
                "note: threads/bare scaled {scaling:.2}x, not about 2x: other work shares the cores, \
                 and the two-thread figures above are not reliable; run again on an idle machine"
            );
        }
    }
}
