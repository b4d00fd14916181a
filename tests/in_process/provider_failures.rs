//! How model providers fail, on paused time: an error event inside a `200`
//! stream (cut anywhere), Gemini's `retryDelay` in a small JSON error body,
//! thresholds per failure class, and what a slow call's latency runs to.
//! The provider is a `service_fn` answering `http::Response`s whose bodies
//! pace their chunks on tokio's virtual clock; the breaker is called as a
//! client calls it, one clone per request.
#![cfg(feature = "http-body")]

use std::pin::Pin;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body::Body;
use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::{
    Classify, ClassifyEos, FailureClass, HttpClassifier, StreamingHttp,
};
use tower_circuit_breaker::policy::{
    ConsecutiveFailures, ConsecutiveFailuresFigures, PerClass, SlowCalls, TripReason,
};
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, Config, LatencyTo, State,
};

use crate::common::paced::{paced, Paced};

/// A provider answering `status` with `headers` and the `chunks` of a body.
type Answer = (
    StatusCode,
    Vec<(&'static str, &'static str)>,
    Vec<(Duration, &'static [u8])>,
);

/// `breaker` judging with `classifier` over a provider giving `answer()`.
fn provider<C>(
    breaker: &Breaker,
    classifier: C,
    answer: fn() -> Answer,
) -> CircuitBreaker<
    impl Service<Request<()>, Response = Response<Paced>, Error = BoxError, Future: Send> + Clone,
    C,
>
where
    C: Classify<Response<Paced>, BoxError> + Clone,
    C::Eos: ClassifyEos,
{
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(classifier)
        .layer(service_fn(move |_: Request<()>| async move {
            let (status, headers, chunks) = answer();
            let mut response = Response::new(paced(chunks, false));
            *response.status_mut() = status;
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            Ok::<_, BoxError>(response)
        }))
}

/// Calls `service` once, as a client would, and reads the body to its end.
async fn call_and_read<S, B>(service: &S) -> usize
where
    S: Service<Request<()>, Response = Response<B>, Error = BoxError> + Clone,
    B: Body<Error = BoxError> + Unpin,
{
    let Ok(response) = service.clone().oneshot(Request::new(())).await else {
        return 0;
    };
    let mut body = response.into_body();
    let mut frames = 0;
    while let Some(Ok(_)) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        frames += 1;
    }
    frames
}

const MS: Duration = Duration::from_millis(1);

fn one_failure_opens() -> Breaker {
    Breaker::new(
        crate::common::one_failure_opens("provider")
            .build()
            .unwrap(),
    )
}

/// Anthropic's error event, cut in the middle of its `event:` line and of
/// its JSON, as a provider's chunks may be.
fn anthropic_overloaded() -> Answer {
    (
        StatusCode::OK,
        vec![("content-type", "text/event-stream")],
        vec![
            (
                MS,
                b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
            ),
            (MS, b"event: err"),
            (
                MS,
                b"or\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloa",
            ),
            (MS, b"ded_error\", \"message\": \"Overloaded\"}}\n\n"),
        ],
    )
}

/// An OpenAI-compatible server failing midway: `data: {"error": ...}`, the
/// key cut in two.
fn openai_compatible_error() -> Answer {
    (
        StatusCode::OK,
        vec![("content-type", "text/event-stream")],
        vec![
            (MS, b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"),
            (MS, b"data: {\"err"),
            (MS, b"or\": {\"message\": \"The server had an error\", \"type\": \"server_error\"}}\n\n"),
            (MS, b"data: [DONE]\n\n"),
        ],
    )
}

#[tokio::test(start_paused = true)]
async fn an_error_event_inside_a_200_is_a_failure() {
    for answer in [anthropic_overloaded, openai_compatible_error] {
        let breaker = one_failure_opens();
        let service = provider(&breaker, StreamingHttp::new().sse_errors(), answer);
        let frames = call_and_read(&service).await;
        assert_eq!(frames, 4, "the reader still gets every frame");
        assert_eq!(breaker.state(), State::Open);
        assert_eq!(breaker.snapshot().counts.failures, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn without_the_sse_judge_an_error_event_is_a_success() {
    let breaker = one_failure_opens();
    let service = provider(&breaker, StreamingHttp::new(), anthropic_overloaded);
    call_and_read(&service).await;
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_stream_carries_an_error_event_is_a_failed_probe() {
    let breaker = one_failure_opens();
    let service = provider(
        &breaker,
        StreamingHttp::new().sse_errors(),
        anthropic_overloaded,
    );
    call_and_read(&service).await;
    assert_eq!(breaker.state(), State::Open);
    advance(Duration::from_secs(10)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    call_and_read(&service).await;
    assert_eq!(breaker.state(), State::Open, "the probe failed");
    assert_eq!(breaker.snapshot().last_trip, Some(TripReason::ProbeFailed));
}

#[tokio::test(start_paused = true)]
async fn an_ordinary_stream_through_the_sse_judge_succeeds() {
    fn tokens() -> Answer {
        (
            StatusCode::OK,
            vec![("content-type", "text/event-stream")],
            vec![
                (
                    MS,
                    b"data: {\"choices\":[{\"delta\":{\"content\":\"error\"}}],\"error\":null}\n\n",
                ),
                (MS, b"data: [DONE]\n\n"),
            ],
        )
    }
    let breaker = one_failure_opens();
    let service = provider(&breaker, StreamingHttp::new().sse_errors(), tokens);
    assert_eq!(call_and_read(&service).await, 2);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

/// Gemini's 429: the wait is in the JSON body, `RetryInfo.retryDelay`.
fn gemini_429() -> Answer {
    (
        StatusCode::TOO_MANY_REQUESTS,
        vec![
            ("content-type", "application/json; charset=UTF-8"),
            ("content-length", "230"),
        ],
        vec![
            (MS, b"{\"error\": {\"code\": 429, \"message\": \"Resource has been exhausted\", \"status\": \"RESOURCE_EXHAUSTED\", \"details\": [{\"@type\": \"type.googleapis.com/google.rpc.RetryInfo\", \"retry"),
            (MS, b"Delay\": \"52s\"}]}}"),
        ],
    )
}

#[tokio::test(start_paused = true)]
async fn geminis_retry_delay_in_a_small_error_body_holds_it_open_that_long() {
    let breaker = one_failure_opens();
    let service = provider(&breaker, StreamingHttp::new(), gemini_429);
    call_and_read(&service).await;
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(52)));
}

#[tokio::test(start_paused = true)]
async fn an_error_body_dropped_unread_is_still_a_failure() {
    let breaker = one_failure_opens();
    let service = provider(&breaker, StreamingHttp::new(), gemini_429);
    let response = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Closed, "judged when its body ends");
    drop(response);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.retry_after(),
        Some(Duration::from_secs(10)),
        "no hint read"
    );
    assert_eq!(breaker.snapshot().counts.cancelled, 0);
}

#[tokio::test(start_paused = true)]
async fn ignore_retry_delay_records_the_429_at_once_without_its_body() {
    let breaker = one_failure_opens();
    let service = provider(
        &breaker,
        StreamingHttp::new().ignore_retry_delay(),
        gemini_429,
    );
    let response = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Open, "recorded at the head");
    drop(response);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(10)));
}

#[tokio::test(start_paused = true)]
async fn a_streamed_or_unknown_length_error_body_is_not_read() {
    fn chunked_429() -> Answer {
        let (status, mut headers, chunks) = gemini_429();
        headers.retain(|(name, _)| *name != "content-length");
        (status, headers, chunks)
    }
    let breaker = one_failure_opens();
    let service = provider(&breaker, StreamingHttp::new(), chunked_429);
    let response = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Open, "recorded at the head");
    drop(response);
    assert_eq!(breaker.retry_after(), Some(Duration::from_secs(10)));
}

/// A provider answering each call with the next status of `statuses`.
fn by_status(
    breaker: &Breaker,
    statuses: &'static [u16],
) -> impl Service<Request<()>, Response = Response<()>, Error = BoxError> + Clone {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(HttpClassifier::new())
        .layer(service_fn(move |_: Request<()>| {
            let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                let mut response = Response::new(());
                *response.status_mut() = StatusCode::from_u16(statuses[at % statuses.len()])?;
                Ok::<_, BoxError>(response)
            }
        }))
}

fn per_class_breaker() -> Breaker {
    let config = Config::builder()
        .name("provider")
        .trip(
            PerClass::new(ConsecutiveFailures::new(5))
                .class(FailureClass::Timeout, ConsecutiveFailures::new(3))
                .class(FailureClass::RateLimited, ConsecutiveFailures::new(20)),
        )
        .build()
        .unwrap();
    Breaker::new(config)
}

#[tokio::test(start_paused = true)]
async fn rate_limits_open_only_after_their_own_threshold() {
    let breaker = per_class_breaker();
    let service = by_status(&breaker, &[429]);
    for _ in 0..19 {
        let _ = service.clone().oneshot(Request::new(())).await;
    }
    assert_eq!(breaker.state(), State::Closed, "19 rate limits of 20");
    let _ = service.clone().oneshot(Request::new(())).await;
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn three_gateway_timeouts_open_it_among_rate_limits() {
    let breaker = per_class_breaker();
    // 504, then two 429s, three times: three timeouts, six rate limits.
    let service = by_status(&breaker, &[504, 429, 429]);
    for _ in 0..7 {
        let _ = service.clone().oneshot(Request::new(())).await;
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.snapshot().last_trip,
        Some(TripReason::PerClass {
            class: FailureClass::Timeout,
            reason: Box::new(TripReason::Policy(
                ConsecutiveFailuresFigures {
                    failures: 3,
                    threshold: 3
                }
                .into()
            )),
        })
    );
}

/// A slow-call breaker (one call slower than 1 s opens it) with `latency_to`.
fn slow_calls(to: LatencyTo) -> Breaker {
    let config = Config::builder()
        .name("provider")
        .trip(
            SlowCalls::new(Duration::from_secs(1))
                .rate(1.0)
                .over_calls(1)
                .min_calls(1),
        )
        .latency_to(to)
        .build()
        .unwrap();
    Breaker::new(config)
}

/// First token at once, then a long answer: 20 chunks, 200 ms apart.
fn long_answer() -> Answer {
    let mut chunks = vec![(MS, b"data: {\"t\":0}\n\n" as &[u8])];
    chunks.extend((0..20).map(|_| (Duration::from_millis(200), b"data: {\"t\":1}\n\n" as &[u8])));
    (
        StatusCode::OK,
        vec![("content-type", "text/event-stream")],
        chunks,
    )
}

/// Head at once, first token after 3 s, then the end.
fn late_first_token() -> Answer {
    (
        StatusCode::OK,
        vec![("content-type", "text/event-stream")],
        vec![(Duration::from_secs(3), b"data: {\"t\":0}\n\n")],
    )
}

#[tokio::test(start_paused = true)]
async fn by_default_a_streams_latency_runs_to_its_first_data_frame() {
    assert_eq!(Config::default().latency_to(), LatencyTo::FirstFrame);
    let breaker = slow_calls(LatencyTo::FirstFrame);
    call_and_read(&provider(&breaker, StreamingHttp::new(), long_answer)).await;
    assert_eq!(
        breaker.state(),
        State::Closed,
        "a long answer is not a slow call"
    );
    call_and_read(&provider(&breaker, StreamingHttp::new(), late_first_token)).await;
    assert_eq!(breaker.state(), State::Open, "a late first token is");
}

#[tokio::test(start_paused = true)]
async fn latency_to_the_end_counts_a_long_answer_as_slow() {
    let breaker = slow_calls(LatencyTo::End);
    call_and_read(&provider(&breaker, StreamingHttp::new(), long_answer)).await;
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn latency_to_the_head_ignores_a_late_first_token() {
    let breaker = slow_calls(LatencyTo::Head);
    call_and_read(&provider(&breaker, StreamingHttp::new(), late_first_token)).await;
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn failover_moves_on_from_a_429_whose_body_is_read_for_its_delay() {
    fn tokens() -> Answer {
        (
            StatusCode::OK,
            vec![("content-type", "text/event-stream")],
            vec![(MS, b"data: [DONE]\n\n")],
        )
    }
    let (first, second) = (one_failure_opens(), one_failure_opens());
    let candidates = [
        provider(&first, StreamingHttp::new(), gemini_429),
        provider(&second, StreamingHttp::new(), tokens),
    ];
    let router = tower_circuit_breaker::Failover::new(candidates).classify(StreamingHttp::new());
    let response = router.oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the second candidate answered"
    );
    assert_eq!(first.state(), State::Open);
    assert_eq!(first.snapshot().counts.failures, 1);
}
