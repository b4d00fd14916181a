//! Configs as written: a mirror of [`Config`] with every field optional,
//! and a trip policy as a table each policy reads its own settings from
//! (through [`Written`]), turned into validated values by the builders.
//!
//! Every leaf is a [`Scalar`], checked only when the config is built, where
//! its path is known: a wrong type, a bad duration and an out-of-range value
//! all come back as a [`ConfigError`] naming the field, the way the
//! builders' own checks do.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use ::serde::de::{self, Deserializer, MapAccess, Visitor};
use ::serde::Deserialize;

use super::scalar::{present, Scalar};
use crate::error::ConfigError;
use crate::policy::{TripPolicy, Written, ANY_OF, IN_FILES};
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
    trip: Option<Scalar>,
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
            b = b.trip(policy_at(trip, &at("trip"))?);
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

/// The [`TripPolicy`] `value` writes at `path`: a table with one key
/// naming the policy, whose value is the policy's table of settings (a
/// list of policies for `any_of`). Read whole when the file is parsed, and
/// turned into a policy when the config is built, where its path is known;
/// each policy reads its own settings ([`FromFile`](crate::policy::FromFile),
/// through [`Table`]). Its values are converted but not yet validated (the
/// config builder validates it, under the same paths).
pub(super) fn policy_at(value: &Scalar, path: &str) -> Result<TripPolicy, ConfigError> {
    let (key, settings) = match value {
        Scalar::Table(entries) if entries.len() == 1 => (&entries[0].0, &entries[0].1),
        Scalar::Table(entries) => {
            return Err(ConfigError::new(
                path,
                format!(
                    "must be a table with one key naming a policy, got {} keys",
                    entries.len()
                ),
            ))
        }
        other => {
            return Err(ConfigError::new(
                path,
                format!("must be a table with one key naming a policy, got {other}"),
            ))
        }
    };
    let at = join(path, key);
    if key == ANY_OF {
        let Scalar::List(members) = settings else {
            return Err(ConfigError::new(
                at,
                format!("must be a list of policies, got {settings}"),
            ));
        };
        return Ok(TripPolicy::any_of(
            members
                .iter()
                .enumerate()
                .map(|(i, member)| policy_at(member, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ));
    }
    let Some(policy) = IN_FILES.iter().find(|policy| policy.key == key) else {
        let known = IN_FILES.iter().map(|policy| policy.key).chain([ANY_OF]);
        return Err(ConfigError::new(
            path,
            format!(
                "names an unknown policy `{key}`, expected one of {}",
                quoted(known)
            ),
        ));
    };
    (policy.read)(&Table::new(settings, at, policy.fields)?)
}

/// `names` in backticks, separated by commas.
fn quoted<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A table of settings as written, read by the policy it belongs to.
struct Table<'a> {
    entries: &'a [(String, Scalar)],
    path: String,
}

impl<'a> Table<'a> {
    /// `value` as the settings at `path`, which may hold only `fields`,
    /// each once.
    fn new(
        value: &'a Scalar,
        path: String,
        fields: &'static [&'static str],
    ) -> Result<Self, ConfigError> {
        let Scalar::Table(entries) = value else {
            return Err(ConfigError::new(
                path,
                format!("must be a table, got {value}"),
            ));
        };
        for (i, (field, _)) in entries.iter().enumerate() {
            if fields.is_empty() {
                return Err(ConfigError::new(
                    path,
                    format!("has an unknown field `{field}`: it takes no settings"),
                ));
            }
            if !fields.contains(&field.as_str()) {
                return Err(ConfigError::new(
                    path,
                    format!(
                        "has an unknown field `{field}`, expected one of {}",
                        quoted(fields.iter().copied())
                    ),
                ));
            }
            if entries[..i].iter().any(|(seen, _)| seen == field) {
                return Err(ConfigError::new(join(&path, field), "is written twice"));
            }
        }
        Ok(Table { entries, path })
    }

    fn get(&self, field: &str) -> Option<&'a Scalar> {
        self.entries
            .iter()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value)
    }

    /// `field`'s value unless it is missing or null: a table or a policy
    /// written as null is not written, as an optional one left out.
    fn given(&self, field: &str) -> Option<&'a Scalar> {
        self.get(field).filter(|value| **value != Scalar::Null)
    }

    /// `field`'s value converted by `convert`, if written.
    fn read<T>(
        &self,
        field: &str,
        convert: impl FnOnce(&Scalar, &str) -> Result<T, ConfigError>,
    ) -> Result<Option<T>, ConfigError> {
        self.get(field)
            .map(|value| convert(value, &self.path(field)))
            .transpose()
    }
}

impl Written for Table<'_> {
    fn path(&self, field: &str) -> String {
        join(&self.path, field)
    }

    fn has(&self, field: &str) -> bool {
        self.given(field).is_some()
    }

    fn count(&self, field: &str) -> Result<Option<u32>, ConfigError> {
        self.read(field, Scalar::count)
    }

    fn number(&self, field: &str) -> Result<Option<f64>, ConfigError> {
        self.read(field, Scalar::number)
    }

    fn duration(&self, field: &str) -> Result<Option<Duration>, ConfigError> {
        self.read(field, Scalar::duration)
    }

    fn policy(&self, field: &str) -> Result<Option<TripPolicy>, ConfigError> {
        self.given(field)
            .map(|value| policy_at(value, &self.path(field)))
            .transpose()
    }

    fn policies(&self, field: &str) -> Result<Vec<(String, TripPolicy)>, ConfigError> {
        let Some(value) = self.given(field) else {
            return Ok(Vec::new());
        };
        let at = self.path(field);
        let Scalar::Table(entries) = value else {
            return Err(ConfigError::new(
                at,
                format!("must be a table of policies by name, got {value}"),
            ));
        };
        // In the order of their names, each read as it comes.
        let mut entries: Vec<&(String, Scalar)> = entries.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
            .into_iter()
            .map(|(name, member)| Ok((name.clone(), policy_at(member, &join(&at, name))?)))
            .collect()
    }

    fn table<'s>(
        &'s self,
        field: &str,
        fields: &'static [&'static str],
    ) -> Result<Option<Box<dyn Written + 's>>, ConfigError> {
        match self.given(field) {
            Some(value) => Ok(Some(Box::new(Table::new(value, self.path(field), fields)?))),
            None => Ok(None),
        }
    }
}

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
