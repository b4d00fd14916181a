//! The providers: OpenAI-compatible chat completion servers on loopback,
//! each streaming its answer as server-sent events, and failing as real
//! providers do when the scenario says so.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::BoxError;

use super::gateway::Chat;

/// How a provider answers one model's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Streams its answer, a token every few milliseconds.
    Healthy,
    /// Accepts the request and holds it: the caller's timeout ends it.
    Hangs,
    /// `503` with `Retry-After: 1`: overloaded, and it says when to return.
    Overloaded,
    /// Answers `200`, streams its first token, then sends nothing more.
    Freezes,
}

/// What the scenario tells every provider, by phase.
pub struct Script {
    phase: AtomicU8,
    rule: fn(u8, &str, &str) -> Behaviour,
}

impl Script {
    pub fn new(rule: fn(u8, &str, &str) -> Behaviour) -> Arc<Script> {
        Arc::new(Script {
            phase: AtomicU8::new(0),
            rule,
        })
    }

    pub fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    fn behaviour(&self, provider: &str, model: &str) -> Behaviour {
        (self.rule)(self.phase.load(Ordering::Relaxed), provider, model)
    }
}

/// A provider's counts of the requests it received.
#[derive(Default)]
pub struct Received {
    pub calls: AtomicU64,
    /// Of those, while it was not healthy for the request's model.
    pub while_sick: AtomicU64,
}

type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Serves provider `name` on a free port of 127.0.0.1 until the process
/// ends; returns its address and its counts.
pub async fn serve(name: &'static str, script: Arc<Script>) -> (SocketAddr, Arc<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    let received = Arc::new(Received::default());
    let counts = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, counts) = (Arc::clone(&script), Arc::clone(&counts));
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                answer(name, Arc::clone(&script), Arc::clone(&counts), req)
            });
            tokio::spawn(async move {
                // A gateway that gave up closes its connection: expected.
                let connection = hyper::server::conn::http1::Builder::new();
                let _ = connection
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, received)
}

async fn answer(
    name: &'static str,
    script: Arc<Script>,
    counts: Arc<Received>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let model = body.ok().and_then(Chat::parse).map(|chat| chat.model);
    let model = model.unwrap_or_default();
    counts.calls.fetch_add(1, Ordering::Relaxed);
    let behaviour = script.behaviour(name, &model);
    if behaviour != Behaviour::Healthy {
        counts.while_sick.fetch_add(1, Ordering::Relaxed);
    }
    Ok(match behaviour {
        Behaviour::Healthy => events(name, model, 5),
        Behaviour::Freezes => events(name, model, 1),
        Behaviour::Hangs => {
            // Held far past any caller's patience; the caller hangs up.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            plain(StatusCode::GATEWAY_TIMEOUT, "")
        }
        Behaviour::Overloaded => {
            let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            response
        }
    })
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from_static(text.as_bytes()));
    let mut response = Response::new(body.map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = status;
    response
}

/// A streamed completion: `tokens` tokens as server-sent events, then
/// `[DONE]`; or, with fewer than five, those and then nothing, the stream
/// held open (frozen) until the caller goes.
fn events(provider: &'static str, model: String, tokens: u32) -> Response<Body> {
    let (send, frames) = mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        for n in 1..=tokens {
            tokio::time::sleep(Duration::from_millis(8)).await;
            let event = format!(
                "data: {{\"model\":\"{model}\",\"provider\":\"{provider}\",\"choices\":[{{\"delta\":{{\"content\":\"token {n}\"}}}}]}}\n\n"
            );
            if send.send(Bytes::from(event)).await.is_err() {
                return;
            }
        }
        if tokens < 5 {
            send.closed().await;
            return;
        }
        let _ = send.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut response = Response::new(Events(frames).boxed_unsync());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// The events a task sends, as a response body that ends with the task.
struct Events(mpsc::Receiver<Bytes>);

impl http_body::Body for Events {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|event| event.map(|e| Ok(Frame::data(e))))
    }
}
