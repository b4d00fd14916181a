//! Signals from outside any call: code that saw the dependency struggle
//! somewhere else asks the breaker to open ([`Shared::trip`]), or reports
//! an outcome it observed without a call of the breaker's
//! ([`Shared::record_outside`]). Both take the breaker's own paths: an
//! opening is a transition like a policy's (event, backoff, half-open
//! probes, fleet sharing), and an outcome feeds the policy like a call's.

use std::time::Duration;

use super::Shared;
use crate::breaker::state::{Manual, Tag, Word};
use crate::breaker::Recorded;
use crate::events::State;
use crate::millis::millis_up;
use crate::outcome::Verdict;
use crate::policy::TripReason;
use crate::sync::Ordering;

impl Shared {
    /// Opens the breaker for `reason`: closed, for its first open period;
    /// half-open (or open with the period ended), as a failed probe round
    /// does, with backoff; open, it stays open, the period lengthened when
    /// `retry_after` reaches past its end. Never for less than
    /// `retry_after` (capped by `max_open`). An operator's hold is left
    /// alone. Returns whether the breaker changed.
    pub(crate) fn trip(&self, reason: TripReason, retry_after: Option<Duration>) -> bool {
        let mut book = self.lock();
        let now = self.now_ms();
        let mut w = self.load();
        loop {
            let from = match w.tag() {
                Tag::Manual => return false,
                Tag::Open if now < w.open_until_ms() => {
                    // Open: only a longer period changes anything.
                    let Some(hint) = retry_after else {
                        return false;
                    };
                    let until = now.saturating_add(millis_up(hint.min(book.config.max_open())));
                    if until <= w.open_until_ms() {
                        return false;
                    }
                    let next = Word::open(w.generation(), until);
                    match self.cas(w, next) {
                        Ok(()) => {
                            book.open_until_ms = until;
                            drop(book);
                            self.wake_waiters();
                            return true;
                        }
                        Err(actual) => {
                            w = actual;
                            continue;
                        }
                    }
                }
                Tag::Closed => State::Closed,
                Tag::Open | Tag::HalfOpen => {
                    // The probes' round is over: it failed, as a probe's
                    // failure would say.
                    book.attempt = book.attempt.saturating_add(1);
                    State::HalfOpen
                }
            };
            self.note_hint(&mut book, retry_after, now);
            let until = self.open_until(&mut book, now);
            let next = Word::open(w.next_generation(), until);
            if let Err(actual) = self.cas(w, next) {
                // A permit taken or given back meanwhile: look again.
                if from == State::HalfOpen {
                    book.attempt -= 1;
                }
                w = actual;
                continue;
            }
            if from == State::Closed {
                self.reset_policy(&mut book);
            }
            self.refresh_success_flag(&book);
            self.fleet_opened(&mut book, until.saturating_sub(now));
            self.opened(book, from, next, reason, now);
            return true;
        }
    }

    /// Records an outcome observed outside any call: closed, it feeds the
    /// policy as a call's would (in the current generation); held closed
    /// by an operator, it is counted; otherwise (open, half-open, isolated
    /// or disabled) it changes nothing and is not counted, as it is no
    /// probe: [`trip`](Self::trip) opens a breaker from any state.
    pub(crate) fn record_outside(&self, verdict: Verdict) -> Recorded {
        let w = self.load();
        let held = match w.tag() {
            Tag::Closed => false,
            Tag::Manual if w.manual_mode() == Manual::ForcedClosed => true,
            _ => return Recorded::Ignored,
        };
        // Counted apart from calls, and before the outcome, so that a rate
        // over the counts never finds it in its numerator (a failure)
        // without its denominator.
        self.extras().recorded.fetch_add(1, Ordering::Relaxed);
        if held {
            self.count_outcome(verdict.outcome());
            return Recorded::CountedWhileHeld;
        }
        self.record_closed(w.generation(), verdict, None);
        if self.load().tag() == Tag::Closed {
            Recorded::Counted
        } else {
            Recorded::Opened
        }
    }

    /// Outcomes fed from outside any call that counted.
    pub(crate) fn recorded(&self) -> u64 {
        self.extras
            .get()
            .map_or(0, |extras| extras.recorded.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(tcb_loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::outcome::Outcome;
    use crate::policy::ConsecutiveFailures;

    fn signal() -> TripReason {
        TripReason::Signal {
            reason: Arc::from("quota alarm"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trip_opens_a_closed_breaker_for_its_cooldown_and_no_less_than_asked() {
        let shared = super::super::test_support::shared(ConsecutiveFailures::new(5));
        assert!(shared.trip(signal(), Some(Duration::from_secs(90))));
        assert_eq!(shared.state(), State::Open);
        assert_eq!(shared.retry_after(), Some(Duration::from_secs(90)));
        assert_eq!(shared.snapshot().last_trip, Some(signal()));
        assert_eq!(shared.snapshot().counts.opened, 1);
        assert!(
            !shared.trip(signal(), Some(Duration::from_secs(10))),
            "shorter: nothing"
        );
        assert!(
            shared.trip(signal(), Some(Duration::from_secs(120))),
            "longer: lengthened"
        );
        assert_eq!(shared.retry_after(), Some(Duration::from_secs(120)));
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_outside_calls_feed_the_policy_only_while_closed() {
        let shared = super::super::test_support::shared(ConsecutiveFailures::new(2));
        shared.record_outside(Outcome::Failure.into());
        shared.record_outside(Outcome::Success.into());
        shared.record_outside(Outcome::Failure.into());
        assert_eq!(
            shared.state(),
            State::Closed,
            "the success reset the streak"
        );
        shared.record_outside(Outcome::Failure.into());
        assert_eq!(shared.state(), State::Open);
        let failures = shared.snapshot().counts.failures;
        shared.record_outside(Outcome::Success.into());
        shared.record_outside(Outcome::Failure.into());
        assert_eq!(shared.state(), State::Open, "no probe: nothing changes");
        assert_eq!(shared.snapshot().counts.failures, failures);
    }
}
