//! What the view knows of one breaker ([`Known`]): open (its generation,
//! attempt and times made local), counting failures, closed, or under an
//! operator's control; what a script's answer tells of it, what a read
//! would give of it, and the version it was true at ([`Stamped`]), so
//! that older news never overrides newer.

use std::time::Duration;

use tokio::time::Instant;

use crate::millis::millis_up;
use crate::store::fleet::Reply;
use crate::Control;

/// What the view knows of one breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    Open {
        generation: u64,
        attempt: u32,
        /// When the fleet's open period ends.
        open_until: Instant,
        /// When the fleet forgets the opening, if known.
        kept_until: Option<Instant>,
    },
    /// Closed, with failures counted.
    Counting { failures: u64 },
    /// Closed: kept while older news of the breaker may still come.
    Closed,
    /// Under `!<name>`: an operator's fleet-wide control of the name, made
    /// at shard version `id`.
    Controlled { control: Control, id: u64 },
}

/// How a breaker's state differs from another's, for telling the local
/// breakers only of what changed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Open(u64, u32),
    Counting,
    Closed,
    Controlled(u64),
}

impl Known {
    pub(super) fn class(self) -> Class {
        match self {
            Known::Open {
                generation,
                attempt,
                ..
            } => Class::Open(generation, attempt),
            Known::Counting { .. } => Class::Counting,
            Known::Closed => Class::Closed,
            Known::Controlled { id, .. } => Class::Controlled(id),
        }
    }

    /// What `reply` tells of the breaker's state, `now`.
    pub(crate) fn of(reply: Reply, now: Instant) -> Known {
        match reply {
            Reply::Closed { failures: 0 } | Reply::Declined { failures: 0 } => Known::Closed,
            Reply::Closed { failures } | Reply::Declined { failures } => {
                Known::Counting { failures }
            }
            Reply::Open {
                generation,
                left_ms,
                attempt,
            } => Known::Open {
                generation,
                attempt,
                open_until: now + Duration::from_millis(left_ms),
                kept_until: None,
            },
            Reply::ProbeWon {
                generation,
                attempt,
            }
            | Reply::ProbeHeld {
                generation,
                attempt,
                ..
            } => Known::Open {
                generation,
                attempt,
                open_until: now,
                kept_until: None,
            },
        }
    }

    /// The breaker's state as a read would give it, `now`.
    pub(super) fn reply(self, now: Instant) -> Reply {
        match self {
            Known::Open {
                kept_until: Some(kept),
                ..
            } if kept <= now => Reply::Closed { failures: 0 },
            Known::Open {
                generation,
                attempt,
                open_until,
                ..
            } => Reply::Open {
                generation,
                left_ms: millis_up(open_until.saturating_duration_since(now)),
                attempt,
            },
            Known::Counting { failures } => Reply::Closed { failures },
            Known::Closed | Known::Controlled { .. } => Reply::Closed { failures: 0 },
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Stamped {
    /// The shard's version when this was true.
    pub(super) version: u64,
    pub(super) known: Known,
}
