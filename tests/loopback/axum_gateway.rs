//! The axum gateway example over loopback: real HTTP requests to the
//! gateway; after the upstream's failures open the breaker, the gateway
//! answers 503 with `Retry-After` and the upstream receives nothing more.
//! The wiring and the scenario are the example's own
//! (`examples/axum_gateway/app.rs`). Real sockets, so real time; the test
//! asserts answers and counts, not timings.
#![cfg(feature = "axum")]

#[path = "../../examples/axum_gateway/app.rs"]
mod app;

use http::StatusCode;
use tower_circuit_breaker::State;

#[tokio::test]
async fn the_gateway_answers_503_with_retry_after_once_the_upstream_has_failed_enough() {
    let upstream = app::Upstream::default();
    let breaker = app::breaker().unwrap();
    let (gateway_addr, _) = app::start_both(&upstream, &breaker).await.unwrap();

    let steps = app::run(gateway_addr, &upstream, |_| {}).await.unwrap();

    let ok = &steps[0];
    let failing: Vec<bool> = steps.iter().map(|s| s.failing).collect();
    assert_eq!(failing, [false, true, true, true, true, true]);
    assert_eq!((ok.answer.status, ok.received), (StatusCode::OK, 1));
    assert_eq!(ok.answer.body, "completion of \"hello\"\n");

    // The upstream's own 503s, forwarded: no Retry-After, its body.
    let threshold = app::THRESHOLD as usize;
    for (n, step) in steps[1..=threshold].iter().enumerate() {
        assert_eq!(step.answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(step.answer.retry_after, None);
        assert_eq!(step.answer.body, "overloaded\n");
        assert_eq!(step.received, 2 + n);
    }
    assert_eq!(breaker.state(), State::Open);

    // The gateway's own 503s: Retry-After in whole seconds, rounded up, and
    // the upstream receives nothing more.
    let refused = &steps[threshold + 1..];
    assert_eq!(refused.len(), 2);
    for step in refused {
        assert_eq!(step.answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            step.answer.retry_after.as_deref(),
            Some("10"),
            "9.9... s left of the 10 s cooldown, rounded up"
        );
        assert_eq!(
            step.answer.body,
            "upstream `completions` is unavailable; retry after 10 s\n"
        );
        assert_eq!(step.received, 1 + threshold, "nothing reached the upstream");
    }
    assert_eq!(breaker.snapshot().counts.rejected, 2);
}

#[tokio::test]
async fn a_request_shaped_error_is_forwarded_and_does_not_count() {
    let upstream = app::Upstream::default();
    let breaker = app::breaker().unwrap();
    let (gateway_addr, _) = app::start_both(&upstream, &breaker).await.unwrap();
    // The upstream has no such route: its 404 is the request's fault.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
    for _ in 0..app::THRESHOLD + 1 {
        let uri = format!("http://{gateway_addr}/v1/nowhere").parse().unwrap();
        let response = client.get(uri).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let snap = breaker.snapshot();
    assert_eq!((snap.state, snap.counts.ignored), (State::Closed, 4));
}
