//! Streamed bodies: the outcome is recorded when the body ends, fails or is
//! dropped; gRPC statuses in headers or trailers; the probe permit is held
//! until the end of the stream.
#![cfg(feature = "http-body")]

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use tokio::time::advance;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::classify::{GrpcClassifier, StreamingHttp};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, State,
};

/// A body that yields scripted frames: data, trailers, or an error.
#[derive(Debug, Default)]
struct Scripted(VecDeque<Result<Frame<&'static [u8]>, BoxError>>);

impl Scripted {
    fn data(mut self, chunk: &'static [u8]) -> Self {
        self.0.push_back(Ok(Frame::data(chunk)));
        self
    }
    fn trailers(mut self, status: u32) -> Self {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from(status));
        self.0.push_back(Ok(Frame::trailers(trailers)));
        self
    }
    fn error(mut self) -> Self {
        self.0.push_back(Err("stream broke".into()));
        self
    }
}

impl Body for Scripted {
    type Data = &'static [u8];
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, BoxError>>> {
        Poll::Ready(self.0.pop_front())
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// Reads a body to its end (or its error).
async fn drain<B: Body + Unpin>(mut body: B) -> Result<(), B::Error> {
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        frame?;
    }
    Ok(())
}

fn breaker() -> Breaker {
    Breaker::new(
        Config::builder()
            .trip(ConsecutiveFailures::new(1))
            .cooldown(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

type Script = fn() -> Response<Scripted>;

/// A breaker judging at the end of the body over a service answering what `script` builds.
fn streaming<C: Clone>(
    breaker: &Breaker,
    classifier: C,
    script: Script,
) -> CircuitBreaker<
    impl Service<Request<()>, Response = Response<Scripted>, Error = BoxError> + Clone,
    C,
> {
    CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(classifier)
        .layer(service_fn(move |_: Request<()>| async move {
            Ok::<_, BoxError>(script())
        }))
}

fn sse_ok() -> Response<Scripted> {
    Response::new(
        Scripted::default()
            .data(b"data: a\n\n")
            .data(b"data: b\n\n"),
    )
}

fn sse_broken() -> Response<Scripted> {
    Response::new(Scripted::default().data(b"data: a\n\n").error())
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_breaks_midway_is_a_failure() {
    let breaker = breaker();
    let svc = streaming(&breaker, StreamingHttp::new(), sse_broken);
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Closed, "not judged before the end");
    assert!(drain(response.into_body()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().counts.failures, 1);
}

#[tokio::test(start_paused = true)]
async fn a_completed_stream_is_a_success() {
    let breaker = breaker();
    let svc = streaming(&breaker, StreamingHttp::new(), sse_ok);
    breaker.force_open(Some(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    let response = svc.oneshot(Request::new(())).await.unwrap();
    drain(response.into_body()).await.unwrap();
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the probe's stream completed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probes_body_dropped_early_is_cancelled_and_reopens_the_breaker() {
    let breaker = breaker();
    let svc = streaming(&breaker, StreamingHttp::new(), sse_ok);
    breaker.force_open(Some(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.snapshot().probes_in_flight, 1);
    drop(response);
    let snap = breaker.snapshot();
    assert_eq!(
        (
            snap.probes_in_flight,
            snap.counts.ignored,
            snap.counts.cancelled
        ),
        (0, 0, 1)
    );
    // No evidence either way: no failure counted, and no probe at once.
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.failed_probe_rounds, 0);
}

#[tokio::test(start_paused = true)]
async fn the_probe_permit_is_held_until_the_end_of_the_stream() {
    let breaker = breaker();
    let svc = streaming(&breaker, StreamingHttp::new(), sse_ok);
    breaker.force_open(Some(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    let probe = svc.clone().oneshot(Request::new(())).await.unwrap();
    // The head is in, the stream is not over: still probing, others refused.
    let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(
        CircuitOpen::find(err.as_ref()).unwrap().state(),
        State::HalfOpen
    );
    drain(probe.into_body()).await.unwrap();
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_5xx_head_is_judged_at_once() {
    let breaker = breaker();
    let svc = streaming(&breaker, StreamingHttp::new(), || {
        let mut r = Response::new(Scripted::default().data(b"busy"));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    });
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Open, "before the body is read");
    assert!(!response.body().is_pending());
}

#[tokio::test(start_paused = true)]
async fn an_empty_body_is_judged_at_once() {
    let breaker = breaker();
    breaker.force_open(Some(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    let svc = streaming(&breaker, StreamingHttp::new(), || {
        Response::new(Scripted::default())
    });
    let response = svc.oneshot(Request::new(())).await.unwrap();
    assert!(!response.body().is_pending());
    assert_eq!(breaker.state(), State::Closed);
}

fn grpc(status_in_head: Option<u32>, trailer: Option<u32>) -> Response<Scripted> {
    let mut body = Scripted::default().data(b"\0\0\0\0\0");
    if let Some(code) = trailer {
        body = body.trailers(code);
    }
    let mut response = Response::new(body);
    if let Some(code) = status_in_head {
        response
            .headers_mut()
            .insert("grpc-status", HeaderValue::from(code));
        response
            .headers_mut()
            .insert("grpc-retry-pushback-ms", HeaderValue::from_static("45000"));
    }
    response
}

#[tokio::test(start_paused = true)]
async fn grpc_trailers_only_unavailable_fails_at_once_with_its_pushback() {
    let breaker = breaker();
    let svc = streaming(&breaker, GrpcClassifier::new(), || grpc(Some(14), None));
    let _ = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(
        breaker.retry_after(),
        Some(Duration::from_secs(45)),
        "pushback over the 10 s cooldown"
    );
}

#[tokio::test(start_paused = true)]
async fn grpc_status_in_trailers_is_judged_at_the_end() {
    for (code, expected) in [
        (14, State::Open),
        (4, State::Open),
        (8, State::Open),
        (0, State::Closed),
    ] {
        let breaker = breaker();
        let svc = streaming(
            &breaker,
            GrpcClassifier::new(),
            match code {
                14 => || grpc(None, Some(14)),
                4 => || grpc(None, Some(4)),
                8 => || grpc(None, Some(8)),
                _ => || grpc(None, Some(0)),
            },
        );
        let response = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(
            breaker.state(),
            State::Closed,
            "code {code}: not before the trailers"
        );
        drain(response.into_body()).await.unwrap();
        assert_eq!(breaker.state(), expected, "code {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn grpc_request_shaped_codes_are_ignored() {
    for code in [3u32, 5, 7, 16] {
        let breaker = breaker();
        let svc = streaming(
            &breaker,
            GrpcClassifier::new(),
            match code {
                3 => || grpc(None, Some(3)),
                5 => || grpc(None, Some(5)),
                7 => || grpc(None, Some(7)),
                _ => || grpc(Some(16), None),
            },
        );
        let response = svc.oneshot(Request::new(())).await.unwrap();
        drain(response.into_body()).await.unwrap();
        let snap = breaker.snapshot();
        assert_eq!(
            (snap.state, snap.counts.ignored),
            (State::Closed, 1),
            "code {code}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_transport_error_is_a_failure() {
    let breaker = breaker();
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(StreamingHttp::new())
        .layer(service_fn(|_: Request<()>| async {
            Err::<Response<Scripted>, BoxError>("connection refused".into())
        }));
    assert!(svc.oneshot(Request::new(())).await.is_err());
    assert_eq!(breaker.state(), State::Open);
}

/// A classifier that defers every result to the body's end, errors too.
#[derive(Clone)]
struct AlwaysAtTheEnd;

impl<B> tower_circuit_breaker::classify::Classify<Response<B>, BoxError> for AlwaysAtTheEnd {
    type Eos = tower_circuit_breaker::classify::Verdict;

    fn classify(
        &self,
        _: Result<&Response<B>, &BoxError>,
    ) -> tower_circuit_breaker::classify::Classified<Self::Eos> {
        let success = tower_circuit_breaker::classify::Verdict::new(
            tower_circuit_breaker::classify::Outcome::Success,
        );
        tower_circuit_breaker::classify::Classified::AtEndOfStream(success)
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_a_classifier_defers_to_a_body_is_a_failure_not_a_cancellation() {
    let breaker = breaker();
    let svc = CircuitBreakerLayer::from_breaker(breaker.clone())
        .classify(AlwaysAtTheEnd)
        .layer(service_fn(|_: Request<()>| async {
            Err::<Response<Scripted>, BoxError>("connection refused".into())
        }));
    assert!(svc.oneshot(Request::new(())).await.is_err());
    let counts = breaker.snapshot().counts;
    assert_eq!(
        (counts.failures, counts.cancelled),
        (1, 0),
        "an error has no body to wait for"
    );
}
