//! The axum gateway example's wiring, which `tests/loopback/axum_gateway.rs`
//! runs too: an upstream that can be switched to failing, a gateway that
//! forwards to it through the breaker, and a small HTTP client.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use http::header::{HOST, RETRY_AFTER};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::timeout::Timeout;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, ConfigError,
};

/// Failures in a row that open the breaker.
pub const THRESHOLD: u32 = 3;
/// How long the breaker stays open.
pub const COOLDOWN: Duration = Duration::from_secs(10);
/// The gateway gives up on the upstream after this long.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The upstream's switch and its request count.
#[derive(Clone, Default)]
pub struct Upstream {
    failing: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
}

impl Upstream {
    /// The upstream's routes: `POST /v1/complete` answers `200` with a
    /// completion, or `503` while failing.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/complete", post(complete))
            .with_state(self.clone())
    }

    /// Makes the upstream fail (or recover) from the next request on.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Requests received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

async fn complete(State(upstream): State<Upstream>, prompt: String) -> Response {
    upstream.received.fetch_add(1, Ordering::SeqCst);
    if upstream.failing.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded\n").into_response()
    } else {
        format!("completion of {prompt:?}\n").into_response()
    }
}

/// The breaker for the upstream.
pub fn breaker() -> Result<Breaker, ConfigError> {
    let config = Config::builder()
        .name("completions")
        .trip(ConsecutiveFailures::new(THRESHOLD))
        .cooldown(COOLDOWN)
        .build()?;
    Ok(Breaker::new(config))
}

/// The gateway's way to the upstream: breaker → timeout → hyper client.
type Upstreams = CircuitBreaker<Timeout<Client<HttpConnector, Body>>, HttpClassifier>;

/// What the gateway's handler needs.
#[derive(Clone)]
struct Gateway {
    upstream: Upstreams,
    upstream_addr: SocketAddr,
}

/// The gateway's routes: every request is forwarded to `upstream_addr`
/// through `breaker`; while the breaker is open the gateway answers `503`
/// with `Retry-After` itself, and the upstream receives nothing.
pub fn gateway(breaker: &Breaker, upstream_addr: SocketAddr) -> Router {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let upstream = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(HttpClassifier::new()))
        .timeout(TIMEOUT)
        .service(client);
    Router::new()
        .route("/{*path}", any(forward))
        .with_state(Gateway {
            upstream,
            upstream_addr,
        })
}

async fn forward(State(gateway): State<Gateway>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match format!("http://{}{path}", gateway.upstream_addr).parse() {
        Ok(uri) => uri,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    parts.headers.remove(HOST); // the client sets the upstream's
                                // axum hands each request its own copy of the state: this clone is the
                                // breaker's per-request handle.
    match gateway
        .upstream
        .oneshot(Request::from_parts(parts, body))
        .await
    {
        Ok(response) => response.map(Body::new),
        Err(err) => match CircuitOpen::take(err) {
            // 503, Retry-After, and a short body naming the breaker.
            Ok(open) => open.into_response(),
            Err(err) if is_timeout(err.as_ref()) => StatusCode::GATEWAY_TIMEOUT.into_response(),
            Err(err) => {
                (StatusCode::BAD_GATEWAY, format!("upstream error: {err}\n")).into_response()
            }
        },
    }
}

/// Serves `router` on a free port of 127.0.0.1 until the runtime shuts
/// down; returns the address.
pub async fn start(router: Router) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// Serves `upstream` and, in front of it, a gateway through `breaker`,
/// each on a free port of 127.0.0.1; returns the gateway's address, then
/// the upstream's.
pub async fn start_both(
    upstream: &Upstream,
    breaker: &Breaker,
) -> io::Result<(SocketAddr, SocketAddr)> {
    let upstream_addr = start(upstream.router()).await?;
    let gateway_addr = start(gateway(breaker, upstream_addr)).await?;
    Ok((gateway_addr, upstream_addr))
}

/// A gateway's answer, as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
    /// The body, as text.
    pub body: String,
}

/// Posts `prompt` to `http://{addr}/v1/complete` and reads the answer.
pub async fn complete_via(addr: SocketAddr, prompt: &str) -> Result<Answer, BoxError> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{addr}/v1/complete"))
        .body(Full::new(Bytes::from(prompt.to_owned())))?;
    let response = client.request(request).await?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// One request of the scenario, as it went.
#[derive(Clone, Debug)]
pub struct Step {
    /// Whether the upstream was failing.
    pub failing: bool,
    /// The gateway's answer.
    pub answer: Answer,
    /// Requests the upstream had received after it.
    pub received: usize,
}

/// The scenario: one request while the upstream is healthy, then five
/// while it fails. The first failures are forwarded (the upstream's own
/// 503s); after `THRESHOLD` of them the gateway answers 503 with
/// `Retry-After` itself and the upstream receives nothing more.
pub async fn run(
    gateway_addr: SocketAddr,
    upstream: &Upstream,
    mut report: impl FnMut(&Step),
) -> Result<Vec<Step>, BoxError> {
    let mut steps = Vec::new();
    for failing in [false, true, true, true, true, true] {
        upstream.set_failing(failing);
        let step = Step {
            failing,
            answer: complete_via(gateway_addr, "hello").await?,
            received: upstream.received(),
        };
        report(&step);
        steps.push(step);
    }
    Ok(steps)
}
