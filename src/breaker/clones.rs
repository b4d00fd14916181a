//! Every service clone of one breaker: the counts it keeps for itself, and,
//! in gate mode, the waker of a clone waiting for the breaker to let it in.

use std::sync::Arc;

use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use std::task::Waker;

/// Counts one service clone keeps for itself. Only that clone writes them,
/// from `call` (which has `&mut self`), so an increment is a load and a
/// store rather than a read-modify-write, on a line no other clone writes.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct CloneCounts {
    admitted: AtomicU64,
    rejected: AtomicU64,
    by_parent: AtomicU64,
}

impl CloneCounts {
    #[inline]
    pub(crate) fn admitted(&self) {
        bump(&self.admitted);
    }

    #[inline]
    pub(crate) fn rejected(&self) {
        bump(&self.rejected);
    }

    /// A refusal made by the breaker's parent, for this breaker's call.
    #[inline]
    pub(crate) fn rejected_by_parent(&self) {
        bump(&self.rejected);
        bump(&self.by_parent);
    }
}

/// Increments a counter that has a single writer.
#[inline]
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

struct Entry {
    counts: Arc<CloneCounts>,
    /// Set while a gate-mode clone waits; taken when the breaker changes.
    waker: Option<Waker>,
}

#[derive(Default)]
struct Roster {
    live: Vec<Option<Entry>>,
    free: Vec<usize>,
    /// Counts of clones already dropped.
    retired_admitted: u64,
    retired_rejected: u64,
    retired_by_parent: u64,
}

/// The live clones of one breaker.
#[derive(Default)]
pub(crate) struct Clones {
    roster: Mutex<Roster>,
}

impl Clones {
    fn lock(&self) -> MutexGuard<'_, Roster> {
        // Never held across user code: a poisoned lock means a bug here.
        self.roster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new clone; returns its counts and its slot.
    pub(crate) fn register(&self) -> (Arc<CloneCounts>, usize) {
        let counts = Arc::new(CloneCounts::default());
        let entry = Entry {
            counts: Arc::clone(&counts),
            waker: None,
        };
        let mut roster = self.lock();
        let slot = match roster.free.pop() {
            Some(slot) => {
                roster.live[slot] = Some(entry);
                slot
            }
            None => {
                roster.live.push(Some(entry));
                roster.live.len() - 1
            }
        };
        (counts, slot)
    }

    /// A clone is going: fold its counts into the totals.
    pub(crate) fn retire(&self, slot: usize) {
        let mut roster = self.lock();
        if let Some(entry) = roster.live.get_mut(slot).and_then(Option::take) {
            roster.retired_admitted += entry.counts.admitted.load(Ordering::Relaxed);
            roster.retired_rejected += entry.counts.rejected.load(Ordering::Relaxed);
            roster.retired_by_parent += entry.counts.by_parent.load(Ordering::Relaxed);
            roster.free.push(slot);
        }
    }

    /// Calls admitted, refused, and refused by the parent, over live and
    /// retired clones.
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        let roster = self.lock();
        roster.live.iter().flatten().fold(
            (
                roster.retired_admitted,
                roster.retired_rejected,
                roster.retired_by_parent,
            ),
            |(admitted, rejected, by_parent), entry| {
                (
                    admitted + entry.counts.admitted.load(Ordering::Relaxed),
                    rejected + entry.counts.rejected.load(Ordering::Relaxed),
                    by_parent + entry.counts.by_parent.load(Ordering::Relaxed),
                )
            },
        )
    }

    /// Wakes `waker` at the next change of the breaker. The caller must look
    /// at the state again after this returns: a change made before it was
    /// registered does not wake it.
    pub(crate) fn wait(&self, slot: usize, waker: &Waker) {
        let mut roster = self.lock();
        if let Some(Some(entry)) = roster.live.get_mut(slot) {
            match &entry.waker {
                Some(existing) if existing.will_wake(waker) => {}
                _ => entry.waker = Some(waker.clone()),
            }
        }
    }

    /// Wakes every waiting clone. Wakers run after the lock is released: a
    /// waker may poll the service at once, which would take it again.
    pub(crate) fn wake_all(&self) {
        let wakers: Vec<Waker> = {
            let mut roster = self.lock();
            roster
                .live
                .iter_mut()
                .flatten()
                .filter_map(|entry| entry.waker.take())
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Clones {
    /// The breaker is gone. A service clone holds its breaker, so whatever
    /// still waits here holds it only weakly (an active probe task): woken,
    /// it finds the breaker gone and ends, rather than sleeping out the
    /// open period with the user's probe service.
    fn drop(&mut self) {
        self.wake_all();
    }
}
