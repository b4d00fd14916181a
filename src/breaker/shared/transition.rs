//! Transitions: opening and closing with their bookkeeping, the length of
//! the next open period, and announcing each transition once, to
//! subscribers, observers and waiting gate-mode clones.

use std::time::Duration;

use tokio::sync::broadcast;

use super::snapshot::retry_after_at;
use super::BookGuard;
use super::{next_unit, state_of, Book, Shared, EVENT_CAPACITY};
use crate::breaker::state::{Word, MAX_DEADLINE_MS};
use crate::events::State;
use crate::events::Transition;
use crate::millis::millis_up;
use crate::policy::TripReason;
use crate::sync::Ordering;
use std::sync::Arc;

impl Shared {
    /// Books an open period from `since_ms` to `until_ms`: when it began,
    /// when half-open begins, and how long it was.
    pub(super) fn book_open_period(&self, book: &mut Book, since_ms: u64, until_ms: u64) {
        book.since_ms = since_ms;
        book.open_until_ms = until_ms;
        self.tuning
            .open_period_ms
            .store(until_ms.saturating_sub(since_ms), Ordering::Relaxed);
    }

    /// The breaker has just moved from `from` to open word `next`, its
    /// period counted from `since_ms`: book it and announce it.
    pub(super) fn opened(
        &self,
        mut book: BookGuard<'_>,
        from: State,
        next: Word,
        reason: TripReason,
        since_ms: u64,
    ) {
        book.last_trip = Some(reason.clone());
        self.book_open_period(&mut book, since_ms, next.open_until_ms());
        book.hint_until_ms = None;
        self.forget_probes(&mut book);
        book.counts.opened += 1;
        let retry_after = retry_after_at(next, self.now_ms()).unwrap_or_default();
        self.announce(
            book,
            self.transition(from, next, Some(reason), Some(retry_after)),
        );
    }

    /// The breaker has just closed (word `next`, from `from`): the past is
    /// forgotten; announce it.
    pub(super) fn closed(
        &self,
        mut book: BookGuard<'_>,
        from: State,
        next: Word,
        reason: Option<TripReason>,
    ) {
        book.attempt = 0;
        book.hint_until_ms = None;
        book.quota_until_ms = 0;
        book.since_ms = self.now_ms();
        self.reset_policy(&mut book);
        self.forget_probes(&mut book);
        self.refresh_success_flag(&book);
        self.announce(book, self.transition(from, next, reason, None));
    }

    /// End of the next open period, starting at `from_ms`: a retry-after
    /// the upstream announced, never under the first period (`cooldown`,
    /// `min_open`); or else the policy's period for this attempt lengthened
    /// by jitter. Never over `max_open`, except during a quota hold (up to
    /// its probe interval).
    pub(super) fn open_until(&self, book: &mut Book, from_ms: u64) -> u64 {
        let c = &book.config;
        // Read, not taken: the caller clears it once the transition is made.
        // The upstream said when to come back: that sets the period, as
        // gRPC's pushback replaces a retry's backoff; backoff grows only the
        // periods the breaker chooses itself. The rounds a hint answered
        // still count toward those.
        if let Some(hint) = book.hint_until_ms {
            let floor = from_ms.saturating_add(millis_up(c.open_period(0)));
            let until = hint.max(floor);
            return held(book, from_ms, until);
        }
        let active = book.attempt > 0 && self.prober().is_some();
        let mut period = if active {
            // Probing actively: a failed probe is followed by the next one
            // an interval later, not by a longer and longer wait. Users are
            // refused from the trip until the breaker closes, and the first
            // probe came after `min_open`: that floor is already kept.
            c.probe_interval()
        } else {
            c.open_period(book.attempt)
        };
        // Jitter lengthens, never shortens: `cooldown` (and every period
        // after it) is the least time before a probe, as users read it and
        // as other breakers and backoffs that jitter a wait treat it.
        if c.jitter() > 0.0 {
            let share = c.jitter() * next_unit(&mut book.rng);
            period = Duration::try_from_secs_f64(period.as_secs_f64() * (1.0 + share))
                .unwrap_or(c.max_open());
        }
        let until = from_ms.saturating_add(millis_up(period));
        held(book, from_ms, until)
    }

    /// Tells the world about a transition: the event, then every waiting
    /// gate-mode clone.
    ///
    /// Subscribers get it while the lock is still held (sending never
    /// waits), so they see one breaker's transitions in order; the `tracing`
    /// event and the wake-ups follow once it is released.
    pub(super) fn announce(&self, book: BookGuard<'_>, transition: Transition) {
        // No subscriber left is not an error.
        if let Some(events) = self.events.get() {
            let _ = events.send(transition.clone());
        }
        if let Some(registry) = &self.forward {
            let _ = registry.send(transition.clone());
        }
        drop(book);
        transition.publish();
        self.wake_waiters();
        if transition.to == State::Open {
            self.start_prober();
        }
    }

    /// A receiver of this breaker's transitions from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.events
            .get_or_init(|| broadcast::channel(EVENT_CAPACITY).0)
            .subscribe()
    }

    pub(super) fn transition(
        &self,
        from: State,
        to: Word,
        reason: Option<TripReason>,
        retry_after: Option<Duration>,
    ) -> Transition {
        Transition {
            breaker: Arc::clone(self.name()),
            from,
            to: state_of(to),
            generation: to.generation(),
            reason,
            retry_after,
            shadow: self.hot.shadow.load(Ordering::Relaxed),
            origin: self.origin(),
        }
    }
}

/// `until`, capped by `max_open` from `from_ms`, and stretched by a quota
/// hold in force.
fn held(book: &Book, from_ms: u64, until: u64) -> u64 {
    let c = &book.config;
    let mut until = until.min(from_ms.saturating_add(millis_up(c.max_open())));
    // A quota hold: the next probe a hold's interval away, or at its
    // end if that is sooner; never sooner than without the hold.
    if book.quota_until_ms > from_ms {
        let next_probe = from_ms.saturating_add(millis_up(c.quota_probe_interval()));
        until = until.max(book.quota_until_ms.min(next_probe));
    }
    until.min(MAX_DEADLINE_MS)
}
