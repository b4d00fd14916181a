//! Errors inside a `200` and in a small error body, through real hyper
//! clients and servers: a fake OpenAI-compatible provider on 127.0.0.1 whose
//! event streams carry error events (the line cut over two chunks) and whose
//! 429s carry Gemini's `retryDelay` in their JSON body or OpenAI's reset of a
//! spent quota an hour away; called by a hyper
//! client behind the breaker, and through a hyper gateway that streams the
//! provider's answer on to its own client. Real sockets, so real time; the
//! tests assert what is counted and the announced waits, never timings.
#![cfg(feature = "http-body")]

use crate::common::gateway;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use tower::{BoxError, ServiceExt};
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, State};

use gateway::Http;

fn breaker() -> Breaker {
    let config = crate::common::one_failure_opens("provider")
        .max_open(Duration::from_secs(3600))
        .build()
        .unwrap();
    Breaker::new(config)
}

/// The provider's answers, by path:
///
/// * `/anthropic/overloaded`: 200 `text/event-stream`, a `message_start`
///   event, then `event: error` with an `overloaded_error`, the `event:`
///   line cut over two chunks;
/// * `/openai/error`: 200 `text/event-stream`, a token, then
///   `data: {"error": ...}` cut inside the key, then `[DONE]`;
/// * `/openai/ok`: 200 `text/event-stream`, two tokens and `[DONE]`;
/// * `/gemini/429`: 429 `application/json` with its length, the
///   `RetryInfo.retryDelay` of 52 s, cut over two chunks;
/// * `/openai/quota`: 429 `insufficient_quota` with OpenAI's
///   `x-ratelimit-reset-requests: 59m30s` and no `Retry-After`.
async fn provider() -> SocketAddr {
    gateway::serve(Http::One, |req: Request<Incoming>| async move {
        let (status, content_type, chunks): (u16, &str, Vec<&'static str>) = match req.uri().path() {
            "/anthropic/overloaded" => (
                200,
                "text/event-stream",
                vec![
                    "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
                    "event: er",
                    "ror\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
                ],
            ),
            "/openai/error" => (
                200,
                "text/event-stream",
                vec![
                    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                    "data: {\"er",
                    "ror\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n",
                    "data: [DONE]\n\n",
                ],
            ),
            "/openai/ok" => (
                200,
                "text/event-stream",
                vec![
                    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                    "data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\n",
                    "data: [DONE]\n\n",
                ],
            ),
            "/openai/quota" => (
                429,
                "application/json",
                vec!["{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":\"insufficient_quota\"}}"],
            ),
            _ => (
                429,
                "application/json; charset=UTF-8",
                vec![
                    "{\"error\":{\"code\":429,\"message\":\"Resource has been exhausted\",\"status\":\"RESOURCE_EXHAUSTED\",\"details\":[{\"@type\":\"type.googleapis.com/google.rpc.RetryInfo\",\"retry",
                    "Delay\":\"52s\"}]}}",
                ],
            ),
        };
        let quota = req.uri().path() == "/openai/quota";
        let length: usize = chunks.iter().map(|c| c.len()).sum();
        let frames = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c.as_bytes())))),
        );
        let mut response = Response::new(StreamBody::new(frames));
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_str(content_type).unwrap());
        if status != 200 {
            headers.insert("content-length", HeaderValue::from(length));
        }
        if quota {
            headers.insert("x-ratelimit-remaining-requests", HeaderValue::from(0));
            headers.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::from_static("59m30s"),
            );
        }
        Ok::<_, Infallible>(response)
    })
    .await
}

/// Calls `path` of `upstream` through a hyper client behind `breaker`'s
/// layer judging with `classifier`, and reads the answer to its end.
async fn direct<C>(breaker: &Breaker, classifier: C, upstream: SocketAddr, path: &str) -> String
where
    C: tower_circuit_breaker::classify::Classify<Response<Incoming>, BoxError>
        + Clone
        + Send
        + Sync
        + 'static,
    C::Eos: tower_circuit_breaker::classify::ClassifyEos,
{
    let layer = CircuitBreakerLayer::from_breaker(breaker.clone()).classify(classifier);
    let client = gateway::guarded(Http::One, &layer);
    let response = client
        .oneshot(gateway::upstream_request(upstream, path))
        .await
        .expect("an answer");
    let body = response.into_body().collect().await.expect("a whole body");
    String::from_utf8_lossy(&body.to_bytes()).into_owned()
}

#[tokio::test]
async fn error_events_inside_a_200_open_the_breaker_for_a_direct_client() {
    let upstream = provider().await;
    for path in ["/anthropic/overloaded", "/openai/error"] {
        let breaker = breaker();
        let body = direct(&breaker, StreamingHttp::new().sse_errors(), upstream, path).await;
        assert!(
            body.contains("error"),
            "the reader got the error event: {body}"
        );
        assert_eq!(breaker.state(), State::Open, "{path}");
        assert_eq!(breaker.snapshot().counts.failures, 1);
    }
    // An ordinary stream succeeds; without the judge, the error is not seen.
    let breaker = breaker();
    direct(
        &breaker,
        StreamingHttp::new().sse_errors(),
        upstream,
        "/openai/ok",
    )
    .await;
    direct(
        &breaker,
        StreamingHttp::new(),
        upstream,
        "/anthropic/overloaded",
    )
    .await;
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.snapshot().counts.failures, 0);
}

#[tokio::test]
async fn error_events_inside_a_200_open_the_breaker_through_a_hyper_gateway() {
    let upstream = provider().await;
    for http in [Http::One, Http::Two] {
        let breaker = breaker();
        let layer = gateway::layer(&breaker, StreamingHttp::new().sse_errors());
        let front = gateway::gateway(http, upstream, Http::One, layer).await;
        let (status, body) = gateway::get(http, front, "/openai/error").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("server_error"), "streamed on: {body}");
        assert_eq!(breaker.state(), State::Open, "{http:?}");
        let (status, _) = gateway::get(http, front, "/openai/ok").await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "refused while open"
        );
    }
}

#[tokio::test]
async fn geminis_retry_delay_holds_it_open_for_a_direct_client() {
    let upstream = provider().await;
    let breaker = breaker();
    let body = direct(&breaker, StreamingHttp::new(), upstream, "/gemini/429").await;
    assert!(body.contains("retryDelay"));
    assert_eq!(breaker.state(), State::Open);
    let wait = breaker.retry_after().expect("open");
    assert!(
        wait > Duration::from_secs(47) && wait <= Duration::from_secs(52),
        "{wait:?}"
    );

    let breaker = self::breaker();
    direct(
        &breaker,
        StreamingHttp::new().ignore_retry_delay(),
        upstream,
        "/gemini/429",
    )
    .await;
    let wait = breaker.retry_after().expect("open");
    assert!(
        wait <= Duration::from_secs(10),
        "the breaker's own cooldown: {wait:?}"
    );
}

#[tokio::test]
async fn geminis_retry_delay_holds_it_open_through_a_hyper_gateway() {
    let upstream = provider().await;
    let breaker = breaker();
    let layer = gateway::layer(&breaker, StreamingHttp::new());
    let front = gateway::gateway(Http::One, upstream, Http::One, layer).await;
    let (status, body) = gateway::get(Http::One, front, "/gemini/429").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("RESOURCE_EXHAUSTED"));
    assert_eq!(breaker.state(), State::Open);
    let wait = breaker.retry_after().expect("open");
    assert!(
        wait > Duration::from_secs(47) && wait <= Duration::from_secs(52),
        "{wait:?}"
    );
}

/// Five failures in a row open it; a quota's reset is held up to a day,
/// probed every quarter hour.
fn quota_held() -> Breaker {
    let config = tower_circuit_breaker::Config::builder()
        .name("provider")
        .trip(tower_circuit_breaker::policy::ConsecutiveFailures::new(5))
        .max_quota_hold(Some(Duration::from_secs(24 * 3600)))
        .quota_probe_interval(Duration::from_secs(15 * 60))
        .build()
        .unwrap();
    Breaker::new(config)
}

#[tokio::test]
async fn a_spent_quota_holds_it_open_for_a_direct_client() {
    let upstream = provider().await;
    let breaker = quota_held();
    let body = direct(&breaker, StreamingHttp::new(), upstream, "/openai/quota").await;
    assert!(body.contains("insufficient_quota"));
    // One 429 of the five: the reset an hour away opened it at once.
    assert_eq!(breaker.state(), State::Open);
    let wait = breaker.retry_after().expect("open");
    assert!(
        wait > Duration::from_secs(14 * 60) && wait <= Duration::from_secs(15 * 60),
        "the next probe a quarter hour away: {wait:?}"
    );
}

#[tokio::test]
async fn a_spent_quota_holds_it_open_through_a_hyper_gateway() {
    let upstream = provider().await;
    let breaker = quota_held();
    let layer = gateway::layer(&breaker, StreamingHttp::new());
    let front = gateway::gateway(Http::One, upstream, Http::One, layer).await;
    let (status, body) = gateway::get(Http::One, front, "/openai/quota").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("insufficient_quota"));
    assert_eq!(breaker.state(), State::Open);
    let (status, _) = gateway::get(Http::One, front, "/openai/quota").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "refused while held"
    );
    assert_eq!(breaker.snapshot().counts.failures, 1);
}
