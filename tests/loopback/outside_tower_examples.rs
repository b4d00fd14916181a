//! The examples of the breaker outside tower, over loopback: a background
//! job's worker (`examples/background_job/app.rs`) and a websocket server's
//! sessions (`examples/websocket/app.rs`) stop calling a failing upstream
//! once the breaker opens, wait out its refusals, and resume after a probe
//! closes it. Real sockets, so real time: the durations are a few hundred
//! milliseconds, and the tests assert counts and states, not timings.

#[path = "../../examples/background_job/app.rs"]
mod background_job;
#[path = "../../examples/common/flaky_upstream.rs"]
mod flaky_upstream;
#[path = "../../examples/websocket/app.rs"]
mod websocket;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tower_circuit_breaker::State;

use background_job::Attempt;
use flaky_upstream::FlakyUpstream;

#[tokio::test]
async fn a_background_job_stops_sending_while_open_and_drains_its_queue_after_a_probe() {
    let upstream = FlakyUpstream::start().await.unwrap();
    let breaker = background_job::breaker().unwrap();
    let mut transitions = breaker.subscribe();
    upstream.fail(true);

    let recovering = upstream.clone();
    let attempts = background_job::work(&upstream, &breaker, 8, move |attempt| {
        // The upstream recovers as soon as the breaker first refuses.
        if matches!(attempt, Attempt::Refused(..)) {
            recovering.fail(false);
        }
    })
    .await;

    let failed = attempts
        .iter()
        .filter(|a| matches!(a, Attempt::Failed(_)))
        .count();
    let refused = attempts
        .iter()
        .filter(|a| matches!(a, Attempt::Refused(..)))
        .count();
    let done: Vec<usize> = attempts
        .iter()
        .filter_map(|a| match a {
            Attempt::Done(item) => Some(*item),
            _ => None,
        })
        .collect();
    assert_eq!(failed, background_job::THRESHOLD as usize, "then it opened");
    assert!(refused >= 1);
    assert_eq!(done.len(), 8, "every item done in the end: {attempts:?}");
    assert_eq!(
        upstream.received(),
        failed + done.len(),
        "nothing sent while the breaker refused"
    );
    let states: Vec<State> = std::iter::from_fn(|| transitions.try_recv().ok())
        .map(|t| t.to)
        .collect();
    assert_eq!(states, [State::Open, State::HalfOpen, State::Closed]);
    let counts = breaker.snapshot().counts;
    assert_eq!(
        (counts.rejected, counts.failures),
        (refused as u64, failed as u64)
    );
}

#[tokio::test]
async fn websocket_sessions_answer_refusals_without_calling_the_provider() {
    let provider = FlakyUpstream::start().await.unwrap();
    let breaker = websocket::breaker().unwrap();
    let addr = websocket::serve(&provider, &breaker).await.unwrap();
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/chat"))
        .await
        .unwrap();
    let mut ask = async |prompt: &str| -> String {
        socket.send(Message::text(prompt)).await.unwrap();
        let reply = socket.next().await.expect("a reply").unwrap();
        reply.to_text().unwrap().to_string()
    };

    assert_eq!(ask("hello").await, "answer to hello");
    provider.fail(true);
    for _ in 0..websocket::THRESHOLD {
        assert_eq!(ask("hello").await, "provider failed: 503");
    }
    assert_eq!(breaker.state(), State::Open);
    let received = provider.received();
    for _ in 0..3 {
        let reply = ask("hello").await;
        assert!(
            reply.starts_with("provider unavailable; retry in "),
            "{reply}"
        );
    }
    assert_eq!(provider.received(), received, "refused without calling");

    provider.fail(false);
    tokio::time::sleep(websocket::COOLDOWN + Duration::from_millis(20)).await;
    assert_eq!(ask("again").await, "answer to again", "the probe");
    assert_eq!(breaker.state(), State::Closed);
}
