//! One name's record: every part the fleet keeps of it (the opening, its
//! open period, `min_open`, the failure count and who failed, the votes,
//! the probe lock, an operator's control), each gone once its time is up
//! as the Redis key it stands for expires, and what the script reads of
//! them (the state, what is left of a period or a lease).

use std::time::Duration;

use tokio::time::Instant;

use super::{InstanceId, VoterId};
use crate::millis::millis_up;
use crate::store::fleet::Reply;
use crate::Control;

/// The fleet's opening of one name (Redis: its `record` hash).
#[derive(Debug)]
pub(super) struct Opening {
    pub(super) generation: u64,
    pub(super) attempt: u32,
    /// Probe successes in this generation.
    pub(super) successes: u64,
    /// When the fleet forgets it.
    pub(super) until: Instant,
}

/// The probe lock: the instance that may probe, until its lease runs out
/// (Redis: `probe_lock`).
#[derive(Debug)]
pub(super) struct ProbeLock {
    pub(super) holder: InstanceId,
    pub(super) until: Instant,
}

/// Everything the fleet keeps of one name; each part is gone once its time
/// is up, as a Redis key that expires.
#[derive(Debug, Default)]
pub(super) struct Record {
    pub(super) opening: Option<Opening>,
    /// While the open period runs (Redis: `wait`).
    pub(super) open_until: Option<Instant>,
    /// Until `min_open` has passed since the outage began.
    pub(super) min_open_until: Option<Instant>,
    /// The failure count, and when it is forgotten.
    pub(super) failures: Option<(u64, Instant)>,
    /// The instances whose failures the count holds (with a quorum above
    /// 1; Redis: the fields of the `failures` hash), forgotten with it.
    pub(super) failing: Vec<VoterId>,
    /// Instances whose own opening was declined, and until when each
    /// counts as failing (Redis: `votes`).
    pub(super) votes: Vec<(VoterId, Instant)>,
    /// The probe lock (Redis: `probe_lock`).
    pub(super) probe_lock: Option<ProbeLock>,
    /// An operator's fleet-wide hold (Redis: the index's `!<name>`
    /// field), kept until restored or reset.
    pub(super) control: Option<(u64, Control)>,
}

impl Record {
    /// Drops every part whose time is up.
    pub(super) fn expire(&mut self, now: Instant) {
        if self.opening.as_ref().is_some_and(|o| o.until <= now) {
            self.opening = None;
        }
        if self.open_until.is_some_and(|at| at <= now) {
            self.open_until = None;
        }
        if self.min_open_until.is_some_and(|at| at <= now) {
            self.min_open_until = None;
        }
        if self.failures.is_some_and(|(_, at)| at <= now) {
            self.failures = None;
        }
        if self.failures.is_none() {
            self.failing.clear();
        }
        self.votes.retain(|(_, until)| *until > now);
        if self.probe_lock.as_ref().is_some_and(|l| l.until <= now) {
            self.probe_lock = None;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.opening.is_none()
            && self.open_until.is_none()
            && self.min_open_until.is_none()
            && self.failures.is_none()
            && self.votes.is_empty()
            && self.probe_lock.is_none()
            && self.control.is_none()
    }

    /// Instances failing at once: those whose failures the count holds,
    /// those whose vote runs, and `caller` (the script's `failing`).
    pub(super) fn failing(&self, caller: VoterId) -> usize {
        let mut seen: Vec<VoterId> = self.failing.clone();
        seen.extend(self.votes.iter().map(|(who, _)| *who));
        seen.push(caller);
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }

    /// Forgets the failure count and who failed.
    pub(super) fn forget_failures(&mut self) -> bool {
        self.failing.clear();
        self.failures.take().is_some()
    }

    pub(super) fn failures(&self) -> u64 {
        self.failures.map_or(0, |(n, _)| n)
    }

    /// What is left of the open period, in whole milliseconds rounded up
    /// (so it reads 0 only once the period is over).
    fn open_left_ms(&self, now: Instant) -> u64 {
        self.open_until
            .map_or(0, |at| millis_up(at.saturating_duration_since(now)))
    }

    /// The script's `state()`.
    pub(super) fn state(&self, now: Instant) -> Reply {
        match &self.opening {
            None => Reply::Closed {
                failures: self.failures(),
            },
            Some(o) => Reply::Open {
                generation: o.generation,
                left_ms: self.open_left_ms(now),
                attempt: o.attempt,
            },
        }
    }

    pub(super) fn lease_left_ms(&self, now: Instant) -> u64 {
        self.probe_lock
            .as_ref()
            .map_or(0, |l| millis_up(l.until.saturating_duration_since(now)))
    }
}

/// `ms` after `now`; past the clock's range, as late as it goes (no
/// setting can make the fleet panic).
pub(super) fn after(now: Instant, ms: u64) -> Instant {
    let far = Duration::from_secs(86_400 * 365 * 30);
    now.checked_add(Duration::from_millis(ms))
        .or_else(|| now.checked_add(far))
        .unwrap_or(now)
}
