//! What a status page serves: snapshots, counts, states, policy figures,
//! trip reasons and transitions, with durations as whole milliseconds.

use ::serde::ser::{Serialize, SerializeStruct, Serializer};

use crate::breaker::{Counts, Snapshot};
use crate::events::State;
use crate::events::Transition;
use crate::millis::{millis, millis_up};
use crate::policy::{PolicyFigures, TripReason};

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
/// figures of the trip if any (`failures`, `window`, `calls`, `slow`,
/// `baseline` for an adaptive policy, or `retry_after_ms` for a pushback),
/// and `message`, the reason in words; a per-class trip has its `class` and
/// its member's `reason`.
impl Serialize for TripReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Whole-number figures, then an adaptive trip's baseline or a
        // pushback's wait.
        let (baseline, retry_after_ms) = match *self {
            TripReason::Adaptive { baseline, .. } => (Some(baseline), None),
            TripReason::Pushback { retry_after } => (None, Some(millis_up(retry_after))),
            TripReason::PerClass { class, ref reason } => {
                let mut s = serializer.serialize_struct("TripReason", 4)?;
                s.serialize_field("policy", self.policy())?;
                s.serialize_field("class", class.name())?;
                s.serialize_field("reason", reason)?;
                s.serialize_field("message", &self.to_string())?;
                return s.end();
            }
            _ => (None, None),
        };
        let figures = self.counts();
        let len = 2
            + figures.len()
            + usize::from(baseline.is_some())
            + usize::from(retry_after_ms.is_some());
        let mut s = serializer.serialize_struct("TripReason", len)?;
        s.serialize_field("policy", self.policy())?;
        for (name, value) in &figures {
            s.serialize_field(name, value)?;
        }
        if let Some(baseline) = baseline {
            s.serialize_field("baseline", &baseline)?;
        }
        if let Some(retry_after_ms) = retry_after_ms {
            s.serialize_field("retry_after_ms", &retry_after_ms)?;
        }
        s.serialize_field("message", &self.to_string())?;
        s.end()
    }
}

/// As a struct: `policy` (its key in a config, such as `time_window`) and
/// its figures by name; an any-of holds its members' in `members`, a per-class policy
/// its rest's in `rest` and each class's in `classes` (`class`, `figures`), an adaptive policy its
/// `baseline`, `learned`, `statistic`, `threshold`, `learning` and, while warming up,
/// its fallback's figures in `fallback` (otherwise null).
impl Serialize for PolicyFigures {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            PolicyFigures::PerClass {
                ref rest,
                ref classes,
            } => {
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
                let members: Vec<Member<'_>> = classes.iter().map(Member).collect();
                let mut s = serializer.serialize_struct("PolicyFigures", 3)?;
                s.serialize_field("policy", "per_class")?;
                s.serialize_field("rest", rest)?;
                s.serialize_field("classes", &members)?;
                return s.end();
            }
            PolicyFigures::AnyOf(ref members) => {
                let mut s = serializer.serialize_struct("PolicyFigures", 2)?;
                s.serialize_field("policy", "any_of")?;
                s.serialize_field("members", members)?;
                return s.end();
            }
            PolicyFigures::Adaptive {
                baseline,
                learned,
                statistic,
                threshold,
                learning,
                ref fallback,
            } => {
                let mut s = serializer.serialize_struct("PolicyFigures", 7)?;
                s.serialize_field("policy", "adaptive")?;
                s.serialize_field("baseline", &baseline)?;
                s.serialize_field("learned", &learned)?;
                s.serialize_field("statistic", &statistic)?;
                s.serialize_field("threshold", &threshold)?;
                s.serialize_field("learning", &learning)?;
                s.serialize_field("fallback", fallback)?;
                return s.end();
            }
            _ => {}
        }
        let (policy, figures) = self.counts();
        let mut s = serializer.serialize_struct("PolicyFigures", 1 + figures.len())?;
        s.serialize_field("policy", policy)?;
        for (name, value) in &figures {
            s.serialize_field(name, value)?;
        }
        s.end()
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
