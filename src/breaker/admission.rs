//! Admission: the decision `poll_ready` and `call` act on, and the half-open
//! probe permit that makes readiness a reservation.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::shared::{Shared, Ticket};
use super::state::Word;
use crate::events::State;

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
