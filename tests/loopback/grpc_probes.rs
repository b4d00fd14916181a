//! Half-open probes through real tonic servers and clients, and how long
//! the breaker reopens for after each: a server-streaming probe that stalls
//! after its first message and that its caller drops reopens the breaker
//! for the period it just had, round after round, without counting a
//! failure; a probe answered RESOURCE_EXHAUSTED with a gRPC pushback
//! reopens it for the pushback each round, with no backoff stacked on top.
//! The server counts the RPCs it receives, so that a refusal is shown
//! never to reach it. Real sockets, so real time: open periods of a few
//! hundred milliseconds, and the tests assert counts, states and ranges of
//! `retry_after`, not timings.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tower::util::MapErr;
use tower::{BoxError, ServiceBuilder};
use tower_circuit_breaker::classify::GrpcClassifier;
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, State,
};

use crate::grpc_deadlines::{check, pushback_ms};

/// A `Channel` behind the breaker, judged by `GrpcClassifier` (head or
/// trailers), its error boxed as the breaker's refusal needs.
pub(crate) type Guarded =
    CircuitBreaker<MapErr<Channel, fn(tonic::transport::Error) -> BoxError>, GrpcClassifier>;

/// Serves `routes` on a free port of 127.0.0.1, counting every RPC that
/// reaches the server; returns the address and the count.
async fn serve_counted(routes: Routes) -> (SocketAddr, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let count = {
        let received = Arc::clone(&received);
        ServiceBuilder::new()
            .map_request(move |request: http::Request<tonic::body::Body>| {
                received.fetch_add(1, Ordering::SeqCst);
                request
            })
            .into_inner()
    };
    let router = Server::builder().layer(count).add_routes(routes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    (addr, received)
}

fn breaker(cooldown: Duration) -> Breaker {
    let config = Config::builder()
        .name("backend")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(cooldown)
        .build()
        .unwrap();
    Breaker::new(config)
}

/// A lazy channel to `backend` behind `breaker`.
pub(crate) fn guarded(breaker: &Breaker, backend: SocketAddr) -> Guarded {
    let channel = Endpoint::from_shared(format!("http://{backend}"))
        .unwrap()
        .connect_lazy();
    let boxed: fn(tonic::transport::Error) -> BoxError = BoxError::from;
    ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(GrpcClassifier::new()))
        .map_err(boxed)
        .service(channel)
}

/// Waits, on the wall clock, until the open period has ended (the state
/// reads half-open before any call comes to probe); fails after 5 s.
async fn until_half_open(breaker: &Breaker) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while breaker.state() != State::HalfOpen {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "still {:?} after 5 s", breaker.state());
}

/// The rest of the open period, which must be there.
fn retry_after_ms(breaker: &Breaker) -> u128 {
    breaker
        .retry_after()
        .unwrap_or_else(|| panic!("open with a period, not {:?}", breaker.state()))
        .as_millis()
}

#[tokio::test]
async fn a_stalled_stream_probe_dropped_by_its_caller_reopens_for_the_same_period_each_round() {
    // `Watch` sends the current status at once, then nothing until it
    // changes, which it never does here: a stream that stalls.
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (backend, received) = serve_counted(Routes::new(health)).await;
    let breaker = breaker(Duration::from_millis(300));
    let rpc = guarded(&breaker, backend);
    assert!(breaker.open_on_signal("backend hung", None));

    for round in 1..=2 {
        until_half_open(&breaker).await;
        let mut stream = HealthClient::new(rpc.clone())
            .watch(check())
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().expect("the current status");
        assert_eq!(first.status(), ServingStatus::Serving);
        let snap = breaker.snapshot();
        assert_eq!(
            (snap.state, snap.probes_in_flight),
            (State::HalfOpen, 1),
            "the probe is judged at the stream's end, not at its first message"
        );
        assert_eq!(received.load(Ordering::SeqCst), round);

        // The caller gives up on the stalled stream.
        drop(stream);
        let snap = breaker.snapshot();
        assert_eq!(
            snap.state,
            State::Open,
            "round {round}: reopened, not half-open"
        );
        assert_eq!(snap.last_trip, Some(TripReason::ProbeCancelled));
        // The cooldown again, less the moments since the drop: not doubled
        // (600 ms), not zero.
        let rest = retry_after_ms(&breaker);
        assert!((100..=300).contains(&rest), "round {round}: {rest} ms");
        assert_eq!(snap.failed_probe_rounds, 0, "a cancel is no failed round");
        assert_eq!(snap.counts.failures, 0, "a cancel is no failure");
        assert_eq!(snap.counts.cancelled, round as u64);

        // The next call is refused without being sent.
        let refused = HealthClient::new(rpc.clone())
            .check(check())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert!(CircuitOpen::find(&refused).is_some());
        assert_eq!(received.load(Ordering::SeqCst), round, "one RPC a round");
    }
}

#[tokio::test]
async fn a_grpc_pushback_sets_each_open_period_without_backoff_stacked_on_it() {
    let mut metadata = MetadataMap::new();
    metadata.insert("grpc-retry-pushback-ms", "400".parse().unwrap());
    let slow_down = Status::with_metadata(Code::ResourceExhausted, "slow down", metadata);
    // Every call answered before the service sees it: trailers-only
    // RESOURCE_EXHAUSTED with the pushback in the head.
    let health = HealthServer::with_interceptor(
        HealthService::from_health_reporter(HealthReporter::new()),
        move |_request| Err(slow_down.clone()),
    );
    let (backend, received) = serve_counted(Routes::new(health)).await;
    // Without a hint the breaker's own periods would be 100, 200, 400, 800
    // ms (backoff 2.0): the pushback decides them instead.
    let breaker = breaker(Duration::from_millis(100));
    let rpc = guarded(&breaker, backend);

    let status = HealthClient::new(rpc.clone())
        .check(check())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(breaker.state(), State::Open);
    let rest = retry_after_ms(&breaker);
    assert!(
        (300..=400).contains(&rest),
        "the pushback, not the cooldown: {rest} ms"
    );

    // Round 0 is the trip itself; rounds 1 to 3 each send one probe.
    for round in 0..=3 {
        if round > 0 {
            until_half_open(&breaker).await;
            let status = HealthClient::new(rpc.clone())
                .check(check())
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::ResourceExhausted, "the probe was sent");
            let snap = breaker.snapshot();
            assert_eq!(snap.state, State::Open);
            assert_eq!(snap.last_trip, Some(TripReason::ProbeFailed));
            assert_eq!(snap.failed_probe_rounds, round);
            // Backoff stacked on the pushback would make it 800 ms in
            // round 3.
            let rest = retry_after_ms(&breaker);
            assert!((300..=400).contains(&rest), "round {round}: {rest} ms");
        }
        assert_eq!(received.load(Ordering::SeqCst), 1 + round as usize);

        // Refused, not sent: UNAVAILABLE with a pushback of its own.
        let refused = HealthClient::new(rpc.clone())
            .check(check())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        let pushback = pushback_ms(&refused);
        // Under a second left: sent as the one-second floor (`From<CircuitOpen>
        // for Status`), not the 400 ms the upstream asked for.
        assert_eq!(pushback, 1000);
        assert_eq!(received.load(Ordering::SeqCst), 1 + round as usize);
    }
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.failures, counts.rejected, counts.probes), (4, 4, 3));
}
