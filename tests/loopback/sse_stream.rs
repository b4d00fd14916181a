//! The server-sent events example over loopback with hyper: a stream cut
//! midway is a failure (judged at its end, not at its head), a stream read
//! to its end is a success (a half-open probe that closes the breaker only
//! after its last event). The wiring and the scenario are the example's own
//! (`examples/sse_stream/app.rs`). Real sockets, so real time: a few
//! hundred milliseconds, and the test asserts counts and states, not
//! timings.
#![cfg(feature = "http-body")]

#[path = "../../examples/sse_stream/app.rs"]
mod app;
use crate::common::demo;

use std::sync::atomic::Ordering;

use http::{Request, StatusCode};
use http_body_util::Empty;
use tower::ServiceExt;
use tower_circuit_breaker::State;

use app::Seen;

fn event(n: usize) -> Seen {
    Seen::Event(format!("token {n}"))
}

#[tokio::test]
async fn a_cut_stream_is_a_failure_and_a_complete_one_a_success() {
    let (addr, received) = app::serve().await.unwrap();
    let breaker = app::breaker().unwrap();
    let mut paths = Vec::new();
    let seen = app::run(addr, &breaker, |path, _| paths.push(path.to_owned())).await;

    // The cut stream: judged when it breaks, not when its head arrives.
    assert_eq!(
        seen[..3],
        [
            Seen::Head(StatusCode::OK, State::Closed),
            event(1),
            event(2)
        ]
    );
    match &seen[3] {
        Seen::End {
            error: Some(_),
            state: State::Open,
        } => {}
        other => panic!("the cut stream should open the breaker: {other:?}"),
    }
    // Open: the next request is refused without reaching the upstream.
    assert_eq!(seen[4], Seen::Refused(State::Open));
    // The probe holds its permit until its last event is in.
    assert_eq!(
        seen[5..],
        [
            Seen::Head(StatusCode::OK, State::HalfOpen),
            event(1),
            event(2),
            event(3),
            Seen::Event("[DONE]".to_owned()),
            Seen::End {
                error: None,
                state: State::Closed
            },
        ]
    );
    assert_eq!(paths[0], "/v1/stream/broken");
    assert_eq!(
        received.load(Ordering::SeqCst),
        2,
        "the refused request was not sent"
    );

    let counts = breaker.snapshot().counts;
    assert_eq!(
        (
            counts.calls,
            counts.failures,
            counts.ignored,
            counts.rejected,
            counts.probes
        ),
        (2, 1, 0, 1, 1)
    );
}

#[tokio::test]
async fn a_stream_dropped_midway_by_the_client_counts_neither_way() {
    let (addr, _) = app::serve().await.unwrap();
    let breaker = app::breaker().unwrap();
    let request = Request::get(format!("http://{addr}/v1/stream/complete"))
        .body(Empty::new())
        .unwrap();
    let response = app::client(&breaker).oneshot(request).await.unwrap();
    drop(response); // the caller walked away before the end
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.counts.cancelled, snap.counts.failures),
        (State::Closed, 1, 0)
    );
}
