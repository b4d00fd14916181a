//! The operator's side of the fleet's state: the fleet-wide control of a
//! name (held, timed force-open, restored, reset), told to every instance,
//! and everything the fleet keeps of a name, as an operator reads it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::operate::open_record;
use super::record::Record;
use super::{Change, Fleet};
use crate::store::fleet::Args;
use crate::store::{FleetOpening, FleetState};
use crate::Control;

impl Fleet {
    /// The control in force on `key`.
    pub(crate) fn control_of(&self, key: &str) -> Option<(u64, Control)> {
        self.records.get(key).and_then(|r| r.control)
    }

    /// An operator's fleet-wide `control` of `key`, told to every instance
    /// (the caller's included) as any change is; `open` are the arguments
    /// of an opening for a period.
    pub(crate) fn control(&mut self, key: &Arc<str>, control: Control, open: &Args, now: Instant) {
        let record = self.records.entry(Arc::clone(key)).or_default();
        record.expire(now);
        let mut changes = Vec::new();
        match control {
            Control::ForceOpen(Some(_)) => {
                if record.control.take().is_some() {
                    changes.push(Change::Controlled(None));
                }
                let (_, opened) = open_record(record, &mut self.last_generation, open, 0, now);
                changes.extend(opened);
            }
            Control::Restore => {
                record.control = None;
                changes.push(Change::Controlled(None));
            }
            Control::Reset => {
                *record = Record::default();
                self.last_control += 1;
                changes.push(Change::Controlled(Some((self.last_control, control))));
            }
            held => {
                self.last_control += 1;
                record.control = Some((self.last_control, held));
                changes.push(Change::Controlled(record.control));
            }
        }
        if record.is_empty() {
            self.records.remove(key);
        }
        for change in changes {
            // From nobody: every instance hears it, the caller's too.
            self.announce(0, key, change);
        }
    }

    /// Everything the fleet keeps of `key`, `now`.
    pub(crate) fn inspect(&mut self, key: &str, now: Instant) -> FleetState {
        let Some(record) = self.records.get_mut(key) else {
            return FleetState::default();
        };
        record.expire(now);
        let left =
            |at: Option<Instant>| at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        let opening = record.opening.as_ref().map(|o| FleetOpening {
            generation: o.generation,
            attempt: o.attempt,
            open_for: left(record.open_until),
            kept_for: left(Some(o.until)),
            min_open_for: left(record.min_open_until),
            probe_successes: u32::try_from(o.successes).unwrap_or(u32::MAX),
        });
        let (failures, failing, votes, lease, control) = (
            record.failures(),
            record.failing.clone(),
            record.votes.iter().map(|(who, _)| *who).collect::<Vec<_>>(),
            record
                .probe_lock
                .as_ref()
                .map(|l| (l.holder, left(Some(l.until)))),
            record.control,
        );
        FleetState {
            opening,
            failures,
            failing: failing.into_iter().map(|v| self.voter_name(v)).collect(),
            votes: votes.into_iter().map(|v| self.voter_name(v)).collect(),
            prober: lease.map(|(holder, left)| (self.name_of(holder), left)),
            control: control.and_then(|(_, c)| (c != Control::Reset).then_some(c)),
        }
    }
}
