//! The outage scenario: many conversations through one provider outage, with
//! and without the breaker.
//!
//! Shared by the demo (`examples/outage`: HTTP upstreams on local sockets, real
//! time) and `tests/in_process/outage_demo.rs` (in-process upstreams, paused
//! time): both hand [`run`] a way to reach a [`Provider`], and everything else,
//! the schedule, the clients, the conversations and the tally, is this file.
#![allow(dead_code)] // each user needs a different part of it

use std::fmt::Write as _;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::{sleep, sleep_until, Instant};
use tower::timeout::Timeout;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_circuit_breaker::classify::HttpClassifier;
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::{Breaker, CircuitBreaker, Config, Failover, State};

/// How a client reaches a provider: a prompt in, a completion out.
pub type Upstream = BoxCloneService<Request<String>, Response<String>, BoxError>;

/// Every duration of the scenario. [`Timing::scaled`] shrinks a real outage
/// so that the demo runs in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// The client's timeout on one call (a real one: 30 s).
    pub timeout: Duration,
    /// Consecutive failures that open the breaker.
    pub threshold: u32,
    /// How long the breaker stays open before it probes.
    pub cooldown: Duration,
    /// Healthy before the outage.
    pub warmup: Duration,
    /// How long the primary is degraded.
    pub outage: Duration,
    /// Healthy again after it.
    pub tail: Duration,
    /// How long a healthy primary takes to answer.
    pub primary_latency: Duration,
    /// How long the secondary takes (a fallback model: a little slower).
    pub secondary_latency: Duration,
    /// A conversation's pause between two requests, at random in this range.
    pub think: (Duration, Duration),
}

impl Timing {
    /// The demo's times: 1 s here stands for about 15 s of a real provider
    /// (a 2 s timeout for 30 s, a 13 s outage for about 3 minutes).
    pub fn scaled() -> Self {
        Timing {
            timeout: Duration::from_secs(2),
            threshold: 5,
            cooldown: Duration::from_secs(3),
            warmup: Duration::from_secs(3),
            outage: Duration::from_secs(13),
            tail: Duration::from_secs(5),
            primary_latency: Duration::from_millis(60),
            secondary_latency: Duration::from_millis(120),
            think: (Duration::from_millis(20), Duration::from_millis(120)),
        }
    }

    /// How long one run lasts.
    pub fn total(&self) -> Duration {
        self.warmup + self.outage + self.tail
    }

    /// The outage, as offsets from the start of a run.
    pub fn outage_window(&self) -> (Duration, Duration) {
        (self.warmup, self.warmup + self.outage)
    }
}

/// A simulated model provider: what its server does with a request.
pub struct Provider {
    pub name: &'static str,
    latency: Duration,
    /// How long a degraded provider holds a request before giving up with a
    /// 503: longer than the client's timeout, so the client gives up first.
    hold: Duration,
    degraded: AtomicBool,
    received: AtomicU64,
    received_degraded: AtomicU64,
}

impl Provider {
    pub fn new(name: &'static str, latency: Duration, timing: &Timing) -> Arc<Self> {
        Arc::new(Provider {
            name,
            latency,
            hold: timing.timeout * 3 / 2,
            degraded: AtomicBool::new(false),
            received: AtomicU64::new(0),
            received_degraded: AtomicU64::new(0),
        })
    }

    /// Answers one prompt: after `latency` when healthy; when degraded, it
    /// takes the request and holds it past the client's timeout.
    pub async fn answer(&self, prompt: Request<String>) -> Response<String> {
        self.received.fetch_add(1, Ordering::Relaxed);
        if self.degraded.load(Ordering::Relaxed) {
            self.received_degraded.fetch_add(1, Ordering::Relaxed);
            sleep(self.hold).await;
            let mut busy = Response::new(String::new());
            *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return busy;
        }
        sleep(self.latency).await;
        let turn = prompt.body().len(); // a stand-in for real work
        Response::new(format!(
            "{}: completion ({turn} bytes of prompt)",
            self.name
        ))
    }

    pub fn set_degraded(&self, degraded: bool) {
        self.degraded.store(degraded, Ordering::Relaxed);
    }

    /// Requests it received while degraded: each one held a caller.
    pub fn received_degraded(&self) -> u64 {
        self.received_degraded.load(Ordering::Relaxed)
    }
}

/// Who answered a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    Primary,
    Secondary,
    /// Nobody: the request failed.
    Failed,
}

/// One request, as its conversation saw it.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When it was sent, from the start of the run.
    pub sent: Duration,
    pub latency: Duration,
    pub served: Served,
    /// The primary's breaker state when it was sent (with the breaker only).
    pub primary_state: Option<State>,
}

/// One run through the outage.
pub struct Run {
    pub label: &'static str,
    pub timeout: Duration,
    pub outage: (Duration, Duration),
    pub samples: Vec<Sample>,
    /// Calls the degraded primary received.
    pub primary_degraded_calls: u64,
    /// The primary's breaker, with the breaker.
    pub breaker: Option<Breaker>,
    /// The primary breaker's state changes, from the start of the run.
    pub transitions: Vec<(Duration, State)>,
}

impl Run {
    /// Requests that waited out the client's timeout (on the primary) before
    /// they were answered or failed.
    pub fn waited(&self) -> usize {
        self.samples
            .iter()
            .filter(|s| s.latency >= self.timeout)
            .count()
    }

    /// Of those, the ones sent while the primary's breaker was not closed:
    /// its probes.
    pub fn waited_after_open(&self) -> usize {
        self.samples
            .iter()
            .filter(|s| s.latency >= self.timeout)
            .filter(|s| matches!(s.primary_state, Some(state) if state != State::Closed))
            .count()
    }

    pub fn success_rate(&self) -> f64 {
        let ok = self
            .samples
            .iter()
            .filter(|s| s.served != Served::Failed)
            .count();
        ok as f64 / self.samples.len().max(1) as f64
    }

    /// The `p`th percentile latency (0..=100) of the samples `keep` picks.
    pub fn percentile(&self, p: f64, keep: impl Fn(&Sample) -> bool) -> Duration {
        let mut latencies: Vec<Duration> = self
            .samples
            .iter()
            .filter(|s| keep(s))
            .map(|s| s.latency)
            .collect();
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        latencies.sort_unstable();
        let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1]
    }

    /// Whether a sample was sent during the outage.
    pub fn in_outage(&self, sample: &Sample) -> bool {
        (self.outage.0..self.outage.1).contains(&sample.sent)
    }

    /// Probe calls the breaker let through.
    pub fn probes(&self) -> Option<u64> {
        self.breaker.as_ref().map(|b| b.snapshot().counts.probes)
    }

    /// Time conversations spent waiting on timeouts.
    pub fn time_lost(&self) -> Duration {
        self.samples
            .iter()
            .filter(|s| s.latency >= self.timeout)
            .map(|s| self.timeout.min(s.latency))
            .sum()
    }
}

/// The two runs, side by side.
pub struct Report {
    pub conversations: usize,
    pub without: Run,
    pub with: Run,
}

/// Runs `conversations` conversations through the same outage twice, at the
/// same time, against two separate pairs of providers: without the breaker
/// (timeout, then the secondary) and with it (failover over two breakers).
/// `connect` gives a client of a provider: over HTTP, or in process.
pub async fn run(
    timing: Timing,
    conversations: usize,
    connect: impl Fn(Arc<Provider>) -> io::Result<Upstream>,
) -> io::Result<Report> {
    let bare = (
        Provider::new("primary", timing.primary_latency, &timing),
        Provider::new("secondary", timing.secondary_latency, &timing),
    );
    let guarded = (
        Provider::new("primary", timing.primary_latency, &timing),
        Provider::new("secondary", timing.secondary_latency, &timing),
    );

    let (without, with, breaker) = {
        let bare = (connect(bare.0.clone())?, connect(bare.1.clone())?);
        let guarded = (connect(guarded.0.clone())?, connect(guarded.1.clone())?);
        let (with, breaker) = with_breaker(&timing, guarded.0, guarded.1);
        (without_breaker(&timing, bare.0, bare.1), with, breaker)
    };

    let start = Instant::now();
    let end = start + timing.total();
    let transitions = record_transitions(&breaker, start);

    // The schedule: both primaries degrade and recover together.
    let schedule = {
        let primaries = [bare.0.clone(), guarded.0.clone()];
        tokio::spawn(async move {
            sleep_until(start + timing.warmup).await;
            primaries.iter().for_each(|p| p.set_degraded(true));
            tracing::info!(
                target: "outage",
                "primary degraded: it takes every request and holds it past the {:?} timeout",
                timing.timeout
            );
            sleep_until(start + timing.warmup + timing.outage).await;
            primaries.iter().for_each(|p| p.set_degraded(false));
            tracing::info!(target: "outage", "primary recovered: it answers again");
        })
    };

    let mut tasks = Vec::new();
    for id in 0..conversations {
        let runs = [
            (without.clone(), None),
            (with.clone(), Some(breaker.clone())),
        ];
        for (client, breaker) in runs {
            tasks.push(tokio::spawn(converse(
                id, client, breaker, start, end, timing,
            )));
        }
    }
    let mut samples = (Vec::new(), Vec::new());
    for (n, task) in tasks.into_iter().enumerate() {
        let done = task.await.unwrap_or_default();
        let into = if n % 2 == 0 {
            &mut samples.0
        } else {
            &mut samples.1
        };
        into.extend(done);
    }
    let _ = schedule.await;
    transitions.0.abort();
    let transitions = std::mem::take(&mut *transitions.1.lock().unwrap());

    let run = |label, samples, provider: &Arc<Provider>| Run {
        label,
        timeout: timing.timeout,
        outage: timing.outage_window(),
        samples,
        primary_degraded_calls: provider.received_degraded(),
        breaker: None,
        transitions: Vec::new(),
    };
    Ok(Report {
        conversations,
        without: run("without breaker", samples.0, &bare.0),
        with: Run {
            breaker: Some(breaker),
            transitions,
            ..run("with breaker + failover", samples.1, &guarded.0)
        },
    })
}

/// Without the breaker: every request tries the primary (behind the
/// client's timeout) and falls back to the secondary only when that failed,
/// after the timeout when the primary hangs.
fn without_breaker(timing: &Timing, primary: Upstream, secondary: Upstream) -> Upstream {
    let timeout = timing.timeout;
    BoxCloneService::new(service_fn(move |prompt: Request<String>| {
        primary_then_secondary(primary.clone(), secondary.clone(), timeout, prompt)
    }))
}

async fn primary_then_secondary(
    primary: Upstream,
    secondary: Upstream,
    timeout: Duration,
    prompt: Request<String>,
) -> Result<Response<String>, BoxError> {
    match tokio::time::timeout(timeout, primary.oneshot(prompt.clone())).await {
        Ok(Ok(reply)) if !reply.status().is_server_error() => Ok(reply),
        // Only now, after the timeout when the primary hangs, the secondary.
        _ => match tokio::time::timeout(timeout, secondary.oneshot(prompt)).await {
            Ok(result) => result,
            Err(elapsed) => Err(elapsed.into()),
        },
    }
}

/// With it: a failover over [breaker(primary), breaker(secondary)], the
/// timeout inside each breaker so that a hang is a failure it records.
fn with_breaker(timing: &Timing, primary: Upstream, secondary: Upstream) -> (Upstream, Breaker) {
    let guard = |name: &str, upstream: Upstream| {
        let config = Config::builder()
            .name(name)
            .trip(ConsecutiveFailures::new(timing.threshold))
            .cooldown(timing.cooldown)
            .backoff(1.0) // a fixed open period: the short demo shows recovery
            .probes(1)
            .build()
            .expect("the demo's config is valid");
        let breaker = Breaker::new(config);
        let service = CircuitBreaker::with_classifier(
            Timeout::new(upstream, timing.timeout),
            &breaker,
            HttpClassifier::new(),
        );
        (service, breaker)
    };
    let (primary, breaker) = guard("primary", primary);
    let (secondary, _) = guard("secondary", secondary);
    let failover = Failover::new([primary, secondary]).classify(HttpClassifier::new());
    (BoxCloneService::new(failover), breaker)
}

/// State changes, timed from the start of a run.
type Timeline = Arc<Mutex<Vec<(Duration, State)>>>;

/// Records the breaker's state changes, timed from `start`, until aborted.
fn record_transitions(
    breaker: &Breaker,
    start: Instant,
) -> (tokio::task::JoinHandle<()>, Timeline) {
    let seen = Arc::new(Mutex::new(vec![(Duration::ZERO, breaker.state())]));
    let mut changes = breaker.subscribe();
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match changes.recv().await {
                    Ok(change) => seen.lock().unwrap().push((start.elapsed(), change.to)),
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => break,
                }
            }
        })
    };
    (task, seen)
}

/// One conversation: a request, a pause to read and type, another request,
/// until the run ends.
async fn converse(
    id: usize,
    mut client: Upstream,
    breaker: Option<Breaker>,
    start: Instant,
    end: Instant,
    timing: Timing,
) -> Vec<Sample> {
    let mut random = Random::new(id as u64);
    let mut samples = Vec::new();
    sleep(random.between(timing.think)).await; // conversations start apart
    let mut turn = 0;
    while Instant::now() < end {
        turn += 1;
        let prompt = Request::new(format!("conversation {id}, turn {turn}: go on"));
        let primary_state = breaker.as_ref().map(Breaker::state);
        let sent = Instant::now();
        let result = match client.ready().await {
            Ok(client) => client.call(prompt).await,
            Err(err) => Err(err),
        };
        let served = match &result {
            Ok(reply) if reply.status().is_success() => {
                if reply.body().starts_with("primary") {
                    Served::Primary
                } else {
                    Served::Secondary
                }
            }
            _ => Served::Failed,
        };
        samples.push(Sample {
            sent: sent - start,
            latency: sent.elapsed(),
            served,
            primary_state,
        });
        sleep(random.between(timing.think)).await;
    }
    samples
}

/// A small deterministic generator (xorshift): the same pauses every run.
struct Random(u64);

impl Random {
    fn new(seed: u64) -> Self {
        Random(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn between(&mut self, (low, high): (Duration, Duration)) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let span = high.saturating_sub(low).as_micros() as u64;
        low + Duration::from_micros(self.0 % span.max(1))
    }
}

/// The side-by-side table.
pub fn table(report: &Report) -> String {
    let (a, b) = (&report.without, &report.with);
    let all = |_: &Sample| true;
    let n = report.conversations as f64;
    let secondary = |run: &Run| {
        let count = run.samples.iter().filter(|s| s.served == Served::Secondary);
        format!(
            "{:.0}%",
            100.0 * count.count() as f64 / run.samples.len().max(1) as f64
        )
    };
    let rows: Vec<(String, String, String)> = vec![
        (
            "requests answered (more: nobody was stuck)".into(),
            a.samples.len().to_string(),
            b.samples.len().to_string(),
        ),
        (
            format!("requests that waited out the {} timeout", human(a.timeout)),
            a.waited().to_string(),
            b.waited().to_string(),
        ),
        (
            "  ... per conversation".into(),
            format!("{:.1}", a.waited() as f64 / n),
            format!("{:.1}", b.waited() as f64 / n),
        ),
        (
            "  ... of them probes, after the breaker opened".into(),
            "-".into(),
            b.waited_after_open().to_string(),
        ),
        (
            "time conversations lost to timeouts".into(),
            human(a.time_lost()),
            human(b.time_lost()),
        ),
        (
            "success rate".into(),
            format!("{:.1}%", a.success_rate() * 100.0),
            format!("{:.1}%", b.success_rate() * 100.0),
        ),
        (
            "latency p50 during the outage".into(),
            human(a.percentile(50.0, |s| a.in_outage(s))),
            human(b.percentile(50.0, |s| b.in_outage(s))),
        ),
        (
            "latency p99 during the outage".into(),
            human(a.percentile(99.0, |s| a.in_outage(s))),
            human(b.percentile(99.0, |s| b.in_outage(s))),
        ),
        (
            "latency p50 whole run".into(),
            human(a.percentile(50.0, all)),
            human(b.percentile(50.0, all)),
        ),
        (
            "latency p99 whole run".into(),
            human(a.percentile(99.0, all)),
            human(b.percentile(99.0, all)),
        ),
        (
            "answered by the (slower) secondary".into(),
            secondary(a),
            secondary(b),
        ),
        (
            "calls the degraded primary received".into(),
            a.primary_degraded_calls.to_string(),
            b.primary_degraded_calls.to_string(),
        ),
        (
            "probes sent by the breaker".into(),
            "-".into(),
            b.probes().unwrap_or(0).to_string(),
        ),
    ];
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let mut out = String::new();
    let title = format!("{} conversations", report.conversations);
    let _ = writeln!(out, "{title:width$}  {:>16}  {:>24}", a.label, b.label);
    for (name, x, y) in rows {
        let _ = writeln!(out, "{name:width$}  {x:>16}  {y:>24}");
    }
    out
}

/// `120 ms`, `2.12 s`, `84 s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d < Duration::from_secs(10) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.0} s", d.as_secs_f64())
    }
}
