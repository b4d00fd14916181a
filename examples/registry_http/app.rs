//! The wiring of the registry demo, shared by `examples/registry_http.rs`
//! and `tests/registry_http.rs`: the registry built from `providers.toml`,
//! simulated traffic through a [`KeyedLayer`], and a hyper 1 server that
//! serves `/metrics` (Prometheus text) and `/snapshot` (JSON) from the very
//! breakers the traffic went through.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;

use http::header::{HeaderName, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::registry::{header, KeyedLayer, Registry};
use tower_circuit_breaker::serialization::RegistryConfig;
use tower_circuit_breaker::{metrics_facade, CircuitOpen, Snapshot};

/// The header a request names its model in (`openai/gpt-x`).
pub const MODEL_HEADER: &str = "x-model";

/// The models the simulated traffic asks, and what each one does.
pub const MODELS: [(&str, Behaviour); 5] = [
    ("openai/gpt-x", Behaviour::Down),
    ("openai/gpt-x-mini", Behaviour::SometimesBadRequest),
    ("anthropic/claude-y", Behaviour::Healthy),
    ("anthropic/claude-z", Behaviour::Flaky),
    ("local/llama-70b", Behaviour::Down),
];

/// Rounds of traffic: one request to every model per round.
pub const ROUNDS: usize = 20;

/// What a simulated model does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers 200.
    Healthy,
    /// Answers 503 Service Unavailable, every time.
    Down,
    /// Every third request gets a 500: never three in a row.
    Flaky,
    /// Every fifth request is a client's mistake (400): ignored by the
    /// breaker, it says nothing about the model.
    SometimesBadRequest,
}

impl Behaviour {
    fn status(self, round: usize) -> StatusCode {
        match self {
            Behaviour::Healthy => StatusCode::OK,
            Behaviour::Down => StatusCode::SERVICE_UNAVAILABLE,
            Behaviour::Flaky if round % 3 == 2 => StatusCode::INTERNAL_SERVER_ERROR,
            Behaviour::SometimesBadRequest if round % 5 == 4 => StatusCode::BAD_REQUEST,
            Behaviour::Flaky | Behaviour::SometimesBadRequest => StatusCode::OK,
        }
    }
}

/// `examples/providers.toml`.
pub fn providers_path() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/providers.toml"
    ))
}

/// Reads and checks a registry config file: every mistake names its field.
pub fn load(path: &Path) -> Result<RegistryConfig<String>, BoxError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    toml::from_str(&text).map_err(|err| {
        let message = err.to_string();
        format!("{}: {}", path.display(), message.trim_end()).into()
    })
}

/// The provider of a `provider/model` key: its parent in the registry.
pub fn provider_of(key: &str) -> Option<String> {
    key.split_once('/')
        .map(|(provider, _)| provider.to_string())
}

/// The registry the request path and the HTTP pages share: the file's
/// configs, with every model under its provider.
pub fn registry(configs: &RegistryConfig<String>) -> Registry<String> {
    configs
        .builder()
        .parent(|key: &String| provider_of(key))
        .build()
}

/// Installs the Prometheus recorder as the global `metrics` recorder, once
/// per process, and returns the handle that renders it.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if let Err(err) = ::metrics::set_global_recorder(recorder) {
                eprintln!("metrics will not be recorded: {err}");
            }
            metrics_facade::install();
            handle
        })
        .clone()
}

/// What the HTTP pages read from.
#[derive(Clone)]
pub struct App {
    pub registry: Registry<String>,
    pub prometheus: PrometheusHandle,
}

impl App {
    fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        match (method, path) {
            (&Method::GET, "/metrics") => {
                // Counts are taken from the breakers now: the request path
                // writes nothing for metrics.
                metrics_facade::export_registry(&self.registry);
                reply(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.prometheus.render(),
                )
            }
            (&Method::GET, "/snapshot") => match serde_json::to_string_pretty(&self.snapshot()) {
                Ok(json) => reply(StatusCode::OK, "application/json", json),
                Err(err) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    err.to_string(),
                ),
            },
            (&Method::GET, "/") => reply(
                StatusCode::OK,
                "text/plain",
                "GET /metrics: Prometheus text\nGET /snapshot: every breaker as JSON\n".into(),
            ),
            (_, "/" | "/metrics" | "/snapshot") => reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "only GET\n".into(),
            ),
            _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    /// Every breaker's snapshot by key, sorted.
    pub fn snapshot(&self) -> BTreeMap<String, Snapshot> {
        self.registry.snapshot().into_iter().collect()
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}

/// Serves `app` on `listener` until `shutdown` completes; connections still
/// open then are closed.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, a connection reset before it was
                // accepted: the next one may do better.
                Err(err) => {
                    eprintln!("accept failed: {err}");
                    continue;
                }
            },
        };
        let app = app.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = app.respond(req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            // A client that goes away mid-request is not worth reporting.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        // Forget connections that are done.
        while connections.try_join_next().is_some() {}
    }
    connections.shutdown().await;
    Ok(())
}

/// Sends `method path` to the server at `addr`; returns the status and the
/// body.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
) -> Result<(StatusCode, String), BoxError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Empty::new())?;
    let response = client.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec())?))
}

/// What one model's requests came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests the model answered (any status).
    pub answered: u64,
    /// Requests the breakers refused without asking the model.
    pub refused: u64,
}

/// What the simulated traffic saw.
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    /// By model, as the requests named it.
    pub by_model: BTreeMap<String, Tally>,
    /// Refusals by the breaker that refused ([`CircuitOpen::breaker`]): a
    /// model's own, or its provider's.
    pub refused_by: BTreeMap<String, u64>,
    /// Answers by model and status.
    pub statuses: BTreeMap<(String, u16), u64>,
}

/// Sends [`ROUNDS`] rounds of requests, one to every model of [`MODELS`]
/// per round, through a [`KeyedLayer`] over `registry`, keyed by the
/// [`MODEL_HEADER`] header and classified by status ([`HttpClassifier`]).
pub async fn drive_traffic(registry: &Registry<String>) -> Result<Traffic, BoxError> {
    let mut client = ServiceBuilder::new()
        .layer(
            KeyedLayer::new(
                registry.clone(),
                header::<String>(HeaderName::from_static(MODEL_HEADER)),
            )
            .classify(HttpClassifier::new()),
        )
        .service(service_fn(|req: Request<String>| async move {
            let model = req
                .headers()
                .get(MODEL_HEADER)
                .and_then(|v| v.to_str().ok());
            let (behaviour, round) = MODELS
                .iter()
                .find(|(name, _)| Some(*name) == model)
                .map_or((Behaviour::Healthy, 0), |(_, b)| (*b, req.body().len()));
            let mut response = Response::new(format!("{model:?} answers"));
            *response.status_mut() = behaviour.status(round);
            Ok::<_, BoxError>(response)
        }));
    let mut traffic = Traffic::default();
    for round in 0..ROUNDS {
        for (model, _) in MODELS {
            // The prompt's length tells the simulated model the round.
            let request = Request::builder()
                .header(MODEL_HEADER, model)
                .body("x".repeat(round))?;
            let tally = traffic.by_model.entry(model.to_string()).or_default();
            match client.ready().await?.call(request).await {
                Ok(response) => {
                    tally.answered += 1;
                    *traffic
                        .statuses
                        .entry((model.to_string(), response.status().as_u16()))
                        .or_default() += 1;
                }
                Err(err) => match CircuitOpen::find(err.as_ref()) {
                    Some(open) => {
                        tally.refused += 1;
                        *traffic
                            .refused_by
                            .entry(open.breaker().to_string())
                            .or_default() += 1;
                    }
                    None => return Err(err),
                },
            }
        }
    }
    Ok(traffic)
}
