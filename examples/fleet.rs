//! One breaker across a fleet: four instances of a service share one
//! breaker through Redis.
//!
//! `cargo run --example fleet --features redis` (about 10 seconds).
//!
//! Four instances run in this process, as four replicas of a service would
//! run on four machines: each has its own [`RedisStore`] (its own
//! connections, its own instance name, `i0` to `i3`) and its own breaker
//! named `llm-provider`, attached to its store. Each sends a request every
//! 50 ms to one simulated model provider, which is healthy for a second,
//! fails at once (as a 503 would) for four, then recovers. The demo prints,
//! as they happen:
//!
//! * the failures that open the breaker, and where they happened: three
//!   failures in a row *across the fleet* open it for every instance;
//! * every instance's transitions, with their reason, from
//!   [`Breaker::subscribe`](tower_circuit_breaker::Breaker::subscribe);
//! * each probe: which instance sent it (the one holding the fleet's probe
//!   lock), how it went, and what each instance refused and sent upstream
//!   during the open period it ended;
//!
//! then a table per instance and a summary.
//!
//! Redis: with `REDIS_URL` set, that server, under a key prefix unique to
//! the run; otherwise the demo starts `redis-server` on a free loopback port
//! (persisting nothing) and kills it when it ends, on errors and Ctrl-C too.
//! `tests/fleet_example.rs` runs this same scenario and checks its figures.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::{sleep, sleep_until, Instant, MissedTickBehavior};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::events::Transition;
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::store::redis::{RedisStore, StoreEvent};
use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, Config, State};

/// The breaker's name: the same on every instance, so they share it.
pub const BREAKER: &str = "llm-provider";

/// Every duration and size of the scenario.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Instances in the fleet.
    pub instances: usize,
    /// Failures in a row, across the fleet, that open the breaker.
    pub threshold: u32,
    /// The open period (fixed: backoff 1.0).
    pub cooldown: Duration,
    /// The provider is healthy this long first,
    pub healthy_for: Duration,
    /// then fails every call this long,
    pub failing_for: Duration,
    /// then is healthy again this long (more if a breaker is still open).
    pub recovered_for: Duration,
    /// Each instance sends one request this often.
    pub request_every: Duration,
    /// How long the provider takes to answer (or to fail).
    pub latency: Duration,
    /// How long past the planned end the demo waits for every breaker to
    /// close, on a slow machine.
    pub grace: Duration,
}

impl Timing {
    /// The demo's scenario: about eight seconds of traffic.
    pub fn demo() -> Self {
        Timing {
            instances: 4,
            threshold: 3,
            cooldown: Duration::from_secs(1),
            healthy_for: Duration::from_secs(1),
            failing_for: Duration::from_secs(4),
            recovered_for: Duration::from_secs(3),
            request_every: Duration::from_millis(50),
            latency: Duration::from_millis(10),
            grace: Duration::from_secs(10),
        }
    }

    /// When the provider fails, from the start.
    pub fn outage(&self) -> (Duration, Duration) {
        (self.healthy_for, self.healthy_for + self.failing_for)
    }

    fn phase(&self, at: Duration) -> Phase {
        let (from, to) = self.outage();
        if at < from {
            Phase::Healthy
        } else if at < to {
            Phase::Failing
        } else {
            Phase::Recovered
        }
    }
}

/// What the provider does at a given moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Healthy,
    Failing,
    Recovered,
}

/// One state change seen on one instance.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When, from the start.
    pub at: Duration,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// Why, as the breaker reported it.
    pub reason: Option<TripReason>,
}

/// One probe: a call that reached the provider while its instance's
/// breaker was half-open.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// The instance that sent it.
    pub instance: usize,
    /// When it started and ended, from the start.
    pub started: Duration,
    /// When it ended.
    pub ended: Duration,
    /// Whether the provider answered.
    pub succeeded: bool,
}

/// What one instance did and saw.
#[derive(Clone, Debug, Default)]
pub struct InstanceReport {
    /// Its name in probe locks, `i0`, `i1`...
    pub name: String,
    /// Requests sent through its breaker.
    pub requests: u64,
    /// Answered by the provider.
    pub answered: u64,
    /// Failed by the provider.
    pub failed: u64,
    /// Refused by the breaker, without calling the provider.
    pub refused: u64,
    /// Calls that reached the provider.
    pub upstream_calls: u64,
    /// Of those, probes (sent while this instance's breaker was half-open).
    pub probes: u64,
    /// Probe locks this instance's store won.
    pub probe_locks_won: u64,
    /// Requests sent while the provider was failing.
    pub outage_requests: u64,
    /// Calls that reached the provider while it was failing.
    pub outage_upstream_calls: u64,
    /// Requests refused after the provider had recovered, while the fleet
    /// waited for its next probe.
    pub refused_after_recovery: u64,
    /// Times its store found Redis unavailable.
    pub store_unavailable: u64,
    /// Its breaker's transitions, in order.
    pub transitions: Vec<Seen>,
}

/// Everything the scenario measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The scenario.
    pub timing: Timing,
    /// Per instance.
    pub instances: Vec<InstanceReport>,
    /// Every probe, in the order they ended.
    pub probes: Vec<Probe>,
    /// The instances whose closed-state failures came before the first
    /// opening, in order.
    pub trip_failures: Vec<usize>,
    /// Calls that reached the provider during the outage before any
    /// instance had opened.
    pub outage_calls_before_open: u64,
    /// When the first instance opened, from the start.
    pub first_open: Option<Duration>,
    /// Whether every breaker was closed at the end.
    pub all_closed: bool,
    /// How long the traffic ran.
    pub ran_for: Duration,
}

impl Report {
    /// Requests over the fleet.
    pub fn total(&self, field: impl Fn(&InstanceReport) -> u64) -> u64 {
        self.instances.iter().map(field).sum()
    }

    /// When every instance had opened once, from the start.
    pub fn all_open(&self) -> Option<Duration> {
        self.instances
            .iter()
            .map(|i| {
                i.transitions
                    .iter()
                    .find(|t| t.to == State::Open)
                    .map(|t| t.at)
            })
            .try_fold(Duration::ZERO, |latest, at| at.map(|at| latest.max(at)))
    }

    /// When the last instance closed after the outage, from the start.
    pub fn all_closed_at(&self) -> Option<Duration> {
        if !self.all_closed {
            return None;
        }
        self.instances
            .iter()
            .map(|i| {
                i.transitions
                    .last()
                    .filter(|t| t.to == State::Closed)
                    .map(|t| t.at)
            })
            .try_fold(Duration::ZERO, |latest, at| at.map(|at| latest.max(at)))
    }

    /// Probes sent while the provider was failing.
    pub fn outage_probes(&self) -> impl Iterator<Item = &Probe> {
        let (from, to) = self.timing.outage();
        self.probes
            .iter()
            .filter(move |p| p.started >= from && p.started < to)
    }

    /// The most open periods that fit between the first opening and the
    /// provider's recovery: each probe during the outage ends one.
    pub fn outage_periods(&self) -> u64 {
        let Some(opened) = self.first_open else {
            return 0;
        };
        let span = self.timing.outage().1.saturating_sub(opened);
        span.as_nanos().div_ceil(self.timing.cooldown.as_nanos()) as u64
    }
}

/// A tally the instances, the provider and the watchers all write to, and
/// that prints the story as it goes (one lock, so lines come in order).
struct Ledger {
    start: Instant,
    timing: Timing,
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    instances: Vec<InstanceReport>,
    /// Refused and upstream calls per instance in the current open period.
    period: Vec<(u64, u64)>,
    failures_in_a_row: u32,
    trip_failures: Vec<usize>,
    outage_calls_before_open: u64,
    first_open: Option<Duration>,
    probes: Vec<Probe>,
}

/// What became of one request.
enum Outcome {
    Answered,
    Failed,
    Refused,
}

impl Ledger {
    fn new(timing: Timing) -> Self {
        let book = Book {
            instances: (0..timing.instances)
                .map(|i| InstanceReport {
                    name: instance_name(i),
                    ..InstanceReport::default()
                })
                .collect(),
            period: vec![(0, 0); timing.instances],
            ..Book::default()
        };
        Ledger {
            start: Instant::now(),
            timing,
            book: Mutex::new(book),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic elsewhere poisons the lock; the tally is still readable.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Prints a line of the story, stamped with the time since the start.
    fn say(&self, line: impl std::fmt::Display) {
        println!("[{:>6.2}s] {line}", self.now().as_secs_f64());
    }

    /// A call reaches the provider.
    fn upstream_call(&self, instance: usize, phase: Phase) {
        let mut book = self.book();
        book.instances[instance].upstream_calls += 1;
        book.period[instance].1 += 1;
        if phase == Phase::Failing {
            book.instances[instance].outage_upstream_calls += 1;
            if book.first_open.is_none() {
                book.outage_calls_before_open += 1;
            }
        }
    }

    /// A call made while this instance's breaker was closed failed.
    fn closed_failure(&self, instance: usize) {
        let mut book = self.book();
        book.failures_in_a_row += 1;
        let n = book.failures_in_a_row;
        if book.first_open.is_none() {
            book.trip_failures.push(instance);
        }
        let threshold = self.timing.threshold;
        let note = if n <= threshold {
            format!("failure {n} in a row across the fleet ({threshold} open the breaker)")
        } else {
            format!("failure {n} in a row: sent before this instance heard of the opening")
        };
        self.say(format_args!(
            "{}  upstream failed (503): {note}",
            instance_name(instance)
        ));
    }

    fn closed_success(&self) {
        self.book().failures_in_a_row = 0;
    }

    /// A request's end.
    fn request(&self, instance: usize, phase: Phase, outcome: Outcome) {
        let mut book = self.book();
        let book = &mut *book;
        let tally = &mut book.instances[instance];
        tally.requests += 1;
        if phase == Phase::Failing {
            tally.outage_requests += 1;
        }
        match outcome {
            Outcome::Answered => tally.answered += 1,
            Outcome::Failed => tally.failed += 1,
            Outcome::Refused => {
                tally.refused += 1;
                book.period[instance].0 += 1;
                if phase == Phase::Recovered {
                    tally.refused_after_recovery += 1;
                }
            }
        }
    }

    /// A probe ended: it closes the open period it ended, so print what
    /// every instance did during that period.
    fn probe(&self, probe: Probe) {
        let mut book = self.book();
        book.instances[probe.instance].probes += 1;
        book.probes.push(probe);
        let n = book.probes.len();
        let result = if probe.succeeded {
            "answered: the fleet closes"
        } else {
            "failed: open again, for the fleet"
        };
        let per_instance = |pick: fn(&(u64, u64)) -> u64| {
            book.period
                .iter()
                .enumerate()
                .map(|(i, counts)| format!("{} {}", instance_name(i), pick(counts)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let line = format!(
            "{}  probe {n}: {result}\n{:>10}in the open period it ended: refused {}; upstream calls {}",
            instance_name(probe.instance),
            "",
            per_instance(|c| c.0),
            per_instance(|c| c.1),
        );
        book.period.iter_mut().for_each(|c| *c = (0, 0));
        self.say(line);
    }

    /// A transition on `instance`'s breaker.
    fn transition(&self, instance: usize, t: &Transition) {
        let mut book = self.book();
        let at = self.now();
        if t.to == State::Open && book.first_open.is_none() {
            book.first_open = Some(at);
            // The first open period starts now: its counts start at zero.
            book.period.iter_mut().for_each(|c| *c = (0, 0));
        }
        book.instances[instance].transitions.push(Seen {
            at,
            from: t.from,
            to: t.to,
            reason: t.reason.clone(),
        });
        let why = match (&t.reason, t.to) {
            (Some(reason), _) => reason.to_string(),
            (None, State::HalfOpen) => "open period over: the next call probes".to_owned(),
            (None, State::Closed) => "probe answered".to_owned(),
            (None, _) => "-".to_owned(),
        };
        let until = match t.retry_after {
            Some(after) if t.to == State::Open => {
                format!("; refusing for up to {:.1} s", after.as_secs_f64())
            }
            _ => String::new(),
        };
        let change = format!("{} -> {}", state_name(t.from), state_name(t.to));
        self.say(format_args!(
            "{}  {change:<20} {why}{until}",
            instance_name(instance)
        ));
    }

    fn report(&self, stores: &[RedisStore], all_closed: bool, ran_for: Duration) -> Report {
        let book = self.book();
        let mut instances = book.instances.clone();
        for (tally, store) in instances.iter_mut().zip(stores) {
            let stats = store.stats();
            tally.probe_locks_won = stats.probe_locks_won;
            tally.store_unavailable = stats.unavailable_episodes;
        }
        Report {
            timing: self.timing,
            instances,
            probes: book.probes.clone(),
            trip_failures: book.trip_failures.clone(),
            outage_calls_before_open: book.outage_calls_before_open,
            first_open: book.first_open,
            all_closed,
            ran_for,
        }
    }
}

fn instance_name(i: usize) -> String {
    format!("i{i}")
}

fn state_name(state: State) -> String {
    match state {
        State::Closed => "closed".to_owned(),
        State::Open => "open".to_owned(),
        State::HalfOpen => "half-open".to_owned(),
        other => format!("{other:?}"),
    }
}

/// The provider's failure: what a 503 would be.
#[derive(Debug)]
struct ProviderDown;

impl std::fmt::Display for ProviderDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("503 Service Unavailable")
    }
}

impl std::error::Error for ProviderDown {}

/// Runs the scenario against the Redis at `redis_url`, with every key
/// under `prefix`, printing the story as it goes.
pub async fn run(redis_url: &str, prefix: &str, timing: Timing) -> Result<Report, BoxError> {
    let config = Config::builder()
        .name(BREAKER)
        .trip(ConsecutiveFailures::new(timing.threshold))
        .cooldown(timing.cooldown)
        .backoff(1.0)
        .build()?;
    let mut stores = Vec::new();
    let mut layers = Vec::new();
    for i in 0..timing.instances {
        let store = RedisStore::builder(redis_url)
            .prefix(prefix)
            .instance(instance_name(i))
            .refresh_interval(Duration::from_millis(250))
            // Shorter than the open period, longer than any probe.
            .probe_lease(timing.cooldown * 4 / 5)
            .build()?;
        let layer = CircuitBreakerLayer::new(config.clone());
        store.attach(&layer.breaker());
        stores.push(store);
        layers.push(layer);
    }
    synced(redis_url, &stores).await?;

    let ledger = Arc::new(Ledger::new(timing));
    let stop = Arc::new(AtomicBool::new(false));
    let mut watchers = Vec::new();
    let mut senders = Vec::new();
    for (i, (store, layer)) in stores.iter().zip(&layers).enumerate() {
        watchers.push(tokio::spawn(watch_breaker(
            i,
            layer.breaker().subscribe(),
            Arc::clone(&ledger),
        )));
        watchers.push(tokio::spawn(watch_store(
            i,
            store.subscribe(),
            Arc::clone(&ledger),
        )));
        let service = layer.layer(provider(i, layer, Arc::clone(&ledger)));
        senders.push(tokio::spawn(send_requests(
            i,
            service,
            Arc::clone(&ledger),
            Arc::clone(&stop),
        )));
    }

    let (from, to) = timing.outage();
    let (start, cooldown) = (ledger.start, timing.cooldown);
    ledger.say(format_args!(
        "{} instances send a request every {} ms each; the provider is healthy",
        timing.instances,
        timing.request_every.as_millis()
    ));
    sleep_until(start + from).await;
    ledger.say("the provider starts failing every call");
    sleep_until(start + to).await;
    ledger.say(format_args!(
        "the provider has recovered; the fleet learns it at its next probe (open periods are {:.1} s)",
        cooldown.as_secs_f64()
    ));
    sleep_until(start + to + timing.recovered_for).await;
    let closed = || layers.iter().all(|l| l.breaker().state() == State::Closed);
    let deadline = Instant::now() + timing.grace;
    while !closed() && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    let all_closed = closed();
    stop.store(true, Ordering::Relaxed);
    let ran_for = ledger.now();
    for sender in senders {
        sender.await?;
    }
    // The last transitions may still be on their way to the watchers.
    sleep(Duration::from_millis(100)).await;
    for watcher in watchers {
        watcher.abort();
    }
    Ok(ledger.report(&stores, all_closed, ran_for))
}

/// Waits until every store has read the shared state and subscribed to
/// the fleet's messages: until then, an instance would not hear of an
/// opening at once.
async fn synced(redis_url: &str, stores: &[RedisStore]) -> Result<(), BoxError> {
    let mut events: Vec<_> = stores.iter().map(RedisStore::subscribe).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = stores.iter().all(|s| {
            let stats = s.stats();
            stats.available && stats.refreshes > 0 && stats.messages > 0
        });
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let mut why = String::from("no answer");
            for events in &mut events {
                while let Ok(event) = events.try_recv() {
                    if let StoreEvent::Unavailable { error } = event {
                        why = error;
                    }
                }
            }
            return Err(format!(
                "Redis at {} was not usable within 10 s ({why})",
                redacted(redis_url)
            )
            .into());
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Instance `i`'s way to the provider: counts every call that reaches it,
/// and tells probes (sent while the breaker is half-open) from the rest.
fn provider(
    i: usize,
    layer: &CircuitBreakerLayer,
    ledger: Arc<Ledger>,
) -> impl Service<String, Response = String, Error = BoxError, Future: Send> + Send + 'static {
    let breaker = layer.breaker();
    service_fn(move |prompt: String| {
        let ledger = Arc::clone(&ledger);
        // Read as the call leaves the breaker: with one probe allowed, a
        // half-open breaker admits only its probe.
        let state = breaker.state();
        let started = ledger.now();
        let phase = ledger.timing.phase(started);
        ledger.upstream_call(i, phase);
        async move {
            sleep(ledger.timing.latency).await;
            let result = match phase {
                Phase::Failing => Err(BoxError::from(ProviderDown)),
                Phase::Healthy | Phase::Recovered => Ok(format!("completion of {prompt}")),
            };
            match state {
                State::HalfOpen => ledger.probe(Probe {
                    instance: i,
                    started,
                    ended: ledger.now(),
                    succeeded: result.is_ok(),
                }),
                State::Closed if result.is_err() => ledger.closed_failure(i),
                State::Closed => ledger.closed_success(),
                _ => {}
            }
            result
        }
    })
}

/// Instance `i`'s traffic: one request every `request_every`, staggered
/// across instances, until `stop`.
async fn send_requests<S>(i: usize, mut service: S, ledger: Arc<Ledger>, stop: Arc<AtomicBool>)
where
    S: Service<String, Response = String, Error = BoxError>,
{
    let timing = ledger.timing;
    let offset = timing.request_every * i as u32 / timing.instances as u32;
    let mut tick = tokio::time::interval_at(ledger.start + offset, timing.request_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let phase = timing.phase(ledger.now());
        let result = match service.ready().await {
            Ok(ready) => {
                ready
                    .call(format!("prompt {n} from {}", instance_name(i)))
                    .await
            }
            Err(e) => Err(e),
        };
        let outcome = match result {
            Ok(_) => Outcome::Answered,
            Err(e) if CircuitOpen::find(e.as_ref()).is_some() => Outcome::Refused,
            Err(_) => Outcome::Failed,
        };
        ledger.request(i, phase, outcome);
    }
}

async fn watch_breaker(
    i: usize,
    mut transitions: tokio::sync::broadcast::Receiver<Transition>,
    ledger: Arc<Ledger>,
) {
    loop {
        match transitions.recv().await {
            Ok(t) => ledger.transition(i, &t),
            Err(RecvError::Lagged(missed)) => ledger.say(format_args!(
                "{}  ({missed} transitions missed)",
                instance_name(i)
            )),
            Err(RecvError::Closed) => return,
        }
    }
}

async fn watch_store(
    i: usize,
    mut events: tokio::sync::broadcast::Receiver<StoreEvent>,
    ledger: Arc<Ledger>,
) {
    while let Ok(event) = events.recv().await {
        let line = match event {
            StoreEvent::Unavailable { error } => {
                format!("Redis unavailable ({error}): running on its local breaker")
            }
            StoreEvent::Restored => "Redis available again: resynced with the fleet".to_owned(),
            other => format!("{other:?}"),
        };
        ledger.say(format_args!("{}  store: {line}", instance_name(i)));
    }
}

/// The table per instance.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>9} {:>9} {:>7} {:>8} {:>15} {:>7} {:>16}",
        "instance",
        "requests",
        "answered",
        "failed",
        "refused",
        "upstream calls",
        "probes",
        "probe locks won"
    );
    let row = |out: &mut String, name: &str, r: &InstanceReport| {
        let _ = writeln!(
            out,
            "{:<8} {:>9} {:>9} {:>7} {:>8} {:>15} {:>7} {:>16}",
            name,
            r.requests,
            r.answered,
            r.failed,
            r.refused,
            r.upstream_calls,
            r.probes,
            r.probe_locks_won
        );
    };
    for instance in &report.instances {
        row(&mut out, &instance.name, instance);
    }
    let fleet = InstanceReport {
        requests: report.total(|i| i.requests),
        answered: report.total(|i| i.answered),
        failed: report.total(|i| i.failed),
        refused: report.total(|i| i.refused),
        upstream_calls: report.total(|i| i.upstream_calls),
        probes: report.total(|i| i.probes),
        probe_locks_won: report.total(|i| i.probe_locks_won),
        ..InstanceReport::default()
    };
    row(&mut out, "fleet", &fleet);
    out
}

/// What the figures say, in words.
pub fn summary(report: &Report) -> String {
    let timing = &report.timing;
    let (from, to) = timing.outage();
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "The provider failed from {} to {}.",
        secs(from),
        secs(to)
    );
    match (report.first_open, report.all_open()) {
        (Some(first), Some(all)) => {
            let who: Vec<String> = report
                .trip_failures
                .iter()
                .map(|&i| instance_name(i))
                .collect();
            let own: Vec<&str> = report
                .instances
                .iter()
                .filter(|i| {
                    i.transitions
                        .iter()
                        .find(|t| t.to == State::Open)
                        .is_some_and(|t| t.reason != Some(TripReason::Shared))
                })
                .map(|i| i.name.as_str())
                .collect();
            let how = if own.is_empty() {
                format!(
                    "no instance saw {} failures itself: the fleet's count in Redis decided, \
                     and every instance opened with reason `shared`",
                    timing.threshold
                )
            } else {
                format!(
                    "{} tripped on its own evidence and shared the opening; the others followed",
                    own.join(", ")
                )
            };
            let _ = writeln!(
                out,
                "- The breaker opened at {} and on all {} instances by {}, after failures on {}: {how}.",
                secs(first),
                report.instances.len(),
                secs(all),
                who.join(", "),
            );
        }
        _ => {
            let _ = writeln!(out, "- The breaker did not open on every instance.");
        }
    }
    let requests = report.total(|i| i.outage_requests);
    let upstream = report.total(|i| i.outage_upstream_calls);
    let probes = report.outage_probes().count() as u64;
    let before = report.outage_calls_before_open;
    let late = upstream.saturating_sub(before + probes);
    let _ = writeln!(
        out,
        "- During the outage the fleet took {requests} requests and {upstream} reached the provider: \
         {before} before the breaker opened, {late} already admitted as it opened, and {probes} probes \
         (at most {} open periods of {} fit between the opening and the recovery).",
        report.outage_periods(),
        secs(timing.cooldown),
    );
    let locks = report.total(|i| i.probe_locks_won);
    let mut probers: Vec<String> = Vec::new();
    for instance in &report.instances {
        if instance.probes > 0 {
            probers.push(format!("{} {}", instance.name, instance.probes));
        }
    }
    let _ = writeln!(
        out,
        "- Probes over the whole run: {} ({}), each sent by the instance holding the fleet's \
         probe lock for its period ({locks} locks won); the other instances kept refusing.",
        report.probes.len(),
        probers.join(", "),
    );
    let recovered = report.probes.iter().find(|p| p.succeeded);
    match (recovered, report.all_closed_at()) {
        (Some(probe), Some(closed)) => {
            let _ = writeln!(
                out,
                "- The first probe after the recovery, by {} at {}, was answered, and every \
                 instance had closed by {}. Meanwhile the fleet refused {} requests the provider \
                 could have answered: the price of waiting for a probe.",
                instance_name(probe.instance),
                secs(probe.started),
                secs(closed),
                report.total(|i| i.refused_after_recovery),
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "- Not every instance had closed when the demo stopped, {} in.",
                secs(report.ran_for)
            );
        }
    }
    let unavailable = report.total(|i| i.store_unavailable);
    if unavailable > 0 {
        let _ = writeln!(
            out,
            "- Redis was unavailable {unavailable} times on some instance (a loaded machine?): \
             meanwhile those instances ran on their local breakers, and may have probed on their own."
        );
    }
    out
}

/// A `redis-server` this demo started: on a free loopback port, persisting
/// nothing, killed when dropped, so on every way out of the demo.
pub struct LocalRedis {
    child: Child,
    port: u16,
}

impl LocalRedis {
    /// Starts one and waits until it answers `PING`.
    pub fn start() -> Result<Self, String> {
        let binary = redis_server()?;
        let mut last_error = String::new();
        // A port free a moment ago may be taken before redis-server binds.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free loopback port: {e}"))?
                .port();
            match Self::spawn(&binary, port) {
                Ok(server) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    fn spawn(binary: &Path, port: u16) -> Result<Self, String> {
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "could not start {}: {e}. Install Redis with \
                     `apt-get install -y redis-server`, or set REDIS_URL to a Redis server you run.",
                    binary.display()
                )
            })?;
        // From here on, dropping `server` kills the process.
        let mut server = LocalRedis { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if answers_ping(port) {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "redis-server exited at start on port {port} ({status})"
                ));
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "redis-server on port {port} did not answer PING within 5 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `redis-server` binary: `$REDIS_SERVER`, or the one on `PATH`.
fn redis_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("redis-server"))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            "`redis-server` was not found on PATH. This demo starts a Redis of its own on \
             loopback: install it with `apt-get install -y redis-server`, or set REDIS_URL \
             to a Redis server you run."
                .to_owned()
        })
}

/// Sends `PING` and expects `+PONG`.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// `url` with any password hidden, for printing.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn main() -> ExitCode {
    // The breaker's own `tracing` events repeat what the demo prints;
    // RUST_LOG=info shows them.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();

    // Keys under a prefix of this run's own, in case REDIS_URL is shared.
    let prefix = format!("fleet-demo-{}", std::process::id());
    let (url, local) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => match LocalRedis::start() {
            Ok(server) => (server.url(), Some(server)),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };

    let timing = Timing::demo();
    let (from, to) = timing.outage();
    println!(
        "Fleet demo: {} instances, each with its own RedisStore and its own breaker `{BREAKER}`, \
         sharing state through Redis at {}{}.\nBreaker: {} failures in a row across the fleet \
         open it for everyone; open periods of {:.1} s (backoff 1.0); one probe at a time, \
         fleet-wide.\nProvider: healthy until {:.1} s, fails every call until {:.1} s, healthy \
         again after.\n",
        timing.instances,
        redacted(&url),
        if local.is_some() {
            " (started by the demo)"
        } else {
            ""
        },
        timing.threshold,
        timing.cooldown.as_secs_f64(),
        from.as_secs_f64(),
        to.as_secs_f64(),
    );
    let result = runtime.block_on(async {
        tokio::select! {
            report = run(&url, &prefix, timing) => report,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        }
    });
    // Stop the store tasks, then the server.
    drop(runtime);
    drop(local);
    match result {
        Ok(report) => {
            println!();
            print!("{}", table(&report));
            println!();
            print!("{}", summary(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
