//! The gRPC router: backends behind a breaker per backend and method, each
//! under its backend's breaker as parent, tonic's own deadlines, failover
//! for unary calls, and streams judged by their trailers. The guide's page
//! on wiring each client (`src/guide/clients.md`) shows this file.

use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::body::BreakerBody;
use tower_circuit_breaker::classify::{GrpcClassifier, TonicClassifier};
use tower_circuit_breaker::failover::{Exhausted, Failover};
use tower_circuit_breaker::policy::TimeWindow;
use tower_circuit_breaker::registry::{KeyedLayer, Registry};
use tower_circuit_breaker::{Config, ConfigError};

/// Each unary call's deadline, sent as `grpc-timeout` and kept by tonic.
pub const DEADLINE: Duration = Duration::from_millis(200);

/// A breaker per backend and method, keyed `"<backend> <path>"`, each
/// under its backend's breaker (keyed `"<backend>"`) as parent.
pub fn breakers() -> Result<Registry<String>, ConfigError> {
    // Over a backend's every method, a rate: one method failing all its
    // calls opens its own breaker, not the backend's.
    let config = Config::builder()
        .trip(
            TimeWindow::new(Duration::from_secs(10))
                .min_calls(3)
                .failure_rate(0.5),
        )
        .cooldown(Duration::from_secs(2))
        .build()?;
    Ok(Registry::builder()
        .default_config(config)
        .parent(|key: &String| key.split_once(' ').map(|(backend, _)| backend.to_string()))
        .build())
}

/// One backend's unary `Check` as a service of the message: the message is
/// cloned by the failover before tonic encodes it, so a failed attempt can
/// be sent again to the next backend. A gRPC `Channel` itself cannot fail
/// over: its requests are encoded bodies, which are not `Clone`.
fn check_on(
    channel: Channel,
) -> impl Service<
    HealthCheckRequest,
    Response = HealthCheckResponse,
    Error = Status,
    Future = impl Future<Output = Result<HealthCheckResponse, Status>> + Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |message: HealthCheckRequest| {
        let mut client = HealthClient::new(channel.clone());
        async move {
            let mut request = tonic::Request::new(message);
            // Expired, it is CANCELLED "Timeout expired": a failure.
            request.set_timeout(DEADLINE);
            client.check(request).await.map(tonic::Response::into_inner)
        }
    })
}

/// The failover chain of `Check`s.
type Unary = BoxCloneSyncService<HealthCheckRequest, HealthCheckResponse, BoxError>;
/// One backend's generated client over its guarded channel.
type Streams = HealthClient<
    BoxCloneSyncService<Request<Body>, Response<BreakerBody<Body, GrpcClassifier>>, BoxError>,
>;

/// The router: a failover chain for `Check`, and a client per backend for
/// the `Watch` stream.
#[derive(Clone)]
pub struct Router {
    unary: Unary,
    streams: Vec<Streams>,
}

/// Builds the router over `backends` (name and address), in order of
/// preference.
pub fn router(
    breakers: &Registry<String>,
    backends: &[(&str, String)],
) -> Result<Router, BoxError> {
    let mut unary = Vec::new();
    let mut streams = Vec::new();
    for (name, addr) in backends {
        let channel = Endpoint::from_shared(addr.clone())?.connect_lazy();
        let backend = name.to_string();
        // Unary: the breaker of ("backend", "Check"), judged by the status.
        let key = format!("{backend} /grpc.health.v1.Health/Check");
        unary.push(
            KeyedLayer::new(breakers.clone(), move |_: &HealthCheckRequest| key.clone())
                .classify(TonicClassifier::new())
                .layer(check_on(channel.clone())),
        );
        // Streams: the breaker of the method's path, judged by the stream's
        // trailers when it ends (a failure in the head at once); the
        // deadline bounds the wait for the head, not the stream.
        let keyed = KeyedLayer::new(breakers.clone(), move |req: &Request<Body>| {
            format!("{backend} {}", req.uri().path())
        })
        .classify(GrpcClassifier::new());
        let guarded = ServiceBuilder::new()
            .layer(keyed)
            .timeout(DEADLINE)
            .service(channel);
        streams.push(HealthClient::new(BoxCloneSyncService::new(guarded)));
    }
    let unary = Failover::new(unary).classify(TonicClassifier::new());
    Ok(Router {
        unary: BoxCloneSyncService::new(unary),
        streams,
    })
}

impl Router {
    /// A unary call: the first backend whose breakers are closed and that
    /// answers; open ones are skipped without being called.
    pub async fn check(&self, message: HealthCheckRequest) -> Result<HealthCheckResponse, Status> {
        self.unary.clone().oneshot(message).await.map_err(status)
    }

    /// A stream from the first backend that starts it: one refused by an
    /// open breaker, or failed before its head, moves on. Once it has
    /// started, a stream cannot fail over (its messages are the caller's):
    /// one that fails later is its caller's to restart, and its trailers
    /// count in its backend's breaker.
    pub async fn watch(
        &self,
        message: HealthCheckRequest,
    ) -> Result<Streaming<HealthCheckResponse>, Status> {
        let mut last = Status::unavailable("no backend");
        for client in &self.streams {
            match client.clone().watch(message.clone()).await {
                Ok(stream) => return Ok(stream.into_inner()),
                Err(status) => last = status,
            }
        }
        Err(last)
    }
}

/// The failover's error as the status a gRPC caller expects: a backend's
/// own status, or UNAVAILABLE with a pushback when every backend is out.
fn status(err: BoxError) -> Status {
    match err.downcast::<Status>() {
        Ok(status) => *status,
        Err(err) => match err.downcast::<Exhausted>() {
            Ok(exhausted) => Status::from(*exhausted),
            Err(other) => Status::from_error(other),
        },
    }
}
