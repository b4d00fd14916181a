//! Reading a breaker: its state and retry-after as a reader should see them
//! (an ended open period reads half-open), and a snapshot of everything.

use std::sync::Arc;
use std::time::Duration;

use super::{state_of, Shared, Tag};
use crate::breaker::state::Word;
use crate::breaker::{Counts, Snapshot};
use crate::events::State;
use crate::policy::PolicyState;
use crate::sync::Ordering;

impl Shared {
    /// The state as a reader should see it: an open breaker whose period
    /// has ended reads as half-open, whether or not a caller has moved it.
    pub(crate) fn state(&self) -> State {
        state_at(self.load(), self.now_ms())
    }

    pub(crate) fn retry_after(&self) -> Option<Duration> {
        retry_after_at(self.load(), self.now_ms())
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let (calls, rejected, by_parent) =
            self.extras.get().map_or((0, 0, 0), |e| e.clones.totals());
        let calls = calls + self.counters.calls.load(Ordering::Relaxed);
        let rejected = rejected + self.counters.rejected.load(Ordering::Relaxed);
        let rejected_by_parent =
            by_parent + self.counters.rejected_by_parent.load(Ordering::Relaxed);
        let mut locked = self.peek();
        let w = self.load();
        let now = self.now_ms();
        let state = state_at(w, now);
        let (probes_in_flight, probe_successes) = match w.tag() {
            Tag::HalfOpen => (w.in_flight(), w.successes()),
            _ => (0, 0),
        };
        let c = &self.counters;
        let mut snapshot = Snapshot {
            name: Arc::clone(self.name()),
            state,
            generation: w.generation(),
            time_in_state: Duration::ZERO,
            retry_after: retry_after_at(w, now),
            probes_in_flight,
            probe_successes,
            failed_probe_rounds: 0,
            last_trip: None,
            policy: PolicyState::new(locked.made_with.trip()).figures(now),
            shadow: self.hot.shadow.load(Ordering::Relaxed),
            counts: Counts {
                calls,
                rejected,
                rejected_by_parent,
                failures: 0,
                ignored: c.ignored.load(Ordering::Relaxed),
                stale: 0,
                cancelled: c.cancelled.load(Ordering::Relaxed),
                opened: 0,
                probes: 0,
                recorded: self.recorded(),
            },
        };
        // A breaker without a book has only ever succeeded: fresh, closed
        // since it was made.
        let Some(book) = locked.book.as_deref_mut() else {
            snapshot.time_in_state = Duration::from_millis(now);
            return snapshot;
        };
        self.fold_tally(book, w);
        let since = match w.tag() {
            Tag::Open if now >= w.open_until_ms() => w.open_until_ms(),
            Tag::HalfOpen => book.open_until_ms,
            _ => book.since_ms,
        };
        snapshot.time_in_state = Duration::from_millis(now.saturating_sub(since));
        snapshot.policy = book.policy.figures(now);
        self.arm_tally(book, w, now);
        snapshot.failed_probe_rounds = book.attempt;
        snapshot.last_trip = book.last_trip.clone();
        let counts = &book.counts;
        snapshot.counts.failures = counts.failures;
        snapshot.counts.stale = counts.stale;
        snapshot.counts.opened = counts.opened;
        snapshot.counts.probes = counts.probes;
        snapshot
    }
}

/// The state as a reader should see it at `now_ms`: an open breaker whose
/// period has ended reads as half-open, whether or not a caller has moved it.
fn state_at(w: Word, now_ms: u64) -> State {
    match w.tag() {
        Tag::Open if now_ms >= w.open_until_ms() => State::HalfOpen,
        _ => state_of(w),
    }
}

/// The rest of the open period at `now_ms`, while open.
pub(super) fn retry_after_at(w: Word, now_ms: u64) -> Option<Duration> {
    (w.tag() == Tag::Open && now_ms < w.open_until_ms())
        .then(|| Duration::from_millis(w.open_until_ms() - now_ms))
}
