//! tower-http's classifiers as this crate's (feature `tower-http`): use
//! `ServerErrorsAsFailures`, `GrpcErrorsAsFailures`, or a classifier of your
//! own written for tower-http, with a breaker.

use std::fmt;

use http::{HeaderMap, Response};
use tower_http::classify::{
    ClassifiedResponse, ClassifyEos as TowerHttpEos, ClassifyResponse as TowerHttpResponse,
};

use super::{Classified, Classify, ClassifyEos, Outcome, Verdict};

/// A tower-http classifier, judging for a breaker
/// ([`CircuitBreakerLayer::classify`](crate::CircuitBreakerLayer::classify)): a response or error
/// it classifies as a failure is a failure, anything else a success (tower-
/// http has no "ignore": a 4xx is a success to `ServerErrorsAsFailures`),
/// and a classification it defers to the end of the stream is made there.
///
/// ```
/// use tower_circuit_breaker::{classify::TowerHttp, CircuitBreakerLayer, Config};
/// use tower_http::classify::GrpcErrorsAsFailures;
///
/// let layer = CircuitBreakerLayer::new(Config::default())
///     .classify(TowerHttp(GrpcErrorsAsFailures::new()));
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TowerHttp<C>(pub C);

fn verdict<F>(result: Result<(), F>) -> Verdict {
    Verdict::new(match result {
        Ok(()) => Outcome::Success,
        Err(_) => Outcome::Failure,
    })
}

impl<C, B, E> Classify<Response<B>, E> for TowerHttp<C>
where
    C: TowerHttpResponse + Clone,
    C::ClassifyEos: Send + 'static,
    E: fmt::Display + 'static,
{
    /// The end-of-stream half of the tower-http classifier, wrapped alike.
    type Eos = TowerHttp<C::ClassifyEos>;

    fn classify(&self, result: Result<&Response<B>, &E>) -> Classified<Self::Eos> {
        match result {
            Ok(response) => match self.0.clone().classify_response(response) {
                ClassifiedResponse::Ready(result) => Classified::Ready(verdict(result)),
                ClassifiedResponse::RequiresEos(eos) => Classified::AtEndOfStream(TowerHttp(eos)),
            },
            Err(error) => {
                let _failure = self.0.clone().classify_error(error);
                Classified::Ready(Verdict::new(Outcome::Failure))
            }
        }
    }
}

/// The end-of-stream half of a tower-http classifier (`TowerHttp` of its
/// `ClassifyEos`).
impl<E> ClassifyEos for TowerHttp<E>
where
    E: TowerHttpEos + Send + 'static,
{
    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Verdict {
        verdict(self.0.classify_eos(trailers))
    }
}
