//! A row of the single-thread table: a service, the loop that calls it,
//! and what it is measured against; then criterion over every row, and the
//! summary table (followed by the `agreement` module's check).

use std::time::Duration;

use criterion::Criterion;
use tower::Service;
use tower_circuit_breaker::{Breaker, State};

use crate::agreement;
use crate::alloc::{counting, Tally};
use crate::callers::{drive_async, drive_block_on, drive_clone_drop, drive_hand, drive_oneshot};
use crate::driver::drive;

/// How a row calls its service (see the `callers` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// `svc.ready().await?.call(req).await` in an async fn.
    Async,
    /// The same, each future pinned and polled once in the loop, only
    /// `is_ok()` of the result kept: the independent program's loop.
    Hand,
    /// The same, awaited in an async block under tokio's `block_on`.
    BlockOn,
    /// `svc.clone().oneshot(req).await` in an async fn.
    Oneshot,
    /// A clone of the service, dropped at once; no call.
    CloneDrop,
    /// `poll_ready`, `call`, one poll of the response future pinned on the
    /// stack: the shared driver's loop.
    Stack,
}

impl Caller {
    /// The prefix of the names of the rows it calls.
    pub fn prefix(self) -> &'static str {
        match self {
            Caller::Async => "async/",
            Caller::Hand => "hand/",
            Caller::BlockOn => "block_on/",
            Caller::Oneshot => "oneshot/",
            Caller::CloneDrop => "clone_drop/",
            Caller::Stack => "",
        }
    }

    /// What its rows measure, for the summary's section headings.
    fn heading(self) -> &'static str {
        match self {
            Caller::Async => {
                "async caller: `svc.ready().await?.call(req).await` in an async fn, \
                 one task per call polled once with a no-op waker"
            }
            Caller::Hand => {
                "hand-polled: the same async fn, each call's future pinned and polled once \
                 in the loop, `black_box(r.is_ok())` (the independent program's loop)"
            }
            Caller::BlockOn => {
                "block_on: the same async fn awaited in a loop inside tokio's current-thread \
                 `block_on`, timed inside the block"
            }
            Caller::Oneshot => {
                "a fresh clone per request: `svc.clone().oneshot(req).await` in an async fn"
            }
            Caller::CloneDrop => "clone + drop of the service, no call",
            Caller::Stack => {
                "stack-pinned: poll_ready, call, one poll of the response future pinned on the stack"
            }
        }
    }

    /// The loop, monomorphised for the service's type.
    fn driver<S: Service<u64> + Clone>(self) -> fn(&mut S, u64) -> Duration {
        match self {
            Caller::Async => drive_async::<S>,
            Caller::Hand => drive_hand::<S>,
            Caller::BlockOn => drive_block_on::<S>,
            Caller::Oneshot => drive_oneshot::<S>,
            Caller::CloneDrop => drive_clone_drop::<S>,
            Caller::Stack => drive::<S>,
        }
    }
}

/// One run of a row: its time, and what it allocated if counted.
type Run = Box<dyn FnMut(u64, Counting) -> (Duration, Tally)>;

/// Whether a run counts its allocations (never in a timed round).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    Off,
    On,
}

/// A service under measurement, with its loop monomorphised for its type
/// and boxed, so that every row is run through the same entry point.
pub struct Scenario {
    pub caller: Caller,
    pub name: String,
    /// The row whose time is taken off this one's: the same loop around
    /// the bare inner service. `None` for a baseline itself.
    pub baseline: Option<String>,
    /// A row this one's added cost is divided by (for a peer: this
    /// crate's).
    pub versus: Option<String>,
    run: Run,
}

impl Scenario {
    /// The row `caller`'s prefix + `name`, calling `svc`; `check` runs
    /// before and after every run, outside the timing, and panics when the
    /// service is not in the state measured (a `closed` figure cannot come
    /// from a breaker that opened, nor a `rejected` one from one that
    /// closed).
    pub fn new<S>(
        caller: Caller,
        name: &str,
        mut svc: S,
        mut check: impl FnMut(&str) + 'static,
    ) -> Self
    where
        S: Service<u64> + Clone + 'static,
    {
        let driver = caller.driver::<S>();
        let run = move |calls, count| {
            check("before");
            let (elapsed, tally) = match count {
                Counting::Off => (driver(&mut svc, calls), Tally::default()),
                Counting::On => counting(|| driver(&mut svc, calls)),
            };
            check("after");
            (elapsed, tally)
        };
        Scenario {
            caller,
            name: format!("{}{name}", caller.prefix()),
            baseline: None,
            versus: None,
            run: Box::new(run),
        }
    }

    /// Measured over `baseline` (named within the caller's rows).
    pub fn over(mut self, baseline: &str) -> Self {
        self.baseline = Some(format!("{}{baseline}", self.caller.prefix()));
        self
    }

    /// Compared with `row` (named within the caller's rows) in the summary.
    pub fn versus(mut self, row: &str) -> Self {
        self.versus = Some(format!("{}{row}", self.caller.prefix()));
        self
    }

    pub fn run(&mut self, calls: u64) -> Duration {
        (self.run)(calls, Counting::Off).0
    }

    fn run_counted(&mut self, calls: u64) -> Tally {
        (self.run)(calls, Counting::On).1
    }
}

/// A check that `breaker` is in `expected` state.
pub fn breaker_in(name: &str, breaker: Breaker, expected: State) -> impl FnMut(&str) + 'static {
    let name = name.to_string();
    move |when| {
        let state = breaker.state();
        assert_eq!(state, expected, "{name}: breaker is {state:?} {when} a run");
    }
}

/// Criterion, one group per family (`async`, `closed`, ...: a row's name
/// up to its first `/`), fed by the same loop as the summary through
/// `iter_custom`; then `more` (the groups not made of these rows), before
/// criterion's final summary.
pub fn run_criterion(scenarios: &mut [Scenario], more: impl FnOnce(&mut Criterion)) {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    let mut i = 0;
    while i < scenarios.len() {
        let family = family_of(&scenarios[i].name).to_string();
        let mut group = c.benchmark_group(&family);
        while i < scenarios.len() && family_of(&scenarios[i].name) == family {
            let scenario = &mut scenarios[i];
            let id = scenario
                .name
                .strip_prefix(family.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or("call")
                .to_string();
            group.bench_function(id, |b| b.iter_custom(|iters| scenario.run(iters)));
            i += 1;
        }
        group.finish();
    }
    more(&mut c);
    c.final_summary();
}

/// The criterion group of a row: its name up to the first `/`.
fn family_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// How much work the single-thread summary does.
pub struct Rounds {
    pub mode: &'static str,
    pub rounds: u32,
    pub calls: u64,
    pub alloc_calls: u64,
}

/// `added`'s ratio to `to`: `-` when `to` is too small to divide by (under
/// a tenth of a nanosecond), empty when there is nothing to compare.
pub fn ratio(added: f64, to: Option<f64>) -> String {
    match to {
        Some(to) if to >= 0.1 => format!("{:.2}x", added / to),
        Some(_) => "-".to_string(),
        None => String::new(),
    }
}

/// Times every row (the minimum over `rounds` short runs of `calls` calls,
/// the rows taking turns within each round so that a slow spell of the
/// machine is shared, and short enough that some runs go by without
/// another process taking the core), then counts each row's allocations
/// in a run of its own, and prints the table (with each row's median run,
/// which shows how much the machine's other work weighed).
pub fn summarize(scenarios: &mut [Scenario], rounds: &Rounds) {
    for scenario in scenarios.iter_mut() {
        scenario.run(rounds.calls);
    }
    let mut runs = vec![Vec::with_capacity(rounds.rounds as usize); scenarios.len()];
    for _ in 0..rounds.rounds {
        for (scenario, runs) in scenarios.iter_mut().zip(&mut runs) {
            runs.push(scenario.run(rounds.calls));
        }
    }
    let allocs: Vec<Tally> = scenarios
        .iter_mut()
        .map(|scenario| scenario.run_counted(rounds.alloc_calls))
        .collect();
    let per_call = |d: Duration| d.as_nanos() as f64 / rounds.calls as f64;
    let (ns, median): (Vec<f64>, Vec<f64>) = runs
        .iter_mut()
        .map(|runs| {
            runs.sort_unstable();
            (per_call(runs[0]), per_call(runs[runs.len() / 2]))
        })
        .unzip();

    let index = |name: &str| scenarios.iter().position(|s| s.name == name);
    let added = |i: usize| -> Option<f64> {
        match &scenarios[i].baseline {
            Some(baseline) => index(baseline).map(|b| ns[i] - ns[b]),
            None => Some(0.0),
        }
    };
    let round_trip = index("reference/arc_round_trip").and_then(added);

    println!();
    println!(
        "hot path summary ({}): min (and median) of {} runs x {} calls; allocations over {} calls",
        rounds.mode, rounds.rounds, rounds.calls, rounds.alloc_calls
    );
    println!(
        "+ns: added over the row's baseline (the same loop around the bare inner service); \
         arc rt: one uncontended Arc clone-and-drop; x vs: +ns over the vs row's +ns"
    );
    let mut caller = None;
    for (i, scenario) in scenarios.iter().enumerate() {
        if caller != Some(scenario.caller) {
            caller = Some(scenario.caller);
            println!();
            println!("{}", scenario.caller.heading());
            println!(
                "{:<44} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}  {:<32} {:>7}",
                "scenario",
                "ns/op",
                "median",
                "+ns",
                "allocs/op",
                "bytes/op",
                "x arc rt",
                "vs",
                "x vs"
            );
        }
        let plus = added(i);
        let versus = scenario.versus.as_deref().and_then(index).and_then(added);
        let calls = rounds.alloc_calls as f64;
        println!(
            "{:<44} {:>9.2} {:>9.2} {:>9} {:>10.2} {:>10.1} {:>9}  {:<32} {:>7}",
            scenario.name,
            ns[i],
            median[i],
            plus.map_or(String::new(), |p| format!("{p:.2}")),
            allocs[i].allocations as f64 / calls,
            allocs[i].allocated as f64 / calls,
            plus.zip(round_trip)
                .map_or(String::new(), |(p, rt)| format!("{:.2}", p / rt)),
            scenario.versus.as_deref().unwrap_or(""),
            plus.map_or(String::new(), |p| ratio(p, versus)),
        );
    }

    let plus: Vec<Option<f64>> = (0..scenarios.len()).map(added).collect();
    agreement::report(scenarios, &plus);
}
