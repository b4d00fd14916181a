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
//!
//! This file holds the state itself (the hot word, the counters, the book
//! behind the lock) and its configuration; each concern that acts on it
//! has a file of its own, in the order a call meets them:
//!
//! | file | owns |
//! | --- | --- |
//! | `admit` | what the breaker says about one call, in every state |
//! | `probes` | half-open permits, their deadlines, what a probe's outcome does |
//! | `record` | what a closed call's outcome does to the trip policy |
//! | `tally` | successes counted without the lock |
//! | `transition` | opening, closing, the next open period, announcing |
//! | `manual` | an operator's commands and shadow mode |
//! | `signal` | openings and outcomes reported from outside any call |
//! | `prober` | the core's side of active probing |
//! | `fleet` | taking in what a fleet backend decided |
//! | `supersede` | handing outcomes on to a breaker that takes this one's place; the two words its keeper uses on it |
//! | `snapshot` | reading state, retry-after and a snapshot |

mod admit;
mod fleet;
mod manual;
mod prober;
mod probes;
mod record;
mod signal;
mod snapshot;
mod supersede;
mod tally;
mod transition;

pub use manual::Control;
pub(crate) use prober::{Prober, Turn};
use probes::ProbeBook;
pub(crate) use probes::Ticket;
use tally::Tally;

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::clones::Clones;
use super::fleet::FleetLink;
use super::state::{Manual, Tag, Word};
use crate::config::{Config, LatencyTo, Settings};
use crate::events::State;
use crate::events::{Origin, Transition};
use crate::millis::millis_up;
use crate::outcome::Verdict;
use crate::policy::{PolicyState, TripReason};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Mutex, MutexGuard, Ordering};

/// Transitions a subscriber may fall behind by before it skips ahead.
pub(crate) const EVENT_CAPACITY: usize = 64;

/// A closed-state success changes nothing: skip it.
const QUIET: u8 = 0;
/// A closed-state success only adds a call to a bucket of time: tally it.
const TALLY: u8 = 1;
/// A closed-state success could change the policy's verdict: record it.
const RECORD: u8 = 2;

/// What every call reads: first in the breaker, so that it shares its
/// cache line with the reference counts and the read-mostly tuning, not
/// with the counters and the lock that slow paths write. (Padding it onto
/// lines of its own doubled the breaker's size for no measured gain: in
/// steady state nothing writes these lines.)
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
    /// Another breaker has taken its place (its registry evicted it): a
    /// handle that remembers this breaker must find the other (read on
    /// every keyed call, written once).
    superseded: AtomicBool,
    /// The trip policy learns from latencies: every call reads the clock
    /// (read on every call, beside the state word; written on reconfigure).
    needs_latency: AtomicBool,
    /// An active probe task runs: users are refused while open or
    /// half-open (read on refusals).
    prober_running: AtomicBool,
}

/// The counters a keyed call through a looked-up breaker writes come
/// first, so that they follow [`Hot`] on the line of the reference counts,
/// which such a call writes too: a lookup among many keys then misses one
/// line of the breaker, not three.
#[derive(Default)]
#[repr(C)]
struct Counters {
    /// Calls admitted and refused on paths without a service clone of
    /// their own (keyed services); clones count theirs in `clones`.
    calls: AtomicU64,
    /// A word its keeper uses as it likes (a registry: the mark of its last
    /// use, see [`Shared::keeper_mark`]).
    keeper_mark: AtomicU64,
    /// Handles its keeper's services keep for themselves, which are no
    /// user's (see [`Shared::keeper_handles`]).
    keeper_handles: AtomicU64,
    rejected: AtomicU64,
    /// Of those, refusals made by the breaker's parent (a registry's).
    rejected_by_parent: AtomicU64,
    ignored: AtomicU64,
    cancelled: AtomicU64,
}

/// Bookkeeping behind the mutex: the policy's counters and what a
/// transition needs to know about the past.
pub(super) struct Book {
    policy: PolicyState,
    /// Failed probe rounds since the breaker last closed.
    attempt: u32,
    /// The latest end of a retry-after hint announced by the upstream.
    hint_until_ms: Option<u64>,
    /// The end of a quota hold (a hint beyond `max_open`, with
    /// `max_quota_hold` set); 0: none.
    quota_until_ms: u64,
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
    /// Superseded: where the outcomes of calls it admitted go.
    successor: Option<Successor>,
    /// The counts of what happens under the lock.
    counts: BookCounts,
}

/// Counts kept under the lock: failures, stale outcomes, openings, probes.
#[derive(Default)]
struct BookCounts {
    failures: u64,
    stale: u64,
    opened: u64,
    probes: u64,
}

/// What the lock guards: the book, made the first time the breaker needs
/// it (its first outcome that must be recorded, or its first transition),
/// and until then the settings the breaker was made with. A breaker that
/// has only ever succeeded holds no book.
pub(super) struct Locked {
    made_with: Arc<Settings>,
    book: Option<Box<Book>>,
}

/// The lock, held, with the book made: what every transition works on.
pub(super) struct BookGuard<'a> {
    locked: MutexGuard<'a, Locked>,
}

impl std::ops::Deref for BookGuard<'_> {
    type Target = Book;

    fn deref(&self) -> &Book {
        match &self.locked.book {
            Some(book) => book,
            // `Shared::lock` makes the book before it hands out a guard.
            None => unreachable!("a guard always holds a book"),
        }
    }
}

impl std::ops::DerefMut for BookGuard<'_> {
    fn deref_mut(&mut self) -> &mut Book {
        match &mut self.locked.book {
            Some(book) => book,
            None => unreachable!("a guard always holds a book"),
        }
    }
}

/// Takes the outcomes of calls a superseded breaker admitted: the breaker
/// that took its place (its registry's for the same key).
pub(crate) type Successor = Arc<dyn Fn(Verdict, Option<(Duration, Instant)>) + Send + Sync>;

/// What lock-free paths read of the config, kept up to date by
/// `tune_lock_free`.
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
    /// A streamed body's limits, in nanoseconds (`u64::MAX`: none): to its
    /// first data frame, and between two.
    first_frame_ns: AtomicU64,
    frame_idle_ns: AtomicU64,
    /// How long a call waits before its cancellation is a failure, in
    /// nanoseconds (`u64::MAX`: never).
    cancelled_failure_ns: AtomicU64,
    /// What a timed call's latency runs to (`LatencyTo` as its index).
    latency_to: AtomicU8,
}

#[repr(C)]
pub(crate) struct Shared {
    hot: Hot,
    counters: Counters,
    tuning: Tuning,
    name: Arc<str>,
    epoch: Instant,
    book: Mutex<Locked>,
    /// Made on first subscription: unsubscribed breakers pay nothing.
    events: OnceLock<broadcast::Sender<Transition>>,
    /// A registry's channel, which every breaker it made also announces to.
    forward: Option<broadcast::Sender<Transition>>,
    /// What only some breakers need, made the first time one does.
    extras: OnceLock<Box<Extras>>,
}

/// What only some breakers need: a breaker called only through services
/// made for single requests, counting no calls in time, never probed
/// actively and never shared with a fleet pays one pointer for all of it.
#[derive(Default)]
struct Extras {
    /// Successes counted without the lock (a policy counting calls in time).
    tally: OnceLock<Box<Tally>>,
    /// The service clones with handles of their own, and gate-mode waiters.
    clones: Clones,
    /// Active probing: what starts the probe task, and this breaker for the
    /// tasks it starts (which must not keep it alive).
    prober: OnceLock<(Box<dyn Prober>, Weak<Shared>)>,
    /// The fleet backend this breaker reports to, if any.
    link: OnceLock<Box<dyn FleetLink>>,
    /// Outcomes fed from outside any call that counted (read by
    /// snapshots; no call path writes it).
    recorded: AtomicU64,
}

impl Shared {
    /// A new breaker, closed.
    pub(crate) fn new_arc(config: Config) -> Arc<Self> {
        Arc::new(Shared::new(config, None))
    }

    /// A new breaker, closed, that also announces every transition to
    /// `forward` (its registry's channel).
    pub(crate) fn new_arc_forwarding(
        config: Config,
        forward: broadcast::Sender<Transition>,
    ) -> Arc<Self> {
        Arc::new(Shared::new(config, Some(forward)))
    }

    fn new(config: Config, forward: Option<broadcast::Sender<Transition>>) -> Self {
        crate::events::created(&config.name);
        let shared = Shared {
            name: Arc::clone(&config.name),
            tuning: Tuning::default(),
            hot: Hot {
                word: AtomicU64::new(Word::closed(0).0),
                // Set below from a fresh policy, which knows whether it
                // tallies, and again whenever the book is made or retuned.
                success: AtomicU8::new(QUIET),
                probe_deadline_ms: AtomicU64::new(u64::MAX),
                shadow: AtomicBool::new(false),
                superseded: AtomicBool::new(false),
                needs_latency: AtomicBool::new(false),
                prober_running: AtomicBool::new(false),
            },
            counters: Counters::default(),
            book: Mutex::new(Locked {
                made_with: Arc::clone(config.settings()),
                book: None,
            }),
            events: OnceLock::new(),
            forward,
            extras: OnceLock::new(),
            epoch: Instant::now(),
        };
        shared.tune_lock_free(&config);
        // What a success does until the book exists, from a fresh policy.
        let mut fresh = PolicyState::new(config.trip());
        let tallies = tallies(&mut fresh);
        let mode = success_mode(&fresh, tallies, false);
        shared.hot.success.store(mode, Ordering::Relaxed);
        shared
    }

    /// A fresh book for `config`.
    fn new_book(&self, config: Config) -> Book {
        let mut book = Book {
            policy: PolicyState::new(config.trip()),
            attempt: 0,
            hint_until_ms: None,
            quota_until_ms: 0,
            last_trip: None,
            since_ms: 0,
            open_until_ms: 0,
            probes: ProbeBook::new(0),
            rng: seed(),
            tallies: false,
            tally_armed: false,
            config,
            fleet: fleet::FleetBook::default(),
            successor: None,
            counts: BookCounts::default(),
        };
        self.tune_book(&mut book);
        book
    }

    /// Copies what lock-free paths read of `config` into atomics.
    fn tune_lock_free(&self, config: &Config) {
        let t = &self.tuning;
        t.probes.store(config.probes(), Ordering::Relaxed);
        t.max_open_ms
            .store(millis_up(config.max_open()), Ordering::Relaxed);
        t.probe_timeout
            .store(config.probe_timeout().is_some(), Ordering::Relaxed);
        // A call's cancellation is judged by how long it waited: the call
        // must be timed.
        let times_calls =
            config.trip().needs_latency() || config.cancelled_failure_after().is_some();
        self.hot.needs_latency.store(times_calls, Ordering::Relaxed);
        t.needs_clock
            .store(config.trip().needs_clock(), Ordering::Relaxed);
        let slow_ns = config.trip().slow_threshold().map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        });
        t.slow_ns.store(slow_ns, Ordering::Relaxed);
        let ns = |limit: Option<Duration>| {
            limit.map_or(u64::MAX, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
            })
        };
        t.first_frame_ns
            .store(ns(config.first_frame_timeout()), Ordering::Relaxed);
        t.frame_idle_ns
            .store(ns(config.frame_idle_timeout()), Ordering::Relaxed);
        t.cancelled_failure_ns
            .store(ns(config.cancelled_failure_after()), Ordering::Relaxed);
        let to = match config.latency_to() {
            LatencyTo::Head => 0,
            LatencyTo::FirstFrame => 1,
            LatencyTo::End => 2,
        };
        t.latency_to.store(to, Ordering::Relaxed);
    }

    /// What a timed call's latency runs to.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn latency_to(&self) -> LatencyTo {
        match self.tuning.latency_to.load(Ordering::Relaxed) {
            0 => LatencyTo::Head,
            1 => LatencyTo::FirstFrame,
            _ => LatencyTo::End,
        }
    }

    /// Whether a call made at `start` and dropped now by its caller counts
    /// as a failure: it waited at least the config's
    /// `cancelled_failure_after`.
    pub(crate) fn cancellation_is_failure(&self, start: Option<Instant>) -> bool {
        let limit = self.tuning.cancelled_failure_ns.load(Ordering::Relaxed);
        limit != u64::MAX
            && start.is_some_and(|start| start.elapsed() >= Duration::from_nanos(limit))
    }

    /// A streamed body's limits: to its first data frame, and between two.
    #[cfg_attr(not(feature = "http-body"), allow(dead_code))]
    pub(crate) fn stream_limits(&self) -> (Option<Duration>, Option<Duration>) {
        let limit = |ns: &AtomicU64| match ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        };
        (
            limit(&self.tuning.first_frame_ns),
            limit(&self.tuning.frame_idle_ns),
        )
    }

    /// Fits the book to its config: whether successes are tallied, and the
    /// room for probe deadlines.
    fn tune_book(&self, book: &mut Book) {
        book.tallies = tallies(&mut book.policy);
        if book.tallies {
            self.extras().tally.get_or_init(|| Box::new(Tally::new()));
        }
        let slots = if book.config.probe_timeout().is_some() {
            book.config.probes() as usize
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
        if book.config.trip() != config.trip() {
            self.discard_tally(&mut book);
            book.policy = PolicyState::new(config.trip());
        }
        self.tune_lock_free(&config);
        book.config = config;
        self.tune_book(&mut book);
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
        self.wake_waiters();
    }

    /// What only some breakers need, made if need be.
    fn extras(&self) -> &Extras {
        self.extras.get_or_init(Box::default)
    }

    /// The service clones with handles of their own.
    pub(crate) fn clones(&self) -> &Clones {
        &self.extras().clones
    }

    /// Wakes every gate-mode clone waiting for this breaker to change.
    pub(super) fn wake_waiters(&self) {
        if let Some(extras) = self.extras.get() {
            extras.clones.wake_all();
        }
    }

    /// The tally, if the policy counts calls in time.
    #[inline]
    fn tally(&self) -> Option<&Tally> {
        self.extras.get()?.tally.get().map(Box::as_ref)
    }

    /// The fleet backend this breaker reports to, if any.
    fn link(&self) -> Option<&dyn FleetLink> {
        Some(self.extras.get()?.link.get()?.as_ref())
    }

    /// What starts this breaker's probe task, if it probes actively.
    fn prober(&self) -> Option<&(Box<dyn Prober>, Weak<Shared>)> {
        self.extras.get()?.prober.get()
    }

    /// The current config.
    pub(crate) fn config(&self) -> Config {
        let locked = self.peek();
        match &locked.book {
            Some(book) => book.config.clone(),
            None => Config::from_parts(Arc::clone(&self.name), Arc::clone(&locked.made_with)),
        }
    }

    /// Whether calls must be timed (a slow-call policy).
    #[inline]
    pub(crate) fn needs_latency(&self) -> bool {
        self.hot.needs_latency.load(Ordering::Relaxed)
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// This breaker, as its transitions name it.
    pub(crate) fn origin(&self) -> Origin {
        Origin(self as *const Shared as usize)
    }

    #[inline]
    pub(crate) fn load(&self) -> Word {
        Word(self.hot.word.load(Ordering::Acquire))
    }

    fn cas(&self, current: Word, next: Word) -> Result<(), Word> {
        self.hot
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

    /// The lock, with the book made if need be.
    fn lock(&self) -> BookGuard<'_> {
        let mut locked = self.peek();
        if locked.book.is_none() {
            let config = Config::from_parts(Arc::clone(&self.name), Arc::clone(&locked.made_with));
            locked.book = Some(Box::new(self.new_book(config)));
        }
        BookGuard { locked }
    }

    /// The lock, without making the book: for readers, which take a
    /// breaker without one as fresh.
    fn peek(&self) -> MutexGuard<'_, Locked> {
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

/// Whether successes of `policy` go to the tally: it counts calls in
/// buckets of time and does not record every success.
fn tallies(policy: &mut PolicyState) -> bool {
    policy.tally_end(0).is_some() && !policy.records_every_success()
}

/// What a closed-state success does, for a policy whose successes
/// matter (or not), tally (or not), or that must pass them on.
fn success_mode(policy: &PolicyState, tallies: bool, passes_on: bool) -> u8 {
    if policy.success_matters() || passes_on {
        RECORD
    } else if tallies {
        TALLY
    } else {
        QUIET
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

/// What the unit tests of this module's files share.
#[cfg(all(test, not(tcb_loom)))]
mod test_support {
    use super::*;
    use crate::policy::TripPolicy;

    /// A breaker tripping on `policy`, otherwise as configured by default.
    pub(super) fn shared(policy: impl Into<TripPolicy>) -> Arc<Shared> {
        Shared::new_arc(Config::builder().trip(policy).build().unwrap())
    }

    /// What a closed-state success does now: `QUIET`, `TALLY` or `RECORD`.
    pub(super) fn mode(shared: &Shared) -> u8 {
        shared.hot.success.load(Ordering::Relaxed)
    }
}
