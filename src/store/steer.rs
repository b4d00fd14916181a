//! The fleet seen and steered by name: what an admin endpoint (or a
//! script of the operator's) reads of one name across the fleet, and the
//! controls that reach every instance's breaker of that name.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::{Breaker, Control};

/// A boxed, sendable future: what a backend's by-name operations return.
pub(crate) type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a fleet backend offers to read and steer by name.
pub(crate) trait Steer: Send + Sync + 'static {
    fn attach(&self, breaker: &Breaker) -> bool;
    fn control(&self, name: &str, control: Control) -> Pending<Result<(), FleetError>>;
    fn state(&self, name: &str) -> Pending<Result<FleetState, FleetError>>;
    fn instance(&self) -> &str;
    fn shares(&self, name: &str) -> bool;
}

/// Makes a store a [`Fleet`] backend through its own methods of the same
/// names (`attach`, `control`, `fleet_state`, `instance`, `shares`), and
/// converts it (or a reference to it) into a [`Fleet`].
macro_rules! steer_through_methods {
    ($store:ty) => {
        impl $crate::store::Steer for $store {
            fn attach(&self, breaker: &$crate::Breaker) -> bool {
                <$store>::attach(self, breaker)
            }

            fn control(
                &self,
                name: &str,
                control: $crate::Control,
            ) -> $crate::store::Pending<Result<(), $crate::store::FleetError>> {
                let (store, name) = (self.clone(), name.to_owned());
                Box::pin(async move { store.control(&name, control).await })
            }

            fn state(
                &self,
                name: &str,
            ) -> $crate::store::Pending<
                Result<$crate::store::FleetState, $crate::store::FleetError>,
            > {
                let (store, name) = (self.clone(), name.to_owned());
                Box::pin(async move { store.fleet_state(&name).await })
            }

            fn instance(&self) -> &str {
                <$store>::instance(self)
            }

            fn shares(&self, name: &str) -> bool {
                <$store>::shares(self, name)
            }
        }

        impl From<$store> for $crate::store::Fleet {
            fn from(store: $store) -> Self {
                $crate::store::Fleet::new(std::sync::Arc::new(store))
            }
        }

        impl From<&$store> for $crate::store::Fleet {
            fn from(store: &$store) -> Self {
                $crate::store::Fleet::new(std::sync::Arc::new(store.clone()))
            }
        }
    };
}
pub(crate) use steer_through_methods;

/// A fleet store, whichever the backend: made from a
/// [`RedisStore`](crate::store::redis::RedisStore) (feature `redis`) or a
/// [`MemoryStore`](crate::store::memory::MemoryStore), to attach breakers
/// to (a registry takes one with
/// [`RegistryBuilder::store`](crate::registry::RegistryBuilder::store)),
/// and to read and steer one name across every instance (the admin
/// endpoint takes one with `Admin::fleet`, feature `admin`). Cheap to
/// clone.
///
/// A fleet-wide control is kept by the fleet, not by one instance: every
/// instance's breakers of that name carry it out as soon as they hear of
/// it (at once by the store's push, at the latest one refresh interval
/// later), an instance that attaches a breaker of that name later carries
/// it out on attaching, and [`Control::Restore`] undoes it everywhere the
/// same way. Each control means what it means on one breaker
/// ([`Breaker::control`](crate::Breaker::control)), with these fleet-wide
/// forms:
///
/// * [`Control::ForceOpen`] with a period is a fleet opening for that
///   long: every instance refuses until it ends, then one instance probes
///   for the fleet, as after any opening;
/// * [`Control::ForceOpen`] without one, [`Control::ForceClosed`] and
///   [`Control::Disable`] hold every instance's breaker until restored;
/// * [`Control::Restore`] hands the breakers held by the fleet back to
///   automatic control (a breaker an operator held on one instance only
///   keeps that hold);
/// * [`Control::Reset`] forgets the fleet's state of the name (its
///   opening, counts, probe lock and votes) and resets every instance's
///   breaker, holds included.
///
/// ```
/// use tower_circuit_breaker::store::{memory::MemoryFleet, Fleet};
/// use tower_circuit_breaker::{Breaker, Config, Control, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let fleet = MemoryFleet::builder().build()?;
/// let (a, b) = (fleet.instance(), fleet.instance());
/// let on_a = Breaker::new(Config::builder().name("openai").build()?);
/// let on_b = Breaker::new(Config::builder().name("openai").build()?);
/// a.attach(&on_a);
/// b.attach(&on_b);
///
/// // An operator at instance a isolates the provider everywhere.
/// let steer = Fleet::from(&a);
/// steer.control("openai", Control::ForceOpen(None)).await?;
/// tokio::task::yield_now().await; // the instances' tasks take it in
/// assert_eq!(on_b.state(), State::ForcedOpen);
/// assert_eq!(steer.state("openai").await?.control, Some(Control::ForceOpen(None)));
///
/// steer.control("openai", Control::Restore).await?;
/// tokio::task::yield_now().await; // the instances' tasks take it in
/// assert_eq!(on_b.state(), State::Closed);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Fleet {
    backend: Arc<dyn Steer>,
}

impl Fleet {
    pub(crate) fn new(backend: Arc<dyn Steer>) -> Self {
        Fleet { backend }
    }

    /// Shares `breaker`'s state with the fleet under its name, as the
    /// store's own `attach` does; false if it already reports to a store.
    pub fn attach(&self, breaker: &Breaker) -> bool {
        self.backend.attach(breaker)
    }

    /// Carries out `control` on the breakers named `name` of every
    /// instance (see the [type's docs](Self) for what each does
    /// fleet-wide). Returns once the fleet has taken it; this instance's
    /// breakers carry it out at once, the others' as they hear of it.
    /// Fails when the fleet cannot be reached: nothing was changed then.
    pub async fn control(&self, name: &str, control: Control) -> Result<(), FleetError> {
        self.backend.control(name, control).await
    }

    /// The fleet's state of `name`, read from the fleet now.
    pub async fn state(&self, name: &str) -> Result<FleetState, FleetError> {
        self.backend.state(name).await
    }

    /// This instance's name in the fleet (the holder of a probe lock is
    /// named so).
    pub fn instance(&self) -> &str {
        self.backend.instance()
    }

    /// Whether `name` is shared with the fleet now (the store reaches the
    /// part of the fleet that keeps it).
    pub fn shares(&self, name: &str) -> bool {
        self.backend.shares(name)
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("instance", &self.backend.instance())
            .finish_non_exhaustive()
    }
}

/// The fleet's state of one name, as the fleet keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetState {
    /// The fleet's opening, while it keeps one.
    pub opening: Option<FleetOpening>,
    /// Closed-state failures counted by the fleet toward an opening.
    pub failures: u64,
    /// With a quorum above 1: the instances (their voter names) whose
    /// failures the count holds.
    pub failing: Vec<String>,
    /// With a quorum above 1: the instances whose own opening the quorum
    /// declined, while their vote runs.
    pub votes: Vec<String>,
    /// The instance holding the probe lock, and the rest of its lease.
    pub prober: Option<(String, Duration)>,
    /// The fleet-wide control in force ([`Control::ForceOpen`] without a
    /// period, [`Control::ForceClosed`] or [`Control::Disable`]), if any.
    pub control: Option<Control>,
}

/// A fleet opening.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetOpening {
    /// The fleet generation: one more on every opening of the name.
    pub generation: u64,
    /// Failed probe rounds in this outage (the backoff's attempt).
    pub attempt: u32,
    /// What is left of the open period (zero: it is over, and the fleet
    /// waits for a probe).
    pub open_for: Duration,
    /// How long until the fleet forgets the opening, if no probe settles
    /// it first.
    pub kept_for: Duration,
    /// What is left of `min_open`, counted from the outage's first opening.
    pub min_open_for: Duration,
    /// Probe successes counted in this generation.
    pub probe_successes: u32,
}

/// The fleet could not be read or steered: its store could not reach
/// where the name is kept. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetError {
    reason: String,
}

impl FleetError {
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        FleetError {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the fleet could not be reached: {}", self.reason)
    }
}

impl Error for FleetError {}
