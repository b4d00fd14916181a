//! The state one breaker's handles share, and every transition between
//! states.
//!
//! The state word (see [`state`](super::state)) is the single source of
//! truth. Lock-free paths read it and change it with one compare-and-swap:
//! admission in every state, the open to half-open step, taking and giving
//! back probe permits. Transitions that must also update the bookkeeping
//! under the mutex (tripping, reopening, closing) take the mutex first and
//! then compare-and-swap, so a change made by a lock-free path in between
//! makes them re-read instead of overwrite. The thread whose
//! compare-and-swap succeeds performs the transition and emits its event:
//! exactly one event per transition.

mod fleet;
mod manual;
mod prober;
mod probes;
mod tally;

pub(crate) use manual::Command;
pub(crate) use prober::{Prober, Turn};
use probes::ProbeBook;
pub(crate) use probes::Ticket;
use tally::Tally;

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::admission::Decision;
use super::clones::Clones;
use super::fleet::FleetLink;
use super::state::{Manual, Tag, Word, MAX_DEADLINE_MS};
use crate::classify::Outcome;
use crate::config::Config;
use crate::events::Transition;
use crate::millis::millis_up;
use crate::policy::{PolicyState, Sample, TripReason};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Mutex, MutexGuard, Ordering};
use crate::{Counts, Snapshot, State};

/// Transitions a subscriber may fall behind by before it skips ahead.
pub(crate) const EVENT_CAPACITY: usize = 64;

/// A closed-state success changes nothing: skip it.
const QUIET: u8 = 0;
/// A closed-state success only adds a call to a bucket of time: tally it.
const TALLY: u8 = 1;
/// A closed-state success could change the policy's verdict: record it.
const RECORD: u8 = 2;

/// Keeps hot, read-mostly fields off the cache lines that slow paths write.
#[repr(align(128))]
struct Padded<T>(T);

struct Hot {
    word: AtomicU64,
    /// What a closed-state success does: nothing ([`QUIET`], it writes
    /// nothing shared), add to the tally ([`TALLY`]), or take the lock to be
    /// recorded ([`RECORD`]).
    success: AtomicU8,
    /// Earliest deadline of an in-flight probe, or `u64::MAX`.
    probe_deadline_ms: AtomicU64,
    /// Shadow mode: every refusal becomes a pass (read on refusals only).
    shadow: AtomicBool,
    /// Evicted from its registry: a keyed service that remembers this
    /// breaker must look its key up again (read on every keyed call,
    /// written once).
    retired: AtomicBool,
    /// The trip policy learns from latencies: every call reads the clock
    /// (read on every call, beside the state word; written on reconfigure).
    needs_latency: AtomicBool,
}

#[derive(Default)]
struct Counters {
    /// Calls admitted and refused on paths without a service clone of
    /// their own (keyed services); clones count theirs in `clones`.
    calls: AtomicU64,
    rejected: AtomicU64,
    failures: AtomicU64,
    ignored: AtomicU64,
    stale: AtomicU64,
    cancelled: AtomicU64,
    opened: AtomicU64,
    probes: AtomicU64,
    /// A registry's insertion count when this breaker was last used: a
    /// cheap clock for eviction order, written only when it has moved on
    /// by the registry's marking interval.
    used_at: AtomicU64,
    /// Handles on this breaker that its registry's keyed services keep for
    /// themselves (keys a service clone remembers, calls in flight): they
    /// do not hold the breaker in the registry, as a user's handle does.
    internal_handles: AtomicU64,
}

/// Bookkeeping behind the mutex: the policy's counters and what a
/// transition needs to know about the past.
pub(super) struct Book {
    policy: PolicyState,
    /// Failed probe rounds since the breaker last closed.
    attempt: u32,
    /// The latest end of a retry-after hint announced by the upstream.
    hint_until_ms: Option<u64>,
    last_trip: Option<TripReason>,
    /// When the current closed or open period began.
    since_ms: u64,
    /// End of the latest open period: when half-open began.
    open_until_ms: u64,
    /// Deadlines of in-flight probes.
    probes: ProbeBook,
    /// The config; lock-free paths read the copies in `Tuning`.
    config: Config,
    rng: u64,
    /// The policy counts calls in buckets of time: successes that do not
    /// matter go to the tally.
    tallies: bool,
    /// The tally is armed: successes may have been added to it since it
    /// was last drained.
    tally_armed: bool,
    /// What this breaker knows of the fleet's state, when it shares one.
    fleet: fleet::FleetBook,
    /// Retired by its registry: where the outcomes of calls it admitted go.
    successor: Option<Successor>,
}

/// Takes the outcomes of calls a retired breaker admitted: the breaker its
/// registry now holds for the same key.
pub(crate) type Successor =
    Arc<dyn Fn(Outcome, Option<Duration>, Option<(Duration, Instant)>) + Send + Sync>;

/// What lock-free paths read of the config, kept up to date by `tune`.
#[derive(Default)]
struct Tuning {
    probes: AtomicU32,
    max_open_ms: AtomicU64,
    probe_timeout: AtomicBool,
    needs_clock: AtomicBool,
    /// The lowest slow-call threshold in nanoseconds (`u64::MAX`: none): a
    /// slower success is always recorded.
    slow_ns: AtomicU64,
    /// The length of the latest open period: the most a refusal while
    /// half-open tells callers to wait (see [`Shared::half_open_wait_ms`]).
    open_period_ms: AtomicU64,
}

pub(crate) struct Shared {
    name: Arc<str>,
    tuning: Tuning,
    hot: Padded<Hot>,
    counters: Padded<Counters>,
    book: Mutex<Book>,
    /// Successes counted without the lock, made on the first tuning to a
    /// policy that counts calls in time.
    tally: OnceLock<Box<Tally>>,
    pub(crate) clones: Clones,
    /// Made on first subscription: unsubscribed breakers pay nothing.
    events: OnceLock<broadcast::Sender<Transition>>,
    /// A registry's channel, which every breaker it made also announces to.
    forward: OnceLock<broadcast::Sender<Transition>>,
    /// This breaker, for the tasks it starts (which must not keep it alive).
    me: Weak<Shared>,
    /// Active probing: what starts the probe task, and whether one runs.
    prober: OnceLock<Box<dyn Prober>>,
    prober_running: AtomicBool,
    epoch: Instant,
    /// The fleet backend this breaker reports to, if any.
    link: OnceLock<Box<dyn FleetLink>>,
}

impl Shared {
    /// A new breaker, closed.
    pub(crate) fn new_arc(config: Config) -> Arc<Self> {
        Arc::new_cyclic(|me| Shared::new(config, me.clone()))
    }

    fn new(config: Config, me: Weak<Shared>) -> Self {
        crate::events::created(&config.name);
        let policy = PolicyState::new(&config.trip);
        Shared {
            name: Arc::clone(&config.name),
            tuning: Tuning::default(),
            hot: Padded(Hot {
                word: AtomicU64::new(Word::closed(0).0),
                // Set by `tuned`, which knows whether the policy tallies.
                success: AtomicU8::new(QUIET),
                probe_deadline_ms: AtomicU64::new(u64::MAX),
                shadow: AtomicBool::new(false),
                retired: AtomicBool::new(false),
                needs_latency: AtomicBool::new(false),
            }),
            counters: Padded(Counters::default()),
            tally: OnceLock::new(),
            clones: Clones::default(),
            book: Mutex::new(Book {
                policy,
                attempt: 0,
                hint_until_ms: None,
                last_trip: None,
                since_ms: 0,
                open_until_ms: 0,
                probes: ProbeBook::new(0),
                rng: seed(),
                tallies: false,
                tally_armed: false,
                config: config.clone(),
                fleet: fleet::FleetBook::default(),
                successor: None,
            }),
            events: OnceLock::new(),
            forward: OnceLock::new(),
            me,
            prober: OnceLock::new(),
            prober_running: AtomicBool::new(false),
            epoch: Instant::now(),
            link: OnceLock::new(),
        }
        .tuned(&config)
    }

    /// Copies what lock-free paths read of `config` into atomics, and sizes
    /// the probe book.
    fn tuned(self, config: &Config) -> Self {
        let mut book = self.lock();
        self.tune(&mut book, config);
        self.refresh_success_flag(&book);
        drop(book);
        self
    }

    fn tune(&self, book: &mut Book, config: &Config) {
        let t = &self.tuning;
        t.probes.store(config.probes, Ordering::Relaxed);
        t.max_open_ms
            .store(millis_up(config.max_open), Ordering::Relaxed);
        t.probe_timeout
            .store(config.probe_timeout.is_some(), Ordering::Relaxed);
        self.hot
            .0
            .needs_latency
            .store(config.trip.needs_latency(), Ordering::Relaxed);
        t.needs_clock
            .store(config.trip.needs_clock(), Ordering::Relaxed);
        let slow_ns = config.trip.slow_threshold().map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        });
        t.slow_ns.store(slow_ns, Ordering::Relaxed);
        book.tallies = book.policy.tally_end(0).is_some() && !book.policy.records_every_success();
        if book.tallies {
            self.tally.get_or_init(|| Box::new(Tally::new()));
        }
        let slots = if config.probe_timeout.is_some() {
            config.probes as usize
        } else {
            0
        };
        book.probes = ProbeBook::new(slots);
    }

    /// Replaces the config, keeping the state, the counts and the open
    /// period: a reload never forgives an outage in progress. The trip
    /// policy's figures are kept when the policy is unchanged and start
    /// afresh when it changed. A half-open round in progress starts again
    /// under the new rules (its probes' outcomes are then dropped).
    pub(crate) fn reconfigure(&self, mut config: Config) {
        config.name = Arc::clone(&self.name);
        let mut book = self.lock();
        if book.config.trip != config.trip {
            self.discard_tally(&mut book);
            book.policy = PolicyState::new(&config.trip);
        }
        self.tune(&mut book, &config);
        book.config = config;
        self.forget_probes(&mut book);
        self.refresh_success_flag(&book);
        let mut w = self.load();
        while w.tag() == Tag::HalfOpen {
            match self.cas(w, Word::half_open(w.next_generation(), 0, 0)) {
                Ok(()) => break,
                Err(actual) => w = actual,
            }
        }
        drop(book);
        self.clones.wake_all();
    }

    /// The current config.
    pub(crate) fn config(&self) -> Config {
        self.lock().config.clone()
    }

    /// Whether calls must be timed (a slow-call policy).
    #[inline]
    pub(crate) fn needs_latency(&self) -> bool {
        self.hot.0.needs_latency.load(Ordering::Relaxed)
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    #[inline]
    pub(crate) fn load(&self) -> Word {
        Word(self.hot.0.word.load(Ordering::Acquire))
    }

    fn cas(&self, current: Word, next: Word) -> Result<(), Word> {
        self.hot
            .0
            .word
            .compare_exchange(current.0, next.0, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(Word)
    }

    #[inline]
    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// The instant `ms` milliseconds after the epoch.
    pub(crate) fn instant_at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    fn ms_at(&self, instant: Instant) -> u64 {
        let elapsed = instant.saturating_duration_since(self.epoch);
        // In u64: `as_millis` would compute in u128 on the refusal path.
        elapsed
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(elapsed.subsec_millis()))
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        // The lock is never held across user code, so a poisoned lock can
        // only come from a bug in this crate; keep serving rather than panic.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn is_half_open_in(&self, generation: u32) -> bool {
        let w = self.load();
        w.tag() == Tag::HalfOpen && w.generation() == generation
    }

    /// Decides about one call. Closed costs one atomic load; open reads the
    /// clock once; an elapsed open period is turned into half-open here, by
    /// whichever caller sees it first.
    #[inline]
    pub(crate) fn admit(self: &Arc<Self>) -> Decision {
        let w = self.load();
        if w.tag() == Tag::Closed {
            return Decision::Closed(w.generation());
        }
        self.admit_slow(w)
    }

    /// A fail-fast refusal's common case, without building a decision:
    /// the state word `w` is open, its period not over, and shadow mode is
    /// off. Returns the milliseconds left; `None` sends the caller to
    /// [`admit`](Self::admit).
    #[inline]
    pub(crate) fn refuses_open(&self, w: Word) -> Option<u64> {
        if w.tag() != Tag::Open || self.hot.0.shadow.load(Ordering::Relaxed) {
            return None;
        }
        let now = self.now_ms();
        w.open_until_ms().checked_sub(now).filter(|&left| left > 0)
    }

    #[cold]
    fn admit_slow(self: &Arc<Self>, mut w: Word) -> Decision {
        let now = self.now_ms();
        loop {
            match w.tag() {
                Tag::Closed => return Decision::Closed(w.generation()),
                Tag::Open => {
                    if now < w.open_until_ms() {
                        let until_ms = w.open_until_ms();
                        return self.refuse(w, State::Open, until_ms - now, Some(until_ms));
                    }
                    if self.prober_running.load(Ordering::Acquire) {
                        // Its probe task, not a user's request, probes.
                        return self.refuse(w, State::HalfOpen, self.probe_interval_ms(), None);
                    }
                    w = self.enter_half_open(w).unwrap_or_else(|actual| actual);
                }
                Tag::HalfOpen if self.prober_running.load(Ordering::Acquire) => {
                    return self.refuse(w, State::HalfOpen, self.probe_interval_ms(), None);
                }
                Tag::HalfOpen => {
                    // A probe past its deadline is dealt with first, whether
                    // or not a permit is free.
                    let deadline = self.hot.0.probe_deadline_ms.load(Ordering::Acquire);
                    if deadline != u64::MAX && now >= deadline {
                        self.time_out_probes(w.generation(), now);
                        let fresh = self.load();
                        if fresh != w {
                            w = fresh;
                            continue;
                        }
                    }
                    if w.in_flight() < self.tuning.probes.load(Ordering::Relaxed) {
                        match self.take_permit(w, now) {
                            Ok(permit) => return Decision::Probe(permit),
                            Err(actual) => {
                                w = actual;
                                continue;
                            }
                        }
                    }
                    let retry_after_ms = self.half_open_wait_ms(deadline, now);
                    let until_ms = (deadline != u64::MAX).then_some(deadline);
                    return self.refuse(w, State::HalfOpen, retry_after_ms, until_ms);
                }
                Tag::Manual => {
                    return match w.manual_mode() {
                        // An operator's isolation holds even in shadow mode:
                        // nobody knows when it ends; say so with `max_open`.
                        Manual::Isolated => Decision::Reject {
                            retry_after_ms: self.tuning.max_open_ms.load(Ordering::Relaxed),
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
    fn half_open_wait_ms(&self, probe_deadline_ms: u64, now: u64) -> u64 {
        let open_period = self.tuning.open_period_ms.load(Ordering::Relaxed);
        probe_deadline_ms.saturating_sub(now).min(open_period)
    }

    /// Books an open period from `since_ms` to `until_ms`: when it began,
    /// when half-open begins, and how long it was.
    pub(super) fn book_open_period(&self, book: &mut Book, since_ms: u64, until_ms: u64) {
        book.since_ms = since_ms;
        book.open_until_ms = until_ms;
        self.tuning
            .open_period_ms
            .store(until_ms.saturating_sub(since_ms), Ordering::Relaxed);
    }

    /// Moves open word `w`, whose period has ended, to half-open; returns
    /// the new word, or the one that changed under us. Under the lock, like
    /// every transition, so that subscribers see transitions in order.
    fn enter_half_open(&self, w: Word) -> Result<Word, Word> {
        let mut book = self.lock();
        let next = Word::half_open(w.next_generation(), 0, 0);
        self.cas(w, next)?;
        self.forget_probes(&mut book);
        self.announce(book, self.transition(State::Open, next, None, None));
        Ok(next)
    }

    /// An automatic refusal; in shadow mode, a pass that a real breaker
    /// would have refused, and whose outcome it would never have seen.
    fn refuse(
        &self,
        w: Word,
        state: State,
        retry_after_ms: u64,
        until_ms: Option<u64>,
    ) -> Decision {
        if self.hot.0.shadow.load(Ordering::Relaxed) {
            return Decision::Bypass {
                counted: false,
                shadowed: true,
            };
        }
        Decision::Reject {
            retry_after_ms,
            state,
            word: w,
            until_ms,
        }
    }

    /// Counts a call admitted, or refused, by a path without a service
    /// clone of its own.
    pub(crate) fn count_call(&self, admitted: bool) {
        let counter = if admitted {
            &self.counters.0.calls
        } else {
            &self.counters.0.rejected
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call dropped before its outcome was known.
    pub(crate) fn count_cancelled(&self) {
        self.counters.0.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the outcome of a call let through without feeding the policy.
    pub(crate) fn count_outcome(&self, outcome: Outcome) {
        match outcome {
            Outcome::Failure => self.counters.0.failures.fetch_add(1, Ordering::Relaxed),
            Outcome::Ignore => self.counters.0.ignored.fetch_add(1, Ordering::Relaxed),
            Outcome::Success => return,
        };
    }

    /// Records the outcome of a call admitted while closed in `generation`;
    /// `timing` is the call's latency and end, when a policy times calls.
    #[inline]
    pub(crate) fn record_closed(
        &self,
        generation: u32,
        outcome: Outcome,
        hint: Option<Duration>,
        timing: Option<(Duration, Instant)>,
    ) {
        match outcome {
            Outcome::Ignore => {
                self.counters.0.ignored.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Success => {
                let mode = self.hot.0.success.load(Ordering::Relaxed);
                match (mode, timing) {
                    // The common case: nothing to reset, nothing to write.
                    (QUIET, None) => {}
                    (RECORD, None) => self.record_closed_slow(generation, false, hint, None),
                    _ => self.record_success(generation, mode, hint, timing),
                }
            }
            Outcome::Failure => self.record_closed_slow(generation, true, hint, timing),
        }
    }

    /// A closed-state success that a policy may need: recorded under the
    /// lock when it could change a verdict or may be a slow call, tallied
    /// when it only adds a call to a bucket of time, and skipped otherwise.
    fn record_success(
        &self,
        generation: u32,
        mode: u8,
        hint: Option<Duration>,
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
            self.record_closed_slow(generation, false, hint, timing);
        }
    }

    /// Adds a success of closed generation `generation` to the tally; false
    /// when it must be recorded under the lock instead (the breaker has
    /// moved on, which the lock finds stale, or the tally cannot take it).
    fn tally_success(&self, generation: u32, timing: Option<(Duration, Instant)>) -> bool {
        let Some(tally) = self.tally.get() else {
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
        let Some(tally) = self.tally.get() else {
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
    fn arm_tally(&self, book: &mut Book, w: Word, now: u64) {
        if self.hot.0.success.load(Ordering::Relaxed) != TALLY || w.tag() != Tag::Closed {
            return;
        }
        let (Some(tally), Some(end_ms)) = (self.tally.get(), book.policy.tally_end(now)) else {
            return;
        };
        book.tally_armed = tally.arm(w.generation(), end_ms);
    }

    /// Forgets the tally, disarmed.
    fn discard_tally(&self, book: &mut Book) {
        if std::mem::take(&mut book.tally_armed) {
            if let Some(tally) = self.tally.get() {
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
        failure: bool,
        hint: Option<Duration>,
        timing: Option<(Duration, Instant)>,
    ) {
        let mut book = self.lock();
        let w = self.load();
        if w != Word::closed(generation) {
            self.counters.0.stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Some(successor) = book.successor.clone() {
            // Retired: the key's breaker now is another; the call counts
            // there (outside this lock: it may take the registry's).
            drop(book);
            let outcome = if failure {
                Outcome::Failure
            } else {
                Outcome::Success
            };
            successor(outcome, hint, timing);
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
            self.counters.0.failures.fetch_add(1, Ordering::Relaxed);
            self.note_hint(&mut book, hint, now);
        }
        let verdict = book.policy.record(Sample { failure, elapsed }, now);
        self.fleet_outcome(&mut book, failure);
        // An upstream that announced when to come back is not worth the
        // rest of the threshold, when so configured.
        let pushback = match hint {
            Some(hint) if failure && book.config.trip_on_pushback => Some(TripReason::Pushback {
                retry_after: hint.min(book.config.max_open),
            }),
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
            self.counters.0.stale.fetch_add(1, Ordering::Relaxed);
            self.refresh_success_flag(&book);
            return;
        }
        self.reset_policy(&mut book);
        self.refresh_success_flag(&book);
        self.fleet_opened(&mut book, until.saturating_sub(now));
        self.opened(book, State::Closed, next, reason, now);
    }

    /// The breaker has just moved from `from` to open word `next`, its
    /// period counted from `since_ms`: book it and announce it.
    pub(super) fn opened(
        &self,
        mut book: MutexGuard<'_, Book>,
        from: State,
        next: Word,
        reason: TripReason,
        since_ms: u64,
    ) {
        book.last_trip = Some(reason.clone());
        self.book_open_period(&mut book, since_ms, next.open_until_ms());
        book.hint_until_ms = None;
        self.forget_probes(&mut book);
        self.counters.0.opened.fetch_add(1, Ordering::Relaxed);
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
        mut book: MutexGuard<'_, Book>,
        from: State,
        next: Word,
        reason: Option<TripReason>,
    ) {
        book.attempt = 0;
        book.hint_until_ms = None;
        book.since_ms = self.now_ms();
        self.reset_policy(&mut book);
        self.forget_probes(&mut book);
        self.refresh_success_flag(&book);
        self.announce(book, self.transition(from, next, reason, None));
    }

    fn refresh_success_flag(&self, book: &Book) {
        // A retired breaker passes every success on.
        let matters = book.policy.success_matters() || book.successor.is_some();
        // A fleet count known to hold failures is reset by a success.
        let matters = matters || book.fleet.failures;
        let mode = if matters {
            RECORD
        } else if book.tallies {
            TALLY
        } else {
            QUIET
        };
        // Write only on change: the flag shares a line with the state word.
        if self.hot.0.success.load(Ordering::Relaxed) != mode {
            self.hot.0.success.store(mode, Ordering::Relaxed);
        }
    }

    fn note_hint(&self, book: &mut Book, hint: Option<Duration>, now: u64) {
        if let Some(hint) = hint {
            let capped = millis_up(hint.min(book.config.max_open));
            let until = now.saturating_add(capped);
            book.hint_until_ms = Some(book.hint_until_ms.map_or(until, |u| u.max(until)));
        }
    }

    /// End of the next open period, starting at `from_ms`: the policy's
    /// period for this attempt, lengthened by jitter, never under `min_open`,
    /// never under an announced retry-after, never over `max_open`.
    fn open_until(&self, book: &mut Book, from_ms: u64) -> u64 {
        let c = &book.config;
        let active = book.attempt > 0 && self.prober.get().is_some();
        let mut period = if active {
            // Probing actively: a failed probe is followed by the next one
            // an interval later, not by a longer and longer wait. Users are
            // refused from the trip until the breaker closes, and the first
            // probe came after `min_open`: that floor is already kept.
            c.probe_interval
        } else {
            c.open_period(book.attempt)
        };
        // Jitter lengthens, never shortens: `cooldown` (and every period
        // after it) is the least time before a probe, as users read it and
        // as other breakers and backoffs that jitter a wait treat it.
        if c.jitter > 0.0 {
            let share = c.jitter * next_unit(&mut book.rng);
            period = Duration::try_from_secs_f64(period.as_secs_f64() * (1.0 + share))
                .unwrap_or(c.max_open);
        }
        let mut until = from_ms.saturating_add(millis_up(period));
        // Read, not taken: the caller clears it once the transition is made.
        if let Some(hint) = book.hint_until_ms {
            until = until.max(hint);
        }
        until
            .min(from_ms.saturating_add(millis_up(c.max_open)))
            .min(MAX_DEADLINE_MS)
    }

    /// Tells the world about a transition: the event, then every waiting
    /// gate-mode clone.
    ///
    /// Subscribers get it while the lock is still held (sending never
    /// waits), so they see one breaker's transitions in order; the `tracing`
    /// event and the wake-ups follow once it is released.
    pub(super) fn announce(&self, book: MutexGuard<'_, Book>, transition: Transition) {
        // No subscriber left is not an error.
        if let Some(events) = self.events.get() {
            let _ = events.send(transition.clone());
        }
        if let Some(registry) = self.forward.get() {
            let _ = registry.send(transition.clone());
        }
        drop(book);
        transition.publish();
        self.clones.wake_all();
        if transition.to == State::Open {
            self.start_prober();
        }
    }

    /// Also announces every transition to `registry`.
    pub(crate) fn forward_to(&self, registry: broadcast::Sender<Transition>) {
        let _ = self.forward.set(registry);
    }

    /// Marks a use at registry insertion count `now`, unless one was marked
    /// less than `every` insertions ago: repeated use of a hot key writes
    /// nothing, and keys arriving all the time make it write at most once
    /// in `every` of them.
    #[inline]
    pub(crate) fn mark_used(&self, now: u64, every: u64) {
        let used_at = &self.counters.0.used_at;
        if now.wrapping_sub(used_at.load(Ordering::Relaxed)) >= every {
            used_at.store(now, Ordering::Relaxed);
        }
    }

    /// The registry insertion count at the last use.
    pub(crate) fn used_at(&self) -> u64 {
        self.counters.0.used_at.load(Ordering::Relaxed)
    }

    /// Retires this breaker from its registry if it is closed, and is not
    /// in shadow mode nor probing actively (whose settings a new breaker
    /// for the key would not have). Every transition holds the lock taken
    /// here, so a breaker that trips meanwhile is not retired. Services
    /// that remember it look the key up again, and the outcomes of calls it
    /// admitted go to `successor`: every success takes the lock from now on
    /// to be passed on.
    pub(crate) fn retire_if_idle(this: &Arc<Self>, successor: Successor) -> bool {
        let mut book = this.lock();
        if !Self::is_evictable(this) {
            return false;
        }
        book.successor = Some(successor);
        this.refresh_success_flag(&book);
        this.hot.0.retired.store(true, Ordering::Release);
        true
    }

    /// Whether its registry may evict it: closed, not in shadow mode, not
    /// probing actively, and held by nothing but the registry itself and
    /// its keyed services' own handles (`this` is the registry's own). A user's [`Breaker`](crate::Breaker), or a service or a
    /// layer built from one, holds the breaker: evicted, it would go on
    /// guarding that user's calls with a breaker that no longer counts its
    /// key's failures. (A keyed call in flight does not hold its breaker:
    /// evicted meanwhile, its outcome goes to the key's breaker then.)
    pub(crate) fn is_evictable(this: &Arc<Self>) -> bool {
        let others = Arc::strong_count(this) as u64 - 1;
        this.load().tag() == Tag::Closed
            && !this.hot.0.shadow.load(Ordering::Relaxed)
            && this.prober.get().is_none()
            && others <= this.counters.0.internal_handles.load(Ordering::Acquire)
    }

    /// A keyed service takes (`true`) or drops a handle of its own on this
    /// breaker: one that does not hold it in its registry. Taken after the
    /// handle is made and dropped before it goes, so that the count never
    /// exceeds such handles and the breaker at worst reads as held.
    pub(crate) fn note_internal_handle(&self, taken: bool) {
        let count = &self.counters.0.internal_handles;
        if taken {
            count.fetch_add(1, Ordering::AcqRel);
        } else {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Records the outcome of a call another breaker admitted (one retired
    /// since), in the current closed generation; dropped if not closed.
    pub(crate) fn record_forwarded(
        &self,
        outcome: Outcome,
        hint: Option<Duration>,
        timing: Option<(Duration, Instant)>,
    ) {
        let w = self.load();
        if w.tag() == Tag::Closed {
            self.record_closed(w.generation(), outcome, hint, timing);
        }
    }

    /// Whether its registry has evicted it.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.hot.0.retired.load(Ordering::Acquire)
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
        self.hot.0.success.load(Ordering::Relaxed) == QUIET
    }

    /// A receiver of this breaker's transitions from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.events
            .get_or_init(|| broadcast::channel(EVENT_CAPACITY).0)
            .subscribe()
    }

    fn transition(
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
            shadow: self.hot.0.shadow.load(Ordering::Relaxed),
        }
    }

    /// The state as a reader should see it: an open breaker whose period
    /// has ended reads as half-open, whether or not a caller has moved it.
    pub(crate) fn state(&self) -> State {
        state_at(self.load(), self.now_ms())
    }

    pub(crate) fn retry_after(&self) -> Option<Duration> {
        retry_after_at(self.load(), self.now_ms())
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let (calls, rejected) = self.clones.totals();
        let calls = calls + self.counters.0.calls.load(Ordering::Relaxed);
        let rejected = rejected + self.counters.0.rejected.load(Ordering::Relaxed);
        let mut book = self.lock();
        let w = self.load();
        let now = self.now_ms();
        self.fold_tally(&mut book, w);
        let state = state_at(w, now);
        let since = match w.tag() {
            Tag::Open if now >= w.open_until_ms() => w.open_until_ms(),
            Tag::HalfOpen => book.open_until_ms,
            _ => book.since_ms,
        };
        let (probes_in_flight, probe_successes) = match w.tag() {
            Tag::HalfOpen => (w.in_flight(), w.successes()),
            _ => (0, 0),
        };
        let policy = book.policy.figures(now);
        self.arm_tally(&mut book, w, now);
        let c = &self.counters.0;
        Snapshot {
            name: Arc::clone(self.name()),
            state,
            generation: w.generation(),
            time_in_state: Duration::from_millis(now.saturating_sub(since)),
            retry_after: retry_after_at(w, now),
            probes_in_flight,
            probe_successes,
            failed_probe_rounds: book.attempt,
            last_trip: book.last_trip.clone(),
            policy,
            shadow: self.hot.0.shadow.load(Ordering::Relaxed),
            counts: Counts {
                calls,
                rejected,
                failures: c.failures.load(Ordering::Relaxed),
                ignored: c.ignored.load(Ordering::Relaxed),
                stale: c.stale.load(Ordering::Relaxed),
                cancelled: c.cancelled.load(Ordering::Relaxed),
                opened: c.opened.load(Ordering::Relaxed),
                probes: c.probes.load(Ordering::Relaxed),
            },
        }
    }
}

/// The state as a reader should see it at `now_ms`: an open breaker whose
/// period has ended reads as half-open, whether or not a caller has moved it.
fn state_at(w: Word, now_ms: u64) -> State {
    match w.tag() {
        Tag::Open if now_ms >= w.open_until_ms() => State::HalfOpen,
        _ => state_of(w),
    }
}

/// The rest of the open period at `now_ms`, while open.
fn retry_after_at(w: Word, now_ms: u64) -> Option<Duration> {
    (w.tag() == Tag::Open && now_ms < w.open_until_ms())
        .then(|| Duration::from_millis(w.open_until_ms() - now_ms))
}

pub(crate) fn state_of(w: Word) -> State {
    match w.tag() {
        Tag::Closed => State::Closed,
        Tag::Open => State::Open,
        Tag::HalfOpen => State::HalfOpen,
        Tag::Manual => match w.manual_mode() {
            Manual::Isolated => State::ForcedOpen,
            Manual::ForcedClosed => State::ForcedClosed,
            Manual::Disabled => State::Disabled,
        },
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", self.name())
            .field("word", &self.load())
            .finish_non_exhaustive()
    }
}

fn seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    h.finish() | 1
}

/// A uniform number in [0, 1) from a xorshift generator.
fn next_unit(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(all(test, not(tcb_loom)))]
mod tests {
    use super::*;
    use crate::policy::{CountWindow, SlowCalls, TimeWindow, TripPolicy};

    fn shared(policy: impl Into<TripPolicy>) -> Arc<Shared> {
        Shared::new_arc(Config::builder().trip(policy).build().unwrap())
    }

    fn mode(shared: &Shared) -> u8 {
        shared.hot.0.success.load(Ordering::Relaxed)
    }

    /// A successor that notes what it is given.
    fn noting() -> (Successor, Arc<Mutex<Vec<Outcome>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let noted = Arc::clone(&seen);
        let successor: Successor = Arc::new(move |outcome, _, _| {
            noted.lock().unwrap().push(outcome);
        });
        (successor, seen)
    }

    #[test]
    fn a_retired_breaker_passes_every_outcome_of_its_generation_on() {
        let shared = shared(CountWindow::new(2, 10));
        let (successor, seen) = noting();
        assert_eq!(mode(&shared), QUIET);
        assert!(Shared::retire_if_idle(&shared, successor));
        assert!(shared.is_retired());
        assert_eq!(mode(&shared), RECORD, "successes take the lock");
        shared.record_closed(0, Outcome::Success, None, None);
        shared.record_closed(0, Outcome::Failure, None, None);
        shared.record_closed(0, Outcome::Failure, None, None);
        shared.record_closed(1, Outcome::Failure, None, None); // stale
        assert_eq!(
            *seen.lock().unwrap(),
            [Outcome::Success, Outcome::Failure, Outcome::Failure]
        );
        assert_eq!(shared.state(), State::Closed, "nothing counted here");
        assert_eq!(shared.snapshot().counts.failures, 0);
    }

    #[test]
    fn only_an_idle_closed_breaker_retires() {
        let open = shared(CountWindow::new(1, 10));
        open.record_closed(0, Outcome::Failure, None, None);
        assert_eq!(open.state(), State::Open);
        assert!(!Shared::retire_if_idle(&open, noting().0));
        assert!(!open.is_retired());

        let shadowed = shared(CountWindow::new(1, 10));
        shadowed.set_shadow(true);
        assert!(!Shared::retire_if_idle(&shadowed, noting().0));
        assert!(!shadowed.is_retired());
    }

    #[test]
    fn time_window_successes_go_to_the_tally_not_the_lock() {
        let shared = shared(TimeWindow::new(Duration::from_secs(3_600)));
        assert_eq!(mode(&shared), TALLY);
        for _ in 0..10 {
            shared.record_closed(0, Outcome::Success, None, None);
        }
        // The first took the lock, which armed the tally for the rest.
        assert_eq!(shared.tally.get().unwrap().drain_total(), 9);
    }

    #[test]
    fn a_time_window_near_its_rate_records_successes_at_once() {
        let shared = shared(
            TimeWindow::new(Duration::from_secs(3_600))
                .min_calls(4)
                .failure_rate(0.5),
        );
        shared.record_closed(0, Outcome::Failure, None, None);
        assert_eq!(mode(&shared), TALLY, "1 failure in 4 calls would not trip");
        shared.record_closed(0, Outcome::Failure, None, None);
        assert_eq!(mode(&shared), RECORD, "2 failures in 4 calls would");
        shared.record_closed(0, Outcome::Success, None, None);
        assert_eq!(
            shared.tally.get().unwrap().drain_total(),
            0,
            "nothing tallied"
        );
        assert_eq!(
            shared.snapshot().policy,
            crate::policy::PolicyFigures::TimeWindow {
                calls: 3,
                failures: 2
            },
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
            shared.record_closed(0, Outcome::Success, None, fast);
            assert_eq!(mode(&shared), RECORD, "the window is still filling");
        }
        shared.record_closed(0, Outcome::Success, None, fast);
        assert_eq!(mode(&shared), QUIET);
        assert!(
            shared.tally.get().is_none(),
            "a window of calls tallies nothing"
        );
    }

    #[test]
    fn policies_without_time_windows_never_tally() {
        let shared = shared(CountWindow::new(2, 5));
        assert_eq!(mode(&shared), QUIET);
        assert!(shared.tally.get().is_none());
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
        assert!(shared.tally.get().is_none(), "no tally made for nothing");
    }
}
