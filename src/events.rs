//! Transitions: what the breaker tells the world when its state changes.
//!
//! Every real transition is emitted exactly once, by the thread that won the
//! compare-and-swap performing it, as a `tracing` event with structured
//! fields (`breaker`, `from`, `to`, `generation`, `reason`, `policy`,
//! `retry_after_ms`): `WARN` when the breaker opens, `INFO` when it turns
//! half-open or closes. Events are emitted after the breaker's lock is
//! released.

use std::sync::Arc;
use std::time::Duration;

use crate::policy::TripReason;
use crate::State;

/// One state change of one breaker.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Transition {
    /// The breaker's name.
    pub breaker: Arc<str>,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The generation the breaker entered.
    pub generation: u32,
    /// Why it opened (only when `to` is [`State::Open`]).
    pub reason: Option<TripReason>,
    /// How long it stays open (only when `to` is [`State::Open`]).
    pub retry_after: Option<Duration>,
}

impl Transition {
    pub(crate) fn emit(&self) {
        let reason = self.reason.as_ref().map(tracing::field::display);
        let policy = self.reason.as_ref().map(TripReason::policy);
        let retry_after_ms = self.retry_after.map(|d| d.as_millis() as u64);
        match self.to {
            State::Open => tracing::warn!(
                breaker = %self.breaker,
                from = ?self.from,
                to = ?self.to,
                generation = self.generation,
                reason,
                policy,
                retry_after_ms,
                "circuit breaker opened"
            ),
            State::HalfOpen => tracing::info!(
                breaker = %self.breaker,
                from = ?self.from,
                to = ?self.to,
                generation = self.generation,
                "circuit breaker half-open: probing"
            ),
            State::Closed => tracing::info!(
                breaker = %self.breaker,
                from = ?self.from,
                to = ?self.to,
                generation = self.generation,
                "circuit breaker closed"
            ),
        }
    }
}
