//! A panic while a streamed body is read, in the inner body or in the
//! end-of-stream classifier, is a failure: recorded (a probe's permit goes
//! back), then resumed to whoever reads, or drops, the body. Through a
//! real hyper server serving the breaker's body, and step by step.
#![cfg(feature = "http-body")]

use crate::common::gateway;
use crate::common::panics;

use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::body::BreakerBody;
use tower_circuit_breaker::classify::{Classified, Classify, ClassifyEos, StreamingHttp, Verdict};
use tower_circuit_breaker::{Breaker, State};

use gateway::{breaker, half_open, layer, Http};
use panics::{quiet_scripted_panics, SCRIPTED_PANIC};

/// Judges every answer at the end of its stream, and panics there.
#[derive(Clone, Copy, Debug)]
struct PanicAtEnd;

#[derive(Debug)]
struct PanicAtEndEos;

impl ClassifyEos for PanicAtEndEos {
    fn classify_eos(self, _: Option<&HeaderMap>) -> Verdict {
        panic!("{}", SCRIPTED_PANIC)
    }
}

impl<B, E> Classify<Response<B>, E> for PanicAtEnd {
    type Eos = PanicAtEndEos;

    fn classify(&self, _: Result<&Response<B>, &E>) -> Classified<PanicAtEndEos> {
        Classified::AtEndOfStream(PanicAtEndEos)
    }
}

/// A body of `frames` data frames that panics where it is told to: in
/// `poll_frame` once its frames are out, or in `is_end_stream` once
/// `end_panics` is set; it reports its end after its last frame unless
/// `end_learnt_later`, where it reports it only once `ended` is set.
#[derive(Debug, Default)]
struct Scripted {
    frames: usize,
    poll_panics: bool,
    end_panics: bool,
    end_learnt_later: bool,
    ended: Arc<AtomicBool>,
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.frames == 0 {
            if self.poll_panics {
                panic!("{}", SCRIPTED_PANIC);
            }
            return Poll::Ready(None);
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: token\n\n",
        )))))
    }

    fn is_end_stream(&self) -> bool {
        if self.end_panics {
            panic!("{}", SCRIPTED_PANIC);
        }
        if self.end_learnt_later {
            self.ended.load(Ordering::SeqCst)
        } else {
            self.frames == 0 && !self.poll_panics
        }
    }
}

type Make = Arc<dyn Fn() -> Scripted + Send + Sync>;

/// A breaker judging at the end of the body judging by `classifier` over a service answering a
/// body `make` builds.
fn streaming<C>(
    breaker: &Breaker,
    classifier: C,
    make: Make,
) -> impl Service<
    (),
    Response = Response<BreakerBody<Scripted, C::Eos>>,
    Error = BoxError,
    Future: Send,
> + Clone
       + Send
       + 'static
where
    C: Classify<Response<Scripted>, BoxError> + Clone + Send + Sync + 'static,
    C::Eos: ClassifyEos,
{
    layer(breaker, classifier).layer(service_fn(move |()| {
        let body = make();
        async move { Ok::<_, BoxError>(Response::new(body)) }
    }))
}

/// The breaker's state after its probe failed: open again, the permit back,
/// one failure.
#[track_caller]
fn assert_probe_failed(breaker: &Breaker) {
    let snap = breaker.snapshot();
    assert_eq!(
        (
            snap.state,
            snap.probes_in_flight,
            snap.counts.failures,
            snap.counts.ignored
        ),
        (State::Open, 0, 1, 0),
        "the panic is a failed probe"
    );
}

#[track_caller]
fn assert_scripted(panic: Box<dyn std::any::Any + Send>) {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied());
    assert_eq!(
        message,
        Some(SCRIPTED_PANIC),
        "the panic is resumed as it was"
    );
}

/// Serves, over HTTP/1, the answers of `svc` (one clone per request) with
/// the breaker's body; GETs one and reads it. The panic ends the server's
/// connection task: the client's answer breaks off.
async fn read_through_a_server<S, B>(svc: S)
where
    S: Service<(), Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let server = gateway::serve(Http::One, move |_: Request<Incoming>| {
        let svc = svc.clone();
        async move {
            let response = svc.oneshot(()).await.expect("an answer head");
            Ok::<_, Infallible>(response)
        }
    })
    .await;
    let uri = format!("http://{server}/").parse().unwrap();
    if let Ok(response) = gateway::client(Http::One).get(uri).await {
        assert!(
            response.into_body().collect().await.is_err(),
            "the body breaks off where the server panicked"
        );
    }
}

#[tokio::test]
async fn a_panicking_end_of_stream_classifier_served_by_hyper_fails_the_probe() {
    quiet_scripted_panics();
    let breaker = breaker();
    half_open(&breaker).await;
    let make: Make = Arc::new(|| Scripted {
        frames: 2,
        ..Scripted::default()
    });
    read_through_a_server(streaming(&breaker, PanicAtEnd, make)).await;
    assert_probe_failed(&breaker);
}

#[tokio::test]
async fn a_panicking_inner_body_served_by_hyper_fails_the_probe() {
    quiet_scripted_panics();
    let breaker = breaker();
    half_open(&breaker).await;
    let make: Make = Arc::new(|| Scripted {
        frames: 1,
        poll_panics: true,
        ..Scripted::default()
    });
    read_through_a_server(streaming(&breaker, StreamingHttp::new(), make)).await;
    assert_probe_failed(&breaker);
}

#[tokio::test]
async fn a_panicking_end_of_stream_classifier_is_resumed_to_the_reader() {
    quiet_scripted_panics();
    let breaker = breaker();
    half_open(&breaker).await;
    let make: Make = Arc::new(|| Scripted {
        frames: 1,
        ..Scripted::default()
    });
    let response = streaming(&breaker, PanicAtEnd, make)
        .oneshot(())
        .await
        .unwrap();
    // Read from a task of its own, as a server reads: the panic ends it.
    let reader = tokio::spawn(async move { response.into_body().collect().await.map(|_| ()) });
    let panic = reader.await.expect_err("the reader panicked").into_panic();
    assert_scripted(panic);
    assert_probe_failed(&breaker);
}

#[tokio::test]
async fn a_panicking_classifier_at_a_dropped_ended_body_is_resumed_to_the_dropper() {
    quiet_scripted_panics();
    let breaker = breaker();
    half_open(&breaker).await;
    let ended = Arc::new(AtomicBool::new(false));
    let flag = ended.clone();
    let make: Make = Arc::new(move || Scripted {
        frames: 1,
        end_learnt_later: true,
        ended: flag.clone(),
        ..Scripted::default()
    });
    let response = streaming(&breaker, PanicAtEnd, make)
        .oneshot(())
        .await
        .unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    ended.store(true, Ordering::SeqCst);
    let panic = catch_unwind(AssertUnwindSafe(|| drop(body))).expect_err("drop panicked");
    assert_scripted(panic);
    assert_probe_failed(&breaker);
}

#[tokio::test]
async fn a_body_whose_end_check_panics_when_it_arrives_fails_the_probe() {
    quiet_scripted_panics();
    let breaker = breaker();
    half_open(&breaker).await;
    let make: Make = Arc::new(|| Scripted {
        frames: 1,
        end_panics: true,
        ..Scripted::default()
    });
    let call = streaming(&breaker, StreamingHttp::new(), make).oneshot(());
    let panic = tokio::spawn(call)
        .await
        .expect_err("the caller panicked")
        .into_panic();
    assert_scripted(panic);
    assert_probe_failed(&breaker);
}
