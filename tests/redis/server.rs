//! One breaker across a fleet, against a real `redis-server` on a free
//! loopback port (started and stopped here; a missing binary fails with a
//! message saying what to install). Each "instance" is its own
//! `RedisStore` (its own connections) with its own local breaker of the
//! same name, as separate processes would be.
//!
//! Redis expiry runs on real time, so these tests use short real durations,
//! wait for conditions with a generous deadline, and assert counts and
//! states, never how long something took (except lower bounds, which a
//! slow machine cannot break).

use crate::common::redis as redis_support;
use crate::common::Upstream;

use futures_util::FutureExt;
use std::time::Duration;

use redis_support::{
    breaker_key, commands_served, connect, eventually, eventually_within, free_port, next_event,
    redis_now_ms, shard_base, GarbageServer, RedisServer, StallingProxy,
};
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::{ConsecutiveFailures, TripReason};
use tower_circuit_breaker::store::redis::{RedisStore, RedisStoreBuilder, StoreError, StoreEvent};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, Config, State};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Answered,
    Failed,
    Refused,
}

type Svc =
    tower_circuit_breaker::CircuitBreaker<tower::util::BoxCloneSyncService<(), (), BoxError>>;

struct Instance {
    store: RedisStore,
    breaker: Breaker,
    service: Svc,
}

impl Instance {
    fn new(store: RedisStoreBuilder, config: Config, upstream: &Upstream<()>) -> Self {
        let store = store.build().expect("a valid store");
        let layer = CircuitBreakerLayer::new(config);
        let breaker = layer.breaker();
        assert!(store.attach(&breaker));
        let inner = tower::util::BoxCloneSyncService::new(upstream.clone());
        let service = tower::Layer::layer(&layer, inner);
        Instance {
            store,
            breaker,
            service,
        }
    }

    /// One request, and what became of it.
    async fn request(&mut self) -> Answer {
        let service = self
            .service
            .ready()
            .await
            .expect("never an error from poll_ready");
        match service.call(()).await {
            Ok(()) => Answer::Answered,
            Err(e) if e.is::<CircuitOpen>() => Answer::Refused,
            Err(_) => Answer::Failed,
        }
    }

    fn state(&self) -> State {
        self.breaker.state()
    }

    /// Sends a request every `pause` until the breaker is closed; fails
    /// after 10 s saying `what` went wrong.
    async fn request_until_closed(&mut self, pause: Duration, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.state() != State::Closed {
            assert!(Instant::now() < deadline, "{what}");
            self.request().await;
            tokio::time::sleep(pause).await;
        }
    }
}

fn store(server: &RedisServer, prefix: &str) -> RedisStoreBuilder {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .refresh_interval(Duration::from_millis(200))
        .probe_lease(Duration::from_millis(800))
        .hold(Duration::from_millis(700))
        .command_timeout(Duration::from_millis(200))
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

/// Waits until every store has read the shared state once (its first
/// refresh, made when the breaker was attached).
async fn synced(instances: &[Instance]) {
    eventually("every instance refreshed once", || {
        instances.iter().all(|i| i.store.stats().refreshes > 0)
    })
    .await;
}

/// `n` instances on `server` under `prefix`, each with its breaker under
/// `config` in front of `upstream`, every one synced.
async fn synced_fleet(
    n: usize,
    server: &RedisServer,
    prefix: &str,
    config: &Config,
    upstream: &Upstream<()>,
) -> Vec<Instance> {
    synced_fleet_of(n, || store(server, prefix), config, upstream).await
}

/// `n` instances, each with a store built by `store` and its breaker
/// under `config` in front of `upstream`, every one synced.
async fn synced_fleet_of(
    n: usize,
    store: impl Fn() -> RedisStoreBuilder,
    config: &Config,
    upstream: &Upstream<()>,
) -> Vec<Instance> {
    let fleet: Vec<Instance> = (0..n)
        .map(|_| Instance::new(store(), config.clone(), upstream))
        .collect();
    synced(&fleet).await;
    fleet
}

/// Waits until every instance's breaker is in `state`.
async fn all_in(fleet: &[Instance], state: State, what: &str) {
    eventually(what, || fleet.iter().all(|i| i.state() == state)).await;
}

/// Makes `server` hold back every write (scripts included) for `ms`
/// milliseconds while it answers reads at once: busy, not down.
async fn pause_writes(server: &RedisServer, ms: u64) {
    let mut conn = connect(&server.url()).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// No instance of `fleet` has taken Redis for down.
fn never_down(fleet: &[Instance]) {
    for instance in fleet {
        let stats = instance.store.stats();
        assert_eq!(stats.unavailable_episodes, 0, "{stats:?}");
    }
}

#[tokio::test]
async fn failures_split_across_three_instances_open_all_three_by_pubsub() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    // Refreshing once a minute: within this test, only pub/sub can tell an
    // instance of the opening.
    let mut fleet: Vec<Instance> = (0..3)
        .map(|_| {
            let builder = store(&server, "split").refresh_interval(Duration::from_secs(60));
            Instance::new(
                builder,
                config("llm", 3, Duration::from_secs(30)),
                &upstream,
            )
        })
        .collect();
    synced(&fleet).await;
    eventually("every instance subscribed", || {
        fleet.iter().all(|i| i.store.stats().messages > 0)
    })
    .await;
    // Subscribing makes one more refresh (messages may have been missed
    // before): wait until the counts stop moving, then count.
    let count = |fleet: &[Instance]| -> Vec<u64> {
        fleet.iter().map(|i| i.store.stats().refreshes).collect()
    };
    let mut refreshes = count(&fleet);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = count(&fleet);
        if now == refreshes {
            break;
        }
        refreshes = now;
    }
    let mut transitions: Vec<_> = fleet.iter().map(|i| i.breaker.subscribe()).collect();
    for instance in &mut fleet {
        assert_eq!(instance.request().await, Answer::Failed);
        // Each failure is counted before the next instance fails, as
        // failures spread over time would be.
        let writes = instance.store.stats().writes;
        eventually("the failure written", || {
            instance.store.stats().writes > writes
        })
        .await;
    }
    all_in(&fleet, State::Open, "all three open").await;
    for ((instance, events), refreshes) in fleet.iter_mut().zip(&mut transitions).zip(refreshes) {
        assert_eq!(
            instance.store.stats().refreshes,
            refreshes,
            "learnt without a refresh"
        );
        let event = events.try_recv().expect("one transition each");
        assert_eq!(event.to, State::Open);
        // No instance saw three failures itself: the fleet decided.
        assert_eq!(event.reason, Some(TripReason::Shared));
        assert!(
            instance.request().await == Answer::Refused,
            "refused at once"
        );
    }
    assert_eq!(upstream.calls(), 3);
}

#[tokio::test]
async fn eight_instances_send_at_most_one_probe_per_open_period() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    let mut fleet = synced_fleet(8, &server, "eight", &config("llm", 1, open), &upstream).await;
    assert_eq!(fleet[0].request().await, Answer::Failed);
    all_in(&fleet, State::Open, "all eight open").await;
    let before = upstream.calls();
    let started = Instant::now();
    // Every instance sends a request every 10 ms for 3 s.
    while started.elapsed() < Duration::from_secs(3) {
        for instance in &mut fleet {
            instance.request().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes = upstream.calls() - before;
    let periods = started.elapsed().as_millis() / open.as_millis() + 1;
    eprintln!("8 instances: {probes} probes in {periods} open periods");
    assert!(probes >= 1, "the fleet probes");
    assert!(
        probes as u128 <= periods,
        "{probes} probes in {periods} periods: more than one per period"
    );
    // One probe per period, not merely as many probes as periods: each
    // comes after the opening its predecessor's failure wrote had run out.
    let arrivals = upstream.arrivals();
    for pair in arrivals[before..].windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= open - Duration::from_millis(10),
            "two probes {gap:?} apart, within one open period"
        );
    }
    let locks: u64 = fleet.iter().map(|i| i.store.stats().probe_locks_won).sum();
    assert!(locks as usize >= probes, "every probe came with the lock");
}

#[tokio::test]
async fn two_successes_close_it_for_all_and_min_open_holds() {
    let server = RedisServer::start();
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
    let mut fleet = synced_fleet(3, &server, "close", &config, &upstream).await;
    let mut closings = fleet[2].breaker.subscribe();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    let opened = Instant::now();
    all_in(&fleet, State::Open, "all open").await;
    // The provider recovers at once; probes would succeed immediately.
    upstream.recover();
    let mut successes = 0;
    while successes < 2 {
        for instance in &mut fleet[..2] {
            if instance.request().await == Answer::Answered {
                successes += 1;
                if successes == 1 {
                    // One success is not evidence enough anywhere.
                    assert!(fleet.iter().all(|i| i.state() != State::Closed));
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    all_in(&fleet, State::Closed, "all three closed").await;
    assert!(
        opened.elapsed() >= min_open,
        "closed before min_open had passed"
    );
    assert_eq!(upstream.calls(), 3, "one failure, then exactly two probes");
    // The third instance never called the upstream: it followed the fleet.
    let mut last = None;
    while let Ok(t) = closings.try_recv() {
        last = Some(t);
    }
    let last = last.expect("the third instance saw transitions");
    assert_eq!(last.to, State::Closed);
    assert_eq!(last.reason, Some(TripReason::Shared));
}

#[tokio::test]
async fn a_prober_that_dies_frees_the_probe_lock_by_expiry() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let config = config("llm", 1, Duration::from_millis(200));
    let mut fleet = synced_fleet(2, &server, "dies", &config, &upstream).await;
    assert_eq!(fleet[0].request().await, Answer::Failed);
    all_in(&fleet, State::Open, "both open").await;
    // Nobody sends a request: whoever wins the lock when the period ends
    // holds it without probing.
    eventually("a lock won", || {
        fleet.iter().any(|i| i.store.stats().probe_locks_won > 0)
    })
    .await;
    let winner = fleet
        .iter()
        .position(|i| i.store.stats().probe_locks_won > 0)
        .unwrap();
    // The winner dies (its store, task and breaker all gone) mid-probe.
    drop(fleet.remove(winner));
    let mut survivor = fleet.pop().unwrap();
    let won_before = survivor.store.stats().probe_locks_won;
    let calls = upstream.calls();
    upstream.recover();
    // The survivor keeps refusing while the dead lease runs, then takes
    // the lock and probes.
    survivor
        .request_until_closed(Duration::from_millis(10), "the survivor never probed")
        .await;
    assert!(survivor.store.stats().probe_locks_won > won_before);
    assert_eq!(upstream.calls(), calls + 1, "one probe closed it");
}

#[tokio::test]
async fn a_lock_holder_cut_off_by_a_redis_stall_races_for_the_lock_again() {
    let server = RedisServer::start_debuggable();
    let upstream = Upstream::failing();
    let config = config("llm", 1, Duration::from_millis(100));
    let mut fleet = synced_fleet(2, &server, "stall", &config, &upstream).await;
    let mut events: Vec<_> = fleet.iter().map(|i| i.store.subscribe()).collect();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    // Nobody sends a request: whoever wins the lock holds it, renewing its
    // lease (800 ms).
    eventually("a lock won", || {
        fleet.iter().any(|i| i.store.stats().probe_locks_won > 0)
    })
    .await;
    // Redis stalls for longer than the lease: the holder's renewal goes
    // unanswered, and its lock runs out in Redis meanwhile.
    let mut conn = connect(&server.url()).await;
    redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(1.5)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEBUG SLEEP");
    for events in &mut events {
        loop {
            if next_event(events).await == StoreEvent::Restored {
                break;
            }
        }
    }
    // Both race for the lock again: one holds it, the other hears so and
    // stays open, so a request to each sends one probe between them.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let calls = upstream.calls();
    let mut answers = vec![fleet[0].request().await, fleet[1].request().await];
    answers.sort_by_key(|a| *a as u8);
    assert_eq!(upstream.calls(), calls + 1, "one probe: {answers:?}");
    assert_eq!(answers, [Answer::Failed, Answer::Refused]);
}

#[tokio::test]
async fn an_idle_prober_whose_lease_runs_out_unopposed_stays_half_open() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let lease = Duration::from_millis(200);
    let mut one = Instance::new(
        store(&server, "idle").probe_lease(lease).instance("solo"),
        config("llm", 1, Duration::from_millis(100)),
        &upstream,
    );
    synced(std::slice::from_ref(&one)).await;
    assert_eq!(one.request().await, Answer::Failed);
    eventually("half-open with the lock", || {
        one.state() == State::HalfOpen && one.store.stats().probe_locks_won == 1
    })
    .await;
    let mut transitions = one.breaker.subscribe();
    // Five leases without a request: each runs out and is taken again.
    tokio::time::sleep(lease * 5).await;
    let mut conn = connect(&server.url()).await;
    // Between a lease's end and its retaking the lock is free for a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(breaker_key("idle", "llm", "probe_lock"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if holder.is_some_and(|h| h.starts_with("solo-")) {
            break;
        }
        assert!(Instant::now() < deadline, "the lock was never taken again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(one.state(), State::HalfOpen);
    assert!(
        transitions.try_recv().is_err(),
        "no transition while nobody else wanted the lock"
    );
    // A request is the probe.
    upstream.recover();
    assert_eq!(one.request().await, Answer::Answered);
    assert_eq!(one.state(), State::Closed);
}

#[tokio::test]
async fn a_fleet_period_from_redis_never_outlasts_max_open() {
    let server = RedisServer::start();
    // Someone wrote an opening of about three years into Redis, and into
    // the index.
    let mut conn = connect(&server.url()).await;
    let years = 100_000_000_000u64;
    let until = redis_now_ms(&mut conn).await + years;
    let shard = shard_base("forever", "llm");
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(breaker_key("forever", "llm", "record"))
        .arg(&["gen", "1", "attempt", "0", "ok", "0"][..])
        .cmd("SET")
        .arg(breaker_key("forever", "llm", "wait"))
        .arg(1)
        .arg("PX")
        .arg(years)
        .cmd("HSET")
        .arg(format!("{shard}:index"))
        .arg("llm")
        .arg(format!("o 7 1 0 {until} {until}"))
        .cmd("SET")
        .arg(format!("{shard}:version"))
        .arg(7)
        .query_async(&mut conn)
        .await
        .unwrap();
    let max_open = Duration::from_secs(2);
    let config = Config::builder()
        .name("llm")
        .max_open(max_open)
        .cooldown(Duration::from_secs(1))
        .build()
        .unwrap();
    let hold = Duration::from_millis(700);
    let one = Instance::new(
        store(&server, "forever").hold(hold),
        config,
        &Upstream::default(),
    );
    eventually("the fleet's opening adopted", || one.state() == State::Open).await;
    let adopted = Instant::now();
    let retry_after = one.breaker.retry_after().expect("open");
    assert!(
        retry_after <= max_open + hold,
        "held open for {retry_after:?}, past max_open and the hold"
    );
    // Refreshes keep reading the same opening; they do not extend it.
    eventually("the breaker leaves open", || one.state() != State::Open).await;
    assert!(adopted.elapsed() <= max_open + hold + Duration::from_secs(1));
}

#[tokio::test]
async fn a_key_holding_foreign_data_is_skipped_and_the_others_still_share() {
    let server = RedisServer::start();
    // Another application's string where a breaker's record would be.
    let mut conn = connect(&server.url()).await;
    let _: () = redis::cmd("SET")
        .arg(breaker_key("poison", "bad", "record"))
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    let upstream = Upstream::failing();
    let open = Duration::from_secs(30);
    let mut first = Vec::new();
    let mut second = Vec::new();
    for name in ["bad", "good"] {
        first.push(Instance::new(
            store(&server, "poison"),
            config(name, 1, open),
            &upstream,
        ));
        second.push(Instance::new(
            store(&server, "poison"),
            config(name, 1, open),
            &upstream,
        ));
    }
    synced(&first).await;
    synced(&second).await;
    // The failure's script meets the foreign data.
    assert_eq!(first[0].request().await, Answer::Failed);
    eventually("a key error counted", || {
        first[0].store.stats().key_errors > 0
    })
    .await;
    assert!(
        first[0].store.is_available(),
        "one key does not take Redis down"
    );
    assert_eq!(first[1].request().await, Answer::Failed);
    eventually("the good breaker's opening shared", || {
        second[1].state() == State::Open
    })
    .await;
    assert_eq!(second[0].state(), State::Closed);
}

#[tokio::test]
async fn a_probe_lock_without_expiry_is_given_one_and_the_fleet_probes_again() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let lease = Duration::from_millis(300);
    let mut one = Instance::new(
        store(&server, "nolease").probe_lease(lease),
        config("llm", 1, Duration::from_millis(200)),
        &upstream,
    );
    synced(std::slice::from_ref(&one)).await;
    assert_eq!(one.request().await, Answer::Failed);
    eventually("open", || one.state() == State::Open).await;
    // Someone takes the lock for good, without an expiry.
    let mut conn = connect(&server.url()).await;
    let _: () = redis::cmd("SET")
        .arg(breaker_key("nolease", "llm", "probe_lock"))
        .arg("intruder")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The script gives the lock a lease; once it ends, this instance probes.
    upstream.recover();
    one.request_until_closed(
        Duration::from_millis(20),
        "the intruder's lock held the fleet open",
    )
    .await;
    assert!(one.store.stats().probe_locks_won >= 1);
}

#[tokio::test]
async fn killed_redis_leaves_requests_local_and_a_restart_resyncs() {
    let mut server = RedisServer::start();
    let upstream = Upstream::default();
    let mut fleet: Vec<Instance> = (0..2)
        .map(|_| {
            Instance::new(
                store(&server, "kill"),
                config("llm", 2, Duration::from_secs(30)),
                &upstream,
            )
        })
        .collect();
    synced(&fleet).await;
    let mut events: Vec<_> = fleet.iter().map(|i| i.store.subscribe()).collect();
    server.kill();
    for events in &mut events {
        let event = next_event(events).await;
        assert!(matches!(event, StoreEvent::Unavailable { .. }), "{event:?}");
    }
    // Requests go on, each answered at the first poll: nothing waits on
    // Redis.
    for instance in &mut fleet {
        for _ in 0..50 {
            let ready = instance.service.ready().now_or_never();
            let service = ready.expect("ready at once").expect("no error");
            let answer = service.call(()).now_or_never();
            assert!(matches!(answer, Some(Ok(()))));
        }
    }
    // One instance trips on its own while Redis is away.
    upstream.fail();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    assert_eq!(fleet[0].state(), State::Open);
    assert_eq!(fleet[1].state(), State::Closed, "nobody told the other");
    assert!(fleet.iter().all(|i| !i.store.is_available()));
    assert_eq!(
        fleet[0].store.stats().unavailable_episodes,
        1,
        "one event per episode"
    );

    server.restart();
    for events in &mut events {
        let event = next_event(events).await;
        assert_eq!(event, StoreEvent::Restored);
    }
    // The opening made meanwhile is shared once Redis is back.
    eventually("the other instance opened too", || {
        fleet[1].state() == State::Open
    })
    .await;
    assert!(fleet[1].request().await == Answer::Refused);
    assert_eq!(fleet[0].store.stats().unavailable_episodes, 1);
}

#[tokio::test]
async fn a_slow_redis_blocks_no_request_and_counts_as_unavailable_until_it_answers() {
    let server = RedisServer::start_debuggable();
    let upstream = Upstream::default();
    let mut instance = Instance::new(
        store(&server, "slow"),
        config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    synced(std::slice::from_ref(&instance)).await;
    let mut events = instance.store.subscribe();
    // Redis stops answering for two seconds (ten command timeouts).
    let sleeper = tokio::spawn({
        let url = server.url();
        async move {
            let mut conn = connect(&url).await;
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(2)
                .query_async::<()>(&mut conn)
                .await
        }
    });
    let event = next_event(&mut events).await;
    assert!(matches!(event, StoreEvent::Unavailable { .. }), "{event:?}");
    // Failures and successes meanwhile: each answered at the first poll.
    upstream.fail();
    for _ in 0..3 {
        let service = instance
            .service
            .ready()
            .now_or_never()
            .expect("ready at once")
            .expect("no error");
        assert!(matches!(service.call(()).now_or_never(), Some(Err(_))));
    }
    assert_eq!(
        instance.state(),
        State::Open,
        "tripped on its local breaker"
    );
    sleeper.await.unwrap().expect("DEBUG SLEEP");
    assert_eq!(next_event(&mut events).await, StoreEvent::Restored);
    assert_eq!(instance.store.stats().unavailable_episodes, 1);
}

#[tokio::test]
async fn a_connection_gone_silent_is_replaced_once_redis_answers_again() {
    let server = RedisServer::start();
    let proxy = StallingProxy::start(server.port);
    let upstream = Upstream::default();
    let instance = Instance::new(
        RedisStore::builder(proxy.url())
            .prefix("silent")
            .refresh_interval(Duration::from_millis(200))
            .command_timeout(Duration::from_millis(200)),
        config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    synced(std::slice::from_ref(&instance)).await;
    let mut events = instance.store.subscribe();
    // The host behind the address vanishes without a reset: the
    // connection stays open and nothing comes back.
    proxy.stall();
    let event = next_event(&mut events).await;
    assert!(matches!(event, StoreEvent::Unavailable { .. }), "{event:?}");
    // Redis answers at that address again; the silent connection never
    // will.
    proxy.heal();
    assert_eq!(next_event(&mut events).await, StoreEvent::Restored);
    assert!(instance.store.is_available());
}

#[tokio::test]
async fn a_burst_of_attachments_learns_the_fleet_from_the_index_with_no_read_per_key() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let slow_refresh =
        |server: &RedisServer| store(server, "burst").refresh_interval(Duration::from_secs(3_600));
    // Another instance has opened the last key for the fleet.
    let mut tripper = Instance::new(
        slow_refresh(&server),
        config("k299", 1, Duration::from_secs(30)),
        &upstream,
    );
    synced(std::slice::from_ref(&tripper)).await;
    assert_eq!(tripper.request().await, Answer::Failed);
    eventually("the opening written", || tripper.store.stats().writes > 0).await;
    let before = commands_served(&server.url()).await;

    // 300 breakers attached at once, as a registry warming up attaches them.
    let store = slow_refresh(&server).build().unwrap();
    let breakers: Vec<Breaker> = (0..300)
        .map(|i| Breaker::new(config(&format!("k{i}"), 1, Duration::from_secs(30))))
        .collect();
    for breaker in &breakers {
        assert!(store.attach(breaker));
    }
    // Learnt at once, not at the next refresh an hour away.
    eventually("the fleet's opening learnt on attachment", || {
        breakers[299].state() == State::Open
    })
    .await;
    assert!(breakers[..299].iter().all(|b| b.state() == State::Closed));
    // What the new instance cost Redis: the shards' versions, the one
    // shard with something in it, its subscription, script loads; not a
    // read per key (300 would be 900 commands).
    let served = commands_served(&server.url()).await - before;
    assert!(served <= 16, "{served} commands");
    // Keys attached to a synced instance learn their state from its view.
    let late = Breaker::new(config("k299", 1, Duration::from_secs(30)));
    assert!(store.attach(&late));
    eventually("a late key learnt the opening", || {
        late.state() == State::Open
    })
    .await;
    let served = commands_served(&server.url()).await - before;
    assert!(served <= 17, "{served} commands");
}

#[tokio::test]
async fn hostile_names_stay_in_their_own_breakers() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let long = "x".repeat(10_000);
    let names = [
        "a:b",
        "a:*",
        "*",
        "{a}",
        "a}{b",
        "{}",
        "line\nbreak",
        "open 1 2 3 a",
        "a b",
        long.as_str(),
    ];
    let fleet = || -> Vec<Instance> {
        names
            .iter()
            .map(|n| {
                let config = config(n, 1, Duration::from_secs(30));
                Instance::new(store(&server, "hostile"), config, &upstream)
            })
            .collect()
    };
    let mut first = fleet();
    let second = fleet();
    synced(&first).await;
    synced(&second).await;
    // Trip them one at a time; each time exactly that name opens elsewhere.
    for (i, name) in names.iter().enumerate() {
        assert_eq!(first[i].request().await, Answer::Failed);
        eventually(&format!("{name:?} open on the other instance"), || {
            second[i].state() == State::Open
        })
        .await;
        for (j, other) in second.iter().enumerate() {
            let expected = if j <= i { State::Open } else { State::Closed };
            assert_eq!(
                other.state(),
                expected,
                "{:?} after tripping {name:?}",
                names[j]
            );
        }
    }
    // Every key lives under the prefix, with a shard's hash tag, and each
    // breaker's keys under its own escaped name, which no name escapes.
    let mut conn = connect(&server.url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut breakers = std::collections::HashSet::new();
    for key in &keys {
        assert!(key.starts_with("hostile:{hostile:"), "{key}");
        let tag_end = key.find('}').unwrap();
        let tag = &key["hostile:{".len()..tag_end];
        assert!(tag.ends_with("/16"), "{key}");
        let rest: Vec<&str> = key[tag_end + 1..].split(':').collect();
        match rest.as_slice() {
            ["", "index" | "version"] => {}
            ["", name, _part] => {
                assert!(!name.contains(['{', '}', '*', ' ', '\n']), "{key}");
                breakers.insert(name.to_string());
            }
            _ => panic!("a key out of place: {key}"),
        }
    }
    assert_eq!(breakers.len(), names.len(), "one place per breaker");
}

#[tokio::test]
async fn a_success_writes_only_when_the_fleet_count_holds_failures() {
    let server = RedisServer::start();
    let upstream = Upstream::default();
    let mut one = Instance::new(
        store(&server, "writes").refresh_interval(Duration::from_secs(60)),
        config("llm", 5, Duration::from_secs(30)),
        &upstream,
    );
    synced(std::slice::from_ref(&one)).await;
    for _ in 0..100 {
        assert_eq!(one.request().await, Answer::Answered);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        one.store.stats().writes,
        0,
        "successes with nothing to reset"
    );
    upstream.fail();
    assert_eq!(one.request().await, Answer::Failed);
    eventually("the failure written", || one.store.stats().writes == 1).await;
    upstream.recover();
    for _ in 0..100 {
        assert_eq!(one.request().await, Answer::Answered);
    }
    eventually("one reset written", || one.store.stats().writes == 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(one.store.stats().writes, 2, "only the first success resets");
}

#[tokio::test]
async fn a_redis_answering_garbage_counts_as_down_and_requests_go_on() {
    let garbage = GarbageServer::start();
    let upstream = Upstream::default();
    let builder = RedisStore::builder(format!("redis://127.0.0.1:{}", garbage.port))
        .refresh_interval(Duration::from_millis(100))
        .command_timeout(Duration::from_millis(200))
        .hold(Duration::from_millis(700));
    let mut instance = Instance::new(
        builder,
        config("llm", 1, Duration::from_secs(30)),
        &upstream,
    );
    let mut events = instance.store.subscribe();
    let event = next_event(&mut events).await;
    assert!(matches!(event, StoreEvent::Unavailable { .. }), "{event:?}");
    assert!(!instance.store.is_available());
    for _ in 0..10 {
        assert_eq!(instance.request().await, Answer::Answered);
    }
}

#[tokio::test]
async fn writes_while_redis_is_down_are_dropped_and_counted() {
    // Nobody listens on this port: Redis is down from the start.
    let port = free_port();
    let upstream = Upstream::failing();
    let builder = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .queue_capacity(4)
        .refresh_interval(Duration::from_millis(50))
        .command_timeout(Duration::from_millis(100))
        .hold(Duration::from_millis(350))
        .failures_to_open(1000);
    let mut instance = Instance::new(
        builder,
        config("llm", 1000, Duration::from_secs(30)),
        &upstream,
    );
    let mut events = instance.store.subscribe();
    assert!(matches!(
        next_event(&mut events).await,
        StoreEvent::Unavailable { .. }
    ));
    for _ in 0..10 {
        assert_eq!(instance.request().await, Answer::Failed);
    }
    eventually("every write dropped", || {
        instance.store.stats().dropped_writes == 10
    })
    .await;
    assert_eq!(instance.store.stats().writes, 0);
}

/// Two synced instances under `prefix` (2 failures open for 200 ms);
/// Redis killed, both told so; then the first instance tripped by a
/// failing upstream while Redis is away.
async fn tripped_while_redis_is_down(
    prefix: &str,
) -> (
    RedisServer,
    Upstream<()>,
    Vec<Instance>,
    Vec<tokio::sync::broadcast::Receiver<StoreEvent>>,
) {
    let mut server = RedisServer::start();
    let upstream = Upstream::default();
    let config = config("llm", 2, Duration::from_millis(200));
    let mut fleet = synced_fleet(2, &server, prefix, &config, &upstream).await;
    let mut events: Vec<_> = fleet.iter().map(|i| i.store.subscribe()).collect();
    server.kill();
    for events in &mut events {
        assert!(matches!(
            next_event(events).await,
            StoreEvent::Unavailable { .. }
        ));
    }
    upstream.fail();
    assert_eq!(fleet[0].request().await, Answer::Failed);
    assert_eq!(fleet[0].request().await, Answer::Failed);
    assert_eq!(fleet[0].state(), State::Open);
    (server, upstream, fleet, events)
}

#[tokio::test]
async fn an_outage_seen_and_over_while_redis_was_down_does_not_open_the_fleet_later() {
    let (mut server, upstream, mut fleet, mut events) = tripped_while_redis_is_down("stale").await;
    // The first instance probes and closes, all while Redis is away.
    upstream.recover();
    fleet[0]
        .request_until_closed(Duration::from_millis(20), "never closed locally")
        .await;
    server.restart();
    for events in &mut events {
        assert_eq!(next_event(events).await, StoreEvent::Restored);
    }
    // A few refreshes later nobody has opened: the old failures stayed local.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fleet[0].state(), State::Closed);
    assert_eq!(fleet[1].state(), State::Closed);
    assert_eq!(fleet[1].request().await, Answer::Answered);
}

#[tokio::test]
async fn an_opening_whose_period_ended_while_redis_was_down_is_not_shared_later() {
    let (mut server, upstream, mut fleet, mut events) = tripped_while_redis_is_down("ended").await;
    // The first instance's open period ends with no request to probe.
    upstream.recover();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fleet[0].state(), State::HalfOpen);
    server.restart();
    for events in &mut events {
        assert_eq!(next_event(events).await, StoreEvent::Restored);
    }
    // A few refreshes later the other instance is still closed: an
    // outage that may be over was not replayed to the fleet.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fleet[1].state(), State::Closed);
    assert_eq!(fleet[1].request().await, Answer::Answered);
    // The first probes on its own next request, and closes.
    assert_eq!(fleet[0].request().await, Answer::Answered);
    assert_eq!(fleet[0].state(), State::Closed);
}

#[tokio::test]
async fn invalid_store_settings_are_errors() {
    let bad = |builder: RedisStoreBuilder, field: &str| match builder.build() {
        Err(StoreError::Config(e)) => assert_eq!(e.field(), field),
        other => panic!("expected a config error on {field}, got {other:?}"),
    };
    let base = || RedisStore::builder("redis://127.0.0.1:1");
    bad(base().prefix("a{b}"), "prefix");
    bad(base().prefix(""), "prefix");
    bad(base().queue_capacity(0), "queue_capacity");
    bad(base().failures_to_open(0), "failures_to_open");
    bad(base().refresh_interval(Duration::ZERO), "refresh_interval");
    bad(
        base()
            .hold(Duration::from_millis(100))
            .command_timeout(Duration::from_millis(100)),
        "hold",
    );
    assert!(matches!(
        RedisStore::builder("not a url").build(),
        Err(StoreError::Url { .. })
    ));
}

#[test]
fn a_store_needs_a_tokio_runtime() {
    assert!(matches!(
        RedisStore::builder("redis://127.0.0.1:1").build(),
        Err(StoreError::NoRuntime)
    ));
}

/// A store on `server` under `prefix` with a registry of `keys` keyed
/// breakers attached (`k0`, `k1`, ...), every key made.
fn registry_of(
    server: &RedisServer,
    prefix: &str,
    keys: usize,
    refresh: Duration,
) -> (
    RedisStore,
    tower_circuit_breaker::registry::Registry<String>,
) {
    let store = store(server, prefix)
        .refresh_interval(refresh)
        .build()
        .expect("a valid store");
    let registry = tower_circuit_breaker::registry::Registry::builder()
        .default_config(config("any", 1, Duration::from_secs(30)))
        .max_keys(keys)
        .store(&store)
        .build();
    for k in 0..keys {
        registry.get(&format!("k{k}")).expect("room for every key");
    }
    (store, registry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_keys_attach_and_sync_within_a_few_refresh_intervals() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    // The fleet has opened the last key before this instance starts.
    let mut tripper = Instance::new(
        store(&server, "large"),
        config("k99999", 1, Duration::from_secs(60)),
        &upstream,
    );
    synced(std::slice::from_ref(&tripper)).await;
    assert_eq!(tripper.request().await, Answer::Failed);
    eventually("the opening written", || tripper.store.stats().writes > 0).await;

    let started = std::time::Instant::now();
    let refresh = Duration::from_millis(200);
    let (store, registry) = registry_of(&server, "large", 100_000, refresh);
    let attached = started.elapsed();
    let last = registry.get(&"k99999".to_owned()).unwrap();
    // A few intervals: the versions, the one shard with something in it.
    eventually_within(refresh * 10, "the last key learnt its opening", || {
        last.state() == State::Open
    })
    .await;
    let synced = started.elapsed();
    let open = registry
        .breakers()
        .into_iter()
        .filter(|(_, b)| b.state() != State::Closed)
        .count();
    assert_eq!(open, 1, "only the key the fleet opened");
    assert!(store.is_available());
    assert_eq!(store.stats().unavailable_episodes, 0);
    eprintln!("100,000 keys: attached in {attached:?}, synced {synced:?} after the start");
}

/// Commands Redis served per refresh of one instance holding `keys` keys,
/// nothing open, over ten refreshes.
async fn commands_per_refresh(keys: usize) -> f64 {
    let server = RedisServer::start();
    let (store, _registry) = registry_of(&server, "quiet", keys, Duration::from_millis(100));
    eventually("synced and subscribed", || {
        let stats = store.stats();
        stats.refreshes > 2 && stats.messages > 0
    })
    .await;
    let (refreshes, served) = (
        store.stats().refreshes,
        commands_served(&server.url()).await,
    );
    eventually("ten more refreshes", || {
        store.stats().refreshes >= refreshes + 10
    })
    .await;
    let (refreshes_after, served_after) = (
        store.stats().refreshes,
        commands_served(&server.url()).await,
    );
    assert_eq!(store.stats().unavailable_episodes, 0);
    // The second INFO is inside the count.
    (served_after - served - 1) as f64 / (refreshes_after - refreshes) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_open_commands_per_refresh_stay_bounded_as_keys_grow() {
    let few = commands_per_refresh(100).await;
    let many = commands_per_refresh(100_000).await;
    eprintln!("commands per refresh: {few:.2} with 100 keys, {many:.2} with 100,000");
    // The versions, and a check of the subscription: two a refresh,
    // whatever the number of keys (a check may fall either side of the
    // counted stretch).
    for per_refresh in [few, many] {
        assert!(per_refresh <= 2.5, "{per_refresh:.2} commands per refresh");
    }
}

#[tokio::test]
async fn one_instance_failing_every_call_opens_only_itself_below_the_quorum() {
    let server = RedisServer::start();
    let config = config("llm", 3, Duration::from_secs(30));
    let quorum = |server: &RedisServer| store(server, "quorum").quorum(2);
    // The first instance's own path to the provider is broken; the
    // provider is healthy for the other two.
    let broken = Upstream::failing();
    let healthy = Upstream::default();
    let mut bad = Instance::new(quorum(&server), config.clone(), &broken);
    let mut good: Vec<Instance> = (0..2)
        .map(|_| Instance::new(quorum(&server), config.clone(), &healthy))
        .collect();
    synced(std::slice::from_ref(&bad)).await;
    synced(&good).await;
    let mut heard = good[0].breaker.subscribe();
    for _ in 0..3 {
        assert_eq!(bad.request().await, Answer::Failed);
    }
    eventually("the opening offered and declined", || {
        bad.store.stats().writes == 4
    })
    .await;
    assert_eq!(bad.state(), State::Open);
    assert_eq!(bad.request().await, Answer::Refused);
    // The others keep serving, for a few refreshes.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for instance in &mut good {
            assert_eq!(instance.request().await, Answer::Answered);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(good.iter().all(|i| i.state() == State::Closed));
    assert!(heard.try_recv().is_err(), "the others never opened");
    assert_eq!(bad.store.stats().writes, 4, "offered once");
}

/// A broken instance that crashes after two failures and is started again,
/// each life with a store of its own: given its stable name, it is one
/// voter however often it restarts, and a quorum of two keeps the healthy
/// fleet serving. Without a name, its second life makes a quorum with its
/// first, and the fleet opens.
#[tokio::test]
async fn a_crash_looping_instance_makes_a_quorum_alone_only_without_a_name() {
    let server = RedisServer::start();
    let config = config("llm", 3, Duration::from_secs(30));
    let (broken, healthy) = (Upstream::failing(), Upstream::default());
    for (prefix, name, lives) in [
        ("named", Some("pod-a"), [2, 2, 2]),
        ("unnamed", None, [2, 1, 0]),
    ] {
        let builder = || store(&server, prefix).quorum(2);
        let mut good = synced_fleet_of(2, builder, &config, &healthy).await;
        for failures in lives.into_iter().filter(|&n| n > 0) {
            let builder = match name {
                Some(name) => builder().instance(name),
                None => builder(),
            };
            let mut bad = Instance::new(builder, config.clone(), &broken);
            if let Some(name) = name {
                assert_eq!(bad.store.voter(), name);
                assert!(bad.store.instance().starts_with(&format!("{name}-")));
            }
            synced(std::slice::from_ref(&bad)).await;
            for _ in 0..failures {
                assert_eq!(bad.request().await, Answer::Failed);
            }
            eventually("the life's failures written", || {
                bad.store.stats().writes == failures
            })
            .await;
            // The process dies here.
        }
        if name.is_some() {
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                for instance in &mut good {
                    assert_eq!(instance.request().await, Answer::Answered, "{prefix}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                good.iter().all(|i| i.state() == State::Closed),
                "one voter is no quorum"
            );
        } else {
            all_in(&good, State::Open, "two lives made a quorum").await;
        }
    }
}

/// Each life of a crash-looping instance trips its own breaker (the fleet
/// declines its opening: a vote under its voter name), and the healthy
/// instances serve between lives, resetting the count: named, its lives'
/// votes are one instance's; unnamed, the second life and the first
/// life's vote make a quorum.
#[tokio::test]
async fn each_life_of_a_crash_looping_instance_votes_under_its_name() {
    let server = RedisServer::start();
    let config = config("llm", 3, Duration::from_secs(30));
    let (broken, healthy) = (Upstream::failing(), Upstream::default());
    for (prefix, name) in [("votes-named", Some("pod-a")), ("votes-unnamed", None)] {
        let builder = || store(&server, prefix).quorum(2);
        let mut good = synced_fleet_of(2, builder, &config, &healthy).await;
        for life in 0..2 {
            let builder = match name {
                Some(name) => builder().instance(name),
                None => builder(),
            };
            let mut bad = Instance::new(builder, config.clone(), &broken);
            synced(std::slice::from_ref(&bad)).await;
            for _ in 0..3 {
                let _ = bad.request().await;
            }
            if name.is_none() && life == 1 {
                // The process lives on until the fleet has heard it.
                all_in(&good, State::Open, "two lives made a quorum").await;
                break;
            }
            eventually("three failures and the declined opening written", || {
                bad.store.stats().writes == 4
            })
            .await;
            assert_eq!(bad.state(), State::Open, "{prefix}: it opened alone");
            // The healthy instances serve for a few refreshes: their
            // successes reset the fleet's count.
            let until = Instant::now() + Duration::from_millis(600);
            while Instant::now() < until {
                for instance in &mut good {
                    assert_eq!(instance.request().await, Answer::Answered, "{prefix}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if name.is_some() {
            assert!(
                good.iter().all(|i| i.state() == State::Closed),
                "one instance's votes are no quorum"
            );
        }
    }
}

#[tokio::test]
async fn failures_from_a_quorum_of_instances_open_all_of_them() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let fleet_config = config("llm", 3, Duration::from_secs(30));
    let mut fleet: Vec<Instance> = (0..3)
        .map(|_| {
            Instance::new(
                store(&server, "quorate").quorum(2),
                fleet_config.clone(),
                &upstream,
            )
        })
        .collect();
    synced(&fleet).await;
    for _ in 0..3 {
        assert_eq!(fleet[0].request().await, Answer::Failed);
    }
    eventually("the first opened alone", || {
        fleet[0].store.stats().writes == 4
    })
    .await;
    assert_eq!(fleet[1].state(), State::Closed);
    // A second instance fails, no success anywhere between: two instances
    // failing, the count past its threshold.
    assert_eq!(fleet[1].request().await, Answer::Failed);
    all_in(&fleet, State::Open, "all three open").await;
    assert_eq!(fleet[2].request().await, Answer::Refused);
    assert_eq!(upstream.calls(), 4);
}

#[tokio::test]
async fn a_trip_shares_its_opening_once() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let mut one = Instance::new(
        store(&server, "once"),
        config("llm", 3, Duration::from_secs(30)),
        &upstream,
    );
    synced(std::slice::from_ref(&one)).await;
    // Three failures before the store's task runs: one batch of three
    // counts and the opening. The first two counts' answers ("closed")
    // come back after the breaker opened: they must not make it offer its
    // opening again.
    for _ in 0..3 {
        let service = one
            .service
            .ready()
            .now_or_never()
            .expect("ready at once")
            .expect("no error");
        assert!(matches!(service.call(()).now_or_never(), Some(Err(_))));
    }
    eventually("written", || one.store.stats().writes >= 4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(one.state(), State::Open);
    assert_eq!(one.store.stats().writes, 4, "three counts, one opening");
}

#[tokio::test]
async fn several_breakers_of_one_name_on_one_instance_send_one_probe() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    let store = store(&server, "siblings").build().unwrap();
    let layers: Vec<CircuitBreakerLayer> = (0..3)
        .map(|_| CircuitBreakerLayer::new(config("llm", 1, open)))
        .collect();
    for layer in &layers {
        assert!(store.attach(&layer.breaker()));
    }
    let mut clients: Vec<Svc> = layers
        .iter()
        .map(|l| {
            let inner = tower::util::BoxCloneSyncService::new(upstream.clone());
            tower::Layer::layer(l, inner)
        })
        .collect();
    eventually("synced", || store.stats().refreshes > 0).await;
    let first = clients[0].ready().await.unwrap().call(()).await;
    assert!(first.is_err());
    eventually("all three open", || {
        layers.iter().all(|l| l.breaker().state() == State::Open)
    })
    .await;
    for round in 1..=3 {
        let won = store.stats().probe_locks_won;
        eventually("the lock won", || store.stats().probe_locks_won > won).await;
        let half_open = layers
            .iter()
            .filter(|l| l.breaker().state() == State::HalfOpen)
            .count();
        assert_eq!(half_open, 1, "round {round}: one breaker probes");
        let before = upstream.calls();
        for client in &mut clients {
            let _ = client.ready().await.unwrap().call(()).await;
        }
        assert_eq!(upstream.calls(), before + 1, "round {round}: one probe");
    }
}

#[tokio::test]
async fn an_active_prober_probes_as_soon_as_its_instance_wins_the_lock() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let open = Duration::from_millis(300);
    // A hold of a minute: a prober that slept out its local period (the
    // fleet's and the hold) would not probe within the test.
    let hold = Duration::from_secs(60);
    let mut fleet: Vec<Instance> = (0..2)
        .map(|_| {
            Instance::new(
                store(&server, "active").hold(hold),
                config("llm", 1, open),
                &upstream,
            )
        })
        .collect();
    synced(&fleet).await;
    for instance in &fleet {
        instance.breaker.probe_actively(
            upstream.clone(),
            || (),
            tower_circuit_breaker::classify::ErrorsAsFailures,
        );
    }
    assert_eq!(fleet[0].request().await, Answer::Failed);
    let failed = upstream.arrivals()[0];
    all_in(&fleet, State::Open, "both open").await;
    eventually("a probe, once the fleet's period ended", || {
        upstream.calls() >= 2
    })
    .await;
    // The fleet's period, which began after the failure, was kept (Redis
    // counts whole milliseconds).
    let probed = upstream.arrivals()[1];
    assert!(probed - failed >= open - Duration::from_millis(2));
}

#[tokio::test]
async fn a_subscriber_on_a_silent_connection_is_replaced_and_hears_again() {
    let server = RedisServer::start();
    let proxy = StallingProxy::start(server.port);
    let upstream = Upstream::failing();
    let open = Duration::from_secs(30);
    let mut listener = Instance::new(
        RedisStore::builder(proxy.url())
            .prefix("deaf")
            .refresh_interval(Duration::from_millis(200))
            .command_timeout(Duration::from_millis(200)),
        config("llm", 1, open),
        &upstream,
    );
    let mut tripper = Instance::new(store(&server, "deaf"), config("llm", 1, open), &upstream);
    synced(std::slice::from_ref(&listener)).await;
    synced(std::slice::from_ref(&tripper)).await;
    let mut events = listener.store.subscribe();
    // The host behind the address vanishes without a reset, then comes
    // back: connections made before stay silent for good.
    proxy.stall();
    let event = next_event(&mut events).await;
    assert!(matches!(event, StoreEvent::Unavailable { .. }), "{event:?}");
    proxy.heal();
    assert_eq!(next_event(&mut events).await, StoreEvent::Restored);
    // Redis still counts the silent subscription (its socket is open at
    // the proxy): the listener's new one makes three subscribers.
    let mut conn = connect(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("deaf:events")
            .query_async(&mut conn)
            .await
            .unwrap();
        if subscribers == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "never subscribed again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let heard = listener.store.stats().messages;
    assert_eq!(tripper.request().await, Answer::Failed);
    eventually("the opening heard by pub/sub", || {
        listener.store.stats().messages > heard
    })
    .await;
    eventually("the listener open", || listener.state() == State::Open).await;
    assert_eq!(listener.request().await, Answer::Refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_shard_of_a_hundred_thousand_entries_is_read_in_pages_and_syncs() {
    let server = RedisServer::start();
    // One shard's index holds 100,000 entries (a fleet with that many keys
    // counting failures) and the opening of `llm`: read in one exchange, it
    // takes longer than the command timeout; in pages, each page answers
    // well within it.
    let mut conn = connect(&server.url()).await;
    let shard = shard_base("big-index", "llm");
    let until = redis_now_ms(&mut conn).await + 3_600_000;
    for chunk in 0..10 {
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("HSET").arg(format!("{shard}:index"));
        for i in 0..10_000 {
            cmd.arg(format!("k{chunk}-{i}"))
                .arg(format!("c 1 1 {until}"));
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(format!("{shard}:index"))
        .arg("llm")
        .arg(format!("o 2 5 0 {until} {until}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{shard}:version"))
        .arg(2)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut instance = Instance::new(
        RedisStore::builder(server.url())
            .prefix("big-index")
            .refresh_interval(Duration::from_millis(500))
            .command_timeout(Duration::from_millis(100))
            .hold(Duration::from_millis(500)),
        config("llm", 1, Duration::from_secs(30)),
        &Upstream::default(),
    );
    eventually("the fleet's opening read from the big shard", || {
        instance.state() == State::Open
    })
    .await;
    assert_eq!(instance.request().await, Answer::Refused);
    let stats = instance.store.stats();
    assert!(stats.available, "{stats:?}");
    assert_eq!(stats.unavailable_episodes, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_for_the_probe_lock_that_redis_answers_late_is_slow_not_down() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let quick = || store(&server, "late-lock").command_timeout(Duration::from_millis(100));
    let config = config("llm", 1, Duration::from_secs(1));
    let mut fleet = synced_fleet_of(2, quick, &config, &upstream).await;
    assert_eq!(fleet[0].request().await, Answer::Failed);
    all_in(&fleet, State::Open, "the fleet open").await;
    // Redis holds every script (the probe-lock attempts among them) past
    // the end of the open period, while it answers reads (the versions)
    // at once: busy, not down.
    pause_writes(&server, 2500).await;
    eventually("a round of lock attempts not answered in time", || {
        fleet.iter().any(|i| i.store.stats().slow_lock_rounds > 0)
    })
    .await;
    never_down(&fleet);
    // Once Redis runs scripts again, the fleet goes on sharing: a probe
    // is let through, fails, and the reopening reaches both.
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.calls() < 2 {
        assert!(Instant::now() < deadline, "never probed");
        for instance in &mut fleet {
            instance.request().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all_in(&fleet, State::Open, "reopened").await;
    never_down(&fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_redis_answers_late_is_slow_not_down() {
    let server = RedisServer::start();
    let upstream = Upstream::failing();
    let quick = || {
        RedisStore::builder(server.url())
            .prefix("late-write")
            .refresh_interval(Duration::from_millis(200))
            .hold(Duration::from_millis(700))
            .command_timeout(Duration::from_millis(100))
    };
    let config = config("llm", 3, Duration::from_secs(30));
    let mut fleet = synced_fleet_of(2, quick, &config, &upstream).await;
    // Redis holds every script back for a while (the failure's count
    // among them) and answers reads at once: busy, not down.
    pause_writes(&server, 1000).await;
    assert_eq!(fleet[0].request().await, Answer::Failed);
    eventually("a batch of writes not answered in time", || {
        fleet[0].store.stats().slow_write_rounds > 0
    })
    .await;
    let stats = fleet[0].store.stats();
    assert_eq!(stats.unavailable_episodes, 0, "{stats:?}");
    assert_eq!(fleet[0].state(), State::Closed);
    // Once Redis runs scripts again, the fleet goes on sharing: the other
    // instance's failures open both.
    let refreshes = fleet[1].store.stats().refreshes;
    eventually("whole refreshes again", || {
        fleet[1].store.stats().refreshes > refreshes + 6
    })
    .await;
    for _ in 0..3 {
        assert_ne!(fleet[1].request().await, Answer::Answered);
    }
    all_in(&fleet, State::Open, "the fleet open").await;
    never_down(&fleet);
}
