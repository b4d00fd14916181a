//! The fleet's settings, [`MemoryFleetBuilder`]: each setting's meaning
//! and default (the Redis store's, where they apply), the checks `build`
//! makes of them, and the runtime the instances' tasks will run on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::state::Fleet;
use super::task::Timing;
use super::{FleetInner, MemoryFleet, MemoryFleetError};
use crate::store::fleet::{self, LinkSettings};

/// Builds a [`MemoryFleet`]; [`build`](Self::build) checks every value.
///
/// The settings are the Redis store's, where they apply (a fleet in memory
/// has no refresh interval, command timeout or key prefix):
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::store::memory::MemoryFleet;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let fleet = MemoryFleet::builder()
///     .probe_lease(Duration::from_secs(5))
///     .hold(Duration::from_millis(200))
///     .failure_window(Duration::from_secs(30))
///     .failures_to_open(10)
///     .queue_capacity(1024)
///     .build();
/// assert!(fleet.is_ok());
///
/// let invalid = MemoryFleet::builder().probe_lease(Duration::ZERO).build();
/// assert!(invalid.is_err(), "an invalid setting is an error, never a panic");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryFleetBuilder {
    pub(super) probe_lease: Duration,
    pub(super) hold: Duration,
    pub(super) queue_capacity: usize,
    pub(super) failures_to_open: Option<u32>,
    pub(super) failure_window: Duration,
    pub(super) quorum: u32,
}

impl MemoryFleetBuilder {
    /// How long the probe lock is held, its lease (default 10 s): it
    /// should cover a probe's duration and be shorter than the open
    /// period. A lease that runs out without a verdict passes the turn on;
    /// a prober still half-open renews it.
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.probe_lease = lease;
        self
    }

    /// How long past the fleet's open period (or another instance's probe
    /// lease) a breaker keeps refusing while its instance's task races for
    /// the probe lock (default 1 s). If the task is gone, the breaker
    /// probes on its own once the hold has run out.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// Writes that may wait for each instance's task (default 4,096); past
    /// that the oldest is dropped and counted.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity;
        self
    }

    /// Failures (with no success in between, anywhere in the fleet) that
    /// open a breaker fleet-wide, whatever its policy. By default, the
    /// policy's consecutive-failures threshold; a policy without one is not
    /// counted fleet-wide (its openings are still shared).
    pub fn failures_to_open(mut self, failures: u32) -> Self {
        self.failures_to_open = Some(failures);
        self
    }

    /// How long the fleet's count remembers a failure with no further
    /// failure (default 60 s).
    pub fn failure_window(mut self, window: Duration) -> Self {
        self.failure_window = window;
        self
    }

    /// How many instances must be failing at once before the fleet opens
    /// a breaker (default 1: any instance's evidence opens it for all).
    /// See the Redis store's
    /// [`quorum`](crate::store::redis::RedisStoreBuilder::quorum), which
    /// this mirrors: below the quorum, an instance's breaker opens on its
    /// own and the others keep serving. Instances are told apart as
    /// [`MemoryFleet::named_instance`] says.
    pub fn quorum(mut self, instances: u32) -> Self {
        self.quorum = instances;
        self
    }

    /// Checks the settings and makes the fleet, whose instances' tasks will
    /// run on the current tokio runtime. Must be called inside one.
    pub fn build(self) -> Result<MemoryFleet, MemoryFleetError> {
        fleet::check_durations(&[
            ("probe_lease", self.probe_lease),
            ("hold", self.hold),
            ("failure_window", self.failure_window),
        ])?;
        fleet::check_counts(self.queue_capacity, self.failures_to_open, self.quorum)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| MemoryFleetError::NoRuntime)?;
        Ok(MemoryFleet {
            inner: Arc::new(FleetInner {
                state: Mutex::new(Fleet::default()),
                settings: Arc::new(LinkSettings {
                    failures_to_open: self.failures_to_open,
                    failure_window: self.failure_window,
                    probe_lease: self.probe_lease,
                    quorum: self.quorum,
                }),
                timing: Timing {
                    hold: self.hold,
                    lease: self.probe_lease,
                },
                queue_capacity: self.queue_capacity,
                runtime,
            }),
        })
    }
}
