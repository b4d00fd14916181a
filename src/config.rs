//! Validated breaker settings: trip policy, open timing, half-open rules.

use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::policy::TripPolicy;

/// The most probes in flight, and probe successes to close, a config may
/// ask for: what the state word's half-open counters hold.
pub(crate) const MAX_COUNT: u32 = (1 << 20) - 1;

/// The longest open period a config may ask for.
const MAX_OPEN_LIMIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A breaker's settings, validated by [`ConfigBuilder::build`].
///
/// The defaults suit a model provider or another slow, expensive upstream:
///
/// | setting | default | meaning |
/// | --- | --- | --- |
/// | `trip` | 5 consecutive failures | when a closed breaker opens |
/// | `cooldown` | 30 s | first open period |
/// | `backoff` | 2.0 | each failed probe multiplies the open period |
/// | `max_open` | 5 min | cap on the open period, and on retry-after hints |
/// | `min_open` | 0 | floor under every open period |
/// | `jitter` | 0.0 | open period lengthened by up to this share, at random (never shortened) |
/// | `probes` | 1 | probe calls in flight at once while half-open |
/// | `successes_to_close` | 1 | probe successes that close the breaker |
/// | `probe_timeout` | 60 s | a probe running longer counts as a failure |
/// | `trip_on_pushback` | off | a failure that announces a retry-after opens the breaker at once |
/// | `probe_interval` | 5 s | with [active probing](crate::Breaker::probe_actively): the time between probes |
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{policy::CountWindow, Config};
///
/// let config = Config::builder()
///     .name("openai")
///     .trip(CountWindow::new(3, 10))
///     .cooldown(Duration::from_secs(10))
///     .successes_to_close(2)
///     .build()?;
/// assert_eq!(config.name(), "openai");
///
/// let err = Config::builder().probes(0).build().unwrap_err();
/// assert_eq!(err.field(), "probes");
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) name: Arc<str>,
    pub(crate) trip: TripPolicy,
    pub(crate) cooldown: Duration,
    pub(crate) min_open: Duration,
    pub(crate) max_open: Duration,
    pub(crate) backoff: f64,
    pub(crate) jitter: f64,
    pub(crate) probes: u32,
    pub(crate) successes_to_close: u32,
    pub(crate) probe_timeout: Option<Duration>,
    pub(crate) probe_interval: Duration,
    pub(crate) trip_on_pushback: bool,
}

impl Config {
    /// Starts from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::default(),
        }
    }

    /// Turns this config back into a builder, to change a few settings.
    pub fn to_builder(&self) -> ConfigBuilder {
        ConfigBuilder {
            config: self.clone(),
        }
    }

    /// The breaker's name, used in errors, events and logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The trip policy.
    pub fn trip(&self) -> &TripPolicy {
        &self.trip
    }

    /// The first open period.
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// The floor under every open period.
    pub fn min_open(&self) -> Duration {
        self.min_open
    }

    /// The cap on every open period and on retry-after hints.
    pub fn max_open(&self) -> Duration {
        self.max_open
    }

    /// The factor the open period grows by on each failed probe.
    pub fn backoff(&self) -> f64 {
        self.backoff
    }

    /// The largest share by which jitter lengthens an open period.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Probe calls allowed in flight at once while half-open.
    pub fn probes(&self) -> u32 {
        self.probes
    }

    /// Probe successes needed to close.
    pub fn successes_to_close(&self) -> u32 {
        self.successes_to_close
    }

    /// How long a probe may run before it counts as a failure.
    pub fn probe_timeout(&self) -> Option<Duration> {
        self.probe_timeout
    }

    /// With active probing, the time between probes.
    pub fn probe_interval(&self) -> Duration {
        self.probe_interval
    }

    /// Whether a failure that announces a retry-after opens the breaker at
    /// once.
    pub fn trip_on_pushback(&self) -> bool {
        self.trip_on_pushback
    }

    /// A preset for a model router in front of LLM providers: three
    /// failures in a row open the breaker, it stays open at least 10 s, an
    /// [active probe](crate::Breaker::probe_actively) goes every 5 s, and two
    /// probe successes in a row close it. Adjust it like any builder.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::Config;
    ///
    /// let config = Config::model_router().name("openai").build()?;
    /// assert_eq!(config.min_open(), Duration::from_secs(10));
    /// assert_eq!(config.successes_to_close(), 2);
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn model_router() -> ConfigBuilder {
        Config::builder()
            .trip(crate::policy::ConsecutiveFailures::new(3))
            .cooldown(Duration::from_secs(10))
            .min_open(Duration::from_secs(10))
            .probe_interval(Duration::from_secs(5))
            .successes_to_close(2)
    }

    /// The open period after `attempt` failed probe rounds (0 for the first
    /// trip), before jitter and hints: `cooldown * backoff^attempt`, capped by
    /// `max_open`, never below `min_open`.
    pub fn open_period(&self, attempt: u32) -> Duration {
        let grown =
            self.cooldown.as_secs_f64() * self.backoff.powi(attempt.min(i32::MAX as u32) as i32);
        let capped = if grown.is_finite() {
            Duration::from_secs_f64(grown.min(self.max_open.as_secs_f64()))
        } else {
            self.max_open
        };
        capped.clamp(self.min_open, self.max_open)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: Arc::from("default"),
            trip: TripPolicy::default(),
            cooldown: Duration::from_secs(30),
            min_open: Duration::ZERO,
            max_open: Duration::from_secs(300),
            backoff: 2.0,
            jitter: 0.0,
            probes: 1,
            successes_to_close: 1,
            probe_timeout: Some(Duration::from_secs(60)),
            probe_interval: Duration::from_secs(5),
            trip_on_pushback: false,
        }
    }
}

/// Builds a [`Config`]; [`build`](ConfigBuilder::build) checks every value
/// and returns a [`ConfigError`] naming the first bad field.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    config: Config,
}

impl ConfigBuilder {
    /// Names the breaker (default `"default"`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Sets the trip policy (default: 5 consecutive failures).
    pub fn trip(mut self, policy: impl Into<TripPolicy>) -> Self {
        self.config.trip = policy.into();
        self
    }

    /// Sets the first open period (default 30 s).
    pub fn cooldown(mut self, period: Duration) -> Self {
        self.config.cooldown = period;
        self
    }

    /// Sets the floor under every open period (default 0).
    pub fn min_open(mut self, period: Duration) -> Self {
        self.config.min_open = period;
        self
    }

    /// Sets the cap on every open period and on retry-after hints
    /// (default 5 min).
    pub fn max_open(mut self, period: Duration) -> Self {
        self.config.max_open = period;
        self
    }

    /// Sets the growth factor applied on each failed probe (default 2.0;
    /// 1.0 keeps the period fixed).
    pub fn backoff(mut self, factor: f64) -> Self {
        self.config.backoff = factor;
        self
    }

    /// Lengthens each open period by a random share up to `share`, in
    /// `[0, 1)` (default 0), so that many clients do not probe in step.
    /// Jitter never shortens a period: `cooldown` stays the least time
    /// before the first probe, and `max_open` still caps the result.
    pub fn jitter(mut self, share: f64) -> Self {
        self.config.jitter = share;
        self
    }

    /// Sets how many probes may be in flight at once while half-open
    /// (default 1; 0 is an error).
    pub fn probes(mut self, probes: u32) -> Self {
        self.config.probes = probes;
        self
    }

    /// Sets how many probe successes close the breaker (default 1).
    pub fn successes_to_close(mut self, successes: u32) -> Self {
        self.config.successes_to_close = successes;
        self
    }

    /// Sets how long a probe may run before it counts as a failure
    /// (default 60 s); `None` lets probes run as long as they like.
    pub fn probe_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.probe_timeout = timeout;
        self
    }

    /// Sets the time between probes when the breaker
    /// [probes actively](crate::Breaker::probe_actively) (default 5 s).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.config.probe_interval = interval;
        self
    }

    /// Opens the breaker at once on a failure that announces a retry-after
    /// (a 429 or 503 with `Retry-After`, gRPC `grpc-retry-pushback-ms`),
    /// whatever the trip policy says: a provider that asks to come back in
    /// a minute is not worth the rest of the threshold. Off by default.
    pub fn trip_on_pushback(mut self, on: bool) -> Self {
        self.config.trip_on_pushback = on;
        self
    }

    /// Checks every value and returns the config.
    pub fn build(self) -> Result<Config, ConfigError> {
        let c = self.config;
        if c.cooldown.is_zero() {
            return Err(ConfigError::new("cooldown", "must be longer than zero"));
        }
        if c.max_open > MAX_OPEN_LIMIT {
            return Err(ConfigError::new("max_open", "must be at most 365 days"));
        }
        if c.cooldown > c.max_open {
            return Err(ConfigError::new(
                "cooldown",
                format!("must be at most max_open ({:?})", c.max_open),
            ));
        }
        if c.min_open > c.max_open {
            return Err(ConfigError::new(
                "min_open",
                format!("must be at most max_open ({:?})", c.max_open),
            ));
        }
        if !(c.backoff.is_finite() && (1.0..=1000.0).contains(&c.backoff)) {
            return Err(ConfigError::new(
                "backoff",
                format!("must be between 1.0 and 1000.0, got {}", c.backoff),
            ));
        }
        if !(c.jitter >= 0.0 && c.jitter < 1.0) {
            return Err(ConfigError::new(
                "jitter",
                format!("must be in [0, 1), got {}", c.jitter),
            ));
        }
        if c.probes == 0 || c.probes > MAX_COUNT {
            return Err(ConfigError::new(
                "probes",
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        if c.successes_to_close == 0 || c.successes_to_close > MAX_COUNT {
            return Err(ConfigError::new(
                "successes_to_close",
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        if c.probe_interval.is_zero() || c.probe_interval > MAX_OPEN_LIMIT {
            return Err(ConfigError::new(
                "probe_interval",
                "must be longer than zero and at most 365 days",
            ));
        }
        if c.probe_timeout == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "probe_timeout",
                "must be longer than zero",
            ));
        }
        c.trip.validate("trip")?;
        Ok(c)
    }
}
