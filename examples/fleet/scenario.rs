//! The fleet scenario: four instances, each with its own [`RedisStore`] and
//! breaker, sending requests to one provider that fails for a while.
//!
//! Shared by `examples/fleet.rs`, which prints it as a demo, and
//! `tests/redis/fleet_example.rs`, which checks its figures: both call [`run`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant, MissedTickBehavior};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::store::redis::{RedisStore, StoreEvent};
use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, Config, State};

use super::ledger::{watch_breaker, watch_store, Ledger, Outcome};
use super::report::{Probe, Report};

/// The breaker's name: the same on every instance, so they share it.
pub const BREAKER: &str = "llm-provider";

/// Every duration and size of the scenario.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Instances in the fleet.
    pub instances: usize,
    /// Failures in a row, across the fleet, that open the breaker.
    pub threshold: u32,
    /// The open period (fixed: backoff 1.0).
    pub cooldown: Duration,
    /// The provider is healthy this long first,
    pub healthy_for: Duration,
    /// then fails every call this long,
    pub failing_for: Duration,
    /// then is healthy again this long (more if a breaker is still open).
    pub recovered_for: Duration,
    /// Each instance sends one request this often.
    pub request_every: Duration,
    /// How long the provider takes to answer (or to fail).
    pub latency: Duration,
    /// How long past the planned end the demo waits for every breaker to
    /// close, on a slow machine.
    pub grace: Duration,
}

impl Timing {
    /// The demo's scenario: about eight seconds of traffic.
    pub fn demo() -> Self {
        Timing {
            instances: 4,
            threshold: 3,
            cooldown: Duration::from_secs(1),
            healthy_for: Duration::from_secs(1),
            failing_for: Duration::from_secs(4),
            recovered_for: Duration::from_secs(3),
            request_every: Duration::from_millis(50),
            latency: Duration::from_millis(10),
            grace: Duration::from_secs(10),
        }
    }

    /// When the provider fails, from the start.
    pub fn outage(&self) -> (Duration, Duration) {
        (self.healthy_for, self.healthy_for + self.failing_for)
    }

    fn phase(&self, at: Duration) -> Phase {
        let (from, to) = self.outage();
        if at < from {
            Phase::Healthy
        } else if at < to {
            Phase::Failing
        } else {
            Phase::Recovered
        }
    }
}

/// What the provider does at a given moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Healthy,
    Failing,
    Recovered,
}

/// An instance's name, in probe locks and in the story: `i0`, `i1`...
pub fn instance_name(i: usize) -> String {
    format!("i{i}")
}

/// The provider's failure: what a 503 would be.
#[derive(Debug)]
struct ProviderDown;

impl std::fmt::Display for ProviderDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("503 Service Unavailable")
    }
}

impl std::error::Error for ProviderDown {}

/// Runs the scenario against the Redis at `redis_url`, with every key
/// under `prefix`, printing the story as it goes.
pub async fn run(redis_url: &str, prefix: &str, timing: Timing) -> Result<Report, BoxError> {
    let config = Config::builder()
        .name(BREAKER)
        .trip(ConsecutiveFailures::new(timing.threshold))
        .cooldown(timing.cooldown)
        .backoff(1.0)
        .build()?;
    let mut stores = Vec::new();
    let mut layers = Vec::new();
    for i in 0..timing.instances {
        let store = RedisStore::builder(redis_url)
            .prefix(prefix)
            .instance(instance_name(i))
            .refresh_interval(Duration::from_millis(250))
            // Shorter than the open period, longer than any probe.
            .probe_lease(timing.cooldown * 4 / 5)
            .build()?;
        let layer = CircuitBreakerLayer::new(config.clone());
        store.attach(&layer.breaker());
        stores.push(store);
        layers.push(layer);
    }
    synced(redis_url, &stores).await?;

    let ledger = Arc::new(Ledger::new(timing));
    let stop = Arc::new(AtomicBool::new(false));
    let mut watchers = Vec::new();
    let mut senders = Vec::new();
    for (i, (store, layer)) in stores.iter().zip(&layers).enumerate() {
        watchers.push(tokio::spawn(watch_breaker(
            i,
            layer.breaker().subscribe(),
            Arc::clone(&ledger),
        )));
        watchers.push(tokio::spawn(watch_store(
            i,
            store.subscribe(),
            Arc::clone(&ledger),
        )));
        let service = layer.layer(provider(i, layer, Arc::clone(&ledger)));
        senders.push(tokio::spawn(send_requests(
            i,
            service,
            Arc::clone(&ledger),
            Arc::clone(&stop),
        )));
    }

    let (from, to) = timing.outage();
    let (start, cooldown) = (ledger.start, timing.cooldown);
    ledger.say(format_args!(
        "{} instances send a request every {} ms each; the provider is healthy",
        timing.instances,
        timing.request_every.as_millis()
    ));
    sleep_until(start + from).await;
    ledger.say("the provider starts failing every call");
    sleep_until(start + to).await;
    ledger.say(format_args!(
        "the provider has recovered; the fleet learns it at its next probe (open periods are {:.1} s)",
        cooldown.as_secs_f64()
    ));
    sleep_until(start + to + timing.recovered_for).await;
    let closed = || layers.iter().all(|l| l.breaker().state() == State::Closed);
    let deadline = Instant::now() + timing.grace;
    while !closed() && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    let all_closed = closed();
    stop.store(true, Ordering::Relaxed);
    let ran_for = ledger.now();
    for sender in senders {
        sender.await?;
    }
    // The last transitions may still be on their way to the watchers.
    sleep(Duration::from_millis(100)).await;
    for watcher in watchers {
        watcher.abort();
    }
    Ok(ledger.report(&stores, all_closed, ran_for))
}

/// Waits until every store has read the shared state and subscribed to
/// the fleet's messages: until then, an instance would not hear of an
/// opening at once.
async fn synced(redis_url: &str, stores: &[RedisStore]) -> Result<(), BoxError> {
    let mut events: Vec<_> = stores.iter().map(RedisStore::subscribe).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = stores.iter().all(|s| {
            let stats = s.stats();
            stats.available && stats.refreshes > 0 && stats.messages > 0
        });
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let mut why = String::from("no answer");
            for events in &mut events {
                while let Ok(event) = events.try_recv() {
                    if let StoreEvent::Unavailable { error } = event {
                        why = error;
                    }
                }
            }
            return Err(format!(
                "Redis at {} was not usable within 10 s ({why})",
                redacted(redis_url)
            )
            .into());
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Instance `i`'s way to the provider: counts every call that reaches it,
/// and tells probes (sent while the breaker is half-open) from the rest.
fn provider(
    i: usize,
    layer: &CircuitBreakerLayer,
    ledger: Arc<Ledger>,
) -> impl Service<String, Response = String, Error = BoxError, Future: Send> + Send + 'static {
    let breaker = layer.breaker();
    service_fn(move |prompt: String| {
        let ledger = Arc::clone(&ledger);
        // Read as the call leaves the breaker: with one probe allowed, a
        // half-open breaker admits only its probe.
        let state = breaker.state();
        let started = ledger.now();
        let phase = ledger.timing.phase(started);
        ledger.upstream_call(i, phase);
        async move {
            sleep(ledger.timing.latency).await;
            let result = match phase {
                Phase::Failing => Err(BoxError::from(ProviderDown)),
                Phase::Healthy | Phase::Recovered => Ok(format!("completion of {prompt}")),
            };
            match state {
                State::HalfOpen => ledger.probe(Probe {
                    instance: i,
                    started,
                    ended: ledger.now(),
                    succeeded: result.is_ok(),
                }),
                State::Closed if result.is_err() => ledger.closed_failure(i),
                State::Closed => ledger.closed_success(),
                _ => {}
            }
            result
        }
    })
}

/// Instance `i`'s traffic: one request every `request_every`, staggered
/// across instances, until `stop`.
async fn send_requests<S>(i: usize, mut service: S, ledger: Arc<Ledger>, stop: Arc<AtomicBool>)
where
    S: Service<String, Response = String, Error = BoxError>,
{
    let timing = ledger.timing;
    let offset = timing.request_every * i as u32 / timing.instances as u32;
    let mut tick = tokio::time::interval_at(ledger.start + offset, timing.request_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let phase = timing.phase(ledger.now());
        let result = match service.ready().await {
            Ok(ready) => {
                ready
                    .call(format!("prompt {n} from {}", instance_name(i)))
                    .await
            }
            Err(e) => Err(e),
        };
        let outcome = match result {
            Ok(_) => Outcome::Answered,
            Err(e) if CircuitOpen::find(e.as_ref()).is_some() => Outcome::Refused,
            Err(_) => Outcome::Failed,
        };
        ledger.request(i, phase, outcome);
    }
}

/// `url` with any password hidden, for printing.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
