//! Streamed bodies passed on by axum and tonic: an axum handler returning
//! the breaker's body, and a tonic server forwarding gRPC calls through a
//! breaker around its `Channel` to an upstream. Both hand the body to
//! hyper's server, which stops reading it at the end it reports; the call
//! counts as that end says. Real sockets, so real time, except the open
//! period, skipped on tokio's clock.
#![cfg(feature = "http-body")]

use crate::common::gateway;
use crate::common::grpc;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::IntoResponse;
use axum::Router;
use http::StatusCode;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{GrpcClassifier, StreamingHttp};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, State};

use gateway::{breaker, half_open, layer, upstream, Http, EVENTS, PLAIN};
use grpc::health_server;

/// An axum gateway on a free port of 127.0.0.1: every path is asked of
/// `upstream` through `layer`'s breaker, and the handler returns the
/// upstream's answer with the breaker's body.
async fn axum_gateway(
    upstream: SocketAddr,
    upstream_http: Http,
    layer: CircuitBreakerLayer<StreamingHttp>,
) -> SocketAddr {
    let client = gateway::guarded(upstream_http, &layer);
    let app = Router::new().fallback(move |req: http::Request<axum::body::Body>| {
        let client = client.clone();
        async move {
            let request = gateway::upstream_request(upstream, req.uri().path());
            match client.oneshot(request).await {
                Ok(response) => response.map(axum::body::Body::new),
                Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            }
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn an_axum_handler_returning_the_breaker_body_closes_a_half_open_breaker() {
    let breaker = breaker();
    let upstream = upstream(Http::One).await;
    let gateway = axum_gateway(upstream, Http::One, layer(&breaker, StreamingHttp::new())).await;
    half_open(&breaker).await;

    let (status, body) = gateway::get(Http::One, gateway, "/plain/ok").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, PLAIN));
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight, snap.counts.ignored),
        (State::Closed, 0, 0)
    );
}

#[tokio::test]
async fn an_event_stream_through_an_axum_handler_resets_a_failure_streak() {
    let breaker = breaker();
    let upstream = upstream(Http::Two).await;
    let gateway = axum_gateway(upstream, Http::Two, layer(&breaker, StreamingHttp::new())).await;
    for (path, status) in [
        ("/plain/fail", StatusCode::BAD_GATEWAY),
        ("/sse/ok", StatusCode::OK),
        ("/plain/fail", StatusCode::BAD_GATEWAY),
    ] {
        let (answer, body) = gateway::get(Http::One, gateway, path).await;
        assert_eq!(answer, status, "{path}");
        if status == StatusCode::OK {
            assert_eq!(body, EVENTS.concat());
        }
    }
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.counts.failures, snap.counts.ignored),
        (State::Closed, 2, 0),
        "the event stream between the failures was a success"
    );
}

/// A tonic server's service forwarding every `grpc.health.v1.Health` call
/// to an upstream through a breaker around the upstream's `Channel`, and
/// answering with the breaker's body.
#[derive(Clone)]
struct Forward {
    breaker: Breaker,
    classifier: GrpcClassifier,
    channel: Channel,
}

impl NamedService for Forward {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<tonic::body::Body>> for Forward {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let upstream = ServiceBuilder::new()
            .layer(layer(&self.breaker, self.classifier))
            .map_err(BoxError::from)
            .service(self.channel.clone());
        Box::pin(async move {
            Ok(match upstream.oneshot(request).await {
                Ok(response) => response.map(tonic::body::Body::new),
                Err(err) if CircuitOpen::find(err.as_ref()).is_some() => {
                    Status::unavailable("circuit open").into_http()
                }
                Err(err) => Status::unavailable(err.to_string()).into_http(),
            })
        })
    }
}

/// A tonic gateway on a free port of 127.0.0.1 forwarding to `upstream`
/// over HTTP/2, judged by `classifier`.
async fn tonic_gateway(
    upstream: SocketAddr,
    breaker: &Breaker,
    classifier: GrpcClassifier,
) -> SocketAddr {
    let channel = Endpoint::from_shared(format!("http://{upstream}"))
        .unwrap()
        .connect_lazy();
    let forward = Forward {
        breaker: breaker.clone(),
        classifier,
        channel,
    };
    grpc::serve(Server::builder().add_service(forward)).await
}

/// Calls `Check` through the gateway at `addr` with a generated client.
async fn check(addr: SocketAddr) -> Result<ServingStatus, Status> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let answer = HealthClient::new(channel).check(request).await?;
    Ok(answer.into_inner().status())
}

/// A gRPC answer ends with its status in the trailers, which the gateway's
/// server reads before it stops: judged by the status.
#[tokio::test]
async fn a_grpc_call_through_a_tonic_gateway_closes_a_half_open_breaker() {
    let breaker = breaker();
    let upstream = health_server().await;
    let gateway = tonic_gateway(upstream, &breaker, GrpcClassifier::new()).await;
    half_open(&breaker).await;

    assert_eq!(check(gateway).await.unwrap(), ServingStatus::Serving);
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight, snap.counts.ignored),
        (State::Closed, 0, 0)
    );
}

/// An upstream whose gRPC answer ends without any status (its last data
/// frame ends the stream, with no trailers): the end of its stream is
/// judged, here as a failure, rather than the call passing as ignored.
#[tokio::test]
async fn a_grpc_stream_ending_without_a_status_through_a_tonic_gateway_fails_its_probe() {
    let breaker = breaker();
    let upstream = gateway::serve(Http::Two, |_: http::Request<hyper::body::Incoming>| async {
        Ok::<_, Infallible>(gateway::answer("/grpc/no-status"))
    })
    .await;
    let strict = GrpcClassifier::new().internal_is_failure(true);
    let gateway = tonic_gateway(upstream, &breaker, strict).await;
    half_open(&breaker).await;

    check(gateway)
        .await
        .expect_err("a gRPC answer without a status is an error");
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight, snap.counts.failures),
        (State::Open, 0, 1),
        "the failed probe opened the breaker again"
    );
}
