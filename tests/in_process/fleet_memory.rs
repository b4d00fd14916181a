//! One breaker across a fleet whose instances share one process
//! (`store::memory`), on paused tokio time: the fleet behaviours the Redis
//! tests pin (tests/redis/server.rs), without Redis. Each "instance" is its own
//! `MemoryStore` of one `MemoryFleet`, with its own breaker of the shared
//! name in front of an upstream, called as a service is: a clone per
//! request, each request a task of its own.
//!
//! Time moves only when every task waits, so after `settle()` every
//! instance's task has taken in everything the fleet decided.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceExt};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::store::memory::{MemoryFleet, MemoryFleetError, MemoryStore};
use tower_circuit_breaker::store::Fleet;
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

use crate::common::Upstream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Answered,
    Failed,
    Refused,
}

type Svc = tower_circuit_breaker::CircuitBreaker<BoxCloneSyncService<(), (), BoxError>>;

/// One instance of the service: its store, its breaker, its client.
struct Instance {
    store: MemoryStore,
    breaker: Breaker,
    service: Svc,
}

impl Instance {
    fn new(fleet: &MemoryFleet, config: Config, upstream: &Upstream<()>) -> Self {
        Instance::with_store(fleet.instance(), config, upstream)
    }

    fn with_store(store: MemoryStore, config: Config, upstream: &Upstream<()>) -> Self {
        let layer = CircuitBreakerLayer::new(config);
        let breaker = layer.breaker();
        assert!(store.attach(&breaker));
        let service = tower::Layer::layer(&layer, BoxCloneSyncService::new(upstream.clone()));
        Instance {
            store,
            breaker,
            service,
        }
    }

    /// One request, on a task of its own with a clone of the client, as a
    /// server handler makes it; and what became of it.
    async fn request(&self) -> Answer {
        let client = self.service.clone();
        let call = tokio::spawn(async move { client.oneshot(()).await });
        answer(call.await.expect("the request task ran"))
    }

    fn state(&self) -> State {
        self.breaker.state()
    }
}

fn answer(result: Result<(), BoxError>) -> Answer {
    match result {
        Ok(()) => Answer::Answered,
        Err(e) if e.is::<CircuitOpen>() => Answer::Refused,
        Err(_) => Answer::Failed,
    }
}

/// Polls `future` once: its output, if it needs no waiting.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// Lets every task take in what it was told (time moves 1 ms, once every
/// task waits).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn config(name: &str, failures: u32, open: Duration) -> Config {
    Config::builder()
        .name(name)
        .trip(ConsecutiveFailures::new(failures))
        .cooldown(open)
        .backoff(1.0)
        .build()
        .expect("a valid config")
}

fn fleet_of(
    n: usize,
    fleet: &MemoryFleet,
    config: &Config,
    upstream: &Upstream<()>,
) -> Vec<Instance> {
    (0..n)
        .map(|_| Instance::new(fleet, config.clone(), upstream))
        .collect()
}

fn states(fleet: &[Instance]) -> Vec<State> {
    fleet.iter().map(Instance::state).collect()
}

/// The last transition `events` holds, if any.
fn last(
    events: &mut tokio::sync::broadcast::Receiver<tower_circuit_breaker::events::Transition>,
) -> Option<tower_circuit_breaker::events::Transition> {
    let mut last = None;
    while let Ok(t) = events.try_recv() {
        last = Some(t);
    }
    last
}

#[tokio::test(start_paused = true)]
async fn failures_spread_over_three_instances_open_all_three() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let fleet = fleet_of(
        3,
        &memory,
        &config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    let mut transitions: Vec<_> = fleet.iter().map(|i| i.breaker.subscribe()).collect();
    for (n, instance) in fleet.iter().enumerate() {
        assert_eq!(instance.request().await, Answer::Failed);
        settle().await;
        if n < 2 {
            assert_eq!(memory.failures("llm"), n as u64 + 1, "one count");
            assert_eq!(states(&fleet), [State::Closed; 3]);
        }
    }
    assert_eq!(states(&fleet), [State::Open; 3]);
    for (instance, events) in fleet.iter().zip(&mut transitions) {
        let event = events.try_recv().expect("one transition each");
        assert_eq!(event.to, State::Open);
        // No instance saw three failures itself: the fleet decided.
        assert_eq!(event.reason, Some(TripReason::Shared));
        assert_eq!(instance.request().await, Answer::Refused);
    }
    assert_eq!(upstream.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_success_anywhere_resets_the_shared_count() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::default();
    let fleet = fleet_of(
        3,
        &memory,
        &config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    let fail = |n: usize| {
        upstream.fail();
        let answer = fleet[n].request();
        async move {
            let answer = answer.await;
            settle().await;
            answer
        }
    };
    assert_eq!(fail(0).await, Answer::Failed);
    assert_eq!(fail(1).await, Answer::Failed);
    assert_eq!(memory.failures("llm"), 2);
    // The third instance never failed; its success resets the fleet's count.
    upstream.recover();
    assert_eq!(fleet[2].request().await, Answer::Answered);
    settle().await;
    assert_eq!(memory.failures("llm"), 0);
    assert_eq!(fleet[2].store.stats().writes, 1, "one reset written");
    // Two more failures do not open: the count started again.
    assert_eq!(fail(0).await, Answer::Failed);
    assert_eq!(fail(1).await, Answer::Failed);
    assert_eq!(states(&fleet), [State::Closed; 3]);
    assert_eq!(fail(2).await, Answer::Failed);
    assert_eq!(states(&fleet), [State::Open; 3]);
}

#[tokio::test(start_paused = true)]
async fn a_success_writes_only_when_the_fleet_count_holds_failures() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::default();
    let one = Instance::new(
        &memory,
        config("llm", 5, Duration::from_secs(30)),
        &upstream,
    );
    for _ in 0..100 {
        assert_eq!(one.request().await, Answer::Answered);
    }
    settle().await;
    assert_eq!(
        one.store.stats().writes,
        0,
        "successes with nothing to reset"
    );
    upstream.fail();
    assert_eq!(one.request().await, Answer::Failed);
    settle().await;
    assert_eq!(one.store.stats().writes, 1);
    upstream.recover();
    for _ in 0..100 {
        assert_eq!(one.request().await, Answer::Answered);
    }
    settle().await;
    assert_eq!(one.store.stats().writes, 2, "only the first success resets");
}

#[tokio::test(start_paused = true)]
async fn eight_instances_send_one_probe_per_open_period_and_all_learn_the_result() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    let fleet = fleet_of(8, &memory, &config("llm", 1, open), &upstream);
    let mut transitions: Vec<_> = fleet.iter().map(|i| i.breaker.subscribe()).collect();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    settle().await;
    assert_eq!(states(&fleet), [State::Open; 8]);
    let before = upstream.calls();
    let started = Instant::now();
    // Every instance sends a request every 10 ms for 3 s.
    while started.elapsed() < Duration::from_secs(3) {
        for instance in &fleet {
            instance.request().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes = upstream.calls() - before;
    let periods = (started.elapsed().as_millis() / open.as_millis()) as usize;
    assert!(
        (periods - 1..=periods).contains(&probes),
        "{probes} probes in {periods} open periods: one each"
    );
    // Each probe came after the opening its predecessor's failure wrote
    // had run out.
    for pair in upstream.arrivals()[before..].windows(2) {
        assert!(pair[1] - pair[0] >= open, "two probes within one period");
    }
    let locks: u64 = fleet.iter().map(|i| i.store.stats().probe_locks_won).sum();
    assert_eq!(
        locks as usize, probes,
        "every probe came with the probe lock"
    );

    // The upstream recovers: the next probe closes every instance.
    upstream.recover();
    let calls = upstream.calls();
    'probing: loop {
        assert!(started.elapsed() < Duration::from_secs(10), "never probed");
        for instance in &fleet {
            if instance.request().await == Answer::Answered {
                break 'probing;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settle().await;
    assert_eq!(states(&fleet), [State::Closed; 8]);
    assert_eq!(upstream.calls(), calls + 1, "one probe closed the fleet");
    let shared = transitions
        .iter_mut()
        .filter_map(last)
        .filter(|t| t.to == State::Closed && t.reason == Some(TripReason::Shared))
        .count();
    assert_eq!(shared, 7, "the other seven learnt the result");
}

#[tokio::test(start_paused = true)]
async fn two_successes_close_it_for_all_and_min_open_holds() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let min_open = Duration::from_millis(800);
    let config = Config::builder()
        .name("llm")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_millis(100))
        .min_open(min_open)
        .successes_to_close(2)
        .probes(1)
        .build()
        .unwrap();
    let fleet = fleet_of(3, &memory, &config, &upstream);
    let mut transitions: Vec<_> = fleet.iter().map(|i| i.breaker.subscribe()).collect();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    let opened = Instant::now();
    settle().await;
    // The provider recovers at once; probes would succeed immediately.
    upstream.recover();
    let mut answered = [0; 3];
    while fleet.iter().any(|i| i.state() != State::Closed) {
        assert!(opened.elapsed() < Duration::from_secs(10), "never closed");
        for (n, instance) in fleet.iter().enumerate() {
            if instance.request().await == Answer::Answered {
                answered[n] += 1;
                if answered.iter().sum::<usize>() == 1 {
                    // One success is not evidence enough anywhere.
                    settle().await;
                    assert!(fleet.iter().all(|i| i.state() != State::Closed));
                }
                // Let the fleet hear of it before anyone calls again.
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(opened.elapsed() >= min_open, "closed before min_open");
    assert_eq!(upstream.calls(), 3, "one failure, then exactly two probes");
    let prober = answered.iter().position(|&n| n == 2).expect("one prober");
    for (n, events) in transitions.iter_mut().enumerate() {
        let last = last(events).expect("transitions");
        assert_eq!(last.to, State::Closed);
        if n != prober {
            assert_eq!(answered[n], 0);
            assert_eq!(last.reason, Some(TripReason::Shared), "followed the fleet");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn probe_successes_add_up_across_instances() {
    let memory = MemoryFleet::builder()
        .probe_lease(Duration::from_millis(500))
        .build()
        .unwrap();
    let upstream = Upstream::failing();
    let config = Config::builder()
        .name("llm")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(Duration::from_millis(200))
        .successes_to_close(2)
        .build()
        .unwrap();
    let mut fleet = fleet_of(3, &memory, &config, &upstream);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    settle().await;
    upstream.recover();
    let first = fleet
        .iter()
        .position(|i| i.state() == State::HalfOpen)
        .expect("one instance holds the probe lock");
    // One success: not enough to close, here or anywhere.
    assert_eq!(fleet[first].request().await, Answer::Answered);
    settle().await;
    assert_eq!(fleet[first].state(), State::HalfOpen);
    // That instance goes away mid-round; once its lease runs out, another
    // takes the turn, and its one success is the fleet's second.
    drop(fleet.remove(first));
    let mut transitions: Vec<_> = fleet.iter().map(|i| i.breaker.subscribe()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let second = loop {
        assert!(Instant::now() < deadline, "nobody took the turn");
        if let Some(n) = fleet.iter().position(|i| i.state() == State::HalfOpen) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(fleet[second].request().await, Answer::Answered);
    settle().await;
    assert_eq!(states(&fleet), [State::Closed; 2]);
    assert_eq!(upstream.calls(), 3, "one failure, two probes");
    for events in &mut transitions {
        let last = last(events).expect("closed");
        assert_eq!(last.to, State::Closed);
        // Neither saw two successes: the fleet counted them.
        assert_eq!(last.reason, Some(TripReason::Shared));
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_with_backoff_for_everyone() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let cooldown = Duration::from_millis(100);
    let config = Config::builder()
        .name("llm")
        .trip(ConsecutiveFailures::new(1))
        .cooldown(cooldown)
        .backoff(2.0)
        .build()
        .unwrap();
    let fleet = fleet_of(3, &memory, &config, &upstream);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    tokio::time::sleep(cooldown).await;
    settle().await;
    let mut answers = Vec::new();
    for instance in &fleet {
        answers.push(instance.request().await);
    }
    answers.sort_by_key(|a| *a as u8);
    assert_eq!(
        answers,
        [Answer::Failed, Answer::Refused, Answer::Refused],
        "one probe"
    );
    let failed_at = Instant::now();
    settle().await;
    for instance in &fleet {
        assert_eq!(instance.state(), State::Open);
        let retry_after = instance.breaker.retry_after().expect("open");
        assert!(
            retry_after >= cooldown * 2 - Duration::from_millis(1),
            "{retry_after:?}: no backoff"
        );
    }
    // The next probe, from whichever instance, waits out the longer period.
    let calls = upstream.calls();
    while upstream.calls() == calls {
        for instance in &fleet {
            instance.request().await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next = *upstream.arrivals().last().unwrap();
    assert!(
        next - failed_at >= cooldown * 2,
        "probed after {:?}",
        next - failed_at
    );
}

#[tokio::test(start_paused = true)]
async fn a_prober_that_dies_passes_the_turn_when_its_lease_runs_out() {
    let lease = Duration::from_millis(800);
    let memory = MemoryFleet::builder().probe_lease(lease).build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(200);
    let mut fleet = fleet_of(2, &memory, &config("llm", 1, open), &upstream);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    let opened = Instant::now();
    // Nobody sends a request: whoever wins the probe lock holds it unused.
    tokio::time::sleep(open).await;
    let won_at = opened + open;
    settle().await;
    let winner = fleet
        .iter()
        .position(|i| i.store.stats().probe_locks_won == 1)
        .expect("a probe lock won");
    // The winner dies (its store, task and breaker all gone) mid-probe.
    drop(fleet.remove(winner));
    let survivor = fleet.pop().unwrap();
    upstream.recover();
    let calls = upstream.calls();
    // The survivor keeps refusing while the dead lease runs...
    tokio::time::sleep_until(won_at + lease - Duration::from_millis(10)).await;
    assert_eq!(survivor.request().await, Answer::Refused);
    assert_eq!(survivor.store.stats().probe_locks_won, 0);
    // ...then takes the probe lock and probes.
    tokio::time::sleep_until(won_at + lease).await;
    settle().await;
    assert_eq!(survivor.request().await, Answer::Answered);
    assert_eq!(survivor.store.stats().probe_locks_won, 1);
    assert_eq!(survivor.state(), State::Closed);
    assert_eq!(upstream.calls(), calls + 1, "one probe closed it");
}

#[tokio::test(start_paused = true)]
async fn an_idle_prober_whose_lease_runs_out_unopposed_keeps_the_turn() {
    let lease = Duration::from_millis(200);
    let memory = MemoryFleet::builder().probe_lease(lease).build().unwrap();
    let upstream = Upstream::failing();
    let config = config("llm", 1, Duration::from_millis(100));
    let one = Instance::new(&memory, config.clone(), &upstream);
    assert_eq!(one.request().await, Answer::Failed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert_eq!(one.state(), State::HalfOpen);
    assert_eq!(one.store.stats().probe_locks_won, 1);
    let mut transitions = one.breaker.subscribe();
    // Five leases without a request: each runs out and is taken again.
    tokio::time::sleep(lease * 5).await;
    assert_eq!(one.state(), State::HalfOpen);
    assert!(transitions.try_recv().is_err(), "no transition meanwhile");
    // An instance starting now finds the probe lock held, and refuses.
    let late = Instance::new(&memory, config, &upstream);
    settle().await;
    assert_eq!(late.state(), State::Open);
    assert_eq!(late.request().await, Answer::Refused);
    // A request is the probe; it closes both.
    upstream.recover();
    assert_eq!(one.request().await, Answer::Answered);
    settle().await;
    assert_eq!(one.state(), State::Closed);
    assert_eq!(late.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_attached_late_learns_an_opening_at_once() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_secs(30);
    let early = Instance::new(&memory, config("llm", 1, open), &upstream);
    assert_eq!(early.request().await, Answer::Failed);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // A new instance, and a second breaker of the name on the first one.
    let late = Instance::new(&memory, config("llm", 1, open), &upstream);
    let second = Breaker::new(config("llm", 1, open));
    let mut events = [late.breaker.subscribe(), second.subscribe()];
    assert!(early.store.attach(&second));
    settle().await;
    for (breaker, events) in [&late.breaker, &second].into_iter().zip(&mut events) {
        assert_eq!(breaker.state(), State::Open);
        let event = events.try_recv().expect("opened");
        assert_eq!(event.reason, Some(TripReason::Shared));
        // What is left of the fleet's period (and the hold), not a new one.
        let retry_after = breaker.retry_after().expect("open");
        assert!(
            retry_after <= open - Duration::from_secs(4),
            "{retry_after:?}"
        );
    }
    assert_eq!(late.request().await, Answer::Refused);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_breakers_are_forgotten_and_never_take_the_probe_lock() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(100);
    let mut fleet = fleet_of(2, &memory, &config("llm", 1, open), &upstream);
    // The first instance's breaker opens the fleet, then goes (with its
    // client); its store stays.
    assert_eq!(fleet[0].request().await, Answer::Failed);
    settle().await;
    let Instance { store: idle, .. } = fleet.remove(0);
    let busy = fleet.pop().unwrap();
    for _ in 0..5 {
        // At each period's end the probe lock is this instance's at once: it
        // probes without waiting out a probe lock taken for nothing.
        tokio::time::sleep(open).await;
        settle().await;
        assert_eq!(busy.request().await, Answer::Failed);
    }
    assert_eq!(busy.store.stats().probe_locks_won, 5);
    assert_eq!(idle.stats().probe_locks_won, 0);
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_store_is_gone_stops_sharing() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let fleet = fleet_of(
        2,
        &memory,
        &config("llm", 2, Duration::from_secs(30)),
        &upstream,
    );
    let Instance {
        store,
        breaker: leaver,
        service: leaver_client,
    } = fleet.into_iter().next().unwrap();
    drop(store);
    let stayer = Instance::new(
        &memory,
        config("llm", 2, Duration::from_secs(30)),
        &upstream,
    );
    let one = |client: &Svc| {
        let client = client.clone();
        async move { answer(client.oneshot(()).await) }
    };
    assert_eq!(one(&leaver_client).await, Answer::Failed);
    settle().await;
    assert_eq!(memory.failures("llm"), 0, "nobody carries its writes out");
    assert_eq!(stayer.request().await, Answer::Failed);
    assert_eq!(stayer.request().await, Answer::Failed);
    settle().await;
    assert_eq!(stayer.state(), State::Open);
    assert_eq!(
        leaver.state(),
        State::Closed,
        "it no longer hears the fleet"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_the_oldest_writes_and_no_request_waits() {
    let memory = MemoryFleet::builder()
        .queue_capacity(2)
        .failures_to_open(3)
        .build()
        .unwrap();
    let upstream = Upstream::failing();
    // Locally, five failures in a row trip; the fleet opens at three.
    let config = config("llm", 5, Duration::from_secs(30));
    let fleet = fleet_of(2, &memory, &config, &upstream);
    settle().await;
    // Three failures and a success on one instance before its task runs:
    // each answered at the first poll. The queue keeps the newest two
    // writes (the third failure and the reset).
    let call = |failing: bool| {
        if failing {
            upstream.fail();
        } else {
            upstream.recover();
        }
        let result = now_or_never(fleet[0].service.clone().oneshot(()));
        answer(result.expect("answered at once, without waiting"))
    };
    for _ in 0..3 {
        assert_eq!(call(true), Answer::Failed);
    }
    assert_eq!(call(false), Answer::Answered);
    settle().await;
    let stats = fleet[0].store.stats();
    assert_eq!((stats.writes, stats.dropped_writes), (2, 2));
    // Had the newest been dropped, the count would hold two failures and
    // one more would open the fleet.
    assert_eq!(memory.failures("llm"), 0);
    upstream.fail();
    assert_eq!(fleet[1].request().await, Answer::Failed);
    assert_eq!(fleet[1].request().await, Answer::Failed);
    settle().await;
    assert_eq!(states(&fleet), [State::Closed; 2]);
}

#[tokio::test]
async fn invalid_fleet_settings_are_errors() {
    let field = |b: tower_circuit_breaker::store::memory::MemoryFleetBuilder| match b.build() {
        Err(MemoryFleetError::Config(e)) => e.field().to_owned(),
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(field(MemoryFleet::builder().hold(Duration::ZERO)), "hold");
    assert_eq!(
        field(MemoryFleet::builder().probe_lease(Duration::from_secs(86_401))),
        "probe_lease"
    );
    assert_eq!(
        field(MemoryFleet::builder().failure_window(Duration::from_micros(10))),
        "failure_window"
    );
    assert_eq!(
        field(MemoryFleet::builder().queue_capacity(0)),
        "queue_capacity"
    );
    assert_eq!(
        field(MemoryFleet::builder().failures_to_open(0)),
        "failures_to_open"
    );
    assert_eq!(field(MemoryFleet::builder().quorum(0)), "quorum");
}

#[tokio::test(start_paused = true)]
async fn one_instance_failing_every_call_opens_only_itself_below_the_quorum() {
    let memory = MemoryFleet::builder().quorum(2).build().unwrap();
    let config = config("llm", 3, Duration::from_secs(30));
    // The first instance's own path to the provider is broken; the
    // provider is healthy for the other two.
    let broken = Upstream::failing();
    let healthy = Upstream::default();
    let bad = Instance::new(&memory, config.clone(), &broken);
    let good = fleet_of(2, &memory, &config, &healthy);
    let mut heard = good[0].breaker.subscribe();
    for _ in 0..3 {
        assert_eq!(bad.request().await, Answer::Failed);
        settle().await;
    }
    // Its own breaker opened on its own evidence; the fleet declined it.
    assert_eq!(bad.state(), State::Open);
    assert_eq!(bad.request().await, Answer::Refused);
    for _ in 0..20 {
        for instance in &good {
            assert_eq!(instance.request().await, Answer::Answered);
        }
        settle().await;
    }
    assert_eq!(states(&good), [State::Closed; 2]);
    assert!(heard.try_recv().is_err(), "the others never opened");
    assert_eq!(healthy.calls(), 40);
    // It offered its opening once, and once only.
    let writes = bad.store.stats().writes;
    assert_eq!(writes, 4, "three failures and one opening");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(bad.store.stats().writes, writes);
}

#[tokio::test(start_paused = true)]
async fn failures_from_a_quorum_of_instances_open_all_of_them() {
    let memory = MemoryFleet::builder().quorum(2).build().unwrap();
    let upstream = Upstream::failing();
    let fleet = fleet_of(
        3,
        &memory,
        &config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    // Three failures on one instance: it opens alone.
    for _ in 0..3 {
        assert_eq!(fleet[0].request().await, Answer::Failed);
        settle().await;
    }
    assert_eq!(states(&fleet), [State::Open, State::Closed, State::Closed]);
    // A failure on a second instance, with no success anywhere between:
    // two instances failing, the count past its threshold. All open.
    assert_eq!(fleet[1].request().await, Answer::Failed);
    settle().await;
    assert_eq!(states(&fleet), [State::Open; 3]);
    assert_eq!(fleet[2].request().await, Answer::Refused);
    assert_eq!(upstream.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn openings_from_a_quorum_of_instances_open_the_fleet() {
    // The count alone never opens here: the instances' own breakers do.
    let memory = MemoryFleet::builder()
        .quorum(2)
        .failures_to_open(1_000)
        .build()
        .unwrap();
    let config = config("llm", 2, Duration::from_secs(30));
    let upstream = Upstream::failing();
    let healthy = Upstream::default();
    let fleet = fleet_of(2, &memory, &config, &upstream);
    let third = Instance::new(&memory, config, &healthy);
    let mut heard = third.breaker.subscribe();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    settle().await;
    assert_eq!(states(&fleet), [State::Open, State::Closed]);
    // A success elsewhere starts the count again: the first instance's
    // failures are no longer in it, but its opening (a vote) still runs.
    assert_eq!(third.request().await, Answer::Answered);
    settle().await;
    assert_eq!(memory.failures("llm"), 0);
    assert_eq!(fleet[1].request().await, Answer::Failed);
    assert_eq!(fleet[1].request().await, Answer::Failed);
    settle().await;
    // The second opening found the first's vote: the fleet opened, and the
    // third instance, which never failed, follows it.
    assert_eq!(states(&fleet), [State::Open; 2]);
    assert_eq!(third.state(), State::Open);
    let event = last(&mut heard).expect("the third opened");
    assert_eq!(event.reason, Some(TripReason::Shared));
}

/// A broken instance that crashes after two failures and starts again,
/// over and over, its failures staying in the fleet's count: made again
/// under its name, it is still one instance failing, and the quorum of
/// two keeps the healthy fleet serving. Without a name each restart is a
/// new voter, so its second life and its first make a quorum, and the
/// healthy fleet is opened (what `MemoryFleet::instance` documents).
#[tokio::test(start_paused = true)]
async fn a_crash_looping_instance_makes_a_quorum_alone_only_without_a_name() {
    // Named: four lives of two failures. Unnamed: two failures in its first
    // life, one in its second: three in the count, from two voters.
    for (name, lives) in [(Some("pod-a"), &[2, 2, 2, 2][..]), (None, &[2, 1][..])] {
        let memory = MemoryFleet::builder().quorum(2).build().unwrap();
        let config = config("llm", 3, Duration::from_secs(30));
        let (broken, healthy) = (Upstream::failing(), Upstream::default());
        let good = fleet_of(2, &memory, &config, &healthy);
        for &failures in lives {
            let store = match name {
                Some(name) => memory.named_instance(name),
                None => memory.instance(),
            };
            let bad = Instance::with_store(store, config.clone(), &broken);
            for _ in 0..failures {
                assert_eq!(bad.request().await, Answer::Failed);
                settle().await;
            }
            // The process dies; its failures stay in the fleet's count.
        }
        if name.is_some() {
            assert!(memory.failures("llm") >= 3, "past the count's threshold");
            assert_eq!(states(&good), [State::Closed; 2], "one voter is no quorum");
            for instance in &good {
                assert_eq!(instance.request().await, Answer::Answered);
            }
        } else {
            assert_eq!(states(&good), [State::Open; 2], "two lives, two voters");
        }
    }
}

/// A broken instance whose every life trips its own breaker (its opening
/// declined by the quorum, a vote that runs for its open period), while
/// the healthy instances keep serving between lives: under its name, each
/// life's vote and failures are one instance's; without one, the second
/// life's failures and the first life's vote make a quorum.
#[tokio::test(start_paused = true)]
async fn each_life_of_a_crash_looping_instance_votes_under_its_name() {
    for name in [Some("pod-a"), None] {
        let memory = MemoryFleet::builder().quorum(2).build().unwrap();
        let config = config("llm", 3, Duration::from_secs(30));
        let (broken, healthy) = (Upstream::failing(), Upstream::default());
        let good = fleet_of(2, &memory, &config, &healthy);
        for _ in 0..3 {
            let store = match name {
                Some(name) => memory.named_instance(name),
                None => memory.instance(),
            };
            let bad = Instance::with_store(store, config.clone(), &broken);
            for _ in 0..3 {
                let _ = bad.request().await;
                settle().await;
            }
            if states(&good) != [State::Closed; 2] {
                break;
            }
            assert_eq!(bad.state(), State::Open, "{name:?}: it opened alone");
            for instance in &good {
                assert_eq!(instance.request().await, Answer::Answered, "{name:?}");
            }
            settle().await;
        }
        match name {
            Some(_) => assert_eq!(states(&good), [State::Closed; 2], "one instance's votes"),
            None => assert_eq!(states(&good), [State::Open; 2], "two lives' votes"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_quorum_of_one_opens_the_fleet_on_one_instances_evidence() {
    let memory = MemoryFleet::builder().build().unwrap();
    let broken = Upstream::failing();
    let healthy = Upstream::default();
    let config = config("llm", 3, Duration::from_secs(30));
    let bad = Instance::new(&memory, config.clone(), &broken);
    let good = Instance::new(&memory, config, &healthy);
    for _ in 0..3 {
        assert_eq!(bad.request().await, Answer::Failed);
    }
    settle().await;
    assert_eq!(good.state(), State::Open, "the default: as before quorums");
}

#[tokio::test(start_paused = true)]
async fn a_trip_shares_its_opening_once() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let one = Instance::new(
        &memory,
        config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    settle().await;
    // Three failures before the instance's task runs: one batch of three
    // counts and the opening. The answers to the first two counts
    // ("closed") come back after the breaker opened; they must not make it
    // offer its opening again.
    for _ in 0..3 {
        let result = now_or_never(one.service.clone().oneshot(()));
        assert_eq!(answer(result.expect("at once")), Answer::Failed);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(one.state(), State::Open);
    assert_eq!(one.store.stats().writes, 4, "three counts, one opening");
}

#[tokio::test(start_paused = true)]
async fn several_breakers_of_one_name_on_one_instance_send_one_probe() {
    let memory = MemoryFleet::builder().build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    let config = config("llm", 1, open);
    let store = memory.instance();
    // Three clients of the same provider in one instance, each with its own
    // breaker of the name (as separate layers or registries make them).
    let layers: Vec<CircuitBreakerLayer> = (0..3)
        .map(|_| CircuitBreakerLayer::new(config.clone()))
        .collect();
    for layer in &layers {
        assert!(store.attach(&layer.breaker()));
    }
    let clients: Vec<Svc> = layers
        .iter()
        .map(|l| tower::Layer::layer(l, BoxCloneSyncService::new(upstream.clone())))
        .collect();
    let call = |n: usize| {
        let client = clients[n].clone();
        async move { answer(client.oneshot(()).await) }
    };
    assert_eq!(call(0).await, Answer::Failed);
    settle().await;
    assert!(layers.iter().all(|l| l.breaker().state() == State::Open));
    for round in 1..=3 {
        // The period ends; this instance wins the probe lock; every client asks.
        tokio::time::sleep(open).await;
        settle().await;
        let half_open = layers
            .iter()
            .filter(|l| l.breaker().state() == State::HalfOpen)
            .count();
        assert_eq!(half_open, 1, "round {round}: one breaker probes");
        let before = upstream.calls();
        for n in 0..3 {
            call(n).await;
        }
        assert_eq!(upstream.calls(), before + 1, "round {round}: one probe");
        settle().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_active_prober_probes_as_soon_as_its_instance_wins_the_probe_lock() {
    let hold = Duration::from_secs(2);
    let memory = MemoryFleet::builder().hold(hold).build().unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    let fleet = fleet_of(2, &memory, &config("llm", 1, open), &upstream);
    for instance in &fleet {
        instance.breaker.probe_actively(
            upstream.clone(),
            || (),
            tower_circuit_breaker::classify::ErrorsAsFailures,
        );
    }
    assert_eq!(fleet[0].request().await, Answer::Failed);
    let opened = Instant::now();
    settle().await;
    // The fleet's period ends at 300 ms; a breaker following it keeps its
    // own open for the hold beyond, waiting for word. The winner's word
    // comes at once: its prober must not sleep out the hold.
    tokio::time::sleep(open + Duration::from_millis(50)).await;
    let probes: Vec<Instant> = upstream.arrivals()[1..].to_vec();
    assert_eq!(probes.len(), 1, "one probe, from the probe lock's winner");
    assert!(
        probes[0] - opened < open + Duration::from_millis(20),
        "probed {:?} after the opening",
        probes[0] - opened
    );
}

#[test]
fn a_fleet_needs_a_tokio_runtime() {
    assert!(matches!(
        MemoryFleet::builder().build(),
        Err(MemoryFleetError::NoRuntime)
    ));
}

#[tokio::test(start_paused = true)]
async fn the_fleets_state_names_the_prober_and_the_voters() {
    let memory = MemoryFleet::builder()
        .quorum(2)
        .probe_lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let upstream = Upstream::failing();
    let config = config("llm", 1, Duration::from_millis(300));
    let east = Instance::with_store(memory.named_instance("east"), config.clone(), &upstream);
    let west = Instance::with_store(memory.named_instance("west"), config, &upstream);
    assert_eq!(east.request().await, Answer::Failed);
    settle().await;
    let steer = Fleet::from(&east.store);
    let state = steer.state("llm").await.unwrap();
    assert_eq!(
        state.votes,
        ["east"],
        "east's opening was declined: {state:?}"
    );
    assert_eq!(state.failing, ["east"]);
    assert_eq!(west.request().await, Answer::Failed);
    settle().await;
    let state = steer.state("llm").await.unwrap();
    let opening = state.opening.expect("a quorum opened it");
    assert_eq!(opening.generation, 1);
    // Once the period ends, one of them holds the probe lock.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let state = steer.state("llm").await.unwrap();
    let (prober, lease) = state.prober.expect("a prober");
    assert!(
        [east.store.instance(), west.store.instance()].contains(&prober.as_str()),
        "{prober}"
    );
    assert!(prober.starts_with("east/") || prober.starts_with("west/"));
    assert!(lease <= Duration::from_secs(5) && lease > Duration::ZERO);
}

/// The fleet conformance suite (`tests/common/fleet_conformance.rs`), on
/// the memory fleet and paused time; the Redis store runs the same
/// scenarios in `tests/redis/conformance.rs`.
mod conformance {
    use std::time::Duration;

    use crate::common::fleet_conformance::Backend;
    use tower_circuit_breaker::store::memory::MemoryFleet;
    use tower_circuit_breaker::store::Fleet;

    struct Memory;

    impl Backend for Memory {
        fn fleet(&self, quorum: u32) -> Box<dyn Fn() -> Fleet + '_> {
            let memory = MemoryFleet::builder()
                .quorum(quorum)
                .probe_lease(Duration::from_millis(800))
                .hold(Duration::from_millis(1300))
                .build()
                .expect("a valid fleet");
            Box::new(move || Fleet::from(memory.instance()))
        }
    }

    crate::common::fleet_conformance::conformance_tests!(
        #[tokio::test(start_paused = true)]
        Memory
    );
}
