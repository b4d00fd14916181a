//! Failover: an ordered chain of candidates, each behind its own breaker.
//!
//! [`Failover`] sends each request to the first candidate that can take it
//! and moves down the chain when one cannot:
//!
//! | the candidate | what the failover does |
//! | --- | --- |
//! | its breaker is open (or held open) | skips it **without calling it**: a read of its state |
//! | its breaker refuses the call with [`CircuitOpen`](crate::CircuitOpen) (half-open, every probe in flight) | moves on; costs no attempt |
//! | it answers, and the classifier says failure (timeout, 5xx, 429) | moves on to the next |
//! | it answers, and the classifier says ignore (a 400: the request is bad) | returns that answer: another provider would refuse it too |
//! | it answers, and the classifier says success | returns it |
//!
//! When no candidate answered, the request fails with [`Exhausted`], which
//! carries every candidate's reason and the smallest retry-after among the
//! open ones. Each fallback is a `tracing` event with structured fields
//! (`candidate`, `breaker`, `state`, `reason`): skips of an open candidate
//! and exhausted chains at `DEBUG` (during an outage they happen on every
//! request), a move past a failed call at `INFO`, a last resort at `WARN`.
//!
//! It sits outermost: failover → breaker → retry → timeout → client.

mod candidate;
mod error;
mod future;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tower::BoxError;
use tower_service::Service;

use crate::classify::{Classify, ErrorsAsFailures};

pub use self::candidate::Candidate;
pub use self::error::{Exhausted, Reason, Unavailable};
pub use self::future::ResponseFuture;

/// A tower [`Service`] over an ordered list of candidates, each behind its
/// breakers: each request goes to the first candidate that answers it (see
/// the [module docs](self) for every case).
///
/// * **A candidate is a breaker service**
///   ([`CircuitBreaker`](crate::CircuitBreaker), or a
///   [`KeyedCircuitBreaker`](crate::registry::KeyedCircuitBreaker) whose
///   request picks its breaker: the request's model picks the (provider,
///   model) breaker and through it the provider's parent). Before a
///   candidate is called, the failover reads the state of every breaker the
///   request would go through there, its key's and the key's parent's: if
///   any is open or held open, the candidate is skipped **without being
///   called**, not even made ready. An operator who isolates a provider
///   (`force_open` on its parent) can count on it: never called, by a last
///   resort either.
/// * **Requests must be `Clone`**: each call a request reaches is made with
///   a clone of it (the original is kept for the next candidate). Make large
///   bodies cheap to clone (`Bytes`, an `Arc`). A gRPC `Channel`'s requests
///   are encoded bodies, which are not: fail over on a service of the
///   message instead, cloned before tonic encodes it (see the [guide's gRPC
///   router](crate::guide::clients#a-grpc-router)).
/// * **Requests are not rewritten**: every candidate gets the same request,
///   so each candidate's own stack sets what differs between providers (its
///   address, its model name, its credential), as `map_request` does.
/// * **The error type is tower's `BoxError`**: a candidate's own error when
///   the classifier returns it (ignored, or counted a success), or
///   [`Exhausted`] when no candidate answered.
/// * **`poll_ready` is always ready.** Which candidate a request reaches, and
///   whether it needs a second one, is known only once earlier attempts have
///   answered, so the response future drives each candidate's readiness
///   (`ready`, then `call`) itself, on a copy of that candidate. Each clone
///   of the failover keeps the copies it made and reuses them, so a
///   breaker's per-clone handle is made once per clone of the failover and
///   candidate, not once per request. A candidate whose `poll_ready` fails
///   counts as failed for that request.
/// * **Use fail-fast candidates** ([`Readiness::FailFast`], the default): a
///   gated one, half-open with every probe in flight, makes the request wait
///   for it rather than move on.
/// * **The classifier is the failover's own** (default: every `Err` is a
///   failure). Give it the one the breakers use, such as
///   [`HttpClassifier`](crate::classify::HttpClassifier), with
///   [`classify`](Failover::classify), so a 503 counts as a failure here as
///   it does there. A streamed answer whose head looks fine is an answer:
///   its body is the caller's, and its end is judged by the candidate's
///   breakers.
/// * **At most [`max_attempts`](Failover::max_attempts) calls** per request
///   (default: the number of candidates). Skips and refusals by an open
///   breaker cost nothing and do not count.
/// * **Last resort** (off by default, [`last_resort`](Failover::last_resort)):
///   when every candidate is open, the one whose retry-after ends soonest is
///   called anyway, around its breakers.
///
/// Candidates all have one type: wrap different clients in
/// `tower::util::BoxCloneService` inside their breakers.
///
/// ```
/// use tower::{service_fn, util::BoxCloneService, BoxError, ServiceExt};
/// use tower_circuit_breaker::failover::{Exhausted, Failover};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker, Config};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// type Provider = BoxCloneService<String, String, BoxError>;
/// let primary: Provider = BoxCloneService::new(service_fn(|_prompt: String| async {
///     Err::<String, BoxError>("503 from primary".into())
/// }));
/// let secondary: Provider = BoxCloneService::new(service_fn(|prompt: String| async move {
///     Ok::<_, BoxError>(format!("secondary answers {prompt}"))
/// }));
///
/// let primary_breaker = Breaker::new(Config::builder().name("primary").build()?);
/// let secondary_breaker = Breaker::new(Config::builder().name("secondary").build()?);
/// let chain = Failover::new([
///     CircuitBreaker::new(primary, &primary_breaker),
///     CircuitBreaker::new(secondary, &secondary_breaker),
/// ]);
///
/// // The primary fails; the secondary answers.
/// let answer = chain.clone().oneshot("hi".to_string()).await?;
/// assert_eq!(answer, "secondary answers hi");
///
/// // With every breaker open, nothing is called and the error says when to
/// // come back.
/// primary_breaker.force_open(Some(std::time::Duration::from_secs(30)));
/// secondary_breaker.force_open(Some(std::time::Duration::from_secs(10)));
/// let err = chain.oneshot("hi".to_string()).await.unwrap_err();
/// let exhausted = Exhausted::find(err.as_ref()).expect("every candidate is open");
/// assert_eq!(exhausted.candidates().len(), 2);
/// assert_eq!(exhausted.retry_after(), Some(std::time::Duration::from_secs(10)));
/// # Ok(())
/// # }
/// ```
///
/// Over keyed candidates, one per provider, each request goes through the
/// breaker of its (provider, model) and the provider's:
///
/// ```
/// use tower::{service_fn, util::BoxCloneService, BoxError, Layer, ServiceExt};
/// use tower_circuit_breaker::failover::Failover;
/// use tower_circuit_breaker::registry::{KeyedLayer, Registry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// type Provider = BoxCloneService<&'static str, String, BoxError>;
/// let provider = |name: &'static str| -> Provider {
///     BoxCloneService::new(service_fn(move |model: &'static str| async move {
///         Ok::<_, BoxError>(format!("{model} by {name}"))
///     }))
/// };
/// let registry = Registry::<String>::builder()
///     .parent(|key: &String| key.split_once('/').map(|(provider, _)| provider.to_string()))
///     .build();
/// let candidate = |name: &'static str| {
///     KeyedLayer::new(registry.clone(), move |model: &&'static str| format!("{name}/{model}"))
///         .layer(provider(name))
/// };
/// let chain = Failover::new([candidate("beta"), candidate("alpha")]);
///
/// // The operator isolates the provider `beta`: its models are never called.
/// registry.get(&"beta".to_string())?.force_open(None);
/// assert_eq!(chain.oneshot("gpt").await?, "gpt by alpha");
/// # Ok(())
/// # }
/// ```
///
/// [`Readiness::FailFast`]: crate::Readiness::FailFast
pub struct Failover<T, C = ErrorsAsFailures> {
    pool: Arc<Pool<T>>,
    classifier: C,
    settings: Settings,
}

/// What a response future needs to know of the failover's settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) max_attempts: usize,
    pub(crate) last_resort: bool,
}

/// The chain, shared by every clone of the failover, and this clone's idle
/// copies of its candidates, shared with its response futures.
pub(crate) struct Pool<T> {
    /// Copied when a clone of the failover has no idle copy at hand. Behind
    /// a mutex so that the chain can be shared across threads whatever the
    /// candidate is (`BoxCloneService` is `Send` but not `Sync`).
    prototypes: Arc<[Mutex<T>]>,
    /// One list per candidate, of copies made by this clone that are not in
    /// use. A copy goes back right after its `call`: it never holds a
    /// reservation when it does.
    idle: Mutex<Vec<Vec<T>>>,
}

/// Locks a mutex that never holds user state mid-update: a panic in a
/// user's `clone` leaves the lists as they were, so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T> Pool<T> {
    fn new(prototypes: Arc<[Mutex<T>]>) -> Self {
        let idle = Mutex::new(prototypes.iter().map(|_| Vec::new()).collect());
        Pool { prototypes, idle }
    }

    /// How many candidates the chain has.
    pub(crate) fn len(&self) -> usize {
        self.prototypes.len()
    }

    /// A copy of candidate `index` to call: an idle one, or a new one.
    pub(crate) fn take(&self, index: usize) -> Option<T>
    where
        T: Clone,
    {
        let idle = lock(&self.idle).get_mut(index).and_then(Vec::pop);
        match idle {
            Some(copy) => Some(copy),
            None => self.prototypes.get(index).map(|p| lock(p).clone()),
        }
    }

    /// Gives back a copy after its `call`.
    pub(crate) fn give_back(&self, index: usize, copy: T) {
        if let Some(list) = lock(&self.idle).get_mut(index) {
            list.push(copy);
        }
    }
}

impl<T> Failover<T> {
    /// A chain over `candidates`, tried in order, with the default
    /// classifier (every `Err` is a failure), at most one call per
    /// candidate, and no last resort.
    pub fn new(candidates: impl IntoIterator<Item = T>) -> Self {
        let prototypes: Arc<[Mutex<T>]> = candidates.into_iter().map(Mutex::new).collect();
        let max_attempts = prototypes.len().max(1);
        Failover {
            pool: Arc::new(Pool::new(prototypes)),
            classifier: ErrorsAsFailures,
            settings: Settings {
                max_attempts,
                last_resort: false,
            },
        }
    }
}

impl<T, C> Failover<T, C> {
    /// Uses `classifier` to decide whether a candidate's result is an answer
    /// (success, or ignored: returned to the caller) or a failure (the next
    /// candidate is tried). Use the breakers' classifier.
    pub fn classify<C2>(self, classifier: C2) -> Failover<T, C2> {
        Failover {
            pool: self.pool,
            classifier,
            settings: self.settings,
        }
    }

    /// Bounds the calls one request may make (default: the number of
    /// candidates; 0 is taken as 1). Candidates past the bound are reported
    /// as [`Reason::NotTried`] (or as open, if they are).
    pub fn max_attempts(mut self, attempts: usize) -> Self {
        self.settings.max_attempts = attempts.max(1);
        self
    }

    /// When every candidate is open, call the one whose retry-after ends
    /// soonest anyway, going around its breakers (default: off).
    ///
    /// The last resort calls the candidate's inner service directly: its
    /// breakers neither admit nor record the call, so their open periods
    /// and probes go on as if the call had not been made, and the result is
    /// returned as it is, success or failure. A candidate any of whose
    /// breakers is held open by an operator (no end to its open period) is
    /// never a last resort.
    pub fn last_resort(mut self, enabled: bool) -> Self {
        self.settings.last_resort = enabled;
        self
    }
}

impl<T, C, Req> Service<Req> for Failover<T, C>
where
    T: Candidate<Req>,
    T::Error: Into<BoxError>,
    C: Classify<T::Response, T::Error> + Clone,
    Req: Clone,
{
    type Response = T::Response;
    type Error = BoxError;
    type Future = ResponseFuture<T, C, Req>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Always ready: the candidate a request reaches is chosen, and made
        // ready, by its response future (see the type's docs).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture::new(
            Arc::clone(&self.pool),
            self.classifier.clone(),
            request,
            self.settings,
        )
    }
}

impl<T, C: Clone> Clone for Failover<T, C> {
    fn clone(&self) -> Self {
        Failover {
            // The chain is shared; the idle copies are not: a new clone (one
            // per task, as tower clones services) makes and keeps its own.
            pool: Arc::new(Pool::new(Arc::clone(&self.pool.prototypes))),
            classifier: self.classifier.clone(),
            settings: self.settings,
        }
    }
}

impl<T, C> fmt::Debug for Failover<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failover")
            .field("candidates", &self.pool.len())
            .field("max_attempts", &self.settings.max_attempts)
            .field("last_resort", &self.settings.last_resort)
            .finish_non_exhaustive()
    }
}
