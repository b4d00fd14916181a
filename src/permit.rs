//! The breaker outside tower: ask it before a call, tell it how the call
//! went.
//!
//! A provider is rarely reached through one tower stack only: a background
//! job, a websocket session, a queue consumer or a command-line client call
//! it too. They share its [`Breaker`] through the two-step form:
//!
//! 1. [`Breaker::try_acquire`] admits the call, as the tower service does
//!    (the same admission: closed, it admits; open, it refuses with the
//!    same [`CircuitOpen`]; half-open, it hands out one of the `probes`
//!    permits), and returns a [`CallPermit`];
//! 2. the permit records the outcome: [`success`](CallPermit::success),
//!    [`failure`](CallPermit::failure), [`ignore`](CallPermit::ignore), or a
//!    [`Verdict`] with a retry-after hint ([`finish`](CallPermit::finish)).
//!    Dropped unrecorded (the call was abandoned, or a panic unwound past
//!    it), the call counts as cancelled however long the permit was held
//!    (`cancelled_failure_after` judges calls through services, whose
//!    start the breaker sees, not permits); a probe so dropped opens the
//!    breaker again for the period it just had (neither doubled nor
//!    skipped: a probe that said nothing is no reason to wait longer, nor
//!    to probe again at once). To give an unused probe permit back, record
//!    it as [`ignore`](CallPermit::ignore).
//!
//! [`Breaker::run`] and [`Breaker::run_with`] do both around an async block,
//! classifying its result like a service's (a panic in it is a failure,
//! resumed). Generations hold as for the service: a permit from a closed
//! breaker that has since opened records nothing.
//!
//! For signals rather than calls: [`Breaker::open_on_signal`] opens the breaker
//! because something else saw the dependency struggle, and
//! [`Breaker::record`] feeds an outcome observed without a call.
//!
//! ```
//! use tower::BoxError;
//! use tower_circuit_breaker::{Breaker, Config};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let breaker = Breaker::new(Config::builder().name("search").build()?);
//!
//! // A background job, one item at a time.
//! match breaker.try_acquire() {
//!     Ok(permit) => match index_one_item().await {
//!         Ok(()) => permit.success(),
//!         Err(_) => permit.failure(),
//!     },
//!     Err(open) => println!("skipped; retry in {:?}", open.retry_after()),
//! }
//!
//! // Or around an async block: the breaker classifies its result.
//! let answer: Result<u32, BoxError> = breaker.run(|| async { Ok(42) }).await;
//! assert_eq!(answer?, 42);
//! # Ok(())
//! # }
//! # async fn index_one_item() -> Result<(), ()> { Ok(()) }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::admission::{settle, Admission, CountIn, Refused};
use crate::breaker::shared::Shared;
use crate::breaker::Breaker;
use crate::classify::{Classify, ErrorsAsFailures, Outcome, Verdict};
use crate::error::{CircuitOpen, Name};
use crate::future::{Call, ResponseFuture, Via};

/// Leave to make one call through a breaker, from
/// [`Breaker::try_acquire`]: record how the call went with
/// [`success`](Self::success), [`failure`](Self::failure),
/// [`ignore`](Self::ignore) or [`finish`](Self::finish). Dropped unrecorded,
/// the call counts as cancelled (neither way) and a probe's permit goes
/// back. A closed breaker's permit holds no lock and allocates nothing.
#[must_use = "a permit records how the call went; dropped unrecorded, the call counts as cancelled"]
pub struct CallPermit {
    shared: Arc<Shared>,
    admission: Admission,
    /// When the call began, for a policy that judges latencies.
    start: Option<Instant>,
}

/// Admits one call at `shared`, as the tower service would, counting it:
/// the admission, and when the call began if its latency counts.
fn admit(shared: &Arc<Shared>) -> Result<(Admission, Option<Instant>), CircuitOpen> {
    match settle(shared.admit(), shared, CountIn::Breaker) {
        Ok(admission) => {
            shared.count_call(true);
            Ok((admission, shared.needs_latency().then(Instant::now)))
        }
        Err(Refused { retry_at, state }) => {
            shared.count_call(false);
            Err(CircuitOpen::new(Name::new(shared.name()), retry_at, state))
        }
    }
}

impl Breaker {
    /// Asks to make one call, outside any tower service: a permit to record
    /// its outcome with, or the [`CircuitOpen`] the service would refuse
    /// with. The same admission as the service's: half-open, it takes one
    /// of the `probes` permits (its deadline starts now), so a call made
    /// with it is a probe. See the [`permit`](crate::permit) module.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Config, State};
    ///
    /// let breaker = Breaker::new(Config::default());
    /// let permit = breaker.try_acquire().expect("closed: admitted");
    /// permit.failure(); // the call failed
    /// assert_eq!(breaker.snapshot().counts.failures, 1);
    ///
    /// breaker.force_open(None);
    /// let refused = breaker.try_acquire().unwrap_err();
    /// assert_eq!(refused.state(), State::ForcedOpen);
    /// ```
    pub fn try_acquire(&self) -> Result<CallPermit, CircuitOpen> {
        let (admission, start) = admit(&self.shared)?;
        Ok(CallPermit {
            shared: Arc::clone(&self.shared),
            admission,
            start,
        })
    }

    /// Runs `call` through the breaker, every `Err` a failure: refused (as
    /// the service refuses) without running it, or run and recorded when it
    /// completes. Dropped before it completes, the call counts as
    /// cancelled; a panic in it (in `call` itself, or in the future it
    /// returns) is a failure, then resumed.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, CircuitOpen, Config};
    ///
    /// #[derive(Debug)]
    /// enum JobError { Refused(CircuitOpen), Upstream(String) }
    ///
    /// impl From<CircuitOpen> for JobError {
    ///     fn from(open: CircuitOpen) -> Self { JobError::Refused(open) }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let breaker = Breaker::new(Config::default());
    /// let result: Result<(), JobError> = breaker
    ///     .run(|| async { Err(JobError::Upstream("timed out".into())) })
    ///     .await;
    /// assert!(matches!(result, Err(JobError::Upstream(_))));
    /// assert_eq!(breaker.snapshot().counts.failures, 1);
    /// # }
    /// ```
    pub async fn run<T, E, Fut>(&self, call: impl FnOnce() -> Fut) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
        E: From<CircuitOpen>,
    {
        self.run_with(ErrorsAsFailures, call).await
    }

    /// [`run`](Self::run), judging the result with `classifier` (an
    /// [`HttpClassifier`](crate::classify::HttpClassifier), a closure...):
    /// an ignored outcome counts neither way, and a verdict's retry-after
    /// hint keeps the breaker open at least that long when it opens.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::Outcome;
    /// use tower_circuit_breaker::{Breaker, CircuitOpen, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let breaker = Breaker::new(Config::default());
    /// // A 4xx is the request's fault, not the provider's.
    /// let classify = |result: Result<&u16, &CircuitOpen>| match result {
    ///     Ok(400..=499) => Outcome::Ignore,
    ///     Ok(500..) | Err(_) => Outcome::Failure,
    ///     Ok(_) => Outcome::Success,
    /// };
    /// let status = breaker.run_with(classify, || async { Ok::<u16, CircuitOpen>(404) }).await;
    /// assert_eq!(status.unwrap(), 404);
    /// assert_eq!(breaker.snapshot().counts.ignored, 1);
    /// # }
    /// ```
    pub async fn run_with<C, T, E, Fut>(
        &self,
        classifier: C,
        call: impl FnOnce() -> Fut,
    ) -> Result<T, E>
    where
        C: Classify<T, E, Eos = Infallible>,
        Fut: Future<Output = Result<T, E>>,
        E: From<CircuitOpen>,
    {
        let (admission, start) = admit(&self.shared).map_err(E::from)?;
        let via = Via::Direct {
            shared: Arc::clone(&self.shared),
            classifier,
        };
        // The response future the tower service would make: it records
        // the outcome, a panic as a failure, a drop as a cancellation.
        // `call` runs inside its first poll, so that a panic while it builds
        // its future is a failure too, not an admitted call that never ends.
        let admitted = Call::new(via, admission, start);
        ResponseFuture::called(async move { call().await }, admitted).await
    }
}

impl CallPermit {
    /// The call succeeded.
    pub fn success(self) {
        self.finish(Outcome::Success);
    }

    /// The call failed in a way that may pass (a timeout, a refused
    /// connection, a 5xx, a 429).
    pub fn failure(self) {
        self.finish(Outcome::Failure);
    }

    /// The call says nothing of the dependency's health (a 400, a 401):
    /// it counts neither way, and a probe's permit goes back.
    pub fn ignore(self) {
        self.finish(Outcome::Ignore);
    }

    /// Records `verdict`: an outcome, and a retry-after hint the dependency
    /// announced (a failure's hint keeps the breaker open at least that long
    /// when it opens). A policy that judges latencies takes the time since
    /// the permit was acquired.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::{Outcome, Verdict};
    /// use tower_circuit_breaker::{policy::ConsecutiveFailures, Breaker, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let breaker = Breaker::new(Config::builder().trip(ConsecutiveFailures::new(1)).build().unwrap());
    /// let permit = breaker.try_acquire().unwrap();
    /// // The provider answered 429, retry after two minutes.
    /// permit.finish(Verdict::new(Outcome::Failure).with_retry_after(Duration::from_secs(120)));
    /// assert_eq!(breaker.retry_after(), Some(Duration::from_secs(120)));
    /// # }
    /// ```
    pub fn finish(mut self, verdict: impl Into<Verdict>) {
        self.record_verdict(verdict.into(), None);
    }

    /// [`finish`](Self::finish), with the call's latency measured by the
    /// caller (for a slow-call policy), rather than the time since the
    /// permit was acquired.
    pub fn finish_timed(mut self, verdict: impl Into<Verdict>, latency: Duration) {
        self.record_verdict(verdict.into(), Some(latency));
    }

    fn record_verdict(&mut self, verdict: Verdict, latency: Option<Duration>) {
        let start = match (latency, self.start) {
            // A latency the caller measured: the call began that long ago.
            (Some(latency), Some(_)) => Instant::now().checked_sub(latency),
            (_, start) => start,
        };
        self.admission.record(&self.shared, verdict, start);
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        // Never recorded: the call was abandoned, or a panic unwound past
        // the permit. A permit's holder says how the call went, and may
        // hold it long before calling: one dropped unsaid is a
        // cancellation however long it was held (`cancelled_failure_after`
        // does not apply), and a probe so ended reopens the breaker for
        // the same period.
        self.admission.cancel(&self.shared, None);
    }
}

impl std::fmt::Debug for CallPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallPermit")
            .field("breaker", self.shared.name())
            .field("generation", &self.admission.generation())
            .field("probe", &self.admission.holds_permit())
            .finish()
    }
}
