//! tower-http's classifiers judging for a breaker judging at the end of the body.
#![cfg(feature = "tower-http")]

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_circuit_breaker::classify::TowerHttp;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, Config, State};
use tower_http::classify::{GrpcCode, GrpcErrorsAsFailures, ServerErrorsAsFailures};

fn breaker() -> Breaker {
    Breaker::new(
        Config::builder()
            .trip(ConsecutiveFailures::new(1))
            .cooldown(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn server_errors_as_failures_opens_on_a_5xx_and_not_on_a_4xx() {
    for (status, expected) in [
        (404, State::Closed),
        (200, State::Closed),
        (502, State::Open),
    ] {
        let breaker = breaker();
        let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
            .classify(TowerHttp(ServerErrorsAsFailures::new()))
            .layer(service_fn(move |_: Request<()>| async move {
                let mut response = Response::new(Empty::<&'static [u8]>::new());
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, BoxError>(response)
            }));
        let response = svc.oneshot(Request::new(())).await.unwrap();
        response.into_body().collect().await.unwrap();
        assert_eq!(breaker.state(), expected, "status {status}");
    }
}

#[tokio::test(start_paused = true)]
async fn grpc_errors_as_failures_judges_the_trailers_at_the_end_of_the_stream() {
    for (code, expected) in [(0u16, State::Closed), (14, State::Open)] {
        let breaker = breaker();
        let classifier = GrpcErrorsAsFailures::new().with_success(GrpcCode::InvalidArgument);
        let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
            .classify(TowerHttp(classifier))
            .layer(service_fn(move |_: Request<()>| async move {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from(code));
                let frames = vec![
                    Ok::<_, BoxError>(http_body::Frame::data(&b"\0\0\0\0\0"[..])),
                    Ok(http_body::Frame::trailers(trailers)),
                ];
                let body = StreamBody::new(tokio_stream::iter(frames));
                Ok::<_, BoxError>(Response::new(body))
            }));
        let response = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(
            breaker.state(),
            State::Closed,
            "code {code}: judged at the end"
        );
        response.into_body().collect().await.unwrap();
        assert_eq!(breaker.state(), expected, "code {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_in_place_of_a_response_is_a_failure() {
    let breaker = breaker();
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(TowerHttp(ServerErrorsAsFailures::new()))
        .layer(service_fn(|_: Request<()>| async {
            Err::<Response<Full<&'static [u8]>>, BoxError>("refused".into())
        }));
    assert!(svc.oneshot(Request::new(())).await.is_err());
    assert_eq!(breaker.state(), State::Open);
}
