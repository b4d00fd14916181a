//! The hyper client example's wiring, which `tests/loopback/hyper_client.rs`
//! runs too: a flaky upstream on a free port of 127.0.0.1, a hyper-util client
//! behind the breaker with a timeout inside it, and the scenario.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::timeout::Timeout;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{is_timeout, HttpClassifier};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{
    Breaker, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, Config, ConfigError, State,
};

use super::demo::wait_out_cooldown;

/// The client gives up on a request after this long: a hang becomes a
/// failure the breaker records.
pub const TIMEOUT: Duration = Duration::from_millis(150);
/// Failures in a row that open the breaker.
pub const THRESHOLD: u32 = 3;
/// How long the breaker stays open before it lets a probe through.
pub const COOLDOWN: Duration = Duration::from_millis(300);

/// What the upstream does with the requests it receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answers `200 OK` at once.
    Healthy,
    /// Answers `503 Service Unavailable` at once.
    Failing,
    /// Holds every request far past the client's timeout.
    Hanging,
}

/// A local HTTP upstream whose behaviour the scenario switches, and which
/// counts the requests it receives.
#[derive(Clone)]
pub struct Upstream {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    received: Arc<AtomicUsize>,
}

impl Upstream {
    /// Serves on a free port of 127.0.0.1 until the runtime shuts down.
    pub async fn start() -> io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = Upstream {
            addr: listener.local_addr()?,
            mode: Arc::new(AtomicU8::new(Mode::Healthy as u8)),
            received: Arc::new(AtomicUsize::new(0)),
        };
        let server = upstream.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let server = server.clone();
                    async move { Ok::<_, hyper::Error>(server.answer().await) }
                });
                tokio::spawn(async move {
                    // A client that timed out closes its connection: expected.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(upstream)
    }

    async fn answer(&self) -> Response<Full<Bytes>> {
        self.received.fetch_add(1, Ordering::SeqCst);
        let status = match self.mode() {
            Mode::Healthy => StatusCode::OK,
            Mode::Failing => StatusCode::SERVICE_UNAVAILABLE,
            Mode::Hanging => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                StatusCode::GATEWAY_TIMEOUT
            }
        };
        let mut response = Response::new(Full::new(Bytes::from(status.as_str().to_owned())));
        *response.status_mut() = status;
        response
    }

    /// Switches what the upstream does from the next request on.
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            0 => Mode::Healthy,
            1 => Mode::Failing,
            _ => Mode::Hanging,
        }
    }

    /// Requests received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }

    /// The upstream's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The breaker for the upstream.
pub fn breaker() -> Result<Breaker, ConfigError> {
    let config = Config::builder()
        .name("flaky-upstream")
        .trip(ConsecutiveFailures::new(THRESHOLD))
        .cooldown(COOLDOWN)
        .build()?;
    Ok(Breaker::new(config))
}

/// The guarded client: breaker → timeout → hyper-util client.
/// `tower::timeout` already turns the client's errors into `BoxError`,
/// which can hold the breaker's refusal.
pub type GuardedClient =
    CircuitBreaker<Timeout<Client<HttpConnector, Empty<Bytes>>>, HttpClassifier>;

/// Builds the guarded client around `breaker`.
pub fn client(breaker: &Breaker) -> GuardedClient {
    let client = Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(CircuitBreakerLayer::from_breaker(breaker.clone()).classify(HttpClassifier::new()))
        .timeout(TIMEOUT)
        .service(client)
}

/// What one request came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The upstream answered with this status.
    Status(StatusCode),
    /// The client's timeout fired.
    TimedOut,
    /// The breaker refused without sending; retry after this long.
    Refused(Duration),
    /// Another error (connection refused...).
    Failed(String),
}

/// Sends one GET to the upstream through the guarded client.
pub async fn get(client: &GuardedClient, upstream: &Upstream) -> Answer {
    let uri = format!("http://{}/v1/models", upstream.addr());
    let request = match Request::get(uri).body(Empty::new()) {
        Ok(request) => request,
        Err(err) => return Answer::Failed(err.to_string()),
    };
    // One clone per request keeps the example short; a server would keep
    // one clone per connection or task.
    match client.clone().oneshot(request).await {
        Ok(response) => Answer::Status(response.status()),
        Err(err) => describe(&err),
    }
}

fn describe(err: &BoxError) -> Answer {
    if let Some(open) = CircuitOpen::find(err.as_ref()) {
        Answer::Refused(open.retry_after())
    } else if is_timeout(err.as_ref()) {
        Answer::TimedOut
    } else {
        Answer::Failed(err.to_string())
    }
}

/// One request of the scenario, as it went.
#[derive(Clone, Debug)]
pub struct Step {
    /// What the upstream was doing.
    pub mode: Mode,
    /// What the request came to.
    pub answer: Answer,
    /// The breaker's state after it.
    pub state: State,
    /// Requests the upstream had received after it.
    pub received: usize,
}

/// The scenario: healthy, then failing and hanging until the breaker opens,
/// refused while open, then recovered; after the cooldown a probe closes
/// the breaker. Calls `report` after each request; returns every step.
pub async fn run(
    upstream: &Upstream,
    breaker: &Breaker,
    mut report: impl FnMut(&Step),
) -> Vec<Step> {
    let client = client(breaker);
    let plan = [
        (Mode::Healthy, 2),
        (Mode::Failing, 1),
        (Mode::Hanging, 2),
        // Open now: these are refused and never reach the upstream.
        (Mode::Hanging, 3),
    ];
    let mut steps = Vec::new();
    let mut send = |mode, answer| {
        let step = Step {
            mode,
            answer,
            state: breaker.state(),
            received: upstream.received(),
        };
        report(&step);
        steps.push(step);
    };
    for (mode, requests) in plan {
        upstream.set(mode);
        for _ in 0..requests {
            send(mode, get(&client, upstream).await);
        }
    }
    upstream.set(Mode::Healthy);
    // Wait out the open period; the next request is the probe.
    wait_out_cooldown(breaker).await;
    for _ in 0..2 {
        send(Mode::Healthy, get(&client, upstream).await);
    }
    steps
}
