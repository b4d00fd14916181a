//! What a status page serves: snapshots, counts, states, policy figures,
//! trip reasons and transitions, with durations as whole milliseconds.

use ::serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::breaker::{Counts, Snapshot};
use crate::events::State;
use crate::events::Transition;
use crate::millis::{millis, millis_up};
use crate::policy::{Figure, PolicyFigures, TripReason};

/// As its snake-case name: `"closed"`, `"open"`, `"half_open"`,
/// `"forced_open"`, `"forced_closed"` or `"disabled"`.
impl Serialize for State {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// As a struct of its counters: `calls`, `rejected`, `rejected_by_parent`,
/// `failures`, `ignored`, `stale`, `cancelled`, `opened`, `probes`,
/// `recorded`.
impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Counts", 10)?;
        s.serialize_field("calls", &self.calls)?;
        s.serialize_field("rejected", &self.rejected)?;
        s.serialize_field("rejected_by_parent", &self.rejected_by_parent)?;
        s.serialize_field("failures", &self.failures)?;
        s.serialize_field("ignored", &self.ignored)?;
        s.serialize_field("stale", &self.stale)?;
        s.serialize_field("cancelled", &self.cancelled)?;
        s.serialize_field("opened", &self.opened)?;
        s.serialize_field("probes", &self.probes)?;
        s.serialize_field("recorded", &self.recorded)?;
        s.end()
    }
}

/// As a struct: `policy` (the name [`TripReason::policy`] gives), the
/// figures of the policy that tripped if one did (as [`PolicyFigures`]
/// writes them), a pushback's `retry_after_ms`, and `message`, the reason
/// in words; a per-class trip has its `class` and its member's `reason`.
impl Serialize for TripReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = Vec::new();
        let mut retry_after_ms = None;
        match self {
            TripReason::Policy(figures) => fields = figures.fields(),
            TripReason::PerClass { class, reason } => {
                let mut s = serializer.serialize_struct("TripReason", 4)?;
                s.serialize_field("policy", self.policy())?;
                s.serialize_field("class", class.name())?;
                s.serialize_field("reason", reason)?;
                s.serialize_field("message", &self.to_string())?;
                return s.end();
            }
            // Rounded up, as every wait a caller is told.
            TripReason::Pushback { retry_after } => retry_after_ms = Some(millis_up(*retry_after)),
            _ => {}
        }
        let len = 2 + fields.len() + usize::from(retry_after_ms.is_some());
        let mut s = serializer.serialize_struct("TripReason", len)?;
        s.serialize_field("policy", self.policy())?;
        for (name, figure) in &fields {
            s.serialize_field(name, &AsWritten(figure))?;
        }
        if let Some(retry_after_ms) = retry_after_ms {
            s.serialize_field("retry_after_ms", &retry_after_ms)?;
        }
        s.serialize_field("message", &self.to_string())?;
        s.end()
    }
}

/// As a struct: `policy` (its key in a config, such as `time_window`) and
/// its figures by name (a duration in whole milliseconds, in a field named
/// `_ms`); an any-of holds its members' in `members`, a per-class policy
/// its rest's in `rest` and each class's in `classes` (`class`,
/// `figures`), an adaptive policy its fallback's in `fallback` while
/// warming up (otherwise null).
impl Serialize for PolicyFigures {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.fields();
        let mut s = serializer.serialize_struct("PolicyFigures", 1 + fields.len())?;
        s.serialize_field("policy", self.policy())?;
        for (name, figure) in &fields {
            s.serialize_field(name, &AsWritten(figure))?;
        }
        s.end()
    }
}

/// A policy's figure as written.
struct AsWritten<'a>(&'a Figure<'a>);

impl Serialize for AsWritten<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self.0 {
            Figure::Count(count) => serializer.serialize_u64(count),
            Figure::Number(number) => serializer.serialize_f64(number),
            Figure::Flag(flag) => serializer.serialize_bool(flag),
            Figure::Duration(duration) => serializer.serialize_u64(millis(duration)),
            Figure::Figures(figures) => figures.serialize(serializer),
            Figure::Members(members) => members.serialize(serializer),
            Figure::Classes(classes) => {
                /// One class's figures, as `{ "class": .., "figures": .. }`.
                struct Member<'a>(&'a (crate::classify::FailureClass, PolicyFigures));
                impl Serialize for Member<'_> {
                    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                        let mut s = serializer.serialize_struct("Class", 2)?;
                        s.serialize_field("class", self.0 .0.name())?;
                        s.serialize_field("figures", &self.0 .1)?;
                        s.end()
                    }
                }
                serializer.collect_seq(classes.iter().map(Member))
            }
        }
    }
}

/// As a struct of its fields, with `time_in_state_ms` (rounded down) and
/// `retry_after_ms` (rounded up; null unless open) for the durations.
impl Serialize for Snapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Snapshot", 12)?;
        s.serialize_field("name", &*self.name)?;
        s.serialize_field("state", &self.state)?;
        s.serialize_field("generation", &self.generation)?;
        s.serialize_field("time_in_state_ms", &millis(self.time_in_state))?;
        s.serialize_field("retry_after_ms", &self.retry_after.map(millis_up))?;
        s.serialize_field("probes_in_flight", &self.probes_in_flight)?;
        s.serialize_field("probe_successes", &self.probe_successes)?;
        s.serialize_field("failed_probe_rounds", &self.failed_probe_rounds)?;
        s.serialize_field("last_trip", &self.last_trip)?;
        s.serialize_field("policy", &self.policy)?;
        s.serialize_field("counts", &self.counts)?;
        s.serialize_field("shadow", &self.shadow)?;
        s.end()
    }
}

/// As a struct of its fields, with `retry_after_ms` (rounded up; null
/// unless it opened) for the open period.
impl Serialize for Transition {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Transition", 7)?;
        s.serialize_field("breaker", &*self.breaker)?;
        s.serialize_field("from", &self.from)?;
        s.serialize_field("to", &self.to)?;
        s.serialize_field("generation", &self.generation)?;
        s.serialize_field("reason", &self.reason)?;
        s.serialize_field("retry_after_ms", &self.retry_after.map(millis_up))?;
        s.serialize_field("shadow", &self.shadow)?;
        s.end()
    }
}
