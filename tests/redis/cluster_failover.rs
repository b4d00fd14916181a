//! The fleet on a three-master, three-replica Redis Cluster when a master
//! fails: only the names whose index shard lived on it leave the fleet
//! (they run on their local breakers), every other name keeps its shared
//! count and its one prober, and the names cut off are shared again soon
//! after Redis promotes the replica. A graceful failover under traffic
//! loses no request and no opening.

use crate::common::redis as redis_support;
use crate::common::Upstream;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_support::{connect, node_command, shard_base, RedisCluster};
use tokio::time::Instant;
use tower_circuit_breaker::store::redis::{RedisStore, StoreEvent};
use tower_circuit_breaker::{CircuitOpen, State};

use super::cluster::{eventually, slot, Instance};

/// What a store went through, and when.
type Log = Arc<Mutex<Vec<(Instant, StoreEvent)>>>;

/// Keeps every event of `store` in the log returned.
fn watch(store: &RedisStore) -> Log {
    let log: Log = Arc::default();
    let mut events = store.subscribe();
    let kept = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            kept.lock().unwrap().push((Instant::now(), event));
        }
    });
    log
}

/// Two names whose index shards live on different masters: the first on
/// the master returned.
async fn names_on_two_masters(cluster: &RedisCluster) -> (String, u16, String) {
    let mut conn = connect(&cluster.urls()[0]).await;
    let mut first: Option<(String, u16)> = None;
    for i in 0.. {
        let name = format!("provider-{i}");
        let s = slot(
            &mut conn,
            &format!("{}:index", shard_base("cluster", &name)),
        )
        .await;
        let master = cluster.master_of(s);
        match &first {
            None => first = Some((name, master)),
            Some((dead, on)) if *on != master => return (dead.clone(), *on, name),
            Some(_) => {}
        }
    }
    unreachable!()
}

/// The fleet: `n` instances on `cluster`, refreshing every `refresh`.
async fn fleet(
    cluster: &RedisCluster,
    n: usize,
    refresh: Duration,
    names: &[&str],
) -> Vec<Instance> {
    let fleet: Vec<Instance> = (0..n)
        .map(|_| {
            Instance::with(RedisStore::cluster_builder(cluster.urls()).refresh_interval(refresh))
        })
        .collect();
    synced(&fleet, names).await;
    fleet
}

/// Attaches `names` on every instance and waits until each has read the
/// index and subscribed.
async fn synced(fleet: &[Instance], names: &[&str]) {
    for instance in fleet {
        for name in names {
            instance.state(name);
        }
    }
    eventually("every instance synced and subscribed", || {
        fleet.iter().all(|i| {
            let stats = i.store.stats();
            stats.refreshes > 0 && stats.messages > 0
        })
    })
    .await;
}

/// Waits until the node on `port` serves as a master; when it did.
async fn promoted(port: u16) -> Instant {
    eventually("the replica promoted", || {
        node_command(port, &["INFO", "replication"]).contains("role:master")
    })
    .await;
    Instant::now()
}

/// How an opening reaches the other instances.
#[derive(PartialEq)]
enum Heard {
    /// By the opener's message, well within the refresh interval.
    ByMessage,
    /// By the message, or by the next refresh: just after a promotion an
    /// instance's subscriber may not have subscribed to the promoted node
    /// yet (it tries again each quarter interval), and a message published
    /// before then reaches only the refresh. Within four intervals (two
    /// seconds here): a refresh or two, on a machine that may be loaded.
    ByMessageOrRefresh,
}

impl Heard {
    /// How long after the second failure every instance must see it open.
    fn within(&self) -> Duration {
        match self {
            Heard::ByMessage => Duration::from_millis(500),
            Heard::ByMessageOrRefresh => Duration::from_secs(2),
        }
    }
}

/// One failure of `name` on each of the instances `by`: the fleet's count
/// (two, the threshold) opens it on every instance. Each instance is
/// watched from the second failure on, as a breaker that saw the opening
/// may be half open again by the time the last one does. Every instance
/// learns of it as `heard` says; returns how long after the second failure
/// the last one saw it open.
async fn open_fleet_wide(
    fleet: &[Instance],
    by: [usize; 2],
    name: &str,
    upstream: &Upstream<()>,
    heard_as: Heard,
) -> Duration {
    let heard: Vec<u64> = fleet.iter().map(|i| i.store.stats().messages).collect();
    for instance in by.map(|i| &fleet[i]) {
        let writes = instance.store.stats().writes;
        assert!(instance.call(name, upstream).await.is_err());
        eventually("the failure written", || {
            instance.store.stats().writes > writes
        })
        .await;
    }
    let failed = Instant::now();
    let mut seen = vec![false; fleet.len()];
    while !seen.iter().all(|&s| s) {
        for (seen, instance) in seen.iter_mut().zip(fleet) {
            *seen |= instance.state(name) == State::Open;
        }
        if failed.elapsed() > Duration::from_secs(10) {
            let stats: Vec<_> = fleet
                .iter()
                .map(|i| (i.state(name), i.store.shares(name), i.store.stats()))
                .collect();
            panic!("{name} not seen open on every instance ({seen:?}): {stats:#?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let lag = failed.elapsed();
    if heard_as == Heard::ByMessage {
        // Told by the opener's message, not found by a refresh.
        for (instance, before) in fleet.iter().zip(heard) {
            assert!(instance.store.stats().messages > before, "no message heard");
        }
    }
    assert!(lag < heard_as.within(), "seen open after {lag:?}");
    lag
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_cuts_off_only_its_shards_which_share_again_after_the_promotion() {
    // Redis does not fail over by itself here: the test promotes the
    // replica once it has seen the fleet without the dead master.
    let mut cluster = RedisCluster::start_replicated(&[
        "--cluster-require-full-coverage",
        "no",
        "--cluster-replica-no-failover",
        "yes",
    ]);
    let (dead, dead_master, alive) = names_on_two_masters(&cluster).await;
    let replica = cluster.replica_of(dead_master);
    let fleet = fleet(&cluster, 4, Duration::from_millis(500), &[&dead, &alive]).await;
    let logs: Vec<Log> = fleet.iter().map(|i| watch(&i.store)).collect();
    let (dead_shard, alive_shard) = (
        fleet[0].store.shard_of(&dead),
        fleet[0].store.shard_of(&alive),
    );

    cluster.kill(dead_master);
    let killed = Instant::now();
    eventually("every instance cut the dead master's names off", || {
        fleet.iter().all(|i| !i.store.shares(&dead))
    })
    .await;
    let left = killed.elapsed();
    for instance in &fleet {
        let cut = instance.store.unreachable_shards();
        assert!(cut.contains(&dead_shard), "{cut:?}");
        assert!(
            !cut.contains(&alive_shard),
            "a surviving master's shard cut: {cut:?}"
        );
        assert!(cut.len() < 16, "only the dead master's shards: {cut:?}");
        assert!(instance.store.is_available() && instance.store.shares(&alive));
    }

    // A name on a surviving master keeps its shared count...
    let upstream = Upstream::failing();
    open_fleet_wide(&fleet, [0, 1], &alive, &upstream, Heard::ByMessage).await;
    // ...and its one prober: every instance calls it all along for 3 s,
    // over six open periods of 500 ms.
    let before = upstream.calls();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        for instance in &fleet {
            let _ = instance.call(&alive, &upstream).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let probes: Vec<Instant> = upstream.arrivals()[before..].to_vec();
    assert!(
        (1..=7).contains(&probes.len()),
        "{} probes in 3 s",
        probes.len()
    );
    for pair in probes.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(250),
            "two probes in one open period, {:?} apart",
            pair[1] - pair[0]
        );
    }

    // A name on the dead master runs on its local breakers: two failures
    // on one instance open it there, and nowhere else.
    let local = Upstream::failing();
    let dropped = fleet[0].store.stats().dropped_writes;
    for _ in 0..2 {
        assert!(fleet[0].call(&dead, &local).await.is_err());
    }
    assert_eq!(fleet[0].state(&dead), State::Open);
    eventually("its writes dropped, not sent", || {
        fleet[0].store.stats().dropped_writes > dropped
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    for instance in &fleet[1..] {
        assert_eq!(instance.state(&dead), State::Closed);
    }

    node_command(replica, &["CLUSTER", "FAILOVER", "FORCE"]);
    let promoted_at = promoted(replica).await;
    eventually(
        "every instance shares the dead master's names again",
        || fleet.iter().all(|i| i.store.shares(&dead)),
    )
    .await;
    let rejoined = promoted_at.elapsed();
    // One degraded refresh (the interval, 500 ms, here) and its read.
    assert!(rejoined < Duration::from_secs(3), "{rejoined:?}");
    // Shared again: one failure on each of two instances opens it for all.
    let pushed = open_fleet_wide(
        &fleet,
        [2, 3],
        &dead,
        &Upstream::failing(),
        Heard::ByMessageOrRefresh,
    )
    .await;

    for (instance, log) in fleet.iter().zip(&logs) {
        let stats = instance.store.stats();
        assert_eq!(stats.unavailable_episodes, 0, "the store never went down");
        assert!(stats.shard_episodes >= 1);
        assert_eq!(stats.unreachable_shards, 0);
        let log = log.lock().unwrap();
        let cut_at = log.iter().position(|(_, e)| {
            matches!(e, StoreEvent::ShardsUnavailable { shards, .. } if shards.contains(&dead_shard))
        });
        let back_at = log.iter().position(|(_, e)| {
            matches!(e, StoreEvent::ShardsRestored { shards } if shards.contains(&dead_shard))
        });
        assert!(
            matches!((cut_at, back_at), (Some(c), Some(b)) if c < b),
            "{log:?}"
        );
        assert!(!log
            .iter()
            .any(|(_, e)| matches!(e, StoreEvent::Unavailable { .. })));
    }
    eprintln!(
        "dead master: every instance left sharing its names within {left:?} (the others \
         kept sharing), {} probes of a surviving name in 3 s, shared again {rejoined:?} \
         after the promotion, its next opening heard everywhere in {pushed:?}",
        probes.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_masters_replica_is_used_soon_after_redis_promotes_it_and_the_rest_never_stops_sharing(
) {
    // Redis's own failover, as soon as its node timeout (1 s) allows.
    let mut cluster = RedisCluster::start_replicated(&[
        "--cluster-require-full-coverage",
        "no",
        "--cluster-replica-validity-factor",
        "0",
    ]);
    let (dead, dead_master, alive) = names_on_two_masters(&cluster).await;
    let replica = cluster.replica_of(dead_master);
    let fleet = Arc::new(fleet(&cluster, 4, Duration::from_millis(500), &[&dead, &alive]).await);

    // Whether the surviving name was shared everywhere, sampled all along.
    let stop = Arc::new(AtomicBool::new(false));
    let (samples, unshared) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (fleet, stop, samples, unshared, alive) = (
            Arc::clone(&fleet),
            Arc::clone(&stop),
            Arc::clone(&samples),
            Arc::clone(&unshared),
            alive.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                samples.fetch_add(1, Ordering::Relaxed);
                if !fleet.iter().all(|i| i.store.shares(&alive)) {
                    unshared.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    cluster.kill(dead_master);
    let killed = Instant::now();
    eventually("every instance cut the dead master's names off", || {
        fleet.iter().all(|i| !i.store.shares(&dead))
    })
    .await;
    let left = killed.elapsed();
    let promoted_at = promoted(replica).await;
    let promotion = promoted_at - killed;
    eventually(
        "every instance shares the dead master's names again",
        || fleet.iter().all(|i| i.store.shares(&dead)),
    )
    .await;
    let rejoined = promoted_at.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();

    assert!(left < Duration::from_secs(3), "left after {left:?}");
    assert!(
        rejoined < Duration::from_secs(3),
        "{rejoined:?} after the promotion"
    );
    assert!(samples.load(Ordering::Relaxed) > 100);
    assert_eq!(
        unshared.load(Ordering::Relaxed),
        0,
        "the surviving name stopped being shared"
    );
    // Shared again: a fleet-wide opening of the name that was cut off.
    let pushed = open_fleet_wide(
        &fleet,
        [0, 1],
        &dead,
        &Upstream::failing(),
        Heard::ByMessageOrRefresh,
    )
    .await;
    for instance in fleet.iter() {
        assert_eq!(instance.store.stats().unavailable_episodes, 0);
    }
    eprintln!(
        "killed master: its names left sharing within {left:?}, Redis promoted the replica \
         {promotion:?} after the kill, shared again {rejoined:?} after that; the surviving \
         name was shared at every one of {} samples; the next opening heard everywhere in \
         {pushed:?}",
        samples.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_traffic_answers_every_request_and_keeps_the_fleets_openings() {
    let cluster = RedisCluster::start_replicated(&[]);
    let (held, master, other) = names_on_two_masters(&cluster).await;
    let replica = cluster.replica_of(master);
    let names = [held.as_str(), other.as_str()];
    let store =
        || RedisStore::cluster_builder(cluster.urls()).refresh_interval(Duration::from_millis(500));
    let fleet: Vec<Instance> = (0..4)
        .map(|_| Instance::with_cooldown(store(), Duration::from_secs(30)))
        .collect();
    synced(&fleet, &names).await;
    let fleet = Arc::new(fleet);
    // An opening on the master about to hand over, 30 s long.
    open_fleet_wide(
        &fleet,
        [0, 1],
        &held,
        &Upstream::failing(),
        Heard::ByMessage,
    )
    .await;

    // Every instance calls both names all along: the open one is refused,
    // the other answered; a call not answered within 2 s is lost.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, answered, lost) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let healthy = Upstream::default();
    let traffic: Vec<_> = (0..fleet.len())
        .map(|i| {
            let (fleet, stop, sent, answered, lost, healthy) = (
                Arc::clone(&fleet),
                Arc::clone(&stop),
                Arc::clone(&sent),
                Arc::clone(&answered),
                Arc::clone(&lost),
                healthy.clone(),
            );
            let (held, other) = (held.clone(), other.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for name in [&held, &other] {
                        sent.fetch_add(1, Ordering::Relaxed);
                        let call = fleet[i].call(name, &healthy);
                        match tokio::time::timeout(Duration::from_secs(2), call).await {
                            Ok(Ok(())) => assert_eq!(name, &other),
                            Ok(Err(e)) => {
                                assert!(e.is::<CircuitOpen>() && name == &held, "{name}: {e}")
                            }
                            Err(_) => {
                                lost.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                    if n % 64 == 0 {
                        // The stores' tasks share these two threads.
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(500)).await;
    node_command(replica, &["CLUSTER", "FAILOVER"]);
    promoted(replica).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for task in traffic {
        task.await.unwrap();
    }

    let (sent, answered, lost) = (
        sent.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed),
    );
    assert_eq!(lost, 0);
    assert_eq!(answered, sent);
    for instance in fleet.iter() {
        assert_eq!(instance.state(&held), State::Open, "the opening held");
        let stats = instance.store.stats();
        assert_eq!(stats.unavailable_episodes, 0);
        assert!(instance.store.shares(&held) && instance.store.shares(&other));
    }
    // The opening is the fleet's still, on the promoted node: an instance
    // started after the failover learns it.
    let late = Instance::with_cooldown(store(), Duration::from_secs(30));
    late.state(&held);
    eventually("a new instance learns the opening", || {
        late.state(&held) == State::Open
    })
    .await;
    eprintln!("failover under traffic: {answered} of {sent} requests answered");
}
