//! The subscriber's messages, and what they and the reads change in the
//! local breakers.

use super::*;

impl Task {
    /// Takes in a message; returns whether a refresh is due.
    pub(super) fn on_message(&mut self, message: Message) -> bool {
        self.count(|s| &s.messages, 1);
        let now = Instant::now();
        match message {
            Message::Subscribed => return true,
            Message::Open {
                version,
                escaped,
                generation,
                left_ms,
                attempt,
                keep_ms,
            } => {
                let shard = keys::shard_of(&escaped, self.shards);
                let known = Known::Open {
                    generation,
                    attempt,
                    open_until: now + Duration::from_millis(left_ms),
                    kept_until: Some(now + Duration::from_millis(keep_ms)),
                };
                // Older than what the view holds (this instance's own
                // answer came first): already told.
                if self.view.heard(shard, &escaped, version, known) {
                    let reply = Reply::Open {
                        generation,
                        left_ms,
                        attempt,
                    };
                    self.apply(&escaped, reply);
                }
            }
            Message::Control {
                version,
                escaped,
                kind,
            } => self.heard_control(&escaped, version, &kind),
            Message::Close {
                version,
                escaped,
                generation,
            } => {
                let shard = keys::shard_of(&escaped, self.shards);
                if self.view.heard(shard, &escaped, version, Known::Closed) {
                    if let Some(entry) = self.entries.get_mut(escaped.as_str()) {
                        let breakers = entry.local.live();
                        entry.local.close(&breakers, Some(generation), 0);
                        self.reschedule(&escaped);
                    }
                }
            }
        }
        false
    }

    /// Brings the local breakers of `escaped` in line with `reply`.
    pub(super) fn apply(&mut self, escaped: &str, reply: Reply) {
        let Some(entry) = self.entries.get_mut(escaped) else {
            return;
        };
        if entry
            .local
            .apply(reply, self.timing.hold, self.timing.lease)
        {
            self.count(|s| &s.probe_locks_won, 1);
        }
        self.reschedule(escaped);
    }

    /// Keeps `scheduled` in step with the key's next try at the lock.
    pub(super) fn reschedule(&mut self, escaped: &str) {
        let Some((name, entry)) = self.entries.get_key_value(escaped) else {
            return;
        };
        self.scheduled.set(name, entry.local.next_probe);
    }
}
