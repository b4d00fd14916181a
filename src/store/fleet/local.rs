//! One name as a backend's task sees it: the local breakers of that name,
//! and when this instance next tries the probe lock. The fleet's answers
//! reach the breakers here, through the `fleet_*` transitions.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Reply;
use crate::breaker::shared::Shared;
use crate::millis::millis;
use crate::Control;

/// The local breakers of one name, and this instance's turn at its probe
/// lock.
#[derive(Default)]
pub(crate) struct LocalBreakers {
    pub(crate) breakers: Vec<Weak<Shared>>,
    /// When to try the probe lock next.
    pub(crate) next_probe: Option<Instant>,
    /// The fleet generation whose probe lock this instance holds.
    pub(crate) won: Option<u64>,
    /// The fleet-wide control of the name as last carried out here: the
    /// change that made it (its id in the fleet) and what it is.
    pub(crate) control: Option<(u64, Control)>,
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

    /// A breaker of the name attached here, the fleet's control of the
    /// name being `control`: it carries out the control in force (not a
    /// reset, which is over), as its elder siblings did.
    pub(crate) fn join(&mut self, breaker: Weak<Shared>, control: Option<(u64, Control)>) {
        if let (Some((_, held)), Some(new)) = (control, breaker.upgrade()) {
            if held != Control::Reset {
                new.command(held);
            }
        }
        self.breakers.push(breaker);
        self.control = control;
    }

    /// The fleet's control of the name is now `control` (`None`: none):
    /// carries out what changed on every breaker. A new control is carried
    /// out whatever an operator did here since; the end of one restores
    /// the breakers it held (a hold made on this instance alone, under no
    /// fleet control, is left alone).
    pub(crate) fn control(&mut self, control: Option<(u64, Control)>) {
        if self.control == control {
            return;
        }
        let before = std::mem::replace(&mut self.control, control);
        let breakers = self.live();
        match control {
            Some((_, Control::Reset)) => {
                self.close(&breakers, None, 0);
                for breaker in &breakers {
                    breaker.command(Control::Reset);
                }
            }
            Some((_, held)) => {
                for breaker in &breakers {
                    breaker.command(held);
                }
            }
            None if before.is_some_and(|(_, held)| held != Control::Reset) => {
                for breaker in &breakers {
                    breaker.command(Control::Restore);
                }
            }
            None => {}
        }
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
