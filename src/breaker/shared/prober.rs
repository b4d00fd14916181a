//! The core's side of active probing: whether a prober is attached, when
//! its task starts and stops, and what it is allowed to do next.
//!
//! The core knows a prober only through [`Prober`]: something that can
//! start a task for a breaker. The task (the `probe` module's) drives the
//! breaker through the same admission and outcome paths as a user's call:
//! [`Shared::prober_turn`] hands it a probe permit when the open period has
//! ended, and the permit records the probe's outcome.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use super::Shared;
use crate::breaker::admission::Permit;
use crate::breaker::state::{Tag, Word};
use crate::millis::millis_up;
use crate::sync::Ordering;

/// Starts a breaker's active probe task.
pub(crate) trait Prober: Send + Sync {
    /// Starts a task probing `breaker` on the runtime this is called on,
    /// which reports its end with [`Shared::prober_stopped`]; false when it
    /// cannot (no runtime here): the breaker then probes passively.
    fn start(&self, breaker: Weak<Shared>) -> bool;
}

/// What the probe task should do next.
pub(crate) enum Turn {
    /// The breaker closed or an operator holds it: the task ends.
    Done,
    /// Open: wait until the period ends, or the breaker changes first.
    Wait(Wait),
    /// Send a probe with this permit.
    Probe(Permit),
}

/// The probe task's wait for its turn: until a time, or until the breaker
/// changes first. A fleet backend can end the local open period early
/// (this instance won the fleet's probe lock: the fleet's one probe of the
/// round is this task's to send, now) or lengthen it; a task that only
/// slept until the period it first saw would probe late, while the fleet
/// waited on it.
pub(crate) struct Wait {
    at: tokio::time::Instant,
    /// The state word when the turn was given.
    seen: Word,
}

impl Wait {
    /// Waits for the time, or for any transition or change of the open
    /// period of `breaker` (which it holds only weakly meanwhile); the task
    /// then asks for its turn again.
    pub(crate) async fn until_due(self, breaker: &Weak<Shared>) {
        let Some(shared) = breaker.upgrade() else {
            return;
        };
        // Woken as a gate-mode clone is: at every change of the breaker.
        let (_, slot) = shared.clones().register();
        drop(shared);
        let _slot = WaitSlot { breaker, slot };
        let mut sleep = pin!(tokio::time::sleep_until(self.at));
        let mut registered = false;
        poll_fn(|cx| {
            if sleep.as_mut().poll(cx).is_ready() || registered {
                return Poll::Ready(());
            }
            let Some(shared) = breaker.upgrade() else {
                return Poll::Ready(());
            };
            shared.clones().wait(slot, cx.waker());
            registered = true;
            // A change made before the waker was registered woke nobody.
            if shared.load() == self.seen {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
    }
}

/// The wait's place among the breaker's clones, given back however the
/// wait ends.
struct WaitSlot<'a> {
    breaker: &'a Weak<Shared>,
    slot: usize,
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.breaker.upgrade() {
            shared.clones().retire(self.slot);
        }
    }
}

impl Shared {
    /// Probes actively from now on; starts at once if the breaker is open.
    /// A breaker takes one prober, the first given.
    pub(crate) fn set_prober(self: &Arc<Self>, prober: Box<dyn Prober>) -> bool {
        if self
            .extras()
            .prober
            .set((prober, Arc::downgrade(self)))
            .is_err()
        {
            return false;
        }
        if matches!(self.load().tag(), Tag::Open | Tag::HalfOpen) {
            self.start_prober();
        }
        true
    }

    /// Starts the probe task unless one runs; without a tokio runtime here,
    /// the breaker keeps probing passively.
    pub(super) fn start_prober(&self) {
        let Some((prober, me)) = self.prober() else {
            return;
        };
        if self.hot.prober_running.swap(true, Ordering::AcqRel) {
            return;
        }
        if !prober.start(me.clone()) {
            self.hot.prober_running.store(false, Ordering::Release);
            tracing::warn!(
                breaker = %self.name,
                "no tokio runtime to probe actively on: probing passively"
            );
        }
    }

    /// The probe task ended. If it ran to its end and the breaker opened
    /// again meanwhile, another starts. If it panicked, or its runtime
    /// dropped it (shutting down: a task spawned there would be dropped at
    /// once, again and again), probing stays passive until the next opening
    /// starts a task on the runtime that opening happens on.
    pub(crate) fn prober_stopped(&self, finished: bool) {
        self.hot.prober_running.store(false, Ordering::Release);
        self.wake_waiters();
        if finished && matches!(self.load().tag(), Tag::Open | Tag::HalfOpen) {
            self.start_prober();
        }
    }

    /// What the probe task does next: end, wait for the open period, or
    /// probe with a permit (taken past any user, who is refused meanwhile).
    pub(crate) fn prober_turn(self: &Arc<Self>) -> Turn {
        loop {
            let w = self.load();
            let now = self.now_ms();
            match w.tag() {
                Tag::Closed | Tag::Manual => return Turn::Done,
                Tag::Open if now < w.open_until_ms() => {
                    return Turn::Wait(Wait {
                        at: self.instant_at(w.open_until_ms()),
                        seen: w,
                    })
                }
                Tag::Open => {
                    let _ = self.enter_half_open(w);
                }
                Tag::HalfOpen if w.in_flight() < self.tuning.probes.load(Ordering::Relaxed) => {
                    match self.take_permit(w, now) {
                        Ok(permit) if permit.begin() => return Turn::Probe(permit),
                        _ => {}
                    }
                }
                // A user's probe from before the task started holds the
                // permits: look again an interval later.
                Tag::HalfOpen => {
                    let at = now.saturating_add(self.probe_interval_ms());
                    return Turn::Wait(Wait {
                        at: self.instant_at(at),
                        seen: w,
                    });
                }
            }
        }
    }

    pub(crate) fn probe_interval(&self) -> Duration {
        self.lock().config.probe_interval()
    }

    pub(super) fn probe_interval_ms(&self) -> u64 {
        millis_up(self.probe_interval())
    }

    pub(crate) fn probe_timeout(&self) -> Option<Duration> {
        self.lock().config.probe_timeout()
    }
}
