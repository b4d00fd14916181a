//! The fleet's shared state on a three-node Redis Cluster (redis-server's
//! cluster mode on loopback ports, created here with `redis-cli --cluster
//! create`): breakers whose keys live in different slots, on different
//! nodes, trip, share and recover as on a single server, and each breaker's
//! keys, however hostile its name, stay in one slot.

use crate::common::redis as redis_support;
use crate::common::Upstream;

use std::collections::HashSet;
use std::time::Duration;

use redis_support::{
    breaker_key, commands_served, connect, eventually_within, free_port, shard_base, RedisCluster,
};
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt};
use tower_circuit_breaker::policy::ConsecutiveFailures;
use tower_circuit_breaker::registry::Registry;
use tower_circuit_breaker::store::redis::RedisStore;
use tower_circuit_breaker::{CircuitOpen, Config, State};

/// Waits until `done` holds: a cluster takes longer to settle than one
/// server, hence 15 s.
pub(crate) async fn eventually(what: &str, done: impl FnMut() -> bool) {
    eventually_within(Duration::from_secs(15), what, done).await;
}

/// The slot Redis gives `key`.
pub(crate) async fn slot(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .expect("CLUSTER KEYSLOT")
}

/// One instance: a registry of breakers (one per upstream name) sharing
/// state through its own cluster store.
pub(crate) struct Instance {
    pub(crate) store: RedisStore,
    pub(crate) registry: Registry<String>,
}

impl Instance {
    pub(crate) fn new(cluster: &RedisCluster) -> Self {
        Self::with(
            RedisStore::cluster_builder(cluster.urls())
                .refresh_interval(Duration::from_millis(200)),
        )
    }

    pub(crate) fn with(store: tower_circuit_breaker::store::redis::RedisStoreBuilder) -> Self {
        Self::with_cooldown(store, Duration::from_millis(500))
    }

    /// An instance whose breakers stay open `cooldown` at a time.
    pub(crate) fn with_cooldown(
        store: tower_circuit_breaker::store::redis::RedisStoreBuilder,
        cooldown: Duration,
    ) -> Self {
        let store = store
            .prefix("cluster")
            .probe_lease(Duration::from_millis(800))
            .hold(Duration::from_millis(1300))
            .command_timeout(Duration::from_millis(400))
            .build()
            .expect("a valid store");
        let config = Config::builder()
            .trip(ConsecutiveFailures::new(2))
            .cooldown(cooldown)
            .backoff(1.0)
            .build()
            .unwrap();
        let registry = Registry::builder()
            .default_config(config)
            .max_keys(100_000)
            .store(&store)
            .build();
        Instance { store, registry }
    }

    pub(crate) fn state(&self, name: &str) -> State {
        self.registry.get(&name.to_owned()).unwrap().state()
    }

    /// One call to `name` through this instance's breaker.
    pub(crate) async fn call(&self, name: &str, upstream: &Upstream<()>) -> Result<(), BoxError> {
        let breaker = self.registry.get(&name.to_owned()).unwrap();
        let mut service = breaker.layer().layer(upstream.clone());
        service.ready().await?.call(()).await
    }
}

use tower::Layer as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_in_different_slots_trip_share_and_recover_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut conn = connect(&cluster.urls()[0]).await;
    // Two names whose keys live in different thirds of the slot space: on
    // different nodes, as `redis-cli --cluster create` splits it.
    let mut names: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let name = format!("provider-{i}");
        let s = slot(&mut conn, &breaker_key("cluster", &name, "record")).await;
        if names.iter().all(|(_, other)| other / 5462 != s / 5462) {
            names.push((name, s));
        }
        if names.len() == 2 {
            break;
        }
    }
    let a = Instance::new(&cluster);
    let b = Instance::new(&cluster);
    let upstreams: Vec<Upstream<()>> = names.iter().map(|_| Upstream::default()).collect();
    for (name, _) in &names {
        // Made (and attached) on both instances before anything fails.
        a.state(name);
        b.state(name);
    }
    eventually("both stores refreshed", || {
        a.store.stats().refreshes > 0 && b.store.stats().refreshes > 0
    })
    .await;
    for ((name, _), upstream) in names.iter().zip(&upstreams) {
        upstream.fail();
        // One failure on each instance: two in the fleet, the threshold.
        assert!(a.call(name, upstream).await.is_err());
        let writes = a.store.stats().writes;
        eventually("a's failure written", || a.store.stats().writes > writes).await;
        assert!(b.call(name, upstream).await.is_err());
        eventually(&format!("{name} open on both"), || {
            a.state(name) == State::Open && b.state(name) == State::Open
        })
        .await;
        let refused = a.call(name, upstream).await.unwrap_err();
        assert!(refused.is::<CircuitOpen>());
        assert_eq!(upstream.calls(), 2);
    }
    // Recovery: the providers answer again; a probe closes each breaker
    // for both instances.
    for ((name, _), upstream) in names.iter().zip(&upstreams) {
        upstream.recover();
        let deadline = Instant::now() + Duration::from_secs(15);
        while a.state(name) != State::Closed || b.state(name) != State::Closed {
            assert!(Instant::now() < deadline, "{name} never closed on both");
            let _ = a.call(name, upstream).await;
            let _ = b.call(name, upstream).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(a.store.is_available() && b.store.is_available());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_breakers_keys_share_one_slot_whatever_its_name() {
    let cluster = RedisCluster::start();
    let instance = Instance::new(&cluster);
    let upstream = Upstream::failing();
    let long = "y".repeat(5_000);
    let names = ["a:b", "{x}", "}{", "a\nb", "*", "", long.as_str()];
    for name in names {
        instance.state(name);
    }
    eventually("refreshed", || instance.store.stats().refreshes > 0).await;
    for name in names {
        // Two failures trip it: every key of the breaker is written.
        let _ = instance.call(name, &upstream).await;
        let _ = instance.call(name, &upstream).await;
        eventually("open", || instance.state(name) == State::Open).await;
    }
    // Each opened on its own evidence first; the fleet's record follows
    // once the task has carried out the writes.
    eventually("the writes carried out", || {
        instance.store.stats().writes >= 3 * names.len() as u64
    })
    .await;
    // Every key of a breaker shares its shard's slot, and the shard's
    // index with it: whatever the name, the empty one included.
    let mut breakers: HashSet<String> = HashSet::new();
    for url in cluster.urls() {
        let mut conn = connect(&url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("cluster:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in keys {
            let base = &key[..key.find('}').unwrap() + 1];
            assert_eq!(
                slot(&mut conn, &key).await,
                slot(&mut conn, &format!("{base}:index")).await,
                "{key} left its shard's slot"
            );
            if let [_, name, _part] = key[base.len()..].split(':').collect::<Vec<_>>()[..] {
                breakers.insert(name.to_owned());
            }
        }
    }
    assert_eq!(breakers.len(), names.len(), "one place per breaker");
    assert!(instance.store.is_available());
    assert_eq!(instance.store.stats().key_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_empty_name_trips_and_shares_and_the_store_stays_up() {
    let cluster = RedisCluster::start();
    let a = Instance::new(&cluster);
    let b = Instance::new(&cluster);
    let upstream = Upstream::failing();
    // What `registry::header` gives a request without the header.
    for name in ["", "other"] {
        a.state(name);
        b.state(name);
    }
    eventually("both synced", || {
        a.store.stats().refreshes > 0 && b.store.stats().refreshes > 0
    })
    .await;
    assert!(a.call("", &upstream).await.is_err());
    let writes = a.store.stats().writes;
    eventually("a's failure written", || a.store.stats().writes > writes).await;
    assert!(b.call("", &upstream).await.is_err());
    eventually("the empty name open on both", || {
        a.state("") == State::Open && b.state("") == State::Open
    })
    .await;
    // The store is up, and other keys still share.
    assert!(a.call("other", &upstream).await.is_err());
    let writes = a.store.stats().writes;
    eventually("a's failure written", || a.store.stats().writes > writes).await;
    assert!(b.call("other", &upstream).await.is_err());
    eventually("another key open on both", || {
        a.state("other") == State::Open && b.state("other") == State::Open
    })
    .await;
    for store in [&a.store, &b.store] {
        assert!(store.is_available());
        let stats = store.stats();
        assert_eq!((stats.unavailable_episodes, stats.key_errors), (0, 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opening_reaches_every_instance_by_pubsub_whatever_node_each_was_given() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    // A name whose shard lives on the third node: not a node the first two
    // instances were given.
    let mut conn = connect(&urls[2]).await;
    let owned: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .unwrap();
    let third = cluster.nodes[2].port;
    let on_third = |slot: u16| {
        owned.iter().any(|range| match range.as_slice() {
            [redis::Value::Int(from), redis::Value::Int(to), redis::Value::Array(node), ..] => {
                (*from..=*to).contains(&i64::from(slot))
                    && matches!(node.get(1), Some(redis::Value::Int(p)) if *p == i64::from(third))
            }
            _ => false,
        })
    };
    let mut name = String::new();
    for i in 0.. {
        let candidate = format!("provider-{i}");
        let s = slot(
            &mut conn,
            &format!("{}:index", shard_base("cluster", &candidate)),
        )
        .await;
        if on_third(s) {
            name = candidate;
            break;
        }
    }
    // Each instance is given one node, a different one, after an address
    // where nothing answers (a node gone); none refreshes within the test:
    // only pub/sub can tell them.
    let gone = format!("redis://127.0.0.1:{}", free_port());
    let fleet: Vec<Instance> = urls
        .iter()
        .map(|url| {
            Instance::with(
                RedisStore::cluster_builder([gone.clone(), url.clone()])
                    .refresh_interval(Duration::from_secs(60)),
            )
        })
        .collect();
    for instance in &fleet {
        instance.state(&name);
    }
    eventually("every instance synced and subscribed", || {
        fleet.iter().all(|i| {
            let stats = i.store.stats();
            stats.refreshes > 0 && stats.messages > 0
        })
    })
    .await;
    // A subscription makes one more refresh: wait until the counts stop
    // moving.
    let count = || -> Vec<u64> { fleet.iter().map(|i| i.store.stats().refreshes).collect() };
    let mut refreshes = count();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if count() == refreshes {
            break;
        }
        refreshes = count();
    }
    let upstream = Upstream::failing();
    // Two failures on the first instance (given the first node): the
    // threshold.
    assert!(fleet[0].call(&name, &upstream).await.is_err());
    assert!(fleet[0].call(&name, &upstream).await.is_err());
    eventually("open on every instance", || {
        fleet.iter().all(|i| i.state(&name) == State::Open)
    })
    .await;
    for (instance, before) in fleet.iter().zip(refreshes) {
        assert_eq!(instance.store.stats().refreshes, before, "told by pub/sub");
    }
}

/// Commands all nodes served per refresh of one instance holding `keys`
/// keys, nothing open, over ten refreshes.
async fn commands_per_refresh(keys: usize) -> f64 {
    let cluster = RedisCluster::start();
    let instance = Instance::with(
        RedisStore::cluster_builder(cluster.urls()).refresh_interval(Duration::from_millis(100)),
    );
    for k in 0..keys {
        instance.state(&format!("k{k}"));
    }
    eventually("synced and subscribed", || {
        let stats = instance.store.stats();
        stats.refreshes > 2 && stats.messages > 0
    })
    .await;
    let served = |urls: Vec<String>| async move {
        let mut total = 0;
        for url in urls {
            total += commands_served(&url).await;
        }
        total
    };
    let (refreshes, before) = (
        instance.store.stats().refreshes,
        served(cluster.urls()).await,
    );
    eventually("ten more refreshes", || {
        instance.store.stats().refreshes >= refreshes + 10
    })
    .await;
    let (refreshes_after, after) = (
        instance.store.stats().refreshes,
        served(cluster.urls()).await,
    );
    assert_eq!(instance.store.stats().unavailable_episodes, 0);
    // The second round of INFO (one per node) is inside the count.
    (after - before - 3) as f64 / (refreshes_after - refreshes) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_open_commands_per_refresh_stay_bounded_as_keys_grow_on_a_cluster() {
    let few = commands_per_refresh(100).await;
    let many = commands_per_refresh(100_000).await;
    eprintln!("commands per refresh on a cluster: {few:.2} with 100 keys, {many:.2} with 100,000");
    // The versions, one per shard (16), and the subscription's check, one
    // per node (3), whatever the number of keys.
    for per_refresh in [few, many] {
        assert!(per_refresh <= 20.0, "{per_refresh:.2} commands per refresh");
    }
}
