//! Half-open probes: taking and giving back permits, their deadlines, and
//! what a probe's outcome does to the breaker.
//!
//! With a probe timeout, a permit and its place in the deadline book change
//! together, under the lock: the number of booked slots of the current
//! half-open generation always equals the probes in flight in the state
//! word. A slot's deadline starts when its permit is reserved and starts
//! again when the call is made (`begin`); an overdue slot whose call was
//! made is a failed probe, an overdue reservation never used is taken back
//! without counting against the upstream. Without a probe timeout, permits
//! are taken and given back with a compare-and-swap alone.

use std::sync::Arc;

use super::BookGuard;
use crate::sync::Ordering;
use std::time::Duration;

use super::{Book, Shared};
use crate::breaker::admission::Permit;
use crate::breaker::state::{Tag, Word};
use crate::events::State;
use crate::millis::millis_up;
use crate::policy::TripReason;

/// A permit's place in the deadline book: its slot, and an id that tells a
/// permit taken back (and its slot reused) from the one holding it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    slot: usize,
    id: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    id: u64,
    deadline_ms: u64,
    /// Whether the call was made (not just reserved).
    called: bool,
}

/// Deadlines of the in-flight probes of one half-open generation.
#[derive(Debug)]
pub(super) struct ProbeBook {
    generation: u32,
    slots: Vec<Option<Entry>>,
    next_id: u64,
    /// Probes judged failed when their deadline passed: their late outcome
    /// (or their drop) must not count a second time.
    judged: Vec<u64>,
}

impl ProbeBook {
    pub(super) fn new(probes: usize) -> Self {
        ProbeBook {
            generation: 0,
            slots: vec![None; probes],
            next_id: 0,
            judged: Vec::new(),
        }
    }

    /// Whether `ticket`'s probe was judged at its deadline; forgets it, as
    /// its outcome arrives only once.
    fn was_judged(&mut self, ticket: Option<Ticket>) -> bool {
        let Some(ticket) = ticket else {
            return false;
        };
        match self.judged.iter().position(|id| *id == ticket.id) {
            Some(i) => {
                self.judged.swap_remove(i);
                true
            }
            None => false,
        }
    }

    fn entry(&mut self, generation: u32, ticket: Ticket) -> Option<&mut Entry> {
        if self.generation != generation {
            return None;
        }
        self.slots
            .get_mut(ticket.slot)?
            .as_mut()
            .filter(|e| e.id == ticket.id)
    }

    fn earliest(&self) -> Option<u64> {
        self.slots.iter().flatten().map(|e| e.deadline_ms).min()
    }

    pub(super) fn clear(&mut self) {
        self.slots.fill(None);
    }
}

impl Shared {
    /// Takes one permit of half-open word `w`, or returns the word that
    /// changed under us.
    pub(super) fn take_permit(self: &Arc<Self>, w: Word, now: u64) -> Result<Permit, Word> {
        let next = Word::half_open(w.generation(), w.in_flight() + 1, w.successes());
        if !self.tuning.probe_timeout.load(Ordering::Relaxed) {
            self.cas(w, next)?;
            // Counted under the lock, as probes are rare.
            self.lock().counts.probes += 1;
            return Ok(Permit::new(Arc::clone(self), w.generation(), None));
        }
        let mut book = self.lock();
        // A reload in between changes the generation: the swap below fails.
        let Some(timeout) = book.config.probe_timeout() else {
            self.cas(w, next)?;
            book.counts.probes += 1;
            return Ok(Permit::new(Arc::clone(self), w.generation(), None));
        };
        self.cas(w, next)?;
        book.counts.probes += 1;
        let probes = &mut book.probes;
        if probes.generation != w.generation() {
            probes.generation = w.generation();
            probes.clear();
        }
        // One free slot per free permit: there is always one.
        let ticket = probes.slots.iter().position(Option::is_none).map(|slot| {
            let id = probes.next_id;
            probes.next_id += 1;
            probes.slots[slot] = Some(Entry {
                id,
                deadline_ms: now.saturating_add(millis_up(timeout)),
                called: false,
            });
            Ticket { slot, id }
        });
        self.publish_probe_deadline(&book);
        Ok(Permit::new(Arc::clone(self), w.generation(), ticket))
    }

    /// Whether a permit still holds: its generation is current and it was
    /// not taken back.
    pub(crate) fn permit_holds(&self, generation: u32, ticket: Option<Ticket>) -> bool {
        if !self.is_half_open_in(generation) {
            return false;
        }
        match ticket {
            None => true,
            Some(ticket) => self.lock().probes.entry(generation, ticket).is_some(),
        }
    }

    /// The probe's call is being made: its deadline starts now. False when
    /// the permit no longer holds.
    pub(crate) fn begin_probe(&self, generation: u32, ticket: Option<Ticket>) -> bool {
        let Some(ticket) = ticket else {
            return self.is_half_open_in(generation);
        };
        let mut book = self.lock();
        let Some(timeout) = book.config.probe_timeout() else {
            return false;
        };
        if !self.is_half_open_in(generation) {
            return false;
        }
        let deadline_ms = self.now_ms().saturating_add(millis_up(timeout));
        let Some(entry) = book.probes.entry(generation, ticket) else {
            return false;
        };
        entry.called = true;
        entry.deadline_ms = deadline_ms;
        self.publish_probe_deadline(&book);
        true
    }

    pub(super) fn publish_probe_deadline(&self, book: &Book) {
        self.hot.probe_deadline_ms.store(
            book.probes.earliest().unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    /// Leaving half-open: no probe deadline applies any more.
    pub(super) fn forget_probes(&self, book: &mut Book) {
        book.probes.clear();
        self.hot
            .probe_deadline_ms
            .store(u64::MAX, Ordering::Release);
    }

    /// Lowers the probes in flight of `generation` by one, keeping the
    /// successes (plus `success`). False when the generation has moved on.
    fn lower_in_flight(&self, generation: u32, success: u32) -> bool {
        let mut w = self.load();
        while w.tag() == Tag::HalfOpen && w.generation() == generation {
            let next = Word::half_open(
                generation,
                w.in_flight().saturating_sub(1),
                w.successes() + success,
            );
            match self.cas(w, next) {
                Ok(()) => return true,
                Err(actual) => w = actual,
            }
        }
        false
    }

    /// Gives back a permit whose call was ignored, cancelled or never made.
    pub(crate) fn release_permit(&self, generation: u32, ticket: Option<Ticket>) {
        let released = match ticket {
            None => self.lower_in_flight(generation, 0),
            Some(ticket) => {
                let mut book = self.lock();
                if book.probes.was_judged(Some(ticket)) {
                    return;
                }
                let Some(slot) = book.probes.entry(generation, ticket).map(|_| ticket.slot) else {
                    // Taken back already, or the generation is over.
                    return;
                };
                book.probes.slots[slot] = None;
                self.publish_probe_deadline(&book);
                self.lower_in_flight(generation, 0)
            }
        };
        if released {
            // A permit is free again: a gate-mode clone waiting may go.
            self.wake_waiters();
        }
    }

    pub(crate) fn probe_succeeded(&self, generation: u32, ticket: Option<Ticket>) {
        let mut book = self.lock();
        if book.probes.was_judged(ticket) {
            return;
        }
        let Some(mut book) = self.unless_late(book, generation, ticket) else {
            return;
        };
        let w = self.load();
        let valid = w.tag() == Tag::HalfOpen
            && w.generation() == generation
            && ticket.is_none_or(|t| book.probes.entry(generation, t).is_some());
        if !valid {
            book.counts.stale += 1;
            return;
        }
        if let Some(ticket) = ticket {
            book.probes.slots[ticket.slot] = None;
            self.publish_probe_deadline(&book);
        }
        self.fleet_probe_succeeded(&book);
        if w.successes() + 1 < book.config.successes_to_close() {
            self.lower_in_flight(generation, 1);
            drop(book);
            self.wake_waiters();
            return;
        }
        let mut w = w;
        loop {
            let next = Word::closed(w.next_generation());
            match self.cas(w, next) {
                Ok(()) => return self.closed(book, State::HalfOpen, next, None),
                // Only a permit taken or given back (same generation).
                Err(actual) => w = actual,
            }
        }
    }

    /// A probe's caller dropped it before its outcome: reopen for the
    /// period just ended, neither grown nor skipped (a dropped probe
    /// handing its permit straight on would let the next call probe at
    /// once, and a caller who gives up every time would probe in a loop).
    pub(crate) fn probe_cancelled(&self, generation: u32, ticket: Option<Ticket>) {
        self.probe_ended(generation, ticket, None, TripReason::ProbeCancelled, 0);
    }

    /// A probe failed: reopen.
    pub(crate) fn probe_failed(
        &self,
        generation: u32,
        ticket: Option<Ticket>,
        hint: Option<Duration>,
    ) {
        self.probe_ended(generation, ticket, hint, TripReason::ProbeFailed, 1);
    }

    /// A probe ended without closing the breaker: reopen, counting
    /// `failures`, unless it was judged already or arrived late.
    fn probe_ended(
        &self,
        generation: u32,
        ticket: Option<Ticket>,
        hint: Option<Duration>,
        reason: TripReason,
        failures: u64,
    ) {
        let mut book = self.lock();
        if book.probes.was_judged(ticket) {
            return;
        }
        let Some(book) = self.unless_late(book, generation, ticket) else {
            return;
        };
        let now = self.now_ms();
        self.reopen(book, generation, now, hint, reason, failures);
    }

    /// Gives the lock back to record a probe's outcome, unless the outcome
    /// arrived after the probe's deadline: then, whatever it says, the probe
    /// timed out, as it would have been judged at its deadline had another
    /// call come by meanwhile. Every overdue probe is judged (the breaker
    /// reopens from the earliest deadline), this one's outcome counts no
    /// further, and `None` is returned.
    fn unless_late<'a>(
        &'a self,
        mut book: BookGuard<'a>,
        generation: u32,
        ticket: Option<Ticket>,
    ) -> Option<BookGuard<'a>> {
        let Some(ticket) = ticket else {
            return Some(book);
        };
        let now = self.now_ms();
        let late = book
            .probes
            .entry(generation, ticket)
            .is_some_and(|e| e.called && e.deadline_ms <= now);
        if !late {
            return Some(book);
        }
        drop(book);
        self.time_out_probes(generation, now);
        self.lock().probes.was_judged(Some(ticket));
        None
    }

    /// A caller saw a probe deadline pass. A probe whose call was made and
    /// is still running counts as failed, and the open period starts from
    /// its deadline, as if a timer had fired then. A reservation never used
    /// is taken back instead: it says nothing about the upstream.
    pub(super) fn time_out_probes(&self, generation: u32, now: u64) {
        let mut book = self.lock();
        if book.probes.generation != generation || !self.is_half_open_in(generation) {
            return;
        }
        let overdue: Vec<(u64, u64)> = book
            .probes
            .slots
            .iter()
            .flatten()
            .filter(|e| e.called && e.deadline_ms <= now)
            .map(|e| (e.id, e.deadline_ms))
            .collect();
        if let Some(deadline) = overdue.iter().map(|(_, d)| *d).min() {
            // Each overdue probe is a failure now, once: its late outcome
            // will be dropped without counting.
            book.probes.judged.extend(overdue.iter().map(|(id, _)| *id));
            let failures = overdue.len() as u64;
            let reason = TripReason::ProbeTimedOut;
            return self.reopen(book, generation, deadline, None, reason, failures);
        }
        let mut taken_back = 0;
        for slot in book.probes.slots.iter_mut() {
            if slot.is_some_and(|e| !e.called && e.deadline_ms <= now) {
                *slot = None;
                taken_back += 1;
            }
        }
        for _ in 0..taken_back {
            self.lower_in_flight(generation, 0);
        }
        self.publish_probe_deadline(&book);
        drop(book);
        if taken_back > 0 {
            self.wake_waiters();
        }
    }

    /// Half-open generation `generation` failed (a probe failed or timed
    /// out): open again for the next, longer period, counted from `from_ms`.
    /// `failures` failed probes count when it reopens; when the generation
    /// is over, the outcome is stale (counted as such) and nothing changes.
    pub(super) fn reopen(
        &self,
        mut book: BookGuard<'_>,
        generation: u32,
        from_ms: u64,
        hint: Option<std::time::Duration>,
        reason: TripReason,
        failures: u64,
    ) {
        let mut w = self.load();
        if w.tag() != Tag::HalfOpen || w.generation() != generation {
            book.counts.stale += 1;
            return;
        }
        self.note_hint(&mut book, hint, from_ms);
        // A cancelled probe said nothing: the period stays as it was.
        if failures > 0 {
            book.attempt = book.attempt.saturating_add(1);
        }
        // Computed once: a retry below only follows a permit change.
        let until = self.open_until(&mut book, from_ms);
        loop {
            let next = Word::open(w.next_generation(), until);
            match self.cas(w, next) {
                Ok(()) => {
                    book.counts.failures += failures;
                    self.fleet_opened(&mut book, until.saturating_sub(from_ms));
                    return self.opened(book, State::HalfOpen, next, reason, from_ms);
                }
                Err(actual)
                    if actual.tag() == Tag::HalfOpen && actual.generation() == generation =>
                {
                    w = actual;
                }
                // Unreachable under the lock; stay safe if that changes.
                Err(_) => {
                    if failures > 0 {
                        book.attempt -= 1;
                    }
                    return;
                }
            }
        }
    }
}
