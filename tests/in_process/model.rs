//! The breaker against a reference model: random steps drive one breaker
//! through its tower service on paused time, and after every step the
//! breaker must agree with a small model of the state machine written here,
//! from the docs, sharing no code with `src/`.
//!
//! Steps: time advances (a millisecond to many open periods, and to the very
//! edge of an open period), calls that succeed, fail (with or without a
//! retry-after hint), are ignored, hang and are cancelled, or panic, calls
//! that complete later (or are cancelled later) while other steps happen,
//! and every manual control: `force_open` with and without a period,
//! `force_closed`, `disable`, `restore`, `reset`, and shadow mode. Calls
//! also go through the two-step path outside tower (`try_acquire`, a
//! permit recorded at once or in a later step, or dropped), mixed with the
//! service's: one admission, one model.
//!
//! The model covers the consecutive-failures policy, `cooldown`, `backoff`,
//! `min_open`, `max_open`, retry-after hints, one probe at a time with
//! `successes_to_close`, and no probe timeout. At every step the two agree
//! on the state, whether a call reached the inner service, the retry-after
//! (`Breaker::retry_after` and each refusal's), the generation, the probes
//! in flight, the counts and the transitions announced.
//!
//! `PROPTEST_CASES` sets the number of cases (default 300) and
//! `PROPTEST_RNG_SEED` the seed.

use crate::common::panics;
use crate::common::paused;

use panics::{quiet_scripted_panics, SCRIPTED_PANIC};
use paused::{paused_runtime, proptest_config};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use tokio::sync::{broadcast, oneshot};
use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::{Outcome, Verdict};
use tower_circuit_breaker::events::Transition;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CallPermit, CircuitBreaker, CircuitOpen, Config, State};

// ---------------------------------------------------------------------------
// The reference model.
// ---------------------------------------------------------------------------

/// What the model knows of a config; the breaker's [`Config`] is built from
/// it. Durations are whole milliseconds and the backoff a fraction, so the
/// model computes every open period exactly.
#[derive(Clone, Debug)]
struct Settings {
    threshold: u32,
    cooldown_ms: u64,
    /// Numerator and denominator.
    backoff: (u64, u64),
    max_open_ms: u64,
    min_open_ms: u64,
    successes_to_close: u32,
}

impl Settings {
    fn config(&self) -> Config {
        Config::builder()
            .name("model")
            .trip(ConsecutiveFailures::new(self.threshold))
            .cooldown(Duration::from_millis(self.cooldown_ms))
            .backoff(self.backoff.0 as f64 / self.backoff.1 as f64)
            .max_open(Duration::from_millis(self.max_open_ms))
            .min_open(Duration::from_millis(self.min_open_ms))
            .jitter(0.0)
            .probes(1)
            .successes_to_close(self.successes_to_close)
            .probe_timeout(None)
            .build()
            .expect("the settings strategy only makes valid configs")
    }
}

/// The model's state: one variant per state, with what that state keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Closed { streak: u32 },
    Open { until: u64 },
    HalfOpen { in_flight: u32, successes: u32 },
    Isolated,
    HeldClosed,
    Disabled,
}

impl Mode {
    /// The state as transitions announce it: an open period that has ended
    /// is still `Open` until a call moves it on.
    fn announced(self) -> State {
        match self {
            Mode::Closed { .. } => State::Closed,
            Mode::Open { .. } => State::Open,
            Mode::HalfOpen { .. } => State::HalfOpen,
            Mode::Isolated => State::ForcedOpen,
            Mode::HeldClosed => State::ForcedClosed,
            Mode::Disabled => State::Disabled,
        }
    }

    fn is_manual(self) -> bool {
        matches!(self, Mode::Isolated | Mode::HeldClosed | Mode::Disabled)
    }
}

/// How an admitted call's outcome will count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admitted {
    /// Closed, in this generation: the outcome feeds the policy.
    Closed(u32),
    /// A half-open probe of this generation, holding the permit.
    Probe(u32),
    /// Held closed: the outcome shows in the counts only.
    CountOnly,
    /// Disabled, or let through by shadow mode: nothing is recorded.
    Unrecorded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    Admitted(Admitted),
    Refused { retry_after_ms: u64, state: State },
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Success,
    /// A failure, with a retry-after hint in microseconds.
    Failure(Option<u64>),
    Ignored,
    Cancelled,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ModelCounts {
    calls: u64,
    rejected: u64,
    failures: u64,
    ignored: u64,
    cancelled: u64,
    opened: u64,
    probes: u64,
}

#[derive(Debug)]
struct Model {
    settings: Settings,
    /// Milliseconds since the breaker was made.
    now: u64,
    mode: Mode,
    generation: u32,
    /// Failed probe rounds since the last close.
    attempt: u32,
    /// The latest end of an announced retry-after.
    hint_until: Option<u64>,
    shadow: bool,
    /// The length of the latest open period: what a refusal while
    /// half-open says to wait.
    open_period: u64,
    counts: ModelCounts,
    /// Transitions not yet compared: from, to, generation, shadow.
    transitions: Vec<(State, State, u32, bool)>,
}

fn ceil_div(n: u128, d: u128) -> u128 {
    n.div_ceil(d)
}

impl Model {
    fn new(settings: Settings) -> Self {
        Model {
            settings,
            now: 0,
            mode: Mode::Closed { streak: 0 },
            generation: 0,
            attempt: 0,
            hint_until: None,
            shadow: false,
            open_period: 0,
            counts: ModelCounts::default(),
            transitions: Vec::new(),
        }
    }

    /// The state a reader sees: an ended open period reads as half-open.
    fn state(&self) -> State {
        match self.mode {
            Mode::Open { until } if self.now >= until => State::HalfOpen,
            mode => mode.announced(),
        }
    }

    fn retry_after_ms(&self) -> Option<u64> {
        match self.mode {
            Mode::Open { until } if self.now < until => Some(until - self.now),
            _ => None,
        }
    }

    fn probes_in_flight(&self) -> (u32, u32) {
        match self.mode {
            Mode::HalfOpen {
                in_flight,
                successes,
            } => (in_flight, successes),
            _ => (0, 0),
        }
    }

    /// Every transition moves to a new generation and is announced once.
    fn move_to(&mut self, next: Mode) {
        let from = self.mode.announced();
        self.generation += 1;
        if let Mode::Open { until } = next {
            self.open_period = until - self.now;
        }
        self.mode = next;
        self.transitions
            .push((from, next.announced(), self.generation, self.shadow));
    }

    /// The first open period: `cooldown` within `min_open` and `max_open`.
    fn first_period_ms(&self) -> u64 {
        let s = &self.settings;
        s.cooldown_ms.min(s.max_open_ms).max(s.min_open_ms)
    }

    /// The open period for the current attempt: `cooldown * backoff^attempt`
    /// capped by `max_open`, never under `min_open`, computed exactly.
    fn period_ms(&self) -> u64 {
        let s = &self.settings;
        let max = u128::from(s.max_open_ms);
        let (num, den) = (u128::from(s.backoff.0), u128::from(s.backoff.1));
        let mut numer = u128::from(s.cooldown_ms);
        let mut denom = 1u128;
        if num != den {
            for _ in 0..self.attempt {
                if ceil_div(numer, denom) >= max {
                    break;
                }
                numer *= num;
                denom *= den;
            }
        }
        let grown = ceil_div(numer, denom).min(max);
        grown.max(u128::from(s.min_open_ms)) as u64
    }

    /// The end of an open period starting now: an announced retry-after,
    /// never under the first period; else the period for this attempt.
    /// Never past `max_open`.
    fn open_until(&self) -> u64 {
        let until = match self.hint_until {
            Some(hint) => hint.max(self.now + self.first_period_ms()),
            None => self.now + self.period_ms(),
        };
        until.min(self.now + self.settings.max_open_ms)
    }

    fn note_hint(&mut self, hint_us: Option<u64>) {
        if let Some(hint_us) = hint_us {
            let capped =
                (ceil_div(u128::from(hint_us), 1000) as u64).min(self.settings.max_open_ms);
            let until = self.now + capped;
            self.hint_until = Some(self.hint_until.map_or(until, |u| u.max(until)));
        }
    }

    fn refuse(&mut self, retry_after_ms: u64, state: State) -> Admission {
        self.counts.rejected += 1;
        if self.shadow {
            // Shadow mode lets it through, unrecorded: a real breaker would
            // never have seen it.
            self.counts.calls += 1;
            return Admission::Admitted(Admitted::Unrecorded);
        }
        Admission::Refused {
            retry_after_ms,
            state,
        }
    }

    fn admit(&mut self) -> Admission {
        loop {
            let admitted = match self.mode {
                Mode::Closed { .. } => Admitted::Closed(self.generation),
                Mode::Open { until } if self.now < until => {
                    return self.refuse(until - self.now, State::Open)
                }
                Mode::Open { .. } => {
                    self.move_to(Mode::HalfOpen {
                        in_flight: 0,
                        successes: 0,
                    });
                    continue;
                }
                Mode::HalfOpen {
                    in_flight: 0,
                    successes,
                } => {
                    self.mode = Mode::HalfOpen {
                        in_flight: 1,
                        successes,
                    };
                    self.counts.probes += 1;
                    Admitted::Probe(self.generation)
                }
                // No probe timeout: come back after the open period that
                // just ended.
                Mode::HalfOpen { .. } => return self.refuse(self.open_period, State::HalfOpen),
                // Even in shadow mode; nobody knows when isolation ends.
                Mode::Isolated => {
                    self.counts.rejected += 1;
                    return Admission::Refused {
                        retry_after_ms: self.settings.max_open_ms,
                        state: State::ForcedOpen,
                    };
                }
                Mode::HeldClosed => Admitted::CountOnly,
                Mode::Disabled => Admitted::Unrecorded,
            };
            self.counts.calls += 1;
            return Admission::Admitted(admitted);
        }
    }

    fn complete(&mut self, admitted: Admitted, ending: Ending) {
        match admitted {
            Admitted::Unrecorded => {}
            _ if ending == Ending::Cancelled => {
                self.counts.cancelled += 1;
                // A probe its caller dropped: open again for the same
                // period, the backoff neither grown nor reset.
                if let (Admitted::Probe(generation), Mode::HalfOpen { .. }) = (admitted, self.mode)
                {
                    if generation == self.generation {
                        let until = self.open_until();
                        self.hint_until = None;
                        self.counts.opened += 1;
                        self.move_to(Mode::Open { until });
                    }
                }
            }
            Admitted::CountOnly => match ending {
                Ending::Failure(_) => self.counts.failures += 1,
                Ending::Ignored => self.counts.ignored += 1,
                Ending::Success | Ending::Cancelled => {}
            },
            Admitted::Closed(generation) => {
                let current = generation == self.generation;
                match (ending, self.mode) {
                    (Ending::Ignored, _) => self.counts.ignored += 1,
                    (Ending::Success, Mode::Closed { .. }) if current => {
                        self.mode = Mode::Closed { streak: 0 };
                    }
                    (Ending::Failure(hint), Mode::Closed { streak }) if current => {
                        self.counts.failures += 1;
                        self.note_hint(hint);
                        let streak = streak + 1;
                        if streak >= self.settings.threshold {
                            let until = self.open_until();
                            self.hint_until = None;
                            self.counts.opened += 1;
                            self.move_to(Mode::Open { until });
                        } else {
                            self.mode = Mode::Closed { streak };
                        }
                    }
                    // Cancelled, or from an earlier generation: dropped.
                    _ => {}
                }
            }
            Admitted::Probe(generation) => {
                let Mode::HalfOpen {
                    in_flight,
                    successes,
                } = self.mode
                else {
                    if ending == Ending::Ignored {
                        self.counts.ignored += 1;
                    }
                    return;
                };
                if generation != self.generation {
                    if ending == Ending::Ignored {
                        self.counts.ignored += 1;
                    }
                    return;
                }
                match ending {
                    Ending::Ignored | Ending::Cancelled => {
                        if ending == Ending::Ignored {
                            self.counts.ignored += 1;
                        }
                        self.mode = Mode::HalfOpen {
                            in_flight: in_flight - 1,
                            successes,
                        };
                    }
                    Ending::Success if successes + 1 >= self.settings.successes_to_close => {
                        self.attempt = 0;
                        self.hint_until = None;
                        self.move_to(Mode::Closed { streak: 0 });
                    }
                    Ending::Success => {
                        self.mode = Mode::HalfOpen {
                            in_flight: in_flight - 1,
                            successes: successes + 1,
                        };
                    }
                    Ending::Failure(hint) => {
                        self.counts.failures += 1;
                        self.note_hint(hint);
                        self.attempt += 1;
                        let until = self.open_until();
                        self.hint_until = None;
                        self.counts.opened += 1;
                        self.move_to(Mode::Open { until });
                    }
                }
            }
        }
    }

    /// An operator's transition: the policy and any hint are forgotten, and
    /// the backoff too unless it opens for a period.
    fn operate(&mut self, next: Mode) -> bool {
        self.hint_until = None;
        if !matches!(next, Mode::Open { .. }) {
            self.attempt = 0;
        }
        self.move_to(next);
        true
    }

    fn force_open(&mut self, period_us: Option<u64>) -> bool {
        match period_us {
            Some(period_us) => {
                let period =
                    (ceil_div(u128::from(period_us), 1000) as u64).min(self.settings.max_open_ms);
                self.counts.opened += 1;
                self.operate(Mode::Open {
                    until: self.now + period,
                })
            }
            None if self.mode == Mode::Isolated => false,
            None => self.operate(Mode::Isolated),
        }
    }

    fn hold(&mut self, mode: Mode) -> bool {
        self.mode != mode && self.operate(mode)
    }

    fn restore(&mut self) -> bool {
        self.mode.is_manual() && self.operate(Mode::Closed { streak: 0 })
    }

    fn reset(&mut self) -> bool {
        if let Mode::Closed { .. } = self.mode {
            // Nothing to transition, but the past is forgotten.
            self.mode = Mode::Closed { streak: 0 };
            self.attempt = 0;
            self.hint_until = None;
            return false;
        }
        self.operate(Mode::Closed { streak: 0 })
    }
}

// ---------------------------------------------------------------------------
// The breaker under test: a scripted upstream and a closure classifier.
// ---------------------------------------------------------------------------

/// What the upstream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    Success,
    /// An `Err`: a failure without a hint.
    Failure,
    /// A failure with a retry-after hint, in microseconds.
    RateLimited(u64),
    /// Ignored by the classifier (a 400).
    BadRequest,
}

impl Reply {
    fn ending(self) -> Ending {
        match self {
            Reply::Success => Ending::Success,
            Reply::Failure => Ending::Failure(None),
            Reply::RateLimited(hint_us) => Ending::Failure(Some(hint_us)),
            Reply::BadRequest => Ending::Ignored,
        }
    }
}

/// What the upstream does with one request.
#[derive(Debug)]
enum Script {
    Now(Reply),
    /// Answers what arrives on the channel (a failure if it is dropped).
    Later(oneshot::Receiver<Reply>),
    /// Never answers.
    Hang,
    Panic,
}

/// Does what each [`Script`] says; not the shared `common::Upstream`, since
/// the model's steps answer a call later through a channel, hang it, or
/// reply with a retry-after hint or an ignored 400.
#[derive(Clone, Default)]
struct Upstream {
    calls: Arc<AtomicUsize>,
}

type UpstreamFuture = Pin<Box<dyn Future<Output = Result<Reply, BoxError>> + Send>>;

impl Service<Script> for Upstream {
    type Response = Reply;
    type Error = BoxError;
    type Future = UpstreamFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, script: Script) -> UpstreamFuture {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let reply = match script {
                Script::Now(reply) => reply,
                Script::Later(reply) => reply.await.unwrap_or(Reply::Failure),
                Script::Hang => std::future::pending().await,
                Script::Panic => panic!("{}", SCRIPTED_PANIC),
            };
            match reply {
                Reply::Failure => Err("upstream failed".into()),
                reply => Ok(reply),
            }
        })
    }
}

type Classifier = fn(Result<&Reply, &BoxError>) -> Verdict;
type Svc = CircuitBreaker<Upstream, Classifier>;
type SvcFuture = <Svc as Service<Script>>::Future;

fn classifier() -> Classifier {
    |result| match result {
        Ok(Reply::Success) => Verdict::new(Outcome::Success),
        Ok(Reply::BadRequest) => Verdict::new(Outcome::Ignore),
        Ok(Reply::RateLimited(hint_us)) => {
            Verdict::new(Outcome::Failure).with_retry_after(Duration::from_micros(*hint_us))
        }
        Ok(Reply::Failure) | Err(_) => Verdict::new(Outcome::Failure),
    }
}

// ---------------------------------------------------------------------------
// Steps.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Time passes, in milliseconds.
    Advance(u64),
    /// Time passes to the end of the model's open period, give or take a
    /// millisecond (1 ms when not open).
    ToPeriodEnd(i8),
    /// A call answered at once.
    Call(Reply),
    /// A call whose upstream future panics, on a task of its own.
    Panic,
    /// A call that hangs and is cancelled (its future dropped).
    HangThenCancel,
    /// A call whose answer comes in a later step.
    Later,
    /// A call made outside tower: `try_acquire`, then its permit records
    /// the reply at once.
    Acquire(Reply),
    /// A permit taken with `try_acquire`, recorded in a later step.
    AcquireLater,
    /// One of the waiting calls is answered.
    Complete(usize, Reply),
    /// One of the waiting calls is cancelled.
    Cancel(usize),
    /// `force_open`, with a period in microseconds.
    ForceOpen(Option<u64>),
    ForceClosed,
    Disable,
    Restore,
    Reset,
    Shadow(bool),
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        4 => Just(Reply::Success),
        4 => Just(Reply::Failure),
        2 => (1u64..=20_000_000).prop_map(Reply::RateLimited),
        1 => Just(Reply::RateLimited(u64::MAX)),
        2 => Just(Reply::BadRequest),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop_oneof![1u64..=5, 1u64..=1_000, 1u64..=30_000, 100_000u64..=3_000_000]
            .prop_map(Step::Advance),
        4 => (-1i8..=1).prop_map(Step::ToPeriodEnd),
        14 => reply().prop_map(Step::Call),
        1 => Just(Step::Panic),
        1 => Just(Step::HangThenCancel),
        2 => Just(Step::Later),
        6 => reply().prop_map(Step::Acquire),
        1 => Just(Step::AcquireLater),
        2 => (any::<usize>(), reply()).prop_map(|(i, r)| Step::Complete(i, r)),
        1 => any::<usize>().prop_map(Step::Cancel),
        1 => prop_oneof![
            Just(None),
            (0u64..=10_000_000).prop_map(Some),
            Just(Some(u64::MAX)),
        ]
        .prop_map(Step::ForceOpen),
        3 => prop_oneof![
            Just(Step::ForceClosed),
            Just(Step::Disable),
            Just(Step::Restore),
            Just(Step::Reset),
        ],
        1 => any::<bool>().prop_map(Step::Shadow),
    ]
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        1u32..=4,
        prop_oneof![Just(10u64), Just(1_000u64), 1u64..=5_000],
        prop_oneof![Just((1u64, 1u64)), Just((3, 2)), Just((2, 1)), Just((3, 1))],
        prop_oneof![Just(1u64), Just(2), Just(5), Just(40), Just(1_000)],
        0u64..1_000,
        0u8..4,
        1u32..=3,
    )
        .prop_map(
            |(threshold, cooldown_ms, backoff, factor, extra_ms, min_open, successes_to_close)| {
                let max_open_ms = cooldown_ms * factor + extra_ms;
                let min_open_ms = match min_open {
                    0 | 1 => 0,
                    2 => cooldown_ms / 2,
                    _ => (cooldown_ms * 3).min(max_open_ms),
                };
                Settings {
                    threshold,
                    cooldown_ms,
                    backoff,
                    max_open_ms,
                    min_open_ms,
                    successes_to_close,
                }
            },
        )
}

// ---------------------------------------------------------------------------
// Driving both, side by side.
// ---------------------------------------------------------------------------

/// Fails the case with both sides and what was being compared.
macro_rules! agree {
    ($breaker:expr, $model:expr, $($what:tt)+) => {{
        let (breaker, model) = (&$breaker, &$model);
        if breaker != model {
            return Err(TestCaseError::fail(format!(
                "{}: breaker {:?}, model {:?}",
                format!($($what)+),
                breaker,
                model
            )));
        }
    }};
}

/// A call admitted and still running.
struct Waiting {
    pending: Pending,
    admitted: Admitted,
}

/// How a waiting call will end: through the service, or a permit.
enum Pending {
    Call {
        future: Pin<Box<SvcFuture>>,
        answer: oneshot::Sender<Reply>,
    },
    Permit(CallPermit),
}

struct Run {
    breaker: Breaker,
    svc: Svc,
    upstream: Upstream,
    events: broadcast::Receiver<Transition>,
    model: Model,
    waiting: Vec<Waiting>,
    /// Calls admitted through permits, which reach no upstream.
    permit_calls: u64,
}

fn failed(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

impl Run {
    fn upstream_calls(&self) -> usize {
        self.upstream.calls.load(Ordering::SeqCst)
    }

    /// `ready` then `call`; compares admission with the model. Returns the
    /// future of an admitted call, or checks the refusal.
    async fn start(
        &mut self,
        script: Script,
    ) -> Result<Option<(SvcFuture, Admitted)>, TestCaseError> {
        let before = self.upstream_calls();
        let svc = self
            .svc
            .ready()
            .await
            .map_err(|e| failed(format!("poll_ready failed: {e}")))?;
        let future = svc.call(script);
        let reached = self.upstream_calls() - before;
        let expected = self.model.admit();
        agree!(
            reached == 1,
            matches!(expected, Admission::Admitted(_)),
            "admitted ({expected:?})"
        );
        match expected {
            Admission::Admitted(admitted) => Ok(Some((future, admitted))),
            Admission::Refused {
                retry_after_ms,
                state,
            } => {
                self.check_refusal(future.await, retry_after_ms, state)?;
                Ok(None)
            }
        }
    }

    fn check_refusal(
        &self,
        result: Result<Reply, BoxError>,
        retry_after_ms: u64,
        state: State,
    ) -> Result<(), TestCaseError> {
        let err = match result {
            Ok(reply) => return Err(failed(format!("refused call answered {reply:?}"))),
            Err(err) => err,
        };
        let open = CircuitOpen::find(err.as_ref())
            .ok_or_else(|| failed(format!("refused with {err}, not CircuitOpen")))?;
        agree!(
            open.retry_after(),
            Duration::from_millis(retry_after_ms),
            "refusal's retry_after"
        );
        agree!(open.state(), state, "refusal's state");
        agree!(open.breaker(), "model", "refusal's breaker name");
        Ok(())
    }

    fn check_answer(result: &Result<Reply, BoxError>, reply: Reply) -> Result<(), TestCaseError> {
        let as_expected = match (result, reply) {
            (Err(err), Reply::Failure) => CircuitOpen::find(err.as_ref()).is_none(),
            (Ok(got), reply) => *got == reply,
            (Err(_), _) => false,
        };
        if !as_expected {
            return Err(failed(format!(
                "admitted call answered {result:?}, upstream said {reply:?}"
            )));
        }
        Ok(())
    }

    async fn step(&mut self, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Advance(ms) => self.advance(ms).await,
            Step::ToPeriodEnd(delta) => {
                let ms = match self.model.mode {
                    Mode::Open { until } => {
                        let target = until.saturating_add_signed(i64::from(delta));
                        target.saturating_sub(self.model.now).max(1)
                    }
                    _ => 1,
                };
                self.advance(ms).await;
            }
            Step::Call(reply) => {
                if let Some((future, admitted)) = self.start(Script::Now(reply)).await? {
                    let result = future.await;
                    Self::check_answer(&result, reply)?;
                    self.model.complete(admitted, reply.ending());
                }
            }
            Step::Panic => self.panic().await?,
            Step::HangThenCancel => {
                if let Some((mut future, admitted)) = self.start(Script::Hang).await? {
                    let polled = std::future::poll_fn(|cx| {
                        Poll::Ready(Pin::new(&mut future).poll(cx).is_pending())
                    })
                    .await;
                    if !polled {
                        return Err(failed("a hanging call completed".into()));
                    }
                    drop(future);
                    self.model.complete(admitted, Ending::Cancelled);
                }
            }
            Step::Later => {
                let (answer, receiver) = oneshot::channel();
                if let Some((future, admitted)) = self.start(Script::Later(receiver)).await? {
                    self.waiting.push(Waiting {
                        pending: Pending::Call {
                            future: Box::pin(future),
                            answer,
                        },
                        admitted,
                    });
                }
            }
            Step::Acquire(reply) => {
                if let Some((permit, admitted)) = self.acquire()? {
                    permit.finish(classifier()(Ok(&reply)));
                    self.model.complete(admitted, reply.ending());
                }
            }
            Step::AcquireLater => {
                if let Some((permit, admitted)) = self.acquire()? {
                    self.waiting.push(Waiting {
                        pending: Pending::Permit(permit),
                        admitted,
                    });
                }
            }
            Step::Complete(i, reply) => {
                if !self.waiting.is_empty() {
                    let waiting = self.waiting.remove(i % self.waiting.len());
                    match waiting.pending {
                        Pending::Call { future, answer } => {
                            let _ = answer.send(reply);
                            let result = future.await;
                            Self::check_answer(&result, reply)?;
                        }
                        Pending::Permit(permit) => permit.finish(classifier()(Ok(&reply))),
                    }
                    self.model.complete(waiting.admitted, reply.ending());
                }
            }
            Step::Cancel(i) => {
                if !self.waiting.is_empty() {
                    let waiting = self.waiting.remove(i % self.waiting.len());
                    drop(waiting.pending);
                    self.model.complete(waiting.admitted, Ending::Cancelled);
                }
            }
            Step::ForceOpen(period_us) => {
                let changed = self
                    .breaker
                    .force_open(period_us.map(Duration::from_micros));
                agree!(
                    changed,
                    self.model.force_open(period_us),
                    "force_open({period_us:?})"
                );
            }
            Step::ForceClosed => {
                agree!(
                    self.breaker.force_closed(),
                    self.model.hold(Mode::HeldClosed),
                    "force_closed"
                );
            }
            Step::Disable => {
                agree!(
                    self.breaker.disable(),
                    self.model.hold(Mode::Disabled),
                    "disable"
                );
            }
            Step::Restore => agree!(self.breaker.restore(), self.model.restore(), "restore"),
            Step::Reset => agree!(self.breaker.reset(), self.model.reset(), "reset"),
            Step::Shadow(on) => {
                self.breaker.set_shadow(on);
                self.model.shadow = on;
            }
        }
        Ok(())
    }

    /// `try_acquire`; compares admission with the model. Returns the
    /// permit of an admitted call, or checks the refusal.
    fn acquire(&mut self) -> Result<Option<(CallPermit, Admitted)>, TestCaseError> {
        let acquired = self.breaker.try_acquire();
        match (acquired, self.model.admit()) {
            (Ok(permit), Admission::Admitted(admitted)) => {
                self.permit_calls += 1;
                Ok(Some((permit, admitted)))
            }
            (
                Err(open),
                Admission::Refused {
                    retry_after_ms,
                    state,
                },
            ) => {
                self.check_refusal(Err(open.into()), retry_after_ms, state)?;
                Ok(None)
            }
            (acquired, expected) => Err(failed(format!(
                "try_acquire: {:?}, model {expected:?}",
                acquired.map(|_| "a permit")
            ))),
        }
    }

    async fn advance(&mut self, ms: u64) {
        tokio::time::advance(Duration::from_millis(ms)).await;
        self.model.now += ms;
    }

    /// A call whose upstream panics, made on a task of its own from a clone
    /// of the service: the panic must reach that task, and count as a
    /// failure.
    async fn panic(&mut self) -> Result<(), TestCaseError> {
        let before = self.upstream_calls();
        let mut clone = self.svc.clone();
        let joined =
            tokio::spawn(async move { clone.ready().await?.call(Script::Panic).await }).await;
        let reached = self.upstream_calls() - before;
        let expected = self.model.admit();
        agree!(
            reached == 1,
            matches!(expected, Admission::Admitted(_)),
            "admitted ({expected:?})"
        );
        match (expected, joined) {
            (Admission::Admitted(admitted), Err(err)) if err.is_panic() => {
                self.model.complete(admitted, Ending::Failure(None));
                Ok(())
            }
            (
                Admission::Refused {
                    retry_after_ms,
                    state,
                },
                Ok(result),
            ) => self.check_refusal(result, retry_after_ms, state),
            (expected, joined) => Err(failed(format!(
                "panicking call: model {expected:?}, task ended {joined:?}"
            ))),
        }
    }

    /// Everything the breaker shows agrees with the model.
    fn compare(&mut self) -> Result<(), TestCaseError> {
        let model = &self.model;
        agree!(self.breaker.state(), model.state(), "state");
        agree!(
            self.breaker.retry_after(),
            model.retry_after_ms().map(Duration::from_millis),
            "retry_after"
        );
        let snap = self.breaker.snapshot();
        agree!(snap.state, model.state(), "snapshot state");
        agree!(
            snap.retry_after,
            self.breaker.retry_after(),
            "snapshot retry_after"
        );
        agree!(snap.generation, model.generation, "generation");
        agree!(
            (snap.probes_in_flight, snap.probe_successes),
            model.probes_in_flight(),
            "probes in flight and probe successes"
        );
        agree!(
            snap.failed_probe_rounds,
            model.attempt,
            "failed probe rounds"
        );
        agree!(snap.shadow, model.shadow, "shadow");
        let c = snap.counts;
        agree!(
            ModelCounts {
                calls: c.calls,
                rejected: c.rejected,
                failures: c.failures,
                ignored: c.ignored,
                cancelled: c.cancelled,
                opened: c.opened,
                probes: c.probes,
            },
            model.counts,
            "counts"
        );
        agree!(
            c.calls,
            self.upstream_calls() as u64 + self.permit_calls,
            "counts.calls against upstream calls and permits"
        );
        let mut announced = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(t) => announced.push((t.from, t.to, t.generation, t.shadow)),
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(err) => return Err(failed(format!("transitions: {err}"))),
            }
        }
        let expected = std::mem::take(&mut self.model.transitions);
        agree!(announced, expected, "transitions announced");
        Ok(())
    }
}

static CASES: AtomicUsize = AtomicUsize::new(0);
static STEPS: AtomicUsize = AtomicUsize::new(0);

async fn run_case(settings: Settings, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let breaker = Breaker::new(settings.config());
    let upstream = Upstream::default();
    let mut run = Run {
        events: breaker.subscribe(),
        svc: CircuitBreaker::with_classifier(upstream.clone(), &breaker, classifier()),
        breaker,
        upstream,
        model: Model::new(settings),
        waiting: Vec::new(),
        permit_calls: 0,
    };
    run.compare()?;
    for (i, step) in steps.iter().enumerate() {
        let before = format!("{:?} at {} ms", run.model.mode, run.model.now);
        let result = match run.step(*step).await {
            Ok(()) => run.compare(),
            Err(err) => Err(err),
        };
        if let Err(err) = result {
            return Err(failed(format!(
                "step {i} ({step:?}, model was {before}): {err}"
            )));
        }
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    // Whatever is still waiting is cancelled: every permit comes back.
    for waiting in std::mem::take(&mut run.waiting) {
        drop(waiting.pending);
        run.model.complete(waiting.admitted, Ending::Cancelled);
    }
    run.compare()?;
    CASES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

#[test]
fn breaker_agrees_with_the_reference_model_at_every_step() {
    quiet_scripted_panics();
    let config = proptest_config(300);
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let strategy = (settings(), prop::collection::vec(step(), 1..250));
    let result = runner.run(&strategy, |(settings, steps)| {
        paused_runtime().block_on(run_case(settings, steps))
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    eprintln!(
        "model: {} cases passed ({} asked), {} steps",
        CASES.load(Ordering::Relaxed),
        cases,
        STEPS.load(Ordering::Relaxed)
    );
}
