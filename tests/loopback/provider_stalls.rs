//! Streams that freeze or start late, through real hyper clients and
//! servers: a fake OpenAI-compatible provider on 127.0.0.1 whose event
//! stream stops after its first chunk, or sends its first token late, read
//! by a hyper client behind the breaker and through a hyper gateway that
//! streams the answer on. With the config's stream limits the reader gets
//! an error at the limit, not a hang, and the breaker counts a failure;
//! without them the stall counts as nothing. Real sockets, so real time:
//! limits of 200 ms; the tests assert counts and states, never timings.
#![cfg(feature = "http-body")]

use crate::common::gateway;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use tower::ServiceExt;
use tower_circuit_breaker::body::StreamTimeout;
use tower_circuit_breaker::classify::StreamingHttp;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, State};

use gateway::Http;

const LIMIT: Duration = Duration::from_millis(200);
const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";

/// One failure opens it; with `limits`, a stream's first data frame and
/// each gap between two are bounded by `LIMIT`.
fn breaker(limits: bool) -> Breaker {
    let limit = limits.then_some(LIMIT);
    let config = crate::common::one_failure_opens("provider")
        .max_open(Duration::from_secs(3600))
        .first_frame_timeout(limit)
        .frame_idle_timeout(limit)
        .build()
        .unwrap();
    Breaker::new(config)
}

/// `/freeze`: 200 `text/event-stream`, one token, then nothing, for ever.
/// `/late`: 200 at once, its first token after 2 s, then `[DONE]`.
async fn provider() -> SocketAddr {
    gateway::serve(Http::One, |req: Request<Incoming>| async move {
        let late = req.uri().path() == "/late";
        let frames = futures_util::stream::once(async move {
            if late {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(TOKEN.as_bytes())))
        });
        let rest: futures_util::stream::BoxStream<'static, _> = if late {
            futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))])
                .boxed()
        } else {
            futures_util::stream::pending().boxed()
        };
        let mut response = Response::new(StreamBody::new(frames.chain(rest)));
        response.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        Ok::<_, Infallible>(response)
    })
    .await
}

/// Whether reading the body failed with the breaker's `StreamTimeout`.
fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(err) = source {
        if err.is::<StreamTimeout>() {
            return true;
        }
        source = err.source();
    }
    false
}

#[tokio::test]
async fn a_frozen_or_late_stream_ends_at_the_limit_and_fails_for_a_direct_client() {
    let upstream = provider().await;
    for path in ["/freeze", "/late"] {
        let breaker = breaker(true);
        let layer =
            CircuitBreakerLayer::from_breaker(breaker.clone()).classify(StreamingHttp::new());
        let client = gateway::guarded(Http::One, &layer);
        let response = client
            .oneshot(gateway::upstream_request(upstream, path))
            .await
            .expect("a head");
        assert_eq!(response.status(), StatusCode::OK);
        let err = response
            .into_body()
            .collect()
            .await
            .expect_err("cut at the limit");
        assert!(timed_out(err.as_ref()), "{path}: {err}");
        assert_eq!(breaker.state(), State::Open, "{path}");
        assert_eq!(breaker.snapshot().counts.failures, 1, "{path}");
    }
}

#[tokio::test]
async fn without_limits_a_frozen_stream_dropped_by_its_reader_counts_as_nothing() {
    let upstream = provider().await;
    let breaker = breaker(false);
    let layer = CircuitBreakerLayer::from_breaker(breaker.clone()).classify(StreamingHttp::new());
    let client = gateway::guarded(Http::One, &layer);
    let response = client
        .oneshot(gateway::upstream_request(upstream, "/freeze"))
        .await
        .expect("a head");
    let gave_up = tokio::time::timeout(2 * LIMIT, response.into_body().collect()).await;
    assert!(gave_up.is_err(), "held until its reader gave up");
    assert_eq!(breaker.state(), State::Closed);
    let counts = breaker.snapshot().counts;
    assert_eq!((counts.failures, counts.cancelled), (0, 1));
}

#[tokio::test]
async fn a_frozen_or_late_stream_ends_at_the_limit_and_fails_through_a_hyper_gateway() {
    let upstream = provider().await;
    for http in [Http::One, Http::Two] {
        for path in ["/freeze", "/late"] {
            let breaker = breaker(true);
            let layer = gateway::layer(&breaker, StreamingHttp::new());
            let front = gateway::gateway(http, upstream, Http::One, layer).await;
            let uri = format!("http://{front}{path}").parse().unwrap();
            let response = gateway::client(http).get(uri).await.expect("a head");
            assert_eq!(response.status(), StatusCode::OK);
            // The gateway's server ends the stream it cannot finish.
            let read =
                tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
                    .await
                    .expect("the client is not held");
            assert!(read.is_err(), "{http:?} {path}: the stream was cut");
            assert_eq!(breaker.state(), State::Open, "{http:?} {path}");
            let (status, _) = gateway::get(http, front, path).await;
            assert_eq!(
                status,
                StatusCode::SERVICE_UNAVAILABLE,
                "refused while open"
            );
        }
    }
}
