//! Why a fleet could not be built ([`MemoryFleetError`]): a setting out of
//! range, or no tokio runtime for the instances' tasks.

use std::error::Error;
use std::fmt;

use crate::error::ConfigError;

/// Why a [`MemoryFleet`](super::MemoryFleet) could not be built.
///
/// ```
/// use tower_circuit_breaker::store::memory::{MemoryFleet, MemoryFleetError};
///
/// // Outside a tokio runtime: the instances' tasks would have nowhere to run.
/// let error = MemoryFleet::builder().build().unwrap_err();
/// assert!(matches!(error, MemoryFleetError::NoRuntime));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum MemoryFleetError {
    /// A setting is out of range.
    Config(ConfigError),
    /// `build` was called outside a tokio runtime, which the instances'
    /// tasks need.
    NoRuntime,
}

impl fmt::Display for MemoryFleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryFleetError::Config(e) => e.fmt(f),
            MemoryFleetError::NoRuntime => {
                f.write_str("the memory fleet must be built inside a tokio runtime")
            }
        }
    }
}

impl Error for MemoryFleetError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            MemoryFleetError::Config(e) => Some(e),
            MemoryFleetError::NoRuntime => None,
        }
    }
}

impl From<ConfigError> for MemoryFleetError {
    fn from(e: ConfigError) -> Self {
        MemoryFleetError::Config(e)
    }
}
