//! Durations in whole milliseconds, as the state word, the Redis store and
//! serialized snapshots hold them; both saturate at `u64::MAX`. And
//! [`Stamp`], an optional instant in one word, as a response future holds
//! the start of the call it times.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// An optional instant in eight bytes (an `Option<Instant>` takes sixteen):
/// signed nanoseconds from a base taken on the first use, `i64::MIN` for
/// none. Any instant within 292 years of the base fits, before it too (a
/// paused clock of a runtime made earlier may read less than the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(i64);

fn base() -> Instant {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    Instant::from_std(*BASE.get_or_init(std::time::Instant::now))
}

impl Stamp {
    /// No instant.
    pub(crate) const NONE: Stamp = Stamp(i64::MIN);

    /// The instant `at`, or none.
    #[inline]
    pub(crate) fn of(at: Option<Instant>) -> Stamp {
        let Some(at) = at else {
            return Stamp::NONE;
        };
        let base = base();
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        if at >= base {
            Stamp(nanos(at - base))
        } else {
            Stamp(nanos(base - at).saturating_neg().max(i64::MIN + 1))
        }
    }

    /// The instant, if there is one.
    #[inline]
    pub(crate) fn get(self) -> Option<Instant> {
        if self == Stamp::NONE {
            return None;
        }
        let base = base();
        let offset = Duration::from_nanos(self.0.unsigned_abs());
        if self.0 >= 0 {
            base.checked_add(offset)
        } else {
            base.checked_sub(offset)
        }
    }
}

/// Whole milliseconds, rounded down (a time already spent).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whole milliseconds, rounded up: whoever waits this long does not come
/// back a fraction of a millisecond too early.
pub(crate) fn millis_up(d: Duration) -> u64 {
    let ms = millis(d);
    if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_gives_back_its_instant_on_either_side_of_the_base() {
        assert_eq!(Stamp::of(None).get(), None);
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_secs(3600),
            base() - Duration::from_millis(1500),
            base() - Duration::from_nanos(1),
            base(),
        ] {
            assert_eq!(Stamp::of(Some(at)).get(), Some(at), "{at:?}");
        }
        assert_eq!(std::mem::size_of::<Stamp>(), 8);
    }

    #[test]
    fn waits_round_up_and_time_spent_rounds_down() {
        assert_eq!(millis_up(Duration::from_micros(1)), 1);
        assert_eq!(millis_up(Duration::from_millis(7)), 7);
        assert_eq!(millis(Duration::from_micros(7_900)), 7);
        assert_eq!(millis_up(Duration::MAX), u64::MAX);
    }
}
