//! What sharing a breaker through Redis costs, and what it saves.
//!
//! The benchmark starts its own `redis-server` on a free loopback port
//! (persisting nothing; killed at the end, a failed assertion included),
//! with the fleet demo's launcher (`examples/fleet/local_redis.rs`), and
//! fails with a message saying what to install if the binary is missing.
//! Two studies:
//!
//! 1. **Closed-path cost.** One always-ready inner service (its future is
//!    `std::future::ready`), driven by the loop of the hot-path bench
//!    (`poll_ready`, `call`, one poll of the response future with a no-op
//!    waker): bare, behind an in-process breaker (default config), and
//!    behind a breaker with the same config attached to a [`RedisStore`]
//!    connected to the live server, its background task running on another
//!    thread. The three take turns within each round; the figure is the
//!    minimum over the rounds. Reported: nanoseconds per call, nanoseconds
//!    added over bare, and the Redis-attached breaker's added cost over the
//!    in-process one's (the target is at most 2x). The Redis writes made
//!    during the run are counted, from the store's counters: successes on a
//!    closed breaker must write nothing, and that is asserted.
//! 2. **Probes per open period.** 1, 2, 4 and 8 instances, each its own
//!    breaker (one consecutive failure opens it, open periods of 300 ms,
//!    backoff 1.0) in front of one always-failing upstream, each sending a
//!    request every 10 ms, on real time: once with every breaker attached
//!    to its own [`RedisStore`] (one breaker for the fleet), once with
//!    private breakers. After every breaker has opened, the calls that
//!    reach the upstream (all of them probes) are counted and divided by
//!    the open periods elapsed. A shared breaker promises at most one probe
//!    per period, whatever the fleet's size; that is asserted.
//!
//! `cargo bench --bench fleet --features redis` runs both (about half a
//! minute); `FLEET_QUICK=1` shortens them (a few seconds). Run as a test
//! (`cargo test --bench fleet --features redis`, an unoptimised build) it
//! makes a hundred calls per closed-path scenario and runs the probe study
//! briefly: it checks that the code works, and its timings mean nothing.

#[path = "../examples/fleet/local_redis.rs"]
mod local_redis;

#[path = "common/driver.rs"]
mod driver;

#[path = "fleet/scale.rs"]
mod scale;

use driver::{call_once, drive, noop_waker};
use std::fmt;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::time::MissedTickBehavior;
use tower::util::{BoxCloneSyncService, ServiceFn};
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::store::redis::{RedisStore, RedisStoreBuilder, StoreStats};
use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen, Config, State};

use local_redis::LocalRedis;

// ---------------------------------------------------------------------
// Redis: stores synced with the benchmark's own redis-server.
// ---------------------------------------------------------------------

/// A store on `url` under `prefix`, with its first refresh done (so that
/// it is connected and subscribed before anything is measured).
fn synced_store(runtime: &Runtime, builder: RedisStoreBuilder, attach: &[&Breaker]) -> RedisStore {
    let _context = runtime.enter();
    let store = builder.build().expect("a valid store");
    for breaker in attach {
        assert!(store.attach(breaker), "attached once");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = store.stats();
        if stats.available && stats.refreshes > 0 && stats.messages > 0 {
            return store;
        }
        assert!(
            Instant::now() < deadline,
            "the store did not sync with Redis within 10 s: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------
// 1. Closed-path cost.
// ---------------------------------------------------------------------

/// The inner service's error; only a refusal could make one, and a closed
/// breaker makes none.
#[derive(Debug)]
struct Refused;

impl From<CircuitOpen> for Refused {
    fn from(_: CircuitOpen) -> Self {
        Refused
    }
}

/// The inner service of every scenario: answers at once.
fn inner() -> ServiceFn<impl Fn(u64) -> Ready<Result<u64, Refused>> + Clone> {
    service_fn(|x: u64| ready(Ok::<u64, Refused>(x)))
}

/// A service under measurement, its loop monomorphised for its type; the
/// check runs before and after every run, outside the timing.
struct Scenario {
    name: &'static str,
    run: Box<dyn FnMut(u64) -> Duration>,
}

impl Scenario {
    fn new<S>(name: &'static str, mut svc: S, breaker: Option<Breaker>) -> Self
    where
        S: Service<u64, Response = u64> + 'static,
        S::Error: fmt::Debug,
    {
        let mut cx = Context::from_waker(noop_waker());
        match call_once(&mut svc, &mut cx, 7) {
            Poll::Ready(Ok(7)) => {}
            other => panic!("{name}: expected the call to be served, got {other:?}"),
        }
        let run = move |calls| {
            let closed = |when: &str| {
                if let Some(breaker) = &breaker {
                    let state = breaker.state();
                    assert_eq!(
                        state,
                        State::Closed,
                        "{name}: breaker is {state:?} {when} a run"
                    );
                }
            };
            closed("before");
            let elapsed = drive(&mut svc, calls);
            closed("after");
            elapsed
        };
        Scenario {
            name,
            run: Box::new(run),
        }
    }
}

/// The closed-path figures.
struct ClosedPath {
    bare: f64,
    in_process: f64,
    redis: f64,
    calls: u64,
    writes: Writes,
}

/// The store's writes during the closed-path run.
struct Writes {
    carried_out: u64,
    dropped: u64,
    failed: u64,
}

impl Writes {
    fn between(before: &StoreStats, after: &StoreStats) -> Self {
        Writes {
            carried_out: after.writes - before.writes,
            dropped: after.dropped_writes - before.dropped_writes,
            failed: after.failed_writes - before.failed_writes,
        }
    }
}

impl ClosedPath {
    fn added_in_process(&self) -> f64 {
        self.in_process - self.bare
    }

    fn added_redis(&self) -> f64 {
        self.redis - self.bare
    }

    /// The Redis-attached breaker's added cost over the in-process one's;
    /// `None` when the latter is too small to divide by.
    fn ratio(&self) -> Option<f64> {
        let base = self.added_in_process();
        (base >= 0.1).then(|| self.added_redis() / base)
    }
}

fn closed_path(runtime: &Runtime, server: &LocalRedis, effort: &Effort) -> ClosedPath {
    let in_process = Breaker::new(
        Config::builder()
            .name("in-process")
            .build()
            .expect("config"),
    );
    let shared = Breaker::new(Config::builder().name("redis").build().expect("config"));
    let store = synced_store(
        runtime,
        RedisStore::builder(server.url()).prefix("bench-closed"),
        &[&shared],
    );
    let before = store.stats();
    let mut scenarios = [
        Scenario::new("bare", inner(), None),
        Scenario::new(
            "in-process breaker",
            CircuitBreaker::new(inner(), &in_process),
            Some(in_process),
        ),
        Scenario::new(
            "Redis-attached breaker",
            CircuitBreaker::new(inner(), &shared),
            Some(shared),
        ),
    ];
    // Warm up, then rounds in which the scenarios take turns, so that a
    // slow spell of the machine falls on all of them alike.
    for scenario in &mut scenarios {
        (scenario.run)(effort.calls / 10 + 1);
    }
    let mut best = [Duration::MAX; 3];
    for _ in 0..effort.rounds {
        for (scenario, best) in scenarios.iter_mut().zip(&mut best) {
            *best = (*best).min((scenario.run)(effort.calls));
        }
    }
    // Anything queued would be written within a few milliseconds.
    std::thread::sleep(Duration::from_millis(200));
    let after = store.stats();
    let calls_made = effort.calls / 10 + 1 + effort.calls * u64::from(effort.rounds) + 1;
    let writes = Writes::between(&before, &after);
    assert!(
        after.available,
        "Redis became unavailable during the run: the figure would not be the attached path's"
    );
    assert_eq!(
        (writes.carried_out, writes.dropped, writes.failed),
        (0, 0, 0),
        "successes on a closed breaker must write nothing to Redis"
    );
    let ns = best.map(|d| d.as_nanos() as f64 / effort.calls as f64);
    for (scenario, ns) in scenarios.iter().zip(ns) {
        println!("closed path: {:<24} {ns:>8.2} ns/call", scenario.name);
    }
    ClosedPath {
        bare: ns[0],
        in_process: ns[1],
        redis: ns[2],
        calls: calls_made,
        writes,
    }
}

// ---------------------------------------------------------------------
// 2. Probes per open period.
// ---------------------------------------------------------------------

const OPEN: Duration = Duration::from_millis(300);
const REQUEST_EVERY: Duration = Duration::from_millis(10);

/// One instance count, shared or private.
#[derive(Clone, Copy)]
struct ProbeRun {
    instances: usize,
    probes: u64,
    periods: f64,
    /// Requests refused during the counted stretch.
    refused: u64,
    /// Probe locks won (shared breakers only).
    locks: u64,
    /// Episodes of Redis unavailable on any store (shared breakers only).
    unavailable: u64,
}

impl ProbeRun {
    fn per_period(&self) -> f64 {
        self.probes as f64 / self.periods
    }
}

type Instance = CircuitBreaker<BoxCloneSyncService<(), (), BoxError>>;

fn probe_config() -> Config {
    Config::builder()
        .name("upstream")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(OPEN)
        .backoff(1.0)
        .build()
        .expect("config")
}

async fn request(instance: &mut Instance) -> Result<(), BoxError> {
    instance.ready().await?.call(()).await
}

/// `instances` breakers in front of one always-failing upstream, sharing
/// state through Redis or not, each sending a request every 10 ms for
/// `run_for` once every breaker is open.
fn probe_run(
    runtime: &Runtime,
    server: &LocalRedis,
    instances: usize,
    shared: bool,
    run_for: Duration,
) -> ProbeRun {
    let calls = Arc::new(AtomicU64::new(0));
    let upstream = {
        let calls = Arc::clone(&calls);
        BoxCloneSyncService::new(service_fn(move |()| {
            calls.fetch_add(1, Ordering::Relaxed);
            ready(Err::<(), BoxError>("upstream failed".into()))
        }))
    };
    let breakers: Vec<Breaker> = (0..instances)
        .map(|_| Breaker::new(probe_config()))
        .collect();
    let stores: Vec<RedisStore> = if shared {
        breakers
            .iter()
            .enumerate()
            .map(|(i, breaker)| {
                let builder = RedisStore::builder(server.url())
                    .prefix(format!("bench-probes-{instances}"))
                    .instance(format!("i{i}"))
                    .refresh_interval(Duration::from_millis(200))
                    // Shorter than the open period, longer than a probe.
                    .probe_lease(Duration::from_millis(250));
                synced_store(runtime, builder, &[breaker])
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut fleet: Vec<Instance> = breakers
        .iter()
        .map(|b| CircuitBreaker::new(upstream.clone(), b))
        .collect();

    runtime.block_on(async {
        // Trip: one failure opens a shared breaker for everyone; a private
        // breaker needs its own.
        let trippers = if shared { 1 } else { instances };
        for instance in &mut fleet[..trippers] {
            let refused = request(instance)
                .await
                .is_err_and(|e| CircuitOpen::find(e.as_ref()).is_some());
            assert!(!refused, "the tripping call reached the upstream");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !breakers.iter().all(|b| b.state() == State::Open) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every breaker opened"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });

    let before = calls.load(Ordering::Relaxed);
    let locks_before: u64 = stores.iter().map(|s| s.stats().probe_locks_won).sum();
    let started = Instant::now();
    let refused = runtime.block_on(async {
        let senders: Vec<_> = fleet
            .into_iter()
            .enumerate()
            .map(|(i, mut instance)| {
                tokio::spawn(async move {
                    // Staggered, as independent instances would be.
                    let offset = REQUEST_EVERY * i as u32 / instances as u32;
                    let first = tokio::time::Instant::now() + offset;
                    let mut tick = tokio::time::interval_at(first, REQUEST_EVERY);
                    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    let mut refused = 0u64;
                    while started.elapsed() < run_for {
                        tick.tick().await;
                        if let Err(e) = request(&mut instance).await {
                            if CircuitOpen::find(e.as_ref()).is_some() {
                                refused += 1;
                            }
                        }
                    }
                    refused
                })
            })
            .collect();
        let mut refused = 0;
        for sender in senders {
            refused += sender.await.expect("the sender ran");
        }
        refused
    });
    let elapsed = started.elapsed();
    ProbeRun {
        instances,
        probes: calls.load(Ordering::Relaxed) - before,
        periods: elapsed.as_secs_f64() / OPEN.as_secs_f64(),
        refused,
        locks: stores
            .iter()
            .map(|s| s.stats().probe_locks_won)
            .sum::<u64>()
            - locks_before,
        unavailable: stores.iter().map(|s| s.stats().unavailable_episodes).sum(),
    }
}

// ---------------------------------------------------------------------
// Driver.
// ---------------------------------------------------------------------

struct Effort {
    mode: &'static str,
    rounds: u32,
    calls: u64,
    probe_run: Duration,
    /// The fleet-scale rows, their steady window, and how long an
    /// instance may take to sync before it counts as never.
    scale_rows: Vec<scale::Row>,
    scale_window: Duration,
    sync_limit: Duration,
}

/// The rows of the fleet-scale study: every K with every M, all closed,
/// then the largest K with 1% of its keys open.
fn scale_rows(keys: &[usize], instances: &[usize], open_rows: bool) -> Vec<scale::Row> {
    let mut rows = Vec::new();
    for &k in keys {
        for &m in instances {
            rows.push(scale::Row {
                keys: k,
                instances: m,
                open_percent: 0,
            });
        }
    }
    if open_rows {
        let largest = keys.iter().copied().max().unwrap_or(100);
        for &m in instances {
            rows.push(scale::Row {
                keys: largest,
                instances: m,
                open_percent: 1,
            });
        }
    }
    rows
}

/// `FLEET_SCALE=K:M:open,...` (for example `100000:16:1`) picks rows.
fn rows_from_env() -> Option<Vec<scale::Row>> {
    let spec = std::env::var("FLEET_SCALE").ok()?;
    let rows = spec
        .split(',')
        .map(|row| {
            let n: Vec<usize> = row
                .split(':')
                .map(|n| n.trim().parse().expect("FLEET_SCALE: numbers"))
                .collect();
            match n.as_slice() {
                [keys, instances, open] => scale::Row {
                    keys: *keys,
                    instances: *instances,
                    open_percent: *open,
                },
                _ => panic!("FLEET_SCALE rows are K:M:open-percent"),
            }
        })
        .collect();
    Some(rows)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // As criterion does: without `--bench` (or with `--test`) this is
    // `cargo test`, an unoptimised build where only correctness means
    // anything.
    let test = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    let quick = std::env::var_os("FLEET_QUICK").is_some_and(|v| v == "1");
    let effort = if test {
        Effort {
            mode: "test run, timings mean nothing",
            rounds: 1,
            calls: 100,
            probe_run: Duration::from_millis(700),
            scale_rows: scale_rows(&[100], &[2], true),
            scale_window: Duration::from_secs(1),
            sync_limit: Duration::from_secs(15),
        }
    } else if quick {
        Effort {
            mode: "quick",
            rounds: 3,
            calls: 200_000,
            probe_run: Duration::from_millis(1500),
            scale_rows: scale_rows(&[100, 10_000], &[1, 4], false),
            scale_window: Duration::from_secs(3),
            sync_limit: Duration::from_secs(20),
        }
    } else {
        Effort {
            mode: "full",
            rounds: 7,
            calls: 2_000_000,
            probe_run: Duration::from_secs(3),
            scale_rows: scale_rows(&[100, 10_000, 100_000], &[1, 4, 16], true),
            scale_window: Duration::from_secs(10),
            sync_limit: Duration::from_secs(60),
        }
    };
    let started = Instant::now();
    let study = std::env::var("FLEET_STUDY").unwrap_or_else(|_| "all".to_owned());
    if matches!(study.as_str(), "all" | "path") {
        closed_and_probes(&effort);
    }
    if matches!(study.as_str(), "all" | "scale") {
        fleet_scale(&effort);
    }
    println!(
        "\nran in {:.1} s of wall time",
        started.elapsed().as_secs_f64()
    );
}

/// Studies 1 and 2, on one `redis-server`.
fn closed_and_probes(effort: &Effort) {
    let server = LocalRedis::start().unwrap_or_else(|e| panic!("{e}"));
    // The stores' tasks and the probe study's instances run here; the
    // closed-path loop runs on the main thread, in its context (as
    // the hot-path bench runs every scenario in a runtime's context).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");

    let closed = {
        let _context = runtime.enter();
        closed_path(&runtime, &server, effort)
    };

    let counts = [1, 2, 4, 8];
    let mut rows = Vec::new();
    for instances in counts {
        let shared = probe_run(&runtime, &server, instances, true, effort.probe_run);
        let private = probe_run(&runtime, &server, instances, false, effort.probe_run);
        println!(
            "probes: {instances} instance(s): shared {} probes in {:.1} periods ({} locks won), \
             private {} probes in {:.1} periods",
            shared.probes, shared.periods, shared.locks, private.probes, private.periods
        );
        rows.push((shared, private));
    }
    drop(runtime);
    drop(server);

    println!();
    println!(
        "fleet summary ({}): closed path, min of {} rounds x {} calls",
        effort.mode, effort.rounds, effort.calls
    );
    println!("{:<26} {:>9} {:>12}", "scenario", "ns/call", "+ns vs bare");
    for (name, ns) in [
        ("bare", closed.bare),
        ("in-process breaker", closed.in_process),
        ("Redis-attached breaker", closed.redis),
    ] {
        println!("{name:<26} {ns:>9.2} {:>12.2}", ns - closed.bare);
    }
    match closed.ratio() {
        Some(ratio) => println!(
            "Redis-attached / in-process, added ns: {ratio:.2}x (target: at most 2x: {}); \
             ns per call: {:.2}x",
            if ratio <= 2.0 { "met" } else { "NOT met" },
            closed.redis / closed.in_process,
        ),
        None => println!(
            "Redis-attached / in-process: the in-process breaker adds under 0.1 ns, too little \
             to divide by; ns per call: {:.2}x",
            closed.redis / closed.in_process
        ),
    }
    println!(
        "Redis writes during {} closed-path calls through the attached breaker: {} \
         (dropped: {}, failed: {})",
        closed.calls, closed.writes.carried_out, closed.writes.dropped, closed.writes.failed
    );

    println!();
    println!(
        "probes per open period: an always-failing upstream, open periods of {} ms (backoff \
         1.0), a request every {} ms per instance, {:.1} s counted after every breaker opened",
        OPEN.as_millis(),
        REQUEST_EVERY.as_millis(),
        effort.probe_run.as_secs_f64()
    );
    println!(
        "{:<10} {:>14} {:>13} {:>12} {:>15} {:>14}",
        "instances",
        "shared/period",
        "shared probes",
        "locks won",
        "private/period",
        "private probes"
    );
    for (shared, private) in &rows {
        println!(
            "{:<10} {:>14.2} {:>13} {:>12} {:>15.2} {:>14}",
            shared.instances,
            shared.per_period(),
            shared.probes,
            shared.locks,
            private.per_period(),
            private.probes
        );
    }
    let refused: u64 = rows.iter().map(|(s, p)| s.refused + p.refused).sum();
    println!(
        "(every other request was refused at once: {refused} in all. One instance alone makes \
         a little under one probe per period: a probe waits for the open period, then for the \
         instance's next request, and the probe of the period under way when counting stops is \
         not counted.)"
    );

    // What the shared breaker promises: at most one probe per open period
    // (plus one for the period under way), unless Redis was unreachable,
    // when instances fall back on their local breakers.
    for (shared, _) in &rows {
        if shared.unavailable > 0 {
            println!(
                "note: with {} instances, Redis was unavailable {} times: instances probed on \
                 their own meanwhile",
                shared.instances, shared.unavailable
            );
            continue;
        }
        assert!(
            shared.probes as f64 <= shared.periods.floor() + 1.0,
            "{} instances sharing a breaker sent {} probes in {:.1} open periods",
            shared.instances,
            shared.probes,
            shared.periods
        );
        assert!(
            shared.locks >= shared.probes,
            "{} instances: a probe without the probe lock",
            shared.instances
        );
    }
}

/// Study 3: the fleet at scale, each row on a `redis-server` of its own.
fn fleet_scale(effort: &Effort) {
    let rows = rows_from_env().unwrap_or_else(|| effort.scale_rows.clone());
    let mut figures = Vec::new();
    for row in rows {
        let f = scale::run(row, effort.scale_window, effort.sync_limit);
        println!(
            "scale: K={} M={} open={}%: {:.0} commands/s, {:.4} CPU s/s, {:.0} bytes/s, \
             rounds {}/{}, first sync {:?}",
            row.keys,
            row.instances,
            row.open_percent,
            f.commands_per_s,
            f.cpu_per_s,
            f.bytes_per_s,
            f.rounds_ok,
            f.rounds_due,
            f.first_sync
        );
        let top: Vec<String> = f
            .top_commands
            .iter()
            .map(|(name, per_s)| format!("{name} {per_s:.0}/s"))
            .collect();
        println!("       most served: {}", top.join(", "));
        figures.push(f);
    }
    scale::report(&figures, effort.sync_limit);
}
