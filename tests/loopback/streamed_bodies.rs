//! Streamed bodies passed on by a hyper gateway: upstream server, hyper
//! client behind a breaker judging at the end of the body, gateway server streaming the body to
//! its own hyper client, over HTTP/1 and HTTP/2, plain and event-stream
//! bodies.
//!
//! A gateway's server stops reading the breaker's body as soon as the body
//! reports its end (`is_end_stream()`) and drops it: the call has then
//! ended, and is judged as ended. Real sockets, so real time, except the
//! open period, skipped on tokio's clock; the tests assert states and
//! counts, not timings.
#![cfg(feature = "http-body")]

use crate::common::gateway;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::body::BreakerBody;
use tower_circuit_breaker::classify::{HttpEos, StreamingHttp};
use tower_circuit_breaker::{Breaker, State};

use gateway::{breaker, half_open, layer, upstream, Http, EVENTS, PLAIN};

/// A fresh breaker, and a gateway (speaking `gateway_http` to its client)
/// in front of an upstream (speaking `upstream_http`) calling it through
/// that breaker, with the streaming HTTP classifier.
async fn streaming_gateway(upstream_http: Http, gateway_http: Http) -> (Breaker, SocketAddr) {
    let breaker = breaker();
    let upstream = upstream(upstream_http).await;
    let gateway = gateway::gateway(
        gateway_http,
        upstream,
        upstream_http,
        layer(&breaker, StreamingHttp::new()),
    )
    .await;
    (breaker, gateway)
}

/// A gateway (speaking `gateway_http` to its client) in front of an
/// upstream (speaking `upstream_http`), its breaker half-open; a request
/// for `path` through it is the probe. Returns the breaker after the
/// client has read the whole answer, and checks the answer.
async fn probe_through_gateway(upstream_http: Http, gateway_http: Http, path: &str) -> Breaker {
    let (breaker, gateway) = streaming_gateway(upstream_http, gateway_http).await;
    half_open(&breaker).await;

    let (status, body) = gateway::get(gateway_http, gateway, path).await;
    assert_eq!(status, StatusCode::OK);
    let expected = match path {
        "/plain/ok" => PLAIN.to_owned(),
        _ => EVENTS.concat(),
    };
    assert_eq!(body, expected, "the whole body came through");
    breaker
}

#[track_caller]
fn assert_closed_by_its_probe(breaker: &Breaker) {
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.probes_in_flight, snap.counts.ignored),
        (State::Closed, 0, 0),
        "the probe's body ended: a success that closes the breaker"
    );
}

#[tokio::test]
async fn a_plain_body_through_an_http1_gateway_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::One, Http::One, "/plain/ok").await;
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn a_plain_body_through_an_http2_gateway_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::Two, Http::Two, "/plain/ok").await;
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn a_plain_http1_body_through_an_http2_gateway_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::One, Http::Two, "/plain/ok").await;
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn an_http2_event_stream_through_an_http1_gateway_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::Two, Http::One, "/sse/ok").await;
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn an_http2_event_stream_through_an_http2_gateway_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::Two, Http::Two, "/sse/ok").await;
    assert_closed_by_its_probe(&breaker);
}

/// A chunked HTTP/1 body never reports its end before its last read, so the
/// gateway reads it to `None`: the path every body that does not know its
/// end takes.
#[tokio::test]
async fn a_chunked_http1_event_stream_read_to_its_none_closes_a_half_open_breaker() {
    let breaker = probe_through_gateway(Http::One, Http::One, "/sse/ok").await;
    assert_closed_by_its_probe(&breaker);
}

/// 502, then a 200 streamed through, then 502, with two failures in a row
/// to open: the success between them resets the streak.
async fn a_streamed_success_resets_the_streak(upstream_http: Http, gateway_http: Http, ok: &str) {
    let (breaker, gateway) = streaming_gateway(upstream_http, gateway_http).await;
    for (path, status) in [
        ("/plain/fail", StatusCode::BAD_GATEWAY),
        (ok, StatusCode::OK),
        ("/plain/fail", StatusCode::BAD_GATEWAY),
    ] {
        let (answer, _) = gateway::get(gateway_http, gateway, path).await;
        assert_eq!(answer, status, "{path}");
    }
    let snap = breaker.snapshot();
    assert_eq!(
        (snap.state, snap.counts.failures, snap.counts.ignored),
        (State::Closed, 2, 0),
        "two failures, not in a row"
    );
}

#[tokio::test]
async fn a_plain_success_through_an_http1_gateway_resets_a_failure_streak() {
    a_streamed_success_resets_the_streak(Http::One, Http::One, "/plain/ok").await;
}

#[tokio::test]
async fn an_event_stream_through_an_http2_gateway_resets_a_failure_streak() {
    a_streamed_success_resets_the_streak(Http::Two, Http::Two, "/sse/ok").await;
}

#[tokio::test]
async fn an_event_stream_through_an_http1_gateway_resets_a_failure_streak() {
    a_streamed_success_resets_the_streak(Http::Two, Http::One, "/sse/ok").await;
}

/// A scripted body of `frames` data frames. It reports its end with its
/// last frame when `end_with_last` is set (as a body that knows its length
/// does), or only once `ended` is set: an end learnt after the last frame
/// was read, as an HTTP/2 END_STREAM that arrives on its own.
#[derive(Default)]
struct Frames {
    frames: usize,
    end_with_last: bool,
    ended: Arc<AtomicBool>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.frames == 0 {
            return Poll::Ready(None);
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: token\n\n",
        )))))
    }

    fn is_end_stream(&self) -> bool {
        (self.end_with_last && self.frames == 0) || self.ended.load(Ordering::SeqCst)
    }
}

/// A breaker judging at the end of the body over a service answering one [`Frames`] body of
/// `frames` frames, whose end `ended` reports (or its last frame, with
/// `end_with_last`).
fn answering_frames(
    breaker: &Breaker,
    frames: usize,
    end_with_last: bool,
    ended: &Arc<AtomicBool>,
) -> impl Service<(), Response = Response<BreakerBody<Frames, HttpEos>>, Error = BoxError> {
    let ended = ended.clone();
    layer(breaker, StreamingHttp::new()).layer(service_fn(move |()| {
        let body = Frames {
            frames,
            end_with_last,
            ended: ended.clone(),
        };
        async move { Ok::<_, BoxError>(Response::new(body)) }
    }))
}

#[tokio::test]
async fn the_last_frame_of_a_body_that_reports_its_end_is_judged_before_it_is_handed_over() {
    let breaker = breaker();
    half_open(&breaker).await;
    let response = answering_frames(&breaker, 2, true, &Arc::default())
        .oneshot(())
        .await
        .unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert!(body.is_pending(), "one frame to go");
    body.frame().await.unwrap().unwrap();
    // Still held by its reader, which may pass the frame on before it gets
    // round to dropping the body: judged already.
    assert!(!body.is_pending());
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn a_body_whose_end_is_learnt_after_its_last_frame_counts_when_dropped() {
    let breaker = breaker();
    half_open(&breaker).await;
    let ended = Arc::new(AtomicBool::new(false));
    let response = answering_frames(&breaker, 1, false, &ended)
        .oneshot(())
        .await
        .unwrap();
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert!(frame.is_data());
    assert!(body.is_pending(), "its end is not known yet");
    ended.store(true, Ordering::SeqCst);
    // What hyper's servers do: the body says it has ended, so it is dropped.
    assert!(body.is_end_stream());
    drop(body);
    assert_closed_by_its_probe(&breaker);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_counts_as_cancelled_not_as_an_outcome() {
    let breaker = breaker();
    half_open(&breaker).await;
    let response = answering_frames(&breaker, 2, false, &Arc::default())
        .oneshot(())
        .await
        .unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body); // one frame still to come: the reader walked away
    let snap = breaker.snapshot();
    // A probe that said nothing: open again for the same period.
    assert_eq!(
        (
            snap.state,
            snap.probes_in_flight,
            snap.counts.cancelled,
            snap.counts.ignored,
            snap.failed_probe_rounds
        ),
        (State::Open, 0, 1, 0, 0)
    );
}
