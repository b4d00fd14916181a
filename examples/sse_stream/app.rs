//! The server-sent events example's wiring, which
//! `tests/loopback/sse_stream.rs` runs too: a local upstream streaming events
//! (one stream breaks midway), and a hyper-util client behind a breaker that
//! judges each call at the end of its stream.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::body::BreakerBody;
use tower_circuit_breaker::classify::{HttpEos, StreamingHttp};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreakerLayer, CircuitOpen, Config, ConfigError, State,
};

use super::demo::wait_out_cooldown;

/// Events per stream.
pub const EVENTS: usize = 3;
/// The broken stream dies after this many events.
pub const BREAKS_AFTER: usize = 2;
/// Time between two events.
pub const EVENT_GAP: Duration = Duration::from_millis(20);
/// How long the breaker stays open before it lets a probe through.
pub const COOLDOWN: Duration = Duration::from_millis(200);

/// Serves `/v1/stream/complete` (every event, then `[DONE]`) and
/// `/v1/stream/broken` (a few events, then the connection is cut) on a free
/// port of 127.0.0.1 until the runtime shuts down. Returns the address and
/// the count of requests received.
pub async fn serve() -> io::Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                counter.fetch_add(1, Ordering::SeqCst);
                let breaks = req.uri().path().ends_with("/broken");
                async move { Ok::<_, hyper::Error>(event_stream(breaks)) }
            });
            tokio::spawn(async move {
                // The broken stream ends its connection with an error: expected.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, received))
}

/// The body of an event stream: frames a task sends one by one.
type Events = StreamBody<ReceiverStream<Result<Frame<Bytes>, BoxError>>>;

/// A `text/event-stream` response whose events a task sends one by one.
fn event_stream(breaks: bool) -> Response<Events> {
    let (events, frames) = mpsc::channel(1);
    tokio::spawn(async move {
        for n in 1..=EVENTS {
            let frame = if breaks && n > BREAKS_AFTER {
                // The body fails: hyper cuts the connection mid-stream.
                Err("upstream crashed mid-stream".into())
            } else {
                tokio::time::sleep(EVENT_GAP).await;
                Ok(Frame::data(Bytes::from(format!("data: token {n}\n\n"))))
            };
            let last = frame.is_err();
            if events.send(frame).await.is_err() || last {
                return; // the client went away, or the stream is cut
            }
        }
        let _ = events
            .send(Ok(Frame::data(Bytes::from("data: [DONE]\n\n"))))
            .await;
    });
    let mut response = Response::new(StreamBody::new(ReceiverStream::new(frames)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// The breaker for the streaming upstream: one failure opens it.
pub fn breaker() -> Result<Breaker, ConfigError> {
    let config = Config::builder()
        .name("sse-provider")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(COOLDOWN)
        .build()?;
    Ok(Breaker::new(config))
}

/// The response of a guarded call: its body records the outcome when the
/// stream ends.
pub type Streamed = Response<BreakerBody<Incoming, HttpEos>>;

/// The guarded client: a breaker judging at the end of the body over hyper-util's client, whose
/// errors become `BoxError` so that they can hold the breaker's refusal.
pub fn client(
    breaker: &Breaker,
) -> impl Service<Request<Empty<Bytes>>, Response = Streamed, Error = BoxError> + Clone {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(StreamingHttp::new()))
        .map_err(BoxError::from)
        .service(client)
}

/// What the scenario saw of one request, as it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The head arrived, and the breaker's state then (it has not judged
    /// the call yet).
    Head(StatusCode, State),
    /// One event's data.
    Event(String),
    /// The stream ended, cut by an error or complete, and the breaker's
    /// state after it.
    End {
        /// The error that cut the stream, if one did.
        error: Option<String>,
        /// The breaker's state once the stream ended.
        state: State,
    },
    /// The breaker refused without sending.
    Refused(State),
    /// Another error.
    Failed(String),
}

/// Reads the events of a stream to its end or its error, noting each.
pub async fn read_events(response: Streamed, breaker: &Breaker, note: &mut impl FnMut(Seen)) {
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let text = String::from_utf8_lossy(data);
                for event in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
                    note(Seen::Event(event.to_owned()));
                }
            }
            Err(err) => {
                let error = Some(err.to_string());
                return note(Seen::End {
                    error,
                    state: breaker.state(),
                });
            }
        }
    }
    note(Seen::End {
        error: None,
        state: breaker.state(),
    });
}

/// The scenario: a stream that breaks midway (a failure: the breaker
/// opens), a request refused while open, and after the cooldown a stream
/// that completes (a successful probe: the breaker closes at its end).
/// Calls `report` as things happen; returns all it saw.
pub async fn run(
    addr: SocketAddr,
    breaker: &Breaker,
    mut report: impl FnMut(&str, &Seen),
) -> Vec<Seen> {
    let client = client(breaker);
    let mut seen = Vec::new();
    let mut note = |path: &str, what: Seen| {
        report(path, &what);
        seen.push(what);
    };
    for path in ["/v1/stream/broken", "/v1/stream/complete"] {
        stream(&client, addr, path, breaker, &mut note).await;
    }
    // Wait out the open period; the next stream is the probe.
    wait_out_cooldown(breaker).await;
    stream(&client, addr, "/v1/stream/complete", breaker, &mut note).await;
    seen
}

/// Sends one request and reads its stream, noting what happens.
async fn stream<S>(
    client: &S,
    addr: SocketAddr,
    path: &str,
    breaker: &Breaker,
    note: &mut impl FnMut(&str, Seen),
) where
    S: Service<Request<Empty<Bytes>>, Response = Streamed, Error = BoxError> + Clone,
{
    let request = match Request::get(format!("http://{addr}{path}")).body(Empty::new()) {
        Ok(request) => request,
        Err(err) => return note(path, Seen::Failed(err.to_string())),
    };
    match client.clone().oneshot(request).await {
        Ok(response) => {
            note(path, Seen::Head(response.status(), breaker.state()));
            read_events(response, breaker, &mut |what| note(path, what)).await;
        }
        Err(err) if CircuitOpen::find(err.as_ref()).is_some() => {
            note(path, Seen::Refused(breaker.state()))
        }
        Err(err) => note(path, Seen::Failed(err.to_string())),
    }
}
