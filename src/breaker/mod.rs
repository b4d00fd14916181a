//! The breaker itself: its state, shared by every service it guards, and the
//! [`Breaker`] handle that reads it.

pub(crate) mod admission;
pub(crate) mod clones;
pub(crate) mod shared;
pub(crate) mod state;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::layer::CircuitBreakerLayer;
use crate::policy::{PolicyFigures, TripReason};
use shared::Shared;

/// A breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls go through; outcomes feed the trip policy.
    Closed,
    /// Calls are refused at once with [`CircuitOpen`](crate::CircuitOpen).
    Open,
    /// The open period has ended: up to `probes` calls go through as probes;
    /// the rest are refused until the probes tell whether to close or reopen.
    HalfOpen,
}

/// A cheap, cloneable handle to one breaker's state.
///
/// Every service a [`CircuitBreakerLayer`] wraps, the layer itself, and every
/// clone of this handle refer to the same breaker: the handle a metrics page
/// reads is the one the request path updates.
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
            shared: Arc::new(Shared::new(config)),
        }
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The config it was built with.
    pub fn config(&self) -> &Config {
        &self.shared.config
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

    /// A layer whose services all share this breaker.
    pub fn layer(&self) -> CircuitBreakerLayer {
        CircuitBreakerLayer::from_breaker(self.clone())
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
}

/// Running totals kept by a breaker.
///
/// Closed-state successes are not counted separately: counting them would
/// put a shared write on the hot path this crate keeps free of one. Calls
/// and refusals are counted by each service clone for itself and summed
/// here. Every admitted call ends as a success, a failure, an ignored or a
/// stale outcome, or a cancellation, or is still in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Calls admitted: passed to the inner service (probes included).
    pub calls: u64,
    /// Calls refused without calling the inner service.
    pub rejected: u64,
    /// Failures recorded (closed-state and probe failures).
    pub failures: u64,
    /// Outcomes the classifier ignored.
    pub ignored: u64,
    /// Outcomes dropped because the breaker had moved to another generation.
    pub stale: u64,
    /// Times the breaker opened (trips and reopenings).
    pub opened: u64,
    /// Probe permits granted.
    pub probes: u64,
}
