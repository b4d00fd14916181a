//! A gateway between real hyper servers and clients on 127.0.0.1, the way a
//! model router passes a provider's answer on: an upstream server, a hyper
//! client behind a breaker judging at the end of the body, and a gateway server streaming the
//! upstream's body to its own client as it arrives.
//!
//! hyper's servers (HTTP/1 and HTTP/2) read a frame of the body they send,
//! ask `is_end_stream()`, and drop the body when it says yes: a body read
//! that way never yields its `None`.
//!
//! Used by the tests of streamed bodies; each uses a part,
//! hence the `dead_code` allowance.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::body::BreakerBody;
use tower_circuit_breaker::classify::{Classify, ClassifyEos};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config};

/// The HTTP version of one hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http {
    One,
    Two,
}

/// The events of `/sse/ok`, in order; `[DONE]` is the last.
pub const EVENTS: [&str; 3] = ["data: token 1\n\n", "data: token 2\n\n", "data: [DONE]\n\n"];

/// The body of `/plain/ok`.
pub const PLAIN: &str = "a completion, sent in one piece with its length";

/// How long a breaker of [`breaker`] stays open.
pub const COOLDOWN: Duration = Duration::from_secs(10);

/// A breaker that opens on two failures in a row, for 10 s.
pub fn breaker() -> Breaker {
    let config = Config::builder()
        .name("upstream")
        .trip(ConsecutiveFailures::new(2))
        .cooldown(COOLDOWN)
        .build()
        .expect("a valid config");
    Breaker::new(config)
}

/// Moves tokio's clock on by `period` without sleeping: pauses it, advances
/// it, and lets it run again. Needs a current-thread runtime, as
/// `#[tokio::test]` gives.
pub async fn skip(period: Duration) {
    tokio::time::pause();
    tokio::time::advance(period).await;
    tokio::time::resume();
}

/// Opens `breaker` and waits out its open period on tokio's clock: its
/// next call is a probe.
pub async fn half_open(breaker: &Breaker) {
    breaker.force_open(Some(COOLDOWN));
    skip(COOLDOWN).await;
    assert_eq!(breaker.state(), tower_circuit_breaker::State::HalfOpen);
}

/// An event stream that knows its last event: its frames come one by one
/// from a task, and it reports its end as soon as the last one is out (as
/// a server does that sends `[DONE]` and then closes the stream). Over
/// HTTP/2 the last event's frame then carries END_STREAM; over HTTP/1 it
/// is chunked.
pub struct Events {
    frames: mpsc::Receiver<Bytes>,
    left: usize,
}

impl Events {
    fn start() -> Events {
        let (send, frames) = mpsc::channel(1);
        tokio::spawn(async move {
            for event in EVENTS {
                // One event per poll of the server: a stream, not one write.
                tokio::task::yield_now().await;
                if send
                    .send(Bytes::from_static(event.as_bytes()))
                    .await
                    .is_err()
                {
                    return; // the client went away
                }
            }
        });
        Events {
            frames,
            left: EVENTS.len(),
        }
    }
}

impl Body for Events {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        match self.frames.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(event)) => {
                self.left -= 1;
                Poll::Ready(Some(Ok(Frame::data(event))))
            }
            Poll::Ready(None) => Poll::Ready(Some(Err("the event source went away".into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

type UpstreamBody = BoxBody<Bytes, BoxError>;

/// One event, then, once the server has sent it, an error: the server cuts
/// the stream.
fn breaks_midway() -> UpstreamBody {
    let (send, frames) = mpsc::channel(1);
    tokio::spawn(async move {
        let event = Bytes::from_static(EVENTS[0].as_bytes());
        let _ = send.send(Ok(Frame::data(event))).await;
        // The head and the first event go out before the break.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = send
            .send(Err("the provider dropped the stream".into()))
            .await;
    });
    let frames = futures_util::stream::unfold(frames, |mut frames| async move {
        let frame: Result<Frame<Bytes>, BoxError> = frames.recv().await?;
        Some((frame, frames))
    });
    http_body_util::StreamBody::new(frames).boxed()
}

fn full(text: &'static str) -> UpstreamBody {
    Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// The upstream's answer to `path`:
///
/// * `/plain/ok`: 200 and [`PLAIN`], with its `content-length`;
/// * `/plain/fail`: 502;
/// * `/sse/ok`: 200 `text/event-stream`, the [`EVENTS`] one by one;
/// * `/sse/break`: 200 `text/event-stream`, one event, then the stream
///   fails (the connection is cut midway);
/// * `/grpc/no-status`: 200 `application/grpc`, one message, and no
///   `grpc-status` anywhere (no trailers): a stream that ends without a
///   status;
/// * anything else: 404.
pub fn answer(path: &str) -> Response<UpstreamBody> {
    let (status, content_type, body) = match path {
        "/plain/ok" => (StatusCode::OK, "text/plain", full(PLAIN)),
        "/plain/fail" => (StatusCode::BAD_GATEWAY, "text/plain", full("bad gateway")),
        "/sse/ok" => (StatusCode::OK, "text/event-stream", Events::start().boxed()),
        "/sse/break" => (StatusCode::OK, "text/event-stream", breaks_midway()),
        "/grpc/no-status" => (
            StatusCode::OK,
            "application/grpc",
            // An uncompressed, empty message: flag 0, length 0.
            full("\0\0\0\0\0"),
        ),
        _ => (StatusCode::NOT_FOUND, "text/plain", full("no such route")),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

/// Serves the upstream (see [`answer`]; every path is answered as its own
/// path, whatever the prefix a gRPC client adds) on a free port of
/// 127.0.0.1 until the runtime shuts down.
pub async fn upstream(http: Http) -> SocketAddr {
    serve(http, |req: Request<Incoming>| async move {
        let path = req.uri().path().to_owned();
        Ok::<_, Infallible>(answer(&path))
    })
    .await
}

/// Serves `handle` over `http` on a free port of 127.0.0.1 until the
/// runtime shuts down.
pub async fn serve<F, Fut, B>(http: Http, handle: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(handle.clone());
            let io = TokioIo::new(stream);
            tokio::spawn(async move {
                // A connection ends with an error when its client goes
                // away mid-stream: nothing to report.
                let _ = match http {
                    Http::One => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    }
                    Http::Two => {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    }
                };
            });
        }
    });
    addr
}

/// A hyper-util client speaking `http`.
pub fn client(http: Http) -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(http == Http::Two)
        .build_http()
}

/// The response of a guarded call: its body records the call's outcome.
pub type Guarded<Eos> = Response<BreakerBody<Incoming, Eos>>;

/// A hyper-util client speaking `http`, behind the breaker judging at the end of the body that
/// `layer` makes; its errors (the refusal included) are `BoxError`s.
pub fn guarded<C>(
    http: Http,
    layer: &CircuitBreakerLayer<C>,
) -> impl Service<Request<Empty<Bytes>>, Response = Guarded<C::Eos>, Error = BoxError, Future: Send>
       + Clone
       + Send
       + 'static
where
    C: Classify<Response<Incoming>, BoxError> + Clone + Send + Sync + 'static,
    C::Eos: ClassifyEos,
{
    ServiceBuilder::new()
        .layer(layer.clone())
        .map_err(BoxError::from)
        .service(client(http))
}

/// The request a gateway sends upstream for `path`.
pub fn upstream_request(upstream: SocketAddr, path: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{upstream}{path}"))
        .body(Empty::new())
        .expect("a valid request")
}

/// A gateway speaking `http` to its clients: each request's path is asked
/// of `upstream` (spoken to over `upstream_http`) through `layer`'s
/// breaker, and the upstream's answer streamed back, its body the
/// breaker's; a refusal is answered `503`.
pub async fn gateway<C>(
    http: Http,
    upstream: SocketAddr,
    upstream_http: Http,
    layer: CircuitBreakerLayer<C>,
) -> SocketAddr
where
    C: Classify<Response<Incoming>, BoxError> + Clone + Send + Sync + 'static,
    C::Eos: ClassifyEos,
{
    let client = guarded(upstream_http, &layer);
    serve(http, move |req: Request<Incoming>| {
        // A clone per request, as servers call services.
        let client = client.clone();
        async move {
            let request = upstream_request(upstream, req.uri().path());
            let answer = match client.oneshot(request).await {
                Ok(response) => response.map(Either::Left),
                Err(err) => {
                    let status = if CircuitOpen::find(err.as_ref()).is_some() {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::BAD_GATEWAY
                    };
                    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
                    *response.status_mut() = status;
                    response
                }
            };
            Ok::<_, Infallible>(answer)
        }
    })
    .await
}

/// A breaker's layer over `breaker`, judging with `classifier`.
pub fn layer<C>(breaker: &Breaker, classifier: C) -> CircuitBreakerLayer<C> {
    CircuitBreakerLayer::from_breaker(breaker.clone()).classify(classifier)
}

/// GETs `path` from `addr` over `http` and reads the whole answer.
pub async fn get(http: Http, addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let uri = format!("http://{addr}{path}").parse().expect("a valid URI");
    let response = client(http).get(uri).await.expect("an answer");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a whole body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
