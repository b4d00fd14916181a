//! Configs from files and snapshots as JSON (cargo feature `serde`).
//!
//! [`Config`], [`TripPolicy`] and [`RegistryConfig`] deserialize from any
//! self-describing format (TOML, JSON, YAML...). Every value goes through
//! [`Config::builder`], so a file is checked exactly as code is, and every
//! mistake (a wrong type, a bad duration, a value out of range, an unknown
//! field) is an error that names its field:
//!
//! ```text
//! invalid circuit breaker config: `trip.count_window.failures` must be at most the window (10)
//! ```
//!
//! A config's fields are named as the [`ConfigBuilder`](crate::ConfigBuilder)
//! methods are:
//!
//! | field | written as |
//! | --- | --- |
//! | `name` | a string |
//! | `trip` | a trip policy, below |
//! | `cooldown`, `min_open`, `max_open`, `probe_interval`, `quota_probe_interval` | a duration |
//! | `probe_timeout`, `first_frame_timeout`, `frame_idle_timeout`, `cancelled_failure_after`, `max_quota_hold` | a duration, or `"none"` (or null) for no limit |
//! | `backoff`, `jitter` | a number |
//! | `probes`, `successes_to_close` | a whole number |
//! | `trip_on_pushback` | `true` or `false` |
//! | `latency_to` | `"head"`, `"first_frame"` or `"end"` |
//!
//! Durations are strings of whole numbers with units, largest first
//! (`"30s"`, `"250ms"`, `"5m"`, `"1h"`, `"1m30s"`; see [`parse_duration`]).
//! A trip policy is a table with one key naming it, whose value holds its
//! settings: the [policy table](crate::policy) gives each policy's name and
//! settings in a config file (`consecutive_failures = { threshold = 3 }`).
//!
//! Fields left out keep the builders' defaults.
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::{policy::{ConsecutiveFailures, TimeWindow, TripPolicy}, Config};
//!
//! let config: Config = toml::from_str(r#"
//!     name = "openai"
//!     cooldown = "30s"
//!     probe_timeout = "none"
//!     trip = { any_of = [
//!         { consecutive_failures = { threshold = 3 } },
//!         { time_window = { window = "60s", buckets = 6, min_calls = 20, failure_rate = 0.5 } },
//!     ] }
//! "#)?;
//! assert_eq!(config.cooldown(), Duration::from_secs(30));
//! assert_eq!(config.probe_timeout(), None);
//! assert_eq!(config.trip(), &TripPolicy::any_of([
//!     ConsecutiveFailures::new(3).into(),
//!     TimeWindow::new(Duration::from_secs(60)).buckets(6).min_calls(20).failure_rate(0.5).into(),
//! ]));
//!
//! let err = toml::from_str::<Config>(r#"trip = { count_window = { failures = 11, window = 10 } }"#)
//!     .unwrap_err();
//! assert!(err.message().contains("`trip.count_window.failures` must be at most the window (10)"));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! The other way, [`Snapshot`](crate::Snapshot), [`Counts`](crate::Counts),
//! [`State`](crate::State), [`PolicyFigures`](crate::policy::PolicyFigures),
//! [`TripReason`](crate::policy::TripReason) and
//! [`Transition`](crate::events::Transition) serialize, so a status page can
//! serve what the request path sees. Durations become whole milliseconds in
//! fields named `_ms` (`retry_after_ms`, `time_in_state_ms`), states and
//! policies snake-case names:
//!
//! ```
//! use tower_circuit_breaker::{Breaker, Config};
//!
//! let breaker = Breaker::new(Config::builder().name("openai").build()?);
//! breaker.force_open(None);
//! let json = serde_json::to_value(breaker.snapshot())?;
//! assert_eq!(json["name"], "openai");
//! assert_eq!(json["state"], "forced_open");
//! assert_eq!(json["counts"]["rejected"], 0);
//! assert_eq!(json["policy"]["policy"], "consecutive_failures");
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```

mod duration;
mod raw;
mod scalar;
mod snapshot;

use std::fmt;
use std::hash::Hash;

use ::serde::de::{Deserialize, Deserializer, Error as _};

pub use duration::{parse_duration, DurationError};

use crate::error::ConfigError;
use crate::policy::TripPolicy;
use crate::registry::{Registry, RegistryBuilder};
use crate::Config;
use raw::{RawConfig, RawRegistry};
use scalar::Scalar;

/// Builds the config through [`Config::builder`], so every check of
/// [`ConfigBuilder::build`](crate::ConfigBuilder::build) runs; fields left
/// out keep their defaults. See the [module docs](self) for the format.
impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawConfig::deserialize(deserializer)?
            .build("")
            .map_err(D::Error::custom)
    }
}

/// Reads a policy as the `trip` field of a config is written
/// (`{ consecutive_failures = { threshold = 3 } }`) and checks it as the
/// config builder would; errors name fields from the policy down
/// (`count_window.failures`).
impl<'de> Deserialize<'de> for TripPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let written = Scalar::deserialize(deserializer)?;
        // Read on its own, the policy is at the root: errors there name it.
        let policy = raw::policy_at(&written, "").map_err(|err| {
            let named = match err.field() {
                "" => ConfigError::new("policy", err.problem()),
                _ => err,
            };
            D::Error::custom(named)
        })?;
        // The config builder checks the policy under the same paths.
        Config::builder()
            .trip(policy.clone())
            .build()
            .map_err(|err| D::Error::custom(untrip(raw::in_file("", err))))?;
        Ok(policy)
    }
}

/// An error about a policy, named from the policy down.
fn untrip(err: ConfigError) -> ConfigError {
    let field = err.field();
    let field = field.strip_prefix("trip.").unwrap_or(field);
    ConfigError::new(field, err.problem())
}

/// The configs of a [`Registry`]: a default and configs of some keys' own,
/// as a file holds them.
///
/// ```toml
/// max_keys = 1000            # optional: the registry's bound
///
/// [default]                  # every key without a section of its own
/// cooldown = "30s"
/// trip = { consecutive_failures = { threshold = 5 } }
///
/// [keys."openai/gpt-x"]      # only what differs from [default]
/// trip = { count_window = { failures = 3, window = 10 } }
/// ```
///
/// A key's section is laid over `[default]`: the fields it writes win, the
/// others come from `[default]` (the trip policy is replaced whole, never
/// merged). Each key's config is named after the key. Every config is
/// checked when the file is read; an error names its field by path, for
/// example ``keys."openai/gpt-x".trip.count_window.failures``.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{serialization::RegistryConfig, policy::CountWindow, State};
///
/// let configs: RegistryConfig<String> = toml::from_str(r#"
///     [default]
///     cooldown = "30s"
///
///     [keys."openai/gpt-x"]
///     trip = { count_window = { failures = 3, window = 10 } }
/// "#)?;
/// let gpt_x = configs.config(&"openai/gpt-x".to_string());
/// assert_eq!(gpt_x.cooldown(), Duration::from_secs(30), "from [default]");
/// assert_eq!(gpt_x.trip(), &CountWindow::new(3, 10).into());
///
/// let registry = configs.build();
/// let breaker = registry.get(&"openai/gpt-x".to_string())?;
/// assert_eq!(breaker.config().trip(), &CountWindow::new(3, 10).into());
///
/// // Later, from the edited file: every breaker keeps its state and counts.
/// breaker.force_open(Some(Duration::from_secs(60)));
/// let edited: RegistryConfig<String> = toml::from_str(r#"
///     [keys."openai/gpt-x"]
///     cooldown = "10s"
/// "#)?;
/// edited.reload(&registry);
/// assert_eq!(breaker.config().cooldown(), Duration::from_secs(10));
/// assert_eq!(breaker.state(), State::Open);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RegistryConfig<K> {
    default: Config,
    keys: Vec<(K, Config)>,
    max_keys: Option<usize>,
}

impl<K> RegistryConfig<K>
where
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
{
    /// The config of every key without a section of its own.
    pub fn default_config(&self) -> &Config {
        &self.default
    }

    /// The keys with a config of their own, in the order written.
    pub fn keys(&self) -> &[(K, Config)] {
        &self.keys
    }

    /// The config `key` gets: its own, or the default.
    pub fn config(&self, key: &K) -> &Config {
        self.keys
            .iter()
            .find(|(k, _)| k == key)
            .map_or(&self.default, |(_, config)| config)
    }

    /// The registry's bound, if the file sets one.
    pub fn max_keys(&self) -> Option<usize> {
        self.max_keys
    }

    /// A registry builder with these configs (and bound), to add what a
    /// file cannot say, such as [`parent`](RegistryBuilder::parent).
    ///
    /// ```
    /// use tower_circuit_breaker::serialization::RegistryConfig;
    ///
    /// let configs: RegistryConfig<String> = toml::from_str("[keys.openai]\nprobes = 2")?;
    /// let registry = configs
    ///     .builder()
    ///     .parent(|key: &String| key.split_once('/').map(|(provider, _)| provider.to_string()))
    ///     .build();
    /// let (_, parent) = registry.get_with_parent(&"openai/gpt-x".to_string())?;
    /// assert_eq!(parent.map(|p| p.config().probes()), Some(2));
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(&self) -> RegistryBuilder<K> {
        let mut builder = Registry::builder().default_config(self.default.clone());
        for (key, config) in &self.keys {
            builder = builder.config(key.clone(), config.clone());
        }
        if let Some(max_keys) = self.max_keys {
            builder = builder.max_keys(max_keys);
        }
        builder
    }

    /// A registry with these configs.
    pub fn build(&self) -> Registry<K> {
        self.builder().build()
    }

    /// Puts these configs into `registry` ([`Registry::reload`]): every
    /// breaker keeps its state, counts and open period. The bound is the
    /// registry's own and does not change.
    pub fn reload(&self, registry: &Registry<K>) {
        registry.reload(self.default.clone(), self.keys.iter().cloned());
    }
}

impl<'de, K> Deserialize<'de> for RegistryConfig<K>
where
    K: Deserialize<'de> + Hash + Eq + fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawRegistry::<K>::deserialize(deserializer)?;
        let max_keys = raw.max_keys().map_err(D::Error::custom)?;
        let default = raw.default.build("default").map_err(D::Error::custom)?;
        let mut keys = Vec::with_capacity(raw.keys.0.len());
        for (key, own) in raw.keys.0 {
            let name = key.to_string();
            let prefix = format!("keys.{name:?}");
            let config = own
                .over(&raw.default)
                .build_named(&prefix, Some(name))
                .map_err(D::Error::custom)?;
            keys.push((key, config));
        }
        Ok(RegistryConfig {
            default,
            keys,
            max_keys,
        })
    }
}
