//! A registry key's breakers outside tower: the two-step form of
//! [`Breaker::try_acquire`](crate::Breaker::try_acquire) for a key and its
//! parent, and signals on a key.

use std::error::Error;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use super::service::{admit_looked_up, Leg};
use super::{Registry, RegistryFull};
use crate::classify::{Outcome, Verdict};
use crate::error::CircuitOpen;

/// Leave to make one call under a registry key, through its breaker and its
/// parent's, from [`Registry::try_acquire`]. Records in both, as the keyed
/// service does; dropped unrecorded, the call counts as cancelled in both.
#[must_use = "a permit records how the call went; dropped unrecorded, the call counts as cancelled"]
pub struct KeyedPermit {
    legs: [Option<Leg>; 2],
    start: Option<Instant>,
}

/// Why [`Registry::try_acquire`] gave no permit.
#[derive(Clone, Debug)]
pub enum AcquireError {
    /// The key's breaker, or its parent's, refused.
    Open(CircuitOpen),
    /// The registry has no room for the key's breaker.
    Full(RegistryFull),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Open(open) => fmt::Display::fmt(open, f),
            AcquireError::Full(full) => fmt::Display::fmt(full, f),
        }
    }
}

impl Error for AcquireError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AcquireError::Open(open) => Some(open),
            AcquireError::Full(full) => Some(full),
        }
    }
}

impl From<CircuitOpen> for AcquireError {
    fn from(open: CircuitOpen) -> Self {
        AcquireError::Open(open)
    }
}

impl From<RegistryFull> for AcquireError {
    fn from(full: RegistryFull) -> Self {
        AcquireError::Full(full)
    }
}

impl<K> Registry<K>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    /// Asks to make one call under `key`, outside any tower service: a
    /// permit recording in the key's breaker and its parent's, or why not
    /// (either refused, as the keyed service would refuse, naming which; or
    /// no room for the key). The parent is asked first, so that an open
    /// parent costs its child no probe permit.
    ///
    /// ```
    /// use tower_circuit_breaker::registry::Registry;
    /// use tower_circuit_breaker::Config;
    ///
    /// let registry = Registry::<String>::builder()
    ///     .default_config(Config::default())
    ///     .parent(|key: &String| key.split_once('/').map(|(provider, _)| provider.to_string()))
    ///     .build();
    /// let permit = registry.try_acquire(&"openai/gpt-x".to_string())?;
    /// permit.failure();
    /// for key in ["openai/gpt-x", "openai"] {
    ///     assert_eq!(registry.get(&key.to_string())?.snapshot().counts.failures, 1);
    /// }
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire(&self, key: &K) -> Result<KeyedPermit, AcquireError> {
        let (child, parent) = self.get_with_parent(key)?;
        let legs = admit_looked_up(child, parent, || true)?;
        let start = legs
            .iter()
            .flatten()
            .any(|leg| leg.via.shared().needs_latency())
            .then(Instant::now);
        Ok(KeyedPermit { legs, start })
    }

    /// [`Breaker::open_on_signal`](crate::Breaker::open_on_signal) on `key`'s breaker (made if
    /// need be): opens it because something outside its calls saw its
    /// dependency struggle. A parent is a key of its own: trip it by its key.
    pub fn open_on_signal(
        &self,
        key: &K,
        reason: impl Into<std::sync::Arc<str>>,
        retry_after: Option<Duration>,
    ) -> Result<bool, RegistryFull> {
        Ok(self.get(key)?.open_on_signal(reason, retry_after))
    }

    /// [`Breaker::record`](crate::Breaker::record) on `key`'s breaker and
    /// its parent's: an outcome observed outside any call, counted in both
    /// as a keyed call's would be. Says what it did to `key`'s own breaker.
    pub fn record(
        &self,
        key: &K,
        verdict: impl Into<Verdict>,
    ) -> Result<crate::Recorded, RegistryFull> {
        let verdict = verdict.into();
        let (child, parent) = self.get_with_parent(key)?;
        let recorded = child.record(verdict);
        if let Some(parent) = parent {
            parent.record(verdict);
        }
        Ok(recorded)
    }
}

impl KeyedPermit {
    /// The call succeeded.
    pub fn success(self) {
        self.finish(Outcome::Success);
    }

    /// The call failed in a way that may pass.
    pub fn failure(self) {
        self.finish(Outcome::Failure);
    }

    /// The call says nothing of the dependency's health.
    pub fn ignore(self) {
        self.finish(Outcome::Ignore);
    }

    /// Records `verdict` in the key's breaker and its parent's.
    pub fn finish(mut self, verdict: impl Into<Verdict>) {
        let verdict = verdict.into();
        let start = self.start;
        for leg in self.legs.iter_mut().flatten() {
            leg.record(verdict, start);
        }
    }
}

impl Drop for KeyedPermit {
    fn drop(&mut self) {
        // A permit's holder says how the call went; one dropped unsaid is
        // a cancellation, however long it was held.
        for leg in self.legs.iter_mut().flatten() {
            leg.cancel(None);
        }
    }
}

impl fmt::Debug for KeyedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .legs
            .iter()
            .flatten()
            .map(|leg| &**leg.via.shared().name())
            .collect();
        f.debug_struct("KeyedPermit")
            .field("breakers", &names)
            .finish()
    }
}
