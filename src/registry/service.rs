//! The keyed tower service: each request goes through the breaker of its
//! key (and of the key's parent).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::{Registry, RegistryFull};
use crate::breaker::admission::Permit;
use crate::breaker::Breaker;
use crate::classify::{Classify, ErrorsAsFailures, Outcome, Verdict};
use crate::error::{CircuitOpen, Name};
use crate::future::{record, Record};
use crate::service::Settled;

/// Wraps services in a [`KeyedCircuitBreaker`]: every request goes through
/// the breaker its key names, made on first use in the [`Registry`].
///
/// `key_of` reads the key from the request; see [`authority`](super::authority)
/// and [`header`](super::header) for `http::Request`s.
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_circuit_breaker::{registry::{KeyedLayer, Registry}, Config};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let registry = Registry::<String>::new(Config::default());
/// let svc = ServiceBuilder::new()
///     .layer(KeyedLayer::new(registry.clone(), |req: &(String, u32)| req.0.clone()))
///     .service(service_fn(|(_, n): (String, u32)| async move { Ok::<_, BoxError>(n) }));
/// assert_eq!(svc.oneshot(("openai".to_string(), 7)).await?, 7);
/// assert_eq!(registry.len(), 1);
/// # Ok(())
/// # }
/// ```
pub struct KeyedLayer<K, F, C = ErrorsAsFailures> {
    registry: Registry<K>,
    key_of: F,
    classifier: C,
}

impl<K, F: Clone, C: Clone> Clone for KeyedLayer<K, F, C> {
    fn clone(&self) -> Self {
        KeyedLayer {
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<K, F> KeyedLayer<K, F> {
    /// A layer over `registry`, keying requests with `key_of`.
    pub fn new(registry: Registry<K>, key_of: F) -> Self {
        KeyedLayer {
            registry,
            key_of,
            classifier: ErrorsAsFailures,
        }
    }
}

impl<K, F, C> KeyedLayer<K, F, C> {
    /// Uses `classifier` to decide which results count as failures.
    pub fn classify<C2>(self, classifier: C2) -> KeyedLayer<K, F, C2> {
        KeyedLayer {
            registry: self.registry,
            key_of: self.key_of,
            classifier,
        }
    }
}

impl<S, K, F: Clone, C: Clone> Layer<S> for KeyedLayer<K, F, C> {
    type Service = KeyedCircuitBreaker<S, K, F, C>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedCircuitBreaker {
            inner,
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

/// A service whose requests each go through the breaker of their key and,
/// if the key has a parent, through the parent's too.
///
/// Readiness is the inner service's: the key comes from the request, so
/// admission happens in `call` (a half-open permit is taken there, not
/// reserved by `poll_ready`). A refused call never reaches the inner
/// service. Its error type is the inner service's, which must hold a
/// [`CircuitOpen`] and a [`RegistryFull`] (`BoxError` holds both).
pub struct KeyedCircuitBreaker<S, K, F, C = ErrorsAsFailures> {
    inner: S,
    registry: Registry<K>,
    key_of: F,
    classifier: C,
}

impl<S: Clone, K, F: Clone, C: Clone> Clone for KeyedCircuitBreaker<S, K, F, C> {
    fn clone(&self) -> Self {
        KeyedCircuitBreaker {
            inner: self.inner.clone(),
            registry: self.registry.clone(),
            key_of: self.key_of.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, K, F, C> fmt::Debug for KeyedCircuitBreaker<S, K, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCircuitBreaker")
            .field("inner", &self.inner)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// One breaker a call went through, and how it was admitted there.
struct Leg {
    breaker: Breaker,
    generation: u32,
    permit: Option<Permit>,
    record: Record,
}

impl Leg {
    /// Admits the call at `breaker`, or says why not (counting the
    /// refusal). The admission is counted by the caller once every breaker
    /// the call goes through has admitted it: a call a child refuses was
    /// not admitted by its parent either.
    fn admit(breaker: Breaker) -> Result<Leg, CircuitOpen> {
        let shared = &breaker.shared;
        match Settled::of(shared.admit(), shared) {
            Settled::Admitted {
                generation,
                permit,
                record,
                shadowed,
            } => {
                if shadowed {
                    // A real breaker would have refused this call.
                    shared.count_call(false);
                }
                Ok(Leg {
                    breaker,
                    generation,
                    permit,
                    record,
                })
            }
            Settled::Refused {
                retry_after_ms,
                state,
            } => {
                shared.count_call(false);
                Err(CircuitOpen::new(
                    Name::new(shared.name()),
                    retry_after_ms,
                    state,
                ))
            }
        }
    }

    fn record(&mut self, verdict: Verdict, start: Option<Instant>) {
        if self.record == Record::Nothing {
            return;
        }
        let count_only = self.record == Record::CountOnly;
        self.record = Record::Nothing;
        record(
            &self.breaker.shared,
            self.generation,
            &mut self.permit,
            verdict,
            start,
            count_only,
        );
    }
}

impl<S, K, F, C, Req> Service<Req> for KeyedCircuitBreaker<S, K, F, C>
where
    S: Service<Req>,
    S::Error: From<CircuitOpen> + From<RegistryFull>,
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    F: Fn(&Req) -> K,
    C: Classify<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = KeyedFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = (self.key_of)(&req);
        let (child, parent) = match self.registry.get_with_parent(&key) {
            Ok(breakers) => breakers,
            Err(full) => return KeyedFuture::failed(full.into()),
        };
        // The parent first: when it is open, the child is not asked (and
        // takes no probe permit it would only give back).
        let parent = match parent.map(Leg::admit).transpose() {
            Ok(leg) => leg,
            Err(open) => return KeyedFuture::failed(open.into()),
        };
        let child = match Leg::admit(child) {
            Ok(leg) => leg,
            // Dropping the parent's leg gives back any permit it took.
            Err(open) => return KeyedFuture::failed(open.into()),
        };
        for leg in std::iter::once(&child).chain(parent.as_ref()) {
            leg.breaker.shared.count_call(true);
        }
        let needs_latency = child.breaker.shared.needs_latency()
            || parent
                .as_ref()
                .is_some_and(|p| p.breaker.shared.needs_latency());
        let start = needs_latency.then(Instant::now);
        KeyedFuture {
            state: KeyedState::Called {
                future: self.inner.call(req),
                legs: [Some(child), parent],
                classifier: self.classifier.clone(),
                start,
            },
        }
    }
}

pin_project! {
    /// Response future of [`KeyedCircuitBreaker`]: records the outcome in
    /// the key's breaker and its parent's when the call completes.
    pub struct KeyedFuture<F, C> {
        #[pin]
        state: KeyedState<F, C>,
    }
}

pin_project! {
    #[project = KeyedProj]
    enum KeyedState<F, C> {
        Called {
            #[pin]
            future: F,
            legs: [Option<Leg>; 2],
            classifier: C,
            start: Option<Instant>,
        },
        Failed {
            error: Option<FailedOutput>,
        },
    }
}

/// An error made before the call: a refusal, or a full registry.
enum FailedOutput {
    Open(CircuitOpen),
    Full(RegistryFull),
}

impl From<CircuitOpen> for FailedOutput {
    fn from(open: CircuitOpen) -> Self {
        FailedOutput::Open(open)
    }
}

impl From<RegistryFull> for FailedOutput {
    fn from(full: RegistryFull) -> Self {
        FailedOutput::Full(full)
    }
}

impl<F, C> KeyedFuture<F, C> {
    fn failed(error: FailedOutput) -> Self {
        KeyedFuture {
            state: KeyedState::Failed { error: Some(error) },
        }
    }
}

impl<F, C, T, E> Future for KeyedFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: From<CircuitOpen> + From<RegistryFull>,
    C: Classify<T, E>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            KeyedProj::Failed { error } => match error.take() {
                Some(FailedOutput::Open(open)) => Poll::Ready(Err(E::from(open))),
                Some(FailedOutput::Full(full)) => Poll::Ready(Err(E::from(full))),
                None => panic!("KeyedFuture polled after completion"),
            },
            KeyedProj::Called {
                future,
                legs,
                classifier,
                start,
            } => {
                let output = match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(output)) => output,
                    Err(panic) => {
                        for leg in legs.iter_mut().flatten() {
                            leg.record(Verdict::new(Outcome::Failure), *start);
                        }
                        resume_unwind(panic)
                    }
                };
                let verdict =
                    match catch_unwind(AssertUnwindSafe(|| classifier.classify(output.as_ref()))) {
                        Ok(verdict) => verdict,
                        Err(panic) => {
                            for leg in legs.iter_mut().flatten() {
                                leg.record(Verdict::new(Outcome::Failure), *start);
                            }
                            resume_unwind(panic)
                        }
                    };
                for leg in legs.iter_mut().flatten() {
                    leg.record(verdict, *start);
                }
                Poll::Ready(output)
            }
        }
    }
}
