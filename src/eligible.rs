//! Probe eligibility: which requests may be a half-open breaker's probe.
//!
//! A probe is a real request sent to a dependency that may still be down.
//! For some requests that is a bad bet: a `POST` that charges a card, or a
//! prompt that costs money whatever the answer. `.probe_when(predicate)` on
//! [`CircuitBreakerLayer`](crate::CircuitBreakerLayer),
//! [`CircuitBreaker`](crate::CircuitBreaker) and
//! [`KeyedLayer`](crate::registry::KeyedLayer) says which requests may probe:
//!
//! * **Closed**, every request passes; the predicate is not asked.
//! * **Half-open with a probe due**, a request the predicate refuses gets
//!   the usual [`CircuitOpen`](crate::CircuitOpen) (state
//!   [`HalfOpen`](crate::State::HalfOpen)), without being called and
//!   **without taking the probe permit**: the next request that may probe
//!   still probes. Its `retry_after` is the one every refused caller gets
//!   while half-open: the time left until the probes in flight are due (the
//!   probe timeout), but never more than the open period that just ended;
//!   with no probe in flight, the open period. An eligible request's probe
//!   settles the question sooner, and a caller that comes back early is
//!   refused again, cheaply.
//! * **Open**, every request is refused, as before.
//!
//! Without a predicate ([`AnyRequest`], the default) any request may probe,
//! at no cost. With one, the probe permit is taken in `call`, where the
//! request is seen, rather than reserved by `poll_ready`: a request that
//! may not probe never holds it, not even between `poll_ready` and `call`.
//! In [gate mode](crate::Readiness::Gate) a clone is ready while a probe is
//! due, and its `call` refuses a request that may not probe.
//!
//! Two predicates ship here, for `http::Request`s: [`idempotent_methods`]
//! and [`marked`] (a [`SafeProbe`] in the request's extensions). Any
//! `Fn(&Req) -> bool` is a predicate, so they combine in a closure:
//! `|req: &Request<B>| idempotent_methods(req) || marked(req)`.
//! They are generic over the body: the compiler learns its type where the
//! service is called or named (`oneshot`, a `BoxCloneService`); where
//! nothing does, name it: `idempotent_methods::<Body>`.
//!
//! ```
//! use std::time::Duration;
//! use http::{Method, Request};
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::{eligible, CircuitBreakerLayer, CircuitOpen, Config, State};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let layer = CircuitBreakerLayer::new(Config::default()).probe_when(eligible::idempotent_methods);
//! let breaker = layer.breaker();
//! let client = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: Request<()>| async { Ok::<_, BoxError>("ok") }));
//!
//! breaker.force_open(Some(Duration::from_secs(10))); // an outage...
//! tokio::time::advance(Duration::from_secs(10)).await; // ...whose open period is over
//! assert_eq!(breaker.state(), State::HalfOpen);
//! let post = Request::post("/charge").body(())?;
//! let err = client.clone().oneshot(post).await.unwrap_err();
//! assert_eq!(CircuitOpen::find(err.as_ref()).map(|open| open.state()), Some(State::HalfOpen));
//!
//! // The POST took no permit: the GET probes, and closes the breaker.
//! let get = Request::builder().method(Method::GET).uri("/status").body(())?;
//! assert_eq!(client.oneshot(get).await?, "ok");
//! assert_eq!(breaker.state(), State::Closed);
//! # Ok(())
//! # }
//! ```

use http::{Method, Request};

/// Says whether a request may be a half-open breaker's probe.
///
/// Implemented by every `Fn(&Req) -> bool`, and by [`AnyRequest`], the
/// default, which lets any request probe. The predicate is asked only
/// while the breaker is half-open, never in closed state. It is cloned
/// with each service clone: a function or a closure without captures costs
/// nothing; put large state behind an `Arc`.
pub trait ProbeEligibility<Req> {
    /// Whether every request may probe, known from the type alone: then no
    /// request is asked about, and `poll_ready` reserves the permit.
    const ANY_REQUEST: bool = false;

    /// Whether `request` may be a probe.
    fn may_probe(&self, request: &Req) -> bool;
}

/// Any request may probe: the default, and today's behaviour without a
/// predicate (the permit is reserved in `poll_ready`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AnyRequest;

impl<Req> ProbeEligibility<Req> for AnyRequest {
    const ANY_REQUEST: bool = true;

    #[inline(always)]
    fn may_probe(&self, _: &Req) -> bool {
        true
    }
}

impl<Req, F> ProbeEligibility<Req> for F
where
    F: Fn(&Req) -> bool,
{
    #[inline]
    fn may_probe(&self, request: &Req) -> bool {
        self(request)
    }
}

/// Requests with an idempotent method may probe: `GET`, `HEAD`, `OPTIONS`,
/// `TRACE`, `PUT` and `DELETE` (RFC 9110, §9.2.2). Sending one to a
/// dependency that is still down does no harm a retry would not.
///
/// ```
/// use http::Request;
/// use tower_circuit_breaker::eligible::idempotent_methods;
///
/// assert!(idempotent_methods(&Request::get("/").body(()).unwrap()));
/// assert!(!idempotent_methods(&Request::post("/").body(()).unwrap()));
/// ```
pub fn idempotent_methods<B>(request: &Request<B>) -> bool {
    matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Requests that carry a [`SafeProbe`] in their extensions may probe.
///
/// ```
/// use http::Request;
/// use tower_circuit_breaker::eligible::{marked, SafeProbe};
///
/// let mut request = Request::post("/v1/chat").body(()).unwrap();
/// assert!(!marked(&request));
/// request.extensions_mut().insert(SafeProbe);
/// assert!(marked(&request));
/// ```
pub fn marked<B>(request: &Request<B>) -> bool {
    request.extensions().get::<SafeProbe>().is_some()
}

/// A mark in a request's `http::Extensions`: this request may be a probe
/// (with the [`marked`] predicate). Put it on requests that are cheap and
/// harmless to send to a dependency that may still be down: a one-token
/// completion, a read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SafeProbe;
