//! Durations in whole milliseconds, as the state word, the Redis store and
//! serialized snapshots hold them; both saturate at `u64::MAX`.

use std::time::Duration;

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
    fn waits_round_up_and_time_spent_rounds_down() {
        assert_eq!(millis_up(Duration::from_micros(1)), 1);
        assert_eq!(millis_up(Duration::from_millis(7)), 7);
        assert_eq!(millis(Duration::from_micros(7_900)), 7);
        assert_eq!(millis_up(Duration::MAX), u64::MAX);
    }
}
