//! One value as written, whatever its type: read as it comes, and checked
//! when the config is built, where its path is known, so that a wrong type
//! or a bad duration is an error naming the field.

use std::fmt;
use std::time::Duration;

use ::serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use ::serde::Deserialize;

use super::duration::parse_duration;
use crate::error::ConfigError;

/// One value as written, whatever its type.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Scalar {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Scalar>),
    /// Its entries in the order written.
    Table(Vec<(String, Scalar)>),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Null => f.write_str("null"),
            Scalar::Bool(b) => write!(f, "boolean {b}"),
            Scalar::Int(n) => write!(f, "integer {n}"),
            Scalar::Float(x) => write!(f, "float {x}"),
            Scalar::Str(s) => write!(f, "string {s:?}"),
            Scalar::List(_) => f.write_str("a list"),
            Scalar::Table(_) => f.write_str("a table"),
        }
    }
}

impl Scalar {
    pub(super) fn count(&self, path: &str) -> Result<u32, ConfigError> {
        self.whole(path, u32::MAX.into())
            .map(|n| n.try_into().unwrap_or(u32::MAX))
    }

    pub(super) fn size(&self, path: &str) -> Result<usize, ConfigError> {
        let max = u64::try_from(usize::MAX).unwrap_or(u64::MAX);
        self.whole(path, max)
            .map(|n| n.try_into().unwrap_or(usize::MAX))
    }

    /// A whole number in `0..=max`.
    pub(super) fn whole(&self, path: &str, max: u64) -> Result<u64, ConfigError> {
        match *self {
            Scalar::Int(n) if n < 0 => Err(ConfigError::new(
                path,
                format!("must not be negative, got {n}"),
            )),
            Scalar::Int(n) => u64::try_from(n)
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| ConfigError::new(path, format!("must be at most {max}, got {n}"))),
            _ => Err(ConfigError::new(
                path,
                format!("must be a whole number, got {self}"),
            )),
        }
    }

    pub(super) fn number(&self, path: &str) -> Result<f64, ConfigError> {
        match *self {
            Scalar::Float(x) => Ok(x),
            Scalar::Int(n) => Ok(n as f64),
            _ => Err(ConfigError::new(
                path,
                format!("must be a number, got {self}"),
            )),
        }
    }

    pub(super) fn duration(&self, path: &str) -> Result<Duration, ConfigError> {
        match self {
            Scalar::Str(text) => parse_duration(text).map_err(|err| {
                ConfigError::new(
                    path,
                    format!(
                        "must be a duration such as \"30s\": {:?} {}",
                        err.input(),
                        err.problem()
                    ),
                )
            }),
            _ => Err(ConfigError::new(
                path,
                format!("must be a duration such as \"30s\", got {self}"),
            )),
        }
    }

    /// A duration, or `"none"` or null for none.
    pub(super) fn optional_duration(&self, path: &str) -> Result<Option<Duration>, ConfigError> {
        match self {
            Scalar::Null => Ok(None),
            Scalar::Str(text) if text == "none" => Ok(None),
            Scalar::Str(_) => self.duration(path).map(Some),
            _ => Err(ConfigError::new(
                path,
                format!("must be a duration such as \"30s\", or \"none\", got {self}"),
            )),
        }
    }

    pub(super) fn boolean(&self, path: &str) -> Result<bool, ConfigError> {
        match *self {
            Scalar::Bool(b) => Ok(b),
            _ => Err(ConfigError::new(
                path,
                format!("must be true or false, got {self}"),
            )),
        }
    }

    pub(super) fn text(&self, path: &str) -> Result<String, ConfigError> {
        match self {
            Scalar::Str(text) => Ok(text.clone()),
            _ => Err(ConfigError::new(
                path,
                format!("must be a string, got {self}"),
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, a string or a boolean")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_u128<E>(self, v: u128) -> Result<Scalar, E> {
        // Past every range checked here either way.
        Ok(Scalar::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Scalar, D::Error> {
        Scalar::deserialize(deserializer)
    }

    // Lists and tables are read whole, whatever they hold, so that a
    // wrong value is an error that names its field when the config is
    // built rather than one that stops the parser here.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Scalar>()? {
            items.push(item);
        }
        Ok(Scalar::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, Scalar>()? {
            entries.push(entry);
        }
        Ok(Scalar::Table(entries))
    }
}

/// A field that was written, null included (absent stays `None`).
pub(super) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Scalar>, D::Error> {
    Scalar::deserialize(deserializer).map(Some)
}
