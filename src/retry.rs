//! A retry policy that knows the breaker (feature `retry`): for
//! `tower::retry`, it never retries a refusal before its `retry_after`,
//! backs off between other attempts (exponential, capped, jittered), and
//! spends a retry budget shared by every request, so that retries cannot
//! multiply the load on a struggling upstream.
//!
//! A naive policy ("retry any `Err`") placed outside a breaker retries a
//! [`CircuitOpen`] at once, and is refused again at once: a request burns
//! its attempts in microseconds and learns nothing. [`RetryPolicy`] waits
//! out the refusal's `retry_after` instead, and gives up at once when that
//! is longer than it is willing to wait ([`max_wait`](RetryPolicy::max_wait)),
//! handing the refusal to the caller (to fail over, or to answer 503).
//!
//! | what came back | [`RetryPolicy`] |
//! | --- | --- |
//! | a success, or an outcome the classifier ignores (a 400) | returned |
//! | a refusal ([`CircuitOpen`]) | retried after its `retry_after` (plus jitter), or returned at once if that is longer than `max_wait` |
//! | a failure with a retry-after hint (a 429 or 503's `Retry-After`, a gRPC pushback) | retried after the hint (plus jitter), or returned if that is longer than `max_wait` |
//! | any other failure | retried after a backoff: `base` doubled each retry, capped at `max_backoff`, drawn at random between half of it and all of it |
//! | no retry left, or the budget spent | returned |
//!
//! Each original request deposits in the budget (tower's
//! [`TpsBudget`]: by default, retries up to 20% of requests over the last
//! 10 s, plus 10 per second); each retry withdraws from it. Clone the
//! policy (or pass one `Arc<TpsBudget>` to several) to share a budget.
//!
//! Outside the breaker, it retries refusals and failures alike; inside it
//! (between the breaker and the timeout), the breaker sees only each
//! request's final outcome. Either way the timeout stays inside the
//! breaker:
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::retry::RetryPolicy;
//! use tower_circuit_breaker::{CircuitBreakerLayer, Config};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let client = service_fn(|prompt: String| async move { Ok::<_, BoxError>(prompt.len()) });
//! let stack = ServiceBuilder::new()
//!     .retry(RetryPolicy::new().retries(2).max_wait(Duration::from_secs(5)))
//!     .layer(CircuitBreakerLayer::new(Config::builder().name("openai").build()?))
//!     .timeout(Duration::from_secs(30))
//!     .service(client);
//! assert_eq!(stack.oneshot("hello".to_string()).await?, 5);
//! # Ok(())
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Sleep;
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;

use crate::classify::{Classify, ErrorsAsFailures, Outcome};
use crate::error::CircuitOpen;

/// Errors a [`RetryPolicy`] can look into for a breaker's refusal.
///
/// Implemented for tower's `BoxError` (the refusal itself, or in its
/// source chain), for [`CircuitOpen`] and, with the `tonic` feature, for
/// `tonic::Status`. For an error enum of your own, return the variant
/// that holds the refusal.
pub trait FindRefusal {
    /// The refusal this error is or holds, if any.
    fn find_refusal(&self) -> Option<&CircuitOpen>;
}

impl FindRefusal for Box<dyn Error + Send + Sync> {
    fn find_refusal(&self) -> Option<&CircuitOpen> {
        CircuitOpen::find(self.as_ref())
    }
}

impl FindRefusal for CircuitOpen {
    fn find_refusal(&self) -> Option<&CircuitOpen> {
        Some(self)
    }
}

#[cfg(feature = "tonic")]
impl FindRefusal for tonic::Status {
    fn find_refusal(&self) -> Option<&CircuitOpen> {
        CircuitOpen::find(self)
    }
}

/// A `tower::retry::Policy` that waits out refusals, backs off with
/// jitter, and spends a shared retry budget (see the [module](self)).
///
/// | setting | default |
/// | --- | --- |
/// | [`retries`](Self::retries) | 2 (3 attempts in all) |
/// | [`backoff`](Self::backoff) | 100 ms, doubling, capped at 2 s |
/// | [`max_wait`](Self::max_wait) | 10 s |
/// | [`budget`](Self::budget) | `TpsBudget::default()`: 20% of requests over 10 s, plus 10 per second |
/// | [`classify`](Self::classify) | [`ErrorsAsFailures`]: every `Err` is worth a retry |
///
/// Requests must be `Clone` (each attempt sends a copy). Every setting
/// takes any value: a `base` longer than `max_backoff` is capped by it.
#[derive(Clone)]
pub struct RetryPolicy<C = ErrorsAsFailures> {
    /// Retries left to this request: the template's count, spent by the
    /// copy `tower::retry` makes for each request.
    retries_left: u32,
    /// Whether this copy has seen its request's first outcome (and
    /// deposited in the budget for it).
    started: bool,
    /// The retries made so far, which the backoff doubles with.
    retried: u32,
    base: Duration,
    max_backoff: Duration,
    max_wait: Duration,
    budget: Arc<TpsBudget>,
    classifier: C,
}

impl RetryPolicy {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        RetryPolicy {
            retries_left: 2,
            started: false,
            retried: 0,
            base: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_wait: Duration::from_secs(10),
            budget: Arc::new(TpsBudget::default()),
            classifier: ErrorsAsFailures,
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::new()
    }
}

impl<C> RetryPolicy<C> {
    /// At most `retries` retries per request (so `retries + 1` attempts).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries_left = retries;
        self
    }

    /// The backoff before a retry of a failure without a hint: `base`,
    /// doubled after each retry, capped at `max_backoff`; each wait is
    /// drawn at random between half of that and all of it, so that callers
    /// that failed together do not come back together.
    pub fn backoff(mut self, base: Duration, max_backoff: Duration) -> Self {
        self.base = base;
        self.max_backoff = max_backoff;
        self
    }

    /// The longest refusal (or announced retry-after) worth waiting out:
    /// a longer one is returned to the caller at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The retry budget, shared with whoever else holds it (one per
    /// dependency, typically).
    pub fn budget(mut self, budget: Arc<TpsBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// Which results are worth a retry: those `classifier` calls failures
    /// (its retry-after hint, a 429's `Retry-After`, is waited out as a
    /// refusal's is). With `HttpClassifier::new()`, a 503 response is
    /// retried and a 400 is not.
    pub fn classify<C2>(self, classifier: C2) -> RetryPolicy<C2> {
        RetryPolicy {
            retries_left: self.retries_left,
            started: self.started,
            retried: self.retried,
            base: self.base,
            max_backoff: self.max_backoff,
            max_wait: self.max_wait,
            budget: self.budget,
            classifier,
        }
    }

    /// The wait before retry number `retried` (from 0) of a failure
    /// without a hint, drawn with `unit`, a number in [0, 1).
    fn backoff_for(&self, retried: u32, unit: f64) -> Duration {
        let doubling = 1u32.checked_shl(retried).unwrap_or(u32::MAX);
        let cap = self
            .base
            .checked_mul(doubling)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        // Half the cap, plus up to the other half at random.
        cap / 2 + (cap / 2).mul_f64(unit)
    }
}

impl<Req, Res, E, C> Policy<Req, Res, E> for RetryPolicy<C>
where
    Req: Clone,
    E: FindRefusal,
    C: Classify<Res, E>,
{
    type Future = Sleep;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        if !std::mem::replace(&mut self.started, true) {
            // The original request: what the budget's retries are a share of.
            self.budget.deposit();
        }
        // The least time to wait: a refusal's retry-after, or a hint the
        // upstream announced with a failure.
        let wait_at_least = match &*result {
            Err(err) => match err.find_refusal() {
                Some(open) => Some(open.retry_after()),
                None => failure_hint(&self.classifier, result.as_ref())?,
            },
            Ok(_) => failure_hint(&self.classifier, result.as_ref())?,
        };
        if self.retries_left == 0 {
            return None;
        }
        if wait_at_least.is_some_and(|wait| wait > self.max_wait) {
            return None;
        }
        if !self.budget.withdraw() {
            return None;
        }
        let backoff = self.backoff_for(self.retried, unit_random());
        self.retries_left -= 1;
        self.retried = self.retried.saturating_add(1);
        let wait = match wait_at_least {
            // Never sooner than asked; the jitter spreads the callers
            // refused together over up to half a backoff after it.
            Some(wait) => wait.saturating_add(backoff / 2),
            None => backoff,
        };
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// `None` when `result` is not worth a retry; otherwise the wait it asks
/// for, if it announced one.
#[allow(clippy::option_option)]
fn failure_hint<Res, E, C: Classify<Res, E>>(
    classifier: &C,
    result: Result<&Res, &E>,
) -> Option<Option<Duration>> {
    let verdict = classifier.classify_head(result);
    (verdict.outcome() == Outcome::Failure).then(|| verdict.retry_after())
}

/// A number in [0, 1), different for every call: a fresh random hasher
/// per call, so that copies of one policy do not draw alike.
fn unit_random() -> f64 {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    (RandomState::new().hash_one(0x9e37_79b9_7f4a_7c15_u64) >> 11) as f64 / (1u64 << 53) as f64
}

impl<C: fmt::Debug> fmt::Debug for RetryPolicy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("retries_left", &self.retries_left)
            .field("base", &self.base)
            .field("max_backoff", &self.max_backoff)
            .field("max_wait", &self.max_wait)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_stays_within_half_and_all_of_it() {
        let policy =
            RetryPolicy::new().backoff(Duration::from_millis(100), Duration::from_millis(700));
        for (retried, cap_ms) in [(0, 100), (1, 200), (2, 400), (3, 700), (10, 700), (40, 700)] {
            let cap = Duration::from_millis(cap_ms);
            assert_eq!(policy.backoff_for(retried, 0.0), cap / 2, "retry {retried}");
            let high = policy.backoff_for(retried, 0.999_999);
            assert!(
                high <= cap && high > cap * 9 / 10,
                "retry {retried}: {high:?}"
            );
        }
    }

    #[test]
    fn a_base_longer_than_the_cap_is_capped() {
        let policy = RetryPolicy::new().backoff(Duration::from_secs(10), Duration::from_secs(1));
        assert!(policy.backoff_for(0, 0.999) <= Duration::from_secs(1));
        let huge = RetryPolicy::new().backoff(Duration::MAX, Duration::from_secs(3));
        assert!(huge.backoff_for(5, 0.5) <= Duration::from_secs(3));
    }

    #[test]
    fn draws_differ_between_calls() {
        let draws: Vec<f64> = (0..8).map(|_| unit_random()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(draws.windows(2).any(|pair| pair[0] != pair[1]));
    }
}
