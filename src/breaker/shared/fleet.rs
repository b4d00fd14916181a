//! A breaker that shares its state with a fleet through a store: what it
//! reports, and how it takes in what the fleet decided.
//!
//! The request path never waits for the backend. Outcomes and transitions
//! go out through the breaker's [`FleetLink`] (see [the port](crate::breaker::fleet));
//! the backend brings the fleet's decisions back through
//! [`Shared::fleet_open`], [`Shared::fleet_probe_won`] and
//! [`Shared::fleet_closed`], which change the local state word like any
//! other transition (under the lock, one compare-and-swap, one event).
//!
//! While the fleet holds a breaker open, the local open period is the
//! fleet's plus a `hold`: long enough for the store's task to take the
//! probe lock (and end the local period at once) or learn that another
//! instance holds it (and extend it), short enough that an instance whose
//! store went silent falls back to probing on its own.

use super::BookGuard;
use super::{state_of, Book, Shared};
use crate::breaker::fleet::FleetLink;
use crate::breaker::state::{Tag, Word, MAX_DEADLINE_MS};
use crate::policy::TripReason;

/// What a breaker knows of the fleet.
#[derive(Debug, Default)]
pub(crate) struct FleetBook {
    /// The fleet generation of the opening this breaker follows; 0 when
    /// closed, or open on its own evidence not yet acknowledged.
    pub(crate) generation: u64,
    /// The fleet's failure count is known to be non-zero: the next success
    /// resets it.
    pub(crate) failures: bool,
    /// When this breaker began following `generation`: it follows for at
    /// most `max_open` (and the hold) from then, whatever Redis says.
    pub(crate) since_ms: u64,
    /// The fleet declined this breaker's latest opening (too few instances
    /// failing): it stays open on its own, and news that the fleet is
    /// closed does not make it offer the opening again.
    pub(crate) declined: bool,
}

impl Shared {
    /// Reports to `link` from now on; false if it already reports to one.
    pub(crate) fn attach_link(&self, link: Box<dyn FleetLink>) -> bool {
        self.extras().link.set(link).is_ok()
    }

    pub(super) fn fleet_outcome(&self, book: &mut Book, failure: bool) {
        let Some(link) = self.link() else { return };
        if failure {
            if link.failure(&book.config) {
                book.fleet.failures = true;
            }
        } else if book.fleet.failures {
            link.reset();
            book.fleet.failures = false;
        }
    }

    /// This breaker opened on its own evidence, for `open_ms`.
    pub(super) fn fleet_opened(&self, book: &mut Book, open_ms: u64) {
        let Some(link) = self.link() else { return };
        link.opened(
            &book.config,
            std::time::Duration::from_millis(open_ms),
            book.attempt,
            book.fleet.generation,
        );
        // Unacknowledged until the store answers with the fleet's opening.
        book.fleet.generation = 0;
        book.fleet.declined = false;
    }

    /// The fleet declined this breaker's opening: fewer instances than the
    /// store's quorum are failing. It stays open on its own evidence (its
    /// period, its own probes), and is not offered to the fleet again until
    /// it opens anew.
    pub(crate) fn fleet_declined(&self) {
        let mut book = self.lock();
        if book.fleet.generation == 0 && matches!(self.load().tag(), Tag::Open | Tag::HalfOpen) {
            book.fleet.declined = true;
        }
    }

    pub(super) fn fleet_probe_succeeded(&self, book: &Book) {
        let Some(link) = self.link() else { return };
        if book.fleet.generation != 0 {
            link.probe_succeeded(&book.config, book.fleet.generation);
        }
    }

    /// The fleet holds the breaker open in `generation`, `left_ms` more
    /// (0: its period is over and the probe lock is another's, or nobody's
    /// yet); stay open that long plus `hold_ms`. With `held_elsewhere`,
    /// another instance holds the probe lock: a local probe round stops.
    /// Returns whether this breaker follows the fleet's opening (false:
    /// held by an operator, or closed here in that generation already).
    pub(crate) fn fleet_open(
        &self,
        generation: u64,
        left_ms: u64,
        attempt: u32,
        hold_ms: u64,
        held_elsewhere: bool,
    ) -> bool {
        let mut book = self.lock();
        let now = self.now_ms();
        // Whatever Redis says, no fleet opening holds this breaker longer
        // than its longest open period (`max_open`, or a quota hold's probe
        // interval) and the hold from when it began following it;
        // past that it probes on its own.
        let since = if book.fleet.generation == generation {
            book.fleet.since_ms
        } else {
            now
        };
        let latest = since
            .saturating_add(crate::millis::millis_up(book.config.longest_open()))
            .saturating_add(hold_ms);
        if now >= latest {
            return false;
        }
        let until = now
            .saturating_add(left_ms)
            .saturating_add(hold_ms)
            .min(latest)
            .min(MAX_DEADLINE_MS);
        let mut w = self.load();
        loop {
            let next = match w.tag() {
                Tag::Manual => return false,
                // Closed here in that generation: the fleet follows.
                Tag::Closed if book.fleet.generation == generation => return false,
                Tag::HalfOpen if left_ms == 0 && !held_elsewhere => return true,
                Tag::Open => Word::open(w.generation(), until),
                Tag::Closed | Tag::HalfOpen => Word::open(w.next_generation(), until),
            };
            match self.cas(w, next) {
                Ok(()) => {
                    book.fleet.generation = generation;
                    book.fleet.since_ms = since;
                    book.fleet.failures = false;
                    book.fleet.declined = false;
                    book.attempt = attempt;
                    book.open_until_ms = until;
                    if w.tag() == Tag::Open {
                        drop(book);
                        self.wake_waiters();
                        return true;
                    }
                    self.reset_policy(&mut book);
                    self.refresh_success_flag(&book);
                    self.opened(book, state_of(w), next, TripReason::Shared, now);
                    return true;
                }
                Err(actual) => w = actual,
            }
        }
    }

    /// This instance holds the probe lock of fleet generation `generation`:
    /// the local open period ends now. Returns whether this breaker probes
    /// (it was open, or is half-open already); false when it is closed or
    /// held by an operator, so that another breaker of the name can.
    pub(crate) fn fleet_probe_won(&self, generation: u64, attempt: u32) -> bool {
        let mut book = self.lock();
        book.fleet.generation = generation;
        book.fleet.declined = false;
        book.attempt = attempt;
        let w = self.load();
        drop(book);
        match w.tag() {
            // Its transition wakes an active prober waiting for the local
            // period's end (see `prober_turn`), so the round starts now.
            Tag::Open => self
                .enter_half_open(w)
                .map_or_else(|now| now.tag() == Tag::HalfOpen, |_| true),
            Tag::HalfOpen => true,
            Tag::Closed | Tag::Manual => false,
        }
    }

    /// The fleet is closed (with `failures` counted), or, with
    /// `generation`, the fleet closed that generation. A breaker that
    /// followed a fleet opening closes; one open on its own evidence that
    /// the fleet has not heard of (Redis was down when it opened) shares
    /// its opening now.
    pub(crate) fn fleet_closed(&self, generation: Option<u64>, failures: u64) {
        let mut book = self.lock();
        let w = self.load();
        if generation.is_none() {
            // Successes tallied so far came before this news; from now on a
            // success may have a fleet count to reset.
            self.fold_tally(&mut book, w);
            book.fleet.failures = failures > 0;
            self.refresh_success_flag(&book);
        }
        let follows =
            book.fleet.generation != 0 && generation.is_none_or(|g| g == book.fleet.generation);
        match w.tag() {
            Tag::Open | Tag::HalfOpen if follows => self.fleet_close(book, w),
            // Still open: an opening whose period has ended (it reads as
            // half-open) may be over, and is not replayed to the fleet.
            Tag::Open
                if book.fleet.generation == 0 && !book.fleet.declined && generation.is_none() =>
            {
                let left_ms = w.open_until_ms().saturating_sub(self.now_ms());
                if left_ms > 0 {
                    self.fleet_opened(&mut book, left_ms);
                }
            }
            _ => {}
        }
    }

    fn fleet_close(&self, mut book: BookGuard<'_>, mut w: Word) {
        loop {
            let next = Word::closed(w.next_generation());
            match self.cas(w, next) {
                Ok(()) => {
                    book.fleet = FleetBook::default();
                    return self.closed(book, state_of(w), next, Some(TripReason::Shared));
                }
                Err(actual) if matches!(actual.tag(), Tag::Open | Tag::HalfOpen) => w = actual,
                Err(_) => return,
            }
        }
    }

    /// Whether this breaker reports to a fleet backend.
    pub(crate) fn has_link(&self) -> bool {
        self.link().is_some()
    }
}
