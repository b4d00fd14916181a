//! Superseding: a breaker whose place another takes hands the outcomes of
//! the calls it admitted on to that one; and the two words its keeper
//! (whoever keeps it in a collection: a registry) may use on its first
//! line. The core knows nothing of why: the keeper decides when a breaker
//! may be superseded, and by what.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Shared, Successor, Tag};
use crate::outcome::Verdict;
use crate::sync::{AtomicU64, Ordering};

impl Shared {
    /// A word its keeper may use as it likes (a registry keeps the mark of
    /// its last use there): on the breaker's first line, which a lookup
    /// reads anyway, and written by nothing else.
    #[inline]
    pub(crate) fn keeper_mark(&self) -> &AtomicU64 {
        &self.counters.keeper_mark
    }

    /// Its keeper's services take (`true`) or drop a handle on it that does
    /// not count as a user's (see [`Self::keeper_handles`]). Taken after the
    /// handle is made and dropped before it goes, so that the count never
    /// exceeds such handles and the breaker at worst reads as held.
    pub(crate) fn note_keeper_handle(&self, taken: bool) {
        let count = &self.counters.keeper_handles;
        if taken {
            count.fetch_add(1, Ordering::AcqRel);
        } else {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The handles on it its keeper's services keep for themselves: every
    /// other handle but the keeper's own is a user's.
    pub(crate) fn keeper_handles(&self) -> u64 {
        self.counters.keeper_handles.load(Ordering::Acquire)
    }

    /// Whether nothing of its own would be lost if another breaker took its
    /// place: closed, not in shadow mode, not probing actively (settings a
    /// new breaker would not have).
    pub(crate) fn is_idle(&self) -> bool {
        self.load().tag() == Tag::Closed
            && !self.hot.shadow.load(Ordering::Relaxed)
            && self.prober().is_none()
    }

    /// Has `successor` take this breaker's place if it is idle and `may`
    /// agrees, both asked under the lock that every transition holds, so
    /// that a breaker that trips meanwhile is not superseded. Handles that
    /// keep it see [`Self::is_superseded`], and the outcomes of calls it
    /// admitted go to `successor`: every success takes the lock from now on
    /// to be passed on.
    pub(crate) fn supersede_if(
        this: &Arc<Self>,
        successor: Successor,
        may: impl FnOnce(&Arc<Self>) -> bool,
    ) -> bool {
        let mut book = this.lock();
        if !(this.is_idle() && may(this)) {
            return false;
        }
        book.successor = Some(successor);
        this.refresh_success_flag(&book);
        this.hot.superseded.store(true, Ordering::Release);
        true
    }

    /// Records the outcome of a call a superseded breaker admitted, in the
    /// current closed generation; dropped if not closed.
    pub(crate) fn record_passed_on(&self, verdict: Verdict, timing: Option<(Duration, Instant)>) {
        let w = self.load();
        if w.tag() == Tag::Closed {
            self.record_closed(w.generation(), verdict, timing);
        }
    }

    /// Whether another breaker has taken its place.
    #[inline]
    pub(crate) fn is_superseded(&self) -> bool {
        self.hot.superseded.load(Ordering::Acquire)
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
    fn a_superseded_breaker_passes_every_outcome_of_its_generation_on() {
        let shared = shared(CountWindow::new(2, 10));
        let (successor, seen) = noting();
        assert_eq!(mode(&shared), QUIET);
        assert!(Shared::supersede_if(&shared, successor, |_| true));
        assert!(shared.is_superseded());
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
    fn only_an_idle_closed_breaker_is_superseded() {
        let open = shared(CountWindow::new(1, 10));
        open.record_closed(0, Outcome::Failure.into(), None);
        assert_eq!(open.state(), State::Open);
        assert!(!Shared::supersede_if(&open, noting().0, |_| true));
        assert!(!open.is_superseded());

        let shadowed = shared(CountWindow::new(1, 10));
        shadowed.set_shadow(true);
        assert!(!Shared::supersede_if(&shadowed, noting().0, |_| true));
        assert!(!shadowed.is_superseded());

        // Idle, but its keeper says no.
        let kept = shared(CountWindow::new(1, 10));
        assert!(!Shared::supersede_if(&kept, noting().0, |_| false));
        assert!(!kept.is_superseded());
        assert_eq!(mode(&kept), QUIET, "successes still skip the lock");
    }
}
