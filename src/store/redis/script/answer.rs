//! The scripts' answers, checked and read: a change's six integers as a
//! [`Reply`] and the shard version it holds at, the inspect script's
//! answer as a [`FleetState`], and the control a kind in the index stands
//! for. Anything of another shape is garbage, never a guess.

use std::time::Duration;

use crate::store::fleet::Reply;
use crate::store::{FleetOpening, FleetState};
use crate::Control;

/// The script's answer, checked: anything else is garbage, and a Redis
/// that answers garbage is treated as down.
impl Reply {
    /// The answer, and the shard's version it holds at.
    pub(crate) fn parse(value: &redis::Value) -> Option<(Reply, u64)> {
        let redis::Value::Array(items) = value else {
            return None;
        };
        let mut n = [0u64; 6];
        if items.len() != n.len() {
            return None;
        }
        for (slot, item) in n.iter_mut().zip(items) {
            match item {
                redis::Value::Int(i) if *i >= 0 => *slot = *i as u64,
                _ => return None,
            }
        }
        let [kind, generation, ms, attempt, failures, version] = n;
        let attempt = u32::try_from(attempt).ok()?;
        let reply = match kind {
            0 => Reply::Closed { failures },
            1 => Reply::Open {
                generation,
                left_ms: ms,
                attempt,
            },
            2 => Reply::ProbeWon {
                generation,
                attempt,
            },
            3 => Reply::ProbeHeld {
                generation,
                lease_ms: ms,
                attempt,
            },
            4 => Reply::Declined { failures },
            _ => return None,
        };
        Some((reply, version))
    }
}

/// The inspect script's answer as the fleet's state of the name; `None`
/// when it is not one.
pub(crate) fn parse_inspect(value: &redis::Value) -> Option<FleetState> {
    use redis::Value;
    let Value::Array(items) = value else {
        return None;
    };
    let [gen, attempt, ok, record_ttl, wait_ttl, min_open_ttl, failures, failing, holder, lease_ttl, votes, control] =
        items.as_slice()
    else {
        return None;
    };
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    };
    let number = |v: &Value| -> Option<u64> {
        match v {
            Value::Int(i) => u64::try_from(*i).ok(),
            v => text(v)?.parse().ok(),
        }
    };
    // A time to live: -2 (no key) and -1 (no expiry) read as none.
    let ttl = |v: &Value| -> Option<Duration> {
        match v {
            Value::Int(i) if *i >= 0 => Some(Duration::from_millis(*i as u64)),
            Value::Int(_) => None,
            _ => None,
        }
    };
    let names = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::Array(items) => items.iter().map(text).collect(),
            _ => None,
        }
    };
    let gen = text(gen)?;
    let opening = if gen.is_empty() {
        None
    } else {
        Some(FleetOpening {
            generation: gen.parse().ok()?,
            attempt: u32::try_from(number(attempt).unwrap_or(0)).ok()?,
            open_for: ttl(wait_ttl).unwrap_or_default(),
            kept_for: ttl(record_ttl).unwrap_or_default(),
            min_open_for: ttl(min_open_ttl).unwrap_or_default(),
            probe_successes: u32::try_from(number(ok).unwrap_or(0)).ok()?,
        })
    };
    let holder = text(holder)?;
    let prober = (!holder.is_empty()).then(|| (holder, ttl(lease_ttl).unwrap_or_default()));
    let control = match text(control)?.split(' ').nth(2) {
        Some(kind) => control_of(kind),
        None => None,
    };
    Some(FleetState {
        opening,
        failures: number(failures)?,
        failing: names(failing)?,
        votes: names(votes)?,
        prober,
        control,
    })
}

/// The control a kind in the index stands for, if it holds the breakers
/// (`reset` is a mark that passes).
pub(crate) fn control_of(kind: &str) -> Option<Control> {
    match kind {
        "open" => Some(Control::ForceOpen(None)),
        "closed" => Some(Control::ForceClosed),
        "disabled" => Some(Control::Disable),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn replies_of_the_wrong_shape_are_garbage() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        assert_eq!(
            Reply::parse(&ints(&[1, 7, 300, 2, 0, 41])),
            Some((
                Reply::Open {
                    generation: 7,
                    left_ms: 300,
                    attempt: 2
                },
                41
            ))
        );
        assert_eq!(
            Reply::parse(&ints(&[4, 0, 0, 0, 3, 41])),
            Some((Reply::Declined { failures: 3 }, 41))
        );
        assert_eq!(Reply::parse(&ints(&[1, 7, 300, 2, 0])), None);
        assert_eq!(Reply::parse(&ints(&[9, 7, 300, 2, 0, 41])), None);
        assert_eq!(Reply::parse(&ints(&[1, -7, 300, 2, 0, 41])), None);
        assert_eq!(Reply::parse(&Value::Okay), None);
        assert_eq!(
            Reply::parse(&Value::Array(vec![Value::Nil; 6])),
            None,
            "nil is not a number"
        );
    }
}
