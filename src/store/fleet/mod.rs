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
//! * `Fail` counts a closed-state failure and opens at the threshold;
//!   `Reset` forgets the count, unless open;
//! * `Open` writes an opening (a new fleet generation), unless a newer one
//!   is already there; `min_open` counts from the first opening of an
//!   outage, not from each reopening;
//! * `Probe` takes the probe lease once the open period has ended, or says
//!   who holds it; a caller whose own lease ran out gives it up;
//! * `ProbeOk` counts a probe's success in its generation and closes at
//!   `successes_to_close` once `min_open` has passed.
//!
//! What reaches the backend comes from [`Link`] (queued on the request
//! path, never waiting); what comes back goes to the breakers through
//! [`LocalBreakers::apply`].

mod link;
mod local;

pub(crate) use link::{Link, LinkSettings, Queue, Write};
pub(crate) use local::LocalBreakers;

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
}
