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
/// | `max_quota_hold` | none | a retry-after hint beyond `max_open` (a quota reset an hour away) holds the breaker open up to this long |
/// | `quota_probe_interval` | 15 min | during such a hold, the time between probes for an early reset |
/// | `min_open` | 0 | floor under every open period |
/// | `jitter` | 0.0 | open period lengthened by up to this share, at random (never shortened) |
/// | `probes` | 1 | probe calls in flight at once while half-open |
/// | `successes_to_close` | 1 | probe successes that close the breaker |
/// | `probe_timeout` | 60 s | a probe running longer counts as a failure |
/// | `trip_on_pushback` | off | a failure that announces a retry-after opens the breaker at once |
/// | `probe_interval` | 5 s | with [active probing](crate::Breaker::probe_actively): the time between probes |
/// | `first_frame_timeout` | none | a streamed body whose first data frame takes longer (after its head) ends with [`StreamTimeout`](crate::body::StreamTimeout) and counts as a failure |
/// | `frame_idle_timeout` | none | a streamed body silent longer between data frames does the same |
/// | `cancelled_failure_after` | never | a call dropped by its caller after waiting this long counts as a failure, not a cancellation |
/// | `latency_to` | [`LatencyTo::FirstFrame`] | what a timed call's latency (for slow-call policies) runs to: its head, its first data frame, or its end |
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
    /// Everything but the name, shared by every breaker made from this
    /// config (a registry's keys share their default's): a clone costs a
    /// reference count.
    settings: Arc<Settings>,
}

/// A config's settings. Durations are kept in nanoseconds (up to 584
/// years), half the size of a `Duration`: a breaker made alone keeps its
/// own.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settings {
    trip: TripPolicy,
    cooldown_ns: u64,
    min_open_ns: u64,
    max_open_ns: u64,
    backoff: f64,
    jitter: f64,
    probes: u32,
    successes_to_close: u32,
    /// `u64::MAX`: none.
    probe_timeout_ns: u64,
    probe_interval_ns: u64,
    trip_on_pushback: bool,
    /// `u64::MAX`: none.
    first_frame_timeout_ns: u64,
    /// `u64::MAX`: none.
    frame_idle_timeout_ns: u64,
    /// `u64::MAX`: never.
    cancelled_failure_after_ns: u64,
    latency_to: LatencyTo,
    /// `u64::MAX`: none.
    max_quota_hold_ns: u64,
    quota_probe_interval_ns: u64,
}

/// What a call's latency runs to, for the policies that time calls
/// ([`SlowCalls`](crate::policy::SlowCalls), an adaptive policy's
/// slow-call fallback): set by [`ConfigBuilder::latency_to`].
///
/// A call whose response is judged at once (no streamed body) ends at its
/// head, whichever is chosen. For a streamed body (server-sent events, a
/// gRPC stream), the default is the first data frame: the time to the first
/// token is what a model provider's caller waits through and what a
/// struggling provider stretches, while the time to the end grows with the
/// length of the answer, healthy or not.
///
/// ```
/// use tower_circuit_breaker::{Config, LatencyTo};
///
/// let config = Config::builder().latency_to(LatencyTo::End).build()?;
/// assert_eq!(config.latency_to(), LatencyTo::End);
/// assert_eq!(Config::default().latency_to(), LatencyTo::FirstFrame);
/// # Ok::<_, tower_circuit_breaker::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LatencyTo {
    /// To the response's head: how long the upstream took to answer at all.
    Head,
    /// To a streamed body's first data frame (its head, for a response
    /// judged at once; its end, for a body that ends with no data).
    #[default]
    FirstFrame,
    /// To the end of a streamed body: how long the whole answer took.
    End,
}

impl LatencyTo {
    /// Its name in configs: `head`, `first_frame`, `end`.
    pub const fn name(self) -> &'static str {
        match self {
            LatencyTo::Head => "head",
            LatencyTo::FirstFrame => "first_frame",
            LatencyTo::End => "end",
        }
    }
}

impl Settings {
    /// The trip policy.
    pub(crate) fn trip(&self) -> &TripPolicy {
        &self.trip
    }
}

/// Nanoseconds, saturating a little below `u64::MAX` (which means "none").
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).map_or(u64::MAX - 1, |ns| ns.min(u64::MAX - 1))
}

impl Config {
    /// Starts from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            name: Arc::from("default"),
            settings: Settings::default(),
        }
    }

    /// Turns this config back into a builder, to change a few settings.
    pub fn to_builder(&self) -> ConfigBuilder {
        ConfigBuilder {
            name: Arc::clone(&self.name),
            settings: Settings::clone(&self.settings),
        }
    }

    /// A config of `name` with `settings`.
    pub(crate) fn from_parts(name: Arc<str>, settings: Arc<Settings>) -> Self {
        Config { name, settings }
    }

    /// Everything but the name, as breakers share it.
    pub(crate) fn settings(&self) -> &Arc<Settings> {
        &self.settings
    }

    /// The breaker's name, used in errors, events and logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The trip policy.
    pub fn trip(&self) -> &TripPolicy {
        &self.settings.trip
    }

    /// The first open period.
    pub fn cooldown(&self) -> Duration {
        Duration::from_nanos(self.settings.cooldown_ns)
    }

    /// The floor under every open period.
    pub fn min_open(&self) -> Duration {
        Duration::from_nanos(self.settings.min_open_ns)
    }

    /// The cap on every open period and on retry-after hints.
    pub fn max_open(&self) -> Duration {
        Duration::from_nanos(self.settings.max_open_ns)
    }

    /// The factor the open period grows by on each failed probe.
    pub fn backoff(&self) -> f64 {
        self.settings.backoff
    }

    /// The largest share by which jitter lengthens an open period.
    pub fn jitter(&self) -> f64 {
        self.settings.jitter
    }

    /// Probe calls allowed in flight at once while half-open.
    pub fn probes(&self) -> u32 {
        self.settings.probes
    }

    /// Probe successes needed to close.
    pub fn successes_to_close(&self) -> u32 {
        self.settings.successes_to_close
    }

    /// How long a probe may run before it counts as a failure.
    pub fn probe_timeout(&self) -> Option<Duration> {
        (self.settings.probe_timeout_ns != u64::MAX)
            .then(|| Duration::from_nanos(self.settings.probe_timeout_ns))
    }

    /// With active probing, the time between probes.
    pub fn probe_interval(&self) -> Duration {
        Duration::from_nanos(self.settings.probe_interval_ns)
    }

    /// Whether a failure that announces a retry-after opens the breaker at
    /// once.
    pub fn trip_on_pushback(&self) -> bool {
        self.settings.trip_on_pushback
    }

    /// How long a streamed body may take to its first data frame, from its
    /// head.
    pub fn first_frame_timeout(&self) -> Option<Duration> {
        (self.settings.first_frame_timeout_ns != u64::MAX)
            .then(|| Duration::from_nanos(self.settings.first_frame_timeout_ns))
    }

    /// How long a call may wait before its caller's giving up on it counts
    /// as a failure.
    pub fn cancelled_failure_after(&self) -> Option<Duration> {
        (self.settings.cancelled_failure_after_ns != u64::MAX)
            .then(|| Duration::from_nanos(self.settings.cancelled_failure_after_ns))
    }

    /// What a timed call's latency runs to.
    pub fn latency_to(&self) -> LatencyTo {
        self.settings.latency_to
    }

    /// How long a retry-after hint beyond `max_open` may hold the breaker
    /// open; `None`: such hints are cut to `max_open`.
    pub fn max_quota_hold(&self) -> Option<Duration> {
        (self.settings.max_quota_hold_ns != u64::MAX)
            .then(|| Duration::from_nanos(self.settings.max_quota_hold_ns))
    }

    /// During a quota hold, the time between probes for an early reset.
    pub fn quota_probe_interval(&self) -> Duration {
        Duration::from_nanos(self.settings.quota_probe_interval_ns)
    }

    /// The longest one open period may last: `max_open`, or during a quota
    /// hold the time between its probes when that is longer.
    pub(crate) fn longest_open(&self) -> Duration {
        match self.max_quota_hold() {
            Some(_) => self.max_open().max(self.quota_probe_interval()),
            None => self.max_open(),
        }
    }

    /// How long a streamed body may stay silent between data frames.
    pub fn frame_idle_timeout(&self) -> Option<Duration> {
        (self.settings.frame_idle_timeout_ns != u64::MAX)
            .then(|| Duration::from_nanos(self.settings.frame_idle_timeout_ns))
    }

    /// A preset for a model router in front of LLM providers: three
    /// failures in a row open the breaker, it stays open at least 10 s, and
    /// two probe successes in a row close it. It also sets the
    /// [`probe_interval`](ConfigBuilder::probe_interval) to 5 s, which only
    /// active probing uses: turn that on with
    /// [`Breaker::probe_actively`](crate::Breaker::probe_actively), and a
    /// probe goes every 5 s while the breaker is open; without it, user
    /// requests probe after each open period, as with any config. Adjust
    /// it like any builder.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::Config;
    ///
    /// let config = Config::model_router().name("openai").build()?;
    /// assert_eq!(config.min_open(), Duration::from_secs(10));
    /// assert_eq!(config.successes_to_close(), 2);
    /// assert_eq!(config.probe_interval(), Duration::from_secs(5)); // for probe_actively
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
        let (max_open, min_open) = (self.max_open(), self.min_open());
        let grown = self.cooldown().as_secs_f64()
            * self.backoff().powi(attempt.min(i32::MAX as u32) as i32);
        let capped = if grown.is_finite() {
            Duration::from_secs_f64(grown.min(max_open.as_secs_f64()))
        } else {
            max_open
        };
        capped.clamp(min_open, max_open)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: Arc::from("default"),
            settings: Arc::new(Settings::default()),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            trip: TripPolicy::default(),
            cooldown_ns: nanos(Duration::from_secs(30)),
            min_open_ns: 0,
            max_open_ns: nanos(Duration::from_secs(300)),
            backoff: 2.0,
            jitter: 0.0,
            probes: 1,
            successes_to_close: 1,
            probe_timeout_ns: nanos(Duration::from_secs(60)),
            probe_interval_ns: nanos(Duration::from_secs(5)),
            trip_on_pushback: false,
            first_frame_timeout_ns: u64::MAX,
            frame_idle_timeout_ns: u64::MAX,
            cancelled_failure_after_ns: u64::MAX,
            latency_to: LatencyTo::FirstFrame,
            max_quota_hold_ns: u64::MAX,
            quota_probe_interval_ns: nanos(Duration::from_secs(15 * 60)),
        }
    }
}

/// Builds a [`Config`]; [`build`](ConfigBuilder::build) checks every value
/// and returns a [`ConfigError`] naming the first bad field.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    name: Arc<str>,
    settings: Settings,
}

impl ConfigBuilder {
    /// Names the breaker (default `"default"`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the trip policy (default: 5 consecutive failures).
    pub fn trip(mut self, policy: impl Into<TripPolicy>) -> Self {
        self.settings.trip = policy.into();
        self
    }

    /// Sets the first open period (default 30 s).
    pub fn cooldown(mut self, period: Duration) -> Self {
        self.settings.cooldown_ns = nanos(period);
        self
    }

    /// Sets the floor under every open period (default 0).
    pub fn min_open(mut self, period: Duration) -> Self {
        self.settings.min_open_ns = nanos(period);
        self
    }

    /// Sets the cap on every open period and on retry-after hints
    /// (default 5 min).
    pub fn max_open(mut self, period: Duration) -> Self {
        self.settings.max_open_ns = nanos(period);
        self
    }

    /// Sets the growth factor applied on each failed probe (default 2.0;
    /// 1.0 keeps the period fixed).
    pub fn backoff(mut self, factor: f64) -> Self {
        self.settings.backoff = factor;
        self
    }

    /// Lengthens each open period by a random share up to `share`, in
    /// `[0, 1)` (default 0), so that many clients do not probe in step.
    /// Jitter never shortens a period: `cooldown` stays the least time
    /// before the first probe, and `max_open` still caps the result.
    pub fn jitter(mut self, share: f64) -> Self {
        self.settings.jitter = share;
        self
    }

    /// Sets how many probes may be in flight at once while half-open
    /// (default 1; 0 is an error).
    pub fn probes(mut self, probes: u32) -> Self {
        self.settings.probes = probes;
        self
    }

    /// Sets how many probe successes close the breaker (default 1).
    pub fn successes_to_close(mut self, successes: u32) -> Self {
        self.settings.successes_to_close = successes;
        self
    }

    /// Sets how long a probe may run before it counts as a failure
    /// (default 60 s); `None` lets probes run as long as they like.
    pub fn probe_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.settings.probe_timeout_ns = timeout.map_or(u64::MAX, nanos);
        self
    }

    /// Sets the time between probes when the breaker
    /// [probes actively](crate::Breaker::probe_actively) (default 5 s).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.settings.probe_interval_ns = nanos(interval);
        self
    }

    /// Opens the breaker at once on a failure that announces a retry-after
    /// (a 429 or 503 with `Retry-After`, gRPC `grpc-retry-pushback-ms`),
    /// whatever the trip policy says: a provider that asks to come back in
    /// a minute is not worth the rest of the threshold. Off by default.
    pub fn trip_on_pushback(mut self, on: bool) -> Self {
        self.settings.trip_on_pushback = on;
        self
    }

    /// Sets how long a streamed body may take to its first data frame,
    /// counted from its head (default: no limit). A provider that answers
    /// `200` at once and then thinks for a minute has answered nothing: past
    /// the limit, the body ends for its reader with a
    /// [`StreamTimeout`](crate::body::StreamTimeout) error and the call
    /// counts as a failure (a probe, as a failed probe). `tower::timeout`
    /// inside the breaker bounds the head; this bounds the first token.
    ///
    /// It applies to bodies the breaker judges at their end (feature
    /// `http-body`, with a classifier such as
    /// [`StreamingHttp`](crate::classify::StreamingHttp) that defers to
    /// it), while their call is still to be recorded.
    pub fn first_frame_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.settings.first_frame_timeout_ns = timeout.map_or(u64::MAX, nanos);
        self
    }

    /// Sets how long a streamed body may stay silent between two data
    /// frames (default: no limit): a stream that freezes after its first
    /// chunk ends for its reader with a
    /// [`StreamTimeout`](crate::body::StreamTimeout) error and counts as a
    /// failure, as [`first_frame_timeout`](Self::first_frame_timeout) does.
    /// Until the first frame, `first_frame_timeout` applies, or, without
    /// one, this limit.
    pub fn frame_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.settings.frame_idle_timeout_ns = timeout.map_or(u64::MAX, nanos);
        self
    }

    /// Counts a call its caller dropped after waiting at least `wait` as a
    /// failure, rather than as a cancellation that counts neither way
    /// (default: never). A timeout outside the breaker, or a client that
    /// hangs up on a provider holding its request, is then seen: a call
    /// that waited thirty seconds was a hang, whoever ended it. A probe so
    /// dropped is a failed probe; a streamed body dropped before its end
    /// after `wait` from the call, likewise. Calls dropped sooner still
    /// count as cancelled.
    ///
    /// The breaker then reads the clock at every call, as a slow-call
    /// policy does. Calls made through [`try_acquire`](crate::Breaker::try_acquire)'s
    /// permits keep counting a drop as a cancellation.
    pub fn cancelled_failure_after(mut self, wait: Option<Duration>) -> Self {
        self.settings.cancelled_failure_after_ns = wait.map_or(u64::MAX, nanos);
        self
    }

    /// Lets a retry-after hint longer than `max_open` hold the breaker open
    /// up to `hold` (default: `None`, such hints are cut to `max_open`).
    ///
    /// `max_open` caps the open periods of congestion: an upstream that
    /// sheds load asks for seconds or minutes. An exhausted quota is not
    /// congestion: a provider that says its requests reset in an hour (a
    /// `Retry-After: 3600`, OpenAI's `x-ratelimit-reset-requests: 1h`,
    /// Anthropic's reset timestamp, Gemini's `retryDelay`) will refuse every
    /// call until then. With a hold, the breaker stays open until the hint's
    /// end (at most `hold` from the failure that announced it), and lets
    /// one probe through every
    /// [`quota_probe_interval`](Self::quota_probe_interval) meanwhile to
    /// catch an early reset: a probe that succeeds closes it as any probe
    /// does; a failed one (or one announcing a new reset) holds it on. Make
    /// that probe cheap with a probe predicate or active probing.
    ///
    /// The hold lands on every breaker that records the failure and has a
    /// hold configured: in a [registry](crate::registry) with parents, give
    /// it to the parents' config for a quota that belongs to a credential
    /// (a provider's account), to the models' for a per-model limit. The
    /// hold ends when the breaker closes; an operator's
    /// [`reset`](crate::Breaker::reset) ends it too.
    pub fn max_quota_hold(mut self, hold: Option<Duration>) -> Self {
        self.settings.max_quota_hold_ns = hold.map_or(u64::MAX, nanos);
        self
    }

    /// Sets the time between probes during a
    /// [quota hold](Self::max_quota_hold) (default 15 min): each open
    /// period of the hold lasts this long, or to the hint's end if that
    /// comes first, and never less than the period the breaker would
    /// have had without the hold.
    pub fn quota_probe_interval(mut self, interval: Duration) -> Self {
        self.settings.quota_probe_interval_ns = nanos(interval);
        self
    }

    /// Sets what a timed call's latency runs to, for slow-call policies
    /// (default: [`LatencyTo::FirstFrame`], the time to the first token;
    /// see [`LatencyTo`] for why).
    pub fn latency_to(mut self, to: LatencyTo) -> Self {
        self.settings.latency_to = to;
        self
    }

    /// Checks every value and returns the config.
    pub fn build(self) -> Result<Config, ConfigError> {
        let config = Config {
            name: self.name,
            settings: Arc::new(self.settings),
        };
        config.validate()?;
        Ok(config)
    }
}

impl Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        let (cooldown, min_open, max_open) = (c.cooldown(), c.min_open(), c.max_open());
        if cooldown.is_zero() {
            return Err(ConfigError::new("cooldown", "must be longer than zero"));
        }
        if max_open > MAX_OPEN_LIMIT {
            return Err(ConfigError::new("max_open", "must be at most 365 days"));
        }
        if cooldown > max_open {
            return Err(ConfigError::new(
                "cooldown",
                format!("must be at most max_open ({max_open:?})"),
            ));
        }
        if min_open > max_open {
            return Err(ConfigError::new(
                "min_open",
                format!("must be at most max_open ({max_open:?})"),
            ));
        }
        let backoff = c.backoff();
        if !(backoff.is_finite() && (1.0..=1000.0).contains(&backoff)) {
            return Err(ConfigError::new(
                "backoff",
                format!("must be between 1.0 and 1000.0, got {backoff}"),
            ));
        }
        let jitter = c.jitter();
        if !(0.0..1.0).contains(&jitter) {
            return Err(ConfigError::new(
                "jitter",
                format!("must be in [0, 1), got {jitter}"),
            ));
        }
        if c.probes() == 0 || c.probes() > MAX_COUNT {
            return Err(ConfigError::new(
                "probes",
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        if c.successes_to_close() == 0 || c.successes_to_close() > MAX_COUNT {
            return Err(ConfigError::new(
                "successes_to_close",
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        let probe_interval = c.probe_interval();
        if probe_interval.is_zero() || probe_interval > MAX_OPEN_LIMIT {
            return Err(ConfigError::new(
                "probe_interval",
                "must be longer than zero and at most 365 days",
            ));
        }
        if let Some(hold) = c.max_quota_hold() {
            if hold <= max_open || hold > MAX_OPEN_LIMIT {
                return Err(ConfigError::new(
                    "max_quota_hold",
                    format!("must be longer than max_open ({max_open:?}) and at most 365 days"),
                ));
            }
        }
        let quota_probe_interval = c.quota_probe_interval();
        if quota_probe_interval.is_zero() || quota_probe_interval > MAX_OPEN_LIMIT {
            return Err(ConfigError::new(
                "quota_probe_interval",
                "must be longer than zero and at most 365 days",
            ));
        }
        for (field, limit) in [
            ("first_frame_timeout", c.first_frame_timeout()),
            ("frame_idle_timeout", c.frame_idle_timeout()),
            ("cancelled_failure_after", c.cancelled_failure_after()),
        ] {
            if limit == Some(Duration::ZERO) {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
        }
        if c.probe_timeout() == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "probe_timeout",
                "must be longer than zero",
            ));
        }
        c.trip().validate("trip")
    }
}
