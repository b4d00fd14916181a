//! Recording outcomes: what a call's result does to the trip policy, from
//! the closed-state success that writes nothing shared, through the tally
//! of successes counted without the lock, to the failure that trips the
//! breaker.

use std::time::Duration;

use tokio::time::Instant;

use super::{Book, Shared, Tag, QUIET, RECORD, TALLY};
use crate::breaker::state::Word;
use crate::events::State;
use crate::millis::millis_up;
use crate::outcome::{Outcome, Verdict};
use crate::policy::{Sample, TripReason};
use crate::sync::Ordering;

impl Shared {
    /// Counts a call dropped before its outcome was known.
    pub(crate) fn count_cancelled(&self) {
        self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the outcome of a call let through without feeding the policy.
    pub(crate) fn count_outcome(&self, outcome: Outcome) {
        match outcome {
            // Held closed by an operator: counted under the lock.
            Outcome::Failure => self.lock().counts.failures += 1,
            Outcome::Ignore => {
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Success => {}
        }
    }

    /// Records the outcome of a call admitted while closed in `generation`;
    /// `timing` is the call's latency and end, when a policy times calls.
    #[inline]
    pub(crate) fn record_closed(
        &self,
        generation: u32,
        verdict: Verdict,
        timing: Option<(Duration, Instant)>,
    ) {
        match verdict.outcome() {
            Outcome::Ignore => {
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Success => {
                let mode = self.hot.success.load(Ordering::Relaxed);
                match (mode, timing) {
                    // The common case: nothing to reset, nothing to write.
                    (QUIET, None) => {}
                    (RECORD, None) => self.record_closed_slow(generation, verdict, None),
                    _ => self.record_success(generation, mode, verdict, timing),
                }
            }
            Outcome::Failure => self.record_closed_slow(generation, verdict, timing),
        }
    }

    /// A closed-state success that a policy may need: recorded under the
    /// lock when it could change a verdict or may be a slow call, tallied
    /// when it only adds a call to a bucket of time, and skipped otherwise.
    fn record_success(
        &self,
        generation: u32,
        mode: u8,
        verdict: Verdict,
        timing: Option<(Duration, Instant)>,
    ) {
        let slow = timing.is_some_and(|(elapsed, _)| {
            elapsed.as_nanos() > u128::from(self.tuning.slow_ns.load(Ordering::Relaxed))
        });
        let skipped = !slow
            && match mode {
                QUIET => true,
                TALLY => self.tally_success(generation, timing),
                _ => false,
            };
        if !skipped {
            self.record_closed_slow(generation, verdict, timing);
        }
    }

    /// Adds a success of closed generation `generation` to the tally; false
    /// when it must be recorded under the lock instead (the breaker has
    /// moved on, which the lock finds stale, or the tally cannot take it).
    fn tally_success(&self, generation: u32, timing: Option<(Duration, Instant)>) -> bool {
        let Some(tally) = self.tally() else {
            return false;
        };
        if self.load() != Word::closed(generation) {
            return false;
        }
        let now = match timing {
            Some((_, end)) => self.ms_at(end),
            None => self.now_ms(),
        };
        tally.add(generation, now)
    }

    /// Folds the tally into the policy, each success at its bucket, when
    /// the breaker (as `w` shows it) is closed in the generation it counted
    /// for; under the lock, first thing. The tally is left disarmed: until
    /// [`Self::arm_tally`], every success takes the lock, so none is
    /// tallied after the policy's verdict could have changed.
    pub(super) fn fold_tally(&self, book: &mut Book, w: Word) {
        if !book.tally_armed {
            return;
        }
        book.tally_armed = false;
        let Some(tally) = self.tally() else {
            return;
        };
        let closed = (w.tag() == Tag::Closed).then(|| w.generation());
        for drained in tally.drain() {
            if closed.is_some_and(|generation| drained.counts_for(generation)) {
                book.policy
                    .add_successes(drained.count, drained.end_ms.saturating_sub(1));
            }
        }
    }

    /// Arms the tally for the successes of closed word `w` made before the
    /// end of the bucket `now` falls in, when successes are to be tallied
    /// (the flag is up to date); under the lock, last thing.
    pub(super) fn arm_tally(&self, book: &mut Book, w: Word, now: u64) {
        if self.hot.success.load(Ordering::Relaxed) != TALLY || w.tag() != Tag::Closed {
            return;
        }
        let (Some(tally), Some(end_ms)) = (self.tally(), book.policy.tally_end(now)) else {
            return;
        };
        book.tally_armed = tally.arm(w.generation(), end_ms);
    }

    /// Forgets the tally, disarmed.
    pub(super) fn discard_tally(&self, book: &mut Book) {
        if std::mem::take(&mut book.tally_armed) {
            if let Some(tally) = self.tally() {
                tally.drain();
            }
        }
    }

    /// The policy starts afresh, and forgets the successes tallied for it.
    pub(super) fn reset_policy(&self, book: &mut Book) {
        book.policy.reset();
        self.discard_tally(book);
    }

    #[cold]
    fn record_closed_slow(
        &self,
        generation: u32,
        verdict: Verdict,
        timing: Option<(Duration, Instant)>,
    ) {
        let failure = verdict.outcome() == Outcome::Failure;
        let hint = verdict.retry_after();
        let mut book = self.lock();
        let w = self.load();
        if w != Word::closed(generation) {
            book.counts.stale += 1;
            return;
        }
        if let Some(successor) = book.successor.clone() {
            // Superseded: the call counts in the breaker that took this
            // one's place (outside this lock: reaching it may take its
            // keeper's).
            drop(book);
            successor(verdict, timing);
            return;
        }
        // A success only needs the time when a policy keeps time windows;
        // resetting a streak or moving a count window does not.
        let (elapsed, now) = match timing {
            Some((elapsed, end)) => (Some(elapsed), self.ms_at(end)),
            None if failure || self.tuning.needs_clock.load(Ordering::Relaxed) => {
                (None, self.now_ms())
            }
            None => (None, 0),
        };
        // The successes tallied so far come first, each in its own bucket.
        self.fold_tally(&mut book, w);
        if failure {
            book.counts.failures += 1;
            self.note_hint(&mut book, hint, now);
        }
        let class = verdict.class().filter(|_| failure);
        let verdict = book.policy.record(
            Sample {
                failure,
                class,
                elapsed,
            },
            now,
        );
        self.fleet_outcome(&mut book, failure);
        // An upstream that announced when to come back is not worth the
        // rest of the threshold, when so configured; nor is one whose quota
        // is spent until a reset beyond `max_open`, when holds are.
        let c = &book.config;
        let pushback = match hint {
            Some(hint) if failure && (c.trip_on_pushback() || book.quota_until_ms > now) => {
                Some(TripReason::Pushback {
                    retry_after: hint.min(c.max_quota_hold().unwrap_or(c.max_open())),
                })
            }
            _ => None,
        };
        let Some(reason) = verdict.or(pushback) else {
            self.refresh_success_flag(&book);
            self.arm_tally(&mut book, w, now);
            return;
        };
        let until = self.open_until(&mut book, now);
        let next = Word::open(w.next_generation(), until);
        // Under the lock nothing else changes a closed word, but stay correct
        // if that ever stops being true: a lost race means the call is stale.
        if self.cas(w, next).is_err() {
            book.counts.stale += 1;
            self.refresh_success_flag(&book);
            return;
        }
        self.reset_policy(&mut book);
        self.refresh_success_flag(&book);
        self.fleet_opened(&mut book, until.saturating_sub(now));
        self.opened(book, State::Closed, next, reason, now);
    }

    pub(super) fn refresh_success_flag(&self, book: &Book) {
        // A superseded breaker passes every success on, and a fleet count
        // known to hold failures is reset by one.
        let passes_on = book.successor.is_some() || book.fleet.failures;
        let mode = super::success_mode(&book.policy, book.tallies, passes_on);
        // Write only on change: the flag shares a line with the state word.
        if self.hot.success.load(Ordering::Relaxed) != mode {
            self.hot.success.store(mode, Ordering::Relaxed);
        }
    }

    pub(super) fn note_hint(&self, book: &mut Book, hint: Option<Duration>, now: u64) {
        if let Some(hint) = hint {
            let max_open = book.config.max_open();
            let capped = millis_up(hint.min(max_open));
            let until = now.saturating_add(capped);
            book.hint_until_ms = Some(book.hint_until_ms.map_or(until, |u| u.max(until)));
            // A quota's reset, beyond any congestion: held for, up to the
            // ceiling, probed at the hold's own interval.
            if let Some(hold) = book.config.max_quota_hold().filter(|_| hint > max_open) {
                let until = now.saturating_add(millis_up(hint.min(hold)));
                book.quota_until_ms = book.quota_until_ms.max(until);
            }
        }
    }

    /// Whether successes are recorded or tallied: the policy holds figures
    /// worth keeping. False while successes are skipped (no failure in a
    /// streak or a count window, a window of calls all fast): a closed
    /// breaker with nothing to forget is the cheapest to evict.
    pub(crate) fn holds_failures(&self) -> bool {
        !self.success_is_quiet()
    }

    /// Whether a closed-state success that needs no time changes nothing.
    #[inline]
    pub(crate) fn success_is_quiet(&self) -> bool {
        self.hot.success.load(Ordering::Relaxed) == QUIET
    }
}

#[cfg(all(test, not(tcb_loom)))]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::test_support::{mode, shared};
    use super::super::{QUIET, RECORD, TALLY};
    use crate::outcome::Outcome;
    use crate::policy::{CountWindow, SlowCalls, TimeWindow, TripPolicy};

    #[test]
    fn time_window_successes_go_to_the_tally_not_the_lock() {
        let shared = shared(TimeWindow::new(Duration::from_secs(3_600)));
        assert_eq!(mode(&shared), TALLY);
        for _ in 0..10 {
            shared.record_closed(0, Outcome::Success.into(), None);
        }
        // The first took the lock, which armed the tally for the rest.
        assert_eq!(shared.tally().unwrap().drain_total(), 9);
    }

    #[test]
    fn a_time_window_near_its_rate_records_successes_at_once() {
        let shared = shared(
            TimeWindow::new(Duration::from_secs(3_600))
                .min_calls(4)
                .failure_rate(0.5),
        );
        shared.record_closed(0, Outcome::Failure.into(), None);
        assert_eq!(mode(&shared), TALLY, "1 failure in 4 calls would not trip");
        shared.record_closed(0, Outcome::Failure.into(), None);
        assert_eq!(mode(&shared), RECORD, "2 failures in 4 calls would");
        shared.record_closed(0, Outcome::Success.into(), None);
        assert_eq!(shared.tally().unwrap().drain_total(), 0, "nothing tallied");
        assert_eq!(
            shared.snapshot().policy,
            crate::policy::PolicyFigures::TimeWindow(crate::policy::TimeWindowFigures {
                calls: 3,
                failures: 2
            }),
            "the success recorded under the lock"
        );
    }

    #[test]
    fn slow_calls_over_calls_skip_fast_successes_once_the_window_is_full_and_fast() {
        let shared = shared(
            SlowCalls::new(Duration::from_secs(1))
                .over_calls(3)
                .min_calls(3),
        );
        let fast = Some((Duration::from_millis(10), Instant::now()));
        for _ in 0..2 {
            shared.record_closed(0, Outcome::Success.into(), fast);
            assert_eq!(mode(&shared), RECORD, "the window is still filling");
        }
        shared.record_closed(0, Outcome::Success.into(), fast);
        assert_eq!(mode(&shared), QUIET);
        assert!(
            shared.tally().is_none(),
            "a window of calls tallies nothing"
        );
    }

    #[test]
    fn policies_without_time_windows_never_tally() {
        let shared = shared(CountWindow::new(2, 5));
        assert_eq!(mode(&shared), QUIET);
        assert!(shared.tally().is_none());
    }

    #[test]
    fn a_time_window_beside_an_adaptive_policy_never_tallies() {
        let shared = shared(TripPolicy::any_of([
            TimeWindow::new(Duration::from_secs(10)).into(),
            crate::policy::Adaptive::new().into(),
        ]));
        assert_eq!(
            mode(&shared),
            RECORD,
            "the adaptive policy learns from every success"
        );
        assert!(shared.tally().is_none(), "no tally made for nothing");
    }
}
