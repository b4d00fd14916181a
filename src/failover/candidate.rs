//! What a failover needs of a candidate: the breakers a request would go
//! through there, read before it is called, and a way around them.

use std::fmt;
use std::hash::Hash;

use tower_service::Service;

use crate::classify::Classify;
use crate::eligible::ProbeEligibility;
use crate::error::HoldsCircuitOpen;
use crate::future::Finish;
use crate::registry::{HoldsKeyedRefusals, KeyedCircuitBreaker};
use crate::{Breaker, CircuitBreaker};

mod sealed {
    pub trait Sealed {}
}

/// A breaker service a [`Failover`](super::Failover) can hold: a
/// [`CircuitBreaker`] (one breaker for every request) or a
/// [`KeyedCircuitBreaker`] (the breaker of the request's key, and the
/// key's parent). Implemented by those two only.
pub trait Candidate<Req>: Service<Req> + Clone + sealed::Sealed {
    /// The service behind the breakers, called by a last resort.
    #[doc(hidden)]
    type Inner: Service<Req, Error = Self::Error> + Clone;

    /// The name of the breaker `request` would go through, and the
    /// breakers it would meet there as they are now (its own and its
    /// parent's), without making any.
    #[doc(hidden)]
    fn breakers_for(&self, request: &Req) -> (String, [Option<Breaker>; 2]);

    /// The service behind the breakers.
    #[doc(hidden)]
    fn inner(&self) -> &Self::Inner;

    /// An answer of the inner service, as a call through the breakers
    /// would have handed it on (its body, if streamed, records nothing).
    #[doc(hidden)]
    fn around(response: <Self::Inner as Service<Req>>::Response) -> Self::Response;
}

impl<S, C, P> sealed::Sealed for CircuitBreaker<S, C, P> {}

impl<S, C, P, Req> Candidate<Req> for CircuitBreaker<S, C, P>
where
    S: Service<Req> + Clone,
    S::Error: HoldsCircuitOpen,
    C: Classify<S::Response, S::Error> + Clone,
    C::Eos: Finish<S::Response>,
    P: ProbeEligibility<Req> + Clone,
{
    type Inner = S;

    fn breakers_for(&self, _: &Req) -> (String, [Option<Breaker>; 2]) {
        let breaker = self.breaker();
        (breaker.name().to_string(), [Some(breaker), None])
    }

    fn inner(&self) -> &S {
        self.get_ref()
    }

    fn around(response: S::Response) -> Self::Response {
        <C::Eos as Finish<S::Response>>::finish(response)
    }
}

impl<S, K, F, C, P> sealed::Sealed for KeyedCircuitBreaker<S, K, F, C, P> {}

impl<S, K, F, C, P, Req> Candidate<Req> for KeyedCircuitBreaker<S, K, F, C, P>
where
    P: ProbeEligibility<Req> + Clone,
    S: Service<Req> + Clone,
    S::Error: HoldsKeyedRefusals,
    K: Hash + Eq + Clone + fmt::Display + Send + Sync + 'static,
    F: Fn(&Req) -> K + Clone,
    C: Classify<S::Response, S::Error> + Clone,
    C::Eos: Finish<S::Response>,
{
    type Inner = S;

    fn breakers_for(&self, request: &Req) -> (String, [Option<Breaker>; 2]) {
        self.breakers_of(request)
    }

    fn inner(&self) -> &S {
        self.get_ref()
    }

    fn around(response: S::Response) -> Self::Response {
        <C::Eos as Finish<S::Response>>::finish(response)
    }
}
