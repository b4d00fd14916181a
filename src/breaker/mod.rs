//! The breaker itself: its state, shared by every service it guards, and the
//! [`Breaker`] handle that reads it.

pub(crate) mod admission;
pub(crate) mod clones;
pub(crate) mod fleet;
pub(crate) mod shared;
pub(crate) mod state;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::config::Config;
use crate::events::{State, Transition};
use crate::outcome::Verdict;
use crate::policy::{PolicyFigures, TripReason};
pub use shared::Control;
use shared::Shared;

/// A cheap, cloneable handle to one breaker's state.
///
/// Every service a [`CircuitBreakerLayer`](crate::CircuitBreakerLayer)
/// wraps, the layer itself, and every clone of this handle refer to the same
/// breaker: the handle a metrics page reads is the one the request path
/// updates. [`layer`](Breaker::layer) makes a layer around it, and
/// [`probe_actively`](Breaker::probe_actively) gives it an active prober.
///
/// ```
/// use tower_circuit_breaker::{Breaker, Config, State};
///
/// let breaker = Breaker::new(Config::builder().name("search").build()?);
/// assert_eq!(breaker.state(), State::Closed);
/// assert_eq!(breaker.snapshot().counts.rejected, 0);
/// let layer = breaker.layer(); // wrap services with it
/// # let _ = layer;
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Breaker {
    pub(crate) shared: Arc<Shared>,
}

impl Breaker {
    /// Creates a breaker, closed.
    pub fn new(config: Config) -> Self {
        Breaker {
            shared: Shared::new_arc(config),
        }
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The current config.
    pub fn config(&self) -> Config {
        self.shared.config()
    }

    /// Replaces the config, keeping the state, the counts and the open
    /// period: a reload never forgives an outage in progress. The trip
    /// policy's figures are kept when the policy is unchanged and start
    /// afresh when it changed; a half-open round in progress starts again
    /// under the new rules. The name is the breaker's own and does not
    /// change.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Config, State};
    ///
    /// let breaker = Breaker::new(Config::default());
    /// breaker.force_open(Some(Duration::from_secs(60)));
    /// breaker.reconfigure(Config::builder().cooldown(Duration::from_secs(5)).build()?);
    /// assert_eq!(breaker.state(), State::Open, "still open");
    /// assert_eq!(breaker.config().cooldown(), Duration::from_secs(5));
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn reconfigure(&self, config: Config) {
        self.shared.reconfigure(config);
    }

    /// The current state. An open breaker whose open period has ended reads
    /// as [`State::HalfOpen`] even before a call arrives to probe it.
    pub fn state(&self) -> State {
        self.shared.state()
    }

    /// The rest of the open period, while open.
    pub fn retry_after(&self) -> Option<Duration> {
        self.shared.retry_after()
    }

    /// State, counters and the policy's figures, read together.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Holds the breaker open. With a period, it opens now for that long
    /// (capped by `max_open`), then probes as usual; without one, it refuses
    /// every call, whatever the clock says, until [`restore`](Self::restore)
    /// or [`reset`](Self::reset). Returns whether the state changed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Config, State};
    ///
    /// let breaker = Breaker::new(Config::default());
    /// breaker.force_open(None); // isolate it
    /// assert_eq!(breaker.state(), State::ForcedOpen);
    /// breaker.restore(); // automatic again, closed
    /// assert_eq!(breaker.state(), State::Closed);
    /// breaker.force_open(Some(Duration::from_secs(60))); // an outage we know of
    /// assert_eq!(breaker.state(), State::Open);
    /// ```
    pub fn force_open(&self, period: Option<Duration>) -> bool {
        self.shared.command(Control::ForceOpen(period))
    }

    /// Holds the breaker closed until [`restore`](Self::restore): every call
    /// goes through; failures are counted but never open it.
    pub fn force_closed(&self) -> bool {
        self.shared.command(Control::ForceClosed)
    }

    /// Switches the breaker off until [`restore`](Self::restore): every call
    /// goes through and nothing is recorded.
    pub fn disable(&self) -> bool {
        self.shared.command(Control::Disable)
    }

    /// Hands a breaker held open, held closed or disabled back to automatic
    /// control, closed. Does nothing to a breaker under automatic control.
    pub fn restore(&self) -> bool {
        self.shared.command(Control::Restore)
    }

    /// Closes the breaker from any state and forgets its past: the policy's
    /// counters, the backoff, any announced retry-after.
    pub fn reset(&self) -> bool {
        self.shared.command(Control::Reset)
    }

    /// Carries out `control`, as the method of its name does; returns
    /// whether the state changed.
    pub fn control(&self, control: Control) -> bool {
        self.shared.command(control)
    }

    /// Opens the breaker because code outside its calls saw the dependency
    /// struggle: a load shedder, a health checker, a provider's status page,
    /// a quota alarm. Unlike [`force_open`](Self::force_open), an operator's
    /// hold, this is the breaker's own opening: announced as a transition
    /// with [`TripReason::Signal`], for the config's open period (lengthened
    /// by backoff when it was already probing), never shorter than
    /// `retry_after` (capped by `max_open`), then probed and closed on
    /// evidence as usual, and shared with a fleet like any opening. An open
    /// breaker stays open, its period lengthened when `retry_after` reaches
    /// past it; an operator's hold is left alone. Returns whether the
    /// breaker changed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Config, State};
    ///
    /// let breaker = Breaker::new(Config::builder().name("openai").build()?);
    /// // The provider's status page says it is degraded for a minute.
    /// breaker.open_on_signal("status page: degraded", Some(Duration::from_secs(60)));
    /// assert_eq!(breaker.state(), State::Open);
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn open_on_signal(
        &self,
        reason: impl Into<Arc<str>>,
        retry_after: Option<Duration>,
    ) -> bool {
        let reason = TripReason::Signal {
            reason: reason.into(),
        };
        self.shared.trip(reason, retry_after)
    }

    /// Records an outcome observed outside any call (a health check's
    /// result, a stream that failed after its call ended) and says what it
    /// did: while closed it feeds the trip policy as a call's outcome would,
    /// and can open the breaker ([`Recorded::Counted`] or
    /// [`Recorded::Opened`]); held closed by an operator it is counted
    /// ([`Recorded::CountedWhileHeld`]); otherwise (open, half-open,
    /// isolated or disabled) it changes nothing, since it is no probe
    /// ([`Recorded::Ignored`]). To open the breaker from any state, use
    /// [`open_on_signal`](Self::open_on_signal).
    ///
    /// ```
    /// use tower_circuit_breaker::{classify::Outcome, policy::ConsecutiveFailures, Breaker, Config, Recorded};
    ///
    /// let breaker = Breaker::new(Config::builder().trip(ConsecutiveFailures::new(2)).build()?);
    /// // Two health checks failed.
    /// assert_eq!(breaker.record(Outcome::Failure), Recorded::Counted);
    /// assert_eq!(breaker.record(Outcome::Failure), Recorded::Opened);
    /// // Open, an outcome from outside is no probe.
    /// assert_eq!(breaker.record(Outcome::Success), Recorded::Ignored);
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn record(&self, verdict: impl Into<Verdict>) -> Recorded {
        self.shared.record_outside(verdict.into())
    }

    /// Shadow mode: the breaker records, decides and announces everything a
    /// real one would (transitions come with `shadow: true`, "would have
    /// opened"), but never refuses a call, for rolling out thresholds safely.
    /// A call a real breaker would have refused goes through, counts in
    /// [`Counts::rejected`], and its outcome is not recorded (a real breaker
    /// would never have seen it). An operator's [`force_open`](Self::force_open)
    /// still refuses.
    pub fn set_shadow(&self, on: bool) {
        self.shared.set_shadow(on);
    }

    /// Whether shadow mode is on.
    pub fn is_shadow(&self) -> bool {
        self.shared.is_shadow()
    }

    /// Whether the breaker refuses calls on its own now: open (unless in
    /// shadow mode, which never refuses) or held open by an operator (which
    /// holds even then).
    pub(crate) fn refuses_calls(&self) -> bool {
        match self.state() {
            State::Open => !self.is_shadow(),
            State::ForcedOpen => true,
            _ => false,
        }
    }

    /// A receiver of this breaker's transitions from now on, in order. See
    /// [`events`](crate::events).
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.shared.subscribe()
    }

    /// Whether two handles refer to the same breaker.
    pub fn ptr_eq(&self, other: &Breaker) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.name())
            .field("state", &self.state())
            .finish()
    }
}

/// What [`Breaker::record`] did with an outcome observed outside any call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recorded {
    /// Closed: fed to the trip policy, and the breaker is still closed.
    Counted,
    /// Closed: fed to the trip policy, and the breaker is open now (this
    /// outcome tripped it, or one recorded at the same moment did).
    Opened,
    /// Held closed by an operator: counted in [`Counts`], no policy fed.
    CountedWhileHeld,
    /// Open, half-open, isolated or disabled: nothing changed and nothing
    /// was counted. An outcome from outside is no probe; use
    /// [`Breaker::open_on_signal`] to open from any state.
    Ignored,
}

/// A point-in-time view of one breaker, from [`Breaker::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The breaker's name.
    pub name: Arc<str>,
    /// The state, derived as [`Breaker::state`] does.
    pub state: State,
    /// The generation: it moves on at every transition.
    pub generation: u32,
    /// How long the breaker has been in `state`.
    pub time_in_state: Duration,
    /// The rest of the open period, while open.
    pub retry_after: Option<Duration>,
    /// Probes in flight, while half-open.
    pub probes_in_flight: u32,
    /// Probe successes so far in this half-open period.
    pub probe_successes: u32,
    /// Failed probe rounds since the breaker last closed (what the open
    /// period's backoff is computed from).
    pub failed_probe_rounds: u32,
    /// Why the breaker last opened.
    pub last_trip: Option<TripReason>,
    /// The trip policy's current figures.
    pub policy: PolicyFigures,
    /// Running totals since the breaker was created.
    pub counts: Counts,
    /// Whether shadow mode is on.
    pub shadow: bool,
}

/// Several breakers under one control: isolate or restore every model of a
/// provider in one call.
///
/// ```
/// use tower_circuit_breaker::{Breaker, BreakerGroup, Config, State};
///
/// let models: Vec<Breaker> = ["gpt-a", "gpt-b"]
///     .iter()
///     .map(|name| Breaker::new(Config::builder().name(*name).build().unwrap()))
///     .collect();
/// let provider = BreakerGroup::new(models.clone());
/// provider.force_open(None);
/// assert!(models.iter().all(|b| b.state() == State::ForcedOpen));
/// provider.restore();
/// assert!(models.iter().all(|b| b.state() == State::Closed));
/// ```
#[derive(Clone, Debug, Default)]
pub struct BreakerGroup {
    breakers: Vec<Breaker>,
}

impl BreakerGroup {
    /// A group of these breakers.
    pub fn new(breakers: impl IntoIterator<Item = Breaker>) -> Self {
        BreakerGroup {
            breakers: breakers.into_iter().collect(),
        }
    }

    /// Adds a breaker.
    pub fn push(&mut self, breaker: Breaker) {
        self.breakers.push(breaker);
    }

    /// The breakers, in order.
    pub fn breakers(&self) -> &[Breaker] {
        &self.breakers
    }

    /// [`Breaker::force_open`] on each; returns how many changed.
    pub fn force_open(&self, period: Option<Duration>) -> usize {
        self.each(|b| b.force_open(period))
    }

    /// [`Breaker::force_closed`] on each; returns how many changed.
    pub fn force_closed(&self) -> usize {
        self.each(Breaker::force_closed)
    }

    /// [`Breaker::disable`] on each; returns how many changed.
    pub fn disable(&self) -> usize {
        self.each(Breaker::disable)
    }

    /// [`Breaker::restore`] on each; returns how many changed.
    pub fn restore(&self) -> usize {
        self.each(Breaker::restore)
    }

    /// [`Breaker::reset`] on each; returns how many changed.
    pub fn reset(&self) -> usize {
        self.each(Breaker::reset)
    }

    /// [`Breaker::set_shadow`] on each.
    pub fn set_shadow(&self, on: bool) {
        self.breakers.iter().for_each(|b| b.set_shadow(on));
    }

    /// A snapshot of each, in order.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.breakers.iter().map(Breaker::snapshot).collect()
    }

    fn each(&self, command: impl Fn(&Breaker) -> bool) -> usize {
        self.breakers.iter().filter(|b| command(b)).count()
    }
}

/// Running totals kept by a breaker.
///
/// Closed-state successes are not counted separately: counting them would
/// put a shared write on the hot path this crate keeps free of one. Calls
/// and refusals are counted by each service clone for itself and summed
/// here. Every admitted call ends as a success, a failure, an ignored or a
/// stale outcome, or a cancellation, or is still in flight. Outcomes fed
/// from outside any call ([`Breaker::record`]) count in `failures` or
/// `ignored` as a call's would, and in `recorded`, not in `calls`: the
/// outcomes counted in all are `calls + recorded`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Calls admitted: passed to the inner service (probes included).
    pub calls: u64,
    /// Calls refused without calling the inner service.
    pub rejected: u64,
    /// Of those, calls refused because the breaker's parent (in a registry
    /// with parents) was open: counted here, in
    /// the child whose call it was, as well as in the parent's own
    /// `rejected`. A model's breaker thus shows every call its provider
    /// turned away.
    pub rejected_by_parent: u64,
    /// Failures recorded (closed-state and probe failures).
    pub failures: u64,
    /// Outcomes the classifier ignored.
    pub ignored: u64,
    /// Outcomes dropped because the breaker had moved to another generation.
    pub stale: u64,
    /// Calls dropped before their outcome was known: the response future
    /// (or a streamed body) dropped by the caller, typically by a timeout
    /// *outside* the breaker. They count neither way (a probe's permit goes
    /// back), so a breaker whose calls are all cancelled never trips: a
    /// growing count here says the timeout belongs inside the breaker (or
    /// that [`cancelled_failure_after`](crate::ConfigBuilder::cancelled_failure_after)
    /// should count the long waits among them as failures).
    pub cancelled: u64,
    /// Times the breaker opened (trips and reopenings).
    pub opened: u64,
    /// Probe permits granted.
    pub probes: u64,
    /// Outcomes fed from outside any call ([`Breaker::record`], and a
    /// registry's `record`) that counted: while closed or held closed.
    pub recorded: u64,
}
