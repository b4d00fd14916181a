//! What every fleet backend shares: the operations of the fleet's state
//! machine and their answers, the link a breaker reports through, and how
//! an answer reaches the local breakers.
//!
//! A backend keeps the fleet's state of each name somewhere (in Redis, or
//! in memory shared by the instances of one process) and carries out
//! [`Op`]s on it, each atomically, each answered by a [`Reply`]. What an
//! operation decides is the same whatever the backend; the Redis store's
//! script (`store/redis/script.rs`) is its reference, and the in-process
//! store (`store/memory/state.rs`) decides alike:
//!
//! * `Fail` counts a closed-state failure and opens at the threshold, once
//!   `quorum` instances are failing; `Reset` forgets the count (and who
//!   failed), unless open;
//! * `Open` writes an opening (a new fleet generation), unless a newer one
//!   is already there; a new opening (not the reopening after a failed
//!   probe) needs `quorum` instances failing, and below it is declined,
//!   and counts as the caller's vote for its open period and the probe
//!   lock; `min_open` counts from the first opening of an outage, not from
//!   each reopening;
//! * `Probe` takes the probe lock once the open period has ended, or says
//!   who holds it; a caller whose own lease ran out gives it up;
//! * `ProbeOk` counts a probe's success in its generation and closes at
//!   `successes_to_close` once `min_open` has passed.
//!
//! Instances failing at once, for the quorum, are those whose failures the
//! count holds (since the last success anywhere, within the failure
//! window), those whose vote is still running, and the caller. With a
//! quorum of 1 (the default) every instance's evidence opens the fleet.
//!
//! What reaches the backend comes from [`Link`] (queued on the request
//! path, never waiting); what comes back goes to the breakers through
//! [`LocalBreakers::apply`], the answers to one batch first narrowed by
//! [`settle`].

mod link;
mod local;

pub(crate) use link::{Link, LinkSettings, Queue, Write};
pub(crate) use local::LocalBreakers;

use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;

/// One operation of the fleet's state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Count a failure; open at `threshold` failures.
    Fail,
    /// Forget the failure count (a success), unless open.
    Reset,
    /// Write an opening, unless another instance's opening is newer.
    Open,
    /// Take the probe lock once the open period has ended; give it up when
    /// the caller's own lease ran out.
    Probe,
    /// Count a probe's success; close at `successes` once `min_open` passed.
    ProbeOk,
}

/// The arguments of one operation (for Redis, in the script's `ARGV`
/// order).
#[derive(Clone, Debug, Default)]
pub(crate) struct Args {
    pub(crate) open_ms: u64,
    pub(crate) min_open_ms: u64,
    pub(crate) keep_ms: u64,
    pub(crate) attempt: u32,
    pub(crate) known_generation: u64,
    pub(crate) threshold: u32,
    pub(crate) window_ms: u64,
    pub(crate) lease_ms: u64,
    pub(crate) successes: u32,
    /// Instances that must be failing at once for a new opening.
    pub(crate) quorum: u32,
}

/// The fleet's answer to an operation, or its state of a name as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Closed, with `failures` counted.
    Closed { failures: u64 },
    /// Open in `generation`, `left_ms` more (0: the period is over, and the
    /// caller does not hold the probe lock).
    Open {
        generation: u64,
        left_ms: u64,
        attempt: u32,
    },
    /// Half-open, and the caller holds the probe lock.
    ProbeWon { generation: u64, attempt: u32 },
    /// Half-open, and another instance holds the probe lock, `lease_ms`
    /// more (0, to its holder: its own lease ran out and was given up).
    ProbeHeld {
        generation: u64,
        lease_ms: u64,
        attempt: u32,
    },
    /// Closed, with `failures` counted, and the caller's opening declined:
    /// fewer than `quorum` instances are failing. The caller's breaker
    /// stays open on its own.
    Declined { failures: u64 },
}

/// The answers to one batch of writes, as the breakers should take them:
/// per key, the last answer only (the fleet's latest state: an earlier
/// answer in the batch is stale by then, and a stale "closed" would make a
/// breaker that opened meanwhile share its opening again), after any
/// `Declined` for that key (which no later answer undoes).
pub(crate) fn settle(replies: Vec<(Arc<str>, Reply)>) -> Vec<(Arc<str>, Reply)> {
    let mut last = std::collections::HashMap::with_capacity(replies.len());
    for (i, (key, _)) in replies.iter().enumerate() {
        last.insert(Arc::clone(key), i);
    }
    replies
        .into_iter()
        .enumerate()
        .filter(|(i, (key, reply))| {
            last.get(key) == Some(i) || matches!(reply, Reply::Declined { .. })
        })
        .map(|(_, answer)| answer)
        .collect()
}

/// Checks a fleet store's durations, in order: each from 1 ms to one day.
pub(crate) fn check_durations(durations: &[(&str, Duration)]) -> Result<(), ConfigError> {
    for &(field, d) in durations {
        if d < Duration::from_millis(1) {
            return Err(ConfigError::new(field, "must be at least 1 ms"));
        }
        if d > Duration::from_secs(86_400) {
            return Err(ConfigError::new(field, "must be at most one day"));
        }
    }
    Ok(())
}

/// Checks the counts every fleet store takes, in order: the write queue's
/// capacity, the fleet's failure threshold and its quorum.
pub(crate) fn check_counts(
    queue_capacity: usize,
    failures_to_open: Option<u32>,
    quorum: u32,
) -> Result<(), ConfigError> {
    let at_least_one = |field: &str| Err(ConfigError::new(field, "must be at least 1"));
    if queue_capacity == 0 {
        return at_least_one("queue_capacity");
    }
    if failures_to_open == Some(0) {
        return at_least_one("failures_to_open");
    }
    if quorum == 0 {
        return at_least_one("quorum");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_settles_on_each_keys_last_answer_after_its_declines() {
        let key = |k: &str| -> Arc<str> { Arc::from(k) };
        let open = Reply::Open {
            generation: 4,
            left_ms: 100,
            attempt: 0,
        };
        let settled = settle(vec![
            (key("a"), Reply::Closed { failures: 1 }),
            (key("b"), Reply::Declined { failures: 2 }),
            (key("a"), Reply::Closed { failures: 2 }),
            (key("b"), Reply::Closed { failures: 3 }),
            (key("a"), open),
        ]);
        assert_eq!(
            settled,
            vec![
                (key("b"), Reply::Declined { failures: 2 }),
                (key("b"), Reply::Closed { failures: 3 }),
                (key("a"), open),
            ]
        );
    }
}
