//! The scenario: conversations through the router while one model of one
//! provider fails, then the whole provider, then every provider's large
//! model; run without the breakers and with them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower_circuit_breaker::registry::Registry;

use super::gateway::{self, TIMEOUT};
use super::providers::{self, Behaviour, Received, Script};

/// The providers, in the order the router tries them.
pub const PROVIDERS: [&str; 3] = ["alpha", "beta", "gamma"];
/// The models each serves.
pub const MODELS: [&str; 2] = ["small", "large"];
/// How long each phase lasts.
pub const PHASE: Duration = Duration::from_millis(1_500);
/// What happens in each phase.
pub const PHASES: [&str; 5] = [
    "every provider healthy",
    "alpha's large model hangs",
    "all of alpha hangs, and beta's small model freezes after its first token",
    "and beta and gamma are overloaded for large (503, Retry-After: 1)",
    "every provider healthy again",
];
/// How long a client waits for a whole answer before it gives up.
pub const GIVE_UP: Duration = Duration::from_millis(1_500);
/// How long a breaker stays open before its first probe.
pub const COOLDOWN: Duration = Duration::from_millis(600);

/// The providers' behaviour in `phase`.
fn rule(phase: u8, provider: &str, model: &str) -> Behaviour {
    match (phase, provider, model) {
        (1, "alpha", "large") | (2 | 3, "alpha", _) => Behaviour::Hangs,
        (2, "beta", "small") => Behaviour::Freezes,
        (3, _, "large") => Behaviour::Overloaded,
        _ => Behaviour::Healthy,
    }
}

/// How one request ended, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200, every event through to `[DONE]`.
    Streamed,
    /// 503: every provider out (with `Retry-After` when the breakers know).
    AllOut,
    /// Anything else: an error, or a stream that broke off.
    Failed,
}

/// One request: when it was sent, how long it took, how it ended.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub sent: Duration,
    pub took: Duration,
    pub answer: Answer,
}

/// One run's figures.
#[derive(Debug, Default)]
pub struct Run {
    pub samples: Vec<Sample>,
    /// Calls the sick provider (alpha, the first tried) received while
    /// failing the request's model.
    pub sick_received: u64,
    /// Probes the breakers let through.
    pub probes: u64,
}

impl Run {
    pub fn count(&self, answer: Answer) -> usize {
        self.samples.iter().filter(|s| s.answer == answer).count()
    }

    /// Requests whose answer took the whole timeout or more.
    pub fn waited(&self) -> usize {
        self.samples.iter().filter(|s| s.took >= TIMEOUT).count()
    }

    /// Requests held by a stream until their client gave up on it.
    pub fn given_up(&self) -> usize {
        self.samples.iter().filter(|s| s.took >= GIVE_UP).count()
    }

    /// The median time to a whole streamed answer while something is out.
    pub fn p50_during_outage(&self) -> Duration {
        let mut took: Vec<Duration> = self
            .samples
            .iter()
            .filter(|s| s.answer == Answer::Streamed && s.sent >= PHASE && s.sent < 4 * PHASE)
            .map(|s| s.took)
            .collect();
        took.sort_unstable();
        took.get(took.len() / 2).copied().unwrap_or_default()
    }
}

/// A router over its own providers, with breakers (`enabled`) or with
/// every breaker disabled: the same pipeline, the breakers out of it.
struct Setup {
    script: Arc<Script>,
    received: Vec<Arc<Received>>,
    registry: Registry<String>,
    gateway: SocketAddr,
}

async fn setup(enabled: bool) -> Setup {
    let script = Script::new(rule);
    let mut providers = Vec::new();
    let mut received = Vec::new();
    for name in PROVIDERS {
        let (addr, counts) = providers::serve(name, Arc::clone(&script)).await;
        providers.push((name, addr));
        received.push(counts);
    }
    let registry = gateway::registry(COOLDOWN);
    if !enabled {
        for provider in PROVIDERS {
            for model in MODELS {
                let key = format!("{provider}/{model}");
                if let Ok((child, parent)) = registry.get_with_parent(&key) {
                    child.disable();
                    parent.iter().for_each(|parent| {
                        parent.disable();
                    });
                }
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let gateway = listener.local_addr().expect("a bound address");
    tokio::spawn(gateway::serve(
        listener,
        gateway::router(&registry, &providers),
    ));
    Setup {
        script,
        received,
        registry,
        gateway,
    }
}

/// Runs `conversations` conversations through the phases, without and
/// with the breakers at once; returns the two runs.
pub async fn run(conversations: usize) -> (Run, Run) {
    let (without, with) = (setup(false).await, setup(true).await);
    let start = Instant::now();
    let end = start + PHASE * PHASES.len() as u32;
    let clients = |setup: &Setup| {
        (0..conversations)
            .map(|n| tokio::spawn(converse(setup.gateway, n, start, end)))
            .collect::<Vec<_>>()
    };
    let (tasks_without, tasks_with) = (clients(&without), clients(&with));
    for (phase, what) in PHASES.iter().enumerate().skip(1) {
        let at = PHASE * phase as u32;
        tokio::time::sleep_until((start + at).into()).await;
        without.script.set_phase(phase as u8);
        with.script.set_phase(phase as u8);
        println!("[{:>4.1}s] {what}", at.as_secs_f64());
    }
    (
        finish(&without, tasks_without).await,
        finish(&with, tasks_with).await,
    )
}

async fn finish(setup: &Setup, tasks: Vec<tokio::task::JoinHandle<Vec<Sample>>>) -> Run {
    let mut run = Run::default();
    for task in tasks {
        run.samples.extend(task.await.unwrap_or_default());
    }
    run.samples.sort_by_key(|s| s.sent);
    run.sick_received = setup
        .received
        .first()
        .map_or(0, |alpha| alpha.while_sick.load(Ordering::Relaxed));
    run.probes = setup
        .registry
        .snapshot()
        .iter()
        .map(|(_, snapshot)| snapshot.counts.probes)
        .sum();
    run
}

/// One conversation: requests one after another, alternating the models,
/// each answer read to its end, until `end`.
async fn converse(gateway: SocketAddr, n: usize, start: Instant, end: Instant) -> Vec<Sample> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut samples = Vec::new();
    let mut turn = n;
    while Instant::now() < end {
        let model = MODELS[turn % MODELS.len()];
        turn += 1;
        let body = format!(
            "{{\"model\":\"{model}\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"turn {turn}\"}}]}}"
        );
        let request = Request::post(format!("http://{gateway}/v1/chat/completions"))
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        let sent = Instant::now();
        let answer = match client.request(request).await {
            Ok(response) => {
                let status = response.status();
                // A client gives up on a stream that has not ended in time.
                let body = tokio::time::timeout(GIVE_UP, response.into_body().collect()).await;
                let body = body.map(|read| read.map(|b| b.to_bytes()));
                match (status, body) {
                    (StatusCode::OK, Ok(Ok(body))) if body.ends_with(b"data: [DONE]\n\n") => {
                        Answer::Streamed
                    }
                    (StatusCode::SERVICE_UNAVAILABLE, _) => Answer::AllOut,
                    _ => Answer::Failed,
                }
            }
            Err(_) => Answer::Failed,
        };
        samples.push(Sample {
            sent: sent - start,
            took: sent.elapsed(),
            answer,
        });
        // A user reads the answer, or waits a little after an error.
        let pause = match answer {
            Answer::Streamed => 30,
            _ => 100,
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    samples
}
