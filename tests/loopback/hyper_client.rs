//! The hyper client example over loopback: the breaker opens on the
//! upstream's failures (a 503 and two timeouts), refuses without sending
//! (the upstream's request count stops), and a probe closes it once the
//! upstream has recovered. The wiring and the scenario are the example's
//! own (`examples/hyper_client/app.rs`). Real sockets, so real time: the
//! durations are a few hundred milliseconds and the test asserts counts
//! and states, not timings.

#[path = "../../examples/hyper_client/app.rs"]
mod app;
use crate::common::demo;

use http::StatusCode;
use tower_circuit_breaker::State;

use app::{Answer, Mode};

#[tokio::test]
async fn opens_on_failures_refuses_without_sending_and_closes_after_recovery() {
    let upstream = app::Upstream::start().await.unwrap();
    let breaker = app::breaker().unwrap();
    let mut transitions = breaker.subscribe();

    let steps = app::run(&upstream, &breaker, |_| {}).await;
    let seen: Vec<_> = steps
        .iter()
        .map(|s| (s.mode, s.answer.clone(), s.state, s.received))
        .collect();
    let ok = Answer::Status(StatusCode::OK);
    let unavailable = Answer::Status(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        seen[..5],
        [
            (Mode::Healthy, ok.clone(), State::Closed, 1),
            (Mode::Healthy, ok.clone(), State::Closed, 2),
            (Mode::Failing, unavailable, State::Closed, 3),
            (Mode::Hanging, Answer::TimedOut, State::Closed, 4),
            (Mode::Hanging, Answer::TimedOut, State::Open, 5),
        ]
    );
    for (mode, answer, state, received) in &seen[5..8] {
        assert_eq!(*mode, Mode::Hanging);
        assert!(matches!(answer, Answer::Refused(_)), "{answer:?}");
        assert_eq!(*state, State::Open);
        assert_eq!(*received, 5, "a refused request never reaches the upstream");
    }
    assert_eq!(
        seen[8..],
        [
            (Mode::Healthy, ok.clone(), State::Closed, 6),
            (Mode::Healthy, ok, State::Closed, 7),
        ],
        "the probe reached the recovered upstream and closed the breaker"
    );

    let counts = breaker.snapshot().counts;
    assert_eq!(
        (
            counts.calls,
            counts.rejected,
            counts.failures,
            counts.opened
        ),
        (7, 3, 3, 1)
    );
    let mut path = Vec::new();
    while let Ok(t) = transitions.try_recv() {
        path.push((t.from, t.to));
    }
    assert_eq!(
        path,
        [
            (State::Closed, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed),
        ]
    );
}

#[tokio::test]
async fn a_refused_answer_carries_the_rest_of_the_cooldown() {
    let upstream = app::Upstream::start().await.unwrap();
    let breaker = app::breaker().unwrap();
    let client = app::client(&breaker);
    upstream.set(Mode::Failing);
    for _ in 0..app::THRESHOLD {
        assert_eq!(
            app::get(&client, &upstream).await,
            Answer::Status(StatusCode::SERVICE_UNAVAILABLE)
        );
    }
    match app::get(&client, &upstream).await {
        Answer::Refused(retry_after) => assert!(retry_after <= app::COOLDOWN),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(upstream.received(), app::THRESHOLD as usize);
}
