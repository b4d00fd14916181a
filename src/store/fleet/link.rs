//! What a breaker holds of its fleet backend: a bounded queue of writes,
//! filled on the request path without waiting, drained by the backend's
//! task.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::millis::millis;
use std::time::Duration;

use tokio::sync::Notify;

use super::{Args, Op};
use crate::breaker::fleet::FleetLink;
use crate::config::Config;
use crate::policy::TripPolicy;

/// One change to write to the fleet.
#[derive(Clone, Debug)]
pub(crate) struct Write {
    /// The breaker's key in the fleet: its name (escaped, for Redis).
    pub(crate) key: Arc<str>,
    pub(crate) op: Op,
    pub(crate) args: Args,
}

/// Writes waiting for the backend's task. Full, it drops the oldest: a
/// request never waits for the fleet, and recent outcomes matter more than
/// old ones.
#[derive(Debug)]
pub(crate) struct Queue {
    items: Mutex<VecDeque<Write>>,
    capacity: usize,
    pub(crate) dropped: AtomicU64,
    pub(crate) notify: Notify,
}

impl Queue {
    pub(crate) fn new(capacity: usize) -> Self {
        Queue {
            items: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            notify: Notify::new(),
        }
    }

    pub(crate) fn push(&self, write: Write) {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if items.len() >= self.capacity {
            items.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        items.push_back(write);
        drop(items);
        self.notify.notify_one();
    }

    /// Up to `max` writes, oldest first.
    pub(crate) fn take(&self, max: usize) -> Vec<Write> {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let n = items.len().min(max);
        items.drain(..n).collect()
    }
}

/// Settings every link of one store shares.
#[derive(Debug)]
pub(crate) struct LinkSettings {
    /// Failures the fleet count opens at, overriding the policy's.
    pub(crate) failures_to_open: Option<u32>,
    /// How long the fleet count remembers a failure.
    pub(crate) failure_window: Duration,
    /// The probe lock's lease.
    pub(crate) probe_lease: Duration,
    /// Instances that must be failing at once for a new fleet opening.
    pub(crate) quorum: u32,
}

/// A breaker's link to its store.
#[derive(Debug)]
pub(crate) struct Link {
    /// The breaker's key in the fleet: its name (escaped, for Redis).
    pub(crate) key: Arc<str>,
    pub(crate) queue: Arc<Queue>,
    pub(crate) settings: Arc<LinkSettings>,
}

/// The failures in a row the fleet count opens at, for `policy`: the
/// smallest consecutive-failures threshold in it, if any.
fn consecutive_threshold(policy: &TripPolicy) -> Option<u32> {
    match policy {
        TripPolicy::ConsecutiveFailures(p) => Some(p.threshold()),
        TripPolicy::AnyOf(list) => list.iter().filter_map(consecutive_threshold).min(),
        _ => None,
    }
}

impl Link {
    fn push(&self, op: Op, args: Args) {
        self.queue.push(Write {
            key: Arc::clone(&self.key),
            op,
            args,
        });
    }

    fn base(&self, config: &Config, open: Duration, attempt: u32) -> Args {
        Args {
            open_ms: millis(open),
            min_open_ms: millis(config.min_open()),
            // The record outlives its open period by `max_open` at least: a
            // fleet that stops probing forgets an outage only after that.
            keep_ms: millis(open)
                .saturating_add(millis(config.max_open().max(Duration::from_secs(60))))
                .saturating_add(millis(self.settings.probe_lease)),
            attempt,
            lease_ms: millis(self.settings.probe_lease),
            successes: config.successes_to_close(),
            quorum: self.settings.quorum,
            ..Args::default()
        }
    }

    fn threshold(&self, config: &Config) -> Option<u32> {
        self.settings
            .failures_to_open
            .or_else(|| consecutive_threshold(config.trip()))
    }
}

/// Each change becomes a write queued for the store's task, which carries
/// it out on the fleet's state; a full queue drops the oldest write.
impl FleetLink for Link {
    /// Counted fleet-wide when a threshold applies: the store's
    /// `failures_to_open`, or the policy's consecutive-failures threshold.
    fn failure(&self, config: &Config) -> bool {
        let Some(threshold) = self.threshold(config) else {
            return false;
        };
        let mut args = self.base(config, config.open_period(0), 0);
        args.threshold = threshold;
        args.window_ms = millis(self.settings.failure_window);
        self.push(Op::Fail, args);
        true
    }

    fn reset(&self) {
        self.push(Op::Reset, Args::default());
    }

    fn opened(&self, config: &Config, open: Duration, attempt: u32, known: u64) {
        let mut args = self.base(config, open, attempt);
        args.known_generation = known;
        self.push(Op::Open, args);
    }

    fn probe_succeeded(&self, config: &Config, known: u64) {
        let mut args = self.base(config, Duration::ZERO, 0);
        args.known_generation = known;
        self.push(Op::ProbeOk, args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_writes_and_counts_them() {
        let queue = Queue::new(4);
        for attempt in 0..10 {
            queue.push(Write {
                key: Arc::from("llm"),
                op: Op::Fail,
                args: Args {
                    attempt,
                    ..Args::default()
                },
            });
        }
        assert_eq!(queue.dropped.load(Ordering::Relaxed), 6);
        let kept: Vec<u32> = queue
            .take(usize::MAX)
            .iter()
            .map(|w| w.args.attempt)
            .collect();
        assert_eq!(kept, [6, 7, 8, 9], "the newest four");
    }
}
