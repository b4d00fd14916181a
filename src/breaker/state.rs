//! The state word: one `u64` that holds the state, the generation and the
//! state's payload, so that every transition is a single compare-and-swap.
//!
//! Layout, from the most significant bit:
//!
//! | bits  | field |
//! | ----- | ----- |
//! | 62-63 | tag: closed, open, half-open or manual |
//! | 40-61 | generation (22 bits, wraps) |
//! | 0-39  | open: the end of the open period, in milliseconds since the breaker's epoch; half-open: probes in flight (bits 20-39) and probe successes (bits 0-19); manual: the mode an operator set |
//!
//! The generation wraps after 2^22 (about four million) transitions; a call
//! would have to stay in flight across all of them for its outcome to be
//! mistaken for a current one.
//!
//! Packing the end of the open period into the word means a reader that sees
//! `Open` also sees when it ends: there is no window in which the state is
//! published but its deadline is not.

use std::fmt;

const TAG_SHIFT: u32 = 62;
const GEN_SHIFT: u32 = 40;
const GEN_MASK: u64 = (1 << 22) - 1;
const PAYLOAD_MASK: u64 = (1 << 40) - 1;
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

// The config bounds the half-open counters (probes in flight, probe
// successes) by what they can hold.
const _: () = assert!(crate::config::MAX_COUNT as u64 == COUNT_MASK);

/// The latest representable deadline, in milliseconds since the epoch.
pub(crate) const MAX_DEADLINE_MS: u64 = PAYLOAD_MASK;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    Closed,
    Open,
    HalfOpen,
    /// Held in a mode an operator chose, until restored.
    Manual,
}

/// The modes an operator can hold a breaker in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Manual {
    /// Refuses everything, whatever the clock says.
    Isolated = 1,
    /// Admits everything; outcomes are counted but never trip it.
    ForcedClosed = 2,
    /// Admits everything and records nothing.
    Disabled = 3,
}

/// A decoded view of the state word. Copy it, inspect it, build the next one,
/// and publish it with a compare-and-swap against the value it was read from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    pub(crate) const fn closed(generation: u32) -> Self {
        Word(((generation as u64) & GEN_MASK) << GEN_SHIFT)
    }

    pub(crate) fn open(generation: u32, until_ms: u64) -> Self {
        Word(
            (1 << TAG_SHIFT)
                | (((generation as u64) & GEN_MASK) << GEN_SHIFT)
                | until_ms.min(MAX_DEADLINE_MS),
        )
    }

    pub(crate) fn half_open(generation: u32, in_flight: u32, successes: u32) -> Self {
        let in_flight = (in_flight as u64).min(COUNT_MASK);
        let successes = (successes as u64).min(COUNT_MASK);
        Word(
            (2 << TAG_SHIFT)
                | (((generation as u64) & GEN_MASK) << GEN_SHIFT)
                | (in_flight << COUNT_BITS)
                | successes,
        )
    }

    pub(crate) fn manual(generation: u32, mode: Manual) -> Self {
        Word((3 << TAG_SHIFT) | (((generation as u64) & GEN_MASK) << GEN_SHIFT) | mode as u64)
    }

    pub(crate) fn tag(self) -> Tag {
        match self.0 >> TAG_SHIFT {
            0 => Tag::Closed,
            1 => Tag::Open,
            2 => Tag::HalfOpen,
            _ => Tag::Manual,
        }
    }

    /// The operator's mode (only meaningful when the tag is `Manual`).
    pub(crate) fn manual_mode(self) -> Manual {
        match self.0 & PAYLOAD_MASK {
            1 => Manual::Isolated,
            2 => Manual::ForcedClosed,
            // Only the three modes are ever written.
            _ => Manual::Disabled,
        }
    }

    pub(crate) fn generation(self) -> u32 {
        ((self.0 >> GEN_SHIFT) & GEN_MASK) as u32
    }

    /// The generation a transition out of this word moves to.
    pub(crate) fn next_generation(self) -> u32 {
        ((self.generation() as u64 + 1) & GEN_MASK) as u32
    }

    /// End of the open period (only meaningful when the tag is `Open`).
    pub(crate) fn open_until_ms(self) -> u64 {
        self.0 & PAYLOAD_MASK
    }

    /// Probes in flight (only meaningful when the tag is `HalfOpen`).
    pub(crate) fn in_flight(self) -> u32 {
        ((self.0 >> COUNT_BITS) & COUNT_MASK) as u32
    }

    /// Probe successes so far (only meaningful when the tag is `HalfOpen`).
    pub(crate) fn successes(self) -> u32 {
        (self.0 & COUNT_MASK) as u32
    }
}

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Word");
        s.field("tag", &self.tag())
            .field("generation", &self.generation());
        match self.tag() {
            Tag::Closed => {}
            Tag::Open => {
                s.field("open_until_ms", &self.open_until_ms());
            }
            Tag::HalfOpen => {
                s.field("in_flight", &self.in_flight())
                    .field("successes", &self.successes());
            }
            Tag::Manual => {
                s.field("mode", &self.manual_mode());
            }
        }
        s.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let w = Word::open(7, 123_456);
        assert_eq!(w.tag(), Tag::Open);
        assert_eq!(w.generation(), 7);
        assert_eq!(w.open_until_ms(), 123_456);

        let w = Word::half_open(9, 3, 2);
        assert_eq!(w.tag(), Tag::HalfOpen);
        assert_eq!(w.generation(), 9);
        assert_eq!((w.in_flight(), w.successes()), (3, 2));

        let w = Word::closed(11);
        assert_eq!(w.tag(), Tag::Closed);
        assert_eq!(w.generation(), 11);

        for mode in [Manual::Isolated, Manual::ForcedClosed, Manual::Disabled] {
            let w = Word::manual(13, mode);
            assert_eq!(w.tag(), Tag::Manual);
            assert_eq!(w.generation(), 13);
            assert_eq!(w.manual_mode(), mode);
        }
    }

    #[test]
    fn generation_wraps_without_touching_the_tag() {
        let w = Word::open(GEN_MASK as u32, 5);
        assert_eq!(w.next_generation(), 0);
        assert_eq!(Word::closed(w.next_generation()).tag(), Tag::Closed);
    }

    #[test]
    fn deadline_saturates_instead_of_spilling_into_the_generation() {
        let w = Word::open(1, u64::MAX);
        assert_eq!(w.generation(), 1);
        assert_eq!(w.open_until_ms(), MAX_DEADLINE_MS);
    }
}
