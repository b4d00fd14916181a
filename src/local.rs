//! Per-clone state and the reference count response futures take on it.
//!
//! A response future may outlive the service that made it, so it must keep
//! the breaker alive. An `Arc` would cost two atomic read-modify-writes per
//! call (clone and drop). Here the count is split: the one service clone that
//! owns a [`Local`] counts the loans it hands out with plain arithmetic
//! (`call` has `&mut self`, so nobody else touches that number), and only a
//! loan's release is atomic. One atomic operation per call, on a cache line
//! private to that clone.
//!
//! The atomic `refs` starts at zero and each released loan subtracts one, so
//! while the owner lives it holds minus the number of loans returned. When
//! the owner drops it adds the number it issued: the result is the number of
//! loans still out. Whoever brings it to zero frees the `Local`: the owner
//! (none out) or the last loan.

use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sync::{fence, AtomicU64, Ordering};

use crate::breaker::clones::CloneCounts;
use crate::breaker::shared::Shared;
use crate::error::Name;

/// What one service clone needs, held privately by that clone.
pub(crate) struct Local<C> {
    pub(crate) shared: Arc<Shared>,
    /// The breaker's name as this clone's rejections carry it, made once: a
    /// short name by value, a long one by reference to a copy of this
    /// clone's own, so that its reference count is on no line another
    /// clone writes.
    pub(crate) name: Name,
    pub(crate) classifier: C,
    refs: AtomicU64,
}

/// The owning side: held by exactly one service clone.
pub(crate) struct Owner<C> {
    ptr: NonNull<Local<C>>,
    issued: u64,
    /// This clone's own call and refusal counts.
    pub(crate) counts: Arc<CloneCounts>,
    slot: usize,
    _owns: PhantomData<Local<C>>,
}

/// A reference held by one response future.
pub(crate) struct Loan<C> {
    ptr: NonNull<Local<C>>,
    _shares: PhantomData<Local<C>>,
}

// SAFETY: both sides only hand out `&Local<C>`, and the last side to go frees
// it, possibly on another thread: `Local<C>` must be `Send` and `Sync`, which
// holds when `C` is (its other fields are).
unsafe impl<C: Send + Sync> Send for Owner<C> {}
// SAFETY: as above; `&Owner` only gives `&Local<C>`.
unsafe impl<C: Send + Sync> Sync for Owner<C> {}
// SAFETY: as above.
unsafe impl<C: Send + Sync> Send for Loan<C> {}
// SAFETY: as above; `&Loan` only gives `&Local<C>`.
unsafe impl<C: Send + Sync> Sync for Loan<C> {}

impl<C> Owner<C> {
    pub(crate) fn new(shared: Arc<Shared>, classifier: C) -> Self {
        let name = Name::new(&Arc::from(&**shared.name()));
        let (counts, slot) = shared.clones().register();
        let local = Box::new(Local {
            shared,
            name,
            classifier,
            refs: AtomicU64::new(0),
        });
        Owner {
            ptr: NonNull::from(Box::leak(local)),
            issued: 0,
            counts,
            slot,
            _owns: PhantomData,
        }
    }

    /// This clone's slot in the breaker's registry of clones.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// How many loans this owner has issued.
    #[cfg(test)]
    pub(crate) fn issued(&self) -> u64 {
        self.issued
    }

    /// A reference for a response future. No atomic operation: only this
    /// owner issues loans, through `&mut self`.
    #[inline(always)]
    pub(crate) fn loan(&mut self) -> Loan<C> {
        self.issued += 1;
        Loan {
            ptr: self.ptr,
            _shares: PhantomData,
        }
    }
}

impl<C> Deref for Owner<C> {
    type Target = Local<C>;

    #[inline(always)]
    fn deref(&self) -> &Local<C> {
        // SAFETY: the `Local` is freed only after this owner has dropped
        // (see the module docs), so it is alive for as long as `self` is.
        unsafe { self.ptr.as_ref() }
    }
}

impl<C> Deref for Loan<C> {
    type Target = Local<C>;

    #[inline(always)]
    fn deref(&self) -> &Local<C> {
        // SAFETY: this loan has not been released yet (that happens in its
        // `drop`), so `refs` cannot have reached zero: the `Local` is alive.
        unsafe { self.ptr.as_ref() }
    }
}

impl<C> Drop for Owner<C> {
    fn drop(&mut self) {
        self.shared.clones().retire(self.slot);
        // `refs` is minus the loans returned so far; adding the number
        // issued gives the loans still out. AcqRel: release this clone's
        // own accesses, and acquire every returned loan's, in case we free.
        let prev = self.refs.fetch_add(self.issued, Ordering::AcqRel);
        if prev.wrapping_add(self.issued) == 0 {
            // SAFETY: the owner is going and no loan is out: nothing else
            // can reach the `Local`, which came from `Box::leak` in `new`.
            drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
        }
    }
}

impl<C> Drop for Loan<C> {
    #[inline(always)]
    fn drop(&mut self) {
        // While the owner lives, `refs` is zero or minus the loans returned,
        // never one (that would need 2^64 - 1 returns), so only a release
        // after the owner has gone can see one: the last loan out.
        if self.refs.fetch_sub(1, Ordering::Release) == 1 {
            self.free();
        }
    }
}

impl<C> Loan<C> {
    /// Frees the `Local`: out of line, so that the common release (the
    /// owner still alive) inlines into the caller.
    #[cold]
    #[inline(never)]
    fn free(&mut self) {
        // Pair with every other release before freeing, as `Arc` does.
        fence(Ordering::Acquire);
        // SAFETY: the owner has dropped and this was the last loan (the
        // caller saw `refs` go from one to zero): nothing else can reach the
        // `Local`, which came from `Box::leak`.
        drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    struct Tracked(Arc<()>);

    fn owner() -> (Owner<Tracked>, Arc<()>) {
        let alive = Arc::new(());
        let shared = Shared::new_arc(Config::default());
        (Owner::new(shared, Tracked(Arc::clone(&alive))), alive)
    }

    #[test]
    fn owner_alone_frees_on_drop() {
        let (owner, alive) = owner();
        drop(owner);
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn leases_returned_before_the_owner_leave_it_to_the_owner() {
        let (mut owner, alive) = owner();
        for _ in 0..3 {
            drop(owner.loan());
        }
        assert_eq!(Arc::strong_count(&alive), 2);
        drop(owner);
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn the_last_lease_out_frees_after_the_owner_is_gone() {
        let (mut owner, alive) = owner();
        let a = owner.loan();
        let b = owner.loan();
        drop(owner.loan());
        drop(owner);
        assert_eq!(Arc::strong_count(&alive), 2, "two loans still out");
        drop(a);
        assert_eq!(Arc::strong_count(&alive), 2, "one loan still out");
        let _ = b.classifier.0.clone();
        drop(b);
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn leases_released_on_other_threads_free_exactly_once() {
        for _ in 0..200 {
            let (mut owner, alive) = owner();
            let loans: Vec<_> = (0..8).map(|_| owner.loan()).collect();
            let threads: Vec<_> = loans
                .into_iter()
                .map(|loan| std::thread::spawn(move || drop(loan)))
                .collect();
            drop(owner);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(Arc::strong_count(&alive), 1);
        }
    }
}
