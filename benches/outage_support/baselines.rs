//! Studies 5 and 6: providers that fail a share of calls when healthy,
//! independently (study 5) or in runs and bad periods (study 6), then
//! degrade; the adaptive policy, with one setting, against each fixed
//! family tuned for each baseline over a wide grid.
//!
//! Every call the tables count goes through the public API: a breaker's
//! layer over a provider that fails the calls it is told to (no timeout: a
//! failure is immediate), at 10 calls per second of paused time, so time
//! windows see time pass. A breaker meets a baseline as a healthy stretch,
//! then steps to 20%, 40% and 100% independent failures, in turn, each
//! after a healthy gap. After a trip, paused time jumps to the end of the
//! open period and healthy calls probe until the breaker closes; only
//! calls made while it was closed count as healthy calls, and every trip
//! on them is a false trip. The steps' outcomes come from generators
//! seeded by baseline, step, trial and seed, so every configuration meets
//! the very same steps.
//!
//! The false-trip budget is one per million healthy calls. The adaptive
//! policy states it (`false_trips_per_million(1.0)`, every other parameter
//! at its default) and runs with that one setting everywhere. Each fixed
//! family is tuned for each baseline over the grid of
//! [`fixed::grid`](crate::fixed::grid): for each shape (consecutive
//! failures 2 to 10; count windows of 10 to 500 calls; time windows of 10,
//! 30, 60 and 120 s, at least 20 calls, rates on a 5% grid), the most
//! sensitive setting whose false trips, measured on the tuning seeds, keep
//! within the budget; of those, the one that detects the steps soonest on
//! the tuning seeds. The tables then measure the chosen settings on other
//! seeds through the layer: a setting chosen on one set of seeds may trip
//! more on another, and the tables say so.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::policy::{Adaptive, TripPolicy};
use tower_circuit_breaker::{Breaker, Config, State};

use crate::failures::{Failures, Provider};
use crate::fixed::{self, Fixed, Replica, CALLS_PER_SECOND};
use crate::rng::SplitMix64;
use crate::{paused_runtime, Layout, Scale};

/// The false-trip budget, per million healthy calls: the adaptive policy
/// states it, and each fixed setting is tuned to it.
pub const BUDGET_PER_MILLION: f64 = 1.0;

/// The failure rates the providers degrade to.
pub const DEGRADED: [f64; 3] = [0.2, 0.4, 1.0];

/// Study 5's baselines: independent failures.
pub fn independent() -> Vec<Failures> {
    [0.0, 0.02, 0.1]
        .into_iter()
        .map(|rate| Failures::Independent { rate })
        .collect()
}

/// Study 6's baselines: failures in runs, and in bad periods.
pub fn bursty() -> Vec<Failures> {
    let mut baselines = Vec::new();
    for (shortest, longest) in [(3, 5), (10, 20)] {
        for rate in [0.02, 0.1] {
            baselines.push(Failures::Runs {
                rate,
                shortest,
                longest,
            });
        }
    }
    for rate in [0.02, 0.1] {
        baselines.push(Failures::Periods {
            rate,
            bad: 0.5,
            shortest: 10,
            longest: 30,
        });
    }
    baselines
}

/// The adaptive policy as every study runs it.
pub fn adaptive() -> Adaptive {
    Adaptive::new().false_trips_per_million(BUDGET_PER_MILLION)
}

/// A provider that fails the calls it is asked to fail, at once.
pub struct Coin;

impl Service<bool> for Coin {
    type Response = ();
    type Error = BoxError;
    type Future = std::future::Ready<Result<(), BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, fail: bool) -> Self::Future {
        std::future::ready(if fail {
            Err(BoxError::from("provider failed"))
        } else {
            Ok(())
        })
    }
}

/// What one configuration did against one baseline, over one or more
/// seeds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    /// Trips on the first healthy stretch (while an adaptive policy
    /// learns), in all.
    pub first_trips: u64,
    /// Calls made while closed during the healthy gaps after it, and the
    /// times the breaker opened on them, in all and per seed.
    pub healthy: u64,
    pub false_trips: u64,
    pub per_seed: Vec<(u64, u64)>,
    /// For each degradation, the calls from the step to the one that
    /// opened the breaker, one per trial; `None` if it stayed closed for
    /// the whole cap.
    pub detect: [Vec<Option<u64>>; 3],
}

impl Judged {
    /// False trips per million healthy calls after the first stretch.
    pub fn false_per_million(&self) -> f64 {
        self.false_trips as f64 * 1e6 / self.healthy.max(1) as f64
    }

    /// The same, seed by seed.
    fn seeds_per_million(&self) -> Vec<f64> {
        self.per_seed
            .iter()
            .map(|&(healthy, trips)| trips as f64 * 1e6 / healthy.max(1) as f64)
            .collect()
    }

    /// Mean calls to detect degradation `d`, counting a miss as the cap,
    /// and whether any trial was cut there.
    pub fn mean_detect(&self, d: usize, cap: u64) -> (f64, bool) {
        let runs = &self.detect[d];
        let total: u64 = runs.iter().map(|r| r.unwrap_or(cap)).sum();
        (
            total as f64 / runs.len().max(1) as f64,
            runs.iter().any(Option::is_none),
        )
    }

    /// The mean over the three degradations.
    pub fn mean_over_steps(&self, cap: u64) -> f64 {
        (0..DEGRADED.len())
            .map(|d| self.mean_detect(d, cap).0)
            .sum::<f64>()
            / DEGRADED.len() as f64
    }

    fn merge(&mut self, other: Judged) {
        self.first_trips += other.first_trips;
        self.healthy += other.healthy;
        self.false_trips += other.false_trips;
        self.per_seed.extend(other.per_seed);
        for (mine, theirs) in self.detect.iter_mut().zip(other.detect) {
            mine.extend(theirs);
        }
    }
}

/// The generator of a baseline's healthy calls for `seed`; seed 0 is the
/// one every earlier run of study 5 used.
fn healthy_seed(failures: Failures, seed: u64) -> u64 {
    let kind = match failures {
        Failures::Independent { .. } | Failures::Drift { .. } => 0,
        Failures::Runs { shortest, .. } => 0x100 + u64::from(shortest),
        Failures::Periods { shortest, .. } => 0x200 + u64::from(shortest),
    };
    (0x5eed ^ failures.rate().to_bits() ^ kind)
        .wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The generator of trial `trial` of degradation `d` at a baseline of
/// `rate`, for `seed`.
pub fn step_seed(rate: f64, d: usize, trial: u32, seed: u64) -> SplitMix64 {
    let seed = rate.to_bits() ^ ((d as u64) << 56) ^ u64::from(trial) ^ (seed << 40);
    SplitMix64(seed.wrapping_mul(0x2545_f491_4f6c_dd1d))
}

/// Drives one breaker with healthy and degraded traffic at
/// [`CALLS_PER_SECOND`], on paused time.
pub struct Drive<S> {
    pub svc: S,
    pub breaker: Breaker,
    /// Which healthy calls (and probes) fail.
    pub healthy: Provider,
    pub sent: u64,
}

impl<S> Drive<S>
where
    S: Service<bool, Response = (), Error = BoxError>,
{
    /// A drive of a breaker tripping on `trip`, healthy calls from
    /// `healthy`.
    pub fn new(trip: &TripPolicy, healthy: Provider, layer: impl FnOnce(&Breaker) -> S) -> Self {
        let config = Config::builder()
            .name("baselines")
            .trip(trip.clone())
            .build()
            .expect("valid study config");
        let breaker = Breaker::new(config);
        Drive {
            svc: layer(&breaker),
            breaker,
            healthy,
            sent: 0,
        }
    }

    /// Sends one call; whether it found the breaker closed.
    pub async fn send(&mut self, fail: bool) -> bool {
        self.sent += 1;
        if self.sent % CALLS_PER_SECOND == 0 {
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let closed = self.breaker.state() == State::Closed;
        match self.svc.ready().await {
            Ok(svc) => {
                let _ = svc.call(fail).await;
            }
            Err(err) => panic!("the breaker failed its readiness: {err}"),
        }
        closed
    }

    /// Waits out an open breaker and probes it with healthy calls until it
    /// closes.
    pub async fn until_closed(&mut self) {
        while self.breaker.state() != State::Closed {
            if let Some(wait) = self.breaker.retry_after() {
                tokio::time::advance(wait).await;
            }
            let fail = self.healthy.fails();
            self.send(fail).await;
        }
    }

    /// Healthy traffic until `judged` calls were made while closed; the
    /// trips on them.
    pub async fn healthy(&mut self, judged: u64) -> u64 {
        let (mut done, mut trips) = (0, 0);
        while done < judged {
            self.until_closed().await;
            let fail = self.healthy.fails();
            if self.send(fail).await {
                done += 1;
                if self.breaker.state() == State::Open {
                    trips += 1;
                }
            }
        }
        self.until_closed().await;
        trips
    }

    /// A step to independent failures at `rate`, outcomes from `rng`: the
    /// calls until the breaker opens, at most `cap`.
    pub async fn degraded(&mut self, rate: f64, rng: &mut SplitMix64, cap: u64) -> Option<u64> {
        for calls in 1..=cap {
            let fail = rng.next_f64() < rate;
            self.send(fail).await;
            if self.breaker.state() != State::Closed {
                return Some(calls);
            }
        }
        None
    }
}

/// One configuration against one baseline, one seed, through the layer: a
/// long healthy stretch, then trials of each degradation, each after a
/// healthy gap.
pub fn judge(trip: &TripPolicy, failures: Failures, scale: &Scale, seed: u64) -> Judged {
    paused_runtime().block_on(async {
        let healthy = Provider::new(failures, healthy_seed(failures, seed));
        let mut drive = Drive::new(trip, healthy, |breaker| breaker.layer().layer(Coin));
        let mut judged = Judged {
            first_trips: drive.healthy(scale.study5_first).await,
            ..Judged::default()
        };
        let (mut trips, mut healthy_calls) = (0, 0);
        for trial in 0..scale.study5_trials {
            for (d, &rate) in DEGRADED.iter().enumerate() {
                trips += drive.healthy(scale.study5_gap).await;
                healthy_calls += scale.study5_gap;
                let mut rng = step_seed(failures.rate(), d, trial, seed);
                let calls = drive.degraded(rate, &mut rng, scale.study5_cap).await;
                judged.detect[d].push(calls);
                drive.until_closed().await;
            }
        }
        judged.healthy = healthy_calls;
        judged.false_trips = trips;
        judged.per_seed = vec![(healthy_calls, trips)];
        judged
    })
}

/// [`judge`] with the replica of a fixed rule instead of the layer, the
/// same calls in the same order: `trials` trials (at most the study's).
fn replica_judge(
    fixed: Fixed,
    failures: Failures,
    scale: &Scale,
    seed: u64,
    trials: u32,
) -> Judged {
    let mut healthy = Provider::new(failures, healthy_seed(failures, seed));
    let mut replica = Replica::new(fixed);
    let mut judged = Judged {
        first_trips: replica.healthy(&mut healthy, scale.study5_first),
        ..Judged::default()
    };
    let (mut trips, mut healthy_calls) = (0, 0);
    for trial in 0..trials {
        for (d, &rate) in DEGRADED.iter().enumerate() {
            trips += replica.healthy(&mut healthy, scale.study5_gap);
            healthy_calls += scale.study5_gap;
            let mut rng = step_seed(failures.rate(), d, trial, seed);
            judged.detect[d].push(replica.step(rate, &mut rng, &mut healthy, scale.study5_cap));
        }
    }
    judged.healthy = healthy_calls;
    judged.false_trips = trips;
    judged.per_seed = vec![(healthy_calls, trips)];
    judged
}

/// Runs `jobs` on every core, each job once; the results in order.
pub fn on_every_core<J: Sync, R: Send>(jobs: &[J], work: impl Fn(&J) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(jobs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = work(job);
                if let Ok(mut results) = results.lock() {
                    results[i] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// A family's choice for one baseline.
#[derive(Clone, Debug)]
pub struct Pick {
    pub fixed: Fixed,
    /// False trips per million on the tuning seeds.
    pub tuned_false: f64,
    /// Whether any setting of the family kept within the budget there.
    pub within: bool,
    /// Mean calls to detect over the steps, on the tuning seeds.
    pub tuned_detect: f64,
}

/// Each family's choice for `failures`: the most sensitive setting within
/// the budget for each shape, then the one that detects soonest; when no
/// setting of a family keeps within the budget, the one that trips least.
/// Both measured by the replica, on the tuning seeds, driven as the
/// tables drive the layer (with fewer trials): false trips include those
/// right after a step, when the breaker has just closed and a window is
/// empty.
pub fn tune(failures: Failures, scale: &Scale) -> Vec<Pick> {
    let measure = |fixed: Fixed| {
        let mut judged = Judged::default();
        for &seed in &scale.tune_seeds {
            judged.merge(replica_judge(
                fixed,
                failures,
                scale,
                seed,
                scale.tune_trials,
            ));
        }
        let detect = judged.mean_over_steps(scale.study5_cap);
        (
            judged.false_per_million(),
            (judged.false_per_million(), detect),
        )
    };
    let candidates: Vec<Pick> = fixed::grid()
        .iter()
        .map(|shape| {
            let (fixed, (tuned_false, tuned_detect), within) =
                fixed::most_sensitive_within(shape, BUDGET_PER_MILLION, measure);
            Pick {
                fixed,
                tuned_false,
                within,
                tuned_detect,
            }
        })
        .collect();
    let mut picks = Vec::new();
    for family in ["consecutive", "count window", "time window"] {
        let family_candidates = candidates.iter().filter(|c| c.fixed.family() == family);
        let best = if family_candidates.clone().any(|c| c.within) {
            family_candidates
                .filter(|c| c.within)
                .min_by(|a, b| a.tuned_detect.total_cmp(&b.tuned_detect))
        } else {
            family_candidates.min_by(|a, b| a.tuned_false.total_cmp(&b.tuned_false))
        };
        if let Some(best) = best {
            picks.push(best.clone());
        }
    }
    picks
}

/// One row of a table: a configuration against one baseline, over the
/// evaluation seeds.
pub struct Row {
    pub name: String,
    pub family: &'static str,
    /// The baseline its setting was chosen for; `None` for the adaptive
    /// policy, one setting for all.
    pub tuned_for: Option<Failures>,
    pub baseline: Failures,
    pub judged: Judged,
    /// For a fixed setting: whether tuning found one within the budget.
    pub within: bool,
}

/// What studies 5 and 6 found.
pub struct Found {
    pub rows: Vec<Row>,
    pub picks: Vec<(Failures, Vec<Pick>)>,
    /// The seeds the rows were measured on.
    pub seeds: Vec<u64>,
}

/// Tunes the fixed families for every baseline, then measures them and
/// the adaptive policy through the layer, on each of `seeds`: at its own
/// baseline each, and, in study 5, the settings chosen for the highest
/// baseline at every baseline (one fixed setting for all, as the adaptive
/// policy is).
pub fn study(baselines: &[Failures], one_for_all: bool, seeds: &[u64], scale: &Scale) -> Found {
    let started = std::time::Instant::now();
    let picks: Vec<(Failures, Vec<Pick>)> = on_every_core(baselines, |&failures| {
        let picks = if scale.fixed_families {
            tune(failures, scale)
        } else {
            Vec::new()
        };
        (failures, picks)
    });
    let tuned = started.elapsed();
    struct Job {
        name: String,
        family: &'static str,
        trip: TripPolicy,
        tuned_for: Option<Failures>,
        baseline: Failures,
        within: bool,
        seed: u64,
    }
    let mut jobs = Vec::new();
    let mut add = |name: String, family, trip: TripPolicy, tuned_for, baseline, within| {
        for &seed in seeds {
            jobs.push(Job {
                name: name.clone(),
                family,
                trip: trip.clone(),
                tuned_for,
                baseline,
                within,
                seed,
            });
        }
    };
    let highest = baselines.last().copied();
    for (failures, family_picks) in &picks {
        add(
            "adaptive (defaults)".to_string(),
            "adaptive",
            adaptive().into(),
            None,
            *failures,
            true,
        );
        for pick in family_picks {
            add(
                pick.fixed.name(),
                pick.fixed.family(),
                pick.fixed.trip(),
                Some(*failures),
                *failures,
                pick.within,
            );
        }
    }
    if let (true, Some(highest)) = (one_for_all, highest) {
        let for_highest = picks.iter().find(|(f, _)| *f == highest);
        for pick in for_highest.map(|(_, p)| p.as_slice()).unwrap_or_default() {
            for &failures in baselines.iter().filter(|&&f| f != highest) {
                add(
                    pick.fixed.name(),
                    pick.fixed.family(),
                    pick.fixed.trip(),
                    Some(highest),
                    failures,
                    pick.within,
                );
            }
        }
    }
    let judged = on_every_core(&jobs, |job| judge(&job.trip, job.baseline, scale, job.seed));
    println!(
        "(tuned the fixed families in {:.0} s, measured {} runs through the layer in {:.0} s)",
        tuned.as_secs_f64(),
        jobs.len(),
        (started.elapsed() - tuned).as_secs_f64()
    );
    let mut rows: Vec<Row> = Vec::new();
    for (job, judged) in jobs.iter().zip(judged) {
        match rows.iter_mut().find(|r| {
            r.name == job.name && r.baseline == job.baseline && r.tuned_for == job.tuned_for
        }) {
            Some(row) => row.judged.merge(judged),
            None => rows.push(Row {
                name: job.name.clone(),
                family: job.family,
                tuned_for: job.tuned_for,
                baseline: job.baseline,
                judged,
                within: job.within,
            }),
        }
    }
    Found {
        rows,
        picks,
        seeds: seeds.to_vec(),
    }
}

/// `12.3`, `12.3+` when some trials were cut at the cap.
fn detect_cell(judged: &Judged, d: usize, cap: u64) -> String {
    let (mean, cut) = judged.mean_detect(d, cap);
    let digits = if mean < 10.0 { 2 } else { 1 };
    format!("{mean:.digits$}{}", if cut { "+" } else { "" })
}

/// Prints the rows of each baseline: its own settings, then (study 5) the
/// settings chosen for another baseline.
pub fn print(title: &str, found: &Found, scale: &Scale) {
    let cap = scale.study5_cap;
    println!();
    println!("{title}");
    println!(
        "calls to detect each step to 20% / 40% / 100% independent failures (mean over {} steps x {} seeds; \
         '+': some steps not detected within {cap} calls, counted as {cap}) and their mean; trips on the first \
         {} healthy calls (while an adaptive policy learns), then false trips per million healthy calls after \
         them (all seeds, then each; {} a seed; budget {BUDGET_PER_MILLION}). Fixed settings tuned over the grid \
         on {} seeds x {} trials; '!': none of the family kept within the budget",
        scale.study5_trials,
        found.seeds.len(),
        scale.study5_first,
        u64::from(scale.study5_trials) * 3 * scale.study5_gap,
        scale.tune_seeds.len(),
        scale.tune_trials,
    );
    println!(
        "{:<34} {:<44} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9}  each seed",
        "baseline", "policy (tuned for)", "to 20%", "to 40%", "to 100%", "mean", "first", "false/M"
    );
    let mut baselines: Vec<Failures> = Vec::new();
    for row in &found.rows {
        if !baselines.contains(&row.baseline) {
            baselines.push(row.baseline);
        }
    }
    for baseline in baselines {
        for row in found.rows.iter().filter(|r| r.baseline == baseline) {
            let label = match row.tuned_for {
                None => format!("{}, one setting", row.name),
                Some(f) if f == baseline => {
                    format!("{}{}", row.name, if row.within { "" } else { " !" })
                }
                Some(f) => format!("{} ({})", row.name, f.describe()),
            };
            let each: Vec<String> = row
                .judged
                .seeds_per_million()
                .iter()
                .map(|f| format!("{f:.2}"))
                .collect();
            println!(
                "{:<34} {:<44} {:>8} {:>8} {:>8} {:>8.1} {:>6} {:>9.2}  {}",
                baseline.describe(),
                label,
                detect_cell(&row.judged, 0, cap),
                detect_cell(&row.judged, 1, cap),
                detect_cell(&row.judged, 2, cap),
                row.judged.mean_over_steps(cap),
                row.judged.first_trips,
                row.judged.false_per_million(),
                each.join(" ")
            );
        }
    }
}

/// What studies 5 and 6 must show of the adaptive policy: it detects every
/// step, a hard outage within its stated bound, and its false trips stay
/// within `allowed` times its budget, over every seed together.
pub fn check(found: &Found, allowed: f64, scale: &Scale, study: &str) {
    let bound = adaptive()
        .max_failures_to_trip()
        .expect("the adaptive policy's bound on a hard outage");
    for row in found.rows.iter().filter(|r| r.tuned_for.is_none()) {
        let name = format!("{study}, adaptive at {}", row.baseline.describe());
        for (d, runs) in row.judged.detect.iter().enumerate() {
            assert!(
                runs.iter().all(Option::is_some),
                "{name}: a step to {:.0}% went undetected",
                DEGRADED[d] * 100.0
            );
        }
        let hardest = row.judged.detect[2]
            .iter()
            .flatten()
            .max()
            .copied()
            .unwrap_or(0);
        assert!(
            hardest <= u64::from(bound),
            "{name}: a hard outage took {hardest} calls, over the bound of {bound}"
        );
        if scale.compare_baselines {
            let rate = row.judged.false_per_million();
            assert!(
                rate <= allowed * BUDGET_PER_MILLION,
                "{name}: {rate:.2} false trips per million, over {allowed} times its budget"
            );
        }
    }
}

/// The replica must count what the layer counts for consecutive failures
/// and count windows: the same false trips, the same calls to detect.
pub fn check_replica(found: &Found, scale: &Scale) {
    for row in &found.rows {
        let Some(fixed) = found
            .picks
            .iter()
            .flat_map(|(_, picks)| picks)
            .map(|p| p.fixed)
            .find(|f| f.name() == row.name)
        else {
            continue;
        };
        if matches!(fixed, Fixed::Time { .. }) {
            continue;
        }
        let mut replica = Judged::default();
        for &seed in &found.seeds {
            replica.merge(replica_judge(
                fixed,
                row.baseline,
                scale,
                seed,
                scale.study5_trials,
            ));
        }
        assert_eq!(
            (replica.first_trips, replica.false_trips, &replica.detect),
            (
                row.judged.first_trips,
                row.judged.false_trips,
                &row.judged.detect
            ),
            "the replica of {} disagrees with the layer at {}",
            row.name,
            row.baseline.describe()
        );
    }
}

/// Study 5 as an SVG scatter chart: mean calls to detect against false
/// trips per million healthy calls, one point per configuration and
/// baseline; both axes logarithmic, with zero false trips on the left edge.
pub fn chart(found: &Found, scale: &Scale) -> String {
    const FAMILIES: [(&str, &str); 4] = [
        ("consecutive", "#d62728"),
        ("count window", "#1f77b4"),
        ("time window", "#2ca02c"),
        ("adaptive", "#000000"),
    ];
    let layout = Layout {
        width: 860.0,
        height: 560.0,
        left: 90.0,
        right: 260.0,
        top: 60.0,
        bottom: 70.0,
    };
    let cap = scale.study5_cap;
    // x: 0, then 10^-2 .. 10^5 false trips per million.
    let (x_lo, x_hi) = (-2.0, 5.0);
    let zero_x = layout.left + 16.0;
    let px = |fp: f64| {
        if fp <= 0.0 {
            zero_x
        } else {
            let v = fp.log10().clamp(x_lo, x_hi);
            layout.left + 56.0 + (v - x_lo) / (x_hi - x_lo) * (layout.plot_width() - 76.0)
        }
    };
    let (y_lo, y_hi) = (0.0, (cap as f64).log10().ceil());
    let py = |calls: f64| layout.log_y(calls, (y_lo, y_hi));
    let mut svg = String::new();
    layout.start(
        &mut svg,
        "Detection against false trips, providers failing 0%, 2% and 10% normally",
    );
    layout.x_decades(&mut svg, (x_lo, x_hi), px);
    layout.x_label(&mut svg, zero_x, "0");
    layout.y_decades(&mut svg, (y_lo, y_hi));
    let budget_x = px(BUDGET_PER_MILLION);
    let _ = writeln!(
        svg,
        r##"<line x1="{budget_x:.1}" y1="{}" x2="{budget_x:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="5 4"/>"##,
        layout.top,
        layout.axis_y()
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">budget: {BUDGET_PER_MILLION} per million</text>"##,
        budget_x + 4.0,
        layout.top + 14.0
    );
    layout.frame(
        &mut svg,
        "false trips per million healthy calls (log scale; 0 at the left edge)",
        "calls to detect, mean over steps to 20%, 40%, 100% (log scale)",
    );
    // Colour by family, shape by baseline (circle 0%, square 2%, triangle
    // 10%); hollow: a setting chosen for another baseline.
    let baselines = independent();
    let mark =
        |svg: &mut String, b: usize, x: f64, y: f64, color: &str, size: f64, hollow: bool| {
            let fill = if hollow {
                format!(r#"fill="white" stroke="{color}" stroke-width="1.5""#)
            } else {
                format!(r#"fill="{color}" fill-opacity="0.8""#)
            };
            let _ = match b {
                0 => writeln!(
                    svg,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="{size:.1}" {fill}/>"#
                ),
                1 => writeln!(
                    svg,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" {fill}/>"#,
                    x - size,
                    y - size,
                    2.0 * size,
                    2.0 * size
                ),
                _ => writeln!(
                    svg,
                    r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" {fill}/>"#,
                    x,
                    y - 1.3 * size,
                    x - 1.2 * size,
                    y + size,
                    x + 1.2 * size,
                    y + size
                ),
            };
        };
    for row in &found.rows {
        let Some(b) = baselines.iter().position(|&f| f == row.baseline) else {
            continue;
        };
        let color = FAMILIES
            .iter()
            .find(|(f, _)| *f == row.family)
            .map_or("#777", |(_, c)| c);
        let adaptive = row.tuned_for.is_none();
        let hollow = row.tuned_for.is_some_and(|f| f != row.baseline);
        let size = if adaptive { 7.0 } else { 4.5 };
        let (x, y) = (
            px(row.judged.false_per_million()),
            py(row.judged.mean_over_steps(cap)),
        );
        mark(&mut svg, b, x, y, color, size, hollow);
        if adaptive {
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" font-weight="bold">adaptive, {:.0}%</text>"#,
                x + 11.0,
                y + 4.0,
                row.baseline.rate() * 100.0
            );
        }
    }
    let lx = layout.legend_x();
    for (i, (family, color)) in FAMILIES.iter().enumerate() {
        let ly = layout.top + 10.0 + 22.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="10" fill="{color}"/>"#,
            ly - 8.0
        );
        let label = if *family == "adaptive" {
            "adaptive (one setting)".to_string()
        } else {
            format!("{family} (tuned per baseline)")
        };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{label}</text>"#,
            lx + 22.0,
            ly + 1.0
        );
    }
    for (b, failures) in baselines.iter().enumerate() {
        let ly = layout.top + 120.0 + 22.0 * b as f64;
        mark(&mut svg, b, lx + 7.0, ly - 3.0, "#555", 5.0, false);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">baseline {:.0}%</text>"#,
            lx + 22.0,
            ly + 1.0,
            failures.rate() * 100.0
        );
    }
    let notes = [
        "lower left is better: fewer calls".to_string(),
        "to notice a degradation, fewer".to_string(),
        "false trips while healthy".to_string(),
        "hollow: the setting tuned for 10%".to_string(),
        "at the other baselines".to_string(),
    ];
    layout.notes(&mut svg, layout.top + 210.0, &notes);
    svg.push_str("</svg>\n");
    svg
}
