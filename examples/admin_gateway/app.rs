//! The admin gateway example's wiring, which `tests/admin_browser.rs` runs
//! too: an upstream of models that can be switched to failing one by one, a
//! gateway that forwards to it through one breaker per model (a registry,
//! models under their providers), and the admin page of that registry
//! served by the gateway at `/admin`.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http::header::HOST;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::admin::Admin;
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{CircuitOpen, Config};

/// The models the example's traffic asks for.
pub const MODELS: [&str; 4] = [
    "openai/gpt-x",
    "openai/mini",
    "anthropic/claude",
    "anthropic/haiku",
];
/// Failures in a row that open a model's breaker.
pub const THRESHOLD: u32 = 3;
/// Failures in a row, across its models, that open a provider's breaker.
pub const PROVIDER_THRESHOLD: u32 = 10;
/// How long a breaker stays open before it probes.
pub const COOLDOWN: Duration = Duration::from_secs(20);
/// The gateway gives up on the upstream after this long.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many breakers: model names come from requests.
pub const MAX_MODELS: usize = 1_000;

/// Which of the upstream's models fail.
#[derive(Clone, Default)]
pub struct Upstream {
    failing: Arc<Mutex<HashSet<String>>>,
}

impl Upstream {
    /// The upstream's routes: `POST /v1/models/{model}/complete` answers
    /// `200`, or `503` while that model fails.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/models/{model}/complete", post(complete))
            .with_state(self.clone())
    }

    /// Makes `model` fail (or recover) from its next request on.
    pub fn set_failing(&self, model: &str, failing: bool) {
        let mut models = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        if failing {
            models.insert(model.to_string());
        } else {
            models.remove(model);
        }
    }

    fn is_failing(&self, model: &str) -> bool {
        let models = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        models.contains(model)
    }
}

async fn complete(State(upstream): State<Upstream>, Path(model): Path<String>) -> Response {
    if upstream.is_failing(&model) {
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded\n").into_response()
    } else {
        format!("a completion from {model}\n").into_response()
    }
}

/// The provider of a model: `openai` for `openai/gpt-x`.
pub fn provider_of(model: &str) -> Option<String> {
    model
        .split_once('/')
        .map(|(provider, _)| provider.to_string())
}

/// One breaker per model, under a breaker per provider: a model opens
/// after [`THRESHOLD`] failures in a row, a provider after
/// [`PROVIDER_THRESHOLD`] across its models.
pub fn registry() -> Result<Registry<String>, BoxError> {
    let config = |name: &str, threshold| {
        Config::builder()
            .name(name)
            .trip(ConsecutiveFailures::new(threshold))
            .cooldown(COOLDOWN)
            .build()
    };
    let mut builder = Registry::builder()
        .default_config(config("model", THRESHOLD)?)
        .parent(|model: &String| provider_of(model))
        .max_keys(MAX_MODELS);
    for provider in ["openai", "anthropic"] {
        builder = builder.config(provider.to_string(), config(provider, PROVIDER_THRESHOLD)?);
    }
    Ok(builder.build())
}

/// The model a request to the upstream is for, which names its breaker.
#[derive(Clone)]
struct Model(String);

fn model_of(request: &http::Request<Body>) -> String {
    request
        .extensions()
        .get::<Model>()
        .map_or_else(String::new, |model| model.0.clone())
}

/// The gateway's way to the upstream: the model's breaker → timeout →
/// hyper client.
type Upstreams = BoxCloneSyncService<http::Request<Body>, http::Response<Incoming>, BoxError>;

#[derive(Clone)]
struct Gateway {
    upstream: Upstreams,
    upstream_addr: SocketAddr,
}

/// The gateway's routes: `POST /v1/models/{model}/complete` is forwarded
/// to `upstream_addr` through that model's breaker in `registry`, and
/// `/admin` serves the registry's admin page (read-only: no control
/// routes).
pub fn gateway(registry: &Registry<String>, upstream_addr: SocketAddr) -> Router {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let upstream = ServiceBuilder::new()
        .layer(KeyedLayer::new(registry.clone(), model_of).classify(HttpClassifier::new()))
        .timeout(TIMEOUT)
        .service(client);
    Router::new()
        .route("/v1/models/{model}/complete", post(forward))
        .with_state(Gateway {
            upstream: BoxCloneSyncService::new(upstream),
            upstream_addr,
        })
        // The page names each model's provider by the registry's own
        // parent function.
        .nest("/admin", Admin::new(registry.clone()).router())
}

async fn forward(
    State(gateway): State<Gateway>,
    Path(model): Path<String>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let uri = format!(
        "http://{}/v1/models/{}/complete",
        gateway.upstream_addr,
        encode(&model)
    );
    parts.uri = match uri.parse() {
        Ok(uri) => uri,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    parts.headers.remove(HOST); // the client sets the upstream's
    parts.extensions.insert(Model(model));
    match gateway
        .upstream
        .oneshot(Request::from_parts(parts, body))
        .await
    {
        Ok(response) => response.map(Body::new),
        Err(err) => match CircuitOpen::find(err.as_ref()) {
            // 503 with Retry-After, naming the open breaker.
            Some(open) => open.clone().into_response(),
            None if is_timeout(err.as_ref()) => StatusCode::GATEWAY_TIMEOUT.into_response(),
            None => (StatusCode::BAD_GATEWAY, format!("upstream error: {err}\n")).into_response(),
        },
    }
}

/// Every byte but ASCII letters and digits percent-encoded: a model's
/// name as one path segment.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Serves `router` on a free port of 127.0.0.1 until the runtime shuts
/// down; returns the address.
pub async fn serve(router: Router) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// A running upstream and gateway.
pub struct Running {
    /// The gateway's address; its admin page is `http://{gateway}/admin`.
    pub gateway: SocketAddr,
    /// The upstream's switches.
    pub upstream: Upstream,
    /// The gateway's breakers.
    pub registry: Registry<String>,
}

/// Serves an upstream and, in front of it, the gateway, each on a free
/// port of 127.0.0.1.
pub async fn start() -> Result<Running, BoxError> {
    let upstream = Upstream::default();
    let registry = registry()?;
    let upstream_addr = serve(upstream.router()).await?;
    let gateway = serve(gateway(&registry, upstream_addr)).await?;
    Ok(Running {
        gateway,
        upstream,
        registry,
    })
}

/// Asks the gateway at `addr` for a completion from `model`; returns the
/// status it answered.
pub async fn complete_via(addr: SocketAddr, model: &str) -> Result<StatusCode, BoxError> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let request = http::Request::post(format!(
        "http://{addr}/v1/models/{}/complete",
        encode(model)
    ))
    .body(Empty::new())?;
    let response = client.request(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    Ok(status)
}

/// The example's traffic, round `round`: which models fail. `gpt-x` is
/// down from round 10 on; `claude` fails for 40 rounds out of every 120;
/// the others stay healthy.
pub fn failing_in(round: u64) -> Vec<&'static str> {
    let mut failing = Vec::new();
    if round >= 10 {
        failing.push("openai/gpt-x");
    }
    if (60..100).contains(&(round % 120)) {
        failing.push("anthropic/claude");
    }
    failing
}
