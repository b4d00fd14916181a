//! Why a store could not be built ([`StoreError`]): a setting out of
//! range, a URL redis-rs refuses, or no tokio runtime to run the task on.

use std::error::Error;
use std::fmt;

use crate::error::ConfigError;

/// Why a [`RedisStore`](super::RedisStore) could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A setting is out of range.
    Config(ConfigError),
    /// The URL is not one redis-rs accepts.
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `build` was called outside a tokio runtime, which the store's task
    /// needs.
    NoRuntime,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Config(e) => e.fmt(f),
            StoreError::Url { url, reason } => write!(f, "invalid Redis URL `{url}`: {reason}"),
            StoreError::NoRuntime => {
                f.write_str("the Redis store must be built inside a tokio runtime")
            }
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StoreError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for StoreError {
    fn from(e: ConfigError) -> Self {
        StoreError::Config(e)
    }
}
