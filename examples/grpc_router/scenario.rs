//! The gRPC router example's scenario, which `examples/grpc_router.rs`
//! prints and `tests/loopback/grpc_router.rs` checks: four backends (one
//! hangs, one pushes back, one drains its streams, one is steady), unary
//! callers, then streams.

use std::time::Duration;

use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tower::BoxError;
use tower_circuit_breaker::registry::Registry;
use tower_circuit_breaker::{Snapshot, State};

use super::backends::{Backend, Fault};
use super::router::{breakers, router, Router};

/// Unary callers, each making `CALLS` calls one after another.
pub const CALLERS: usize = 8;
/// Calls per unary caller.
pub const CALLS: usize = 25;
/// Streams started one after another.
pub const STREAMS: usize = 4;
/// How long a stream's caller waits for its next message before it stops
/// reading (the steady backend's `Watch` sends only changes).
const MESSAGE_WAIT: Duration = Duration::from_millis(300);

/// How a stream went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRun {
    /// Messages received.
    pub messages: usize,
    /// The status it ended with: `None` when the caller stopped reading.
    pub ended: Option<Code>,
}

/// What the scenario saw.
pub struct Run {
    /// The backends, in the router's order: hanging, pushing back,
    /// draining, steady.
    pub backends: Vec<Backend>,
    /// The router's breakers.
    pub breakers: Registry<String>,
    /// Each unary call's result: `Ok` or its status code.
    pub unary: Vec<Result<(), Code>>,
    /// Each stream, in order.
    pub streams: Vec<StreamRun>,
    /// A unary call made after the streams.
    pub after: Result<(), Code>,
}

impl Run {
    /// The breaker `key` (`"<backend>"` or `"<backend> <path>"`) as it is
    /// now, if a call made it.
    pub fn breaker(&self, key: &str) -> Option<Snapshot> {
        let key = key.to_string();
        self.breakers
            .snapshot()
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, snapshot)| snapshot)
    }

    /// The state of the breaker `key`, if a call made it.
    pub fn state(&self, key: &str) -> Option<State> {
        self.breaker(key).map(|snapshot| snapshot.state)
    }
}

fn message() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// Runs the scenario on loopback.
pub async fn run() -> Result<Run, BoxError> {
    let backends = vec![
        Backend::start("hanging", Fault::Hang).await?,
        Backend::start("pushing-back", Fault::PushBack(Duration::from_secs(3))).await?,
        Backend::start("draining", Fault::DrainStreams).await?,
        Backend::start("steady", Fault::None).await?,
    ];
    let breakers = breakers()?;
    let list: Vec<(&str, String)> = backends.iter().map(|b| (b.name, b.url.clone())).collect();
    let router = router(&breakers, &list)?;

    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move {
                let mut results = Vec::with_capacity(CALLS);
                for _ in 0..CALLS {
                    let answer = router.check(message()).await;
                    results.push(answer.map(|_| ()).map_err(|status| status.code()));
                }
                results
            })
        })
        .collect();
    let mut unary = Vec::new();
    for caller in callers {
        unary.extend(caller.await?);
    }

    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        streams.push(stream(&router).await);
    }
    let after = router
        .check(message())
        .await
        .map(|_| ())
        .map_err(|status| status.code());
    Ok(Run {
        backends,
        breakers,
        unary,
        streams,
        after,
    })
}

/// Starts a stream and reads it until it ends or stalls.
async fn stream(router: &Router) -> StreamRun {
    let mut stream = match router.watch(message()).await {
        Ok(stream) => stream,
        Err(status) => {
            return StreamRun {
                messages: 0,
                ended: Some(status.code()),
            }
        }
    };
    let mut messages = 0;
    loop {
        match tokio::time::timeout(MESSAGE_WAIT, stream.message()).await {
            Ok(Ok(Some(_))) => messages += 1,
            Ok(Ok(None)) => {
                return StreamRun {
                    messages,
                    ended: Some(Code::Ok),
                }
            }
            Ok(Err(status)) => {
                return StreamRun {
                    messages,
                    ended: Some(status.code()),
                }
            }
            Err(_stalled) => {
                return StreamRun {
                    messages,
                    ended: None,
                }
            }
        }
    }
}
