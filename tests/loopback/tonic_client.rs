//! The tonic client example over loopback: a channel behind the breaker,
//! a `tonic-health` server switched by its `HealthReporter`. Switching the
//! server to NOT_SERVING (answered as UNAVAILABLE) opens the breaker, which
//! then refuses without sending; switching it back lets a probe close it.
//! The wiring and the scenario are the example's own
//! (`examples/tonic_client/app.rs`). Real sockets, so real time: a few
//! hundred milliseconds, and the test asserts counts and states, not
//! timings.
#![cfg(feature = "tonic")]

#[path = "../../examples/tonic_client/app.rs"]
mod app;
use crate::common::demo;

use tonic::transport::Endpoint;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::{service_fn, Layer, ServiceExt};
use tower_circuit_breaker::classify::TonicClassifier;
use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, State};

use app::Answer;

#[tokio::test]
async fn not_serving_opens_the_breaker_and_a_probe_closes_it_once_serving() {
    let upstream = app::Upstream::start().await.unwrap();
    let breaker = app::breaker().unwrap();
    let steps = app::run(&upstream, &breaker, |_| {}).await.unwrap();
    let seen: Vec<_> = steps
        .iter()
        .map(|s| (s.serving, s.answer.clone(), s.state, s.received))
        .collect();

    let serving = Answer::Serving(ServingStatus::Serving);
    let unavailable = Answer::Status(Code::Unavailable, "not serving".to_owned());
    assert_eq!(
        seen[..4],
        [
            (true, serving.clone(), State::Closed, 1),
            (true, serving.clone(), State::Closed, 2),
            (false, unavailable.clone(), State::Closed, 3),
            (false, unavailable, State::Open, 4),
        ]
    );
    for (serving, answer, state, received) in &seen[4..6] {
        assert!(!serving);
        match answer {
            Answer::Refused(Some(pushback)) => {
                let ms: u64 = pushback.parse().unwrap();
                // Under a second of the open period is left: the pushback
                // is the one-second floor, as `Retry-After` would be.
                assert!(app::COOLDOWN < std::time::Duration::from_secs(1));
                assert_eq!(ms, 1000);
            }
            other => panic!("expected a refusal with a pushback, got {other:?}"),
        }
        assert_eq!(*state, State::Open);
        assert_eq!(*received, 4, "a refused call never reaches the server");
    }
    assert_eq!(
        seen[6..],
        [
            (true, serving.clone(), State::Closed, 5),
            (true, serving, State::Closed, 6),
        ],
        "the probe reached the server, serving again, and closed the breaker"
    );
    let counts = breaker.snapshot().counts;
    assert_eq!(
        (
            counts.calls,
            counts.rejected,
            counts.failures,
            counts.probes
        ),
        (6, 2, 2, 1)
    );
}

/// The other placement: a breaker around one generated client method, whose
/// error is `tonic::Status`, judged by `TonicClassifier`.
#[tokio::test]
async fn a_breaker_around_a_generated_method_classifies_its_statuses() {
    let upstream = app::Upstream::start().await.unwrap();
    let breaker = app::breaker().unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", upstream.addr))
        .unwrap()
        .connect_lazy();
    let client = HealthClient::new(channel);
    let check = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(TonicClassifier::new())
        .layer(service_fn(move |service: String| {
            let mut client = client.clone();
            async move { client.check(HealthCheckRequest { service }).await }
        }));

    // NOT_FOUND (no such service) is the request's fault: ignored.
    let err = check
        .clone()
        .oneshot("no.such.Service".into())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(breaker.snapshot().counts.ignored, 1);

    upstream.set_serving(false).await;
    for _ in 0..app::THRESHOLD {
        let err = check.clone().oneshot(String::new()).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
    }
    assert_eq!(breaker.state(), State::Open);
    let refused = check.clone().oneshot(String::new()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(CircuitOpen::find(&refused).is_some());
    assert_eq!(upstream.received(), 1 + app::THRESHOLD as usize);

    upstream.set_serving(true).await;
    demo::wait_out_cooldown(&breaker).await;
    let answer = check.oneshot(String::new()).await.unwrap();
    assert_eq!(answer.into_inner().status(), ServingStatus::Serving);
    assert_eq!(breaker.state(), State::Closed);
}
