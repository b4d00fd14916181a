//! The probe lock, tried when a key's open period ends here.

use super::*;

impl Task {
    /// Tries the probe lock of every key whose time has come.
    pub(super) async fn probe_due(&mut self) {
        if self.is_down() {
            // The holds run out by themselves; local breakers probe.
            for name in self.scheduled.take_all() {
                if let Some(entry) = self.entries.get_mut(&name) {
                    entry.local.next_probe = None;
                }
            }
            return;
        }
        let now = Instant::now();
        let lease_ms = millis(self.timing.lease);
        let due = self.scheduled.take_due(now);
        let mut batch = Vec::with_capacity(due.len());
        for name in due {
            let Some(entry) = self.entries.get_mut(&name) else {
                continue;
            };
            entry.local.next_probe = None;
            // A key whose breakers are all gone would hold the lock with
            // nothing to probe; one whose shard is cut off probes on its
            // own once its hold runs out.
            if !entry.local.prune() || self.unreachable[usize::from(entry.shard)] {
                continue;
            }
            batch.push(Write {
                key: name,
                op: Op::Probe,
                args: Args {
                    lease_ms,
                    ..Args::default()
                },
            });
        }
        // In batches, as queued writes are: a round of many keys ending at
        // once (a fleet with a thousand keys open) is no one exchange.
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(BATCH));
            if self.send(batch, Exchange::ProbeLocks).await.lost > 0 {
                if !self.is_down() {
                    // Slow: the keys not yet sent try again shortly.
                    let again = Instant::now() + self.timing.command_timeout;
                    for write in rest {
                        if let Some(entry) = self.entries.get_mut(&write.key) {
                            entry.local.next_probe = Some(again);
                            self.reschedule(&write.key);
                        }
                    }
                }
                return;
            }
            batch = rest;
        }
    }
}
