//! One name as a backend's task sees it: the local breakers of that name,
//! and when this instance next tries the probe lock. The fleet's answers
//! reach the breakers here, through the `fleet_*` transitions.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Reply;
use crate::breaker::shared::Shared;
use crate::millis::millis;

/// The local breakers of one name, and this instance's turn at its probe
/// lock.
#[derive(Default)]
pub(crate) struct LocalBreakers {
    pub(crate) breakers: Vec<Weak<Shared>>,
    /// When to try the probe lock next.
    pub(crate) next_probe: Option<Instant>,
    /// The fleet generation whose probe lock this instance holds.
    pub(crate) won: Option<u64>,
}

impl LocalBreakers {
    /// Forgets breakers that are gone; whether any is left.
    pub(crate) fn prune(&mut self) -> bool {
        self.breakers.retain(|b| b.strong_count() > 0);
        !self.breakers.is_empty()
    }

    pub(crate) fn live(&mut self) -> Vec<Arc<Shared>> {
        self.prune();
        self.breakers.iter().filter_map(Weak::upgrade).collect()
    }

    /// The fleet closed (generation `generation` if known, with `failures`
    /// counted since): nothing to probe, every breaker told.
    pub(crate) fn close(
        &mut self,
        breakers: &[Arc<Shared>],
        generation: Option<u64>,
        failures: u64,
    ) {
        self.next_probe = None;
        self.won = None;
        for breaker in breakers {
            breaker.fleet_closed(generation, failures);
        }
    }

    /// Brings the local breakers in line with `reply`, each following a
    /// fleet opening for its period plus `hold`; returns whether this
    /// instance has just won the probe lock (`lease` long) of a generation
    /// it did not hold.
    pub(crate) fn apply(&mut self, reply: Reply, hold: Duration, lease: Duration) -> bool {
        let hold_ms = millis(hold);
        let won_before = self.won;
        let now = Instant::now();
        let breakers = self.live();
        match reply {
            Reply::Closed { failures } => self.close(&breakers, None, failures),
            Reply::Open {
                generation,
                left_ms,
                attempt,
            } => {
                let follows = follow(&breakers, |b| {
                    b.fleet_open(generation, left_ms, attempt, hold_ms, false)
                });
                if !follows {
                    // Nothing here waits for a probe (closed here already,
                    // or held by an operator): later news (for Redis, the
                    // refresh) keeps watching.
                    self.won = None;
                    self.next_probe = None;
                } else if !(left_ms == 0
                    && self.won == Some(generation)
                    && self.next_probe.is_some())
                {
                    // Unless this instance holds the lock of this round
                    // (its lease renewal decides when to look again), try
                    // the lock when the period ends. A holder whose renewal
                    // went unanswered (Redis stalled, or was down) has none
                    // scheduled, and may have lost the lock meanwhile: it
                    // races for it again.
                    self.won = None;
                    self.next_probe = Some(now + retry_in(left_ms));
                }
            }
            Reply::ProbeWon {
                generation,
                attempt,
            } => {
                self.won = Some(generation);
                self.next_probe = Some(now + lease);
                // One local breaker probes, the first that can: the lock
                // allows one probe round, and several breakers of one name
                // here would each send theirs. The others wait as for a
                // lock held elsewhere, and learn the verdict from the fleet.
                let mut probing = false;
                for breaker in &breakers {
                    if probing {
                        breaker.fleet_open(generation, millis(lease), attempt, hold_ms, true);
                    } else {
                        probing = breaker.fleet_probe_won(generation, attempt);
                    }
                }
                return won_before != Some(generation);
            }
            Reply::Declined { failures } => {
                // The fleet stays closed; the breakers that opened here
                // stay open on their own, and do not offer it again.
                for breaker in &breakers {
                    breaker.fleet_declined();
                }
                self.close(&breakers, None, failures);
            }
            Reply::ProbeHeld {
                generation,
                lease_ms: 0,
                ..
            } if won_before == Some(generation) => {
                // This instance's own lease ran out and was given up: race
                // for the lock again at once, staying half-open meanwhile.
                self.won = None;
                self.next_probe = Some(now);
            }
            Reply::ProbeHeld {
                generation,
                lease_ms,
                attempt,
            } => {
                let follows = follow(&breakers, |b| {
                    b.fleet_open(generation, lease_ms, attempt, hold_ms, true)
                });
                self.won = None;
                self.next_probe = follows.then(|| now + retry_in(lease_ms));
            }
        }
        false
    }
}

/// Tells every breaker with `open`; whether any of them follows the
/// fleet's opening (each is told, whatever the others said).
fn follow(breakers: &[Arc<Shared>], open: impl Fn(&Shared) -> bool) -> bool {
    breakers.iter().fold(false, |follows, b| open(b) | follows)
}

/// When to try the probe lock again, `ms` from now: never at once, so that
/// no state in the fleet can make the task spin.
fn retry_in(ms: u64) -> Duration {
    Duration::from_millis(ms).max(Duration::from_millis(10))
}
