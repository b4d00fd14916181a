//! Configs as written: mirrors of [`Config`] and the trip policies with
//! every field optional, turned into validated values by the builders.
//!
//! Every leaf is a [`Scalar`], checked only when the config is built, where
//! its path is known: a wrong type, a bad duration and an out-of-range value
//! all come back as a [`ConfigError`] naming the field, the way the
//! builders' own checks do.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

use ::serde::de::{self, Deserializer, MapAccess, Visitor};
use ::serde::Deserialize;

use super::scalar::{present, required, Scalar};
use crate::classify::FailureClass;
use crate::error::ConfigError;
use crate::policy::{
    Adaptive, ConsecutiveFailures, CountWindow, FailuresWithin, PerClass, SlowCalls, TimeWindow,
    TripPolicy,
};
use crate::{Config, ConfigBuilder, LatencyTo};

/// `prefix.field`, or `field` at the top.
pub(super) fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    }
}

/// A builder's error, with its path as the file spells it and under
/// `prefix`.
pub(super) fn in_file(prefix: &str, err: ConfigError) -> ConfigError {
    // The builders name a slow-call window `window.calls` or
    // `window.length`; a file writes `over_calls` or `over_time.length`.
    let field = err
        .field()
        .replace("slow_calls.window.calls", "slow_calls.over_calls")
        .replace("slow_calls.window.", "slow_calls.over_time.");
    ConfigError::new(join(prefix, &field), err.problem())
}

/// A [`Config`] as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default, deserialize_with = "present")]
    name: Option<Scalar>,
    #[serde(default)]
    trip: Option<RawTrip>,
    #[serde(default, deserialize_with = "present")]
    cooldown: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    min_open: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    max_open: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    backoff: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    jitter: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    probes: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    successes_to_close: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    probe_timeout: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    probe_interval: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    trip_on_pushback: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    first_frame_timeout: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    frame_idle_timeout: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    cancelled_failure_after: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    latency_to: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    max_quota_hold: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    quota_probe_interval: Option<Scalar>,
}

impl RawConfig {
    /// The builder with every field written here set, from the defaults.
    fn builder(&self, prefix: &str) -> Result<ConfigBuilder, ConfigError> {
        let at = |field| join(prefix, field);
        let mut b = Config::builder();
        if let Some(v) = &self.name {
            b = b.name(v.text(&at("name"))?);
        }
        if let Some(trip) = &self.trip {
            b = b.trip(trip.policy(&at("trip"))?);
        }
        if let Some(v) = &self.cooldown {
            b = b.cooldown(v.duration(&at("cooldown"))?);
        }
        if let Some(v) = &self.min_open {
            b = b.min_open(v.duration(&at("min_open"))?);
        }
        if let Some(v) = &self.max_open {
            b = b.max_open(v.duration(&at("max_open"))?);
        }
        if let Some(v) = &self.backoff {
            b = b.backoff(v.number(&at("backoff"))?);
        }
        if let Some(v) = &self.jitter {
            b = b.jitter(v.number(&at("jitter"))?);
        }
        if let Some(v) = &self.probes {
            b = b.probes(v.count(&at("probes"))?);
        }
        if let Some(v) = &self.successes_to_close {
            b = b.successes_to_close(v.count(&at("successes_to_close"))?);
        }
        if let Some(v) = &self.probe_timeout {
            b = b.probe_timeout(v.optional_duration(&at("probe_timeout"))?);
        }
        if let Some(v) = &self.probe_interval {
            b = b.probe_interval(v.duration(&at("probe_interval"))?);
        }
        if let Some(v) = &self.trip_on_pushback {
            b = b.trip_on_pushback(v.boolean(&at("trip_on_pushback"))?);
        }
        if let Some(v) = &self.first_frame_timeout {
            b = b.first_frame_timeout(v.optional_duration(&at("first_frame_timeout"))?);
        }
        if let Some(v) = &self.max_quota_hold {
            b = b.max_quota_hold(v.optional_duration(&at("max_quota_hold"))?);
        }
        if let Some(v) = &self.quota_probe_interval {
            b = b.quota_probe_interval(v.duration(&at("quota_probe_interval"))?);
        }
        if let Some(v) = &self.frame_idle_timeout {
            b = b.frame_idle_timeout(v.optional_duration(&at("frame_idle_timeout"))?);
        }
        if let Some(v) = &self.cancelled_failure_after {
            b = b.cancelled_failure_after(v.optional_duration(&at("cancelled_failure_after"))?);
        }
        if let Some(v) = &self.latency_to {
            let path = at("latency_to");
            let text = v.text(&path)?;
            let to = [LatencyTo::Head, LatencyTo::FirstFrame, LatencyTo::End]
                .into_iter()
                .find(|to| to.name() == text)
                .ok_or_else(|| {
                    ConfigError::new(path, "must be one of `head`, `first_frame`, `end`")
                })?;
            b = b.latency_to(to);
        }
        Ok(b)
    }

    /// The validated config; errors name fields under `prefix`.
    pub(super) fn build(&self, prefix: &str) -> Result<Config, ConfigError> {
        self.build_named(prefix, None)
    }

    /// As [`build`](Self::build), named `name` whatever the file says.
    pub(super) fn build_named(
        &self,
        prefix: &str,
        name: Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut builder = self.builder(prefix)?;
        if let Some(name) = name {
            builder = builder.name(name);
        }
        builder.build().map_err(|err| in_file(prefix, err))
    }

    /// These settings over `base`'s: a field written here wins; the trip
    /// policy is replaced whole, never merged.
    pub(super) fn over(&self, base: &RawConfig) -> RawConfig {
        let pick = |mine: &Option<Scalar>, theirs: &Option<Scalar>| mine.clone().or(theirs.clone());
        RawConfig {
            name: pick(&self.name, &base.name),
            trip: self.trip.clone().or(base.trip.clone()),
            cooldown: pick(&self.cooldown, &base.cooldown),
            min_open: pick(&self.min_open, &base.min_open),
            max_open: pick(&self.max_open, &base.max_open),
            backoff: pick(&self.backoff, &base.backoff),
            jitter: pick(&self.jitter, &base.jitter),
            probes: pick(&self.probes, &base.probes),
            successes_to_close: pick(&self.successes_to_close, &base.successes_to_close),
            probe_timeout: pick(&self.probe_timeout, &base.probe_timeout),
            probe_interval: pick(&self.probe_interval, &base.probe_interval),
            trip_on_pushback: pick(&self.trip_on_pushback, &base.trip_on_pushback),
            first_frame_timeout: pick(&self.first_frame_timeout, &base.first_frame_timeout),
            frame_idle_timeout: pick(&self.frame_idle_timeout, &base.frame_idle_timeout),
            cancelled_failure_after: pick(
                &self.cancelled_failure_after,
                &base.cancelled_failure_after,
            ),
            latency_to: pick(&self.latency_to, &base.latency_to),
            max_quota_hold: pick(&self.max_quota_hold, &base.max_quota_hold),
            quota_probe_interval: pick(&self.quota_probe_interval, &base.quota_probe_interval),
        }
    }
}

/// A [`TripPolicy`] as written: a table with one key naming the policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawTrip {
    ConsecutiveFailures(RawConsecutive),
    CountWindow(RawCountWindow),
    TimeWindow(RawTimeWindow),
    SlowCalls(RawSlowCalls),
    Adaptive(RawAdaptive),
    AnyOf(Vec<RawTrip>),
    PerClass(RawPerClass),
    FailuresWithin(RawFailuresWithin),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFailuresWithin {
    #[serde(default, deserialize_with = "present")]
    failures: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    period: Option<Scalar>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPerClass {
    rest: Box<RawTrip>,
    #[serde(default)]
    classes: std::collections::BTreeMap<String, RawTrip>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsecutive {
    #[serde(default, deserialize_with = "present")]
    threshold: Option<Scalar>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCountWindow {
    #[serde(default, deserialize_with = "present")]
    failures: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    window: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    stale_after: Option<Scalar>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeWindow {
    #[serde(default, deserialize_with = "present")]
    window: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    buckets: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    min_calls: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    failure_rate: Option<Scalar>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlowCalls {
    #[serde(default, deserialize_with = "present")]
    slower_than: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    rate: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    over_calls: Option<Scalar>,
    #[serde(default)]
    over_time: Option<RawOverTime>,
    #[serde(default, deserialize_with = "present")]
    min_calls: Option<Scalar>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdaptive {
    #[serde(default, deserialize_with = "present")]
    false_trips_per_million: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    min_degradation: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    warm_up: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    ceiling: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    baseline_horizon: Option<Scalar>,
    #[serde(default)]
    fallback: Option<Box<RawTrip>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverTime {
    #[serde(default, deserialize_with = "present")]
    length: Option<Scalar>,
    #[serde(default, deserialize_with = "present")]
    buckets: Option<Scalar>,
}

impl RawTrip {
    /// The policy, its values converted but not yet validated (the config
    /// builder validates it, under the same paths).
    pub(super) fn policy(&self, path: &str) -> Result<TripPolicy, ConfigError> {
        Ok(match self {
            RawTrip::ConsecutiveFailures(raw) => {
                let at = |field| format!("{path}.consecutive_failures.{field}");
                let threshold = required(&raw.threshold, &at("threshold"))?;
                ConsecutiveFailures::new(threshold.count(&at("threshold"))?).into()
            }
            RawTrip::CountWindow(raw) => {
                let at = |field| format!("{path}.count_window.{field}");
                let failures = required(&raw.failures, &at("failures"))?.count(&at("failures"))?;
                let window = required(&raw.window, &at("window"))?.count(&at("window"))?;
                let mut policy = CountWindow::new(failures, window);
                if let Some(age) = &raw.stale_after {
                    policy = policy.stale_after(age.duration(&at("stale_after"))?);
                }
                policy.into()
            }
            RawTrip::TimeWindow(raw) => {
                let at = |field| format!("{path}.time_window.{field}");
                let window = required(&raw.window, &at("window"))?.duration(&at("window"))?;
                let mut policy = TimeWindow::new(window);
                if let Some(v) = &raw.buckets {
                    policy = policy.buckets(v.count(&at("buckets"))?);
                }
                if let Some(v) = &raw.min_calls {
                    policy = policy.min_calls(v.count(&at("min_calls"))?);
                }
                if let Some(v) = &raw.failure_rate {
                    policy = policy.failure_rate(v.number(&at("failure_rate"))?);
                }
                policy.into()
            }
            RawTrip::SlowCalls(raw) => {
                let at = |field| format!("{path}.slow_calls.{field}");
                let slower_than =
                    required(&raw.slower_than, &at("slower_than"))?.duration(&at("slower_than"))?;
                let mut policy = SlowCalls::new(slower_than);
                if let Some(v) = &raw.rate {
                    policy = policy.rate(v.number(&at("rate"))?);
                }
                match (&raw.over_calls, &raw.over_time) {
                    (Some(_), Some(_)) => {
                        return Err(ConfigError::new(
                            at("over_time"),
                            "conflicts with `over_calls`: give one window",
                        ))
                    }
                    (Some(calls), None) => {
                        policy = policy.over_calls(calls.count(&at("over_calls"))?);
                    }
                    (None, Some(time)) => {
                        let at = |field| format!("{path}.slow_calls.over_time.{field}");
                        let length =
                            required(&time.length, &at("length"))?.duration(&at("length"))?;
                        let buckets = match &time.buckets {
                            Some(v) => v.count(&at("buckets"))?,
                            None => DEFAULT_BUCKETS,
                        };
                        policy = policy.over_time(length, buckets);
                    }
                    (None, None) => {}
                }
                if let Some(v) = &raw.min_calls {
                    policy = policy.min_calls(v.count(&at("min_calls"))?);
                }
                policy.into()
            }
            RawTrip::Adaptive(raw) => {
                let at = |field| format!("{path}.adaptive.{field}");
                let mut policy = Adaptive::new();
                if let Some(v) = &raw.false_trips_per_million {
                    policy =
                        policy.false_trips_per_million(v.number(&at("false_trips_per_million"))?);
                }
                if let Some(v) = &raw.min_degradation {
                    policy = policy.min_degradation(v.number(&at("min_degradation"))?);
                }
                if let Some(v) = &raw.warm_up {
                    policy = policy.warm_up(v.count(&at("warm_up"))?);
                }
                if let Some(v) = &raw.ceiling {
                    policy = policy.ceiling(v.number(&at("ceiling"))?);
                }
                if let Some(v) = &raw.baseline_horizon {
                    policy = policy.baseline_horizon(v.count(&at("baseline_horizon"))?);
                }
                if let Some(fallback) = &raw.fallback {
                    policy = policy.fallback(fallback.policy(&at("fallback"))?);
                }
                policy.into()
            }
            RawTrip::PerClass(raw) => {
                let at = |field: &str| format!("{path}.per_class.{field}");
                let mut policy = PerClass::new(raw.rest.policy(&at("rest"))?);
                for (name, member) in &raw.classes {
                    let class_path = at(&format!("classes.{name}"));
                    let class = FailureClass::from_name(name).ok_or_else(|| {
                        ConfigError::new(
                            class_path.clone(),
                            "is no failure class (rate_limited, overloaded, timeout, server_error, stream, other)",
                        )
                    })?;
                    policy = policy.class(class, member.policy(&class_path)?);
                }
                policy.into()
            }
            RawTrip::FailuresWithin(raw) => {
                let at = |field| format!("{path}.failures_within.{field}");
                let failures = required(&raw.failures, &at("failures"))?.count(&at("failures"))?;
                let period = required(&raw.period, &at("period"))?.duration(&at("period"))?;
                FailuresWithin::new(failures, period).into()
            }
            RawTrip::AnyOf(list) => TripPolicy::any_of(
                list.iter()
                    .enumerate()
                    .map(|(i, raw)| raw.policy(&format!("{path}.any_of[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        })
    }
}

/// Buckets of a slow-call time window when the file gives none, as for a
/// [`TimeWindow`].
const DEFAULT_BUCKETS: u32 = 10;

/// A registry's configs as written.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "K: Deserialize<'de> + Hash + Eq + fmt::Display")
)]
pub(super) struct RawRegistry<K> {
    #[serde(default)]
    pub(super) default: RawConfig,
    #[serde(default)]
    pub(super) keys: KeyList<K>,
    #[serde(default, deserialize_with = "present")]
    max_keys: Option<Scalar>,
}

impl<K> RawRegistry<K> {
    pub(super) fn max_keys(&self) -> Result<Option<usize>, ConfigError> {
        let Some(value) = &self.max_keys else {
            return Ok(None);
        };
        match value.size("max_keys")? {
            0 => Err(ConfigError::new("max_keys", "must be at least 1")),
            n => Ok(Some(n)),
        }
    }
}

/// Per-key configs in the order written; a key given twice is an error.
pub(super) struct KeyList<K>(pub(super) Vec<(K, RawConfig)>);

impl<K> Default for KeyList<K> {
    fn default() -> Self {
        KeyList(Vec::new())
    }
}

impl<'de, K> Deserialize<'de> for KeyList<K>
where
    K: Deserialize<'de> + Hash + Eq + fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(KeyListVisitor(PhantomData))
    }
}

struct KeyListVisitor<K>(PhantomData<K>);

impl<'de, K> Visitor<'de> for KeyListVisitor<K>
where
    K: Deserialize<'de> + Hash + Eq + fmt::Display,
{
    type Value = KeyList<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of configs by key")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyList<K>, A::Error> {
        let mut keys = Vec::new();
        while let Some((key, config)) = map.next_entry::<K, RawConfig>()? {
            keys.push((key, config));
        }
        let mut seen = HashSet::with_capacity(keys.len());
        for (key, _) in &keys {
            if !seen.insert(key) {
                return Err(de::Error::custom(format!(
                    "invalid circuit breaker config: `keys` names {:?} twice",
                    key.to_string()
                )));
            }
        }
        Ok(KeyList(keys))
    }
}
