//! A breaker judging a tonic `Channel` by HTTP status sees every gRPC
//! answer as a 200: it never opens. It says so, once, as a warning naming
//! the fix; with the gRPC classifier it says nothing.
#![cfg(feature = "tonic")]

use crate::common::captured;
use crate::common::grpc;

use tonic::transport::Endpoint;
use tonic::Status;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::ServiceBuilder;
use tower_circuit_breaker::classify::{GrpcClassifier, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, Config, State};

use captured::Captured;
use grpc::health_server;

/// How many warnings `captured` holds of a gRPC answer judged by HTTP
/// status.
fn warnings_about_grpc(captured: &Captured) -> usize {
    captured
        .text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("sees a gRPC response"))
        .count()
}

fn breaker() -> Breaker {
    Breaker::new(
        Config::builder()
            .name("health")
            .trip(ConsecutiveFailures::new(2))
            .build()
            .unwrap(),
    )
}

fn to_status(err: tonic::transport::Error) -> Status {
    Status::from_error(Box::new(err))
}

fn unknown_service() -> HealthCheckRequest {
    HealthCheckRequest {
        service: "no-such-service".to_string(),
    }
}

#[tokio::test]
async fn judging_grpc_by_http_status_warns_once_and_the_grpc_classifier_does_not() {
    let (captured, _guard) = Captured::start("warn");
    let addr = health_server().await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();

    // The right wiring: judged by `grpc-status`, two NOT_FOUNDs say nothing
    // of the server's health, and nothing is said.
    let breaker_ok = breaker();
    let guarded = ServiceBuilder::new()
        .layer(breaker_ok.layer().classify(GrpcClassifier::new()))
        .map_err(to_status as fn(_) -> Status)
        .service(channel.clone());
    let mut client = HealthClient::new(guarded);
    for _ in 0..2 {
        assert!(client.check(unknown_service()).await.is_err());
    }
    assert_eq!(warnings_about_grpc(&captured), 0);

    // Judged by HTTP status: every gRPC answer is a 200. Said once.
    let breaker_blind = breaker();
    let blind = ServiceBuilder::new()
        .layer(breaker_blind.layer().classify(HttpClassifier::new()))
        .map_err(to_status as fn(_) -> Status)
        .service(channel);
    let mut client = HealthClient::new(blind);
    for _ in 0..3 {
        assert!(client.check(unknown_service()).await.is_err());
    }
    assert_eq!(breaker_blind.snapshot().counts.failures, 0, "blind to gRPC");
    assert_eq!(breaker_blind.state(), State::Closed);
    assert_eq!(warnings_about_grpc(&captured), 1, "said once, not per call");
}
