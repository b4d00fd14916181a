//! A shard's index as read ([`ShardRead`]): the read script's answer, a
//! page at a time, with Redis's times made local; each entry's text
//! (`o ...` open, `c ...` counting, `x ...` an operator's control), the
//! version a shard's key holds, and the index field of a name's control.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::known::{Known, Stamped};
use crate::store::redis::script::control_of;
use crate::Control;

/// One shard's index as read: its version, and its entries. A read in
/// pages holds the version of its first page: every change after it is
/// either among the entries (stamped with its own, later, version), or
/// moves the version past the read's, so that the shard is read again.
pub(crate) struct ShardRead {
    pub(crate) version: u64,
    pub(super) entries: Vec<(Arc<str>, Stamped)>,
    /// Entries that could not be read (another application's data, or
    /// damaged).
    pub(crate) unreadable: u64,
}

/// A version as Redis holds it: absent (0) or a number.
pub(crate) fn version_of(value: &Value) -> Option<u64> {
    match value {
        Value::Nil => Some(0),
        Value::BulkString(bytes) if bytes.is_empty() => Some(0),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

impl ShardRead {
    /// A shard that never changed (its version key does not exist): its
    /// index is empty, without reading it.
    pub(crate) fn empty() -> ShardRead {
        ShardRead {
            version: 0,
            entries: Vec::new(),
            unreadable: 0,
        }
    }

    /// The read script's answer, `{version, now, cursor, name, entry,
    /// ...}`: one page, and the cursor of the next (0: none), with Redis's
    /// times made local from `at` (when the answer came); `None` when it
    /// is not one at all.
    pub(crate) fn parse(value: &Value, at: Instant) -> Option<(ShardRead, u64)> {
        let Value::Array(items) = value else {
            return None;
        };
        let [version, now, cursor, rest @ ..] = items.as_slice() else {
            return None;
        };
        let version = version_of(version)?;
        let number = |value: &Value| -> Option<u64> {
            match value {
                Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
                _ => None,
            }
        };
        let (now, cursor) = (number(now)?, number(cursor)?);
        if rest.len() % 2 != 0 {
            return None;
        }
        let local = |redis_ms: u64| -> Instant {
            match redis_ms.checked_sub(now) {
                Some(ahead) => at + Duration::from_millis(ahead),
                None => at,
            }
        };
        let mut read = ShardRead {
            version,
            entries: Vec::with_capacity(rest.len() / 2),
            unreadable: 0,
        };
        for pair in rest.chunks_exact(2) {
            let (Value::BulkString(name), Value::BulkString(entry)) = (&pair[0], &pair[1]) else {
                read.unreadable += 1;
                continue;
            };
            let parsed = std::str::from_utf8(name)
                .ok()
                .zip(std::str::from_utf8(entry).ok())
                .and_then(|(name, entry)| Some((Arc::from(name), parse_entry(entry, &local)?)));
            match parsed {
                Some(entry) => read.entries.push(entry),
                None => read.unreadable += 1,
            }
        }
        Some((read, cursor))
    }

    /// Adds a later page of the same read.
    pub(crate) fn extend(&mut self, page: ShardRead) {
        self.entries.extend(page.entries);
        self.unreadable += page.unreadable;
    }
}

/// `o <version> <generation> <attempt> <open until> <kept until>`,
/// `c <version> <failures> <until>`, or (under `!<name>`) `x <version>
/// <kind> <until>`.
fn parse_entry(entry: &str, local: &impl Fn(u64) -> Instant) -> Option<Stamped> {
    let mut words = entry.split(' ');
    let kind = words.next()?;
    let version = words.next()?.parse().ok()?;
    if kind == "x" {
        let control = match words.next()? {
            "reset" => Control::Reset,
            kind => control_of(kind)?,
        };
        words.next()?.parse::<u64>().ok()?;
        let known = Known::Controlled {
            control,
            id: version,
        };
        return words.next().is_none().then_some(Stamped { version, known });
    }
    let mut number = || -> Option<u64> { words.next()?.parse().ok() };
    let known = match kind {
        "o" => Known::Open {
            generation: number()?,
            attempt: u32::try_from(number()?).ok()?,
            open_until: local(number()?),
            kept_until: Some(local(number()?)),
        },
        "c" => {
            let failures = number()?;
            number()?;
            Known::Counting { failures }
        }
        _ => return None,
    };
    words.next().is_none().then_some(Stamped { version, known })
}

/// The index field of `escaped`'s fleet-wide control.
pub(crate) fn control_field(escaped: &str) -> String {
    format!("!{escaped}")
}

/// The name whose control `field` is, if it is a control's field.
pub(crate) fn controlled_name(field: &str) -> Option<&str> {
    field.strip_prefix('!')
}
