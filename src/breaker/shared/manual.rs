//! Manual control: an operator holds a breaker open, closed or disabled,
//! puts it in shadow mode, hands it back to automatic control, or resets it.
//!
//! Every change is a transition like any other: taken under the lock with a
//! compare-and-swap on the state word, into a new generation (so outcomes of
//! calls admitted before it are dropped), announced once, waking gate-mode
//! waiters.

use crate::sync::Ordering;
use std::time::Duration;

use super::{state_of, Shared};
use crate::breaker::state::{Manual, Tag, Word};
use crate::millis::millis_up;
use crate::policy::TripReason;

/// What an operator does to a breaker: [`Breaker::control`] on one
/// instance, or, through a fleet store, on every instance at once. Each is
/// the [`Breaker`] method of the same name.
///
/// [`Breaker`]: crate::Breaker
/// [`Breaker::control`]: crate::Breaker::control
///
/// ```
/// use tower_circuit_breaker::{Breaker, Config, Control, State};
///
/// let breaker = Breaker::new(Config::default());
/// assert!(breaker.control(Control::ForceOpen(None)));
/// assert_eq!(breaker.state(), State::ForcedOpen);
/// assert!(breaker.control(Control::Restore));
/// assert_eq!(breaker.state(), State::Closed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Control {
    /// Open now; with a period, for that long (capped by `max_open`, then
    /// probing as usual), without one, until restored whatever the clock
    /// says.
    ForceOpen(Option<Duration>),
    /// Closed until restored: failures are counted, never trip it.
    ForceClosed,
    /// Admits everything, records nothing, until restored.
    Disable,
    /// Back to automatic control, closed, from a manual mode; otherwise
    /// nothing.
    Restore,
    /// Closed, with the policy's counters, the backoff and any announced
    /// retry-after forgotten, from any state.
    Reset,
}

impl Control {
    /// The name the admin endpoint's routes give it: `force-open`,
    /// `force-closed`, `disable`, `restore` or `reset`.
    pub fn name(self) -> &'static str {
        match self {
            Control::ForceOpen(_) => "force-open",
            Control::ForceClosed => "force-closed",
            Control::Disable => "disable",
            Control::Restore => "restore",
            Control::Reset => "reset",
        }
    }
}

impl Shared {
    /// Carries out `command`; returns whether the state changed.
    pub(crate) fn command(&self, command: Control) -> bool {
        let mut book = self.lock();
        let now = self.now_ms();
        let mut w = self.load();
        loop {
            let next = match (command, w.tag()) {
                (Control::ForceOpen(Some(period)), _) => {
                    let until = now.saturating_add(millis_up(period.min(book.config.max_open())));
                    Word::open(w.next_generation(), until)
                }
                (Control::ForceOpen(None), Tag::Manual) if w.manual_mode() == Manual::Isolated => {
                    return false
                }
                (Control::ForceOpen(None), _) => {
                    Word::manual(w.next_generation(), Manual::Isolated)
                }
                (Control::ForceClosed, Tag::Manual) if w.manual_mode() == Manual::ForcedClosed => {
                    return false
                }
                (Control::ForceClosed, _) => {
                    Word::manual(w.next_generation(), Manual::ForcedClosed)
                }
                (Control::Disable, Tag::Manual) if w.manual_mode() == Manual::Disabled => {
                    return false
                }
                (Control::Disable, _) => Word::manual(w.next_generation(), Manual::Disabled),
                (Control::Restore, Tag::Manual)
                | (Control::Reset, Tag::Open | Tag::HalfOpen | Tag::Manual) => {
                    Word::closed(w.next_generation())
                }
                (Control::Restore, _) => return false,
                (Control::Reset, _) => {
                    // Already closed: no transition, but forget the past.
                    self.reset_policy(&mut book);
                    book.attempt = 0;
                    book.hint_until_ms = None;
                    self.refresh_success_flag(&book);
                    return false;
                }
            };
            match self.cas(w, next) {
                Ok(()) => {
                    self.reset_policy(&mut book);
                    book.hint_until_ms = None;
                    book.since_ms = now;
                    if next.tag() == Tag::Open {
                        self.book_open_period(&mut book, now, next.open_until_ms());
                        book.last_trip = Some(TripReason::Manual);
                        book.counts.opened += 1;
                    } else {
                        book.attempt = 0;
                    }
                    self.forget_probes(&mut book);
                    self.refresh_success_flag(&book);
                    let retry_after = (next.tag() == Tag::Open)
                        .then(|| Duration::from_millis(next.open_until_ms().saturating_sub(now)));
                    let from = state_of(w);
                    self.announce(
                        book,
                        self.transition(from, next, Some(TripReason::Manual), retry_after),
                    );
                    return true;
                }
                // A permit was taken or given back meanwhile: look again.
                Err(actual) => w = actual,
            }
        }
    }

    /// Shadow mode on or off: refusals become passes, transitions are
    /// announced as what a real breaker would have done.
    pub(crate) fn set_shadow(&self, on: bool) {
        let was = self.hot.shadow.swap(on, Ordering::Relaxed);
        if was != on {
            tracing::info!(breaker = %self.name(), shadow = on, "circuit breaker shadow mode changed");
            // Shadow mode turns every refusal into a pass: a gate-mode clone
            // waiting for the breaker to admit it may go now (and one
            // admitted by shadow mode must look again when it ends).
            self.wake_waiters();
        }
    }

    pub(crate) fn is_shadow(&self) -> bool {
        self.hot.shadow.load(Ordering::Relaxed)
    }
}
