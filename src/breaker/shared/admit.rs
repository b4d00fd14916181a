//! Admission: what the breaker says about one call, in every state. Closed
//! costs one atomic load; open reads the clock; an ended open period turns
//! half-open here, by whichever caller sees it first; half-open takes a
//! probe permit or refuses with an honest wait. A call that may not probe
//! asks without taking a permit, and learns that a probe is due.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Shared, Tag};
use crate::breaker::admission::Decision;
use crate::breaker::state::{Manual, Word};
use crate::events::State;
use crate::sync::Ordering;

impl Shared {
    /// Decides about one call. Closed costs one atomic load; open reads the
    /// clock once; an elapsed open period is turned into half-open here, by
    /// whichever caller sees it first.
    #[inline]
    pub(crate) fn admit(self: &Arc<Self>) -> Decision {
        let w = self.load();
        if w.tag() == Tag::Closed {
            return Decision::Closed(w.generation());
        }
        self.admit_slow(w, true)
    }

    /// Decides about one call, asking `may_probe` whether it may be a
    /// probe only when the breaker is not closed: as [`admit`](Self::admit)
    /// when it may, as [`admit_without_probe`](Self::admit_without_probe)
    /// when not. Closed costs one atomic load, and the question is not
    /// asked.
    #[inline]
    pub(crate) fn admit_if(self: &Arc<Self>, may_probe: impl FnOnce() -> bool) -> Decision {
        let w = self.load();
        if w.tag() == Tag::Closed {
            return Decision::Closed(w.generation());
        }
        self.admit_slow(w, may_probe())
    }

    /// Decides about one call that may not be a probe: as [`admit`](Self::admit),
    /// but where a half-open breaker would take a permit for it, it takes
    /// none and answers [`Decision::ProbeDue`]. The permit stays free for a
    /// call that may probe.
    #[inline]
    pub(crate) fn admit_without_probe(self: &Arc<Self>) -> Decision {
        let w = self.load();
        if w.tag() == Tag::Closed {
            return Decision::Closed(w.generation());
        }
        self.admit_slow(w, false)
    }

    /// When open word `w`'s period ends, for a fail-fast refusal's common
    /// case decided without building a decision: `None` when `w` is not
    /// open or shadow mode is on (then the caller asks [`admit`](Self::admit)).
    /// The caller compares the clock with it: a refusal reads the clock and
    /// compares two instants, with no arithmetic on them.
    #[inline]
    pub(crate) fn open_period_end(&self, w: Word) -> Option<Instant> {
        if w.tag() != Tag::Open || self.hot.shadow.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.instant_at(w.open_until_ms()))
    }

    /// `probe`: whether this call may take a half-open permit.
    #[cold]
    fn admit_slow(self: &Arc<Self>, mut w: Word, probe: bool) -> Decision {
        let now_at = Instant::now();
        let now = self.ms_at(now_at);
        let after = |ms: u64| now_at + Duration::from_millis(ms);
        loop {
            match w.tag() {
                Tag::Closed => return Decision::Closed(w.generation()),
                Tag::Open => {
                    if now < w.open_until_ms() {
                        let until_ms = w.open_until_ms();
                        return self.refuse(
                            w,
                            State::Open,
                            self.instant_at(until_ms),
                            Some(until_ms),
                        );
                    }
                    if self.hot.prober_running.load(Ordering::Acquire) {
                        // Its probe task, not a user's request, probes.
                        return self.refuse(
                            w,
                            State::HalfOpen,
                            after(self.probe_interval_ms()),
                            None,
                        );
                    }
                    w = self.enter_half_open(w).unwrap_or_else(|actual| actual);
                }
                Tag::HalfOpen if self.hot.prober_running.load(Ordering::Acquire) => {
                    return self.refuse(w, State::HalfOpen, after(self.probe_interval_ms()), None);
                }
                Tag::HalfOpen => {
                    // A probe past its deadline is dealt with first, whether
                    // or not a permit is free.
                    let deadline = self.hot.probe_deadline_ms.load(Ordering::Acquire);
                    if deadline != u64::MAX && now >= deadline {
                        self.time_out_probes(w.generation(), now);
                        let fresh = self.load();
                        if fresh != w {
                            w = fresh;
                            continue;
                        }
                    }
                    let free = w.in_flight() < self.tuning.probes.load(Ordering::Relaxed);
                    if free && !probe {
                        // The same wait as a refusal with every permit
                        // taken: this caller cannot probe, and the next one
                        // that can will settle the question within it.
                        let retry_at = after(self.half_open_wait_ms(deadline, now));
                        if self.hot.shadow.load(Ordering::Relaxed) {
                            return Decision::Bypass {
                                counted: false,
                                shadowed: true,
                            };
                        }
                        return Decision::ProbeDue { retry_at };
                    }
                    if free {
                        match self.take_permit(w, now) {
                            Ok(permit) => return Decision::Probe(permit),
                            Err(actual) => {
                                w = actual;
                                continue;
                            }
                        }
                    }
                    let retry_at = after(self.half_open_wait_ms(deadline, now));
                    let until_ms = (deadline != u64::MAX).then_some(deadline);
                    return self.refuse(w, State::HalfOpen, retry_at, until_ms);
                }
                Tag::Manual => {
                    return match w.manual_mode() {
                        // An operator's isolation holds even in shadow mode:
                        // nobody knows when it ends; say so with `max_open`.
                        Manual::Isolated => Decision::Refuse {
                            retry_at: after(self.tuning.max_open_ms.load(Ordering::Relaxed)),
                            state: State::ForcedOpen,
                            word: w,
                            until_ms: None,
                        },
                        Manual::ForcedClosed => Decision::Bypass {
                            counted: true,
                            shadowed: false,
                        },
                        Manual::Disabled => Decision::Bypass {
                            counted: false,
                            shadowed: false,
                        },
                    };
                }
            }
        }
    }

    /// What a refusal while half-open (every permit taken) tells callers to
    /// wait: the time left until the in-flight probes' deadline, but never
    /// more than the open period that just ended. The deadline is the
    /// probe timeout's worst case (60 s by default), which would send a
    /// gateway's users away for a minute while a probe that usually
    /// answers in a second is in flight; the open period is the breaker's
    /// own measure of how soon it is worth looking again. A probe's answer
    /// settles the question sooner either way: callers that come back
    /// early are refused again, cheaply.
    pub(super) fn half_open_wait_ms(&self, probe_deadline_ms: u64, now: u64) -> u64 {
        let open_period = self.tuning.open_period_ms.load(Ordering::Relaxed);
        probe_deadline_ms.saturating_sub(now).min(open_period)
    }

    /// Moves open word `w`, whose period has ended, to half-open; returns
    /// the new word, or the one that changed under us. Under the lock, like
    /// every transition, so that subscribers see transitions in order.
    pub(super) fn enter_half_open(&self, w: Word) -> Result<Word, Word> {
        let mut book = self.lock();
        let next = Word::half_open(w.next_generation(), 0, 0);
        self.cas(w, next)?;
        self.forget_probes(&mut book);
        self.announce(book, self.transition(State::Open, next, None, None));
        Ok(next)
    }

    /// An automatic refusal; in shadow mode, a pass that a real breaker
    /// would have refused, and whose outcome it would never have seen.
    fn refuse(&self, w: Word, state: State, retry_at: Instant, until_ms: Option<u64>) -> Decision {
        if self.hot.shadow.load(Ordering::Relaxed) {
            return Decision::Bypass {
                counted: false,
                shadowed: true,
            };
        }
        Decision::Refuse {
            retry_at,
            state,
            word: w,
            until_ms,
        }
    }

    /// Counts a call admitted, or refused, by a path without a service
    /// clone of its own.
    pub(crate) fn count_call(&self, admitted: bool) {
        let counter = if admitted {
            &self.counters.calls
        } else {
            &self.counters.rejected
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call of this breaker's refused by its parent, by a path
    /// without a service clone of its own.
    pub(crate) fn count_parent_refusal(&self) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        self.counters
            .rejected_by_parent
            .fetch_add(1, Ordering::Relaxed);
    }
}
