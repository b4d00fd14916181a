//! The bench's global allocator: the system's, counting only while the
//! thread that allocates asks it to.
//!
//! Counting is switched per thread ([`counting`]): a flag and three
//! counters in a thread-local, read by every allocation and written only
//! while the flag is up. A timed loop therefore pays one read of its own
//! thread's flag per allocation, and shares nothing with other threads: no
//! global counter, no atomic read-modify-write. Only the passes that report
//! allocations (run apart from the timed rounds) and the memory report turn
//! it on, and they count the allocations of the thread that runs them
//! alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// What was allocated and freed while counting.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Allocations and reallocations.
    pub allocations: u64,
    /// Bytes asked for (a reallocation counts its new size).
    pub allocated: u64,
    /// Bytes handed back (a reallocation counts its old size).
    pub freed: u64,
}

impl Tally {
    /// Bytes still held: asked for minus handed back. The sizes are those
    /// requested; the allocator's own rounding and bookkeeping come on top.
    pub fn retained(&self) -> i64 {
        self.allocated as i64 - self.freed as i64
    }
}

/// The counting state of one thread.
struct Counter {
    on: Cell<bool>,
    allocations: Cell<u64>,
    allocated: Cell<u64>,
    freed: Cell<u64>,
}

thread_local! {
    // A `const` initialiser and no destructor: reading it neither allocates
    // nor registers anything, so the allocator can use it.
    static COUNTER: Counter = const {
        Counter {
            on: Cell::new(false),
            allocations: Cell::new(0),
            allocated: Cell::new(0),
            freed: Cell::new(0),
        }
    };
}

/// Runs `f` with counting on for this thread, and returns what it
/// allocated and freed.
pub fn counting<T>(f: impl FnOnce() -> T) -> (T, Tally) {
    let before = COUNTER.with(|c| c.on.replace(true));
    let start = tally();
    let output = f();
    let end = tally();
    COUNTER.with(|c| c.on.set(before));
    let spent = Tally {
        allocations: end.allocations - start.allocations,
        allocated: end.allocated - start.allocated,
        freed: end.freed - start.freed,
    };
    (output, spent)
}

fn tally() -> Tally {
    COUNTER.with(|c| Tally {
        allocations: c.allocations.get(),
        allocated: c.allocated.get(),
        freed: c.freed.get(),
    })
}

#[inline(always)]
fn note(allocated: usize, freed: usize, allocations: u64) {
    // `try_with`: never panic inside the allocator, even on a thread whose
    // thread-locals are being torn down (this one has no destructor, so it
    // is always there).
    let _ = COUNTER.try_with(|c| {
        if c.on.get() {
            c.allocations.set(c.allocations.get() + allocations);
            c.allocated.set(c.allocated.get() + allocated as u64);
            c.freed.set(c.freed.get() + freed as u64);
        }
    });
}

pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counting touches only this thread's `Cell`s, never the
// memory handed out, and allocates nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 0, 1);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 0, 1);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, layout.size(), 0);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size, layout.size(), 1);
        System.realloc(ptr, layout, new_size)
    }
}
