//! Admission, from the breaker's decision to the call's outcome: what the
//! breaker says about one call ([`Decision`]), the half-open probe permit
//! that makes readiness a reservation ([`Permit`]), the decision settled at
//! `call` into an admitted call or a refusal ([`settle`]), and the admitted
//! call itself ([`Admission`]), which records its outcome once or, when its
//! holder is dropped first, counts a cancellation.
//!
//! Every holder of an admitted call (a response future, a streamed body's
//! obligation, a call permit, a keyed leg) goes through [`Admission`]'s
//! `record` and `cancel`, so the path from an outcome to the breaker is
//! written once: a closed-state success that no policy needs returns
//! inline in [`record`]; anything else goes to [`record_slow`] and from
//! there to the breaker's `record_closed` or the probe's permit.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::clones::CloneCounts;
use super::shared::{Shared, Ticket};
use super::state::Word;
use crate::events::State;
use crate::outcome::{FailureClass, Outcome, Verdict};

/// What the breaker says about one call.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Closed: call the inner service; the outcome counts in this generation.
    Closed(u32),
    /// Half-open: this call is a probe and holds a permit.
    Probe(Permit),
    /// Half-open with a permit free, asked by a call that may not probe
    /// ([`Shared::admit_without_probe`]): no permit was taken. Refused, it
    /// waits until `retry_at`, as a refusal with every permit taken would.
    ProbeDue { retry_at: Instant },
    /// Let the call through without feeding the trip policy: held closed
    /// (`counted`: its outcome still shows in the counts), disabled, or a
    /// refusal that shadow mode turns into a pass (`shadowed`).
    Bypass { counted: bool, shadowed: bool },
    /// Refuse at once.
    Refuse {
        /// When to ask again: the end of the open period, or the breaker's
        /// estimate while half-open or held.
        retry_at: Instant,
        state: State,
        /// The state word the refusal was decided on.
        word: Word,
        /// When a call may next be admitted (the end of the open period, or
        /// the in-flight probes' deadline), if known.
        until_ms: Option<u64>,
    },
}

/// One of the `probes` half-open permits.
///
/// Taken when the breaker admits a probe, moved from the service into the
/// response future by `call`, and given back exactly once: by the probe's
/// outcome, or by `Drop` when the future is cancelled, the service clone that
/// reserved it is dropped, or a panic unwinds through either.
#[derive(Debug)]
pub(crate) struct Permit {
    shared: Arc<Shared>,
    generation: u32,
    ticket: Option<Ticket>,
    armed: bool,
}

impl Permit {
    pub(crate) fn new(shared: Arc<Shared>, generation: u32, ticket: Option<Ticket>) -> Self {
        Permit {
            shared,
            generation,
            ticket,
            armed: true,
        }
    }

    /// The half-open generation that issued this permit.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether the permit still holds: the breaker is still in the
    /// half-open generation that issued it, and it was not taken back.
    pub(crate) fn is_current(&self) -> bool {
        self.shared.permit_holds(self.generation, self.ticket)
    }

    /// The probe's call is being made: its deadline starts now. False when
    /// the permit no longer holds (the caller must decide again).
    pub(crate) fn begin(&self) -> bool {
        self.shared.begin_probe(self.generation, self.ticket)
    }

    pub(crate) fn succeed(mut self) {
        self.armed = false;
        self.shared.probe_succeeded(self.generation, self.ticket);
    }

    /// The probe's call was dropped by its caller before its outcome: open
    /// again for the same period, counting no failure.
    pub(crate) fn cancelled(mut self) {
        self.armed = false;
        self.shared.probe_cancelled(self.generation, self.ticket);
    }

    pub(crate) fn fail(mut self, hint: Option<Duration>) {
        self.armed = false;
        self.shared.probe_failed(self.generation, self.ticket, hint);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release_permit(self.generation, self.ticket);
        }
    }
}

/// Where a call's admission and refusal are counted: in a service clone's
/// own counts (no shared write), or in the breaker's.
#[derive(Clone, Copy)]
pub(crate) enum CountIn<'a> {
    Clone(&'a CloneCounts),
    Breaker,
}

impl CountIn<'_> {
    /// Counts a call to the breaker `shared` that its parent refused.
    #[inline]
    pub(crate) fn count_parent_refusal(self, shared: &Shared) {
        match self {
            CountIn::Clone(counts) => counts.rejected_by_parent(),
            CountIn::Breaker => shared.count_parent_refusal(),
        }
    }

    /// Counts a call to the breaker `shared`, admitted or refused.
    #[inline]
    pub(crate) fn count(self, shared: &Shared, admitted: bool) {
        match (self, admitted) {
            (CountIn::Clone(counts), true) => counts.admitted(),
            (CountIn::Clone(counts), false) => counts.rejected(),
            (CountIn::Breaker, admitted) => shared.count_call(admitted),
        }
    }
}

/// A call the breaker refused, before the refusal is counted and made:
/// when to ask again, and the state that refused.
pub(crate) struct Refused {
    pub(crate) retry_at: Instant,
    pub(crate) state: State,
}

/// Settles `decision`, made by `shared` for a call about to be made, into
/// an admitted call or a refusal. A probe's permit is begun here (its
/// deadline runs from the call); one lost at once (the half-open round
/// just ended) is a refusal. A call shadow mode lets through is counted in
/// `counts` as the refusal a real breaker would have made (its admission
/// is counted by the caller, as every admission is).
///
/// The closed case is settled inline, in the caller (a keyed leg, a call
/// permit; the service's closed path asks nothing of `settle`); the others
/// out of line, so that a closed call's admission is built where the
/// caller keeps it rather than returned through memory.
#[inline(always)]
pub(crate) fn settle(
    decision: Decision,
    shared: &Arc<Shared>,
    counts: CountIn<'_>,
) -> Result<Admission, Refused> {
    match decision {
        Decision::Closed(generation) => Ok(Admission::closed(generation)),
        decision => settle_past_closed(decision, shared, counts),
    }
}

/// [`settle`] past the closed case.
#[inline(never)]
fn settle_past_closed(
    decision: Decision,
    shared: &Arc<Shared>,
    counts: CountIn<'_>,
) -> Result<Admission, Refused> {
    match decision {
        // Settled inline by `settle`; kept so that the match says every case.
        Decision::Closed(generation) => Ok(Admission::closed(generation)),
        Decision::Probe(permit) if permit.begin() => Ok(Admission::probe(permit)),
        Decision::Probe(_) => Err(Refused {
            retry_at: Instant::now(),
            state: shared.state(),
        }),
        // Asked for a call that may not probe, while a probe is due.
        Decision::ProbeDue { retry_at } => Err(Refused {
            retry_at,
            state: State::HalfOpen,
        }),
        Decision::Bypass { counted, shadowed } => {
            if shadowed {
                counts.count(shared, false);
            }
            let record = if counted {
                Record::CountOnly
            } else {
                Record::Nothing
            };
            Ok(Admission::new(shared.load().generation(), None, record))
        }
        Decision::Refuse {
            retry_at, state, ..
        } => Err(Refused { retry_at, state }),
    }
}

/// What a call's outcome feeds, once it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// The trip policy (closed) or the probe's permit (half-open).
    Policy = 0,
    /// Only the breaker's counts (held closed by an operator).
    CountOnly = 1,
    /// Nothing: disabled, passed by shadow mode, or already recorded (or
    /// handed on to a streamed body, which records it).
    Nothing = 2,
}

/// A call the breaker let through, as its admission settled it: the
/// generation its outcome counts in (a probe's: the half-open one), a
/// probe's permit, and what its outcome feeds. Whatever holds an admitted
/// call until its outcome (a response future, a streamed body's
/// obligation, a call permit, a keyed leg) holds one, records through
/// [`Admission::record`] and, dropped first, cancels through
/// [`Admission::cancel`].
///
/// The generation (the low half) and what the outcome feeds (the high
/// half) share one word, so that the admission is two whole words: built
/// and moved word by word, never written in narrow parts and read back
/// whole (which stalls the load behind the stores).
pub(crate) struct Admission {
    /// A probe's permit; boxed, as probes are rare and every call moves
    /// its admission.
    permit: Option<Box<Permit>>,
    meta: u64,
}

impl Admission {
    #[inline(always)]
    fn new(generation: u32, permit: Option<Box<Permit>>, record: Record) -> Self {
        Admission {
            permit,
            meta: u64::from(generation) | (record as u64) << 32,
        }
    }

    /// A call admitted closed in `generation`, its outcome for the policy.
    #[inline(always)]
    pub(crate) fn closed(generation: u32) -> Self {
        Admission::new(generation, None, Record::Policy)
    }

    /// A probe, begun: its outcome goes to `permit`.
    #[inline]
    pub(crate) fn probe(permit: Permit) -> Self {
        Admission::new(permit.generation(), Some(Box::new(permit)), Record::Policy)
    }

    /// The generation its outcome counts in.
    #[inline(always)]
    pub(crate) fn generation(&self) -> u32 {
        self.meta as u32
    }

    /// What its outcome feeds; `Nothing` once recorded.
    #[inline(always)]
    pub(crate) fn feeds(&self) -> Record {
        match self.meta >> 32 {
            0 => Record::Policy,
            1 => Record::CountOnly,
            _ => Record::Nothing,
        }
    }

    /// Whether it still holds a probe's permit (a probe's admission gives
    /// it up as it records, cancels or hands on).
    pub(crate) fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// What its outcome feeds, leaving `Nothing` for any later outcome.
    #[inline(always)]
    fn take_feeds(&mut self) -> Record {
        let feeds = self.feeds();
        self.meta = u64::from(self.generation()) | (Record::Nothing as u64) << 32;
        feeds
    }

    /// Hands the outcome on to a new admission (a streamed body's, which
    /// records at the end of the stream), leaving this one recorded;
    /// `None` if there is nothing left to record.
    #[inline]
    pub(crate) fn hand_on(&mut self) -> Option<Admission> {
        match self.take_feeds() {
            Record::Nothing => None,
            feeds => Some(Admission::new(self.generation(), self.permit.take(), feeds)),
        }
    }

    /// Records `verdict` at `shared` for a call started at `start`, once:
    /// later verdicts feed nothing.
    #[inline(always)]
    pub(crate) fn record(&mut self, shared: &Shared, verdict: Verdict, start: Option<Instant>) {
        let count_only = match self.take_feeds() {
            Record::Nothing => return,
            feeds => feeds == Record::CountOnly,
        };
        record(
            shared,
            self.generation(),
            &mut self.permit,
            verdict,
            start,
            count_only,
        );
    }

    /// Counts the call as cancelled at `shared`, unless its outcome was
    /// recorded: what its holder does when dropped. A call dropped by its
    /// caller before its outcome was known is a cancellation, counting
    /// neither way, or, once it has waited the config's
    /// `cancelled_failure_after`, a failure (a probe's, a failed probe). A
    /// cancelled probe gave no evidence: the breaker opens again for the
    /// period it just had, neither longer nor at once.
    #[inline(always)]
    pub(crate) fn cancel(&mut self, shared: &Shared, start: Option<Instant>) {
        // Checked here, inline: a call whose outcome was recorded (every
        // call that completed) drops without a call out of line. What goes
        // out of line goes by value, so that the call's fields stay where
        // the caller's optimiser put them. A recorded admission holds no
        // permit: recording, handing on and cancelling each take it.
        debug_assert!(self.feeds() != Record::Nothing || self.permit.is_none());
        if self.feeds() != Record::Nothing {
            let what = self.take_feeds();
            cancel_unrecorded(shared, self.generation(), self.permit.take(), what, start);
        }
    }
}

/// [`Admission::cancel`] past its check, for a call not yet recorded,
/// whose outcome would have fed `what`.
#[cold]
#[inline(never)]
fn cancel_unrecorded(
    shared: &Shared,
    generation: u32,
    permit: Option<Box<Permit>>,
    what: Record,
    start: Option<Instant>,
) {
    if shared.cancellation_is_failure(start) {
        let failure = Verdict::failure(FailureClass::Timeout);
        record_slow(
            shared,
            generation,
            permit,
            failure,
            start,
            what == Record::CountOnly,
        );
    } else {
        shared.count_cancelled();
        if let Some(permit) = permit {
            permit.cancelled();
        }
    }
}

/// Records a call's verdict: in the closed generation that admitted it, or
/// as a probe through its permit, which it takes.
#[inline(always)]
fn record(
    shared: &Shared,
    generation: u32,
    permit: &mut Option<Box<Permit>>,
    verdict: Verdict,
    start: Option<Instant>,
    count_only: bool,
) {
    // The common case, decided here rather than behind a call: a
    // closed-state success that no policy needs (no time, no permit).
    if !count_only
        && start.is_none()
        && permit.is_none()
        && verdict.outcome() == Outcome::Success
        && shared.success_is_quiet()
    {
        return;
    }
    record_slow(
        shared,
        generation,
        permit.take(),
        verdict,
        start,
        count_only,
    );
}

/// [`record`] past its common case.
fn record_slow(
    shared: &Shared,
    generation: u32,
    permit: Option<Box<Permit>>,
    verdict: Verdict,
    start: Option<Instant>,
    count_only: bool,
) {
    if count_only {
        shared.count_outcome(verdict.outcome());
        return;
    }
    match permit.map(|permit| *permit) {
        None => shared.record_closed(
            generation,
            verdict,
            // One clock read gives both the latency and the time to record
            // it at.
            start.map(|start| {
                let end = Instant::now();
                (end.saturating_duration_since(start), end)
            }),
        ),
        Some(permit) => match verdict.outcome() {
            Outcome::Success => permit.succeed(),
            Outcome::Failure => permit.fail(verdict.retry_after()),
            Outcome::Ignore => {
                shared.record_closed(generation, verdict, None);
                drop(permit);
            }
        },
    }
}
