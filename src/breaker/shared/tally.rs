//! Successes counted without the breaker's lock, for policies that count
//! calls in buckets of time (time windows, slow calls over time).
//!
//! Such a policy needs every success as a call, but a success can trip it
//! only when the failures held are already near the rate; the rest of the
//! time a success merely adds one to the calls of the bucket it falls in.
//! Those successes go to a tally instead of the lock: a few words, each on a
//! cache line of its own. Each thread takes a word the first time it
//! tallies, in turn with every other thread of the process, so threads that
//! took their turns one after another (two threads started together, four
//! workers of a runtime) write lines of their own; threads that share a
//! word lose nothing.
//!
//! A word counts successes of one closed generation made before the end of
//! one bucket. Whoever takes the lock to record an outcome, or to read the
//! policy's figures, first drains every word, adding each count to the
//! policy at the end of the word's bucket: the bucket of the success's own
//! time, or, for a success whose clock read came just before the word was
//! armed for a later bucket, that later one, where recording it under the
//! lock would have put it too. The words stay disarmed (every success then
//! takes the lock)
//! until that lock holder, done, re-arms them when successes are still to be
//! tallied. A success is thus tallied only while no success could change
//! the verdict, and is in the policy before any later outcome is judged.
//!
//! A word holds the end of its bucket (40 bits of milliseconds since the
//! breaker's epoch), the low 8 bits of the closed generation it counts for,
//! and the count (16 bits). A success adds one with a compare-and-swap, and
//! only to a word armed for its generation whose bucket has not ended and
//! whose count is not full: otherwise it takes the lock. Any change to the
//! word between the check and the swap makes the swap fail. Every change of
//! generation or reset of the policy discards the words, so a success of a
//! generation the breaker has left is not counted (short of a thread held
//! up between its check and its swap while the breaker goes through 256
//! generations and the word comes back to the very value it read).

use std::cell::Cell;

use crate::sync::{AtomicU64, Ordering};

/// Words per breaker: one per thread for up to this many threads.
pub(super) const STRIPES: usize = 4;

const COUNT_BITS: u32 = 16;
const GENERATION_BITS: u32 = 8;
const END_SHIFT: u32 = COUNT_BITS + GENERATION_BITS;
const COUNT_FULL: u64 = (1 << COUNT_BITS) - 1;
/// Bucket ends beyond this (34 years after the breaker was made) are not
/// tallied: every success is then recorded under the lock.
const MAX_END_MS: u64 = (1 << (64 - END_SHIFT)) - 1;

#[repr(align(128))]
struct Line(AtomicU64);

/// The tally of one breaker.
pub(super) struct Tally {
    lines: [Line; STRIPES],
}

/// What a word held when it was drained: `count` successes made before
/// `end_ms`, in closed generation `generation` (its low 8 bits).
pub(super) struct Drained {
    pub(super) count: u32,
    pub(super) end_ms: u64,
    generation: u8,
}

impl Drained {
    /// Whether these successes belong to closed generation `generation`.
    pub(super) fn counts_for(&self, generation: u32) -> bool {
        self.count > 0 && self.generation == generation as u8
    }
}

impl Tally {
    pub(super) fn new() -> Self {
        Tally {
            lines: std::array::from_fn(|_| Line(AtomicU64::new(0))),
        }
    }

    /// Counts one success made at `now_ms` in closed generation
    /// `generation`. False when this thread's word cannot take it (not armed
    /// for that generation, its bucket ended, or full): record it under the
    /// lock, which drains every word and re-arms them.
    #[inline]
    pub(super) fn add(&self, generation: u32, now_ms: u64) -> bool {
        let line = &self.lines[stripe()].0;
        let mut word = line.load(Ordering::Relaxed);
        loop {
            if now_ms >= word >> END_SHIFT
                || (word >> COUNT_BITS) as u8 != generation as u8
                || word & COUNT_FULL == COUNT_FULL
            {
                return false;
            }
            // Relaxed: the count is only ever read by a swap on this same
            // word, which sees every increment before it.
            match line.compare_exchange_weak(word, word + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
    }

    /// Empties and disarms every word, and returns what they held: from
    /// now on no success is added until the tally is armed again.
    pub(super) fn drain(&self) -> [Drained; STRIPES] {
        std::array::from_fn(|i| {
            let word = self.lines[i].0.swap(0, Ordering::Relaxed);
            Drained {
                count: (word & COUNT_FULL) as u32,
                end_ms: word >> END_SHIFT,
                generation: (word >> COUNT_BITS) as u8,
            }
        })
    }

    /// Drains every word; the successes they held, whatever their bucket
    /// or generation.
    #[cfg(test)]
    pub(super) fn drain_total(&self) -> u32 {
        self.drain().iter().map(|d| d.count).sum()
    }

    /// Arms every word, drained before, for the successes of closed
    /// generation `generation` made before `end_ms`. False (nothing armed)
    /// when `end_ms` does not fit a word.
    pub(super) fn arm(&self, generation: u32, end_ms: u64) -> bool {
        if end_ms > MAX_END_MS {
            return false;
        }
        let armed = end_ms << END_SHIFT | u64::from(generation as u8) << COUNT_BITS;
        for line in &self.lines {
            // Drained words take no success: nothing to lose by a store.
            line.0.store(armed, Ordering::Relaxed);
        }
        true
    }
}

/// This thread's word. Threads take the words in turn, the first time they
/// record a success into any tally.
#[inline]
fn stripe() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| match stripe.get() {
        usize::MAX => {
            let next = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            stripe.set(next);
            next
        }
        known => known,
    })
}

#[cfg(all(test, not(tcb_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_only_for_the_armed_generation_and_bucket() {
        let tally = Tally::new();
        assert!(!tally.add(1, 0), "a word not armed takes nothing");
        assert!(tally.arm(1, 1_000));
        assert!(tally.add(1, 999));
        assert!(tally.add(257, 999), "the generation's low 8 bits match");
        assert!(!tally.add(2, 999), "another generation");
        assert!(!tally.add(1, 1_000), "the bucket has ended");
        let drained = tally.drain();
        let held: Vec<_> = drained.iter().filter(|d| d.counts_for(1)).collect();
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].count, held[0].end_ms), (2, 1_000));
        assert!(!tally.add(1, 0), "drained with no arming: takes nothing");
    }

    #[test]
    fn a_full_word_sends_successes_to_the_lock() {
        let tally = Tally::new();
        assert!(tally.arm(3, 50));
        for _ in 0..COUNT_FULL {
            assert!(tally.add(3, 10));
        }
        assert!(!tally.add(3, 10));
        assert_eq!(tally.drain_total(), COUNT_FULL as u32);
    }

    #[test]
    fn an_end_past_the_word_arms_nothing() {
        let tally = Tally::new();
        assert!(!tally.arm(0, MAX_END_MS + 1));
        assert!(!tally.add(0, 0));
    }

    #[test]
    fn threads_adding_at_once_lose_no_success() {
        let tally = Tally::new();
        assert!(tally.arm(7, 10_000));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        assert!(tally.add(7, 5));
                    }
                });
            }
        });
        assert_eq!(tally.drain_total(), 40_000);
    }
}
