//! tonic's own deadlines through real tonic servers and clients: a backend
//! that hangs past every deadline answers, or is answered for, CANCELLED
//! "Timeout expired", which the breaker counts as the DEADLINE_EXCEEDED
//! failure it is, while a call its caller dropped stays a cancellation.
//! A refusal reaches a generated client as UNAVAILABLE with its pushback
//! even through a `BoxError` stack (`tower::timeout` inside the breaker).
//! Real sockets, so real time: deadlines of 100 ms, and the tests assert
//! counts and states, not timings.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{GrpcClassifier, TonicClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, State};

const DEADLINE: Duration = Duration::from_millis(100);

fn breaker() -> Breaker {
    let config = Config::builder()
        .name("backend")
        .trip(ConsecutiveFailures::new(1))
        .build()
        .unwrap();
    Breaker::new(config)
}

/// A health server that holds every call an hour, with `timeout` of its
/// own when given (tonic's `Server::timeout`).
async fn hanging_backend(timeout: Option<Duration>) -> SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let hang = ServiceBuilder::new()
        .map_future(|answer| async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            answer.await
        })
        .into_inner();
    let mut server = Server::builder();
    if let Some(timeout) = timeout {
        server = server.timeout(timeout);
    }
    let router = server.layer(hang).add_service(health);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

/// A status's `grpc-retry-pushback-ms`, which it must carry.
pub(crate) fn pushback_ms(status: &Status) -> u64 {
    let value = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("a pushback");
    value.to_str().unwrap().parse().unwrap()
}

pub(crate) fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// A generated client's `Check` behind the breaker, judged by its
/// `Status`, each call with a deadline of `DEADLINE`.
fn unary(
    breaker: &Breaker,
    classifier: TonicClassifier,
    backend: SocketAddr,
) -> impl tower::Service<(), Response = (), Error = Status> + Clone {
    let channel = Endpoint::from_shared(format!("http://{backend}"))
        .unwrap()
        .connect_lazy();
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(classifier)
        .layer(service_fn(move |()| {
            let mut client = HealthClient::new(channel.clone());
            async move {
                let mut request = Request::new(check());
                request.set_timeout(DEADLINE);
                client.check(request).await.map(|_| ())
            }
        }))
}

#[tokio::test]
async fn a_tonic_deadline_that_expires_is_a_failure() {
    let backend = hanging_backend(None).await;
    let breaker = breaker();
    let rpc = unary(&breaker, TonicClassifier::new(), backend);
    let status = rpc.clone().oneshot(()).await.unwrap_err();
    assert_eq!(status.code(), Code::Cancelled);
    assert_eq!(status.message(), "Timeout expired");
    assert_eq!(breaker.state(), State::Open, "the backend hung past it");
    let refused = rpc.oneshot(()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
}

#[tokio::test]
async fn an_expired_deadline_is_ignored_when_so_told_and_a_callers_cancel_always_is() {
    let backend = hanging_backend(None).await;
    let breaker = breaker();
    let lenient = unary(
        &breaker,
        TonicClassifier::new().ignore_expired_deadlines(),
        backend,
    );
    let status = lenient.oneshot(()).await.unwrap_err();
    assert_eq!(status.code(), Code::Cancelled);
    assert_eq!(breaker.state(), State::Closed);

    // The caller gives up before the deadline: dropped, not judged.
    let rpc = unary(&breaker, TonicClassifier::new(), backend);
    let gave_up = tokio::time::timeout(DEADLINE / 4, rpc.oneshot(())).await;
    assert!(gave_up.is_err());
    assert_eq!(breaker.state(), State::Closed);
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.failures, counts.cancelled), (0, 1));
}

#[tokio::test]
async fn a_servers_deadline_answered_as_cancelled_is_a_failure_around_a_channel() {
    let backend = hanging_backend(Some(DEADLINE)).await;
    let breaker = breaker();
    let guarded = crate::grpc_probes::guarded(&breaker, backend);
    // No deadline of the client's own: the server's answers.
    let status = HealthClient::new(guarded.clone())
        .check(check())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Cancelled);
    assert_eq!(breaker.state(), State::Open);
    let refused = HealthClient::new(guarded).check(check()).await.unwrap_err();
    assert_ne!(refused.code(), Code::Cancelled, "refused, not sent");
    assert_eq!(breaker.snapshot().counts.failures, 1);
}

/// The guide's order, `tower::timeout` directly inside the breaker: the
/// stack's error is `BoxError`, and a generated client still answers a
/// refusal with UNAVAILABLE and its pushback, not UNKNOWN.
#[tokio::test]
async fn a_refusal_through_a_boxed_error_reaches_a_generated_client_as_unavailable() {
    let backend = hanging_backend(None).await;
    let breaker = breaker();
    let channel = Endpoint::from_shared(format!("http://{backend}"))
        .unwrap()
        .connect_lazy();
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(GrpcClassifier::new()))
        .timeout(DEADLINE)
        .service(channel);
    breaker.force_open(Some(Duration::from_millis(2_500)));
    let refused = HealthClient::new(guarded).check(check()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let pushback = pushback_ms(&refused);
    // What is left of the 2.5 s, read on the wall clock a moment later.
    assert!((1000..=2500).contains(&pushback), "{pushback}");
    assert!(tower_circuit_breaker::CircuitOpen::find(&refused).is_some());
    // The chain of sources ends: refusal, its status, and no further.
    let mut depth = 0;
    let mut source: Option<&dyn std::error::Error> = Some(&refused);
    while let Some(err) = source {
        depth += 1;
        assert!(depth < 8, "an endless chain of sources");
        source = err.source();
    }
}
