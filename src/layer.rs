//! The tower [`Layer`]: every service it wraps shares one breaker.

use tower_layer::Layer;

use crate::breaker::Breaker;
use crate::classify::ErrorsAsFailures;
use crate::config::Config;
use crate::eligible::AnyRequest;
use crate::service::{CircuitBreaker, Readiness};

/// Wraps services in a [`CircuitBreaker`].
///
/// **Every service one layer wraps shares one breaker**: a layer stands for
/// one dependency. Calling [`layer`](Layer::layer) twice does not make two
/// breakers; build one layer per dependency (or use
/// [`Breaker::layer`] to share a breaker you already hold).
///
/// ```
/// use std::time::Duration;
/// use tower::{ServiceBuilder, ServiceExt, service_fn, BoxError};
/// use tower_circuit_breaker::{CircuitBreakerLayer, Config, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let breaker = CircuitBreakerLayer::new(Config::builder().name("upstream").build()?);
/// let handle = breaker.breaker();
///
/// let service = ServiceBuilder::new()
///     .layer(breaker)
///     .timeout(Duration::from_secs(30)) // inside: a hang becomes a failure it sees
///     .service(service_fn(|req: &'static str| async move { Ok::<_, BoxError>(req.len()) }));
///
/// assert_eq!(service.oneshot("hello").await?, 5);
/// assert_eq!(handle.state(), State::Closed);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct CircuitBreakerLayer<C = ErrorsAsFailures, P = AnyRequest> {
    breaker: Breaker,
    classifier: C,
    mode: Readiness,
    eligible: P,
}

impl CircuitBreakerLayer {
    /// A layer around a new breaker with `config` and the default
    /// classifier (every `Err` is a failure).
    pub fn new(config: Config) -> Self {
        Self::from_breaker(Breaker::new(config))
    }

    /// A layer around an existing breaker.
    pub fn from_breaker(breaker: Breaker) -> Self {
        CircuitBreakerLayer {
            breaker,
            classifier: ErrorsAsFailures,
            mode: Readiness::FailFast,
            eligible: AnyRequest,
        }
    }
}

impl<C, P> CircuitBreakerLayer<C, P> {
    /// Uses `classifier` to decide which results count as failures.
    pub fn classify<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2, P> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier,
            mode: self.mode,
            eligible: self.eligible,
        }
    }

    /// Lets only the requests `predicate` accepts be a half-open probe
    /// (default: any request). Any `Fn(&Req) -> bool` is a predicate;
    /// [`eligible`](crate::eligible) ships two for `http::Request`s.
    ///
    /// While a probe is due, a request the predicate refuses is refused
    /// with [`CircuitOpen`](crate::CircuitOpen) (state half-open), is not
    /// called, and takes no probe permit: the next request that may probe
    /// still probes. Its `retry_after` is what every refused caller is told
    /// while half-open (the probes' deadline, at most the open period that
    /// just ended). Closed, every request passes and the predicate is not
    /// asked.
    ///
    /// ```
    /// use http::Request;
    /// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::{eligible, CircuitBreakerLayer, Config};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// let client = ServiceBuilder::new()
    ///     .layer(
    ///         CircuitBreakerLayer::new(Config::builder().name("payments").build()?)
    ///             // A retried GET is harmless; a POST is not: only the first probes.
    ///             .probe_when(|req: &Request<()>| {
    ///                 eligible::idempotent_methods(req) || eligible::marked(req)
    ///             }),
    ///     )
    ///     .service(service_fn(|_req: Request<()>| async { Ok::<_, BoxError>("paid") }));
    ///
    /// // Closed: every request passes, whatever the predicate says.
    /// assert_eq!(client.oneshot(Request::post("/charge").body(())?).await?, "paid");
    /// # Ok(())
    /// # }
    /// ```
    pub fn probe_when<P2>(self, predicate: P2) -> CircuitBreakerLayer<C, P2> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
            mode: self.mode,
            eligible: predicate,
        }
    }

    /// Sets how wrapped services answer `poll_ready` while the breaker will
    /// not admit a call (default [`Readiness::FailFast`]; see [`Readiness`]).
    pub fn readiness(mut self, mode: Readiness) -> Self {
        self.mode = mode;
        self
    }

    /// A handle to the breaker every wrapped service shares.
    pub fn breaker(&self) -> Breaker {
        self.breaker.clone()
    }
}

impl Breaker {
    /// A layer whose services all share this breaker.
    ///
    /// ```
    /// use tower::{service_fn, BoxError, ServiceBuilder};
    /// use tower_circuit_breaker::{Breaker, Config};
    ///
    /// let breaker = Breaker::new(Config::builder().name("search").build()?);
    /// let service = ServiceBuilder::new()
    ///     .layer(breaker.layer())
    ///     .service(service_fn(|q: String| async move { Ok::<_, BoxError>(q.len()) }));
    /// # let _ = service;
    /// # Ok::<_, tower_circuit_breaker::ConfigError>(())
    /// ```
    pub fn layer(&self) -> CircuitBreakerLayer {
        CircuitBreakerLayer::from_breaker(self.clone())
    }
}

impl From<&Breaker> for CircuitBreakerLayer {
    /// A layer around `breaker`, as [`Breaker::layer`] makes it.
    fn from(breaker: &Breaker) -> Self {
        breaker.layer()
    }
}

impl<S, C: Clone, P: Clone> Layer<S> for CircuitBreakerLayer<C, P> {
    type Service = CircuitBreaker<S, C, P>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::with_classifier(inner, &self.breaker, self.classifier.clone())
            .readiness(self.mode)
            .probe_when(self.eligible.clone())
    }
}
