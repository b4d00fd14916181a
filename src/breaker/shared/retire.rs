//! Retirement from a registry: the marks of use that order eviction, which
//! breakers may be evicted (idle, and held by no user), and where the
//! outcomes of calls a retired breaker admitted go.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Shared, Successor, Tag};
use crate::outcome::Verdict;
use crate::sync::Ordering;

impl Shared {
    /// Marks a use at registry insertion count `now`, unless one was marked
    /// less than `every` insertions ago: repeated use of a hot key writes
    /// nothing, and keys arriving all the time make it write at most once
    /// in `every` of them.
    #[inline]
    pub(crate) fn mark_used(&self, now: u64, every: u64) {
        let used_at = &self.counters.used_at;
        if now.wrapping_sub(used_at.load(Ordering::Relaxed)) >= every {
            used_at.store(now, Ordering::Relaxed);
        }
    }

    /// The registry insertion count at the last use.
    pub(crate) fn used_at(&self) -> u64 {
        self.counters.used_at.load(Ordering::Relaxed)
    }

    /// Retires this breaker from its registry if it is closed, and is not
    /// in shadow mode nor probing actively (whose settings a new breaker
    /// for the key would not have). Every transition holds the lock taken
    /// here, so a breaker that trips meanwhile is not retired. Services
    /// that remember it look the key up again, and the outcomes of calls it
    /// admitted go to `successor`: every success takes the lock from now on
    /// to be passed on.
    pub(crate) fn retire_if_idle(this: &Arc<Self>, successor: Successor) -> bool {
        let mut book = this.lock();
        if !Self::is_evictable(this) {
            return false;
        }
        book.successor = Some(successor);
        this.refresh_success_flag(&book);
        this.hot.retired.store(true, Ordering::Release);
        true
    }

    /// Whether its registry may evict it: closed, not in shadow mode, not
    /// probing actively, and held by nothing but the registry itself and
    /// its keyed services' own handles (`this` is the registry's own). A user's [`Breaker`](crate::Breaker), or a service or a
    /// layer built from one, holds the breaker: evicted, it would go on
    /// guarding that user's calls with a breaker that no longer counts its
    /// key's failures. (A keyed call in flight does not hold its breaker:
    /// evicted meanwhile, its outcome goes to the key's breaker then.)
    pub(crate) fn is_evictable(this: &Arc<Self>) -> bool {
        let others = Arc::strong_count(this) as u64 - 1;
        this.load().tag() == Tag::Closed
            && !this.hot.shadow.load(Ordering::Relaxed)
            && this.prober().is_none()
            && others <= this.counters.internal_handles.load(Ordering::Acquire)
    }

    /// A keyed service takes (`true`) or drops a handle of its own on this
    /// breaker: one that does not hold it in its registry. Taken after the
    /// handle is made and dropped before it goes, so that the count never
    /// exceeds such handles and the breaker at worst reads as held.
    pub(crate) fn note_internal_handle(&self, taken: bool) {
        let count = &self.counters.internal_handles;
        if taken {
            count.fetch_add(1, Ordering::AcqRel);
        } else {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Records the outcome of a call another breaker admitted (one retired
    /// since), in the current closed generation; dropped if not closed.
    pub(crate) fn record_forwarded(&self, verdict: Verdict, timing: Option<(Duration, Instant)>) {
        let w = self.load();
        if w.tag() == Tag::Closed {
            self.record_closed(w.generation(), verdict, timing);
        }
    }

    /// Whether its registry has evicted it.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.hot.retired.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(tcb_loom)))]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::super::test_support::{mode, shared};
    use super::super::{Shared, Successor, QUIET, RECORD};
    use crate::events::State;
    use crate::outcome::Outcome;
    use crate::policy::CountWindow;

    /// A successor that notes what it is given.
    fn noting() -> (Successor, Arc<Mutex<Vec<Outcome>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let noted = Arc::clone(&seen);
        let successor: Successor = Arc::new(move |verdict: crate::outcome::Verdict, _| {
            noted.lock().unwrap().push(verdict.outcome());
        });
        (successor, seen)
    }

    #[test]
    fn a_retired_breaker_passes_every_outcome_of_its_generation_on() {
        let shared = shared(CountWindow::new(2, 10));
        let (successor, seen) = noting();
        assert_eq!(mode(&shared), QUIET);
        assert!(Shared::retire_if_idle(&shared, successor));
        assert!(shared.is_retired());
        assert_eq!(mode(&shared), RECORD, "successes take the lock");
        shared.record_closed(0, Outcome::Success.into(), None);
        shared.record_closed(0, Outcome::Failure.into(), None);
        shared.record_closed(0, Outcome::Failure.into(), None);
        shared.record_closed(1, Outcome::Failure.into(), None); // stale
        assert_eq!(
            *seen.lock().unwrap(),
            [Outcome::Success, Outcome::Failure, Outcome::Failure]
        );
        assert_eq!(shared.state(), State::Closed, "nothing counted here");
        assert_eq!(shared.snapshot().counts.failures, 0);
    }

    #[test]
    fn only_an_idle_closed_breaker_retires() {
        let open = shared(CountWindow::new(1, 10));
        open.record_closed(0, Outcome::Failure.into(), None);
        assert_eq!(open.state(), State::Open);
        assert!(!Shared::retire_if_idle(&open, noting().0));
        assert!(!open.is_retired());

        let shadowed = shared(CountWindow::new(1, 10));
        shadowed.set_shadow(true);
        assert!(!Shared::retire_if_idle(&shadowed, noting().0));
        assert!(!shadowed.is_retired());
    }
}
