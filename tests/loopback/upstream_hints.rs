//! Classifiers told not to trust the upstream's retry-after hints
//! (`Retry-After`, `grpc-retry-pushback-ms`), through real hyper and tonic
//! clients and servers: the breaker's own open period alone decides, and a
//! hint cannot trip it. Real sockets, so real time; the tests assert
//! states and announced waits, not timings.
#![cfg(feature = "http-body")]

use crate::common::gateway;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::{Bytes, Incoming};
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{Classify, GrpcClassifier, HttpClassifier, StreamingHttp};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, State};

use gateway::Http;

const COOLDOWN: Duration = Duration::from_secs(10);

/// What the upstreams announce: two minutes.
const ANNOUNCED: Duration = Duration::from_secs(120);

/// A breaker that opens after `failures` failures in a row, for 10 s, or
/// at once on a failure with a hint when `trip_on_pushback`.
fn breaker(failures: u32, trip_on_pushback: bool) -> Breaker {
    let config = Config::builder()
        .name("upstream")
        .trip(ConsecutiveFailures::new(failures))
        .cooldown(COOLDOWN)
        .max_open(Duration::from_secs(3600))
        .trip_on_pushback(trip_on_pushback)
        .build()
        .unwrap();
    Breaker::new(config)
}

/// An HTTP/1 upstream answering every request `status` with
/// `Retry-After: 120`.
async fn announcing(status: StatusCode) -> SocketAddr {
    gateway::serve(Http::One, move |_: Request<Incoming>| async move {
        let mut response = Response::new(Full::new(Bytes::from_static(b"busy")));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("120"));
        Ok::<_, Infallible>(response)
    })
    .await
}

/// One GET of `upstream` through a hyper client behind `breaker`, judged
/// by `classifier`; returns the status.
async fn call_through<C>(breaker: &Breaker, classifier: C, upstream: SocketAddr) -> StatusCode
where
    C: Classify<Response<Incoming>, BoxError, Eos = Infallible> + Clone,
{
    let client = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(classifier))
        .map_err(BoxError::from)
        .service(gateway::client(Http::One));
    let request = gateway::upstream_request(upstream, "/");
    client.oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn a_429s_retry_after_holds_the_breaker_open_unless_ignored() {
    let upstream = announcing(StatusCode::TOO_MANY_REQUESTS).await;
    for (classifier, longest) in [
        (HttpClassifier::new(), ANNOUNCED),
        (HttpClassifier::new().ignore_retry_after(), COOLDOWN),
    ] {
        let breaker = breaker(1, false);
        let status = call_through(&breaker, classifier, upstream).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(breaker.state(), State::Open, "{classifier:?}");
        let wait = breaker.retry_after().expect("open");
        assert!(
            wait <= longest && wait > longest - Duration::from_secs(5),
            "{classifier:?}: open for {wait:?}, not about {longest:?}"
        );
    }
}

#[tokio::test]
async fn an_ignored_retry_after_cannot_trip_the_breaker_on_its_own() {
    let upstream = announcing(StatusCode::SERVICE_UNAVAILABLE).await;
    let trusting = breaker(3, true);
    call_through(&trusting, HttpClassifier::new(), upstream).await;
    assert_eq!(trusting.state(), State::Open, "a pushback trips at once");

    let ignoring = breaker(3, true);
    call_through(
        &ignoring,
        HttpClassifier::new().ignore_retry_after(),
        upstream,
    )
    .await;
    let snap = ignoring.snapshot();
    assert_eq!(
        (snap.state, snap.counts.failures),
        (State::Closed, 1),
        "one failure of three, and no hint"
    );
}

#[tokio::test]
async fn a_streaming_breaker_can_ignore_retry_after_too() {
    let upstream = announcing(StatusCode::SERVICE_UNAVAILABLE).await;
    for (classifier, longest) in [
        (StreamingHttp::new(), ANNOUNCED),
        (StreamingHttp::new().ignore_retry_after(), COOLDOWN),
    ] {
        let breaker = breaker(1, false);
        let client = gateway::guarded(Http::One, &gateway::layer(&breaker, classifier));
        let request: Request<Empty<Bytes>> = gateway::upstream_request(upstream, "/");
        let response = client.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let wait = breaker.retry_after().expect("open");
        assert!(
            wait <= longest && wait > longest - Duration::from_secs(5),
            "{classifier:?}: open for {wait:?}, not about {longest:?}"
        );
    }
}

/// A gRPC upstream answering every call UNAVAILABLE, trailers-only, with a
/// pushback of two minutes.
async fn pushing_back() -> SocketAddr {
    gateway::serve(Http::Two, |_: Request<Incoming>| async {
        let mut response = Response::new(Empty::<Bytes>::new());
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static("14"));
        headers.insert("grpc-message", HeaderValue::from_static("draining"));
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("120000"));
        Ok::<_, Infallible>(response)
    })
    .await
}

#[tokio::test]
async fn a_grpc_pushback_holds_the_breaker_open_unless_ignored() {
    let upstream = pushing_back().await;
    for (classifier, longest) in [
        (GrpcClassifier::new(), ANNOUNCED),
        (GrpcClassifier::new().ignore_pushback(), COOLDOWN),
    ] {
        let breaker = breaker(1, false);
        let channel = Endpoint::from_shared(format!("http://{upstream}"))
            .unwrap()
            .connect_lazy();
        let guarded = ServiceBuilder::new()
            .layer(gateway::layer(&breaker, classifier))
            .map_err(BoxError::from)
            .service(channel);
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let status = HealthClient::new(guarded)
            .check(request)
            .await
            .expect_err("UNAVAILABLE");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(breaker.state(), State::Open, "{classifier:?}");
        let wait = breaker.retry_after().expect("open");
        assert!(
            wait <= longest && wait > longest - Duration::from_secs(5),
            "{classifier:?}: open for {wait:?}, not about {longest:?}"
        );
    }
}
