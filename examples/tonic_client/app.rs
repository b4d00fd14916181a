//! The tonic client example's wiring, which `tests/loopback/tonic_client.rs`
//! runs too: a gRPC server built from `tonic-health` whose `HealthReporter`
//! switches it between serving and not, and a generated client whose `Channel`
//! sits behind a breaker that classifies at the end of each stream.
//!
//! tonic-health's `Check` answers a NOT_SERVING server with status **OK**
//! and `NOT_SERVING` in the message: a successful RPC, which a breaker
//! judging gRPC statuses counts as a success. A server that is really
//! unavailable (draining, in maintenance, overloaded) answers its RPCs with
//! the UNAVAILABLE status instead, so the server here has a small tower
//! layer, [`UnavailableUnlessServing`], that asks the health service first
//! and answers every RPC with UNAVAILABLE while it reports NOT_SERVING. The
//! `HealthReporter` stays the one switch.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::{HealthReporter, HealthService};
use tower::util::MapErr;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tower_circuit_breaker::classify::GrpcClassifier;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, ConfigError, State,
};

use super::demo::wait_out_cooldown;

/// Failures in a row that open the breaker.
pub const THRESHOLD: u32 = 2;
/// How long the breaker stays open before it lets a probe through.
pub const COOLDOWN: Duration = Duration::from_millis(300);

/// The gRPC server: its health switch and the count of RPCs it received.
#[derive(Clone)]
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its health switch: NOT_SERVING makes every RPC UNAVAILABLE.
    pub reporter: HealthReporter,
    received: Arc<AtomicUsize>,
}

impl Upstream {
    /// Serves `grpc.health.v1.Health` on a free port of 127.0.0.1 until the
    /// runtime shuts down.
    pub async fn start() -> io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (reporter, health_server) = tonic_health::server::health_reporter();
        let received = Arc::new(AtomicUsize::new(0));
        let gate = UnavailableUnlessServingLayer {
            health: Arc::new(HealthService::from_health_reporter(reporter.clone())),
            received: received.clone(),
        };
        tokio::spawn(
            Server::builder()
                .layer(gate)
                .add_service(health_server)
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        Ok(Upstream {
            addr,
            reporter,
            received,
        })
    }

    /// Switches the whole server (the service named `""`) on or off.
    pub async fn set_serving(&self, serving: bool) {
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        self.reporter.set_service_status("", status).await;
    }

    /// RPCs received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

/// A server-side tower layer: every RPC is answered with UNAVAILABLE while
/// the health service reports the server (service `""`) NOT_SERVING, and
/// counted.
#[derive(Clone)]
pub struct UnavailableUnlessServingLayer {
    health: Arc<HealthService>,
    received: Arc<AtomicUsize>,
}

impl<S> Layer<S> for UnavailableUnlessServingLayer {
    type Service = UnavailableUnlessServing<S>;

    fn layer(&self, inner: S) -> Self::Service {
        UnavailableUnlessServing {
            inner,
            gate: self.clone(),
        }
    }
}

/// The service [`UnavailableUnlessServingLayer`] makes.
#[derive(Clone)]
pub struct UnavailableUnlessServing<S> {
    inner: S,
    gate: UnavailableUnlessServingLayer,
}

impl<S> Service<http::Request<Body>> for UnavailableUnlessServing<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.gate.received.fetch_add(1, Ordering::SeqCst);
        // The ready service goes into the future; a fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let health = self.gate.health.clone();
        Box::pin(async move {
            let check = HealthCheckRequest {
                service: String::new(),
            };
            let serving = match health.check(tonic::Request::new(check)).await {
                Ok(answer) => answer.into_inner().status() == ServingStatus::Serving,
                Err(_) => false,
            };
            if serving {
                inner.call(request).await
            } else {
                Ok(Status::unavailable("not serving").into_http())
            }
        })
    }
}

/// The breaker for the gRPC server.
pub fn breaker() -> Result<Breaker, ConfigError> {
    let config = Config::builder()
        .name("health-upstream")
        .trip(ConsecutiveFailures::new(THRESHOLD))
        .cooldown(COOLDOWN)
        .build()?;
    Ok(Breaker::new(config))
}

/// The channel behind the breaker: its transport errors become
/// `tonic::Status` (UNAVAILABLE for a refused connection), the error type
/// the breaker's refusal converts into (`From<CircuitOpen> for Status`).
pub type GuardedChannel =
    CircuitBreaker<MapErr<Channel, fn(tonic::transport::Error) -> Status>, GrpcClassifier>;

/// A generated client on a channel to `addr`, behind `breaker`, which
/// judges each RPC by its `grpc-status` (in the head of a trailers-only
/// answer, or in the trailers at the end of the stream).
pub fn client(
    breaker: &Breaker,
    addr: SocketAddr,
) -> Result<HealthClient<GuardedChannel>, BoxError> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy();
    let to_status: fn(tonic::transport::Error) -> Status = |err| Status::from_error(Box::new(err));
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(GrpcClassifier::new()))
        .map_err(to_status)
        .service(channel);
    Ok(HealthClient::new(guarded))
}

/// What one `Check` came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The server answered with this serving status.
    Serving(ServingStatus),
    /// The server answered with an error status.
    Status(Code, String),
    /// The breaker refused without sending: UNAVAILABLE, with this
    /// `grpc-retry-pushback-ms`.
    Refused(Option<String>),
}

/// Calls `Check` for the whole server.
pub async fn check(client: &mut HealthClient<GuardedChannel>) -> Answer {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    match client.check(request).await {
        Ok(answer) => Answer::Serving(answer.into_inner().status()),
        Err(status) if CircuitOpen::find(&status).is_some() => Answer::Refused(
            status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        ),
        Err(status) => Answer::Status(status.code(), status.message().to_owned()),
    }
}

/// One `Check` of the scenario, as it went.
#[derive(Clone, Debug)]
pub struct Step {
    /// Whether the server was serving.
    pub serving: bool,
    /// What the call came to.
    pub answer: Answer,
    /// The breaker's state after it.
    pub state: State,
    /// RPCs the server had received after it.
    pub received: usize,
}

/// The scenario: checks while serving, then NOT_SERVING until the breaker
/// opens, refused while open, then serving again; after the cooldown a
/// probe closes the breaker. Calls `report` after each call.
pub async fn run(
    upstream: &Upstream,
    breaker: &Breaker,
    mut report: impl FnMut(&Step),
) -> Result<Vec<Step>, BoxError> {
    let mut client = client(breaker, upstream.addr)?;
    let mut steps = Vec::new();
    // Serving: 2 checks; not serving: THRESHOLD failures, then 2 refusals;
    // serving again, after the cooldown: the probe and one more.
    for (serving, calls, wait_first) in [
        (true, 2, false),
        (false, THRESHOLD + 2, false),
        (true, 2, true),
    ] {
        upstream.set_serving(serving).await;
        if wait_first {
            wait_out_cooldown(breaker).await;
        }
        for _ in 0..calls {
            let answer = check(&mut client).await;
            let step = Step {
                serving,
                answer,
                state: breaker.state(),
                received: upstream.received(),
            };
            report(&step);
            steps.push(step);
        }
    }
    Ok(steps)
}
