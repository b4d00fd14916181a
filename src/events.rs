//! States and transitions: what the breaker tells the world when its state
//! changes.
//!
//! Every real transition is announced exactly once, by the thread that won
//! the compare-and-swap performing it:
//!
//! * as a `tracing` event with structured fields (`breaker`, `from`, `to`,
//!   `generation`, `reason`, `policy`, `retry_after_ms`, `shadow`): `WARN`
//!   when the breaker opens (or an operator holds it open), `INFO` otherwise;
//! * to every subscriber ([`Breaker::subscribe`](crate::Breaker::subscribe)),
//!   in order per breaker, through a bounded broadcast channel: sending never
//!   waits, so a slow or dropped subscriber never blocks the request path (a
//!   subscriber that falls behind skips ahead and is told how many it missed).
//!
//! In shadow mode the same transitions are announced with `shadow: true`
//! ("would have opened"), while no call is ever refused.
//!
//! # Observers
//!
//! Whatever watches every breaker of the process (the `metrics` feature's
//! gauges, an admin page, your own exporter) is an [`Observer`], added once
//! with [`observe`]: it learns of each breaker made and of each transition,
//! in order per breaker, on the thread that made it, right after the
//! subscribers. The breaker calls its observers and knows nothing else of
//! them. An observer must return quickly and never block: it runs on the
//! request path of the call that caused the transition.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower_circuit_breaker::events::{observe, Observer, Transition};
//! use tower_circuit_breaker::{Breaker, Config, State};
//!
//! #[derive(Default)]
//! struct Openings(AtomicUsize);
//!
//! impl Observer for Openings {
//!     fn transition(&self, transition: &Transition) {
//!         if transition.to == State::ForcedOpen {
//!             self.0.fetch_add(1, Ordering::Relaxed);
//!         }
//!     }
//! }
//!
//! let openings = Arc::new(Openings::default());
//! observe(openings.clone());
//! Breaker::new(Config::default()).force_open(None);
//! assert!(openings.0.load(Ordering::Relaxed) >= 1);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::millis::millis;
use crate::policy::TripReason;

/// A breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls go through; outcomes feed the trip policy.
    Closed,
    /// Calls are refused at once with [`CircuitOpen`](crate::CircuitOpen).
    Open,
    /// The open period has ended: up to `probes` calls go through as probes;
    /// the rest are refused until the probes tell whether to close or reopen.
    HalfOpen,
    /// Held open by an operator ([`Breaker::force_open`](crate::Breaker::force_open) without an end):
    /// refuses everything, whatever the clock says, until restored.
    ForcedOpen,
    /// Held closed by an operator ([`Breaker::force_closed`](crate::Breaker::force_closed)): admits
    /// everything; failures are counted but never trip it.
    ForcedClosed,
    /// Switched off by an operator ([`Breaker::disable`](crate::Breaker::disable)): admits everything
    /// and records nothing.
    Disabled,
}

impl State {
    /// The state's snake-case name: `"closed"`, `"open"`, `"half_open"`,
    /// `"forced_open"`, `"forced_closed"` or `"disabled"`, as metric labels
    /// and serialized snapshots spell it.
    ///
    /// ```
    /// use tower_circuit_breaker::State;
    ///
    /// assert_eq!(State::HalfOpen.as_str(), "half_open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
            State::ForcedOpen => "forced_open",
            State::ForcedClosed => "forced_closed",
            State::Disabled => "disabled",
        }
    }
}

/// One state change of one breaker.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{Breaker, Config, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let breaker = Breaker::new(Config::builder().name("search").build().unwrap());
/// let mut transitions = breaker.subscribe();
/// breaker.force_open(None);
/// let t = transitions.recv().await.unwrap();
/// assert_eq!((&*t.breaker, t.from, t.to), ("search", State::Closed, State::ForcedOpen));
/// # }
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct Transition {
    /// The breaker's name (its key, in a registry).
    pub breaker: Arc<str>,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The generation the breaker entered.
    pub generation: u32,
    /// Why: the policy that tripped with its figures, a probe's failure, or
    /// an operator. `None` for the automatic open to half-open and half-open
    /// to closed steps.
    pub reason: Option<TripReason>,
    /// How long it stays open (when `to` is [`State::Open`]).
    pub retry_after: Option<Duration>,
    /// Announced by a breaker in shadow mode: what a real breaker would have
    /// done; no call was refused.
    pub shadow: bool,
    /// Which breaker announced it: breakers may share a name (read by the
    /// admin endpoint's streams of a set of breakers).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) origin: Origin,
}

/// Equal when every public field is: which breaker of that name announced
/// it is left out, as it is from `Debug`.
impl PartialEq for Transition {
    fn eq(&self, other: &Self) -> bool {
        self.breaker == other.breaker
            && self.from == other.from
            && self.to == other.to
            && self.generation == other.generation
            && self.reason == other.reason
            && self.retry_after == other.retry_after
            && self.shadow == other.shadow
    }
}

impl fmt::Debug for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transition")
            .field("breaker", &self.breaker)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("generation", &self.generation)
            .field("reason", &self.reason)
            .field("retry_after", &self.retry_after)
            .field("shadow", &self.shadow)
            .finish()
    }
}

/// The breaker a transition comes from: the address of its shared state,
/// unique among the breakers alive (so among those a subscriber holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Origin(pub(crate) usize);

/// Watches every breaker of the process: added with [`observe`]. Both
/// methods do nothing unless implemented.
pub trait Observer: Send + Sync + 'static {
    /// A breaker named `name` was made, closed.
    fn created(&self, name: &str) {
        let _ = name;
    }

    /// A breaker changed state (shadow-mode transitions included: see
    /// [`Transition::shadow`]).
    fn transition(&self, transition: &Transition) {
        let _ = transition;
    }
}

/// The observers added so far, and whether there is any: a breaker made
/// or changed with none pays one load.
static OBSERVERS: RwLock<Vec<Arc<dyn Observer>>> = RwLock::new(Vec::new());
static ANY_OBSERVER: AtomicBool = AtomicBool::new(false);

/// Adds `observer` to every breaker of the process, from now on: breakers
/// made before are observed from their next transition. Observers are
/// never removed.
pub fn observe(observer: Arc<dyn Observer>) {
    OBSERVERS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(observer);
    ANY_OBSERVER.store(true, Ordering::Release);
}

fn each_observer(tell: impl Fn(&dyn Observer)) {
    if !ANY_OBSERVER.load(Ordering::Acquire) {
        return;
    }
    // Cloned out, so that an observer may add another without a deadlock.
    let observers = OBSERVERS.read().unwrap_or_else(|p| p.into_inner()).clone();
    for observer in &observers {
        tell(observer.as_ref());
    }
}

/// A breaker named `name` was made: its observers learn of it.
pub(crate) fn created(name: &str) {
    each_observer(|o| o.created(name));
}

impl Transition {
    /// Tells the world about this transition, once it is made and its
    /// subscribers have it: the `tracing` event, then every observer.
    pub(crate) fn publish(&self) {
        self.emit();
        each_observer(|o| o.transition(self));
    }

    fn emit(&self) {
        let reason = self.reason.as_ref().map(tracing::field::display);
        let policy = self.reason.as_ref().map(TripReason::policy);
        let retry_after_ms = self.retry_after.map(millis);
        macro_rules! event {
            ($level:ident, $message:literal) => {
                tracing::$level!(
                    breaker = %self.breaker,
                    from = ?self.from,
                    to = ?self.to,
                    generation = self.generation,
                    reason,
                    policy,
                    retry_after_ms,
                    shadow = self.shadow,
                    $message
                )
            };
        }
        match (self.to, self.shadow) {
            (State::Open, false) => event!(warn, "circuit breaker opened"),
            (State::Open, true) => event!(warn, "circuit breaker would have opened (shadow mode)"),
            (State::HalfOpen, _) => event!(info, "circuit breaker half-open: probing"),
            (State::Closed, _) => event!(info, "circuit breaker closed"),
            (State::ForcedOpen, _) => event!(warn, "circuit breaker held open by an operator"),
            (State::ForcedClosed, _) => event!(info, "circuit breaker held closed by an operator"),
            (State::Disabled, _) => event!(info, "circuit breaker disabled by an operator"),
        }
    }
}
