//! The cost of the breaker on the request path, and what it holds in
//! memory, beside the bare service and the other Rust breaker crates, in
//! one run.
//!
//! ```text
//! cargo bench -p tower-circuit-breaker-hot-path          # criterion, then the tables
//! HOT_PATH_QUICK=1 cargo bench -p tower-circuit-breaker-hot-path
//! cargo test -p tower-circuit-breaker-hot-path --benches # every row checked, a few calls each
//! ```
//!
//! This is a package of its own so that tokio is built as a user's build
//! builds it: the crate's tests enable tokio's `test-util` (paused time),
//! with which every read of tokio's clock first looks for a paused runtime
//! clock. Cargo unifies features across the packages one command builds,
//! so the figures hold for users when this package is built alone (`-p`, as
//! above; `cargo bench --workspace` would bring `test-util` back).
//!
//! # Rows
//!
//! Every inner service answers at once, so what is measured is what is
//! around it, not an executor. Each row is run by one of six loops (the
//! `callers` module; the stack-pinned one is `benches/common/driver.rs`):
//!
//! * `async/*`: the call as tower users write it,
//!   `svc.ready().await?.call(req).await` inside an async fn, so that the
//!   response future is moved into the async fn's state and awaited there.
//!   The loop is a minimal executor: each call is a task (the async fn's
//!   future) polled once with a no-op waker, no tokio runtime involved.
//! * `hand/*`: the same async fn, in the loop of an independent program
//!   that measured this crate against recloser: each call's future pinned
//!   in the loop and polled once with a no-op waker, and only
//!   `black_box(r.is_ok())` kept of the result (the async loop keeps all
//!   of it). The same work in another code layout. This loop and the next
//!   call a copy of the async loop's async fn (`program_call`): sharing one
//!   with it made the compiler stop inlining it into the async loop, and
//!   `async/bare` went from 0.8 to 13 ns.
//! * `block_on/*`: the same async fn awaited in a loop inside one
//!   `block_on` of a tokio current-thread runtime (`enable_all()`), timed
//!   inside the block, as the same program's second loop: a real executor,
//!   a real waker, each call's future part of the block's state. The
//!   runtime is its own, made once and kept in a static, not the one `main`
//!   enters: `enter()` only sets the current handle, so `block_on` under
//!   it does not nest (tokio refuses a `block_on` only inside another one
//!   or inside a task), and a runtime of its own keeps the loop
//!   independent of the rest and configured as the program's was. With
//!   this package's tokio features `enable_all()` is the time driver alone
//!   (no `net`: adding it would change the tokio every row is built with).
//! * `oneshot/*`: a request through a fresh clone,
//!   `svc.clone().oneshot(req).await` in an async fn, as axum routes,
//!   `Buffer` callers and balancers make them.
//! * `clone_drop/*`: a clone of the service, dropped at once, no call.
//! * the rest: `poll_ready` (must be ready), `call`, and one poll of the
//!   response future pinned on the stack, with a no-op waker.
//!
//! For the async and the stack-pinned callers alike:
//!
//! * `bare`: the inner service alone, the baseline of the rows below it.
//! * `closed/*`: the breaker, closed, in front of it, one per trip policy,
//!   and `closed/gate` in gate readiness mode; every call succeeds.
//!   `closed/two_step` is the default breaker used outside tower, in the
//!   two-step form (`try_acquire`, the call, the permit's `success`).
//! * `rejected`: the breaker, open, refusing every call with `CircuitOpen`.
//! * `peer/closed/*`, `peer/rejected/*`: the other breaker crates in front
//!   of the same inner service, closed and forced open (see
//!   [Peers](#peers)), compared with `closed/consecutive` (this crate's
//!   default) and with `rejected`.
//! * `floor/closed`, `floor/rejected`: the floor (see [The floor](#the-floor)),
//!   closed and forced open, compared with `closed/consecutive` and with
//!   `rejected`.
//! * `boxed/*`: the same with an inner service whose error is `BoxError`
//!   (every rejection boxed), over `boxed/bare`, that service alone.
//!
//! The hand-polled and `block_on` callers exist to check the other two
//! (see [Driver agreement](#driver-agreement)), with fewer rows: `bare`,
//! `closed/consecutive`, `closed/time_window`, `rejected`, the peers'
//! `peer/closed/*` and `peer/rejected/*`, the floor's two, and
//! `boxed/closed/consecutive` over `boxed/bare`.
//!
//! For a clone per request (`oneshot/*`) and a clone dropped (`clone_drop/*`):
//! `bare`, `reference/arc` (a service holding one `Arc`: one reference-count
//! round trip per clone, the unit), `tower-circuit-breaker` (closed, default
//! policy), `keyed/1k_keys/4_keys` (a keyed service over a registry of
//! 1,000 keys, calling four of them), `floor` (see
//! [The floor](#the-floor)) and each peer, closed.
//!
//! Keyed calls as the registry grows (`async/keyed/*`, the `keyed` module):
//! registries of 10, 1,000 and 100,000 keys, called with four keys the
//! service remembers (`hot`), every key in turn (`cycled`), and a random
//! key per call (`random`). `hot` is compared with a single breaker
//! (`closed/consecutive`); `cycled` and `random` with the keyed floor over
//! the same keys in the same pattern (`floor/keyed/*`, see
//! [The floor](#the-floor)).
//!
//! For scale, stack-pinned: `reference/load_shed` and `reference/timeout`
//! (`tower::load_shed` and `tower::timeout` around the same inner service),
//! `reference/arc_round_trip` (the inner service plus one uncontended
//! reference-count round trip per call: an `Arc` cloned into the response
//! future and dropped with it, the price any response future that outlives
//! its service pays; the `x arc rt` column gives every row's added cost in
//! units of it, a ratio that holds from one machine to another where
//! nanoseconds do not), and `reference/clock_read` (one read of tokio's
//! clock per call, what a policy that needs the time and every refusal pay
//! at least).
//!
//! Then, on two OS threads sharing one breaker through clones (the
//! `threads` module; each thread drives its own clone, stack-pinned, for a
//! fixed number of calls):
//!
//! * `threads/*`: closed calls, one thread against two: calls per second
//!   and the two-over-one scaling factor (2.0 is perfect on two free cores),
//!   for this crate (default policy) and each peer, with `bare` (each thread
//!   its own inner service, nothing shared) as the ceiling. Where threads
//!   can be pinned (Linux; the `cores` module), one thread is timed on each
//!   of two cores and the two threads run one on each: each thread makes
//!   the same number of calls, so two threads take as long as the slower
//!   core does, and a round's scaling is its two threads over its one
//!   thread on the slower core (the faster core's figure is printed
//!   beside it). Cores of unequal speed, as a virtual machine's often are,
//!   then show as two one-thread figures rather than as a scaling that
//!   moves with the core a one-thread run happened to get. A round runs
//!   its one-thread and two-thread runs back to back, so that its ratio
//!   compares runs that met the same load on the machine; each row gives
//!   the median round (the one with the median scaling) of seven. The
//!   clones are
//!   made on the main thread and moved to the threads, as an accept loop
//!   hands one to each connection; `threads/tower-circuit-breaker/thread-clone`
//!   has each thread make its own, so that memory two clones might share
//!   by being allocated side by side (false sharing) shows as a difference
//!   between the two rows.
//! * `threads/keyed/4_hot`: the same with a keyed service, each thread's
//!   clone calling the same four keys of a registry of 10,000 breakers.
//! * `threads/time_window`: this crate with a time window.
//! * `half_open/*`: both threads hammer a half-open breaker whose one probe
//!   permit is held by a probe in flight: every call is refused. Only
//!   breakers with a probe limit take part.
//!
//! Streamed response bodies (the `streams` module), read frame by frame:
//!
//! * `streams/*`: bodies of 64 data frames of an SSE chunk, read to their
//!   end bare, through a breaker classifying with `StreamingHttp`, with
//!   stream limits too, and with the limits and the SSE judge; nanoseconds
//!   per frame, their ratio to the bare body's, and allocations per frame
//!   (reading) and per body (the call). Reading through the breaker must
//!   allocate nothing more per frame than the bare body: every run checks
//!   it.
//!
//! A `Pending` in the threaded loop (a peer's lock taken by the other
//! thread) is polled again until it resolves, after yielding the thread;
//! the table counts those `Pending` polls per call.
//!
//! # Memory
//!
//! The `memory` module prints `size_of` the service, its response future
//! and the futures of the two async callers above (this crate, with a
//! typed error and with `BoxError`, the keyed service, and each peer), of
//! `CircuitOpen` and of the results; the heap retained by building one
//! breaker and its layer with each trip policy, by the first service made
//! from it, by a clone kept alive, and by a clone after 1,000 calls (each
//! peer alike); and the heap of a `Registry<String>` of 100,000 keys of 12
//! bytes, made through `get`, in all and per key.
//!
//! # Counting allocations
//!
//! The global allocator (the `alloc` module) is the system's, with counting
//! switched per thread: a flag and counters in a thread-local, written only
//! while the flag is up. The timed rounds run with it down, so a timed loop
//! pays one read of its own thread's flag per allocation and shares
//! nothing with other threads (no global counter, no atomic read-modify-
//! write). Each row's allocations (and bytes asked for) per operation are
//! counted in a run of its own after the timed rounds, and the memory
//! report counts around what it builds.
//!
//! # Peers
//!
//! Each peer is configured as close to this crate's default as it allows:
//!
//! | peer | how it is put in front of the inner service | closed config |
//! | --- | --- | --- |
//! | `tower-resilience-circuitbreaker` 0.14 | its own tower layer (`build_with_handle`, so that clones and the tripping service share one circuit) | 5 consecutive failures, 30 s open, 1 half-open call |
//! | `failsafe` 1.3 | `Failsafe`, a tower `Service` written here: `poll_ready` is the inner service's, `call` wraps the inner future with `failsafe::futures::CircuitBreaker::call` | 5 consecutive failures, exponential backoff 30 s to 5 min |
//! | `recloser` 1.4 | `Recloser`, the same adapter around `AsyncRecloser::call` | its default: failure rate 50% over a ring of 100 calls, 30 s open (it has no consecutive-failures policy) |
//!
//! The adapters are the thinnest a tower user could write: both crates
//! decide admission when their future is first polled, so the adapter adds
//! nothing but the call into them. "Forced open" means tripped by one
//! failure with a one-failure threshold and an hour-long open period, as
//! this crate's `rejected` is. Neither failsafe nor recloser limits calls
//! while half-open (both admit every call then), so they have no
//! `half_open/*` row.
//!
//! # The floor
//!
//! `floor/*` (the `floor` module) is the least a tower circuit breaker that
//! works must do, written here: an `Arc` holding an `AtomicU32` count of
//! consecutive failures and an `AtomicU64` end of the open period
//! (nanoseconds from a base `Instant`); `call` reads the clock only once
//! the count has reached the threshold, and refuses while the period
//! runs; the response future holds a clone of the `Arc` and records the
//! outcome, a failure adding one to the count (at the threshold it opens
//! the breaker) and a success storing 0 when the count is not 0 already.
//! Same inner service, a typed error (`FloorError`, no allocation on a
//! refusal), 5 failures and 30 s as this crate's default. It has no
//! probe limit, no configuration, no events, no cancellation path: a
//! crate's added cost divided by the floor's says how far from the least
//! possible that crate is, and what its features cost on the hot path.
//!
//! The keyed floor (`floor/keyed/*`) is the least a keyed breaker must do:
//! std's `HashMap` of floor breakers (its default hasher) behind an
//! `RwLock`, read on every call, the key's `Arc` cloned into the response
//! future. Every breaker is made beforehand; it bounds, evicts and
//! remembers nothing. A lookup among 100,000 keys misses the cache on the
//! table and on the breaker whatever the breaker does: the floor measures
//! those misses on the machine that runs the bench, and a keyed row's
//! added cost divided by the floor's says what the registry adds to them.
//! Rows take turns, so every run starts with the caches holding what the
//! rows before it touched; the floor's check before and after a run reads
//! the table's length and eight of its breakers, as a keyed row's reads
//! the registry's length, so that neither brings its table into the
//! caches for its own timed loop.
//!
//! # Driver agreement
//!
//! After the table, every row measured by more than one of the async,
//! hand-polled, `block_on` and stack-pinned loops (this crate's, each
//! peer's and the floor's, closed and open) is printed again with its
//! added nanoseconds under each loop (the `agreement` module). A line
//! starting `DISAGREE:` names each row whose added cost under one loop is
//! more than 25% above (of the smaller) and more than 5 ns above its cost
//! under another, with the widest pair. The figures are reported as they
//! are, never averaged: a row that disagrees has a cost that depends on the
//! code around the call, and a comparison that holds under one loop only
//! is not what users get. Then, per loop, the two ratios the targets are
//! set in: this crate's `closed/consecutive` added cost over recloser's
//! (`peer/closed/recloser`) and over the floor's (`floor/closed`), and
//! the same for `rejected` (over `peer/rejected/recloser` and
//! `floor/rejected`).
//!
//! # Profile
//!
//! The workspace sets no `[profile.release]` or `[profile.bench]`, so the
//! figures come from cargo's default release profile (thin local LTO, 16
//! codegen units), as a user's build without a profile of its own. The
//! independent program was built with fat LTO and one codegen unit; to
//! measure that way, without changing the workspace, use cargo's
//! environment overrides:
//!
//! ```text
//! CARGO_PROFILE_BENCH_LTO=fat CARGO_PROFILE_BENCH_CODEGEN_UNITS=1 \
//!     cargo bench -p tower-circuit-breaker-hot-path
//! ```
//!
//! # Output
//!
//! `cargo bench -p tower-circuit-breaker-hot-path` runs criterion on every
//! single-thread row, then prints the tables. The first gives nanoseconds
//! per operation (the minimum over many short runs, the rows taking turns,
//! timed here rather than read back from criterion; and the median run),
//! nanoseconds added over the row's baseline, allocations and bytes
//! allocated per operation, the added cost in `Arc` round trips, and the
//! added cost divided by that of the `vs` row (for a peer, this crate's:
//! above 1 the peer costs more). Then the driver-agreement check (see
//! [Driver agreement](#driver-agreement)), the streamed bodies' table, the
//! memory report, and the two-thread table (the median of a few rounds), with a
//! note when `bare` did not scale (other work on the cores makes it
//! unreliable). With `HOT_PATH_QUICK=1` criterion is skipped and the
//! tables come from fewer rounds, in about a minute. `HOT_PATH_ONLY=async/closed/consecutive`
//! keeps one row (with its baseline), for profiling it alone;
//! `HOT_PATH_ONLY=streams` keeps the streamed bodies' rows,
//! `HOT_PATH_ONLY=threads` the two-thread table, and
//! `-- streams` (criterion's filter) their criterion group alone. Run as a
//! test (`cargo test -p tower-circuit-breaker-hot-path --benches`, or
//! `cargo test --workspace --benches`), every row is only checked, with a
//! handful of calls, because an unoptimised build says nothing about speed.

mod agreement;
mod alloc;
mod callers;
mod cores;
#[path = "../common/driver.rs"]
mod driver;
mod floor;
mod keyed;
mod memory;
mod peers;
mod rows;
mod scenario;
mod services;
mod streams;
mod threads;

use scenario::{run_criterion, summarize, Rounds};
use threads::ThreadRounds;

#[global_allocator]
static GLOBAL: alloc::CountingAlloc = alloc::CountingAlloc;

fn main() {
    // `tower::timeout` creates a tokio `Sleep` in every `call`, which needs a
    // runtime with a time driver in context. Nothing is ever spawned or
    // registered on it (the inner future is ready at the first poll, before
    // the sleep is polled), and without `test-util` tokio's clock is read
    // the same way inside a context as outside, so it is entered once for
    // every row alike.
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
    let only = std::env::var("HOT_PATH_ONLY").ok();

    let mut scenarios = rows::scenarios();
    let mut stream_rows = match &only {
        Some(only) if !only.starts_with("streams") => Vec::new(),
        _ => streams::rows(),
    };
    if let Some(only) = &only {
        let baseline = scenarios
            .iter()
            .find(|s| &s.name == only)
            .and_then(|s| s.baseline.clone());
        scenarios.retain(|s| {
            &s.name == only
                || Some(&s.name) == baseline.as_ref()
                || s.name == "bare"
                || s.name == "reference/arc_round_trip"
        });
    }
    let (rounds, thread_rounds, registry_keys) = if test {
        let mode = "test run, timings mean nothing";
        (
            Rounds {
                mode,
                rounds: 1,
                calls: 100,
                alloc_calls: 100,
            },
            ThreadRounds {
                mode,
                rounds: 1,
                calls: 100,
            },
            100_000,
        )
    } else if quick {
        (
            Rounds {
                mode: "quick",
                rounds: 40,
                calls: 10_000,
                alloc_calls: 100_000,
            },
            ThreadRounds {
                mode: "quick",
                rounds: 3,
                calls: 100_000,
            },
            100_000,
        )
    } else {
        run_criterion(&mut scenarios, |c| streams::bench(c, &mut stream_rows));
        (
            Rounds {
                mode: "full",
                rounds: 200,
                calls: 20_000,
                alloc_calls: 100_000,
            },
            ThreadRounds {
                mode: "full",
                rounds: 7,
                calls: 1_000_000,
            },
            100_000,
        )
    };
    summarize(&mut scenarios, &rounds);
    if !stream_rows.is_empty() {
        streams::summarize(&mut stream_rows, &rounds);
    }
    if only.is_none() {
        memory::report(registry_keys);
    }

    // The threads enter this runtime: its one worker, idle, drives the
    // timer that a peer's sleeps need (tower-resilience sleeps 1 ms when
    // the other thread holds its lock in `poll_ready`).
    let threads_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    threads::run(threads_runtime.handle(), only.as_deref(), &thread_rounds);
}
