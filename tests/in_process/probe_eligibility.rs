//! Probe eligibility: a predicate on the request says which requests may be
//! a half-open probe. A request it refuses, while a probe is due, is
//! refused with `CircuitOpen` and takes no permit; closed, it is not asked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use tokio::time::advance;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::eligible::{self, SafeProbe};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, Failover, Readiness, State,
};

use crate::common::Upstream;

const COOLDOWN: Duration = Duration::from_secs(10);

fn config(name: &str) -> Config {
    Config::builder()
        .name(name)
        .trip(ConsecutiveFailures::new(1))
        .cooldown(COOLDOWN)
        .build()
        .unwrap()
}

fn request(method: Method) -> Request<()> {
    Request::builder()
        .method(method)
        .uri("/v1/items")
        .body(())
        .unwrap()
}

fn marked(method: Method) -> Request<()> {
    let mut req = request(method);
    req.extensions_mut().insert(SafeProbe);
    req
}

/// Opens the breaker behind `svc` with one failed call, and lets its open
/// period pass: the next call admitted is a probe.
async fn trip_and_wait<S>(svc: &S, upstream: &Upstream<Request<()>>, breaker: &Breaker)
where
    S: Service<Request<()>, Response = Method, Error = BoxError> + Clone,
{
    upstream.fail();
    assert!(svc.clone().oneshot(request(Method::GET)).await.is_err());
    upstream.recover();
    assert_eq!(breaker.state(), State::Open);
    advance(COOLDOWN).await;
    assert_eq!(breaker.state(), State::HalfOpen);
}

/// The refusal in `result`, which must be one.
fn refusal(result: Result<Method, BoxError>) -> CircuitOpen {
    let err = result.expect_err("refused");
    CircuitOpen::find(err.as_ref())
        .expect("a CircuitOpen")
        .clone()
}

#[tokio::test(start_paused = true)]
async fn without_a_predicate_any_request_probes() {
    let layer = CircuitBreakerLayer::new(config("default"));
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    trip_and_wait(&svc, &upstream, &breaker).await;

    let calls = upstream.calls();
    let answer = svc.clone().oneshot(request(Method::POST)).await.unwrap();
    assert_eq!(answer, Method::POST);
    assert_eq!(upstream.calls(), calls + 1, "the POST was the probe");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn with_idempotent_methods_a_post_is_refused_and_leaves_the_probe_to_a_get() {
    let layer =
        CircuitBreakerLayer::new(config("idempotent")).probe_when(eligible::idempotent_methods);
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    trip_and_wait(&svc, &upstream, &breaker).await;

    let calls = upstream.calls();
    for _ in 0..3 {
        let open = refusal(svc.clone().oneshot(request(Method::POST)).await);
        assert_eq!(open.state(), State::HalfOpen);
        // What every refused caller is told while half-open with no probe
        // in flight: the open period that just ended.
        assert_eq!(open.retry_after(), COOLDOWN);
    }
    assert_eq!(upstream.calls(), calls, "no POST was sent");
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::HalfOpen);
    assert_eq!(snapshot.probes_in_flight, 0, "no permit taken");
    assert_eq!(snapshot.counts.probes, 0);

    let answer = svc.clone().oneshot(request(Method::GET)).await.unwrap();
    assert_eq!(answer, Method::GET);
    assert_eq!(upstream.calls(), calls + 1, "the GET was the probe");
    assert_eq!(breaker.snapshot().counts.probes, 1);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_post_refused_while_a_get_probes_is_told_what_a_refused_get_is_told() {
    let layer =
        CircuitBreakerLayer::new(config("in-flight")).probe_when(eligible::idempotent_methods);
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    trip_and_wait(&svc, &upstream, &breaker).await;

    // A probe in flight: its future is made and not yet polled.
    let mut prober = svc.clone();
    let probe = prober.ready().await.unwrap().call(request(Method::GET));
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    let post = refusal(svc.clone().oneshot(request(Method::POST)).await);
    let get = refusal(svc.clone().oneshot(request(Method::GET)).await);
    assert_eq!(post.state(), State::HalfOpen);
    assert_eq!(post.retry_after(), get.retry_after());
    // The open period that just ended, sooner than the probe's deadline.
    assert_eq!(post.retry_after(), COOLDOWN);

    assert_eq!(probe.await.unwrap(), Method::GET);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_request_marked_safe_probe_may_probe() {
    let layer = CircuitBreakerLayer::new(config("marked")).probe_when(eligible::marked);
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    trip_and_wait(&svc, &upstream, &breaker).await;

    let calls = upstream.calls();
    let open = refusal(svc.clone().oneshot(request(Method::GET)).await);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(upstream.calls(), calls, "an unmarked GET may not probe");

    let answer = svc.clone().oneshot(marked(Method::POST)).await.unwrap();
    assert_eq!(answer, Method::POST);
    assert_eq!(upstream.calls(), calls + 1, "the marked POST was the probe");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn closed_state_ignores_the_predicate() {
    let asked = Arc::new(AtomicUsize::new(0));
    let layer = CircuitBreakerLayer::new(config("closed")).probe_when({
        let asked = Arc::clone(&asked);
        move |_: &Request<()>| {
            asked.fetch_add(1, Ordering::SeqCst);
            false
        }
    });
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());

    for method in [Method::POST, Method::PATCH, Method::GET] {
        assert_eq!(
            svc.clone().oneshot(request(method.clone())).await.unwrap(),
            method
        );
    }
    assert_eq!(upstream.calls(), 3, "every request passed");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "the predicate was not asked"
    );
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn keyed_layer_honours_the_predicate() {
    let registry = Registry::<String>::new(config("keyed"));
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new()
        .layer(
            KeyedLayer::new(registry.clone(), |req: &Request<()>| {
                req.uri().path().to_string()
            })
            .probe_when(eligible::idempotent_methods),
        )
        .service(upstream.clone());
    let breaker = registry.get(&"/v1/items".to_string()).unwrap();
    trip_and_wait(&svc, &upstream, &breaker).await;

    let calls = upstream.calls();
    let open = refusal(svc.clone().oneshot(request(Method::POST)).await);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(open.breaker(), "/v1/items");
    assert_eq!(open.retry_after(), COOLDOWN);
    assert_eq!(upstream.calls(), calls, "the POST was not sent");
    assert_eq!(breaker.snapshot().probes_in_flight, 0, "no permit taken");

    assert_eq!(
        svc.clone().oneshot(request(Method::DELETE)).await.unwrap(),
        Method::DELETE
    );
    assert_eq!(upstream.calls(), calls + 1, "the DELETE was the probe");
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn failover_moves_past_a_half_open_candidate_a_request_may_not_probe() {
    let primary = Breaker::new(config("primary"));
    let secondary = Breaker::new(config("secondary"));
    let (first, second) = (Upstream::default(), Upstream::default());
    let candidate = |upstream: &Upstream<Request<()>>, breaker: &Breaker| {
        CircuitBreaker::new(upstream.clone(), breaker).probe_when(eligible::idempotent_methods)
    };
    let chain = Failover::new([candidate(&first, &primary), candidate(&second, &secondary)]);
    let lone = ServiceBuilder::new()
        .layer(primary.layer())
        .service(first.clone());
    trip_and_wait(&lone, &first, &primary).await;

    let calls = first.calls();
    let answer = chain.clone().oneshot(request(Method::POST)).await.unwrap();
    assert_eq!(answer, Method::POST);
    assert_eq!(second.calls(), 1, "the secondary took the POST");
    assert_eq!(first.calls(), calls, "the primary was not called");
    assert_eq!(primary.snapshot().probes_in_flight, 0, "no permit taken");

    assert_eq!(
        chain.oneshot(request(Method::GET)).await.unwrap(),
        Method::GET
    );
    assert_eq!(first.calls(), calls + 1, "the GET probed the primary");
    assert_eq!(primary.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn gate_mode_is_ready_while_a_probe_is_due_and_refuses_a_post_without_its_permit() {
    let layer = CircuitBreakerLayer::new(config("gated"))
        .readiness(Readiness::Gate)
        .probe_when(eligible::idempotent_methods);
    let breaker = layer.breaker();
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new().layer(layer).service(upstream.clone());
    trip_and_wait(&svc, &upstream, &breaker).await;

    let calls = upstream.calls();
    let open = refusal(svc.clone().oneshot(request(Method::POST)).await);
    assert_eq!(open.state(), State::HalfOpen);
    assert_eq!(upstream.calls(), calls, "the POST was not sent");
    assert_eq!(breaker.snapshot().probes_in_flight, 0, "no permit taken");

    assert_eq!(
        svc.oneshot(request(Method::HEAD)).await.unwrap(),
        Method::HEAD
    );
    assert_eq!(breaker.state(), State::Closed);
}
