//! The ledger: the tally that the instances, the provider and the watchers
//! of every breaker and store write to, and that prints the story as it goes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tower_circuit_breaker::events::Transition;
use tower_circuit_breaker::store::redis::{RedisStore, StoreEvent};
use tower_circuit_breaker::State;

use super::report::{InstanceReport, Probe, Report, Seen};
use super::scenario::{instance_name, Phase, Timing};

/// A tally the instances, the provider and the watchers all write to, and
/// that prints the story as it goes (one lock, so lines come in order).
pub struct Ledger {
    /// When the scenario started: every time in the story counts from here.
    pub start: Instant,
    /// The scenario.
    pub timing: Timing,
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
pub enum Outcome {
    Answered,
    Failed,
    Refused,
}

impl Ledger {
    /// A ledger for `timing`'s instances, starting now.
    pub fn new(timing: Timing) -> Self {
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

    /// The time since the start.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic elsewhere poisons the lock; the tally is still readable.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Prints a line of the story, stamped with the time since the start.
    pub fn say(&self, line: impl std::fmt::Display) {
        println!("[{:>6.2}s] {line}", self.now().as_secs_f64());
    }

    /// A call reaches the provider.
    pub fn upstream_call(&self, instance: usize, phase: Phase) {
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
    pub fn closed_failure(&self, instance: usize) {
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

    /// A call made while this instance's breaker was closed succeeded.
    pub fn closed_success(&self) {
        self.book().failures_in_a_row = 0;
    }

    /// A request's end.
    pub fn request(&self, instance: usize, phase: Phase, outcome: Outcome) {
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
    pub fn probe(&self, probe: Probe) {
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
    pub fn transition(&self, instance: usize, t: &Transition) {
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

    /// The report, with each store's counters read now.
    pub fn report(&self, stores: &[RedisStore], all_closed: bool, ran_for: Duration) -> Report {
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

/// A state as the ledger prints it: `half-open` for `half_open`.
fn state_name(state: State) -> String {
    state.as_str().replace('_', "-")
}

/// Instance `i`'s breaker transitions, into the ledger, until the breaker
/// is gone.
pub async fn watch_breaker(
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

/// Instance `i`'s store events, told as they come, until the store is
/// gone.
pub async fn watch_store(
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
            StoreEvent::ShardsUnavailable { shards, error } => format!(
                "shards {shards:?} unreachable ({error}): their names run locally, the rest stay shared"
            ),
            StoreEvent::ShardsRestored { shards } => {
                format!("shards {shards:?} answer again: their names are shared again")
            }
            other => format!("{other:?}"),
        };
        ledger.say(format_args!("{}  store: {line}", instance_name(i)));
    }
}
